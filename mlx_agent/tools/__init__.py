"""The tool runtime: schemas, the executor, and built-in tools. It knows nothing of models."""

from .builtin import builtin_tools
from .executor import ToolResult, error_result, run_tool
from .schema import Tool, ToolSchemaError, declared_tools, load_tools, parse_tools

__all__ = ["Tool", "ToolResult", "ToolSchemaError", "builtin_tools", "error_result",
           "declared_tools", "load_tools", "parse_tools", "run_tool"]
