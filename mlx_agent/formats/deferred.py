"""Deferred tools: a one-line index and a ``get_tool_info`` tool instead of every schema.

The prompt shows each tool's name and the first line of its description; the model asks for a
tool's schema with ``get_tool_info(name)``, which the server answers itself (see
:mod:`mlx_agent.serve.service`). The grammar still knows every schema.
"""

from __future__ import annotations

from typing import Any, Sequence

from ..tools import Tool
from .messages import compact

GET_TOOL_INFO = "get_tool_info"
INDEX_HEADER = ("You have access to these tools; call get_tool_info with a tool's name to "
                "learn its arguments before calling it:")


def get_tool_info_tool(tools: Sequence[Tool]) -> Tool:
    return Tool(name=GET_TOOL_INFO,
                description="Get the full description and argument schema of one tool. "
                            "Call it before calling a tool whose arguments you do not know.",
                parameters={"type": "object", "required": ["name"], "properties": {
                    "name": {"type": "string", "enum": [t.name for t in tools]}}})


def tool_index(tools: Sequence[Tool]) -> str:
    """One line per tool: its name and the first line of its description."""
    lines = []
    for t in tools:
        first = (t.description.strip().splitlines() or [""])[0]
        lines.append(f"- {t.name}: {first}".rstrip(": "))
    return "\n".join(lines)


def tool_info(tools: Sequence[Tool], name: Any) -> str:
    """``get_tool_info``'s answer: the tool's schema, or an error the model can act on."""
    for t in tools:
        if t.name == name:
            return compact({"name": t.name, "description": t.description,
                            "parameters": t.parameters})
    known = ", ".join(t.name for t in tools)
    return compact({"error": f"unknown tool {name!r}; tools: {known}"})
