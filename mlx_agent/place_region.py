"""A place as its parameter asks for it: "Boston" as "Boston, MA", "UK" as "GB".

Tools that take a place often ask for it with its state or country, because a city's name
alone is ambiguous (Paris, France or Paris, Texas): "The city and state, e.g. San Francisco,
CA" is the parameter of the best-known tool-calling example there is, and "in the format of
'City, State (abbr)' ... 'City, Country' if State for the city doesn't exist" is common. A
small model copies the city the request names and stops ("weather in Boston" is called with
``location: "Boston"``), and asked to go on it writes a region it does not know ("Boston,
New York", "Moscow, Canada", "Tel Aviv, USA": the bundled model, greedy). The user did not
write the region because people don't; the tool asked for it.

:func:`regional_places`: a place parameter (:func:`mlx_agent.copied_values.is_place`) whose
description asks for a region (:func:`asks_region`), holding a city's bare name (as the
conversation writes it, capitalised, or a big city's in a line all in lower case; not a
country's or a US state's name: "Virginia" is the state), gets the city's region from a
gazetteer (``data/places.json.gz``: GeoNames' 34,006 cities of 15,000 people or more, CC BY
4.0, written by ``scripts/make_places.py``): a US city's state as its two letters where the
description asks for a state, the country's name where it asks for a country ("Boston, MA",
"Tel Aviv, Israel", "Lang Son, Vietnam"; Chennai stays "Chennai" for "The name of the city,
such as 'New York, NY'"). Of cities of one name, the most populous, where it has at least
:data:`CLEAR_LEAD` times the people of any other in another region (Hyderabad, India, not
Pakistan; no Springfield: Missouri's and Massachusetts' are alike).

:func:`country_codes`: a country a parameter asks as its ISO 3166 code (``country`` whose
description says "ISO 3166-1 alpha-2", "2-letter country code", "alpha-3") is written as
that code where the model wrote its name or what people call it ("UK", the bundled model's
``country`` for "London in the UK", is "GB"; "Germany" is "DE", or "DEU" for alpha-3).

Not promised: the city the user meant where a smaller one has its name (Paris, France for
someone in Paris, Texas who did not say so), a region where the conversation names another
country or state (the user's own words then stand; "London, Ontario" is kept whole before
this by :func:`mlx_agent.copied_values.whole_places`), a town under 15,000 people or a name
GeoNames does not write, or any region where the tool takes it in a parameter of its own
(``city`` and ``country``).
"""

from __future__ import annotations

import functools
import itertools
import gzip
import json
import re
import zlib
from pathlib import Path
from typing import Any, Collection, NamedTuple

from .copied_values import is_place, takes_parts
from .heard import DESCRIPTION_CHARS, NAME_WORD
from .tools import Tool

PLACES = Path(__file__).resolve().parent / "data" / "places.json.gz"
CLEAR_LEAD = 3.0  # how many times the people of the next city of its name a city must have
LONGEST_PLACE = 40  # characters: a longer value is no city's bare name
BIG_CITY = 1_000_000  # people: a state's name is this city's (New York), not Washington's
LOWER_CASE_CITY = 100_000  # people: "weather in boston" names Boston; "up north" no North
# "City, State (abbr)", "the city and state", "city and country", "Location, State"
_ASKED = re.compile(r"\b(?:city|town|location|place)(?: name)?\s*(?:,|\band(?: (?:the|its))?)"
                    r"\s*(state|country)\b", re.IGNORECASE)
# an example written with a state's two letters: "e.g. San Francisco, CA", "such as
# 'Seattle, WA'"
_EXAMPLE = re.compile(r"(?i:\be\.g\.|\bsuch as|\bfor example|\bfor instance|\blike)"
                      r"[\s,:]*['\"]?[A-Z][\w.'-]*(?: [A-Z][\w.'-]*){0,3}, ([A-Z]{2})\b")
_BARE = re.compile(r"[^\W\d_][\w .'-]*")  # a name: letters first, no comma, no digits


class Gazetteer(NamedTuple):
    cities: dict[str, list[tuple[str, str, int]]]  # a name, lower case -> (country, state, people)
    countries: dict[str, str]  # ISO 3166 two-letter code -> name
    codes: dict[str, str]  # a country's name, alias or code, lower case -> two-letter code
    three: dict[str, str]  # two-letter code -> three-letter code
    states: dict[str, str]  # US state's two letters -> name
    state_names: frozenset[str]  # US states' names, lower case
    # every name of a region a user may write (countries', US states', ALIASES), lower case,
    # with the country it names (a state's name: None, but Georgia's)
    regions: tuple[tuple[str, str | None], ...]


# countries' names that are common words too: a region only where written with a capital
COMMON = frozenset("turkey china chad guinea jersey".split())
# US states' two letters that are words after a city too: "Boston, in celsius", "Paris or"
_WORD_CODES = frozenset("in or me hi ok oh la de id al co ma pa wa ne mo".split())
# what people call countries that GeoNames names otherwise ("UK" is no ISO code: GB is)
ALIASES = {"uk": "GB", "u.k.": "GB", "britain": "GB", "great britain": "GB", "england": "GB",
           "scotland": "GB", "wales": "GB", "northern ireland": "GB", "usa": "US",
           "u.s.": "US", "u.s.a.": "US", "america": "US", "united states of america": "US",
           "the us": "US", "the usa": "US", "the uk": "GB", "holland": "NL",
           "the netherlands": "NL", "czech republic": "CZ", "korea": "KR",
           "republic of korea": "KR", "ivory coast": "CI", "uae": "AE", "burma": "MM",
           "turkey": "TR", "russian federation": "RU"}


@functools.cache
def gazetteer() -> Gazetteer:
    """The gazetteer, read once (about 0.1 s); empty where its file cannot be read (a broken
    install: no region is then added, and the calls stand as the model wrote them)."""
    try:
        doc = json.loads(gzip.decompress(PLACES.read_bytes()))
    except (OSError, EOFError, ValueError, zlib.error):
        return Gazetteer({}, {}, {}, {}, {}, frozenset(), ())
    cities: dict[str, list[tuple[str, str, int]]] = {}
    for names, country, state, people in doc["cities"]:
        for name in names:
            cities.setdefault(name.lower(), []).append((country, state, people))
    countries = {iso: name for iso, (name, _) in doc["countries"].items()}
    three = {iso: iso3 for iso, (_, iso3) in doc["countries"].items()}
    codes = {**{name.lower(): iso for iso, name in countries.items()},
             **{iso3.lower(): iso for iso, iso3 in three.items()},
             **{iso.lower(): iso for iso in countries}, **ALIASES}
    states = doc["us_states"]
    regions = tuple((n.lower(), codes.get(n.lower()))
                    for n in (*countries.values(), *states.values(), *ALIASES))
    return Gazetteer(cities, countries, codes, three, states,
                     frozenset(n.lower() for n in states.values()), regions)


def asks_region(schema: Any) -> frozenset[str]:
    """What regions a parameter's schema asks a place with: "state" where its description
    asks for a state ("City, State (abbr)", "the city and state", or shows one: "such as
    'New York, NY'"), "country" where it asks for a country ("City, Country"); none where
    it is no free string or asks for neither."""
    if not isinstance(schema, dict) or schema.get("type") != "string" \
            or "enum" in schema or "const" in schema or "pattern" in schema:
        return frozenset()
    described = schema.get("description")
    if not isinstance(described, str):
        return frozenset()
    described = described[:DESCRIPTION_CHARS]
    asked = {m.group(1).lower() for m in _ASKED.finditer(described)}
    shown = any(m.group(1) in gazetteer().states  # not "e.g. London, UK"
                for m in itertools.islice(_EXAMPLE.finditer(described), 8))
    return frozenset(asked | ({"state"} if shown else set()))


def region(city: str, asked: Collection[str]) -> str | None:
    """The region of the city named ``city`` (:data:`CLEAR_LEAD`), as ``asked``
    (:func:`asks_region`): a US city's state where a state is asked, else its country's
    name where a country is; None where neither is asked of it, or no one city has the
    name."""
    places = gazetteer()
    found = sorted(places.cities.get(city.strip().lower(), ()), key=lambda c: -c[2])
    if not found:
        return None
    country, state, people = found[0]
    if any((c, s) != (country, state) and p * CLEAR_LEAD > people for c, s, p in found[1:]):
        return None
    if country == "US" and state and "state" in asked:
        return state
    return places.countries.get(country) if "country" in asked else None


# "ISO 3166-1 alpha-2", "2-letter country code", "country code, e.g. 'US'"
_CODE = re.compile(r"\bISO[- ]?3166|\balpha[- ]?[23]\b|\bcountry[- ]code|"
                   r"\b(?:2|3|two|three)[- ]letter\b", re.IGNORECASE)
# "the full name, not the 2-letter code", "no country codes", "never an ISO 3166 code"; not
# "If not provided, the default code US is used"
_NOT_CODE = re.compile(r"\b(?:not|no|never)\b(?!\s+(?:provided|given|specified|set|passed|"
                       r"supplied)\b)[^.;]{0,40}\bcodes?\b", re.IGNORECASE)
_TWO = re.compile(r"\balpha[- ]?2\b|\b(?:2|two)[- ]letter\b", re.IGNORECASE)
_THREE = re.compile(r"\balpha[- ]?3\b|\b(?:3|three)[- ]letter\b", re.IGNORECASE)


def asks_code(name: str, schema: Any) -> int:
    """How many letters of a country's ISO 3166 code a parameter asks for (2 or 3), by its
    name (a country's, not ``country_name``) and description ("ISO 3166-1 alpha-2", "the
    2-letter country code"; not "the full name, not the 2-letter code"); 0 where it asks for
    none."""
    words = {w.lower() for w in NAME_WORD.findall(name)}
    if not isinstance(schema, dict) or schema.get("type") != "string" \
            or "enum" in schema or "const" in schema or "country" not in words \
            or "name" in words:
        return 0
    described = schema.get("description")
    if not isinstance(described, str):
        return 0
    asked = _NOT_CODE.sub(" ", described[:DESCRIPTION_CHARS])
    if not _CODE.search(asked):  # what it refuses aside: "Two-letter; not a 3-letter code"
        return 0
    return 3 if _THREE.search(asked) and not _TWO.search(asked) else 2


def country_code(country: str, letters: int) -> str | None:
    """The ISO 3166 code of ``letters`` letters of the country named (or coded)
    ``country``: "UK" is "GB", "Germany" "DE" or "DEU"; None where no country is so
    named."""
    places = gazetteer()
    code = places.codes.get(" ".join(country.split()).lower())
    return None if code is None else code if letters == 2 else places.three.get(code)


def _proper_name(value: str, heard: str) -> bool:
    """Whether ``value`` is a city's name as ``heard`` writes it: capitalised there (or, a
    city of :data:`LOWER_CASE_CITY` people, in a line with no capitals: "weather in
    boston"), as whole words ("the weather up north" writes no city North), and no
    country's name or code nor a US state's name (Virginia, Jordan and Mexico are cities
    too, but a user who writes them means the state or the country), but for a city of
    :data:`BIG_CITY` people or more (New York)."""
    places, value = gazetteer(), " ".join(value.split())
    low = value.lower()
    people = max((p for _, _, p in places.cities.get(low, ())), default=0)
    if low in places.codes or low in places.state_names and people < BIG_CITY:
        return False
    for m in itertools.islice(re.finditer(rf"(?<!\w){re.escape(value)}(?!\w)", heard,
                                          re.IGNORECASE), 64):
        start, end = heard.rfind("\n", 0, m.start()) + 1, heard.find("\n", m.end())
        line = heard[start:end if end >= 0 else len(heard)]
        if m.group()[:1].isupper() or line == line.lower() and people >= LOWER_CASE_CITY:
            return True  # capitalised, or a big city's in a line written all in lower case
    return False


def _names_another(heard: str, city: str, region_: str) -> bool:
    """Whether ``heard`` names a country (by any name: "the UK") or a US state (by name,
    as whole words, in any case: "Paris texas", but :data:`COMMON` words only with a
    capital: not "turkey"; or by its two letters after a comma, "Paris, TX", or after the
    city, "athens ga") other than ``region_`` (a state's two letters or a country's name)
    and its country, that is not ``city`` itself (New York, NY names the state New York)."""
    places = gazetteer()
    own = {region_.lower(), places.states.get(region_, "").lower(), city.strip().lower()}
    # the region's country: its every name is the region's own ("MA" is Massachusetts,
    # not Morocco: a state's country is the US)
    country = "US" if region_ in places.states else places.codes.get(region_.lower())
    names = [n for n, code in places.regions
             if n not in own and (country is None or code != country)]
    low = heard.lower()
    return any(n in low and any(
        n not in COMMON or m.group()[:1].isupper() for m in itertools.islice(
            re.finditer(rf"(?<!\w){re.escape(n)}(?!\w)", heard, re.IGNORECASE), 64))
        for n in names) \
        or any(code != region_ and code in places.states
               for code in re.findall(r", ([A-Z]{2})(?![\w.])", heard)) \
        or any(code.upper() != region_ and code.upper() in places.states  # "athens ga"
               and code.lower() not in _WORD_CODES
               for code in re.findall(rf"(?<!\w){re.escape(city.strip())},?\s+([a-z]{{2}})"
                                      r"(?![\w.])", heard, re.IGNORECASE)[:64])


def country_codes(tool: Tool, arguments: dict) -> dict:
    """``arguments`` with each country a parameter asks as its ISO code (:func:`asks_code`)
    written as that code (:func:`country_code`: the model wrote ``country: "UK"`` where
    "ISO 3166-1 alpha-2 country codes" are asked), where the schema takes it; ``arguments``
    itself where none is."""
    out = arguments
    for name, value in arguments.items():
        letters = asks_code(name, tool.properties.get(name)) if isinstance(value, str) else 0
        code = country_code(value, letters) if letters else None
        if code is not None and code != value and not tool.validate({**out, name: code}):
            out = {**out, name: code}
    return out


def regional_places(tool: Tool, arguments: dict, heard: str) -> dict:
    """``arguments`` with each city's bare name that its parameter asks with a region
    (:func:`asks_region`) followed by the city's region (:func:`region`), where ``heard``
    (the conversation's user messages and tool results) writes the name as a city's
    (:func:`_proper_name`) and names no other country or state (:func:`_names_another`),
    and the tool's schema takes the new value; ``arguments`` itself where none is."""
    out = arguments
    for name, value in arguments.items():
        if not isinstance(value, str) or len(value) > LONGEST_PLACE \
                or not _BARE.fullmatch(value.strip()) or not is_place(name) \
                or takes_parts(tool, name):
            continue
        asked = asks_region(tool.properties.get(name))  # before a city's is read
        found = region(value, asked) if asked and _proper_name(value, heard) else None
        if found is None or _names_another(heard, value, found) \
                or tool.validate({**out, name: f"{value.strip()}, {found}"}):
            continue
        out = {**out, name: f"{value.strip()}, {found}"}
    return out
