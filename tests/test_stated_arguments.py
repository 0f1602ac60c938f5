"""Optional arguments a request states: probed once a call is sampled, added where stated.

The bundled model, asked for the weather "in fahrenheit" with a tool whose ``unit`` is
optional, called ``get_weather(city="Oslo")`` and reported Celsius.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from mlx_agent import trajectory as tj
from mlx_agent.agent import Agent, AgentConfig, agent_format
from mlx_agent.agent import events as ev
from mlx_agent.chat import ChatFormat
from mlx_agent.stated_arguments import complete_reply, stated
from mlx_agent.tools import parse_tools

from .test_agent_loop import QWEN_LIKE, Recorder
from .test_loop_guard import Obliging

EXAMPLES = Path(__file__).parents[1] / "examples"
WEATHER = parse_tools(json.dumps([{
    "name": "weather", "description": "Current weather for a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"]},
    "_exec": 'printf "%s %s" "$city" "${unit:-celsius}"'}]))
TOOL = WEATHER[0]
BFCL_LIKE = parse_tools(json.dumps([{
    "name": "calculate_triangle_area", "description": "Calculate the area of a triangle.",
    "parameters": {"type": "object", "properties": {
        "base": {"type": "integer"}, "height": {"type": "integer"},
        "unit": {"type": "string", "description": "The unit of the base and height."},
        "distance": {"type": "integer", "description": "Distance, typically in kilometers."},
        "label": {"type": "string"}, "reason": {"type": "string"},
        "include_human_impact": {"type": "boolean"}, "tags": {"type": "array"},
        "avoid_tolls": {"type": "boolean"}},
        "required": ["base"]}}]), runnable=False)[0]


@pytest.mark.parametrize("name, value, request_, arguments, expected", [
    ("unit", "fahrenheit", "Weather in Oslo in Fahrenheit", {"city": "Oslo"}, True),
    ("unit", "inch", "a radius of 4 inches", {"radius": 4}, True),  # its plural
    ("unit", "fahren", "Weather in Oslo in Fahrenheit", {"city": "Oslo"}, False),  # part word
    ("unit", "kelvin", "Weather in Oslo in Fahrenheit", {"city": "Oslo"}, False),
    ("city", "Oslo", "Weather in Oslo", {"place": "Oslo"}, False),  # another argument's
    ("city", "Oslo", "Weather in Oslo, Norway", {"place": "Oslo, Norway"}, False),
    ("reason", "38951", "odometer 38951, booking SER-5510", {"odometer": 38951}, False),
    ("days", 3, "the next 3 days", {"city": "Oslo"}, True),
    ("days", 3, "the next 3 days", {"hours": 3}, False),
    ("days", 4, "the next 3 days", {}, False),
    ("days", 1500, "driving 1,500 miles", {}, True),
    ("include_human_impact", True, "for 5 years including human impact", {}, True),
    ("include_human_impact", True, "for 5 years", {}, False),
    ("include_human_impact", False, "including human impact", {}, False),
    ("tags", ["red", "blue"], "tag it red and blue", {}, True),
    ("tags", ["red", "green"], "tag it red and blue", {}, False),
    ("tags", [], "tag it red and blue", {}, False),
    ("unit", "IT", "Is it going to rain?", {}, False),  # two letters: only as written
    ("unit", "US", "Rain in the US?", {}, True),
    ("days", 3, "from March 3 on", {"start": "March 3"}, False),  # a string's number
    ("days", 0.05, "a 5% discount", {}, True), ("days", 1e-9, "a charge of 1e-9", {}, True),
    ("days", 10**400, "1" * 401, {}, False),  # no float holds it: not an OverflowError
    ("include_human_impact", True, "excluding human impact", {}, False),
    ("include_human_impact", True, "do not include the human impact", {}, False),
    ("include_human_impact", True, "I'm not too concerned about the human impact", {}, False),
    ("include_human_impact", True, "Not concerned about cost, but include human impact", {},
     True),  # indifference holds for its own clause
])
def test_what_a_request_states(name, value, request_, arguments, expected):
    assert stated(TOOL, name, value, request_, arguments) is expected


def test_a_parameters_name_is_not_a_value_stated():
    tool = parse_tools(json.dumps([{"name": "game_rewards", "parameters": {
        "type": "object", "properties": {
            "game": {"type": "string"}, "mission": {"type": "string"},
            "trophy": {"type": "string"}, "price": {"type": "number"},
            "sort_by": {"type": "string", "enum": ["price", "date"]}},
        "required": ["game"]}}]), runnable=False)[0]
    request = "Rewards for Fortnite with different missions and trophies, sorted by price."
    assert not stated(tool, "mission", "trophies", request, {"game": "Fortnite"})
    assert not stated(tool, "trophy", "missions", request, {"game": "Fortnite"})
    assert not stated(tool, "trophy", "trophies", request, {"game": "Fortnite"})  # its own
    assert stated(tool, "mission", "different missions", request, {"game": "Fortnite"})
    assert stated(tool, "sort_by", "price", request, {"game": "Fortnite"})  # an enum's value


def test_what_the_tool_is_about_or_another_arguments_unit_is_not_stated():
    tool = BFCL_LIKE
    request = "Find the area of a triangle with a base of 10 units, 50 kilometers away."
    assert not stated(tool, "label", "triangle", request, {"base": 10})  # the tool's subject
    assert not stated(tool, "label", "kilometers", request, {"base": 10})  # distance's word
    assert not stated(tool, "reason", "units", request, {"base": 10})  # the base's unit
    assert stated(tool, "unit", "units", request, {"base": 10})  # unit "of the base"


def ask(lm, protocol, replies, request, **config):
    rec = Recorder()
    recorder = config.pop("recorder", None)
    script = Obliging(lm, *replies)  # the replies, and the values the probes write
    agent = Agent(lm, lm.engine(), WEATHER, agent_format(protocol, lm),
                  AgentConfig(grammar=True, max_steps=3, **config), emit=rec,
                  sampler=script, recorder=recorder, probe_sampler=script)
    return agent, agent.ask(request), rec


def weather_replies(protocol, city="Oslo"):
    """``weather(city=...)`` as ``protocol``'s grammar writes it, and an answer."""
    arguments = json.dumps({"city": city}, separators=(",", ":"))
    call = f'{{"tool":"weather","arguments":{arguments}}}' if protocol == "json" else \
        f'<tool_call>\n{{"name":"weather","arguments":{arguments}}}\n</tool_call>'
    answer = '{"answer":"done"}' if protocol == "json" else "done"
    return call, answer


@pytest.mark.parametrize("protocol", ["json", "hermes"])
def test_a_stated_optional_argument_is_added_and_the_cache_is_reused_whole(tiny_lm, protocol,
                                                                           tmp_path):
    lm = tiny_lm if protocol == "json" else replace(tiny_lm, chat=ChatFormat(QWEN_LIKE))
    call, answer = weather_replies(protocol)
    rec = tj.Recorder(tmp_path, task="t", model_fingerprint="fp", sampling={})
    # the probes: days (3, which the request does not say), then unit
    agent, out, events = ask(lm, protocol, [call, "3,", '"fahrenheit"}', answer],
                             "Weather in Oslo in Fahrenheit, over 2 days.", recorder=rec)
    calls = events.of(ev.ToolCall)
    assert [(c.arguments, c.stdout) for c in calls] == \
        [({"city": "Oslo", "unit": "fahrenheit"}, "Oslo fahrenheit")]
    assert out.answer == "done" and out.stats.stated_calls == 1
    t = tj.read(rec.path)
    arguments = '{"city":"Oslo","unit":"fahrenheit"}'
    written = f'{{"tool":"weather","arguments":{arguments}}}' if protocol == "json" else \
        f'<tool_call>\n{{"name":"weather","arguments":{arguments}}}\n</tool_call>'
    reply = next(s for s in t.steps if s.role == "assistant")
    assert reply.content == written and lm.decode(reply.output_ids).startswith(written)
    assert_reused_whole(t, agent)  # the completed call is what the model read next


def assert_reused_whole(t: tj.Trajectory, agent: Agent) -> None:
    """The trajectory replays to the cache, and each step after the first reused all that
    came before it: the probes left the engine holding the reply as kept."""
    assert t.token_sequence() == agent.engine.tokens
    fed = [s for s in t.steps if s.input_ids is not None]
    assert all(s.prefix_len == len(tj.Trajectory(id="x", steps=t.steps[:t.steps.index(s)])
                                    .token_sequence()) for s in fed[1:])


@pytest.mark.parametrize("protocol", ["json", "hermes"])
def test_an_unstated_value_or_the_switch_leaves_the_call_as_sampled(tiny_lm, protocol,
                                                                   tmp_path):
    lm = tiny_lm if protocol == "json" else replace(tiny_lm, chat=ChatFormat(QWEN_LIKE))
    call, answer = weather_replies(protocol)
    rec = tj.Recorder(tmp_path, task="t", model_fingerprint="fp", sampling={})
    # days probed (the request has a number), unit not (it names no unit): nothing stated
    agent, out, events = ask(lm, protocol, [call, "3,", answer], "Weather in Oslo for 5 days.",
                             recorder=rec)
    assert [c.arguments for c in events.of(ev.ToolCall)] == [{"city": "Oslo"}]
    assert out.answer == "done\n\nweather returned Oslo celsius."
    assert out.stats.stated_calls == 0
    assert_reused_whole(tj.read(rec.path), agent)
    # turned off, or an exact call the step was given (a guided rollout's)
    for config in ({"stated_arguments": False},
                   {"tool_choice": [{"name": "weather", "arguments": {"city": "Oslo"}}, "auto"]}):
        _, out, events = ask(lm, protocol, [call, answer], "Weather in Oslo in Fahrenheit.",
                             **config)
        assert [c.arguments for c in events.of(ev.ToolCall)] == [{"city": "Oslo"}]
        assert out.stats.stated_calls == 0
        assert out.answer == ("done" if "stated_arguments" in config  # the answer as sampled
                              else "done\n\nweather returned Oslo celsius.")


@pytest.mark.real_model
def test_the_bundled_model_asked_in_fahrenheit_gets_fahrenheit():
    cli = [sys.executable, "-m", "mlx_agent.cli.main", "agent", "--tools",
           str(EXAMPLES / "everyday.json"), "--json-out", "--single",
           "Check the current weather for Oslo with the get_weather tool, in fahrenheit."]
    for extra, arguments in (([], {"city": "Oslo", "unit": "fahrenheit"}),
                             (["--no-stated-arguments"], {"city": "Oslo"})):
        r = subprocess.run(cli + extra, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        events = [ev.decode(line) for line in r.stdout.splitlines()]
        assert [e.arguments for e in events if isinstance(e, ev.ToolCall)] == [arguments]


@pytest.mark.real_model
def test_the_server_returns_the_call_with_its_stated_argument():
    from mlx_agent.models import default_adapter, load
    from mlx_agent.serve import ChatService
    from mlx_agent.serve.service import ChatCall
    from mlx_agent.tools import load_tools

    lm = load("smollm2-135m", adapter=default_adapter("smollm2-135m"))  # as `serve` loads it
    tools = load_tools(str(EXAMPLES / "everyday.json"))
    request = "What is the weather in Oslo in fahrenheit?"
    for on, arguments in ((True, {"city": "Oslo", "unit": "fahrenheit"}),
                          (False, {"city": "Oslo"})):
        service = ChatService(lm, tools=tools, kv_slots=0, stated_arguments=on)
        result = service.chat(service.prepare(ChatCall(
            messages=[{"role": "user", "content": request}], tool_choice="get_weather")))
        assert [(c.name, c.arguments) for c in result.tool_calls] == \
            [("get_weather", arguments)]


@pytest.mark.real_model
def test_the_bundled_model_probed_for_a_string_writes_one():
    # tests/data/vehicles.json: a catalogue scripts/general_adapter.py generated
    cli = [sys.executable, "-m", "mlx_agent.cli.main", "agent", "--tools",
           str(Path(__file__).parent / "data" / "vehicles.json"), "--json-out", "--single",
           "Create car rental right away \u2014 pickup city (a city) equal to Tunis, service "
           "date equal to 2025-10-09 and fuel equal to hybrid."]
    r = subprocess.run(cli, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    events = [ev.decode(line) for line in r.stdout.splitlines()]
    # the call leaves the city out; probed for it, the model wrote "" (which no request
    # states) until a probe's string had to hold a character
    assert [e.arguments for e in events if isinstance(e, ev.ToolCall)][:1] == \
        [{"service_date": "2025-10-09", "fuel": "hybrid", "pickup_city": "Tunis"}]


@pytest.mark.parametrize("arguments, request_, expected", [
    ({"base": 1, "include_human_impact": False}, "Including the human impact, please.",
     {"base": 1, "include_human_impact": True}),
    ({"base": 1, "include_human_impact": False}, "Humanitarian impacts too.",
     {"base": 1, "include_human_impact": True}),  # the words' beginnings, in one clause
    ({"base": 1, "include_human_impact": True}, "Don't include the human impact.",
     {"base": 1, "include_human_impact": False}),
    ({"base": 1, "include_human_impact": False}, "Skip the human impact.", None),  # as said
    ({"base": 1, "include_human_impact": False}, "dont include human impact", None),
    ({"base": 1, "include_human_impact": True}, "Don't forget the human impact", None),
    ({"base": 1, "include_human_impact": False}, "Human? Impact.", None),  # two clauses
    ({"base": 1, "include_human_impact": False}, "The human impact is optional.", None),
    ({"base": 1, "include_human_impact": False}, "Is the human impact included?", None),
    ({"base": 1, "include_human_impact": True}, "Weather in Oslo.", None),  # not spoken of
    ({"base": 1, "avoid_tolls": False}, "The fastest route with toll roads avoided.",
     {"base": 1, "avoid_tolls": True}),
    ({"base": 1, "avoid_tolls": True}, "The fastest route, and don't avoid tolls.",
     {"base": 1, "avoid_tolls": False}),
    ({"base": 1, "avoid_tolls": False}, "The fastest route, no tolls.", None),
])
def test_a_flag_the_model_wrote_is_turned_only_where_the_request_says_otherwise(
        arguments, request_, expected):
    from mlx_agent.flags import flags_as_asked

    assert flags_as_asked(BFCL_LIKE, arguments, request_) == (expected or arguments)


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
    from mlx_agent.flags import stated_default

    assert stated_default(schema) == expected


def test_a_flag_nobody_speaks_of_takes_its_stated_default():
    """The default adapter wrote ``formatted: false`` where the tool says "Default is true"
    and the request says nothing of it."""
    from mlx_agent.flags import flags_by_default

    t = parse_tools(json.dumps([{"name": "t", "description": "A tool.", "parameters": {
        "type": "object", "required": ["number", "formatted"], "properties": {
            "number": {"type": "integer"},
            "formatted": {"type": "boolean", "description": "Return formatted string if "
                          "true, array if false. Default is true."}}}}]), runnable=False)[0]
    heard = "Find the prime factors of 450"
    assert flags_by_default(t, {"number": 450, "formatted": False}, heard) == \
        {"number": 450, "formatted": True}
    for said in ("Find the prime factors of 450, not formatted",
                 "Give me the prime factors of 450 as an array"):  # spoken of, by its name
        # or its description's words: the model's reading stands
        arguments = {"number": 450, "formatted": False}
        assert flags_by_default(t, arguments, said) is arguments
    arguments = {"number": 450, "formatted": True}  # the default already
    assert flags_by_default(t, arguments, heard) is arguments
    # an optional flag is left to the tool's own default (without_made_up drops it)
    optional = parse_tools(json.dumps([{"name": "ls", "description": "List a folder.",
                                         "parameters": {"type": "object", "properties": {
        "path": {"type": "string"}, "recursive": {
            "type": "boolean", "description": "List subfolders too. Defaults to false."}},
        "required": ["path"]}}]), runnable=False)[0]
    arguments = {"path": "src", "recursive": True}
    assert flags_by_default(optional, arguments, "List everything in src") is arguments


def test_a_probe_of_a_nullable_string_or_list_writes_one_that_is_not_empty(tiny_lm):
    from mlx_agent.probe import _probe_schema, probe

    tool = parse_tools(json.dumps([{"name": "t", "parameters": {"type": "object", "properties": {
        "s": {"type": ["string", "null"]},
        "l": {"type": ["array", "null"], "items": {"type": "string"}}}}}]), runnable=False)[0]
    assert _probe_schema(tool, "s")["minLength"] == 1
    assert _probe_schema(tool, "l")["minItems"] == 1
    prompt = agent_format("json", tiny_lm).prompt_ids(FAHRENHEIT, [tool])
    engine = tiny_lm.engine()
    # the model would write "" or []: it may not, and writes its next choice
    value = probe(engine, tiny_lm, Obliging(tiny_lm, '"",', '"x",'), prompt, "json", tool,
                  {}, "s")
    assert value == "x"
    # (a list's next choice cannot share the script's first token: whatever the random
    # model then writes, it is not the empty list the schema would have taken)
    value = probe(engine, tiny_lm, Obliging(tiny_lm, "[],"), prompt, "json", tool, {}, "l")
    assert value != []


CHAIN = parse_tools(json.dumps([
    {"name": "find_booking", "description": "Find a booking.",
     "parameters": {"type": "object", "required": ["booking_id"],
                    "properties": {"booking_id": {"type": "string"}}},
     "_exec": "echo REF-42"},
    {"name": "cancel_booking", "description": "Cancel a booking.",
     "parameters": {"type": "object", "required": ["booking_id"], "properties": {
         "booking_id": {"type": "string"}, "reason": {"type": "string"},
         "nights": {"type": "integer"}}},
     "_exec": 'printf "%s %s" "$booking_id" "$reason"'}]))


@pytest.mark.parametrize("request_, added", [
    ("Find booking BK-1, then cancel booking BK-1, passing its output as the reason.",
     {"reason": "REF-42"}),
    ("Find booking BK-1, then cancel booking BK-1.", {}),  # the request passes nothing on
])
def test_a_result_the_request_passes_on_is_added(tiny_lm, request_, added):
    calls = ['{"tool":"find_booking","arguments":{"booking_id":"BK-1"}}',
             '{"tool":"cancel_booking","arguments":{"booking_id":"BK-1"}}']
    rec = Recorder()
    # the probe for reason writes the first result (the bundled model did so, asked)
    agent = Agent(tiny_lm, tiny_lm.engine(), CHAIN, agent_format("json", tiny_lm),
                  AgentConfig(grammar=True, max_steps=4), emit=rec,
                  sampler=Obliging(tiny_lm, *calls, '{"answer":"done"}'),
                  probe_sampler=Obliging(tiny_lm, '"REF-42"}'))
    out = agent.ask(request_)
    assert [c.arguments for c in rec.of(ev.ToolCall)] == \
        [{"booking_id": "BK-1"}, {"booking_id": "BK-1", **added}]
    assert out.stats.stated_calls == len(added)


def test_what_a_turns_results_hold_whole():
    from mlx_agent.stated_arguments import _piped, turn_results

    messages = [{"role": "user", "content": "old"}, {"role": "tool", "content": "OLD-1"},
                {"role": "user", "content": "new"},
                {"role": "tool", "content": json.dumps({"tool": "t", "stdout": " 63\n",
                                                        "stderr": "", "exit_code": 0})},
                {"role": "tool", "content": "plain text "},
                {"role": "tool", "name": "get_tool_info", "content": "SCHEMA-9"}]
    assert sorted(turn_results(messages)) == \
        sorted([messages[3]["content"], "t", "63", "plain text"])
    results = turn_results(messages)
    request = "Then log it, with its output as the odometer km and the note."
    assert _piped("odometer_km", 63, request, results, {})
    assert _piped("note", "plain text", request, results, {})
    assert not _piped("odometer_km", 0, request, results, {})  # an exit code
    assert not _piped("odometer_km", 63, request, results, {"km": 63})  # another holds it
    assert not _piped("mileage", 63, request, results, {})  # the request names another
    assert not _piped("note", "OLD-1", request, results, {})  # an earlier turn's
    assert not _piped("note", "SCHEMA-9", request, results, {})  # a schema, not a result
    assert not _piped("note", "plain", request, results, {})  # not whole


def test_a_hostile_request_is_read_in_linear_time():
    import time

    start = time.perf_counter()
    for request in ("1" * 100_000 + " lb kg", "1," * 100_000 + "0 lb x", "a " * 100_000):
        for name, value in (("label", "kg"), ("label", "x"), ("include_human_impact", True)):
            stated(BFCL_LIKE, name, value, request, {"base": 1})  # a number's every start
            # once took time quadratic in a run of digits
    nested: dict = {"base": 1}
    for _ in range(5000):  # deeper than Python's recursion limit
        nested = {"x": [nested]}
    assert not stated(BFCL_LIKE, "distance", 1, "1", nested)
    assert time.perf_counter() - start < 5


@pytest.mark.parametrize("protocol", ["json", "hermes"])
def test_completing_never_makes_a_repeat(tiny_lm, protocol):
    lm = tiny_lm if protocol == "json" else replace(tiny_lm, chat=ChatFormat(QWEN_LIKE))
    call, answer = weather_replies(protocol)
    # the model writes the call as it first sampled it again: the guard refuses it (it
    # would complete into the call that ran), so the model makes another (this random
    # model: unit celsius) or answers
    agent, out, events = ask(lm, protocol, [call, '"fahrenheit"}', call, answer],
                             "Weather in Oslo in Fahrenheit.")
    calls = [json.dumps(c.arguments) for c in events.of(ev.ToolCall)]
    # the second call's celsius is not made the fahrenheit the request writes: that ran
    # (and this random model's third call, in json, is made fahrenheit: a second change)
    assert calls[:2] == ['{"city": "Oslo", "unit": "fahrenheit"}',
                         '{"city": "Oslo", "unit": "celsius"}']
    assert out.stats.stated_calls == {"json": 2, "hermes": 1}[protocol]
    assert '{"city": "Oslo"}' not in calls and len(set(calls)) == len(calls), calls
    # and a call is not completed into one that ran this turn (the server's case: it sees
    # only the completed call in the request's messages)
    from mlx_agent.grammar import call_text

    done = call_text(protocol, TOOL, {"city": "Oslo", "unit": "fahrenheit"})
    for made, expected in (([], {"city": "Oslo", "unit": "fahrenheit"}),
                           ([done], {"city": "Oslo"})):
        engine, prompt, reply, call, ids = sampled(lm, protocol)
        out_reply, text, out_ids = complete_reply(engine, lm, protocol, prompt, reply, call,
                                                  ids, [], WEATHER, FAHRENHEIT,
                                                  Obliging(lm, '"fahrenheit"}'), made)
        assert out_reply.calls[0].arguments == expected
        assert engine.tokens == prompt + out_ids


FAHRENHEIT = [{"role": "user", "content": "Weather in Oslo in Fahrenheit."}]


def sampled(lm, protocol: str = "json", room: int | None = None):
    """An engine holding the prompt for :data:`FAHRENHEIT` and ``weather(city="Oslo")``
    as if the model had sampled it (its context ``room`` tokens past them, if given), the
    prompt, the parsed reply, its text and ids: what :func:`complete_reply` takes."""
    fmt = agent_format(protocol, lm)
    prompt = fmt.prompt_ids(FAHRENHEIT, WEATHER)
    call = weather_replies(protocol)[0]
    ids = lm.encode_text(call)
    engine = lm.engine() if room is None else \
        lm.engine(context_length=len(prompt) + len(ids) + room)
    engine.sync(prompt + ids)
    return engine, prompt, fmt.parse(call), call, ids


def test_an_optional_argument_no_one_wrote_is_dropped():
    from mlx_agent.stated_arguments import without_made_up

    heard = "List all PostgreSQL servers in New York from 2024.\nfound 3 servers, ref 42"
    cases = [
        ({"city": "Oslo", "days": 9}, {"city": "Oslo"}),  # 9: made up
        ({"city": "Paris"}, {"city": "Paris"}),  # required: the model's, whatever it is
        ({"city": "x", "unit": "parrot"}, {"city": "x"}),
        ({"city": "x", "unit": "postgres"}, None),  # begins "PostgreSQL"
        ({"city": "x", "unit": "New York City"}, None),
        ({"city": "x", "days": 2024}, None), ({"city": "x", "days": 42}, None),  # a result's
        ({"city": "x", "days": [3, 1]}, None), ({"city": "x", "days": [7, 8]}, {"city": "x"}),
        ({"city": "x", "unit": ""}, None),
        # a required argument's string repeated: the optional copy is made up
        ({"city": "New York", "unit": "new york "}, {"city": "New York"}),
        ({"city": "New York", "unit": "New York City"}, None),  # another value
    ]
    for arguments, expected in cases:
        assert without_made_up(TOOL, arguments, heard) == (expected or arguments), arguments
    flags = BFCL_LIKE
    # a flag whose name the request never speaks of is made up, either way; one it does is
    # the model's (its words begin the request's, up to their fifth letter)
    for flag in (False, True):
        assert without_made_up(flags, {"base": 3, "include_human_impact": flag}, "x") == \
            {"base": 3}
        for heard in ("the human cost", "without impacts", "humanitarian"):
            assert without_made_up(flags, {"base": 3, "include_human_impact": flag},
                                   heard) == {"base": 3, "include_human_impact": flag}
    assert without_made_up(TOOL, {"city": "x", "days": 10**400}, "x") == {"city": "x"}
    free = parse_tools(json.dumps([{"name": "f", "parameters": {"type": "object", "properties": {
        "a": {"type": "string"}}}}]), runnable=False)[0]  # requires nothing: says nothing
    assert without_made_up(free, {"a": "made up"}, "hello") == {"a": "made up"}
    from mlx_agent.tools.builtin import builtin_tools

    grep, listing = [t for t in builtin_tools(".") if t.name in ("grep", "list_files")]
    for value, heard, kept in [
        ("budget.json", "Which file mentions the budget?", False),  # a name made up
        ("notes", "Search notes.txt", False),  # a part of a path is not the path
        ("notes", "Search the notes folder", True), (".", "Search here", True),
        ("docs/a.md", "Look for x\n{\"stdout\": \"docs/a.md\", \"exit_code\": 0}", True),
    ]:
        assert without_made_up(grep, {"pattern": "x", "path": value}, heard) == \
            ({"pattern": "x", "path": value} if kept else {"pattern": "x"}), value
    # another tool's path is read as any string: its default may be wider than meant
    clean = parse_tools(json.dumps([{"name": "clean", "parameters": {"type": "object",
        "properties": {"mode": {"type": "string"}, "path": {"type": "string"}},
        "required": ["mode"]}}]), runnable=False)[0]
    assert without_made_up(clean, {"mode": "x", "path": "old_logs"}, "Clean the old logs") \
        == {"mode": "x", "path": "old_logs"}
    # a built-in tool that requires nothing still has its paths read
    assert without_made_up(listing, {"path": "this_folder"}, "What files are in this "
                           "folder?") == {}
    assert without_made_up(listing, {"path": "docs"}, "List docs.") == {"path": "docs"}
    long = "7" * 100_000 + " 1 " + "word " * 100_000  # a tool's long output: one sort
    assert without_made_up(TOOL, {"city": "x", "days": 1, "unit": "wor"}, long) == \
        {"city": "x", "days": 1, "unit": "wor"}


def test_a_failed_results_error_is_not_heard():
    """Nor are the paths it suggests, but apart, and from a built-in tool."""
    from mlx_agent.stated_arguments import heard_text

    messages = [{"role": "user", "content": "What files are here?"},
                {"role": "assistant", "content": "{}"},
                {"role": "tool", "name": "read_file", "content": json.dumps(
                    {"tool": "read_file", "stdout": "partial", "exit_code": 1,
                     "stderr": "FileNotFoundError: no file 'this_folder'"})},
                {"role": "tool", "name": "grep", "content": json.dumps(
                    {"tool": "grep", "stdout": "", "exit_code": 1, "stderr": "FileNotFoundError: "
                     "no file 'utils.py'; did you mean 'src/utils.py' or 'lib/utils.py'?"})},
                {"role": "tool", "name": "x", "content": json.dumps(
                    {"tool": "x", "stdout": "ok", "stderr": "warned 'y'", "exit_code": 0})},
                {"role": "tool", "name": "z", "content": "{not json 'w'"}]
    heard = heard_text(messages)
    assert "this_folder" not in heard and "partial" in heard  # its output stays
    assert "utils.py" not in heard  # an error, suggestions and all
    # the paths a built-in tool's error suggests are read apart, from built-in tools alone
    from mlx_agent.stated_arguments import suggested_paths
    from mlx_agent.tools.builtin import builtin_tools

    assert suggested_paths(messages, builtin_tools(".")) == ["src/utils.py", "lib/utils.py"]
    mimic = parse_tools(json.dumps([{"name": "grep", "parameters": {"type": "object"},
                                     "_exec": "true"}]))
    assert suggested_paths(messages, mimic) == []
    assert "warned 'y'" in heard and "'w'" in heard  # a result that ran, any other text


@pytest.mark.parametrize("protocol", ["json", "hermes"])
def test_a_made_up_value_is_dropped_and_a_results_value_kept(tiny_lm, protocol, tmp_path):
    lm = tiny_lm if protocol == "json" else replace(tiny_lm, chat=ChatFormat(QWEN_LIKE))

    def call(arguments):
        arguments = json.dumps(arguments, separators=(",", ":"))
        return f'{{"tool":"weather","arguments":{arguments}}}' if protocol == "json" else \
            f'<tool_call>\n{{"name":"weather","arguments":{arguments}}}\n</tool_call>'

    _, answer = weather_replies(protocol)
    rec = tj.Recorder(tmp_path, task="t", model_fingerprint="fp", sampling={})
    agent, out, events = ask(lm, protocol, [
        call({"city": "Oslo", "days": 9}),  # nobody said 9: the tool's default stands
        call({"city": "Bergen", "unit": "celsius"}),  # the first result said celsius
        answer], "Weather in Oslo, then in Bergen in the same unit.", recorder=rec)
    assert [c.arguments for c in events.of(ev.ToolCall)] == \
        [{"city": "Oslo"}, {"city": "Bergen", "unit": "celsius"}]
    assert out.stats.stated_calls == 1
    assert_reused_whole(tj.read(rec.path), agent)


def test_a_probe_past_the_context_leaves_the_call_as_sampled(tiny_lm):
    engine, prompt, reply, call, ids = sampled(tiny_lm, room=1)  # no room for more
    out = complete_reply(engine, tiny_lm, "json", prompt, reply, call, ids, [], WEATHER,
                         FAHRENHEIT, Obliging(tiny_lm, '"fahrenheit"}'))
    assert out == (reply, call, ids) and engine.tokens == prompt + ids  # was: ContextFull


def test_ctrl_c_during_a_probe_cuts_the_turn_not_the_session(tiny_lm):
    call, answer = weather_replies("json")

    def interrupted(logprobs):
        raise KeyboardInterrupt

    rec = Recorder()
    agent = Agent(tiny_lm, tiny_lm.engine(), WEATHER, agent_format("json", tiny_lm),
                  AgentConfig(grammar=True, max_steps=3), emit=rec,
                  sampler=Obliging(tiny_lm, call, answer), probe_sampler=interrupted)
    out = agent.ask("Weather in Oslo in Fahrenheit.")
    assert out.interrupt is not None and rec.of(ev.ToolCall) == []  # the call did not run
    assert tiny_lm.decode(agent.engine.tokens).endswith(call)  # not the probe's prefix
    assert agent.ask("Thanks.").answer == "done"  # the session goes on


@pytest.mark.parametrize("protocol", ["json", "hermes"])
def test_a_stated_number_is_added(tiny_lm, protocol):
    lm = tiny_lm if protocol == "json" else replace(tiny_lm, chat=ChatFormat(QWEN_LIKE))
    call, answer = weather_replies(protocol)
    # a bare number's grammar is never done: the probe ends at the "," or "}" after it
    _, out, events = ask(lm, protocol, [call, "4}", answer], "Weather in Oslo for 4 days.")
    assert [c.arguments for c in events.of(ev.ToolCall)] == [{"city": "Oslo", "days": 4}]


def test_a_rotating_cache_is_left_alone(tiny_lm):
    fmt = agent_format("json", tiny_lm)
    call = '{"tool":"weather","arguments":{"city":"Oslo","days":9}}'
    engine = tiny_lm.engine(cache_mode="rotating", kv_window=64)
    reply = fmt.parse(call)
    out = complete_reply(engine, tiny_lm, "json", [1, 2], reply, call, [3], [], WEATHER,
                         [{"role": "user", "content": "Weather in Oslo."}])
    # 9 is made up, but a rotated cache cannot be cut back to the reply
    assert out == (reply, call, [3])


def test_no_probe_once_the_client_has_left(tiny_lm):
    engine, prompt, reply, call, ids = sampled(tiny_lm)

    def never(logprobs):
        raise AssertionError("a probe ran for a client that left")

    out = complete_reply(engine, tiny_lm, "json", prompt, reply, call, ids, [], WEATHER,
                         FAHRENHEIT, never, stop=lambda: True)
    assert out == (reply, call, ids) and engine.tokens == prompt + ids


@pytest.mark.parametrize("request_, expected", [
    ("Weather in Oslo, with the detailed forecast.", {"city": "Oslo", "detailed": True}),
    ("Weather in Oslo, no detailed forecast.", {"city": "Oslo", "detailed": False}),
    ("Weather in Oslo.", {"city": "Oslo"}),
])
def test_a_flag_the_request_names_is_set_without_a_probe(tiny_lm, request_, expected):
    tool = parse_tools(json.dumps([{
        "name": "weather", "description": "Current weather for a city.",
        "parameters": {"type": "object", "required": ["city"], "properties": {
            "city": {"type": "string"}, "detailed": {"type": "boolean"}}},
        "_exec": 'printf "%s %s" "$city" "${detailed:-false}"'}]))

    def never(logprobs):
        raise AssertionError("a flag was probed")

    call, answer = weather_replies("json")
    rec = Recorder()
    agent = Agent(tiny_lm, tiny_lm.engine(), tool, agent_format("json", tiny_lm),
                  AgentConfig(grammar=True, max_steps=3), emit=rec,
                  sampler=Obliging(tiny_lm, call, answer), probe_sampler=never)
    out = agent.ask(request_)
    assert [c.arguments for c in rec.of(ev.ToolCall)] == [expected]
    assert out.stats.stated_calls == (len(expected) > 1)


@pytest.mark.parametrize("name, request_, plain", [
    ("detailed", "Find me detailed information about the human cell", True),
    ("allow_transfer", "Go by train, and you can transfer.", True),
    ("include_comments", "ratings and comments for the interview?", True),  # asked for
    ("include_images", "Don\u2019t include images", False),  # a curly apostrophe
    ("include_images", "The report doesn't need images", False),
    ("include_images", "Images are not required", False),
    ("include_images", "Images are optional", False), ("include_images", "Leave out images", False),
    ("include_images", "Skip the images", False), ("include_images", "Ignore images", False),
    ("smoking", "I need a non-smoking room", False),
    ("smoking_allowed", "Is smoking allowed at the Hilton?", False),  # a yes-no question
    ("has_pool", "a pool or not, either is fine", False),
    ("smoking_allowed", "I'm not too concerned about the rating or whether smoking is allowed",
     False),
    ("in_stock", "a bike shop in Stockholm", False), ("sort_desc", "Describe the orders", False),
    ("is_new", "a used car in New York", False), ("include_all", "Show all flights", False),
    ("use_24h", "Book 24 rooms", False), ("no_cache", "Cache the page", False),
    # a flag named for its negative: the request writes that word too, and so asks for it
    ("avoid_tolls", "Find the fastest route from SF to LA with toll roads avoided.", True),
    ("avoid_tolls", "Route to LA avoiding tolls", True),
    ("avoid_tolls", "Route to LA, and don't avoid tolls.", False),
    ("avoid_tolls", "Route to LA, no tolls please", False),  # "avoid" unsaid: the model's
    ("avoid_tolls", "Avoid tolls if you can, or not", False),
    ("skip_validation", "Import it and skip validation", True),
    ("without_sugar", "A latte without sugar", True),
    ("no_cache", "no cache", False),  # a word of two letters
])
def test_which_flags_are_set_without_asking_the_model(name, request_, plain):
    from mlx_agent.flags import flag_plain

    assert flag_plain(name, request_) is plain


@pytest.mark.parametrize("name, request_, refused", [
    ("include_hourly", "Check pollen near Auckland and don't include hourly.", True),
    ("include_hourly", "dont include hourly", True),
    ("include_hourly", "Don't forget the hourly forecast", False),  # asks for it
    ("include_images", "Don\u2019t include images", True),  # a curly apostrophe
    ("has_pool", "A room without a pool.", True),
    ("has_garage", "Two bedrooms. No need for a garage, but a yard.", True),
    ("detailed", "The weather, no detailed forecast.", True),
    ("include_images", "Include images.", False), ("include_images", "Images, please", False),
    ("include_images", "Show images, not videos", False),  # the negation is another's
    ("include_images", "Images are not required", False),  # not refused: the model decides
    ("has_pool", "With or without a pool.", False), ("has_pool", "Pool or not.", False),
    ("has_pool", "I don't mind whether it has no pool", False),
    ("has_pool", "Is there no pool?", False),  # a yes-no question
    ("no_cache", "Don't cache the page", False),  # true where refused: the model decides
    ("is_new", "Not a new car", False),  # a word of three letters
    ("avoid_tolls", "Route to LA, and don't avoid tolls.", True),
    ("avoid_tolls", "Route to LA without avoiding tolls", True),
    ("avoid_tolls", "Route to LA avoiding tolls", False),
    ("skip_intro", "Play the video and skip the intro", False),  # the name's own word
    ("skip_intro", "Play the video, and don't skip the intro", True),
])
def test_which_flags_are_set_false_without_asking_the_model(name, request_, refused):
    from mlx_agent.flags import flag_refused

    assert flag_refused(name, request_) is refused


def test_a_tool_result_is_read_as_json_past_any_space_round_it():
    from mlx_agent.stated_arguments import turn_results

    messages = [{"role": "user", "content": "x"},
                {"role": "tool", "name": "t", "content": '\x0c{"a": "x1"}\xa0'}]
    assert turn_results(messages) == ['{"a": "x1"}', "x1"]
