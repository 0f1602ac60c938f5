"""Stop strings: cut streamed text at the first one, holding back a tail that may start one."""

from __future__ import annotations

from typing import Sequence


class StopStrings:
    def __init__(self, stops: Sequence[str]):
        self.stops = [s for s in stops if s]
        self.text = ""
        self.sent = 0
        self.hit = False

    def _held(self) -> int:
        """The longest tail of the text that is a proper prefix of a stop string."""
        best = 0
        for stop in self.stops:
            for k in range(min(len(stop) - 1, len(self.text)), best, -1):
                if self.text.endswith(stop[:k]):
                    best = k
                    break
        return best

    def feed(self, delta: str) -> str:
        """Add text; returns what may be shown now."""
        if self.hit:  # nothing after a stop string, even what the detokenizer held back
            return ""
        self.text += delta
        if not self.stops:
            return self.flush()
        start = max(self.sent - max(len(s) for s in self.stops), 0)
        found = [i for i in (self.text.find(s, start) for s in self.stops) if i >= 0]
        if found:
            self.text, self.hit = self.text[: min(found)], True
            return self.flush()
        ready = len(self.text) - self._held()
        out = self.text[self.sent:max(ready, self.sent)]
        self.sent += len(out)
        return out

    def flush(self) -> str:
        out = self.text[self.sent:]
        self.sent = len(self.text)
        return out
