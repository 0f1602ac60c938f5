"""What is wrong with a JSON document, said where an editor would show it.

msgspec reports a byte offset (``JSON is malformed: invalid character (byte 106)``);
:func:`json_problem` turns it into the line, the column and the character found there
(``invalid character 'N' at line 3, column 57 (JSON has no NaN; write null or a number)``;
a document of one line, as a JSONL row is, gets the column alone). Not promised: the column
counts characters of valid UTF-8 only.
"""

from __future__ import annotations

import re

_AT_BYTE = re.compile(r"^JSON is malformed: (.*) \(byte (\d+)\)$")
_HINTS = {"N": "JSON has no NaN; write null or a number",
          "I": "JSON has no Infinity; write null or a number",
          "'": "JSON strings take double quotes",
          "/": "JSON has no comments"}


def json_problem(error: Exception, data: bytes | str) -> str:
    """msgspec's ``error`` on ``data``, with the line and column it happened at."""
    text = str(error)
    if text == "Input data was truncated":
        return "the JSON ends early (an unclosed bracket, brace or string)" if data.strip() \
            else "the file is empty"
    found = _AT_BYTE.match(text)
    if not found:
        return text
    what, offset = found.group(1), int(found.group(2))
    if what == "trailing characters":  # msgspec counts one past the first of them
        offset = max(offset - 1, 0)
    raw = data.encode("utf-8", "surrogateescape") if isinstance(data, str) else data
    before = raw[:offset].decode("utf-8", "replace")
    line = before.count("\n") + 1
    column = len(before) - (before.rfind("\n") + 1) + 1
    char = raw[offset:offset + 1].decode("utf-8", "replace")
    shown = f" {char!r}" if what == "invalid character" and char.isprintable() and char else ""
    hint = _HINTS.get(char) if what == "invalid character" else None
    where = f"line {line}, column {column}" if b"\n" in raw.rstrip() else f"column {column}"
    return f"{what}{shown} at {where}" + (f" ({hint})" if hint else "")
