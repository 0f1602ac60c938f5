"""A call's strings as the request writes them: a garbled copy copied again, a place whole.

The default adapter, asked for the weather in "Riga, Latvia", called
``get_current_weather(location="Riga")``; asked for the route to "Los Angeles", it wrote
``end_location: "Lasagna"``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from mlx_agent import trajectory as tj
from mlx_agent.agent import agent_format
from mlx_agent.agent import events as ev
from mlx_agent.chat import ChatFormat
from mlx_agent.copied_values import (MARGIN, apart_values, as_cased, as_quoted,
                                     assigned_values, garbled, is_place, named_choices,
                                     percent_rates, phrases, place_alone, recopied,
                                     scaled_numbers, signed_numbers, whole_identifiers,
                                     whole_lists, whole_paths, whole_place, whole_places,
                                     written_choices)
from mlx_agent.heard import Heard, number_runs
from mlx_agent.stated_arguments import complete_reply
from mlx_agent.tools import parse_tools

from .test_agent_loop import QWEN_LIKE
from .test_loop_guard import Obliging
from .test_stated_arguments import WEATHER, ask, assert_reused_whole, weather_replies

EXAMPLES = Path(__file__).parents[1] / "examples"


def tool(**properties):
    return parse_tools(json.dumps([{"name": "t", "description": "A tool.", "parameters": {
        "type": "object", "properties": properties,
        "required": list(properties)[:1]}}]), runnable=False)[0]


ROUTE = "from San Francisco, CA to Los Angeles, CA"


@pytest.mark.parametrize("value, request_, expected", [
    ("Riga", "Im at Riga, Latvia, Can you tell me the temperature?", "Riga, Latvia"),
    ("Bangkok", "the weather in Bangkok, Thailand. I have a busy day", "Bangkok, Thailand"),
    ("2020 Addison Street", "a ride from 2020 Addison Street, Berkeley, CA, USA, and I can wait",
     "2020 Addison Street, Berkeley, CA, USA"),
    ("San Francisco", ROUTE, "San Francisco, CA"), ("Los Angeles", ROUTE, "Los Angeles, CA"),
    ("Berkeley", "at Berkeley, CA 94704 and then", "Berkeley, CA 94704"),
    ("paris", "Weather in Paris, France?", "Paris, France"),  # as the request writes it
    ("Paris", "Weather in Paris, france", "Paris"),  # a qualifier is capitalised
    ("Paris", "Weather in Paris, Can you tell me?", "Paris"),  # a clause's first word
    ("Paris", "Visit Paris, London and Rome.", "Paris"),  # a list of places
    ("Boston", "Flights from Boston, Chicago, and Denver", "Boston"),
    ("Oslo", "Weather in Oslo.", "Oslo"), ("Lima", "Weather in Oslo, Norway.", "Lima"),
    ("Paris", "Weather in Paris, May 5, 2024?", "Paris"),  # a date
    ("New York", "Hotels in New York, 2 adults, 3 nights", "New York"),  # a count
    ("Paris", "in Paris, France, Celsius please", "Paris, France"),  # a unit
    ("London", "Weather in London, UK, Tomorrow I fly", "London, UK"),
    ("Paris", "Weather in Paris, Mr. Smith asks", "Paris"), ("Paris", "Paris, TX", "Paris, TX"),
])
def test_a_place_is_copied_whole(value, request_, expected):
    assert whole_place(value, request_, []) == expected


def test_only_a_place_of_a_tool_with_no_parameter_for_its_parts_is_extended():
    request = "Weather in Paris, France, for Alice, Bob."
    weather = tool(location={"type": "string"})
    assert whole_places(weather, {"location": "Paris"}, request) == \
        {"location": "Paris, France"}
    for t, arguments in ((tool(city={"type": "string"}, country={"type": "string"}),
                          {"city": "Paris"}),  # France goes in country
                         (tool(to={"type": "string"}), {"to": "Alice"}),  # not a place
                         (tool(city={"type": "string", "enum": ["Paris"]}), {"city": "Paris"}),
                         (tool(city={"type": "string"}, note={"type": "string"}),
                          {"city": "Paris", "note": "France"}),  # another argument's
                         (tool(city={"type": "string", "maxLength": 8}), {"city": "Paris"})):
        assert whole_places(t, arguments, request) is arguments
    # a parameter for a place's part by whole words: "statement_id" is no state
    assert whole_places(tool(city={"type": "string"}, statement_id={"type": "string"}),
                        {"city": "Lund"}, "Go to Lund, Sweden.") == {"city": "Lund, Sweden"}
    # another argument's value as whole words only: "en" is not in "Sweden"
    assert whole_places(tool(city={"type": "string"}, lang={"type": "string"}),
                        {"city": "Lund", "lang": "en"}, "Go to Lund, Sweden.") == \
        {"city": "Lund, Sweden", "lang": "en"}
    assert [is_place(n) for n in ("loc", "pickup_city", "startLocation", "home_address")] == \
        [True, True, True, True]
    assert not any(map(is_place, ("block", "email_address", "placeholder", "original_text",
                                  "origin_language", "name", "title")))


def test_a_place_that_runs_on_into_another_parameter_is_cut_back_to_the_place():
    rental = tool(plate_number={"type": "string"}, pickup_city={"type": "string"},
                  litres={"type": "number"},
                  unit={"type": "string", "enum": ["celsius", "fahrenheit"]})
    request = "Browse rentals with pickup city equal to Tunis, litres equal to 119.21."
    assert place_alone(rental, "pickup_city", " Tunis, litres equal to 119.21", request) == \
        "Tunis"
    assert place_alone(rental, "pickup_city", "Lang Son in fahrenheit",
                       "Weather in Lang Son in fahrenheit?") == "Lang Son"  # an enum value
    for value, request_ in (("Tunis", request),  # mentions none
                            ("litres", "litres"),  # nothing would be left
                            ("Tunis, litres", "Tunis and litres")):  # not copied as it is
        assert place_alone(rental, "pickup_city", value, request_) == value
    assert whole_places(rental, {"plate_number": "P", "pickup_city": "Sfax, litres"},
                        "in Sfax, litres 3 and Sfax, Tunisia") == \
        {"plate_number": "P", "pickup_city": "Sfax, Tunisia"}  # cut, then made whole


def test_a_list_of_numbers_one_item_off_the_requests_is_copied_whole():
    request = "Average of [12, 15, 18, 20, 21]; bins 5, 6 and 7 and 8, then 1,500 or 2"
    assert number_runs(request) == [[12, 15, 18, 20, 21], [5, 6, 7, 8]]
    numbers = tool(data={"type": "array", "items": {"type": "integer"}},
                   other={"type": "array", "items": {"type": "number"}})
    for data, expected in (([12, 15, 20, 21], [12, 15, 18, 20, 21]),  # an inner one left out
                           ([12, 15, 18, 20, 21, 21], [12, 15, 18, 20, 21]),  # one repeated
                           ([12, 15, 15, 18, 20, 21], [12, 15, 18, 20, 21]),
                           ([15, 18, 20, 21], None),  # dropped from an end: a filter
                           ([12, 15, 19, 20, 21], None),  # one changed: an edit
                           ([12, 15, 18, 20, 21, 7], None),  # one added: an edit
                           ([12, 20, 21], None),  # two off: the model's own list
                           ([5, 7, 8], [5, 6, 7, 8]), ([21, 20, 18, 15, 12], None)):
        arguments = {"data": data}
        assert whole_lists(numbers, arguments, request) == \
            ({"data": expected} if expected else arguments), data
    held = {"data": [5, 7, 8], "other": [5, 6, 7, 8]}  # another argument's list
    assert whole_lists(numbers, held, request) is held
    words = tool(tags={"type": "array", "items": {"type": "string"}})
    assert whole_lists(words, {"tags": ["12", "15"]}, request) == {"tags": ["12", "15"]}


def test_a_list_already_right_or_an_edit_stays():
    numbers = tool(x={"type": "array", "items": {"type": "number"}},
                   y={"type": "array", "items": {"type": "number"}})
    # a list equal to one run is not "fixed" into another it is one off
    assert whole_lists(numbers, {"x": [10, 20, 30, 40]},
                       "Data: 10, 20, 30. Update: use 10, 20, 30, 40 instead.") == \
        {"x": [10, 20, 30, 40]}
    # "remove duplicates from 1, 2, 2, 3": a repeat left out is the request's edit
    assert whole_lists(numbers, {"x": [1, 2, 3]}, "Dedupe 1, 2, 2, 3.") == {"x": [1, 2, 3]}
    # one run two lists are near: neither is changed (no swap)
    both = {"x": [1, 2, 3, 3], "y": [1, 3]}
    assert whole_lists(numbers, both, "x: 1, 2, 3 and more") is both


@pytest.mark.parametrize("value, heard, expected", [
    ("Lasagna", "Route to Los Angeles", True), ("Las Angeles", "to Los Angeles", True),
    ("Los Angeles", "to los angeles", False), ("inch", "4 inches", False),
    ("inches", "1 inch", False), ("PLA-8435", "plate PLA-8435", False),
    ("2024-03-05", "tomorrow", False),  # no word of letters: a date, an id, a number
    ("ORD-124", "order ORD-1234", False), ("go", "went", False),  # under three letters
    ("miles", "the distance in milesfrom here", False),  # begins a word written
])
def test_what_is_garbled(value, heard, expected):
    assert garbled(value, Heard(heard)) is expected


def test_a_requests_phrases_are_its_runs_of_words_as_written():
    got = phrases("Route to Los Angeles, CA? Now.")
    assert {"Los Angeles", "Los Angeles, CA", "CA", "Route to Los Angeles, CA? Now"} <= set(got)
    assert "Angeles, CA?" not in got and got == sorted(got)
    assert phrases("Los\x00Angeles\tnow") == ["Angeles", "Los", "now"]  # no NUL, no tab
    from mlx_agent.copied_values import _alike

    # the phrases a probe may choose for "LAS": SequenceMatcher's ratio of the value first
    # (its ratio is not symmetric: "Los Angeles" first would give 0.29, under LIKENESS)
    assert _alike("LAS", ["Los Angeles", "Los", "lawsuit", "court"]) == \
        ["Los", "Los Angeles", "lawsuit"]
    long = phrases("word " * 100_000)  # the first 2,000 characters only
    assert long == ["word" + " word" * i for i in range(8)]


@pytest.mark.parametrize("protocol", ["json", "hermes"])
def test_a_garbled_copy_is_copied_again_and_the_cache_reused_whole(tiny_lm, protocol,
                                                                   tmp_path):
    lm = tiny_lm if protocol == "json" else replace(tiny_lm, chat=ChatFormat(QWEN_LIKE))
    call, answer = weather_replies(protocol, "Rigggga Lattvviiaa")
    rec = tj.Recorder(tmp_path, task="t", model_fingerprint="fp", sampling={})
    # the probe may write only the request's phrases: the script's is one, and this model
    # finds it more likely than its own spelling (test_a_less_likely_copy_is_not_taken)
    agent, out, events = ask(lm, protocol, [call, '"Riga, Latvia"}', answer],
                             "Weather in Riga, Latvia.", recorder=rec)
    assert [(c.arguments, c.stdout) for c in events.of(ev.ToolCall)] == \
        [({"city": "Riga, Latvia"}, "Riga, Latvia celsius")]
    # the answer states nothing of the result: it follows (mlx_agent.stated_result)
    assert out.answer == "done\n\nweather returned Riga, Latvia celsius."
    assert out.stats.stated_calls == 1 and out.stats.stated_answers == 1
    assert_reused_whole(tj.read(rec.path), agent)
    # a place cut at its comma is copied whole, with no probe
    call, answer = weather_replies(protocol, "Riga")
    _, out, events = ask(lm, protocol, [call, answer], "Weather in Riga, Latvia.")
    assert [c.arguments for c in events.of(ev.ToolCall)] == [{"city": "Riga, Latvia"}]


def test_a_less_likely_copy_is_not_taken(tiny_lm):
    from mlx_agent.probe import _value_grammar, likelihood

    cached = _value_grammar.cache_info().currsize
    fmt = agent_format("json", tiny_lm)
    messages = [{"role": "user", "content": "Weather in Riga, Latvia."}]
    prompt = fmt.prompt_ids(messages, WEATHER)
    # the probe writes "Riga, Latvia"; "Riga", a shorter phrase it starts with, is what this
    # model finds most likely of the two, and is weighed against the model's own value:
    # "Rigggga Lattvviiaa" is less likely (a garble), "Paris" more (a value it meant)
    for city, taken in (("Rigggga Lattvviiaa", True), ("Paris", False)):
        call = weather_replies("json", city)[0]
        ids = tiny_lm.encode_text(call)
        engine = tiny_lm.engine()
        odds = {v: likelihood(engine, tiny_lm, prompt, "json", WEATHER[0], {}, "city", v)
                for v in ("Riga, Latvia", "Riga", city)}
        assert odds["Riga"] > odds["Riga, Latvia"]
        assert (odds["Riga"] >= odds[city] - MARGIN) is taken  # the model's preference decides
        copied = recopied(engine, tiny_lm, prompt, "json", WEATHER[0], {"city": city},
                          messages[0]["content"], messages[0]["content"],
                          Obliging(tiny_lm, '"Riga, Latvia"}'))
        assert copied == {"city": "Riga" if taken else city}
        engine.sync(prompt + ids)
        reply, _, out_ids = complete_reply(engine, tiny_lm, "json", prompt, fmt.parse(call),
                                           call, ids, [], WEATHER, messages,
                                           Obliging(tiny_lm, '"Riga, Latvia"}'))
        # "Riga", then the qualifier the request writes after it (whole_places)
        assert reply.calls[0].arguments == {"city": "Riga, Latvia" if taken else city}
        assert engine.tokens == prompt + out_ids
    # a request's phrases make a grammar of its own: not kept in the schemas' cache
    assert _value_grammar.cache_info().currsize == cached


def test_of_optional_strings_that_repeat_one_another_the_likeliest_stays(tiny_lm):
    from mlx_agent.copied_values import one_of_repeats
    from mlx_agent.probe import likelihood

    movies = parse_tools(json.dumps([{"name": "find_movies", "parameters": {
        "type": "object", "required": ["city"], "properties": {
            "city": {"type": "string"}, "cast": {"type": "string"},
            "directed_by": {"type": "string"}, "genre": {"type": "string"}}}}]),
        runnable=False)[0]
    fmt = agent_format("json", tiny_lm)
    prompt = fmt.prompt_ids([{"role": "user", "content": "A film with Tzi Ma in Oslo."}],
                            [movies])
    engine = tiny_lm.engine()
    arguments = {"city": "Oslo", "cast": "Tzi Ma", "directed_by": " tzi  ma", "genre": "Drama"}
    odds = {n: likelihood(engine, tiny_lm, prompt, "json", movies, arguments, n, arguments[n])
            for n in ("cast", "directed_by")}
    kept = max(odds, key=odds.get)
    assert one_of_repeats(engine, tiny_lm, prompt, "json", movies, arguments) == \
        {k: v for k, v in arguments.items() if k not in odds or k == kept}
    assert one_of_repeats(engine, tiny_lm, prompt, "json", movies, arguments,
                          stop=lambda: True) is arguments  # the client left: as it was
    apart = {"city": "Oslo", "cast": "Tzi Ma", "genre": "Drama"}
    assert one_of_repeats(engine, tiny_lm, prompt, "json", movies, apart) is apart


@pytest.mark.parametrize("protocol", ["json", "hermes"])
def test_a_value_the_model_meant_otherwise_stays(tiny_lm, protocol):
    lm = tiny_lm if protocol == "json" else replace(tiny_lm, chat=ChatFormat(QWEN_LIKE))
    call, answer = weather_replies(protocol, "New York City")
    # the phrase the model picks shares too little with what it wrote: not a miscopy
    # (the model's own call: this random model would answer, and be made to call the tool
    # the request names, then asked for the city it made up)
    _, out, events = ask(lm, protocol, [call, '"Manhattan"}', answer], "Weather in Manhattan.",
                         follow_named_tool=False)
    assert [c.arguments for c in events.of(ev.ToolCall)] == [{"city": "New York City"}]
    _, out, events = ask(lm, protocol, [weather_replies(protocol, "Rigga")[0], answer],
                         "Weather in Riga, Latvia.", stated_arguments=False)
    assert [c.arguments for c in events.of(ev.ToolCall)] == [{"city": "Rigga"}]


def test_a_phrase_another_argument_holds_is_not_copied(tiny_lm):
    two = parse_tools(json.dumps([{"name": "server", "description": "Add a server.",
                                   "parameters": {"type": "object", "properties": {
                                       "host": {"type": "string"}, "key": {"type": "string"}},
                                       "required": ["host", "key"]}}]), runnable=False)
    fmt = agent_format("json", tiny_lm)
    messages = [{"role": "user", "content": "Add the server plga.ca with key topsecret."}]
    for key, script, expected in (("plgax", '"plga.ca"}', "plgax"),  # the host's
                                  ("topsecrt", '"topsecret"}', "topsecret")):
        call = json.dumps({"tool": "server", "arguments": {"host": "plga.ca", "key": key}},
                          separators=(",", ":"))
        prompt, ids = fmt.prompt_ids(messages, two), tiny_lm.encode_text(call)
        engine = tiny_lm.engine()
        engine.sync(prompt + ids)
        reply, text, out_ids = complete_reply(engine, tiny_lm, "json", prompt, fmt.parse(call),
                                              call, ids, [], two, messages,
                                              Obliging(tiny_lm, script))
        assert reply.calls[0].arguments == {"host": "plga.ca", "key": expected}
        assert engine.tokens == prompt + out_ids


VISIT = tool(pet_name={"type": "string"},
             species={"type": "string", "enum": ["cat", "dog", "hamster", "hot_air"]},
             other={"type": "string", "enum": ["cat", "dog"]}, count={"type": "integer"})


@pytest.mark.parametrize("arguments, request_, expected", [
    # the request writes one other value of the enum: that one
    ({"pet_name": "Ximena", "species": "cat"}, "Add a visit for Ximena, the hamster option.",
     {"pet_name": "Ximena", "species": "hamster"}),
    ({"pet_name": "Ximena", "species": "cat"}, "Ximena flies in a hot air balloon.",
     {"pet_name": "Ximena", "species": "hot_air"}),  # the value's words apart
    ({"pet_name": "Ximena", "species": "cat"}, "Ximena, in a hot-air balloon.",
     {"pet_name": "Ximena", "species": "hot_air"}),
    ({"pet_name": "Ximena", "species": "cat"}, "Two hamsters for Ximena.",
     {"pet_name": "Ximena", "species": "hamster"}),  # as its plural
    # the request writes the value, or a word that begins with it ("Cats", "category")
    ({"pet_name": "X", "species": "cat"}, "Cats, or a hamster, for X.", None),
    ({"pet_name": "X", "species": "cat"}, "A category for X, hamster or not.", None),
    ({"pet_name": "X", "species": "cat"}, "A dog or a hamster for X.", None),  # two others
    ({"pet_name": "X", "species": "cat"}, "A pet for X.", None),  # none
    ({"pet_name": "X", "species": "cat", "other": "dog"}, "X: dog.", None),  # another holds it
    ({"pet_name": "X", "species": "dogfish"}, "A hamster for X.",  # not even the enum's
     {"pet_name": "X", "species": "hamster"}),
    ({"pet_name": "hamster", "count": 2}, "A hamster called Bo.", None),  # no enum
])
def test_an_enums_value_the_request_names_is_taken(arguments, request_, expected):
    assert written_choices(VISIT, arguments, request_) == (expected or arguments)


@pytest.mark.parametrize("arguments, request_, expected", [
    ({"a": 50, "b": 100}, "A payout of 50 million on 100 million shares.",
     {"a": 50_000_000, "b": 100_000_000}),
    ({"a": 1.5}, "It costs 1.5 billion dollars.", {"a": 1_500_000_000}),
    ({"a": 2}, "Some 2 thousand, 2 billion.", None),  # two scales: which one?
    ({"a": 2_000_000, "b": 2}, "The 2 million dollar estate among 2 heirs", None),
    ({"a": 3}, "3 million users: the top 3", None),  # also written without its scale
    ({"a": 2.01}, "2.01 million", {"a": 2_010_000}),  # to 12 significant digits
    ({"a": 2}, "2 trillion dollars", {"a": 2_000_000_000_000}),
    ({"a": 1e299}, "1" + "0" * 299 + " trillion", None),  # past a float: left
    ({"a": 213}, "213 million people", None),  # the parameter counts in millions
    ({"a": 8}, "8.5 million square kilometers", None),  # not the number written
    ({"a": 5}, "5 m tall, 5 k", None),  # words only: "m" may be metres
    ({"a": "213"}, "213 million", None),  # a number only
    # a power of ten: "1e-9" copied as 1.0
    ({"a": 2.0}, "Charges of 1e-9 and 2e-9 at 0.05 m", {"a": 2e-9}),
    ({"a": 1.0, "b": 2}, "Charges of 1e-9 and 2e-9 at 0.05 m", {"a": 1e-9, "b": 2}),  # b: int
    ({"a": 6.02}, "Avogadro's 6.02 x 10^23", {"a": 6.02e23}),
    ({"a": 3.2}, "3.2\u00d710^-5 moles", {"a": 3.2e-5}),
    ({"a": 1.0}, "1e-9 over 1 metre", None),  # also written bare
    ({"a": 123}, "the id 123e4567-e89b", None),  # part of a word
    ({"a": 1}, "1e400 and 2 x 10^999", None),  # past a float: no OverflowError
])
def test_a_number_the_request_scales_is_taken_at_its_scale(arguments, request_, expected):
    t = parse_tools(json.dumps([{"name": "t", "parameters": {"type": "object", "properties": {
        "a": {"type": "number", "description": "in millions" if "people" in request_
              else "an amount"}, "b": {"type": "integer"}}, "required": ["a"]}}]),
        runnable=False)[0]
    assert scaled_numbers(t, arguments, request_) == (expected or arguments)


COORDINATES = parse_tools(json.dumps([{"name": "t", "parameters": {"type": "object",
    "properties": {"lat": {"type": "number"}, "lon": {"type": "number"},
                   "pair": {"type": "array", "items": {"type": "number"}},
                   "watts": {"type": "number", "minimum": 0}},
    "required": ["lat"]}}]), runnable=False)[0]


@pytest.mark.parametrize("arguments, request_, expected", [
    ({"lat": 37.8651, "lon": 119.5383}, "the forecast at 37.8651 N, 119.5383 W?",
     {"lat": 37.8651, "lon": -119.5383}),
    ({"lat": 33.9, "lon": 18.4}, "Cape Town, 33.9\u00b0S 18.4\u00b0E", {"lat": -33.9, "lon": 18.4}),
    ({"lat": 1, "pair": [37.8715, 122.273]}, "latitude 37.8715 and longitude -122.2730",
     {"lat": 1, "pair": [37.8715, -122.273]}),
    ({"lat": 5, "lon": 5}, "from -5 to 5", None),  # written both ways
    ({"lat": -3, "lon": 3}, "-3 or so", None),  # another argument holds it
    ({"lat": 1, "watts": 100}, "a 100 W bulb at -100 C", None),  # the schema refuses it
    ({"lat": 100}, "a 100 W bulb", None),  # a unit, not a west longitude
    ({"lat": 2}, "2 N, 3 E", None),
    ({"lat": 3, "lon": 3}, "Shift it by -3, three times", {"lat": -3, "lon": 3}),  # one takes it
])
def test_a_number_the_request_writes_negative_keeps_its_sign(arguments, request_, expected):
    assert signed_numbers(COORDINATES, arguments, request_) == (expected or arguments)


RATES = parse_tools(json.dumps([{"name": "t", "parameters": {"type": "object", "properties": {
    "rate": {"type": "number", "description": "The annual interest rate."},
    "growth": {"type": "number"}, "years": {"type": "integer"},
    "discount": {"type": "number", "description": "As a decimal, e.g. 5% is 0.05."},
    "yield_pct": {"type": "number", "description": "The yield."},
    "annual_rate": {"type": "number", "description": "The rate as a percentage."},
    "volume": {"type": "number", "description": "The volume level."},
    "small": {"type": "number", "description": "The rate.", "minimum": 1},
    "pct_sign": {"type": "number", "description": "The interest rate (%)."},
    "per": {"type": "number", "description": "The tax rate, e.g. 8 for 8%."}},
    "required": ["rate"]}}]), runnable=False)[0]


@pytest.mark.parametrize("arguments, request_, expected", [
    ({"rate": 5, "years": 10}, "$10000 at an annual interest rate of 5% for 10 years",
     {"rate": 0.05, "years": 10}),
    ({"rate": 1, "growth": 3.5}, "3.5 percent a year", {"rate": 1, "growth": 0.035}),
    ({"rate": 1, "discount": 20}, "20% off", {"rate": 1, "discount": 0.2}),
    ({"rate": 0.05}, "5%", None),  # the fraction already
    ({"rate": 1, "yield_pct": 5}, "a 5% yield", None),  # "pct": a percentage
    ({"rate": 1, "annual_rate": 5}, "a 5% rate", None),  # says it is a percentage
    ({"rate": 1, "volume": 30}, "volume at 30%", None),  # not a rate
    ({"rate": 5}, "5% over 5 years", None),  # also written bare
    ({"rate": 1, "small": 5}, "5%", None),  # the schema refuses it
    ({"rate": 1, "pct_sign": 5}, "a 5% rate", None),  # "(%)": a percentage
    ({"rate": 1, "per": 8}, "8% tax", None),  # "8 for 8%"
])
def test_a_rate_written_as_a_percentage_is_its_fraction(arguments, request_, expected):
    assert percent_rates(RATES, arguments, request_) == (expected or arguments)


@pytest.mark.parametrize("a, b, expected", [
    ("London 2022/08/16", "2022/08/16", "London"), ("NBA 2021", "2021", "NBA"),
    ("New York to Los Angeles", "Los Angeles", "New York"),
    ("London, United Kingdom", "United Kingdom", "London"),
    ("Hotel California", "California", None),  # a name: no digit, no joining word
    ("Bank of America", "America", None), ("Sunnyvale Indian", "Sunnyvale", None),
    ("1st June 2022", "June 2022", None),  # no word of three letters before it
    ("Los Angeles", "Los Angeles", None), ("Reggaeton", "Reggae", None),
    ("Lunch with Sarah", "Sarah", None), ("Meet me at Central Park", "Central Park", None),
    ("Send the report to John", "John", None), ("Tom and Jerry", "Jerry", None),
    ("set an alarm for 11 PM", "11 PM", None),  # "for" leads on: a phrase
])
def test_a_value_run_on_into_the_next_ones_is_cut(a, b, expected):
    names = {"New York to Los Angeles": ("start", "end"),
             "London, United Kingdom": ("city", "country")}.get(a, ("a", "b"))
    t = tool(**{names[0]: {"type": "string"}, names[1]: {"type": "string"},
                "e": {"type": "string", "enum": ["x"]}})
    assert apart_values(t, {names[0]: a, names[1]: b}) == {names[0]: expected or a, names[1]: b}
    held = {"e": "London 2022", names[1]: "2022"}  # an enum's value is the schema's
    assert apart_values(t, held) is held


def test_a_place_keeps_what_is_no_part_of_it_and_a_route_its_end():
    t = tool(address={"type": "string"}, city={"type": "string"}, to={"type": "string"},
             message={"type": "string"})
    kept = {"address": "1 Market St, San Francisco", "city": "San Francisco"}
    assert apart_values(t, kept) is kept  # a city is no part of an address to cut
    kept = {"message": "Drive to Boston", "to": "Boston"}  # a message is no route's end
    assert apart_values(t, kept) is kept


STATS = parse_tools(json.dumps([{"name": "t", "parameters": {"type": "object", "properties": {
    "player": {"type": "string"},
    "metrics": {"type": "array", "items": {"type": "string", "enum": [
        "Points", "Rebounds", "Assists", "high_low_temperature", "player count", "all",
        "news"]}},
    "odd": {"type": "array", "items": {"enum": ["celsius", {"k": 1}]}}},
    "required": ["player"]}}]), runnable=False)[0]


@pytest.mark.parametrize("metrics, request_, expected", [
    (None, "Get point and rebound stats for LeBron", ["Points", "Rebounds"]),  # in its order
    (["Points"], "rebounds and points for LeBron", ["Rebounds", "Points"]),
    ([], "high and low temperatures", ["high_low_temperature"]),  # a word between
    (None, "the rating and player count", ["player count"]),
    (["Assists"], "rebounds and points", None),  # the model named one the request does not
    (["Points"], "points for LeBron", None),  # as named
    (["Points"], "all points", None),  # one named: the model's stands ("all": too short)
    (None, "LeBron's stats", None),  # none named
    (None, "the newest assists", ["Assists"]),  # whole words: "newest" is no "news"
])
def test_a_list_of_choices_holds_each_the_request_names(metrics, request_, expected):
    arguments = {"player": "LeBron"} | ({} if metrics is None else {"metrics": metrics})
    assert named_choices(STATS, arguments, request_) == \
        ({"player": "LeBron", "metrics": expected} if expected else arguments)
    odd = {"player": "x", "metrics": ["Points"], "odd": [{"k": 1}]}  # an object in an enum
    assert named_choices(STATS, odd, "in celsius") is odd


ASSIGN = parse_tools(json.dumps([{"name": "calculate", "parameters": {"type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "number"},
                   "op": {"type": "string", "enum": ["add", "sub"]},
                   "start_time": {"type": "string"}, "to": {"type": "string"},
                   "url": {"type": "string"}}, "required": ["a"]}}]), runnable=False)[0]


@pytest.mark.parametrize("arguments, request_, expected", [
    ({"a": 371, "b": 806}, "compute a op b (b=371, a=806, the sub option)", {"a": 806, "b": 371}),
    ({"a": 1, "start_time": "HH:MM"}, "with start time equal to '20:00'",
     {"a": 1, "start_time": "20:00"}),
    ({"a": 1, "b": 2.5}, "a being 7 and b: 1,500.5", {"a": 7, "b": 1500.5}),
    ({"a": 1}, "a=1 or a=2", None),  # assigned twice: which?
    ({"a": 1, "op": "add"}, "op=sub", {"a": 1, "op": "sub"}),  # an enum's value
    ({"a": 1, "op": "add"}, "op=MUL", None),  # no value of the enum
    ({"a": 1, "op": "add"}, "a=1 and the op being sub.", {"a": 1, "op": "sub"}),
    ({"a": 1, "start_time": "x"}, "start time: 20:00", {"a": 1, "start_time": "20:00"}),
    ({"a": 1, "to": "GBP"}, "to equal to USD and from equal to GBP", {"a": 1, "to": "USD"}),
    ({"a": 1, "start_time": "x"}, "start time equal to half past", None),  # words: quoted
    ({"a": 1}, "a=2024-12-22", None), ({"a": 1}, "data=5", None),  # not a number; not "a"
])
def test_a_value_the_request_assigns_by_name_is_that_parameters(arguments, request_, expected):
    assert assigned_values(ASSIGN, arguments, request_) == (expected or arguments)


@pytest.mark.parametrize("value, request_, expected", [
    ("Ximena.Mehta@Mail.example.net", "Email arjun.mehta@mail.example.net. Ximena asked.",
     "arjun.mehta@mail.example.net"),
    ("https://exmple.com/a", "Open https://example.com/a?", "https://example.com/a"),
    ("bob@x.org", "mail ann@y.com or ann@y.net", None),  # unlike either (under LIKENESS)
    ("ann@y.xyz", "mail ann@y.com or ann@y.net", None),  # as alike to both: which?
    ("https://x.org", "mail ann@y.com", None),  # a web address is no email
])
def test_an_email_or_web_address_is_copied_whole(value, request_, expected):
    assert whole_identifiers(ASSIGN, {"a": 1, "to": value}, request_) == \
        {"a": 1, "to": expected or value}


@pytest.mark.parametrize("value, request_, expected", [
    ("order more coffee beans.", 'count "Order more coffee beans."', "Order more coffee beans."),
    ("ARJUN@X.ORG", "mail arjun@x.org", "arjun@x.org"),
    ("paris", "Paris or PARIS?", None),  # written two ways: which?
    ("Par", "Paris", None),  # not whole words
    ("ab", "AB", None),  # too short to say
])
def test_a_string_is_cased_as_the_request_writes_it(value, request_, expected):
    assert as_cased(ASSIGN, {"a": 1, "to": value}, request_) == {"a": 1, "to": expected or value}
    held = {"a": 1, "op": "ADD"}  # an enum's value is the schema's
    assert as_cased(ASSIGN, held, "add") is held


def test_a_path_the_request_writes_is_taken_whole():
    files = tool(path={"type": "string"}, file_type={"type": "string"},
                 src_path={"type": "string"})
    request = "Show data/users.csv and out/users.csv.bak, then notes.txt"
    for value, heard, expected in [
        ("users.csv", request, "data/users.csv"), ("./users.csv,", request, "data/users.csv"),
        ("NOTES.TXT", request, "notes.txt"), ("notes", request, "notes.txt"),  # its extension
        ("data/users", request, "data/users.csv"),
        ("users.csv", request + "\nusers.csv", None),  # a result writes it: it is that
        ("notes2.txt", request, None),  # a new name, however alike
        ("csv", request, None),  # no folder before it
    ]:
        assert whole_paths(files, {"path": value}, request, heard) == {"path": expected or value}
    # a path a built-in tool suggested ("did you mean"); not one a result's output writes
    # (a file read or a page fetched could name any path)
    listing = "Show the agenda\ndocs/agenda.md\nnotes.txt"
    assert whole_paths(files, {"path": "agenda.md,"}, "Show the agenda", "Show the agenda",
                       ["docs/agenda.md"]) == {"path": "docs/agenda.md"}
    assert whole_paths(files, {"path": "agenda.md"}, "Show the agenda", listing) == \
        {"path": "agenda.md"}
    # no extension rule for a value with one of its own: a backup is no report
    assert whole_paths(files, {"path": "report.md"}, "see out/report.md.bak", "x") == \
        {"path": "report.md"}
    twice = "Compare a/users.csv and b/users.csv"  # which?
    assert whole_paths(files, {"path": "users.csv"}, twice, twice) == {"path": "users.csv"}
    assert whole_paths(files, {"file_type": "csv"}, request, request) == {"file_type": "csv"}
    move = "Move data/report.txt to the top folder"  # a target is not made the source
    assert whole_paths(files, {"src_path": "data/report.txt", "path": "report.txt"}, move,
                       move) == {"src_path": "data/report.txt", "path": "report.txt"}


def test_a_tool_that_only_reads_reads_the_one_file_the_request_names():
    # "tube.csv" for "Check parts.csv": reading another file than the model made up harms
    # nothing; a write could replace the one file named (a new file's name is made up too)
    reader = tool(path={"type": "string", "description": "File path."})  # takes a file
    request = "How much does a tube cost? Check parts.csv."
    assert whole_paths(reader, {"path": "tube.csv"}, request, request, reads_only=True) == \
        {"path": "parts.csv"}
    check = "Check tools.csv: what condition is the hose in?"
    assert whole_paths(reader, {"path": "what_condition is the hose in?"}, check, check,
                       reads_only=True) == {"path": "tools.csv"}
    kept = [  # the request, what it and the turn's results wrote, whether it only reads,
        # and every message so far
        ("tube.csv", request, request, False, ""),  # a tool that may write
        ("tube.csv", "Compare parts.csv with stock.csv", "", True, ""),  # which?
        ("config/app.toml", "What port does the app in config/ use?", "", True, ""),  # a folder
        ("logs/april.log", "Read the April log and compare it with notes.txt.", "", True,
         "logs/april.log\nnotes.txt"),  # an earlier turn's listing wrote it
        ("tube.csv", request, request + "\ntube.csv", True, ""),  # this turn's result did
    ]
    for value, request_, heard, reads_only, said in kept:
        assert whole_paths(reader, {"path": value}, request_, heard or request_, (),
                           reads_only, said) == {"path": value}
    # a folder's path (list_files, grep) is never made the file's
    folders = tool(path={"type": "string", "description": "File or directory."})
    assert whole_paths(folders, {"path": "docs.v2"}, "List what is next to notes.txt.",
                       "List what is next to notes.txt.", reads_only=True) == {"path": "docs.v2"}


@pytest.mark.parametrize("value, request_, expected", [
    ("Remember the keys.", "Save 'remember the keys' into reminder.txt.", "remember the keys"),
    ("'hello world'", "Write the text 'hello world' to a.txt", "hello world"),
    ('"Hi!"', 'Say \u201cHi!\u201d', "Hi!"),
    ("Hello, world!", "Write 'hello world'", None),  # other words
    ("x", "Don't write 'x' or 'X' now", None),  # quoted two ways: which?
    ("hello world", "Write 'hello world'", None),  # as quoted
    ('"', "Join with ' ' or ','", None),  # only quotes: nothing of a span
    ("screen and 7", 'the 5" screen and 7" tablet', None),  # spaces round a span are no part
])
def test_a_quoted_span_is_copied_as_quoted(value, request_, expected):
    assert as_quoted(ASSIGN, {"a": 1, "to": value}, request_) == {"a": 1, "to": expected or value}
    held = {"a": 1, "op": "ADD"}  # an enum's value is the schema's
    assert as_quoted(ASSIGN, held, "'add'") is held


def test_a_string_that_repeats_the_path_is_the_text_the_request_quotes():
    write = tool(path={"type": "string"}, content={"type": "string"},
                 mode={"type": "string", "enum": ["a.txt", "w"]})
    request = "Write 'call the bank' to todo.md."
    assert as_quoted(write, {"path": "todo.md", "content": "todo.md"}, request) == \
        {"path": "todo.md", "content": "call the bank"}
    for args, said in [
        ({"path": "todo.md", "content": "call the bank"}, request),  # held already
        ({"path": "todo.md", "content": "todo.md"}, "Write 'a' or 'b' to todo.md"),  # which?
        ({"path": "todo.md", "content": "notes"}, request),  # no repeat
        ({"path": "a.txt", "mode": "a.txt"}, "Append 'x' to a.txt"),  # an enum's value
    ]:
        assert as_quoted(write, args, said) == args


def test_a_hostile_request_is_read_in_linear_time():
    start = time.perf_counter()
    for request in ("Paris" + ", A B C" * 50_000 + " x", "Paris, " * 50_000,
                    ("Paris, France" + "x" * 100) * 5_000, ", 1" * 50_000):
        whole_place("Paris", request, [])
        phrases(request)
        garbled("Parris " * 1000, Heard(request))
        number_runs(request)
        place_alone(tool(city={"type": "string"}, in_x={"type": "string"}), "city",
                    request[:20_000], request)
        scaled_numbers(tool(n={"type": "number"}), {"n": 1}, request + " 1" + " " * 50_000)
        signed_numbers(tool(n={"type": "number"}), {"n": 1}, request + " 1 N, 2 W" * 3_000)
        percent_rates(tool(rate={"type": "number"}), {"rate": 1}, request + " 1%" * 5_000)
        named_choices(STATS, {"player": "x"}, request + " high a " * 5_000)
        assigned_values(ASSIGN, {"a": 1}, request + " a = " * 5_000 + "a=" + "1" * 5_000)
        whole_identifiers(ASSIGN, {"a": 1, "to": "a@b.c"}, request + "a@" * 5_000 + "x.y")
        as_quoted(ASSIGN, {"a": 1, "to": "x"}, request + " '" * 20_000 + "x" + "'" * 5_000)
        whole_paths(tool(path={"type": "string"}), {"path": "x.txt"},
                    request + "a/" * 20_000 + " a.b" * 5_000, request)
        written_choices(tool(e={"type": "string", "enum": ["a b"] * 50}), {"e": "x"}, request)
    assert time.perf_counter() - start < 5


@pytest.mark.real_model
def test_the_bundled_model_asked_for_a_qualified_place_gets_it_whole():
    cli = [sys.executable, "-m", "mlx_agent.cli.main", "agent", "--tools",
           str(EXAMPLES / "everyday.json"), "--json-out", "--single",
           "Check the current weather for Riga, Latvia with the get_weather tool."]
    for extra, city in (([], "Riga, Latvia"), (["--no-stated-arguments"], "Riga")):
        r = subprocess.run(cli + extra, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        events = [ev.decode(line) for line in r.stdout.splitlines()]
        calls = [e.arguments for e in events if isinstance(e, ev.ToolCall)]
        assert calls[0]["city"] == city, calls


@pytest.mark.real_model
def test_the_bundled_model_gets_the_place_it_garbled_and_not_the_words_after_it():
    from mlx_agent.models import default_adapter, load
    from mlx_agent.serve import ChatService
    from mlx_agent.serve.service import ChatCall

    route = parse_tools(json.dumps([{
        "name": "report_driving_route",
        "description": "Get the driving route for a start point and end point.",
        "parameters": {"type": "object", "properties": {
            "start_point": {"type": "string", "description": "Start point (a city)"},
            "end_point": {"type": "string", "description": "End point (a city)"},
            "travel_mode": {"type": "string", "enum": ["driving", "walking", "transit"]}},
            "required": ["start_point", "end_point"]}}]), runnable=False)
    request = ("Is it possible to report driving route using the start point being Glasgow, "
               "the travel mode being transit and the end point being Porto?")
    lm = load("smollm2-135m", adapter=default_adapter("smollm2-135m"))
    # the model writes "Glenorr"; of the request's phrases it then picks "Glasgow, the
    # travel", which runs on past the "Glasgow" it finds most likely
    for on, start in ((True, "Glasgow"), (False, "Glenorr")):
        service = ChatService(lm, tools=route, kv_slots=0, stated_arguments=on)
        result = service.chat(service.prepare(ChatCall(
            messages=[{"role": "user", "content": request}])))
        assert [c.arguments["start_point"] for c in result.tool_calls] == [start]


def test_likelihood_is_the_models_own_log_probability(tiny_lm):
    """Summed from one forward pass over the whole text, as a plain engine and a batched
    one (on its model thread) both compute it."""
    import mlx.core as mx

    from mlx_agent.batch_runner import batch_engines
    from mlx_agent.grammar import call_text
    from mlx_agent.probe import _value_grammar, likelihood

    cached = _value_grammar.cache_info().currsize
    fmt = agent_format("json", tiny_lm)
    prompt = fmt.prompt_ids([{"role": "user", "content": "Weather in Riga."}], WEATHER)
    text = call_text("json", WEATHER[0], {"city": "Riga, Latvia"})
    head = prompt + tiny_lm.encode_text(text[:text.index('"Riga')])
    value = tiny_lm.encode_text('"Riga, Latvia"')
    logits = tiny_lm.model(mx.array([head + value]))[0].astype(mx.float32)
    expected = sum((logits[len(head) - 1 + i, t] - mx.logsumexp(logits[len(head) - 1 + i]))
                   .item() for i, t in enumerate(value))
    plain = likelihood(tiny_lm.engine(), tiny_lm, prompt, "json", WEATHER[0], {}, "city",
                       "Riga, Latvia")
    engine = batch_engines(tiny_lm, 2)[0]
    try:
        batched = likelihood(engine, tiny_lm, prompt, "json", WEATHER[0], {}, "city",
                             "Riga, Latvia")
    finally:
        engine.runner.close()
    assert plain == pytest.approx(expected, rel=1e-3) and batched == pytest.approx(plain,
                                                                                 rel=1e-4)


def test_a_hostile_schema_is_read_in_bounded_time(monkeypatch):
    """A client's enum of 100,000 values, a parameter named with no word: the request is
    read against the enum's first MAX_CHOICES values only, and an empty name labels no
    "="."""
    import mlx_agent.copied_values as cv

    many = parse_tools(json.dumps([{"name": "t", "parameters": {"type": "object",
        "properties": {"x": {"type": "string"},
                       "tags": {"type": "array", "items": {"type": "string", "enum": [
                           f"w{j} w{j + 1}" for j in range(100_000)]}},
                       "": {"type": "integer"}}, "required": ["x"]}}]), runnable=False)[0]
    read = []
    monkeypatch.setattr(cv, "_choice_at", lambda request, value: read.append(value))
    assert named_choices(many, {"x": "a"}, "w1 w2 w3") == {"x": "a"}
    assert len(read) == cv.MAX_CHOICES
    assert assigned_values(many, {"x": "a"}, "w1 = 5") == {"x": "a"}
