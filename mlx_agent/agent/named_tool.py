"""The tool a request tells the agent, by name, to use: "Use the echo tool to say hello."

A small model does not always do what it is told in so many words: asked "Use the echo
tool to say hello.", the bundled model greets the user and calls nothing. When a request
tells the agent to use one of the catalogue's tools by name ("use the echo tool", "call
`echo`", "run search_files", "with the calculator tool"), the agent's first step is made to
call that tool (its grammar allows that call only); the model still writes the arguments,
and every later step is its own choice.

Not promised: reading intent. A name counts after *use*, *call*, *run*, *invoke*,
*execute*, *try*, *with* or *using* (and "the", "your", "my"), followed by "tool",
"function" or "command", or in quotes or backticks; bare ("use search_files") only where the
name is no English word (it has ``_``, ``-``, ``.``, a digit or an inner capital), so "use
the time you have" never forces a ``time`` tool. Underscores and hyphens may be written as
spaces, in any case. A negation just before ("don't use the echo tool", "you don't need to
call it", "avoid using") or a question about it ("how do I use the echo tool?", "is it safe
to run the delete_files tool?") names nothing. The first tool named wins, among the
request's first :data:`MAX_VERBS` such verbs.
"""

from __future__ import annotations

import re
from typing import Iterable

_VERB = re.compile(r"\b(use|call|run|invoke|execute|try|with|using)\s+(?:(?:the|your|my)\s+)?",
                   re.IGNORECASE)
_BARE_VERBS = frozenset({"use", "call", "run", "invoke", "execute"})
_WORD = re.compile(r"[^\W_]+(?:\.[^\W_]+)*")  # a name's words: get, weather; math.factorial
_JOIN = re.compile(r"[_\-\s]?")  # what may stand between a name's words as written
_KIND = re.compile(r"\s+(?:tool|function|command)\b", re.IGNORECASE)
_NOT = re.compile(r"\b(?:(?:don|doesn)['\u2019]?t|do not|never|not|without|no need to|stop|"
                  r"avoid|instead of)\s+(?:(?:need|have)\s+to\s+)?(?:\w+\s+)?$", re.IGNORECASE)
_ASKING = re.compile(r"\b(?:how|why|when|whether|should)\s+(?:do|does|did|can|could|would|"
                     r"should|to|i|we|you)\b[^.?!]*$", re.IGNORECASE)
# a sentence that opens as a question ("Is it safe to run the delete_files tool?"); "can
# you", "could you" open a request
_QUESTION = re.compile(r"(?:what|which|who|whose|where|is|are|was|were|do|does|did|has|have|"
                       r"am|may|might|shall)\b", re.IGNORECASE)
_SENTENCE = re.compile(r"[.?!](?=\s|$)|\n")
_DISTINCT = re.compile(r"[_\-.\d]|[a-z][A-Z]")  # search_files, getWeather; not "search"
_NEAR = 200  # characters before a verb that a negation or a question is looked for in
MAX_VERBS = 64  # verbs of one request looked at (a hostile one repeats them without end)


def _key(name: str) -> tuple[str, ...]:
    return tuple(w.lower() for w in _WORD.findall(name))


def named_tool(text: str, names: Iterable[str]) -> str | None:
    """The tool ``text`` tells the agent to use, by one of ``names``; None when it names
    none (see the module's promises). A dict lookup per verb, so a catalogue's size costs
    nothing per request."""
    table: dict[tuple[str, ...], str] = {}
    for name in names:
        if (key := _key(name)) and "".join(key) == re.sub(r"[_\-\s]", "", name).lower():
            table.setdefault(key, name)  # a name of other characters is never matched
    if not table:
        return None
    longest = max(len(k) for k in table)
    for n, verb in enumerate(_VERB.finditer(text)):
        if n == MAX_VERBS:
            break
        named = _after(text, verb, table, longest)
        if named is None:
            continue
        before = text[max(0, verb.start() - _NEAR):verb.start()]
        if not (_NOT.search(before) or _ASKING.search(before) or _asked(text, verb, before)):
            return named
    return None


def _asked(text: str, verb: re.Match, before: str) -> bool:
    """Whether the verb's sentence asks about the tool: it opens as a question, ends in "?"."""
    starts = [m.end() for m in _SENTENCE.finditer(before)]
    if not starts and verb.start() > _NEAR:  # the sentence opens further back than we look
        return False
    opening = before[max(starts, default=0):]
    if not _QUESTION.match(opening.lstrip(" \t\"'(*")):
        return False
    end = _SENTENCE.search(text, verb.end(), verb.end() + _NEAR)
    return end is not None and end.group() == "?"


def _after(text: str, verb: re.Match, table: dict, longest: int) -> str | None:
    """The tool whose name follows ``verb`` as an instruction names it, if one does."""
    at = verb.end()
    quote = text[at:at + 1] if text[at:at + 1] in "`'\"" else ""
    at += len(quote)
    words, ends = [], []
    for word in _WORD.finditer(text, at, at + 200):
        if word.start() != (ends[-1] if ends else at) and not (
                ends and _JOIN.fullmatch(text[ends[-1]:word.start()])):
            break
        words.append(word.group().lower())
        ends.append(word.end())
        if len(words) == longest:
            break
    for k in range(len(words), 0, -1):  # the longest name that fits
        name = table.get(tuple(words[:k]))
        if name is None:
            continue
        end = ends[k - 1]
        if quote:
            return name if text[end:end + 1] == quote else None
        if _KIND.match(text, end):
            return name
        bare = verb.group(1).lower() in _BARE_VERBS and _DISTINCT.search(name)
        return name if bare and not re.match(r"[\w-]", text[end:end + 1]) else None
    return None
