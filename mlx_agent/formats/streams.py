"""What a stream shows of a reply while it is generated: the answer's text, never protocol.

One filter per format: plain text passes through; hermes shows free text and nothing of a
reply that opens with ``<`` (calls: the grammar allows no ``<`` in text); json decodes the
string of ``{"answer": "..."}`` as it arrives, escapes included, and shows nothing of a call.
"""

from __future__ import annotations

import json


class Passthrough:
    def feed(self, delta: str) -> str:
        return delta


class HermesTextStream:
    def __init__(self):
        self.calls: bool | None = None

    def feed(self, delta: str) -> str:
        if self.calls is None:
            stripped = delta.lstrip()
            if not stripped:
                return ""
            self.calls = stripped.startswith("<")
            delta = stripped
        return "" if self.calls else delta


class JsonAnswerStream:
    PREFIX = '{"answer":"'

    def __init__(self):
        self.buf = ""
        self.pos: int | None = None  # where undecoded string text starts; -1: not an answer
        self.closed = False

    def feed(self, delta: str) -> str:
        self.buf += delta
        if self.pos is None:
            head = self.buf.lstrip()
            if len(head) < len(self.PREFIX):
                if not self.PREFIX.startswith(head):
                    self.pos = -1
                return ""
            self.pos = len(self.buf) - len(head) + len(self.PREFIX) \
                if head.startswith(self.PREFIX) else -1
        if self.pos < 0 or self.closed:
            return ""
        out, i = [], self.pos
        while i < len(self.buf):
            c = self.buf[i]
            if c == '"':
                self.closed = True
                break
            if c != "\\":
                out.append(c)
                i += 1
                continue
            width = self._escape_width(i)
            if width is None:  # the escape is not complete yet
                break
            try:
                char = json.loads(f'"{self.buf[i:i + width]}"')
            except ValueError:  # not a valid escape (only without the grammar): as written
                char = self.buf[i:i + width]
            out.append(char.encode("utf-8", "replace").decode("utf-8"))  # no lone surrogates
            i += width
        self.pos = i
        return "".join(out)

    def _escape_width(self, i: int) -> int | None:
        """The length of the escape at ``buf[i]``, or None while it is still arriving."""
        buf = self.buf
        if i + 1 >= len(buf):
            return None
        if buf[i + 1] != "u":
            return 2
        if i + 6 > len(buf):
            return None
        width = 6
        try:
            code = int(buf[i + 2:i + 6], 16)
        except ValueError:
            return width
        if 0xD800 <= code <= 0xDBFF:  # may start a surrogate pair
            if i + 8 > len(buf):
                return None
            width = 12 if buf[i + 6:i + 8] == "\\u" else 6
        return width if i + width <= len(buf) else None
