"""A call cut short by a list that repeats itself: the list closed, the call finished.

A small model writing a list under the grammar can fall into a loop: asked for "a DNA
sequence with 100 bases including more G and C", it wrote ``"preferences": ["G", "C", "G",
"C", "C", "C", ...`` until the reply's token budget ran out; asked for a sensor's alerts,
``"networkId": ["SERPENDABLE", "SERPENDABLE", ...``. The reply is then no call at all, and
the turn ends with nothing. The grammar cannot forbid the loop (a list may repeat an item;
JSON grammars have no "unlike the item before"), so the runtime reads it afterwards:

:func:`runaway_cut` finds, in a call's text cut off at the budget, the innermost open list
whose items from some point on only repeat items before that point (at least
:data:`REPEATS` of them, each one whole): the loop. :func:`closed_call` cuts the list there,
closes it and the call's open objects, and has the model write each required argument the
call had not reached (:func:`mlx_agent.probe.probe`, in the grammar's order); the call is
then the one the grammar would write (:func:`mlx_agent.grammar.call_text`), and goes on
through the rest of :func:`mlx_agent.stated_arguments.complete_reply` like any other.

The agent and the server end such a reply early: their scanners stop a list that has
repeated its items 24 times in a row (:class:`~mlx_agent.formats.scanner.RunawayListScanner`),
so the loop costs a few dozen tokens; a reply cut at its token budget is read the same way.

Not promised: only a reply cut off inside such a list is read, whatever cut it off (a string
that runs on, or a list of new items that never ends, stays cut off; a list that loops and
then runs on in a string is closed before that string); a list whose items repeat in a
longer cycle than the items before it ("A", "B", "A", "A", "B", "A", ...) is cut at its
first repeat; a required argument nested in an object the call had not reached makes the
call fail its schema, and the reply stays as it was.
"""

from __future__ import annotations

import json
from typing import Callable, Sequence

from .engine import Sampler, greedy_sampler
from .formats.messages import Call, Reply, unspaced
from .grammar import call_text, written_arguments
from .probe import probe, reply_ids
from .tools import Tool

REPEATS = 3  # the fewest repeated items, after the last new one, that make a list a loop


def _frames(text: str, start: int) -> list[tuple[str, int, list[tuple[int, int]]]]:
    """The containers open where ``text`` ends, outermost first, reading its JSON from
    ``start``: each one's bracket, where it opened, and for a list its whole items'
    spans."""
    stack: list[tuple[str, int, list[tuple[int, int]]]] = []
    in_string = escaped = False
    for i in range(start, len(text)):
        c = text[i]
        if in_string:
            escaped, in_string = (False, True) if escaped else (c == "\\", c != '"')
            continue
        if c == '"':
            in_string = True
        elif c in "[{":
            stack.append((c, i, []))
        elif c in "]}" and stack:
            stack.pop()
        elif c == "," and stack and stack[-1][0] == "[":
            items = stack[-1][2]
            items.append((items[-1][1] + 1 if items else stack[-1][1] + 1, i))
    return stack


def _loop_start(items: list[str]) -> int | None:
    """The first index from which every item repeats one before that index, with at least
    :data:`REPEATS` items from it on; None where there is none. Linear: an item repeats
    one before ``c`` where it first came before ``c``, so ``c`` works where the latest first
    coming of the items from ``c`` on is before ``c``."""
    first: dict[str, int] = {}
    firsts = [first.setdefault(item, i) for i, item in enumerate(items)]
    latest = -1
    starts = []
    for c in range(len(items) - 1, 0, -1):  # latest first coming of items[c:], from the end
        latest = max(latest, firsts[c])
        if latest < c and len(items) - c >= REPEATS:
            starts.append(c)
    return min(starts) if starts else None


def runaway_cut(text: str) -> str | None:
    """``text`` (a call's JSON, cut off) up to the end of the last new item of the
    innermost open list that then only repeats its items (:data:`REPEATS` or more of them),
    that list and every container around it closed; None where no open list does."""
    start = text.find("{")
    if start < 0:
        return None
    frames = _frames(text, start)
    for depth in range(len(frames) - 1, -1, -1):
        bracket, _, spans = frames[depth]
        if bracket != "[":
            continue
        cut = _loop_start([text[a:b].strip() for a, b in spans])
        if cut is None:
            continue
        closing = "".join("]" if b == "[" else "}" for b, _, _ in reversed(frames[:depth]))
        return text[start:spans[cut - 1][1]] + "]" + closing
    return None


def closed_call(engine, lm, protocol: str, prompt: Sequence[int], text: str,
                tools: Sequence[Tool], sampler: Sampler = greedy_sampler,
                stop: Callable[[], bool] = lambda: False
                ) -> tuple[Reply, str, list[int]] | None:
    """The reply ``text`` (cut off at its budget after ``prompt``) as one call, its
    runaway list closed (:func:`runaway_cut`) and each required argument it had not
    reached probed, with the call's text as the grammar writes it and that text's ids;
    None where the text holds no such list, names none of ``tools``, a probe writes
    nothing, ``stop`` says so, or the call fails its schema. The engine is left wherever
    the last probe left it."""
    closed = runaway_cut(text)
    try:
        obj = unspaced(json.loads(closed)) if closed is not None else None
    except (ValueError, RecursionError):
        return None
    key = "tool" if protocol == "json" else "name"
    if not isinstance(obj, dict) or not isinstance(obj.get("arguments"), dict):
        return None
    tool = next((t for t in tools if t.name == obj.get(key)), None)
    if tool is None:
        return None
    arguments = dict(obj["arguments"])
    for name in [p for p in tool.argument_order() if p in tool.required and p not in arguments]:
        if stop():
            return None
        value = probe(engine, lm, sampler, prompt, protocol, tool, arguments, name)
        if value is None:
            return None
        arguments[name] = value
    arguments = written_arguments(protocol, tool, arguments)
    if tool.validate(arguments):
        return None
    written = call_text(protocol, tool, arguments)
    return Reply(calls=[Call(tool.name, arguments)]), written, reply_ids(lm, protocol, written)
