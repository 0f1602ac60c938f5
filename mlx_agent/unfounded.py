"""Calls that rest on a number no one gave: the user is asked for it instead.

A small model asked something its tools do not serve often calls the nearest tool anyway,
and fills the numbers it needs with its own: "What is the final price after a 25% discount
and 10% tax?" calls ``calculate_final_price`` with ``price: 100``. :func:`unfounded` finds
such a call: a required parameter holds a number (at any depth: a list's items, an object's
values) that the conversation (every message, the system prompt and tool results included,
and the arguments of the calls it made) and the tool's own schema (its description,
defaults and examples) never write, read loosely
(:func:`~mlx_agent.heard.numbers`: "6cm", "five", "8.5 million" and "5%" as 0.05 all count).
Where the reply may be an answer (tool choice ``auto``),
:func:`mlx_agent.stated_arguments.complete_reply` replaces the call by :func:`question`,
which asks the user for those values, as OpenAI's function-calling guide asks of a model
("don't make assumptions about what values to plug into functions"): nothing runs on a
made-up input, and the user's next message gives it.

Not promised: a number the model worked out from the request ("2 pi" as 6.2832, "100 uF" as
0.0001; a word of time's count, "compounded monthly" as 12, is read) counts as made up (0
and 1 never count: "a", "none" and "from rest" write them; nor does a sign: "-$100", "112
W"); only numbers are read (a required string the model made up is kept: on BFCL's questions
that rule refused right calls and no wrong ones), except in a reply that had to be a call
because the request wrote a tool's name (``strings``: "What's the weather?" with a
``get_weather`` tool asks for the city rather than make one up, read against the user's
messages and the turn's results alone); a reply of several calls, and a tool that requires
nothing, are not read; the question is in English.
"""

from __future__ import annotations

from typing import Sequence

from .formats import text_of
from .heard import NAME_WORD, Heard, json_text, leaves, number, numbers
from .tools import Tool

FREE = frozenset({0.0, 1.0})  # numbers a request writes without digits ("a", "from rest")


def _key(x: float) -> float:
    """``x`` without its sign, to 12 significant digits: "0.7%" read as 0.006999999999999999
    is the 0.007 a model writes."""
    return float(f"{abs(x):.12g}")


def _conversation(tool: Tool, messages: Sequence[dict]) -> str:
    """The text of ``messages`` (and the arguments of the calls they made) and of the
    tool's description and schema, a line each."""
    texts = [tool.description or "", json_text(tool.parameters)]
    for m in messages:
        texts.append(text_of(m.get("content")))
        for call in m.get("tool_calls") or ():
            arguments = (call.get("function") or {}).get("arguments") \
                if isinstance(call, dict) else None
            texts.append(arguments if isinstance(arguments, str) else json_text(arguments))
    return "\n".join(texts)


def unfounded(tool: Tool, arguments: dict, messages: Sequence[dict],
              strings: str | None = None) -> list[str]:
    """The required parameters of ``tool`` whose value in ``arguments`` holds a number that
    neither ``messages`` nor the tool's description and schema write (0 and 1 aside, signs
    aside), and where ``strings`` is given (the user's messages and the turn's tool results:
    not a schema's examples, nor the tools a system prompt lists), a string that is empty
    or none of whose words it begins (:meth:`~mlx_agent.heard.Heard.made_up`; not a
    parameter's enum or const), in the call's order; empty where the call is founded."""
    required = set(tool.required)
    if not required & arguments.keys():
        return []
    said = {name: {_key(x) for v in leaves(value) if (x := number(v)) is not None} - FREE
            for name, value in arguments.items() if name in required}
    texts = {name: [v for v in leaves(value) if isinstance(v, str)]
             for name, value in arguments.items() if strings is not None and name in required
             and not (isinstance(s := tool.properties.get(name), dict)
                      and {"enum", "const"} & s.keys())}
    if not any(said.values()) and not any(texts.values()):  # nothing to read: nor is the
        return []  # conversation
    heard = {_key(x) for x in numbers(_conversation(tool, messages), loose=True)} \
        if any(said.values()) else set()
    words = Heard(strings) if strings is not None and any(texts.values()) else None

    def made_up(text: str) -> bool:
        return not text.strip() or words is not None and words.made_up(text)

    return [name for name in arguments if name in required
            and (said[name] - heard or any(map(made_up, texts.get(name, ()))))]


def question(tool: Tool, names: Sequence[str]) -> str:
    """What the user is asked for a call of ``tool`` on made-up ``names``: "To use
    calculate_final_price I need the price and the discount rate: what are they?"."""
    said = [f"the {' '.join(w.lower() for w in NAME_WORD.findall(n)) or n}" for n in names]
    listed = said[0] if len(said) == 1 else ", ".join(said[:-1]) + " and " + said[-1]
    return f"To use {tool.name} I need {listed}: what {'is it' if len(said) == 1 else 'are they'}?"
