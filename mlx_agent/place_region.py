"""A place with the region its parameter asks for: "Boston" as "Boston, MA".

Tools that take a place often ask for it with its state or country, because a city's name
alone is ambiguous (Paris, France or Paris, Texas): "The city and state, e.g. San Francisco,
CA" is the parameter of the best-known tool-calling example there is, and "in the format of
'City, State (abbr)' ... 'City, Country' if State for the city doesn't exist" is common. A
small model copies the city the request names and stops ("weather in Boston" is called with
``location: "Boston"``), and asked to go on it writes a region it does not know ("Boston,
New York", "Moscow, Canada", "Tel Aviv, USA": the bundled model, greedy). The user did not
write the region because people don't; the tool asked for it.

:func:`regional_places`: a place parameter (:func:`mlx_agent.copied_values.is_place`) whose
description asks for a region (:func:`asks_region`), holding a city's bare name, gets the
city's region from a gazetteer (``data/places.json.gz``: GeoNames' 34,006 cities of 15,000
people or more, CC BY 4.0, written by ``scripts/make_places.py``): a US city's state as
its two letters where the description asks for a state, the country's name where it asks
for a country ("Boston, MA", "Tel Aviv, Israel", "Lang Son, Vietnam"; Chennai stays
"Chennai" for "The name of the city, such as 'New York, NY'"). Of cities of one name, the
most populous, where it has at least :data:`CLEAR_LEAD` times the people of any other in
another region (Hyderabad, India, not Pakistan; no Springfield: Missouri's and
Massachusetts' are alike).

Not promised: the city the user meant where a smaller one has its name (Paris, France for
someone in Paris, Texas who did not say so), a region where the request names another
country or state (the user's own words then stand), a town under 15,000 people or a name
GeoNames does not write, or any region where the tool takes it in a parameter of its own
(``city`` and ``country``).
"""

from __future__ import annotations

import functools
import gzip
import json
import re
from pathlib import Path
from typing import Any, Collection, NamedTuple

from .copied_values import is_place, takes_parts
from .tools import Tool

PLACES = Path(__file__).resolve().parent / "data" / "places.json.gz"
CLEAR_LEAD = 3.0  # how many times the people of the next city of its name a city must have
LONGEST_PLACE = 40  # characters: a longer value is no city's bare name
# "City, State (abbr)", "the city and state", "city and country", "Location, State"
_ASKED = re.compile(r"\b(?:city|town|location|place)(?: name)?\s*(?:,|\band(?: (?:the|its))?)"
                    r"\s*(state|country)\b", re.IGNORECASE)
# an example written with a state's two letters: "e.g. San Francisco, CA", "such as
# 'Seattle, WA'"
_EXAMPLE = re.compile(r"(?:e\.g\.|such as|for example|for instance|like)[\s,:]*['\"]?"
                      r"[A-Z][\w.'-]*(?: [A-Z][\w.'-]*){0,3}, [A-Z]{2}\b")
_BARE = re.compile(r"[^\W\d_][\w .'-]*")  # a name: letters first, no comma, no digits


class Gazetteer(NamedTuple):
    cities: dict[str, list[tuple[str, str, int]]]  # a name, lower case -> (country, state, people)
    countries: dict[str, str]  # ISO code -> name
    states: dict[str, str]  # US state's two letters -> name


@functools.cache
def gazetteer() -> Gazetteer:
    """The gazetteer, read once (about 0.2 s)."""
    doc = json.loads(gzip.decompress(PLACES.read_bytes()))
    cities: dict[str, list[tuple[str, str, int]]] = {}
    for names, country, state, people in doc["cities"]:
        for name in names:
            cities.setdefault(name.lower(), []).append((country, state, people))
    return Gazetteer(cities, doc["countries"], doc["us_states"])


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
    asked = {m.group(1).lower() for m in _ASKED.finditer(described)}
    return frozenset(asked | ({"state"} if _EXAMPLE.search(described) else set()))


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


def _names_another(request: str, city: str, region_: str) -> bool:
    """Whether ``request`` names a country or a US state (by name, as whole words, or by
    its two letters after a comma: "Paris, TX") other than ``region_`` (a state's two
    letters or a country's name) that is not ``city`` itself (New York, NY names the state
    New York)."""
    places = gazetteer()
    own = {region_.lower(), places.states.get(region_, "").lower(), city.strip().lower()}
    names = [n for n in (*places.countries.values(), *places.states.values())
             if n.lower() not in own]
    low = request.lower()
    return any(n.lower() in low and re.search(rf"(?<!\w){re.escape(n)}(?!\w)", request,
                                               re.IGNORECASE)
               for n in names) \
        or any(code != region_ and code in places.states
               for code in re.findall(r", ([A-Z]{2})(?![\w.])", request))


def regional_places(tool: Tool, arguments: dict, request: str) -> dict:
    """``arguments`` with each city's bare name that its parameter asks with a region
    (:func:`asks_region`) followed by the city's region (:func:`region`), where the request
    names no other country or state and the tool's schema takes the new value; ``arguments``
    itself where none is."""
    out = arguments
    for name, value in arguments.items():
        if not isinstance(value, str) or len(value) > LONGEST_PLACE \
                or not _BARE.fullmatch(value.strip()) or not is_place(name) \
                or takes_parts(tool, name):
            continue
        asked = asks_region(tool.properties.get(name))
        found = region(value, asked) if asked else None
        if found is None or _names_another(request, value, found) \
                or tool.validate({**out, name: f"{value.strip()}, {found}"}):
            continue
        out = {**out, name: f"{value.strip()}, {found}"}
    return out
