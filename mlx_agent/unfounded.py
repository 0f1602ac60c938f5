"""Calls that rest on a number no one gave: the user is asked for it instead.

A small model asked something its tools do not serve often calls the nearest tool anyway,
and fills the numbers it needs with its own: "What is the final price after a 25% discount
and 10% tax?" calls ``calculate_final_price`` with ``price: 100``. :func:`unfounded` finds
such a call: a required parameter holds a number (at any depth: a list's items, an object's
values) that the conversation (every message, tool results included) and the tool's own
schema (its description, defaults and examples) never write, read loosely
(:func:`~mlx_agent.heard.numbers`: "6cm", "five", "8.5 million" and "5%" as 0.05 all count).
Where the reply may be an answer (tool choice ``auto``),
:func:`mlx_agent.stated_arguments.complete_reply` replaces the call by :func:`question`,
which asks the user for those values, as OpenAI's function-calling guide asks of a model
("don't make assumptions about what values to plug into functions"): nothing runs on a
made-up input, and the user's next message gives it.

Not promised: a number the model worked out ("2 pi" as 6.2832, "a week" as 7 days) is told
from one it made up (0 and 1 are never counted: "a", "none" and "from rest" write them; nor
is a sign: "-$100", "112 W"); only numbers are read (a required string the model made up is
kept: on BFCL's questions that rule refused right calls and no wrong ones).
"""

from __future__ import annotations

import json
from typing import Any, Iterator, Sequence

from .formats import text_of
from .heard import NAME_WORD, number, numbers
from .tools import Tool

FREE = frozenset({0.0, 1.0})  # numbers a request writes without digits ("a", "from rest")


def _numbers_in(value: Any) -> Iterator[float]:
    """The numbers of ``value``, at any depth (flags are not numbers)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif (x := number(item)) is not None:
            yield abs(x)


def unfounded(tool: Tool, arguments: dict, messages: Sequence[dict]) -> list[str]:
    """The required parameters of ``tool`` whose value in ``arguments`` holds a number that
    neither ``messages`` nor the tool's schema writes (0 and 1 aside, signs aside), in the
    call's order; empty where the call is founded."""
    required = set(tool.required)
    if not required & arguments.keys():
        return []
    heard = numbers("\n".join([*(text_of(m.get("content")) for m in messages),
                               tool.description or "", json.dumps(tool.parameters)]), loose=True)
    return [name for name, value in arguments.items() if name in required
            and any(x not in FREE and x not in heard and -x not in heard
                    for x in _numbers_in(value))]


def question(tool: Tool, names: Sequence[str]) -> str:
    """What the user is asked for a call of ``tool`` on made-up ``names``: "To use
    calculate_final_price I need the price and the discount rate: what are they?"."""
    said = [f"the {' '.join(w.lower() for w in NAME_WORD.findall(n)) or n}" for n in names]
    listed = said[0] if len(said) == 1 else ", ".join(said[:-1]) + " and " + said[-1]
    return f"To use {tool.name} I need {listed}: what {'is it' if len(said) == 1 else 'are they'}?"
