"""Incremental end-of-turn detection over decoded text, O(1) amortized per character.

- :class:`JsonObjectScanner` (json, one call a reply) finds the first complete top-level
  JSON object: it is string- and escape-aware, ignores everything (a stray ``}`` included)
  before the first ``{``, and reports where the object ends.
- :class:`RepeatedLineScanner` (json, parallel calls one per line) ends the turn when a
  finished line repeats an earlier one: a small model looping on a call.
- :class:`ToolCallScanner` (hermes) ends a turn once text after a ``</tool_call>`` is
  neither white space nor the start of another ``<tool_call>``.
- :class:`NeverScanner` (plain text) leaves the end to the stop token and the token limit.

The end-of-turn token itself is the engine's stop id. Each only looks at each character once.
"""

from __future__ import annotations

OPEN, CLOSE = "<tool_call>", "</tool_call>"


class JsonObjectScanner:
    def __init__(self):
        self.text = ""
        self.start: int | None = None  # index of the first '{'
        self.end: int | None = None  # index just past the matching '}'
        self._depth = 0
        self._in_string = False
        self._escape = False

    def feed(self, segment: str) -> bool:
        """Add decoded text; True once the first top-level object is complete."""
        if self.end is not None:
            return True
        base = len(self.text)
        self.text += segment
        for i, ch in enumerate(segment, base):
            if self.start is None:
                if ch == "{":
                    self.start, self._depth = i, 1
                continue
            if self._in_string:
                if self._escape:
                    self._escape = False
                elif ch == "\\":
                    self._escape = True
                elif ch == '"':
                    self._in_string = False
            elif ch == '"':
                self._in_string = True
            elif ch == "{":
                self._depth += 1
            elif ch == "}":
                self._depth -= 1
                if self._depth == 0:
                    self.end = i + 1
                    return True
        return False

    @property
    def object_text(self) -> str | None:
        return self.text[self.start : self.end] if self.end is not None else None

    @property
    def turn_text(self) -> str:
        return self.text

    @property
    def finished(self) -> bool:
        return self.end is not None


class RepeatedLineScanner:
    def __init__(self):
        self.text = ""
        self._lines: set[str] = set()
        self._line_start = 0
        self.repeated = False

    def feed(self, segment: str) -> bool:
        """Add decoded text; True once a finished line repeats an earlier one."""
        if self.repeated:
            return True
        self.text += segment
        while (end := self.text.find("\n", self._line_start)) >= 0:
            line = self.text[self._line_start:end]
            self._line_start = end + 1
            if line in self._lines:
                self.repeated = True
                return True
            self._lines.add(line)
        return False

    @property
    def turn_text(self) -> str:
        return self.text

    @property
    def finished(self) -> bool:
        return self.repeated


class ToolCallScanner:
    def __init__(self):
        self.text = ""
        self._after_close: int | None = None  # where text after the last </tool_call> starts
        self._pos = 0  # next character to look at
        self._between = False  # after a </tool_call>, before anything else
        self._prefix = ""  # non-space text seen since that </tool_call>
        self.done = False

    def feed(self, segment: str) -> bool:
        """Add decoded text; True once the turn has plainly moved past its tool calls."""
        if self.done:
            return True
        self.text += segment
        while True:
            if not self._between:
                # a tag may straddle segments: re-scan only the last len(CLOSE) - 1 chars
                at = self.text.find(CLOSE, max(self._pos - len(CLOSE) + 1, 0))
                if at < 0:
                    self._pos = len(self.text)
                    return False
                self._after_close = self._pos = at + len(CLOSE)
                self._between, self._prefix = True, ""
            while self._pos < len(self.text):
                ch = self.text[self._pos]
                self._pos += 1
                if not self._prefix and ch.isspace():
                    continue
                self._prefix += ch
                if not OPEN.startswith(self._prefix):
                    self.done = True
                    return True
                if self._prefix == OPEN:
                    self._between = False
                    break
            else:
                return False

    @property
    def turn_text(self) -> str:
        """The text the turn keeps: up to the last ``</tool_call>`` when it ended early."""
        if self.done and self._after_close is not None:
            return self.text[: self._after_close]
        return self.text

    @property
    def finished(self) -> bool:
        return self.done


class NeverScanner:
    def __init__(self):
        self.text = ""

    def feed(self, segment: str) -> bool:
        self.text += segment
        return False

    @property
    def turn_text(self) -> str:
        return self.text

    @property
    def finished(self) -> bool:
        return False
