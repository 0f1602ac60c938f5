"""The tool a request tells the agent, by name, to use: "Use the echo tool to say hello."

A small model does not always do what it is told in so many words: asked "Use the echo
tool to say hello.", the bundled model greets the user and calls nothing. When a request
tells the agent to use one of the catalogue's tools by name ("use the echo tool", "call
`echo`", "run search_files", "with the weather tool"), the agent's first step is made to
call that tool (its grammar allows that call only); the model still writes the arguments,
and every later step is its own choice.

Not promised: reading intent. A name counts after *use*, *call*, *run*, *invoke*,
*execute*, *try*, *with* or *using* (and "the", "your", "my"), followed by "tool",
"function" or "command", or in quotes or backticks; bare ("use search_files") only where the
name is no English word (it has ``_``, ``-``, ``.``, a digit or an inner capital), so "use
the time you have" never forces a ``time`` tool. Underscores and hyphens may be written as
spaces, in any case. A negation just before ("don't use the echo tool") or a question about
it ("how do I use the echo tool?") names nothing. The first tool named wins.
"""

from __future__ import annotations

import re
from typing import Iterable

_VERBS = r"(?:use|call|run|invoke|execute|try|with|using)"
_BARE_VERBS = r"(?:use|call|run|invoke|execute)"
_NOT = re.compile(r"(?:\b(?:don'?t|do not|never|not|without|no need to|stop)\s+(?:\w+\s+)?)$",
                  re.IGNORECASE)
_ASKING = re.compile(r"\b(?:how|why|when|whether|should)\s+(?:do|does|did|can|could|would|"
                     r"should|to|i|we|you)\b[^.?!]*$", re.IGNORECASE)
_DISTINCT = re.compile(r"[_\-.\d]|[a-z][A-Z]")  # search_files, getWeather; not "search"


def _spelling(name: str) -> str:
    """``name`` as a request may write it: ``get_weather`` also as "get weather"."""
    parts = [re.escape(p) for p in re.split(r"[_\-\s]+", name) if p]
    return r"[_\-\s]?".join(parts) if parts else re.escape(name)


def _patterns(name: str) -> list[re.Pattern]:
    spelled, the = _spelling(name), r"(?:the\s+|your\s+|my\s+)?"
    found = [rf"\b{_VERBS}\s+{the}{spelled}\s+(?:tool|function|command)\b",  # the echo tool
             rf"\b{_VERBS}\s+{the}[`'\"]{spelled}[`'\"]"]  # `echo`
    if _DISTINCT.search(name):  # a name no sentence uses as a word: bare will do
        found.append(rf"\b{_BARE_VERBS}\s+{the}{spelled}(?![\w-])")
    return [re.compile(p, re.IGNORECASE) for p in found]


def named_tool(text: str, names: Iterable[str]) -> str | None:
    """The tool ``text`` tells the agent to use, by one of ``names``; None when it names
    none (see the module's promises)."""
    first: tuple[int, str] | None = None
    for name in names:
        for pattern in _patterns(name):
            for found in pattern.finditer(text):
                before = text[:found.start()]
                if _NOT.search(before) or _ASKING.search(before):
                    continue
                if first is None or found.start() < first[0]:
                    first = (found.start(), name)
                break
    return first[1] if first else None
