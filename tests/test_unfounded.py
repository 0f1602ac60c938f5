"""A call on a number no one gave: the user is asked for it, where the reply may answer.

The bundled model, asked for a final price after a discount and tax with no price given,
called ``calculate_final_price`` with a price of its own (BFCL's irrelevance questions are
mostly such calls).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pytest

from mlx_agent import trajectory as tj
from mlx_agent.agent import Agent, AgentConfig, agent_format
from mlx_agent.agent import events as ev
from mlx_agent.chat import ChatFormat
from mlx_agent.heard import numbers
from mlx_agent.tools import parse_tools
from mlx_agent.unfounded import question, unfounded

from .test_agent_loop import QWEN_LIKE, Recorder
from .test_loop_guard import Obliging
from .test_serve import Scripted, serve, user  # noqa: F401  (the serve fixture)
from .test_stated_arguments import assert_reused_whole

PRICE_TOOL = {
    "name": "final_price", "description": "Price after a discount and tax (tax default 8).",
    "parameters": {"type": "object", "properties": {
        "price": {"type": "number"}, "discount": {"type": "number"},
        "tax": {"type": "number"}, "lines": {"type": "array", "items": {"type": "object"}}},
        "required": ["price", "discount", "lines"]},
    "_exec": 'echo "$price"'}
PRICE = parse_tools(json.dumps([PRICE_TOOL]))
TOOL = PRICE[0]


@pytest.mark.parametrize("arguments, said, expected", [
    ({"price": 100, "discount": 25}, "after a 25% discount", ["price"]),
    ({"price": 100, "discount": 25}, "a 100 dollar item, 25% off", []),
    ({"price": 100, "discount": 0.25}, "a 100 dollar item, 25% off", []),  # 25% as 0.25
    ({"price": 6, "discount": 10}, "6cm wide, 10cm high", []),  # a unit glued on
    ({"price": 5, "discount": 21}, "five of them, twenty-one off", []),  # spelt
    ({"price": 8_500_000, "discount": 2}, "8.5 million, two off", []),
    ({"price": 0, "discount": 1}, "from nothing, a single one", []),  # 0 and 1: never counted
    ({"price": -100, "discount": 5}, "cash flows of -$100, 5 off", []),  # its sign aside
    ({"price": 100, "discount": 8}, "100 dollars", []),  # 8: the tool's description says it
    ({"price": 100, "discount": 3, "tax": 9}, "100 dollars, 3 off", []),  # tax: optional
    ({"price": 100, "discount": 3, "lines": [{"qty": 7}]}, "100 dollars, 3 off", ["lines"]),
    ({"price": 100, "discount": True}, "100 dollars", []),  # a flag is not a number
    ({"price": 12, "discount": 3}, "rs12 and v3", ["price", "discount"]),  # inside words
])
def test_what_is_unfounded(arguments, said, expected):
    assert unfounded(TOOL, arguments, [{"role": "user", "content": said}]) == expected


def test_a_number_from_any_message_or_tool_result_is_founded():
    messages = [{"role": "system", "content": "Prices in euros."},
                {"role": "user", "content": "Look up item 7, then price it with 25% off."},
                {"role": "assistant", "content": None},
                {"role": "tool", "content": "item 7 costs 129.50"}]
    assert unfounded(TOOL, {"price": 129.5, "discount": 25}, messages) == []
    assert unfounded(TOOL, {"price": 130, "discount": 25}, messages) == ["price"]
    compact = [{"role": "user", "content": "Price the second at 25% off."},
               {"role": "tool", "content": '{"prices":[120,250,399]}'}]
    assert unfounded(TOOL, {"price": 250, "discount": 25}, compact) == []
    earlier = [{"role": "user", "content": "Weather there at 25% cloud?"},  # an earlier
               {"role": "assistant", "content": None, "tool_calls": [  # call's arguments
                   {"type": "function", "function": {"name": "geo", "arguments": {"lat": 48.85}}},
                   {"type": "function", "function": {"name": "geo", "arguments": '{"x": 2.35}'}}]}]
    assert unfounded(TOOL, {"price": 48.85, "discount": 2.35}, earlier) == []
    assert unfounded(TOOL, {"price": 100, "discount": 0.007},  # 0.7% is 0.00699999...
                     [{"role": "user", "content": "100 at 0.7% off"}]) == []
    parts = [{"type": "text", "text": "price 44"}]  # a message's content as parts
    assert unfounded(TOOL, {"price": 44, "discount": 0},
                     [{"role": "user", "content": parts}]) == []


def test_the_schema_is_read_as_written_not_as_json():
    tool = parse_tools(json.dumps([{**PRICE_TOOL, "parameters": {
        "type": "object", "required": ["price", "discount"], "properties": {
            "price": {"type": "number", "description": "Units:\n2 = imperial, 5–10 = metric"},
            "discount": {"type": "number", "default": 12.5}}}}]))[0]
    assert unfounded(tool, {"price": 2, "discount": 12.5}, []) == []
    assert unfounded(tool, {"price": 10, "discount": 5}, []) == []
    assert unfounded(tool, {"price": 11, "discount": 5}, []) == ["price"]


def test_the_question_names_what_is_missing():
    assert question(TOOL, ["price"]) == "To use final_price I need the price: what is it?"
    assert question(TOOL, ["price", "discountRate", "sales_tax"]) == (
        "To use final_price I need the price, the discount rate and the sales tax: "
        "what are they?")


@pytest.mark.parametrize("text, written, not_written", [
    ("6cm and 10cm", {6, 10}, set()), ("300K", {300}, set()),
    ("rs6034464 v2", set(), {6034464, 2}),  # inside words
    ("five matches", {5}, set()), ("twenty-one, ninety nine", {21, 99}, set()),
    ("two hundred, ten thousand, a million, a dozen", {200, 10_000, 1e6, 12}, set()),
    ("someone often", set(), {1, 10}), ("8.5 million", {8.5, 8_500_000}, set()),
    ("1,500 million", {1.5e9}, set()), ("$1.2k, 1.5M and 2.5bn", {1200, 1.5e6, 2.5e9}, set()),
    ("1,500 items at 5%", {1500, 5, 0.05}, set()), ("25 percent", {25, 0.25}, set()),
    ("1e5 and 0.7%", {1e5, 0.7}, set()), ("[120,250,399]", {120, 250, 399}, set()),
    ("compounded monthly, over 2 weeks", {12, 7, 2}, set()),  # the counts time implies
])
def test_numbers_a_request_writes_read_loosely(text, written, not_written):
    found = numbers(text, loose=True)
    assert written <= found and not not_written & found
    assert numbers("[120,250]") == {120250}  # read strictly, as the other rules do


def call_text(protocol, arguments):
    arguments = json.dumps(arguments, separators=(",", ":"))
    return f'{{"tool":"final_price","arguments":{arguments}}}' if protocol == "json" else \
        f'<tool_call>\n{{"name":"final_price","arguments":{arguments}}}\n</tool_call>'


def ask(lm, replies, *requests, **config):
    rec = Recorder()
    recorder = config.pop("recorder", None)
    protocol = config.pop("protocol", "json")
    system = config.pop("system", None)
    agent = Agent(lm, lm.engine(), PRICE, agent_format(protocol, lm, system),
                  AgentConfig(grammar=True, max_steps=3, **config), emit=rec,
                  sampler=Obliging(lm, *replies), recorder=recorder)
    return agent, [agent.ask(r) for r in requests], rec


@pytest.mark.parametrize("protocol", ["json", "hermes"])
def test_the_agent_asks_for_a_made_up_number_and_calls_once_it_is_given(tiny_lm, protocol,
                                                                        tmp_path):
    lm = tiny_lm if protocol == "json" else replace(tiny_lm, chat=ChatFormat(QWEN_LIKE))
    call = call_text(protocol, {"price": 100, "discount": 25, "lines": []})
    answer = '{"answer":"done"}' if protocol == "json" else "done"
    rec = tj.Recorder(tmp_path, task="t", model_fingerprint="fp", sampling={})
    agent, (first, second), events = ask(
        lm, [call, call, answer], "Final price after a 25% discount?", "It costs 100.",
        protocol=protocol, recorder=rec)
    asked = "To use final_price I need the price: what is it?"
    assert first.answer == asked and first.stats.unfounded_calls == 1
    assert first.stats.calls == 0  # nothing ran on the made-up price
    # the user gave it: the same call is founded now, and runs
    assert [c.arguments["price"] for c in events.of(ev.ToolCall)] == [100]
    assert second.answer == "done" and second.stats.unfounded_calls == 0
    written = json.dumps({"answer": asked}, separators=(",", ":")) if protocol == "json" \
        else asked
    assert [e.raw for e in events.of(ev.Assistant)][0] == written
    assert_reused_whole(tj.read(rec.path), agent)  # the question is what the model read


def test_a_call_that_must_be_made_the_switch_or_the_system_prompt_keeps_the_call(tiny_lm):
    call = call_text("json", {"price": 100, "discount": 25, "lines": []})
    for config in ({"stated_arguments": False}, {"tool_choice": ["required", "auto"]},
                   {"tool_choice": ["final_price", "auto"]},
                   {"system": "Every item costs 100 euros."}):
        _, (out,), events = ask(tiny_lm, [call, '{"answer":"done"}'],
                                "Final price after a 25% discount?", **config)
        assert [c.arguments["price"] for c in events.of(ev.ToolCall)] == [100], config
        assert out.stats.unfounded_calls == 0


@pytest.mark.parametrize("protocol", ["json", "hermes"])
def test_the_server_asks_and_streams_the_question(tiny_lm, serve, protocol):  # noqa: F811
    lm = tiny_lm if protocol == "json" else replace(tiny_lm, chat=ChatFormat(QWEN_LIKE))
    call = call_text(protocol, {"price": 100, "discount": 25, "lines": []})
    s = serve(lm, sampler_for=Scripted(lm, call, call, call, call, call), protocol=protocol)
    tools = [TOOL.openai()]
    messages = user("Final price after a 25% discount?")
    asked = "To use final_price I need the price: what is it?"
    r = s.client.chat.completions.create(model="tiny", messages=messages, tools=tools)
    assert r.choices[0].message.content == asked and not r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "stop"
    chunks = list(s.client.chat.completions.create(model="tiny", messages=messages,
                                                   tools=tools, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == asked
    assert not any(c.choices[0].delta.tool_calls for c in chunks)
    cut = s.client.chat.completions.create(model="tiny", messages=messages, tools=tools,
                                           stop=[":"])  # the client's stop strings apply
    assert cut.choices[0].message.content == "To use final_price I need the price"
    # a client that requires a call gets the call; one that gives the price gets it too
    r = s.client.chat.completions.create(model="tiny", messages=messages, tools=tools,
                                         tool_choice="required")
    assert json.loads(r.choices[0].message.tool_calls[0].function.arguments)["price"] == 100
    r = s.client.chat.completions.create(
        model="tiny", messages=user("Final price of 100 after a 25% discount?"), tools=tools)
    assert r.choices[0].message.tool_calls[0].function.name == "final_price"


WEATHER_TOOL = {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "required": ["city"], "properties": {
        "city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}}},
    "_exec": 'echo "sunny in $city"'}
WEATHER = parse_tools(json.dumps([WEATHER_TOOL]))


def test_a_made_up_string_counts_only_where_the_reply_had_to_be_a_call():
    tool = parse_tools(json.dumps([{**WEATHER_TOOL, "description": "e.g. Paris"}]))[0]
    said = [{"role": "user", "content": "What's the weather like?"}]
    assert unfounded(tool, {"city": "Paris"}, said) == []  # only numbers, by default
    # where the reply had to be a call, read against what the user and the turn's tools
    # wrote (not the schema's example)
    assert unfounded(tool, {"city": "Paris"}, said, "What's the weather like?") == ["city"]
    assert unfounded(tool, {"city": " "}, said, "Weather in Paris?") == ["city"]  # empty
    assert unfounded(tool, {"city": "paris, FR"}, said, "Weather in Paris?") == []
    assert unfounded(tool, {"city": "Oslo", "unit": "f"}, said, "Oslo") == []  # an enum's


HERMES_CALL = '<tool_call>\n{"name":"get_weather","arguments":{"city":"%s"}}\n</tool_call>'


def test_a_request_that_writes_a_tools_name_gets_a_call_or_a_question(tiny_lm):
    # under hermes, this random model would answer (its first token is not <tool_call>:
    # test_would_call_is_what_greedy_decoding_opens); under json it would call
    lm = replace(tiny_lm, chat=ChatFormat(QWEN_LIKE))

    def ask_weather(request, **config):
        rec = Recorder()
        agent = Agent(lm, lm.engine(), WEATHER, agent_format("hermes", lm),
                      AgentConfig(grammar=True, max_steps=3, **config), emit=rec,
                      sampler=Obliging(lm, "It is sunny.", HERMES_CALL % "Oslo",
                                       "It is sunny."))
        return agent.ask(request), rec

    out, rec = ask_weather("What's the weather in Oslo?")
    assert [c.arguments for c in rec.of(ev.ToolCall)] == [{"city": "Oslo"}]
    assert out.stats.mentioned_steps == 1 and out.answer == "It is sunny."
    # no city given: the call the model must make is on one it made up, so it asks
    out, rec = ask_weather("What's the weather like?")
    assert rec.of(ev.ToolCall) == [] and out.stats.unfounded_calls == 1
    assert out.answer == "To use get_weather I need the city: what is it?"
    # a request that writes no tool's name, or either switch off: the model's answer
    for request, config in (("Is it sunny in Oslo?", {}),
                            ("What's the weather in Oslo?", {"stated_arguments": False}),
                            ("What's the weather in Oslo?", {"follow_named_tool": False})):
        out, rec = ask_weather(request, **config)
        assert rec.of(ev.ToolCall) == [] and out.answer == "It is sunny.", config
        assert out.stats.mentioned_steps == 0


@pytest.mark.real_model
def test_the_bundled_model_asked_the_weather_without_a_city_asks_for_it(tmp_path):
    (tmp_path / "tools.json").write_text(json.dumps([WEATHER_TOOL]))
    cli = [sys.executable, "-m", "mlx_agent.cli.main", "agent", "--tools",
           str(tmp_path / "tools.json"), "--json-out", "--single"]
    # it would answer from its own knowledge; made to call, it makes a city up: asked
    r = subprocess.run([*cli, "What's the weather like today?"], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    events = [ev.decode(line) for line in r.stdout.splitlines()]
    stats = next(e for e in events if isinstance(e, ev.Stats))
    assert not [e for e in events if isinstance(e, ev.ToolCall)], r.stdout
    assert stats.mentioned_steps == 1 and stats.unfounded_calls == 1, r.stdout


def test_the_server_calls_where_the_request_writes_a_tools_name(tiny_lm, serve):  # noqa: F811
    lm = replace(tiny_lm, chat=ChatFormat(QWEN_LIKE))  # would answer under hermes
    # the model would answer each time; where it may not, it makes the call
    script = Obliging(lm, "It is sunny.", HERMES_CALL % "Oslo", "It is sunny.", "It is sunny.")
    s = serve(lm, sampler_for=lambda sampling: script, protocol="hermes")
    tools = [WEATHER[0].openai()]
    r = s.client.chat.completions.create(model="tiny", messages=user(
        "What's the weather in Oslo?"), tools=tools)
    assert [(c.function.name, json.loads(c.function.arguments))
            for c in r.choices[0].message.tool_calls] == [("get_weather", {"city": "Oslo"})]
    # after the tool's result, the reply may answer; so may one to a request naming no tool
    r = s.client.chat.completions.create(model="tiny", tools=tools, messages=[
        *user("What's the weather in Oslo?"),
        {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": {
            "name": "get_weather", "arguments": '{"city":"Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny in Oslo"}])
    assert r.choices[0].message.content == "It is sunny."
    r = s.client.chat.completions.create(model="tiny", messages=user("Sunny in Oslo?"),
                                         tools=tools)
    assert r.choices[0].message.content == "It is sunny."


def test_a_reply_is_pressed_to_the_tools_the_request_names_and_no_call_has_called():
    from mlx_agent.stated_arguments import pressed_tools

    asked = user("What's the weather in Oslo?")
    assert pressed_tools(WEATHER, asked) == WEATHER  # the first reply: any tool
    assert pressed_tools(WEATHER, user("Is it sunny in Oslo?")) == []
    called = [*asked, {"role": "assistant", "tool_calls": [{"type": "function", "function": {
        "name": "get_weather", "arguments": {"city": "Oslo"}}}]},
        {"role": "tool", "content": "sunny"}]
    assert pressed_tools(WEATHER, called) == []  # it ran: the reply may answer
    assert pressed_tools(WEATHER, [{"role": "system", "content": "weather"}]) == []  # no user
    assert pressed_tools(WEATHER, [*called, {"role": "assistant", "content": "x"},
                                   *user("And the weather in Rome?")]) == WEATHER  # a new turn
    # a chain: the second tool the request names is pressed once the first has run
    chain = parse_tools(json.dumps([{"name": "get_weather", "parameters": {"type": "object",
        "properties": {"city": {"type": "string"}}}}, {"name": "create_event", "parameters": {
        "type": "object", "properties": {"title": {"type": "string"}}}}, {"name": "send_email",
        "parameters": {"type": "object", "properties": {"to": {"type": "string"}}}}]),
        runnable=False)
    request = user("Get the weather in Oslo, then create an event with it as the title.")
    ran = [*request, *called[1:]]
    assert pressed_tools(chain, request) == chain
    assert [t.name for t in pressed_tools(chain, ran)] == ["create_event"]
    assert pressed_tools(chain, [*ran, {"role": "assistant", "tool_calls": [{"type": "function",
        "function": {"name": "create_event", "arguments": "{}"}}]},
        {"role": "tool", "content": "created"}]) == []  # both ran
    # a client's result that names its tool, with no tool_calls before it: that one ran
    named_result = [*user("What's the weather in Oslo?"),
                    {"role": "tool", "name": "get_weather", "content": "sunny"}]
    assert pressed_tools(chain, named_result) == []
    # a clause that does not ask for the call: negated, conditional, a question of whether
    for request in ("Get the weather in Oslo. Don't create an event.",
                    "Get the weather in Oslo; if it rains, create an event.",
                    "Get the weather in Oslo and tell me whether to create an event.",
                    "Get the weather in Oslo, then email it, but do not create an event."):
        assert pressed_tools(chain, [*user(request), *called[1:]]) == [], request
    # a tool named by the words a tried one was named by is not named again
    listings = parse_tools(json.dumps([{"name": n, "parameters": {"type": "object",
        "properties": {"city": {"type": "string"}}}} for n in (
            "check_adoption_listing", "search_adoption_listings")]), runnable=False)
    checked = [*user("Check adoption listing near Montreal. Let me know the output."),
               {"role": "assistant", "tool_calls": [{"type": "function", "function": {
                   "name": "check_adoption_listing", "arguments": "{}"}}]},
               {"role": "tool", "content": "829"}]
    assert pressed_tools(listings, checked) == []
    # the first of the tools left, in the order the request names them
    both = user("Get the weather in Oslo, then send an email to ann@x.org and create an event.")
    assert [t.name for t in pressed_tools(chain, [*both, *called[1:]])] == ["send_email"]
    assert pressed_tools(chain, [*both, *called[1:]], tried={"get_weather", "send_email"}) \
        == [chain[1]]  # the agent says what its calls tried (a denied one too)


CHAIN = parse_tools(json.dumps([WEATHER_TOOL, {
    "name": "send_email", "parameters": {"type": "object", "required": ["to"], "properties": {
        "to": {"type": "string"}}}, "_exec": 'echo "sent to $to"'}, {
    "name": "create_event", "description": "Create a calendar event.",
    "parameters": {"type": "object", "required": ["title"], "properties": {
        "title": {"type": "string"}}},
    "_exec": 'echo "created $title"'}]))
CHAIN_REQUEST = "Get the weather in Oslo, then create an event, passing the result as its title."


def test_a_chains_second_tool_is_called_with_the_first_result(tiny_lm):
    """After the first call's result, the model would answer: the step is pressed to the
    tool the request names that has not run, and the result goes where the request says."""
    lm = replace(tiny_lm, chat=ChatFormat(QWEN_LIKE))
    second = '<tool_call>\n{"name":"create_event","arguments":{"title":"Oslo"}}\n</tool_call>'

    def ask(request, **config):
        rec = Recorder()
        agent = Agent(lm, lm.engine(), CHAIN, agent_format("hermes", lm),
                      AgentConfig(grammar=True, max_steps=4, **config), emit=rec,
                      sampler=Obliging(lm, HERMES_CALL % "Oslo", "Done.", second, "Done."))
        return agent.ask(request), rec

    out, rec = ask(CHAIN_REQUEST)
    assert [(c.tool, c.arguments) for c in rec.of(ev.ToolCall)] == [
        ("get_weather", {"city": "Oslo"}), ("create_event", {"title": "sunny in Oslo"})]
    assert out.answer == "Done.\n\ncreate_event returned created sunny in Oslo."
    assert out.stats.mentioned_steps == 2
    # the switch off: the model answers after the first result, as it would
    out, rec = ask(CHAIN_REQUEST, stated_arguments=False)
    assert [c.tool for c in rec.of(ev.ToolCall)] == ["get_weather"] and out.answer == "Done."
    # the user denies the second call: it is not pressed again, the model answers
    out, rec = ask(CHAIN_REQUEST, confirm=lambda name, arguments: name != "create_event")
    assert [c.tool for c in rec.of(ev.ToolCall)] == ["get_weather", "create_event"]
    assert out.answer == "Done." and out.stats.mentioned_steps == 2


@pytest.mark.parametrize("name, request_, passes", [
    ("title", "create event, feeding in the answer you got as its title.", True),
    ("title", "create event, passing its output as the title.", True),
    ("label", "then set a timer, using the result for the label", True),
    ("title", "with the title set to the output", True),
    ("text", "reverse text, passing its output as the text", True),
    ("title", "Create an event titled Lunch", False),
    ("title", "Title: the answer to life", False),
    ("minutes", "a timer of 5 minutes, and the result as a label", False),  # another's
    ("text", "then translate the text to that language", False),
    ("body", "email bob with the body set to this: meeting moved", False),
    ("date", "schedule it for the date we discussed", False),
    ("title", "Use it as the title", True),
])
def test_where_a_request_passes_a_result_on(name, request_, passes):
    from mlx_agent.stated_arguments import _passes_on

    assert _passes_on(name, request_) is passes


def test_a_passed_on_result_is_the_parameters_value():
    from mlx_agent.stated_arguments import last_result, piped_results

    tool = parse_tools(json.dumps([{"name": "t", "parameters": {"type": "object",
        "required": ["title"], "properties": {"title": {"type": "string"},
                                             "minutes": {"type": "integer"}}}}]),
        runnable=False)[0]
    request = "Create it, with the result as the title and the answer as its minutes."
    assert piped_results(tool, {"title": "x"}, request, "616.0 miles") == \
        {"title": "616.0 miles"}  # a result of words: no number for minutes
    assert piped_results(tool, {"title": "x"}, request, "42") == {"title": "42", "minutes": 42}
    assert piped_results(tool, {"title": "x"}, "Create it.", "42") == {"title": "x"}
    held = {"title": "x"}
    assert piped_results(tool, held, request, None) is held
    agent = [*user("x"), {"role": "tool", "content": json.dumps(
        {"tool": "k", "stdout": "616.0 miles\n", "stderr": ""})}]
    assert last_result(agent) == "616.0 miles"  # the agent's result: its output
    assert last_result([*user("x"), {"role": "tool", "content": " plain "}]) == "plain"
    assert last_result([{"role": "tool", "content": "before"}, *user("x")]) is None
    assert last_result([*user("x"), {"role": "tool", "content": '{"temp": 31}'}]) is None
    assert last_result([*user("x"), {"role": "tool", "content": '"hi"'}]) == "hi"
    failed = {"tool": "k", "stdout": "partial", "exit_code": 1}
    assert last_result([*user("x"), {"role": "tool", "content": json.dumps(failed)}]) is None


def test_the_server_asks_for_the_string_a_pressed_call_made_up(tiny_lm, serve):  # noqa: F811
    lm = replace(tiny_lm, chat=ChatFormat(QWEN_LIKE))
    script = Obliging(lm, "It is sunny.", HERMES_CALL % "Paris")
    s = serve(lm, sampler_for=lambda sampling: script, protocol="hermes")
    r = s.client.chat.completions.create(model="tiny", messages=user(
        "What's the weather like?"), tools=[WEATHER[0].openai()])
    assert r.choices[0].message.content == "To use get_weather I need the city: what is it?"
    assert not r.choices[0].message.tool_calls


@pytest.mark.parametrize("protocol", ["json", "hermes"])
def test_would_call_is_what_greedy_decoding_opens(tiny_lm, protocol):
    from mlx_agent.engine import greedy_sampler
    from mlx_agent.grammar import tool_constraint
    from mlx_agent.probe import would_call

    lm = tiny_lm if protocol == "json" else replace(tiny_lm, chat=ChatFormat(QWEN_LIKE))
    fmt, engine = agent_format(protocol, lm), lm.engine()
    for request in ("What's the weather in Oslo?", "Hello!", "Weather?", "Tell me a joke.",
                    "Oslo, Rome, Paris: sunny?", "Use get_weather for Oslo."):
        prompt = fmt.prompt_ids(user(request), WEATHER)
        constraint = tool_constraint(lm, protocol, WEATHER, 64, "auto", parallel=False)
        calls = would_call(engine, lm, protocol, prompt, constraint)
        assert engine.tokens == prompt  # left as it found it
        ids = list(engine.generate(greedy_sampler, max_tokens=4, stop_ids=lm.end_ids,
                                   constraint=constraint))
        start = lm.decode(ids) if protocol == "json" else ids[0]
        greedy = start.startswith('{"tool"') if protocol == "json" \
            else start == lm.encode("<tool_call>")[0]
        assert calls is greedy, request
    full = lm.engine(context_length=len(prompt))  # no room for a reply: nothing to press
    assert would_call(full, lm, protocol, prompt, constraint) and full.tokens == prompt


@pytest.mark.real_model
def test_the_bundled_model_would_call_for_a_tools_request_and_answer_a_greeting():
    from mlx_agent.grammar import tool_constraint
    from mlx_agent.models import default_adapter, load
    from mlx_agent.probe import would_call

    lm = load("smollm2-135m", adapter=default_adapter("smollm2-135m"))
    fmt, engine = agent_format("json", lm), lm.engine()
    for request, calls in (("What's the weather in Oslo today?", True),
                           ("Hello! Who are you?", False)):
        prompt = fmt.prompt_ids(user(request), WEATHER)
        constraint = tool_constraint(lm, "json", WEATHER, 64, "auto", parallel=False)
        assert would_call(engine, lm, "json", prompt, constraint) is calls, request


@pytest.mark.real_model
def test_the_bundled_model_asks_for_the_price_it_was_not_given(tmp_path):
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps({"tools": [{"type": "function", "function": {
        "name": "calculate_final_price",
        "description": "Calculate the final price of a product after a discount and sales tax.",
        "parameters": {"type": "object", "properties": {
            "price": {"type": "number", "description": "The original price of the product."},
            "discount_rate": {"type": "number", "description": "The discount in percent."},
            "sales_tax": {"type": "number", "description": "The sales tax in percent."}},
            "required": ["price", "discount_rate", "sales_tax"]},
        "_exec": "awk -v p=\"$price\" -v d=\"$discount_rate\" -v t=\"$sales_tax\" "
                 "'BEGIN { printf \"%.2f\\n\", p * (1 - d / 100) * (1 + t / 100) }'"}}]}))

    def agent(request):
        cli = [sys.executable, "-m", "mlx_agent.cli.main", "agent", "--tools", str(tools),
               "--json-out", "--single", request]
        out = subprocess.run(cli, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        return [json.loads(line) for line in out.stdout.splitlines()]

    events = agent("How much is the final price after a discount and sales tax?")
    assert not [e for e in events if e["type"] == "tool_call"]
    (answer,) = [e["text"] for e in events if e["type"] == "answer"]
    assert answer.startswith("To use calculate_final_price I need the price")
    assert [e["unfounded_calls"] for e in events if e["type"] == "stats"] == [1]
    events = agent("What is the final price of a 80 dollar product after a 25% discount and "
                   "10% sales tax?")
    assert [e["stdout"] for e in events if e["type"] == "tool_call"] == ["66.00\n"]


def test_a_hostile_conversation_is_read_in_linear_time():
    import time

    start = time.perf_counter()
    for text in ("1" * 100_000 + " million", "1," * 100_000, "twenty-" * 30_000,
                 "1a" * 100_000, "1." * 100_000, "1" + ",111" * 50_000 + "x",
                 "1" + ",111" * 50_000 + " million"):  # "9 million"'s every start, and each
        assert unfounded(TOOL, {"price": 7, "discount": 3},  # ",111", once took time
                         [{"role": "user", "content": text}]) == ["price", "discount"]
    nested: dict = {"qty": 7}
    for _ in range(5000):  # deeper than Python's recursion limit
        nested = {"x": [nested]}
    assert unfounded(TOOL, {"price": 2, "discount": 2, "lines": nested},
                     [{"role": "user", "content": "2"}]) == ["lines"]
    assert time.perf_counter() - start < 5
