"""Reading hermes ``<tool_call>`` blocks out of a reply's text."""

from __future__ import annotations

import json
import re

from .messages import Call, unspaced, valid_json_text

_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


def tool_call_blocks(text: str) -> list[Call]:
    """The ``<tool_call>{"name", "arguments"}</tool_call>`` blocks in ``text``, in order; a
    block that cannot be read is a Call with ``error`` set (never dropped)."""
    calls = []
    for block in _TOOL_CALL.findall(text):
        try:
            obj = valid_json_text(json.loads(block))
        except json.JSONDecodeError as e:
            calls.append(Call("?", None, f"tool call is not valid JSON ({e.msg})"))
            continue
        except ValueError:  # int() refuses a number of more than 4,300 digits
            calls.append(Call("?", None, "tool call holds a number too long to read"))
            continue
        except RecursionError:
            calls.append(Call("?", None, "tool call is nested too deeply"))
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            calls.append(Call("?", None, 'tool call needs {"name": ..., "arguments": {...}}'))
            continue
        args = obj.get("arguments", {})
        if isinstance(args, str):  # some models send the arguments JSON-encoded
            try:
                args = valid_json_text(json.loads(args))
            except (ValueError, RecursionError):
                pass
        if not isinstance(args, dict):
            calls.append(Call(obj["name"], args, "tool call arguments must be a JSON object"))
            continue
        try:
            calls.append(Call(obj["name"], unspaced(args)))
        except RecursionError:
            calls.append(Call("?", None, "tool call is nested too deeply"))
    return calls
