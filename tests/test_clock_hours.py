"""Hours on the clock their parameter counts (mlx_agent/clock_hours.py), and flags at the
defaults their parameters state (mlx_agent/flags.py's flags_by_default): the default
adapter wrote ``operating_hours: 11`` for "opens until at least 11 PM" where the hour "is in
24 hour format", and ``formatted: false`` where the tool says "Default is true" and the
request says nothing of it."""

from __future__ import annotations

import json

import pytest

from mlx_agent.clock_hours import clock_hours, counts_24, on_24_clock
from mlx_agent.flags import flags_by_default, stated_default
from mlx_agent.heard import Heard
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


@pytest.mark.parametrize("schema, expected", [
    ({"type": "boolean", "description": "Formatted if true. Default is true."}, True),
    ({"type": "boolean", "description": "Whether to include it. Defaults to False."}, False),
    ({"type": "boolean", "description": "Sort it (default: true)"}, True),
    ({"type": "boolean", "description": "Default value is 'false'."}, False),
    ({"type": "boolean", "default": False, "description": "Default is true."}, False),
    ({"type": "boolean", "description": "If true, a string; if false, a list."}, None),
    ({"type": "boolean", "description": "Default is true; default false in v2."}, None),
    ({"type": "boolean", "description": "Default is true if a query is given, else false."},
     None),
    ({"type": "boolean", "description": "Defaults to true when sorting, false otherwise."},
     None),
    ({"type": "boolean", "description": "Use default true/false handling."}, None),
    ({"type": "boolean", "description": "Defaults to false if not specified."}, False),
    ({"type": "boolean", "description": "Defaults to true unless specified otherwise"}, True),
    ({"type": "boolean", "description": "Default: false. Set to true to enable it."}, False),
    ({"type": "boolean", "description": "Default is false if not set; true when verbose."},
     None),
    ({"type": "boolean", "description": "Default: false (true for admins)"}, None),
    ({"type": "boolean", "default": "false", "description": "Default is true."}, False),
    ({"type": "boolean", "default": None, "description": "Default is true."}, None),
    ({"type": "boolean"}, None), (None, None),
])
def test_the_default_a_flag_states(schema, expected):
    assert stated_default(schema) == expected


def test_a_flag_nobody_speaks_of_takes_its_stated_default():
    t = tool(number={"type": "integer"}, formatted={
        "type": "boolean", "description": "Return formatted string if true, array if false. "
                                          "Default is true."})
    heard = Heard("Find the prime factors of 450")
    assert flags_by_default(t, {"number": 450, "formatted": False}, heard) == \
        {"number": 450, "formatted": True}
    for said in ("Find the prime factors of 450, not formatted",
                 "Give me the prime factors of 450 as an array"):  # spoken of, by its name
        # or its description's words: the model's reading stands
        arguments = {"number": 450, "formatted": False}
        assert flags_by_default(t, arguments, Heard(said)) is arguments
    arguments = {"number": 450, "formatted": True}  # the default already
    assert flags_by_default(t, arguments, heard) is arguments
    # an optional flag is left to the tool's own default (without_made_up drops it)
    optional = parse_tools(json.dumps([{"name": "ls", "description": "List a folder.",
                                         "parameters": {"type": "object", "properties": {
        "path": {"type": "string"}, "recursive": {
            "type": "boolean", "description": "List subfolders too. Defaults to false."}},
        "required": ["path"]}}]), runnable=False)[0]
    arguments = {"path": "src", "recursive": True}
    assert flags_by_default(optional, arguments, Heard("List everything in src")) is arguments
