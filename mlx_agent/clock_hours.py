"""An hour of the day on the clock its parameter asks: "11 PM" as 23 where it counts 24.

Asked for a restaurant "that opens until at least 11 PM" by a tool whose closing hour "is
in 24 hour format", a small model copies the number it reads: ``operating_hours: 11``, an
hour before noon. :func:`clock_hours` makes an hour the request writes with "PM" (or "12
AM", midnight) the hour a 24-hour clock gives it, where the parameter is a number whose
description says it counts 24 hours ("24 hour format", "24-hour clock", "0-23", "military
time").

Not promised: hours written as strings ("11:00 PM" for a ``time`` string is left as it is),
minutes, or an hour the request also writes as a bare number elsewhere ("11 guests at 11
PM" is left as the model wrote it: which one it copied cannot be told).
"""

from __future__ import annotations

import re
from typing import Any

from .heard import DESCRIPTION_CHARS
from .tools import Tool

# "in 24 hour format", "24-hour clock", "Hour (24h)", "(0-23)"; not "at most 24h", "(max
# 24h)", "within 24 hours": durations
_CLOCK = re.compile(r"\b24[- ]?(?:hours?|hrs?|h)\s*(?:format|clock|time|notation)\b"
                    r"|\(\s*24[- ]?(?:hours?|hrs?|h)\s*\)|\b0\s*(?:-|to)\s*23\b"
                    r"|\bmilitary time\b", re.IGNORECASE)


def counts_24(schema: Any) -> bool:
    """Whether a parameter is a number of the hour on a 24-hour clock, by its description."""
    return isinstance(schema, dict) and schema.get("type") in ("integer", "number") \
        and isinstance(schema.get("description"), str) \
        and bool(_CLOCK.search(schema["description"][:DESCRIPTION_CHARS]))


def on_24_clock(hour: int, request: str) -> int | None:
    """``hour`` on a 24-hour clock where the request writes it with "PM" (23 for "11 PM",
    12 for "12 pm") or as "12 AM" (0), and nowhere bare; None where it does not."""
    if not 1 <= hour <= 12:
        return None
    written = list(re.finditer(rf"(?<![\d.:]){hour}(?:[:.]00)?(?![\d.:])(\s*([ap])\.?m\b\.?)?",
                               request, re.IGNORECASE))
    if not written or any(m.group(1) is None for m in written):
        return None
    halves = {m.group(2).lower() for m in written}
    if halves == {"p"}:
        return hour if hour == 12 else hour + 12
    return 0 if halves == {"a"} and hour == 12 else None


def clock_hours(tool: Tool, arguments: dict, request: str) -> dict:
    """``arguments`` with each hour of a 24-hour parameter (:func:`counts_24`) the request
    writes on a 12-hour clock on the 24-hour one (:func:`on_24_clock`), where the schema
    takes it; ``arguments`` itself where none is."""
    out = arguments
    for name, value in arguments.items():
        # compared before int(): a parsed 1e999 is inf, 10**400 no float
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not 0 <= value <= 24 or value != int(value) \
                or not counts_24(tool.properties.get(name)):
            continue
        hour = on_24_clock(int(value), request)
        if hour is not None and hour != value and not tool.validate({**out, name: hour}):
            out = {**out, name: hour}
    return out
