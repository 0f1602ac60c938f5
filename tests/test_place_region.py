"""A bare city gets the region its parameter asks for (mlx_agent/place_region.py)."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import pytest

from mlx_agent.agent import events as ev
from mlx_agent.place_region import (PLACES, asks_code, asks_region, country_code,
                                   country_codes, region, regional_places)
from mlx_agent.tools import parse_tools

STATE = "The city and state, e.g. San Francisco, CA"
EITHER = ("The location, in the format of 'City, State (abbr)', such as 'San Francisco, CA' "
          "if State for the city exists. 'City, Country' if State for the city doesn't exist.")
COUNTRY = "The city and country, e.g. Paris, France"


def tool(**properties):
    return parse_tools(json.dumps([{"name": "t", "description": "A tool.", "parameters": {
        "type": "object", "properties": properties,
        "required": list(properties)[:1]}}]), runnable=False)[0]


@pytest.mark.parametrize("description, asked", [
    (STATE, {"state"}), (EITHER, {"state", "country"}), (COUNTRY, {"country"}),
    ("The name of the city, such as 'New York, NY'.", {"state"}),  # shown, not said
    ("Location of the hotel, in the format of 'City, Country'", {"country"}),
    ("City where restaurant is located.", set()), ("The city, e.g. Boston", set()),
    ("The state of the order", set()),
    ("The city, e.g. London, UK", set()),  # a country's code shown: no US state
    ("Unlike Paris, TX", set()),
])
def test_what_region_a_description_asks_for(description, asked):
    assert asks_region({"type": "string", "description": description}) == asked
    # only a free string: not an enum, a pattern, a number, or a schema with no words
    for schema in ({"type": "string", "description": description, "enum": ["Boston, MA"]},
                   {"type": "string", "description": description, "pattern": "^.*$"},
                   {"type": "integer", "description": description}, {"type": "string"}):
        assert asks_region(schema) == set()


def test_a_description_is_read_only_so_far():
    """A server's description may be megabytes: the rules read its first
    DESCRIPTION_CHARS characters, as the flags' do."""
    from mlx_agent.heard import DESCRIPTION_CHARS

    filler = "Where it is. " * (DESCRIPTION_CHARS // 13 + 1)
    assert asks_region({"type": "string", "description": STATE + filler}) == {"state"}
    assert asks_region({"type": "string", "description": filler + STATE}) == set()
    assert asks_code("country", {"type": "string", "description": filler + "ISO 3166"}) == 0


@pytest.mark.parametrize("city, asked, expected", [
    ("Boston", {"state"}, "MA"), ("boston", {"state", "country"}, "MA"),
    ("Boston", {"country"}, "United States"), ("New York", {"state"}, "NY"),  # an alias
    ("Moscow", {"state", "country"}, "Russia"),  # Moscow, Idaho is far smaller
    ("Hyderabad", {"country"}, "India"),  # not Pakistan's, a fifth of its size
    ("Lang Son", {"country"}, "Vietnam"), ("Lạng Sơn", {"country"}, "Vietnam"),  # accents
    ("Chennai", {"state"}, None),  # no state: the description shows only a US one
    ("Springfield", {"state"}, None),  # Missouri's and Massachusetts' are alike
    ("Marapu", {"state", "country"}, None), ("Big Apple", {"state"}, None),
    ("Boston", set(), None),
])
def test_a_city_s_region_comes_from_the_gazetteer(city, asked, expected):
    assert region(city, asked) == expected


def test_a_bare_city_gets_its_region_where_its_parameter_asks():
    weather = tool(location={"type": "string", "description": EITHER},
                   unit={"type": "string", "enum": ["celsius", "fahrenheit"]})
    for city, whole in (("Boston", "Boston, MA"), ("Tel Aviv", "Tel Aviv, Israel"),
                        (" Moscow ", "Moscow, Russia")):
        asked = {"location": city, "unit": "celsius"}
        assert regional_places(weather, asked, f"Weather in {city.strip()}, in celsius?") == \
            {"location": whole, "unit": "celsius"}
    request = "What's the weather like?"
    for t, arguments in (
            (weather, {"location": "Boston, MA"}),  # a region already
            (weather, {"location": "Springfield"}), (weather, {"location": "Gotham"}),
            (weather, {"location": "221B Baker Street"}),  # digits: no city's bare name
            (tool(location={"type": "string", "description": EITHER},
                  state={"type": "string"}), {"location": "Boston"}),  # the state goes there
            (tool(location={"type": "string", "description": EITHER, "maxLength": 8}),
             {"location": "Boston"}),  # the schema does not take it
            (tool(city={"type": "string", "description": "The city"}), {"city": "Boston"}),
            (tool(note={"type": "string", "description": STATE}), {"note": "Boston"})):
        assert regional_places(t, arguments, request) is arguments
    # the user's own words stand: another state or country named, by any of its names
    for city, request in (("Paris", "Weather in Paris in Texas?"),
                          ("Paris", "Weather in Paris near Dallas, TX?"),
                          ("Boston", "Weather in Boston in the UK?"),
                          ("Boston", "Weather in Boston, England.")):
        assert regional_places(weather, {"location": city}, request) == {"location": city}
    # the region's own country named is no other: Boston, MA is in the USA
    assert regional_places(weather, {"location": "Boston"}, "Weather in Boston in the USA") \
        == {"location": "Boston, MA"}
    # a state's or a country's name is the state or the country, not a town of its name;
    # a common word is no city where the request does not write it capitalised
    for value, request in (("Virginia", "Weather in Virginia?"), ("Jordan", "Jordan today"),
                           ("Washington", "Washington state weather"),
                           ("Colorado", "Colorado"), ("North", "the weather up north"),
                           ("Boston", "Weather in boston, please")):
        assert regional_places(weather, {"location": value}, request) == {"location": value}
    # a region the user writes in lower case is still named ("Paris texas", "athens ga")
    for value, request in (("Paris", "Weather in Paris texas?"),
                           ("Portland", "Weather in Portland maine?"),
                           ("Boston", "Weather in Boston? i'm from canada"),
                           ("columbus", "weather in columbus georgia"),
                           ("athens", "athens ga")):
        assert regional_places(weather, {"location": value}, request) == {"location": value}
    # a big city in a message written all in lower case is a city ("turkey" is no Turkey)
    assert regional_places(weather, {"location": "boston"}, "weather in boston") == \
        {"location": "boston, MA"}
    assert regional_places(weather, {"location": "Boston"}, "weather in boston? making "
                           "turkey tonight") == {"location": "Boston, MA"}
    # the conversation, not only its last message: a region named before stands
    heard = "I am in Paris, Texas this week.\nWhat's the weather in Paris?"
    assert regional_places(weather, {"location": "Paris"}, heard) == {"location": "Paris"}
    # the city's own name is no other state: New York, NY
    assert regional_places(weather, {"location": "New York"}, "Weather in New York? OK") == \
        {"location": "New York, NY"}


def test_an_unreadable_gazetteer_adds_nothing(tmp_path, monkeypatch):
    import mlx_agent.place_region as pr

    broken = tmp_path / "places.json.gz"
    broken.write_bytes(b"\x1f\x8b not gzip")
    monkeypatch.setattr(pr, "PLACES", broken)
    pr.gazetteer.cache_clear()
    try:
        weather = tool(location={"type": "string", "description": EITHER})
        arguments = {"location": "Boston"}
        assert pr.regional_places(weather, arguments, "Weather in Boston?") is arguments
        assert pr.country_code("UK", 2) is None
    finally:
        pr.gazetteer.cache_clear()


def test_the_gazetteer_is_whole_and_attributed():
    doc = json.loads(gzip.decompress(PLACES.read_bytes()))
    assert "GeoNames" in doc["source"] and "CC BY" in doc["source"]
    assert len(doc["cities"]) > 30_000 and len(doc["us_states"]) >= 50
    assert doc["countries"]["IL"] == ["Israel", "ISR"]


@pytest.mark.real_model
def test_the_bundled_model_asked_for_a_city_and_state_gets_both(tmp_path):
    tools = tmp_path / "weather.json"
    tools.write_text(json.dumps([{
        "name": "get_current_weather", "description": "Get the current weather in a location.",
        "parameters": {"type": "object", "properties": {
            "location": {"type": "string", "description": STATE},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["location"]},
        "_exec": 'echo "sunny, 21 degrees in $location"'}]))
    cli = [sys.executable, "-m", "mlx_agent.cli.main", "agent", "--tools", str(tools),
           "--json-out", "--single"]
    # the question names the tool by its noun ("current" says when, and needs no writing):
    # the model, which would answer "Boston is in the weather here.", must call it
    for request, extra, places in (
            ("Get the current weather in Boston.", [], ["Boston, MA"]),
            ("Get the current weather in Boston.", ["--no-stated-arguments"], ["Boston"]),
            ("What's the weather in Boston?", [], ["Boston, MA"]),
            ("What's the weather in Boston?", ["--no-stated-arguments"], [])):
        r = subprocess.run(cli + [request] + extra, capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, r.stderr
        events = [ev.decode(line) for line in r.stdout.splitlines()]
        calls = [e.arguments for e in events if isinstance(e, ev.ToolCall)]
        assert [c["location"] for c in calls] == places, (request, extra, calls)


@pytest.mark.parametrize("country, letters, code", [
    ("UK", 2, "GB"), ("the UK", 2, "GB"), ("Germany", 2, "DE"), ("Germany", 3, "DEU"),
    ("united  states", 2, "US"), ("USA", 3, "USA"), ("gb", 2, "GB"), ("FRA", 2, "FR"),
    ("Narnia", 2, None), ("", 2, None),
])
def test_a_country_s_iso_code(country, letters, code):
    assert country_code(country, letters) == code


@pytest.mark.parametrize("description, letters", [
    ("ISO 3166-1 alpha-2 country code. If not provided, the default code US is used", 2),
    ("Two-letter country code; do not use a 3-letter code", 2),
    ("Country code (ISO 3166). No full names, codes only", 2),
    ("Full English country name; do not use ISO 3166 codes.", 0),
    ("Country name in English, no country codes", 0), ("The country, not 2-letter codes", 0),
    ("The 3-letter country code", 3), ("ISO 3166-1 alpha-3", 3),
    ("The full name, not the ISO 3166 code", 0), ("The country", 0),
])
def test_the_code_a_country_s_parameter_asks(description, letters):
    assert asks_code("country", {"type": "string", "description": description}) == letters


def test_a_country_is_written_as_the_code_its_parameter_asks():
    alpha2 = {"type": "string", "description": "The country where the city is located, e.g., "
              "'US' for the United States. Use ISO 3166-1 alpha-2 country codes."}
    weather = tool(city={"type": "string"}, country=alpha2)
    assert country_codes(weather, {"city": "London", "country": "UK"}) == \
        {"city": "London", "country": "GB"}
    assert country_codes(tool(country_code={"type": "string", "description":
                                            "The 3-letter country code"}),
                         {"country_code": "Japan"}) == {"country_code": "JPN"}
    for t, arguments in (
            (weather, {"city": "London", "country": "GB"}),  # a code already
            (weather, {"city": "London", "country": "Narnia"}),  # no country known
            (tool(country={"type": "string", "description": "The country's name"}),
             {"country": "UK"}),  # a name is asked
            (tool(city={"type": "string", "description": alpha2["description"]}),
             {"city": "UK"}),  # no country's parameter
            (tool(country={**alpha2, "enum": ["UK", "US"]}), {"country": "UK"}),
            (tool(country={"type": "string", "description": "The full name, not the ISO "
                           "3166 code"}), {"country": "UK"}),  # a name, said so
            (tool(country_name=alpha2), {"country_name": "UK"}),
            (tool(country={"type": "string", "description": "Full country name, not the "
                           "2-letter code"}), {"country": "UK"}),
            (tool(country={**alpha2, "maxLength": 1}), {"country": "UK"})):
        assert country_codes(t, arguments) is arguments
