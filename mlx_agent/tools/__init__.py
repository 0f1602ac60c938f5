"""The tool runtime: schemas, the executor, and built-in tools. It knows nothing of models."""

from .builtin import advised_tool, builtin_tools, reads_only
from .executor import ToolResult, error_result, run_tool
from .sandbox import Sandbox, SandboxUnavailable, resolve as resolve_sandbox
from .schema import Tool, ToolSchemaError, declared_tools, load_tools, parse_tools

__all__ = ["Sandbox", "SandboxUnavailable", "Tool", "ToolResult", "ToolSchemaError",
           "advised_tool", "builtin_tools", "error_result", "declared_tools", "load_tools",
           "parse_tools", "reads_only", "resolve_sandbox", "run_tool"]
