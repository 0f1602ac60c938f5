"""An answer after a tool result states it: one that writes nothing of a short result is
followed by that result, and one that misses the line a request asks about, by that line.

After a call that worked, the bundled model often answers from its own head: "list_files
returned 1." for the listing "logs/server.log", "There are 4 files in the logs directory."
for one file, "Done. The result: docs.html." for "docs/agenda.md". The user asked for the
result, and a made-up answer is worse than none. :func:`stated_answer` reads the turn's last
tool result (the agent's ``{"stdout": ..., "exit_code": 0}`` as its output:
:attr:`mlx_agent.stated_arguments.ToolMessage.result`) and follows an answer, after a blank
line, by what it leaves unsaid:

- where a line of the result sets a value by a name whose words the request writes
  ("closing_hour = 18" for "tell me the closing hour", "Owner: Priya
  Nair" for "Who owns the shop?"; one such line, however long the result), an answer that
  writes nothing the line tells is followed by ``"From <tool>: <line>."``;
- else, where the result is at most :data:`MAX_SAID` characters and writes a word or a
  number that neither the request nor the tool's name writes (what the result tells:
  numbers, words of three letters or more but function words; not only "done" or
  "success": :data:`SAYS_NOTHING`), an answer that writes none of those, or quotes the
  result cut short ("It returned logs/april.log:2: 2026-04-05." for a line that goes on),
  is followed by ``"<tool> returned <result>."`` (its lines joined by commas, or semicolons
  where a line holds one; a full stop where it ends in none), as the training rows state a
  result (:data:`mlx_agent.synth.conversations.ANSWERS`).

The model's words are kept: an answer that worked something out from the result ("calc.py
has 2 lines") may be right without writing any of it.

Not promised: a longer result is otherwise left to the model (an answer may rightly sum a
file up); an answer that writes one of the result's words (but for a quote cut short, and
of a line asked about, its value's) is kept, right or wrong ("There are 3 lines" for four); a
failed call's error is not stated; a made-up answer is not taken out, only shown beside the
result; a line longer than :data:`MAX_LINE` characters is not one asked about. The server
does not add to answers: it streams them as they are generated.
"""

from __future__ import annotations

import re
from typing import Sequence

from .described_tool import FUNCTION_WORDS, stems
from .formats.messages import Reply
from .grammar import written_json
from .heard import words
from .probe import hold, reply_ids
from .stated_arguments import last_user, request_text, turn_tool_messages

MAX_SAID = 80  # the longest result (in characters) an answer is made to state whole
MIN_QUOTE = 10  # the characters of a result an answer quotes before it cuts the rest
MAX_LINES = 1_000  # of a longer result, the lines read for the one the request asks about
MAX_LINE = 200  # the longest line (in characters) an answer is followed by
# a result that tells only these tells nothing an answer must state ("success"); "True",
# "False" and "None" do ("Yes, 91 is prime" beside is_prime's False)
SAYS_NOTHING = frozenset("success successful successfully done".split())


def _told(result: str, request: str, tool: str) -> set[str]:
    """The words and numbers of ``result`` that neither ``request`` nor the tool's name
    ``tool`` writes: numbers, and words of three letters or more but function words ("the",
    "for"; "is" and "a" are too short: an answer that writes them states nothing)."""
    known = set(words(request)) | set(words(tool.replace("_", " "))) | FUNCTION_WORDS
    return {w for w in words(result) if (len(w) > 2 or w.isdigit()) and w not in known}


def _unstated(result: str, request: str, name: str, answer: str) -> str | None:
    """What ``answer`` leaves unsaid of the tool ``name``'s ``result`` (see the module
    docstring), as the sentence to follow it; None where it states the result."""
    answered = set(words(answer))
    if (asked := _asked(result, request)) is not None:
        line, value = asked
        told = _told(value, request, name)
        return f"From {name}: {line}" if told and not told & answered else None
    if len(result) > MAX_SAID:
        return None
    told = _told(result, request, name)
    if not told - SAYS_NOTHING or told & answered and not _cut(result, answer, told, answered):
        return None
    lines = [line.strip() for line in result.splitlines() if line.strip()]
    joined = ("; " if any("," in line for line in lines) else ", ").join(lines)
    return f"{name} returned {joined}"


def _cut(result: str, answer: str, told: set[str], answered: set[str]) -> bool:
    """Whether ``answer`` quotes ``result`` cut short: it writes its first
    :data:`MIN_QUOTE` characters or more, and none of what the rest of it tells ("It
    returned logs/april.log:2: 2026-04-05." for a line that goes on "replaced chain for
    Mateo")."""
    text = " ".join(result.split())
    start = next((k for k in range(len(text), MIN_QUOTE - 1, -1) if text[:k] in answer), 0)
    rest = set(words(text[start:])) & told
    return bool(start) and start < len(text) and bool(rest) and not rest & answered


# a line that sets a value by name: "closing_hour = 18", "Owner: Priya Nair" (and a grep
# result's "path:3: " before it)
_KEYED = re.compile(r"^(?:[^:\n]{1,300}:\d+:\s*)?([A-Za-z][\w .-]{0,40}?)\s*[:=]\s*(\S.*)$")


def _asked(result: str, request: str) -> tuple[str, str] | None:
    """The one line of ``result`` that sets a value by a name whose every word ``request``
    writes (:func:`~mlx_agent.described_tool.stems`: "closing_hour = 18" for "tell me the
    closing hour", "Owner: Priya Nair" for "Who owns the shop?"), stripped, and the value it
    sets; None where no line or more than one does."""
    said = stems(request)
    found = [(line.strip(), m.group(2)) for line in result.splitlines()[:MAX_LINES]
             if len(line.strip()) <= MAX_LINE and (m := _KEYED.match(line.strip()))
             and (key := stems(m.group(1))) and key <= said]
    return found[0] if len(found) == 1 else None


def stated_answer(engine, lm, protocol: str, prompt: Sequence[int], reply: Reply, text: str,
                  ids: list[int], tail: list[int], messages: Sequence[dict]
                  ) -> tuple[Reply, str, list[int]]:
    """``reply`` (an answer to ``messages``, ``text`` sampled as ``ids`` and then ``tail``: its
    end token, if it had one) as it was, or, where it states nothing of the turn's last tool
    result (see the module docstring), the answer followed by what it leaves unsaid, with
    its text and ids; the engine then holds ``prompt``, those ids and ``tail``, as if the
    answer had been sampled so."""
    unchanged = (reply, text, ids)
    if reply.calls or not reply.complete or not reply.content \
            or getattr(engine, "cache_mode", None) == "rotating":  # a window cannot be cut back
        return unchanged
    results = turn_tool_messages(messages) if last_user(messages) is not None else []
    result = results[-1].result if results else None
    if not result:
        return unchanged
    name = results[-1].name or "the tool"
    said = _unstated(result, request_text(messages), name, reply.content)
    if said is None:
        return unchanged
    stop = "" if said.endswith((".", "!", "?")) else "."
    content = f"{reply.content.rstrip()}\n\n{said}{stop}"
    text = written_json({"answer": content}, "json") if protocol == "json" else content
    ids = reply_ids(lm, protocol, text)
    room = getattr(engine, "context_length", None)
    if room is not None and len(prompt) + len(ids) + len(tail) > room:  # the answer as sampled
        return unchanged  # fits; with the result it would not
    try:
        hold(engine, list(prompt) + ids + tail)
    except KeyboardInterrupt:  # the caller keeps the answer as sampled: so does the engine
        hold(engine, list(prompt) + unchanged[2] + tail)
        raise
    return Reply(content=content), text, ids
