"""Dates in the format their parameter asks: the default adapter, asked for the weather "on
April 11th, 2023" by a tool whose date is "in the format of 'YYYY-MM-DD'", wrote
``date: "April 11th, 2023"``."""

from __future__ import annotations

import datetime
import json
import time

import pytest

from mlx_agent.dates import asked_format, dated_values, read_date
from mlx_agent.tools import parse_tools


@pytest.mark.parametrize("schema, expected", [
    ({"type": "string", "format": "date"}, "%Y-%m-%d"),
    ({"type": "string", "description": "The date, in the format of 'YYYY-MM-DD'."}, "%Y-%m-%d"),
    ({"type": "string", "description": "The format is MM-DD-YYYY"}, "%m-%d-%Y"),
    ({"description": "Format - DD-MM-YYYY"}, "%d-%m-%Y"),
    ({"type": "string", "description": "as 'dd/mm/yyyy', such as '15/03/2024'"}, "%d/%m/%Y"),
    ({"type": "string", "description": "strftime's %Y-%m-%d"}, "%Y-%m-%d"),
    ({"type": "string", "description": "as 'dd/mm/yyyy HH:MM'"}, None),  # a time too
    ({"type": "string", "description": "in ISO-8601 format"}, None),  # no pattern
    ({"type": "string", "description": "YYYY-YYYY"}, None),  # a season, not a date
    ({"type": "string", "description": "The date."}, None),
    ({"type": "integer", "description": "YYYY-MM-DD"}, None), (None, None),
])
def test_the_format_a_parameter_asks(schema, expected):
    assert asked_format(schema) == expected


@pytest.mark.parametrize("text, year, expected", [
    ("April 11th, 2023", None, (2023, 4, 11)), ("March.11, 2022", None, (2022, 3, 11)),
    ("Jun. 20, 2023", None, (2023, 6, 20)), ("10th December 2022", None, (2022, 12, 10)),
    ("5th of march 2023", None, (2023, 3, 5)), ("2023 April 4th", None, (2023, 4, 4)),
    ("2023.3.1", None, (2023, 3, 1)), ("2022/08/16", None, (2022, 8, 16)),
    ("15th October, 2023", None, (2023, 10, 15)), ("Sept 9", 2024, (2024, 9, 9)),
    ("April 3rd", None, None),  # no year to give it
    ("June 2022", 2022, None), ("April 1 to April 30 2023", None, None),  # not a date alone
    ("03/04/2023", None, None),  # the day or the month first: either
    ("February 30, 2023", None, None), ("Pleasanton 2023", None, None), ("", None, None),
])
def test_a_date_read_whole(text, year, expected):
    assert read_date(text, year) == (datetime.date(*expected) if expected else None)


TOOL = parse_tools(json.dumps([{"name": "t", "parameters": {"type": "object", "properties": {
    "start": {"type": "string", "description": "in the format of 'YYYY-MM-DD'"},
    "end": {"type": "string", "format": "date"},
    "us": {"type": "string", "description": "MM/DD/YYYY"},
    "note": {"type": "string"},
    "code": {"type": "string", "description": "YYYY-MM-DD", "pattern": "^x"},
    "odd": {"type": "string", "description": "as YYYY-DD-MM"}},
    "required": ["start"]}}]), runnable=False)[0]


@pytest.mark.parametrize("arguments, request_, expected", [
    ({"start": "April 3rd", "end": "April 5th 2023"}, "from April 3rd to April 5th 2023",
     {"start": "2023-04-03", "end": "2023-04-05"}),
    ({"start": "2023-04-03", "us": "2022-01-05"}, "x", {"start": "2023-04-03", "us": "01/05/2022"}),
    ({"start": "April 3rd"}, "April 3rd, in 2023 or in 2024", None),  # which year?
    ({"start": "x", "note": "April 5th 2023"}, "April 5th 2023", None),  # no format asked
    ({"start": "x", "code": "April 5th 2023"}, "April 5th 2023", None),  # the schema refuses
    ({"start": "next Friday"}, "next Friday", None),
    ({"start": "May 5th"}, "Book flight 2231 on May 5th", None),  # no year: a flight number
    ({"start": "June 3"}, "on June 3 under 2500 dollars", None),
    ({"start": "May 5th"}, "in 2023, on May 5th", {"start": "2023-05-05"}),
    ({"start": "x", "odd": "2023-12-05"}, "x", None),  # in its format already (day, month)
    ({"start": "January 1, 0001"}, "x", None),  # a year "%Y" would not pad
])
def test_a_date_is_written_as_its_parameter_asks(arguments, request_, expected):
    assert dated_values(TOOL, arguments, request_) == (expected or arguments)


def test_a_hostile_value_is_read_in_linear_time():
    start = time.perf_counter()
    for text in ("1" * 100_000, "April " * 20_000, "2023." * 20_000, "5th of " * 20_000,
                 "April" + " " * 16_000 + "x", "in 2023 " * 10_000):
        read_date(text, 2023)
        dated_values(TOOL, {"start": text}, text)
    assert time.perf_counter() - start < 5
