"""Hours on the clock their parameter counts (mlx_agent/clock_hours.py): the default adapter
wrote ``operating_hours: 11`` for "opens until at least 11 PM" where the hour "is in 24 hour
format"."""

from __future__ import annotations

import json

import pytest

from mlx_agent.clock_hours import clock_hours, counts_24, on_24_clock
from mlx_agent.tools import parse_tools


def tool(**properties):
    return parse_tools(json.dumps([{"name": "t", "description": "A tool.", "parameters": {
        "type": "object", "properties": properties,
        "required": list(properties)}}]), runnable=False)[0]


@pytest.mark.parametrize("hour, request_, expected", [
    (11, "a restaurant that opens until at least 11 PM.", 23), (11, "by 11pm", 23),
    (9, "from 9 p.m. on", 21), (3, "at 3:00 PM", 15), (12, "at 12 pm", 12),
    (12, "at 12 AM", 0), (11, "at 11 AM", None), (11, "at 11", None),  # no PM
    (11, "11 guests at 11 PM", None),  # which 11 the model copied cannot be told
    (11, "at 11 PM or 11 AM", None), (3, "at 3.5 PM", None), (13, "at 13 PM", None),
    (1, "at 11 PM", None),
])
def test_an_hour_on_a_24_hour_clock(hour, request_, expected):
    assert on_24_clock(hour, request_) == expected


def test_an_hour_is_made_the_24_hour_one_where_its_parameter_counts_24():
    closing = {"type": "integer",
               "description": "Latest closing time. This is in 24 hour format."}
    t = tool(hour=closing, guests={"type": "integer"})
    request = "Find a place open until at least 11 PM for 4 guests."
    assert clock_hours(t, {"hour": 11, "guests": 4}, request) == {"hour": 23, "guests": 4}
    assert counts_24({"type": "number", "description": "Hour of the day (0-23)"})
    for schema in ({"type": "integer", "description": "The hour."},  # a 12-hour clock?
                   {"type": "string", "description": "Time, 24-hour clock"},  # a string
                   {"type": "integer", "description": "in 24 hour format", "maximum": 12}):
        arguments = {"hour": 11, "guests": 4}
        assert clock_hours(tool(hour=schema, guests={"type": "integer"}), arguments,
                           request) is arguments
    assert not counts_24({"type": "integer", "description": "Lasts at most 24h."})
    far = "The hour. " * 300 + "In 24 hour format."  # read to DESCRIPTION_CHARS only
    assert not counts_24({"type": "integer", "description": far})
    for duration in ("Within 24 hours of booking", "Duration in hours (max 24h)",
                     "Hours ahead to forecast (1-24h)", "Cache TTL in hours; default 24h"):
        assert not counts_24({"type": "integer", "description": duration})
    assert counts_24({"type": "integer", "description": "Closing hour (24h)"})
    for odd in (float("inf"), float("nan"), 1e300, 10 ** 400, -11, 11.5):  # 1e999 is inf
        arguments = {"hour": odd, "guests": 4}
        assert clock_hours(t, arguments, request) is arguments
    assert clock_hours(t, {"hour": 11.0, "guests": 4}, request) == {"hour": 23, "guests": 4}
    arguments = {"hour": True, "guests": 4}  # a flag is no hour
    assert clock_hours(tool(hour=closing, guests={"type": "integer"}), arguments,
                       "at 1 PM") is arguments
