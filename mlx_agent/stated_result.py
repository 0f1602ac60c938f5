"""An answer after a tool result states it: one that writes nothing of a short result is
followed by that result.

After a call that worked, the bundled model often answers from its own head: "list_files
returned 1." for the listing "logs/server.log", "There are 4 files in the logs directory."
for one file, "Done. The result: docs.html." for "docs/agenda.md". The user asked for the
result, and a made-up answer is worse than none. :func:`stated_answer` reads the turn's last
tool result (the agent's ``{"stdout": ..., "exit_code": 0}`` as its output:
:func:`mlx_agent.stated_arguments.last_result`) and, where it is at most :data:`MAX_SAID`
characters and writes a word or a number that neither the request nor the tool's name writes
(what the result tells: numbers, words of three letters or more but function words; not only
"done" or "success": :data:`SAYS_NOTHING`), an answer that writes none of those is followed,
after a blank line, by ``"<tool> returned <result>."`` (its lines joined by commas, or
semicolons where a line holds one; a full stop where it ends in none), as the training rows
state a result (:data:`mlx_agent.synth.conversations.ANSWERS`). The model's words are kept:
an answer that worked something out from the result ("calc.py has 2 lines") may be right
without writing any of it.

Not promised: a longer result is left to the model (an answer may rightly sum a file up);
an answer that writes one of the result's words is kept, right or wrong ("There are 3
lines" for four); a failed call's error is not stated; a made-up answer is not taken out,
only shown beside the result. The server does not add to answers: it streams them as
they are generated.
"""

from __future__ import annotations

from typing import Sequence

from .described_tool import FUNCTION_WORDS
from .formats.messages import Reply
from .grammar import written_json
from .heard import words
from .probe import hold, reply_ids
from .stated_arguments import last_result, last_tool_message, last_user, request_text

MAX_SAID = 80  # the longest result (in characters) an answer is made to state
# a result that tells only these tells nothing an answer must state ("success"); "True",
# "False" and "None" do ("Yes, 91 is prime" beside is_prime's False)
SAYS_NOTHING = frozenset("success successful successfully done".split())


def _told(result: str, request: str, tool: str) -> set[str]:
    """The words and numbers of ``result`` that neither ``request`` nor the tool's name
    ``tool`` writes: numbers, and words of three letters or more but function words ("the",
    "for"; "is" and "a" are too short: an answer that writes them states nothing)."""
    known = set(words(request)) | set(words(tool.replace("_", " "))) | FUNCTION_WORDS
    return {w for w in words(result) if (len(w) > 2 or w.isdigit()) and w not in known}


def stated_answer(engine, lm, protocol: str, prompt: Sequence[int], reply: Reply, text: str,
                  ids: list[int], tail: list[int], messages: Sequence[dict]
                  ) -> tuple[Reply, str, list[int]]:
    """``reply`` (an answer to ``messages``, ``text`` sampled as ``ids`` and then ``tail``: its
    end token, if it had one) as it was, or, where it states nothing of the turn's last tool
    result (see the module docstring), the answer followed by ``"<tool> returned
    <result>."``, with its text and ids; the engine then holds ``prompt``, those ids and
    ``tail``, as if the answer had been sampled so."""
    unchanged = (reply, text, ids)
    if reply.calls or not reply.complete or not reply.content \
            or getattr(engine, "cache_mode", None) == "rotating":  # a window cannot be cut back
        return unchanged
    tool = last_tool_message(messages) if last_user(messages) is not None else None
    result = last_result(messages) if tool is not None else None
    if not result or len(result) > MAX_SAID:
        return unchanged
    name = str(tool.get("name") or "the tool")
    told = _told(result, request_text(messages), name)
    if not told - SAYS_NOTHING or told & set(words(reply.content)):
        return unchanged
    lines = [line.strip() for line in result.splitlines() if line.strip()]
    said = ("; " if any("," in line for line in lines) else ", ").join(lines)
    stop = "" if said.endswith((".", "!", "?")) else "."
    content = f"{reply.content.rstrip()}\n\n{name} returned {said}{stop}"
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
