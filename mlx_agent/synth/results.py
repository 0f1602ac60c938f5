"""A tool result made up from the tool's name, description and arguments, for a written
conversation whose tool could not give a real one.

:func:`synthesised_result` reads what the tool does from the words of its name and
description (weather, a price, a distance, a count, a search, an action such as send or
create, ...) and writes one short line of that shape, drawing numbers and ids from the
``random.Random`` it is given, so the same seed gives the same line. It echoes an argument
where that makes the line read naturally ("3 results for 'tea'").

Not promised: that the line is what the tool would return, or in the tool's own format. A
model trained on it learns to call and to report; not the tool's output format.
"""

from __future__ import annotations

import random
from typing import Any

from ..tools import Tool
from . import pools as P
from .values import singular, words

CONDITIONS = ("sunny", "cloudy", "light rain", "clear", "windy", "overcast", "snow showers")
STATES = ("active", "ready", "available", "pending", "ok", "enabled")
PAST = {
    "add": "added", "approve": "approved", "archive": "archived", "assign": "assigned",
    "book": "booked", "cancel": "cancelled", "create": "created", "delete": "deleted",
    "move": "moved", "order": "ordered", "pay": "paid", "post": "posted",
    "publish": "published", "register": "registered", "remove": "removed",
    "rename": "renamed", "reserve": "reserved", "save": "saved", "schedule": "scheduled",
    "send": "sent", "set": "set", "share": "shared", "start": "started", "stop": "stopped",
    "submit": "submitted", "transfer": "transferred", "update": "updated",
    "upload": "uploaded", "write": "written", "log": "logged", "invite": "invited",
    "subscribe": "subscribed", "enable": "enabled", "disable": "disabled",
}
SEARCHES = {"search", "find", "list", "query", "browse", "filter"}


def _first_text(arguments: dict) -> str | None:
    """The first short string argument, to echo back."""
    return next((v for v in arguments.values() if isinstance(v, str) and 0 < len(v) <= 40),
                None)


def _weather(tool, args, rng) -> str:
    place = _first_text(args)
    where = f" in {place}" if place else ""
    return f"{rng.randint(-5, 34)}°C and {rng.choice(CONDITIONS)}{where}"


def _money(tool, args, rng) -> str:
    return f"{rng.randint(2, 900)}.{rng.randint(0, 99):02d}"


def _distance(tool, args, rng) -> str:
    return f"{rng.randint(1, 900)}.{rng.randint(0, 9)} km"


def _count(tool, args, rng) -> str:
    return str(rng.randint(2, 500))


def _time(tool, args, rng) -> str:
    return f"{rng.randint(0, 23):02d}:{rng.choice((0, 10, 15, 20, 30, 45, 50)):02d}"


def _date(tool, args, rng) -> str:
    return f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"


def _text(tool, args, rng) -> str:
    return rng.choice(P.SENTENCES)


def _search(tool, args, rng) -> str:
    query = _first_text(args)
    return f"{rng.randint(2, 40)} results" + (f" for '{query}'" if query else "")


# (words that mark the kind, how its result reads), tried in this order
KINDS = (
    ({"weather", "forecast", "temperature", "climate"}, _weather),
    ({"price", "cost", "quote", "fare", "balance", "salary", "fee", "rate", "exchange",
      "convert", "currency", "stock", "tax", "tip"}, _money),
    ({"distance", "route", "length", "far"}, _distance),
    ({"count", "number", "total", "sum", "many", "population", "size"}, _count),
    ({"time", "clock", "timezone", "hour"}, _time),
    ({"read", "file", "content", "open", "cat", "note", "message", "text"}, _text),
    ({"date", "day", "birthday", "deadline", "holiday"}, _date),
)


def synthesised_result(tool: Tool, arguments: dict[str, Any], rng: random.Random) -> str:
    """One plausible, short result line for this call (see the module docstring)."""
    name = [singular(w.lower()) for w in words(tool.name)]
    described = {singular(w.lower()) for w in words(tool.description)}
    verb = next((w for w in name if w in PAST), None)
    if verb is not None:  # an action: it reports what it did, with an id
        thing = " ".join(w for w in name if w != verb) or "request"
        return f"{thing} {PAST[verb]} (id {rng.randint(1000, 9999)})"
    if set(name) & SEARCHES:
        return _search(tool, arguments, rng)
    for keys in (set(name), described):
        for marks, make in KINDS:
            if marks & keys:
                return make(tool, arguments, rng)
    thing = " ".join(w for w in name if w not in {"get", "fetch", "check", "read", "lookup",
                                                     "look", "show"}) or "status"
    return f"{thing}: {rng.choice(STATES)}"
