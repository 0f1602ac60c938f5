"""Incremental end-of-turn detection over decoded text, O(1) amortized per character.

- :class:`JsonObjectScanner` (json, one call a reply) finds the first complete top-level
  JSON object: it is string- and escape-aware, ignores everything (a stray ``}`` included)
  before the first ``{``, and reports where the object ends.
- :class:`RepeatedLineScanner` (json, parallel calls one per line) ends the turn when a
  finished line repeats an earlier one: a small model looping on a call.
- :class:`ToolCallScanner` (hermes) ends a turn once text after a ``</tool_call>`` is
  neither white space nor the start of another ``<tool_call>``.
- :class:`NeverScanner` (plain text) leaves the end to the stop token and the token limit.
- :class:`RunawayListScanner` wraps json's and hermes's: it also ends the turn once a list in
  the reply's JSON has repeated its earlier items :data:`RUNAWAY_REPEATS` times in a row
  (``["G", "C", "C", "C", ...``: a loop the grammar cannot forbid), so the loop costs a few
  dozen tokens, not the reply's whole budget; :mod:`mlx_agent.runaway_list` then closes it.

The end-of-turn token itself is the engine's stop id. Each only looks at each character once.
"""

from __future__ import annotations

OPEN, CLOSE = "<tool_call>", "</tool_call>"
RUNAWAY_REPEATS = 24  # items in a row that a list already holds: a loop, not a list


class JsonObjectScanner:
    looped = False  # no loop ends its turns (RunawayListScanner's do)

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
    looped = False  # no loop ends its turns (RunawayListScanner's do)

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
    looped = False  # no loop ends its turns (RunawayListScanner's do)

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
    looped = False  # no loop ends its turns (RunawayListScanner's do)

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


class RunawayListScanner:
    """``inner``'s end of the turn, or where a JSON list in the reply (from the first ``{``
    after ``start``: hermes's ``<tool_call>``, json's reply start) has had
    :data:`RUNAWAY_REPEATS` items in a row, each followed by a comma, that it already
    held: string- and escape-aware, each character read once (a list's items are kept, as
    text, to compare). A list the user asks for with that many equal items in a row after
    its first, and another after them, is cut too (and closed after its first:
    :mod:`mlx_agent.runaway_list`)."""

    def __init__(self, inner, repeats: int = RUNAWAY_REPEATS, start: str = ""):
        self.inner, self.repeats, self.start = inner, repeats, start
        self.looped = False
        self._pos = 0
        self._started = self._in_string = self._escape = False
        self._stack: list[list] = []  # per open container: [bracket, item start, seen, run]

    def feed(self, segment: str) -> bool:
        ended = self.inner.feed(segment)
        text = self.inner.text
        begin = self._pos
        if not self._started and self.start:
            at = text.find(self.start, max(0, self._pos - len(self.start) + 1))
            if at < 0:
                self._pos = len(text)
                return ended
            begin, self.start = at + len(self.start), ""
        for i in range(begin, len(text)):
            if self.looped:
                break
            ch = text[i]
            if not self._started:
                self._started = ch == "{"
            if not self._started:
                continue
            if self._in_string:
                self._escape, self._in_string = (False, True) if self._escape else \
                    (ch == "\\", ch != '"')
            elif ch == '"':
                self._in_string = True
            elif ch in "[{":
                self._stack.append([ch, i + 1, set(), 0])
            elif ch == "," and self._stack and self._stack[-1][0] == "[":
                self._item(text, i)
            elif ch in "]}" and self._stack:  # a closed list's last item ends no loop
                self._stack.pop()
        self._pos = len(text)
        return ended or self.looped

    def _item(self, text: str, end: int) -> None:
        """The list on top of the stack has an item up to ``end``: seen before, or new."""
        frame = self._stack[-1]
        item = text[frame[1]:end].strip()
        frame[1] = end + 1
        if item in frame[2]:
            frame[3] += 1
            self.looped = frame[3] >= self.repeats
        else:
            frame[2].add(item)
            frame[3] = 0

    @property
    def text(self) -> str:
        return self.inner.text

    @property
    def turn_text(self) -> str:
        return self.inner.turn_text

    @property
    def finished(self) -> bool:
        return self.inner.finished or self.looped
