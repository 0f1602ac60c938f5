"""The tool a request describes: a turn's first call of another tool is written again for it.

The default adapter, asked for "the compound interest" with ``financial.compound_interest``
and ``financial.simple_interest`` offered, called the simple one; asked to convert euros to
dollars, it called ``unit_conversion.convert`` beside ``currency_exchange.convert``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pytest

from mlx_agent.agent import Agent, AgentConfig, agent_format
from mlx_agent.agent import events as ev
from mlx_agent.chat import ChatFormat
from mlx_agent.described_tool import described_tool, mentioned, scores, stems
from mlx_agent.stated_arguments import complete_reply
from mlx_agent.tools import load_tools, parse_tools

from .test_agent_loop import QWEN_LIKE, Recorder
from .test_loop_guard import Obliging

WEATHER_SPEC = {"name": "weather", "description": "Current weather for a city.",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                               "required": ["city"]}}
TOOLS = parse_tools(json.dumps([
    {**WEATHER_SPEC, "_exec": 'printf "sunny in %s" "$city"'},
    {"name": "currency_exchange", "description": "Convert money at today's exchange rate.",
     "parameters": {"type": "object", "properties": {
         "amount": {"type": "number"}, "to": {"type": "string"}},
         "required": ["amount", "to"]},
     "_exec": 'printf "%s %s" "$amount" "$to"'}]))
WEATHER, EXCHANGE = TOOLS
ASKED = "Change 200 euros into dollars at the currency exchange rate."


def beside_weather(*specs):
    """The weather tool and ``specs``, not runnable: the catalogues the model's wrong call
    (of weather) is moved out of."""
    return parse_tools(json.dumps([WEATHER_SPEC, *specs]), runnable=False)


def tools(*spec):
    return parse_tools(json.dumps([{"name": name, "description": description,
                                    "parameters": {"type": "object", "properties": {
                                        p: {"type": "string"} for p in params}}}
                                   for name, description, params in spec]), runnable=False)


NAMED = parse_tools(json.dumps([{"name": n, "parameters": {"type": "object", "properties": {}}}
                                 for n in ("find_roots", "entropy_change.calculate",
                                           "get_details", "generate_DNA_sequence",
                                           "getWeatherInfo", "get_current_time",
                                           "get_latest_news", "get_current_user",
                                           "get_current_weather", "get_liver_enzymes",
                                           "check_liver_function", "get_current_temperature",
                                           "get_current_branch")]), runnable=False)


@pytest.mark.parametrize("request_, expected", [
    ("What are the roots of x^2 - 4?", ["find_roots"]),
    ("The change in entropy of a 1kg ice block", ["entropy_change.calculate"]),
    ("Generate a DNA sequence with 100 bases", ["generate_DNA_sequence"]),
    ("Is it raining? The weather in Oslo.", ["getWeatherInfo", "get_current_weather"]),
    ("Get the details and the information", []),  # what a tool does, not what it is about
    ("The DNA of a whale", []), ("Entropy alone", []),  # some of the name: not the name
    ("Les racines", []),
    # a name's words that say when are not needed before weather ("current"); before
    # other nouns (time, user, news, temperature, ...) they are
    ("Is the weather fine?", ["getWeatherInfo", "get_current_weather"]),  # camelCase too
    ("What is the current time in Tokyo?", ["get_current_time"]),
    ("What is the time complexity of quicksort?", []), ("How many times does 3 go?", []),
    ("I am a new user", []), ("Any news?", []), ("Which enzymes digest fat?", []),
    ("Explain what a function is", []),  # "liver" is no "live"
    ("What is the temperature of the sun's surface?", []), ("Explain git branches", []),
    ("What's current and latest?", []),  # only such words: no tool's name
])
def test_the_tools_whose_name_a_request_writes(request_, expected):
    assert [t.name for t in mentioned(NAMED, request_)] == expected


def test_words_are_stems_of_names_and_text():
    assert stems("getTopGoalScorers") == {"get", "top", "goal", "scor"}
    assert stems("the depreciated value") == stems("depreciation values")
    assert stems("What is the rate of it for you?") == {"rat"}  # function words left out
    assert stems("Zürich 3 ab hôtel Lyon") == {"lyon"}  # ASCII words of three letters+


def test_the_tool_a_request_describes_over_the_one_called():
    interest = tools(("financial.compound_interest", "Compound interest of a principal.",
                      ["principal", "rate"]),
                     ("financial.simple_interest", "Simple interest of a principal.",
                      ["principal", "rate"]))
    request = "Calculate the compound interest for a principal of $1000 at 5%."
    # "interest", "principal", "rate" and "financial" are every tool's: they count nothing
    assert scores(interest, request) == [2, 0]
    assert described_tool(interest, request, interest[1]) is interest[0]
    assert described_tool(interest, request, interest[0]) is None  # the model's own choice
    fields = tools(("electric_field.calculate", "The electric field of a charge.", ["charge"]),
                   ("magnetic_field.calculate", "The magnetic field of a current.", ["current"]),
                   ("electric_force.calculate", "The force between two charges.", ["charge"]))
    request = "Calculate the magnetic field at point P of a current of 10 A."
    # "field" describes the called tool only as it describes the other: it counts nothing
    assert scores(fields, request) == [2, 5, 0]
    assert described_tool(fields, request, fields[0]) is fields[1]
    shapes = tools(("geometry.area_circle", "Area of a circle.", ["radius"]),
                   ("plot_sine_wave", "Plot a sine wave.", ["frequency"]))
    assert described_tool(shapes, "The area of a circle of radius 10?", shapes[1]) is shapes[0]


@pytest.mark.parametrize("request_", [
    "Calculate it for a principal of $1000 at 5%.",  # describes neither: the model's choice
    "Compare the compound and the simple interest.",  # both alike: a tie
    "What is the yearly interest?",  # one word of a description only: under MARGIN
])
def test_a_request_describing_no_tool_alone_leaves_the_models_choice(request_):
    interest = tools(("compound_interest", "Interest added to the principal yearly.",
                      ["principal"]),
                     ("simple_interest", "Interest on the principal alone.", ["principal"]))
    assert described_tool(interest, request_, interest[1]) is None


def test_a_request_in_another_language_describes_no_tool():
    rooms = tools(("book_hotel", "Book a hotel room.", ["city"]),
                  ("restart_server", "Restart a server.", ["host"]))
    request = "Réserver une chambre d'hôtel à Lyon pour demain."  # no "server" in "Réserver"
    assert scores(rooms, request) == [0, 0]
    assert described_tool(rooms, request, rooms[0]) is None


def test_a_request_that_describes_the_called_tool_too_may_ask_for_both():
    pets = tools(("retrieve_storm_warning", "Storm warnings for a place.", ["location"]),
                 ("update_feeding_plan", "Change a pet's feeding plan.",
                  ["feeding_plan_id", "age_years"]))
    request = ("Retrieve the storm warning near Dublin, then update feeding plan FEE-2285 "
               "with the age in years you got.")
    assert scores(pets, request) == [6, 8]  # the second writes more, the first its name
    assert described_tool(pets, request, pets[0]) is None
    assert described_tool(pets, "Update feeding plan FEE-2285.", pets[0]) is pets[1]


def test_one_tool_alone_a_tool_not_offered_or_one_the_user_names_is_kept():
    one = tools(("plot_sine_wave", "Plot a sine wave.", ["frequency"]))
    assert described_tool(one, "The area of a circle?", one[0]) is None
    assert described_tool(TOOLS, ASKED, one[0]) is None
    assert described_tool(TOOLS, ASKED, WEATHER) is EXCHANGE
    assert described_tool(TOOLS, "Use the weather tool. " + ASKED, WEATHER) is None


def test_a_tool_of_no_words_leaves_the_words_every_other_tool_has():
    interest = tools(("compound_interest", "Interest of a principal, compounded.", []),
                     ("simple_interest", "Interest of a principal.", []))
    request = "The compound interest on a principal of 1000."
    assert scores(interest + tools(("do", "", [])), request) == scores(interest, request) \
        + [0] == [2, 0, 0]


def ask(lm, protocol, replies, request, **config):
    rec = Recorder()
    script = Obliging(lm, *replies)  # the replies, and what the probes write
    agent = Agent(lm, lm.engine(), TOOLS, agent_format(protocol, lm),
                  AgentConfig(grammar=True, max_steps=3, **config), emit=rec, sampler=script,
                  probe_sampler=script)
    return agent, agent.ask(request), rec


def written(protocol, name, arguments):
    arguments = json.dumps(arguments, separators=(",", ":"))
    return f'{{"tool":"{name}","arguments":{arguments}}}' if protocol == "json" else \
        f'<tool_call>\n{{"name":"{name}","arguments":{arguments}}}\n</tool_call>'


@pytest.mark.parametrize("protocol", ["json", "hermes"])
def test_a_call_of_another_tool_is_written_again_for_the_described_one(tiny_lm, protocol):
    lm = tiny_lm if protocol == "json" else replace(tiny_lm, chat=ChatFormat(QWEN_LIKE))
    answer = '{"answer":"done"}' if protocol == "json" else "done"
    wrong = written(protocol, "weather", {"city": "dollars"})
    # the probe writes the described tool's arguments, then the closing brace
    _, out, events = ask(lm, protocol, [wrong, '{"amount":200,"to":"dollars"}}', answer],
                         ASKED)
    assert [(c.tool, c.arguments, c.stdout) for c in events.of(ev.ToolCall)] == \
        [("currency_exchange", {"amount": 200, "to": "dollars"}, "200 dollars")]
    assert out.answer == "done" and out.stats.stated_calls == 1
    # with the pass off, the model's call stands
    _, out, events = ask(lm, protocol, [wrong, answer], ASKED, stated_arguments=False)
    assert [c.tool for c in events.of(ev.ToolCall)] == ["weather"]


def test_the_models_own_call_may_follow_a_moved_one(tiny_lm):
    wrong = written("json", "weather", {"city": "dollars"})
    # the guard refuses the moved call, not the one the model sampled: it may make it next
    _, out, events = ask(tiny_lm, "json", [wrong, '{"amount":200,"to":"dollars"}}', wrong,
                                           '{"answer":"done"}'], ASKED)
    assert [(c.tool, c.arguments) for c in events.of(ev.ToolCall)] == \
        [("currency_exchange", {"amount": 200, "to": "dollars"}),
         ("weather", {"city": "dollars"})]


def reread(lm, tools_, messages, call, script, max_tokens=256, choices=None,
           stop=lambda: False):
    """``complete_reply`` on ``call``, the probes writing ``script`` (``choices``: all of
    ``tools_`` unless given): the call's tool and arguments after, and whether the engine
    holds the prompt and the reply as it reads (its text, as the grammar writes it)."""
    fmt = agent_format("json", lm)
    prompt, ids = fmt.prompt_ids(messages, tools_), lm.encode_text(call)
    engine = lm.engine()
    engine.sync(prompt + ids)
    reply, text, out_ids = complete_reply(engine, lm, "json", prompt, fmt.parse(call), call,
                                          ids, [], tools_, messages,
                                          Obliging(lm, *([script] if isinstance(script, str)
                                                         else script)),
                                          choices=tools_ if choices is None else choices,
                                          max_tokens=max_tokens, stop=stop)
    made = reply.calls[0].name, reply.calls[0].arguments
    return made, text == written("json", *made) and engine.tokens == prompt + out_ids


def test_a_chains_later_call_is_read_as_made(tiny_lm):
    call = written("json", "weather", {"city": "dollars"})
    messages = [{"role": "user", "content": ASKED},
                {"role": "assistant", "content": call},
                {"role": "tool", "name": "weather", "content": "sunny"}]
    assert reread(tiny_lm, TOOLS, messages, call, '{"amount":200,"to":"dollars"}}') == \
        (("weather", {"city": "dollars"}), True)
    # as the turn's first call, it is moved
    assert reread(tiny_lm, TOOLS, messages[:1], call, '{"amount":200,"to":"dollars"}}') == \
        (("currency_exchange", {"amount": 200, "to": "dollars"}), True)


def test_a_call_whose_required_values_the_request_never_writes_is_not_made_first(tiny_lm):
    flights = parse_tools(json.dumps([
        {"name": "search_flights", "description": "Find flights between two cities.",
         "parameters": {"type": "object", "properties": {"origin": {"type": "string"},
                        "destination": {"type": "string"}}, "required": ["origin"]}},
        {"name": "book_flight", "description": "Book a flight.",
         "parameters": {"type": "object", "properties": {"flight_id": {"type": "string"}},
                        "required": ["flight_id"]}}]), runnable=False)
    messages = [{"role": "user", "content": "Book me a flight from Boston to Denver."}]
    call = written("json", "search_flights", {"origin": "Boston", "destination": "Denver"})
    assert reread(tiny_lm, flights, messages, call, '{"flight_id":"UA-2291"}}')[0] == \
        ("search_flights", {"origin": "Boston", "destination": "Denver"})  # its id comes next
    assert reread(tiny_lm, flights, messages, call, '{"flight_id":"flight_2291"}}')[0] == \
        ("search_flights", {"origin": "Boston", "destination": "Denver"})  # a word with digits
    messages = [{"role": "user", "content": "Book me flight UA-2291 from Boston to Denver."}]
    assert reread(tiny_lm, flights, messages, call, '{"flight_id":"UA-2291"}}')[0] == \
        ("book_flight", {"flight_id": "UA-2291"})


def test_a_garble_in_the_moved_call_is_copied_again_before_it_is_read(tiny_lm):
    hotels = beside_weather({"name": "book_hotel", "description": "Book a hotel room.",
                             "parameters": WEATHER_SPEC["parameters"]})
    messages = [{"role": "user", "content": "Book a hotel room in Riga, Latvia."}]
    call = written("json", "weather", {"city": "Riga, Latvia"})
    # the garble alone reads as made up; the copy probe writes the request's phrase, which
    # this model finds about as likely (test_copied_values's test_a_less_likely_copy...)
    assert reread(tiny_lm, hotels, messages, call,
                  ['{"city":"Rigggga Lattvviiaa"}}', '"Riga, Latvia"}']) == \
        (("book_hotel", {"city": "Riga, Latvia"}), True)


def test_a_client_that_leaves_during_the_arguments_stops_them(tiny_lm):
    asked = []  # the client leaves once the arguments' first token is written
    assert reread(tiny_lm, TOOLS, [{"role": "user", "content": ASKED}],
                  written("json", "weather", {"city": "x"}), '{"amount":200,"to":"dollars"}}',
                  stop=lambda: asked.append(1) or len(asked) > 1) == \
        (("weather", {"city": "x"}), True)


def test_arguments_are_written_in_the_calls_order_and_within_its_budget(tiny_lm):
    noted = beside_weather(
        {"name": "currency_exchange", "description": "Convert money at the exchange rate.",
         "parameters": {"type": "object", "properties": {   # the required one declared last
             "note": {"type": "string"}, "value": {"type": "number"}},
             "required": ["value"]}})
    messages = [{"role": "user", "content": "Change 200 euros, a currency exchange for me."}]
    call = written("json", "weather", {"city": "euros"})
    # the json protocol writes required arguments first (not as declared, nor sorted): so
    # does the probe
    assert reread(tiny_lm, noted, messages, call, '{"value":200,"note":"for me"}}') == \
        (("currency_exchange", {"value": 200, "note": "for me"}), True)
    # arguments the reply's budget cannot hold: the call stays as sampled
    assert reread(tiny_lm, noted, messages, call, '{"value":200,"note":"for me"}}',
                  max_tokens=4) == (("weather", {"city": "euros"}), True)


@pytest.mark.parametrize("choices", [TOOLS, ()])
def test_the_engine_holds_the_call_as_it_now_reads(tiny_lm, choices):
    expected = ("currency_exchange", {"amount": 200, "to": "dollars"}) if choices \
        else ("weather", {"city": "x"})
    assert reread(tiny_lm, TOOLS, [{"role": "user", "content": ASKED}],
                  written("json", "weather", {"city": "x"}), '{"amount":200,"to":"dollars"}}',
                  choices=choices) == (expected, True)


INTEREST = [
    {"name": "compound_interest", "description": "Calculates compound interest.",
     "parameters": {"type": "object", "properties": {
         "principle": {"type": "integer"}, "rate": {"type": "number"},
         "time": {"type": "integer"}, "n": {"type": "integer"}},
         "required": ["principle", "rate", "time", "n"]},
     "_exec": "printf 3200.11"},
    {"name": "simple_interest", "description": "Calculates simple interest.",
     "parameters": {"type": "object", "properties": {
         "principle": {"type": "integer"}, "rate": {"type": "number"},
         "time": {"type": "integer"}}, "required": ["principle", "rate", "time"]},
     "_exec": "printf 3100"}]
COMPOUND = "Calculate the compound interest on $2500 at 4% a year for 6 years, compounded monthly."


@pytest.mark.real_model
def test_the_bundled_model_asked_for_compound_interest_calls_that_tool(tmp_path):
    (tmp_path / "tools.json").write_text(json.dumps(INTEREST))
    cli = [sys.executable, "-m", "mlx_agent.cli.main", "agent", "--tools",
           str(tmp_path / "tools.json"), "--json-out", "--single", COMPOUND]
    for extra, tool in (([], "compound_interest"),
                        (["--no-stated-arguments"], "simple_interest")):  # its own choice
        r = subprocess.run(cli + extra, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        events = [ev.decode(line) for line in r.stdout.splitlines()]
        answers = [e.text for e in events if isinstance(e, ev.Answer)]
        # or it wrote a rate of its own (1.04 for "4%"), and the user is asked for it
        assert [e.tool for e in events if isinstance(e, ev.ToolCall)][:1] == [tool] or \
            answers[0].startswith(f"To use {tool} I need")  # (test_unfounded)


@pytest.mark.real_model
def test_the_server_calls_the_described_tool_unless_the_client_named_one(tmp_path):
    from mlx_agent.models import default_adapter, load
    from mlx_agent.serve import ChatService
    from mlx_agent.serve.service import ChatCall

    (tmp_path / "tools.json").write_text(json.dumps(INTEREST))
    lm = load("smollm2-135m", adapter=default_adapter("smollm2-135m"))  # as `serve` loads it
    service = ChatService(lm, tools=load_tools(str(tmp_path / "tools.json")), kv_slots=0)
    for choice, tool in (("auto", "compound_interest"), ("required", "compound_interest"),
                         ("simple_interest", "simple_interest")):
        result = service.chat(service.prepare(ChatCall(
            messages=[{"role": "user", "content": COMPOUND}], tool_choice=choice)))
        assert [c.name for c in result.tool_calls] == [tool] or \
            choice == "auto" and result.content.startswith(f"To use {tool} I need")
