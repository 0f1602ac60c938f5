"""A date the model wrote as the request says it, written in the format its parameter asks.

Asked for the weather "on April 11th, 2023" by a tool whose ``date`` is "in the format of
'YYYY-MM-DD'", a small model copies the request's words: ``date: "April 11th, 2023"``. The
tool then fails to parse it, or reads another day. :func:`dated_values` rewrites such a
value in the parameter's format: the one its JSON schema names (``"format": "date"``:
2023-04-11), or the pattern its description writes (:func:`asked_format`: "YYYY-MM-DD",
"MM-DD-YYYY", "dd/mm/yyyy", "%Y-%m-%d", ...).

The value is read by :func:`read_date`, whole: "March 11, 2022", "Jun. 20, 2023", "10th
December 2022", "5th of march 2023", "2023 April 4th", "2023.3.1", "2022/08/16" (or a date
already in another numeric format with the year first). A date without its year ("April
3rd") takes the year the request writes, where it writes one year only as a year (after a
month or a day, or "in", "of", "year", "for": not "flight 2231"). A value in the asked format
already is left as it is.

Not promised: month names other than English ones; a value with a time, or a format that
asks for one ("dd/mm/yyyy HH:MM", ISO 8601's date-time), is left as it is, and so is a value
that is not a date alone ("June 2022", "April 1 to April 30", "next Friday"), a numeric date
with the day or the month first (03/04/2023 reads both ways), and a date the calendar lacks.
"""

from __future__ import annotations

import datetime
import re
from typing import Any

from .tools import Tool

MONTHS = {m: i for i, names in enumerate((
    "jan january", "feb february", "mar march", "apr april", "may", "jun june", "jul july",
    "aug august", "sep sept september", "oct october", "nov november", "dec december"), 1)
    for m in names.split()}
_MONTH = r"(?P<month>" + "|".join(sorted(MONTHS, key=len, reverse=True)) + r")\.?"
_DAY = r"(?P<day>\d{1,2})(?:st|nd|rd|th)?"
_YEAR = r"(?P<year>\d{4})"
_GAP = r"\s*(?:,\s*)?"  # a space or a comma, or both: "March 11, 2022", "March.11"
_DATES = [re.compile(p, re.IGNORECASE) for p in (
    rf"{_MONTH}{_GAP}{_DAY}(?:{_GAP}{_YEAR})?",  # March 11, 2022; Jun. 20; April 3rd
    rf"{_DAY}\s+(?:of\s+)?{_MONTH}(?:{_GAP}{_YEAR})?",  # 10th December 2022; 5th of march
    rf"{_YEAR}\s+{_MONTH}\s+{_DAY}",  # 2023 April 4th
    rf"{_YEAR}[-/.](?P<month>\d{{1,2}})[-/.]{_DAY}",  # 2023.3.1, 2022/08/16
)]
# a date's pattern in a description: YYYY-MM-DD, MM/DD/YYYY, dd.mm.yyyy, %Y-%m-%d
_PARTS = {"yyyy": "%Y", "yy": "%y", "mm": "%m", "m": "%m", "dd": "%d", "d": "%d"}
_PATTERN = re.compile(r"(?<![A-Za-z%])(YYYY|YY|MM|DD)([-/.])(YYYY|MM|DD)\2(YYYY|YY|MM|DD)"
                      r"(?![A-Za-z])(?P<time>[T ]?\s*(?:HH|hh|%H))?", re.IGNORECASE)
_STRFTIME = re.compile(r"%([Ymd])([-/.])%([Ymd])\2%([Ymd])(?P<time>[T ]?%H)?")
# a year the request writes as one: after a month or a day of one, or "in", "of", "year"
# ("April 5th 2023", "in 2023"; not "flight 2231", "under 2500 dollars")
_YEARS = re.compile(r"(?:\b(?:" + "|".join(sorted(MONTHS, key=len, reverse=True))
                    + r")\.?(?:\s+\d{1,2}(?:st|nd|rd|th)?)?,?\s+|\b\d{1,2}(?:st|nd|rd|th)"
                    r",?\s+|\b(?:in|of|year|for)\s+)((?:19|20)\d\d)\b", re.IGNORECASE)


def asked_format(schema: Any) -> str | None:
    """The strftime format a string parameter asks its dates in: its JSON schema's
    ``"format": "date"``, or the first date pattern its description writes (of a year, a
    month and a day, in some order, apart by one of ``-/.``); None where it asks for none,
    or for a time too."""
    if not isinstance(schema, dict) or schema.get("type") not in (None, "string"):
        return None
    if schema.get("format") == "date":
        return "%Y-%m-%d"
    about = schema.get("description")
    if not isinstance(about, str):
        return None
    m = _PATTERN.search(about)
    if m:
        parts = [m.group(1).lower(), m.group(3).lower(), m.group(4).lower()]
        kinds = sorted(p[0] for p in parts)
        if kinds != ["d", "m", "y"] or m.group("time"):
            return None
        return m.group(2).join(_PARTS[p] for p in parts)
    m = _STRFTIME.search(about)
    if m and sorted(m.group(1, 3, 4)) == ["Y", "d", "m"] and not m.group("time"):
        return m.group(2).join(f"%{p}" for p in m.group(1, 3, 4))
    return None


def read_date(text: str, year: int | None = None) -> datetime.date | None:
    """``text`` as a date where it is one whole ("April 11th, 2023", "2023.3.1"), its year
    ``year`` where it writes none; None where it is not, or the calendar lacks it."""
    text = text.strip()
    for pattern in _DATES:
        m = pattern.fullmatch(text)
        if m is None:
            continue
        month = m.group("month")
        month = int(month) if month.isdigit() else MONTHS[month.lower().rstrip(".")]
        written = m.groupdict().get("year")
        if not (written or year) or int(written or year) < 1000:  # "%Y" pads no year below
            return None
        try:
            return datetime.date(int(written or year), month, int(m.group("day")))
        except ValueError:
            return None
    return None


def _in_format(value: str, fmt: str) -> bool:
    """Whether ``value`` is a date written in ``fmt`` already."""
    try:
        datetime.datetime.strptime(value.strip(), fmt)
    except ValueError:
        return False
    return True


def dated_values(tool: Tool, arguments: dict, request: str) -> dict:
    """``arguments`` with each top-level string that is a date whole (:func:`read_date`;
    with no year, the one year the request writes as a year: :data:`_YEARS`) written in the
    format its parameter asks for (:func:`asked_format`), where it is not so already and the
    schema takes it; ``arguments`` itself where none is."""
    out, years = arguments, None
    for name, value in arguments.items():
        fmt = asked_format(tool.properties.get(name)) if isinstance(value, str) else None
        if fmt is None:
            continue
        if years is None:
            years = set(_YEARS.findall(request[:16_000]))
        if _in_format(value, fmt):  # "2023-12-05" asked as YYYY-DD-MM: so already
            continue
        day = read_date(value, int(next(iter(years))) if len(years) == 1 else None)
        written = day.strftime(fmt) if day is not None else value
        if written != value and not tool.validate({**out, name: written}):
            out = {**out, name: written}
    return out
