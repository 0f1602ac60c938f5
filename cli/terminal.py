"""Text from models, tools and files, made safe to print on a terminal.

A model's answer, a tool's stderr or a trajectory's text can hold escape sequences: an OSC
sequence retitles the window, CR rewrites the line, a bidirectional override reorders what
follows. :func:`for_terminal` shows each such character as an escape (``\\x1b``,
``\\u202e``) and keeps newlines and tabs. Not for ``--json-out``, where JSON escapes them.
"""

from __future__ import annotations

import re

# C0 controls but tab and newline, DEL, C1 controls, and Unicode's bidirectional controls
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _escape(m: re.Match) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def for_terminal(text: str) -> str:
    return _UNSAFE.sub(_escape, text)
