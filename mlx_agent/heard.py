"""What a turn's messages write: their words and numbers, as a call's values are read
against them.

A value "is written" in a request when its words begin the request's words (``postgres`` in
"PostgreSQL") or its number is one the request writes ("1,500", "1e-9", "5%" also as 0.05);
read loosely, also "6cm", "five", "twenty-one", "2 million" as 2,000,000 and "monthly" as
12. :class:`Heard` holds a text's words sorted, so a long tool result costs one sort, not a
scan per value. Not promised: words are ASCII letters and digits, lower-cased ("Zürich" is
"z", "rich"); numbers are decimal, with thousands commas but not spaces or dots; loosely
read, a letter glued on may be a variable ("3x^2" writes 3), and spelt numbers are English
words up to the nineties, "hundred", "thousand" and "dozen", not "three hundred and two".
"""

from __future__ import annotations

import bisect
import itertools
import math
import re
from typing import Any, Iterator

NUMBER = re.compile(r"(?<![\w.])-?\d+(?:,\d{3})*(?:\.\d+)?(?:[eE][-+]?\d+)?(%?)(?![\w])")
# read loosely: the digits of a run, whatever follows or joins them ("6cm", "[120,250]"),
# never inside a word ("rs64"); "25 percent"; a scale ("8.5 million", "1,500 thousand",
# "$1.2k", "2.5bn"); spelt ("twenty one", "two hundred", "a dozen")
_DIGITS = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(%?)")
_PERCENT = re.compile(r"(?<![\w.,])(\d+(?:,\d{3})*(?:\.\d+)?)\s*(?:percent|per\s+cent)\b",
                      re.IGNORECASE)
SCALE_WORDS = {"thousand": 1e3, "million": 1e6, "billion": 1e9, "trillion": 1e12}
SCALES = {**SCALE_WORDS, "k": 1e3, "m": 1e6, "bn": 1e9, "b": 1e9}
_SCALED = re.compile(r"(?<![\w.,])(\d+(?:,\d{3})*(?:\.\d+)?)\s*(thousand|million|billion|"
                     r"trillion|k|m|bn|b)\b", re.IGNORECASE)
UNITS = "zero one two three four five six seven eight nine ten eleven twelve thirteen " \
    "fourteen fifteen sixteen seventeen eighteen nineteen".split()
TENS = "twenty thirty forty fifty sixty seventy eighty ninety".split()
SPELT = {**{w: i for i, w in enumerate(UNITS)}, **{w: 20 + 10 * i for i, w in enumerate(TENS)},
         "a": 1, "an": 1, "dozen": 12}
_LARGE = "hundred|thousand|million|billion|trillion"
_SPELT = re.compile(rf"\b(?:({'|'.join(TENS)})(?:[- ]({'|'.join(UNITS[1:10])}))?"
                    rf"|({'|'.join(UNITS)}|dozen|an?(?= (?:{_LARGE}))))"
                    rf"(?: ({_LARGE}))?\b|\b({_LARGE})\b", re.IGNORECASE)
# how many of a smaller unit a word of time implies ("compounded monthly": 12 a year)
PERIODS = {"hourly": (24,), "daily": (365,), "weekly": (52,), "biweekly": (26,),
           "fortnightly": (26,), "monthly": (12,), "quarterly": (4,), "semiannually": (2,),
           "biannually": (2,), "annually": (1,), "yearly": (1,), "minute": (60,),
           "hour": (60,), "day": (24,), "week": (7,), "fortnight": (14,),
           "month": (30, 31), "year": (12, 52, 365), "decade": (10,), "century": (100,),
           "semi-annually": (2,), "half-yearly": (2,)}
_PERIOD = re.compile(rf"\b({'|'.join(PERIODS)})s?\b", re.IGNORECASE)
REQUEST_CHARS = 16_000  # the rules read a request's first so many characters
DESCRIPTION_CHARS = 2_000  # and a parameter's description (a server's may be huge) so far
NAME_WORD = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+")  # "startLocation": start, Location


def words(text: str) -> list[str]:
    """The lower-case runs of ASCII letters and digits of ``text``."""
    return re.findall(r"[a-z0-9]+", text.lower())


def writes_whole(text: str, phrase: str) -> bool:
    """Whether ``text`` writes ``phrase`` as whole words, case aside, or as its plural
    ("inch" in "4 inches"); a phrase of two letters only as written ("US" is not in "tell
    us"), of one not at all."""
    phrase = phrase.strip()
    flags = re.IGNORECASE if len(phrase) > 2 else 0
    return len(phrase) >= 2 and re.search(rf"(?<!\w){re.escape(phrase)}(?:e?s)?(?!\w)", text,
                                          flags) is not None


def number(value: Any) -> float | None:
    """``value`` as a finite float, or None (a flag, a string, an integer of 400 digits)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        x = float(value)
    except OverflowError:
        return None
    return x if math.isfinite(x) else None


def _written(m: re.Match) -> float:
    """A :data:`NUMBER` match's number, as written: "1,500%" is 1500."""
    return float(m.group()[:len(m.group()) - len(m.group(1))].replace(",", ""))


def numbers(text: str, loose: bool = False) -> set[float]:
    """The numbers ``text`` writes ("1,500", "-2.5", "1e-9"), a percentage also as its
    fraction ("5%": 5 and 0.05); ``loose``, also each run of digits whatever follows or
    joins it ("6cm": 6; "[120,250]": 120 and 250 too), "25 percent" as 0.25 too, a number of
    a scale as its whole too ("8.5 million", "$1.2k", "2.5bn"), the spelt ones ("five",
    "twenty one", "two hundred", "a dozen"), and the counts a word of time implies
    (:data:`PERIODS`: "monthly" 12, "a week" 7 days)."""
    out = set()
    for m in itertools.chain(NUMBER.finditer(text), _DIGITS.finditer(text) if loose else ()):
        x = float(m.group()[:len(m.group()) - len(m.group(1))].replace(",", ""))
        if math.isfinite(x):
            out |= {x, x / 100} if m.group(1) else {x}
    if not loose:
        return out
    for m in _PERCENT.finditer(text):
        out.add(float(m.group(1).replace(",", "")) / 100)
    for m in _SCALED.finditer(text):
        out.add(float(m.group(1).replace(",", "")) * SCALES[m.group(2).lower()])
    for m in _PERIOD.finditer(text):
        out.update(float(x) for x in PERIODS[m.group(1).lower()])
    for m in _SPELT.finditer(text):
        tens, unit, alone, scale, bare = (g.lower() if g else "" for g in m.groups())
        if bare:
            out.add(SCALES[bare] if bare in SCALES else 100.0)
            continue
        base = float(SPELT[alone] if alone else SPELT[tens] + SPELT.get(unit, 0))
        factor = SCALES.get(scale, 100.0) if scale else 1.0
        out |= {base * factor, float(SPELT[tens])} if tens and unit else {base * factor}
    return {x for x in out if math.isfinite(x)}


def leaves(value: Any, keys: bool = False) -> Iterator[Any]:
    """The strings, numbers and flags of a JSON value at any depth (and its objects' keys,
    with ``keys``), without recursion: a model's arguments may nest as deep as the parser
    allows."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if keys:
                yield from (k for k in item if isinstance(k, str))
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif item is not None:
            yield item


def json_text(value: Any) -> str:
    """The keys, strings and numbers of a JSON value (a schema, a call's arguments), a line
    each, as written: its JSON text would hide a digit after an escape ("Units:\\n2")."""
    return "\n".join(v if isinstance(v, str) else repr(v) for v in leaves(value, keys=True)
                     if isinstance(v, str) or number(v) is not None)


_LIST_GAP = re.compile(r"\s*(?:[,;&]|and|,\s*and)?\s*")


def number_runs(text: str) -> list[list[float]]:
    """The runs of three or more numbers ``text`` writes one after another, apart only by
    a comma, a semicolon, "and" or spaces ("85, 90, 88 and 92", "[12, 15, 18]"), as
    written (a percentage as its number)."""
    runs: list[list[float]] = []
    run: list[float] = []
    end = None
    for m in NUMBER.finditer(text):
        x = _written(m)
        if run and _LIST_GAP.fullmatch(text, end, m.start()) and math.isfinite(x):
            run.append(x)
        else:
            if len(run) >= 3:
                runs.append(run)
            run = [x] if math.isfinite(x) else []
        end = m.end()
    return runs + [run] if len(run) >= 3 else runs


class Heard:
    """What a turn's request and tool results write: their words, sorted (a word's prefix is
    found by bisection, so a long tool result costs a sort, not a scan per value), and their
    numbers."""

    def __init__(self, text: str):
        self.words = sorted(set(words(text)))
        self.numbers = numbers(text)

    def begins_a_word(self, prefix: str) -> bool:
        i = bisect.bisect_left(self.words, prefix)
        return i < len(self.words) and self.words[i].startswith(prefix)

    def made_up(self, value: Any) -> bool:
        """Whether ``value`` is a string or number (or a list of them) never written here:
        a string none of whose words of three or more characters begins a word ("postgres"
        is written in "PostgreSQL", "New York City" in "New York"), a number
        :func:`numbers` does not find; a flag, an object, null or an empty string never
        is."""
        if isinstance(value, bool) or value is None:
            return False
        if isinstance(value, str):
            said = [w for w in words(value) if len(w) > 2]
            return bool(said) and not any(map(self.begins_a_word, said))
        if isinstance(value, (int, float)):  # one no float holds is written nowhere here
            return number(value) not in self.numbers
        if isinstance(value, list):
            return bool(value) and all(map(self.made_up, value))
        return False
