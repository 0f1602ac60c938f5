"""`mlx_agent synth`: schema-valid, deterministic, held out by values and templates, and
loadable (and runnable) by `eval`; the command line in a real subprocess."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from mlx_agent.evaluate import load_tasks, run
from mlx_agent.synth import conversations, phrasing, pools
from mlx_agent.synth import tasks as tasks_module
from mlx_agent.synth.conversations import Outcomes, write_conversation
from mlx_agent.synth.synthesis import SynthConfig, generated_tools, synthesize
from mlx_agent.synth.values import canonical, free_leaves, singular, words
from mlx_agent.tools import declared_tools, load_tools, run_tool

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "mlx_agent.cli.main"]
CATALOGUE = ROOT / "tests" / "data" / "catalogue.json"
EXAMPLES = [ROOT / "examples" / "echo.json", ROOT / "examples" / "debugger.json",
            ROOT / "examples" / "specialist" / "tools.json"]


def fn(name, description, properties, required=(), exec_="echo ok"):
    return {"type": "function", "function": {
        "name": name, "description": description, "_exec": exec_,
        "parameters": {"type": "object", "properties": properties,
                       "required": list(required)}}}


PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "description": "Full name"},
    "email": {"type": "string", "format": "email"},
    "age": {"type": "integer", "minimum": 0, "maximum": 120}}, "required": ["name", "email"]}
BFCL_SHAPED = [  # written here, in the shapes BFCL's schemas take; no BFCL data
    fn("book_flight", "Book a flight for a passenger.", {
        "passenger": PERSON, "date": {"type": "string", "format": "date"},
        "cabin": {"type": "string", "enum": ["economy", "business", "first"]},
        "seats": {"type": "integer", "minimum": 1, "maximum": 9},
        "notes": {"type": "string", "description": "Anything the airline should know"}},
        ["passenger", "date", "cabin"]),
    fn("create_event", "Create a calendar event.", {
        "title": {"type": "string"}, "start": {"type": "string", "format": "date-time"},
        "attendees": {"type": "array", "items": PERSON, "minItems": 1, "maxItems": 4},
        "duration_minutes": {"type": "integer", "minimum": 15, "maximum": 480,
                             "multipleOf": 15},
        "reminder": {"type": "string", "format": "time"},
        "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}},
        ["title", "start", "attendees"]),
    fn("convert_units", "Convert a quantity between units.", {
        "value": {"type": "number", "exclusiveMinimum": 0, "maximum": 10000},
        "from_unit": {"type": "string", "enum": ["kg", "lb", "g"]},
        "to_unit": {"type": "string", "enum": ["kg", "lb", "g"]}},
        ["value", "from_unit", "to_unit"], 'echo "$value $from_unit in $to_unit"'),
    fn("get_stock_price", "Latest price of a stock.", {
        "ticker": {"type": "string", "pattern": "^[A-Z]{1,5}$"},
        "exchange": {"type": "string", "enum": ["NYSE", "NASDAQ"]}}, ["ticker"]),
    fn("lookup_order", "Look up an order.", {
        "order_id": {"type": "string", "format": "uuid"},
        "include_items": {"type": "boolean"},
        "limit": {"anyOf": [{"type": "integer", "minimum": 1, "maximum": 20},
                            {"type": "null"}]}}, ["order_id"]),
    fn("fetch_page", "Fetch a web page.", {
        "url": {"type": "string", "format": "uri"},
        "timeout_seconds": {"type": "number", "minimum": 1, "maximum": 60}}, ["url"]),
    fn("set_thermostat", "Set the thermostat.", {
        "temperature_celsius": {"type": "number", "minimum": 10, "maximum": 30},
        "schedule": {"type": "object", "properties": {
            "days": {"type": "array", "items": {"type": "string", "enum": ["mon", "tue", "wed"]},
                     "minItems": 1, "uniqueItems": True},
            "at": {"type": "string", "format": "time"}}, "required": ["days", "at"]}},
        ["temperature_celsius"]),
    fn("system_status", "Report the system status.", {}),
]


@pytest.fixture(scope="module")
def bfcl_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("bfcl") / "tools.json"
    path.write_text(json.dumps({"tools": BFCL_SHAPED}))
    return path


@pytest.fixture(scope="module")
def catalogue_run():
    """The test catalogue with its tools run (chains and answers), made once."""
    return synthesize(load_tools(CATALOGUE), SynthConfig(n_train=100, n_heldout=40))


def cli(*args):
    return subprocess.run([*CLI, "synth", *args], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, env={**os.environ})


def calls_of(task: dict) -> list[dict]:
    return task["check"].get("tool_calls") or []


def assert_valid(tools, synthesis):
    by_name = {t.name: t for t in tools}
    for t in synthesis.train + synthesis.heldout:
        for c in map(json.loads, t.calls):
            tool = by_name[c["name"]]
            assert tool.validate(c["arguments"]) == [], (t.task, tool.validate(c["arguments"]))
            strict = Draft202012Validator(tool.parameters,
                                          format_checker=Draft202012Validator.FORMAT_CHECKER)
            assert list(strict.iter_errors(c["arguments"])) == [], c


@pytest.mark.parametrize("name", ["catalogue", "echo", "debugger", "specialist", "bfcl"])
def test_every_call_is_schema_valid_and_every_tool_is_covered(name, bfcl_file):
    path = {"catalogue": CATALOGUE, "bfcl": bfcl_file,
            **{p.stem if p.stem != "tools" else "specialist": p for p in EXAMPLES}}[name]
    tools = load_tools(path)
    s = synthesize(tools, SynthConfig(n_train=80, n_heldout=40, run_tools=False))
    assert_valid(tools, s)
    assert s.report["skipped"] == {}
    args_only = [t for t in tools if t.properties]
    for side in (s.train, s.heldout):
        called = Counter(n for t in side if t.kind == "call" for n in t.tools)
        assert {t.name for t in args_only} <= set(called), called
    if name == "bfcl":  # the shapes really appear: nested objects, arrays of them, formats
        calls = [c for t in s.train for c in map(json.loads, t.calls)]
        flights = [c["arguments"] for c in calls if c["name"] == "book_flight"]
        assert all("@" in f["passenger"]["email"] for f in flights)
        events = [c["arguments"] for c in calls if c["name"] == "create_event"]
        assert all(1 <= len(e["attendees"]) <= 4 and e["duration_minutes"] % 15 == 0
                   for e in events if "duration_minutes" in e)
        assert any("notes" in f for f in flights) and any("notes" not in f for f in flights)
        assert all(re.fullmatch(r"[A-Z]{1,5}", c["arguments"]["ticker"]) for c in calls
                   if c["name"] == "get_stock_price")


def test_chains_and_answers_are_valid_and_use_real_results(catalogue_run):
    tools = load_tools(CATALOGUE)
    by_name = {t.name: t for t in tools}
    assert_valid(tools, catalogue_run)
    chains = [t for t in catalogue_run.train + catalogue_run.heldout if t.kind == "chain"]
    assert chains
    for t in chains:
        first, second = calls_of(t.task)
        result = run_tool(by_name[first["name"]], first["arguments"]).stdout.strip()
        assert result in {str(v) for v in second["arguments"].values()}, t.task
    answers = [t for t in catalogue_run.heldout if t.kind == "answer"]
    assert answers
    for t in answers:
        (c,) = map(json.loads, t.calls)
        result = run_tool(by_name[c["name"]], c["arguments"]).stdout.strip()
        assert re.search(t.task["check"]["answer_pattern"], f"The result is {result}.")
        assert not re.search(t.task["check"]["answer_pattern"], f"It is {result}0.")


def test_kinds_come_in_their_shares(catalogue_run):
    for side, n in ((catalogue_run.train, 100), (catalogue_run.heldout, 40)):
        kinds = Counter(t.kind for t in side)
        assert len(side) == n
        assert kinds["none"] == round(n * 0.15) and kinds["chain"] == round(n * 0.15)
        assert kinds["answer"] == round(n * 0.2) and kinds["call"] == n - sum(
            kinds[k] for k in ("none", "chain", "answer"))
    vocab = {w for t in load_tools(CATALOGUE) for w in words(t.name + " " + t.description)
             if len(w) > 3}
    for t in catalogue_run.train + catalogue_run.heldout:
        if t.kind == "none":
            assert t.task["check"] == {"tool_calls": []}
            assert not set(words(t.task["prompt"])) & vocab, t.task["prompt"]
        if t.kind == "chain":
            assert len(calls_of(t.task)) == 2


def test_a_share_too_small_for_one_catalogue_holds_over_many():
    """5% of 8 tasks is 0.4: rounded, no catalogue would get one; drawn, 1 in 2.5 does."""
    rng = random.Random(0)
    plans = [tasks_module.Plan.of(8, {"outside": 0.05, "none": 0.15}, {"call", "outside", "none"},
                                  rng).counts for _ in range(2000)]
    assert {p["outside"] for p in plans} == {0, 1} and {p["none"] for p in plans} == {1, 2}
    assert 0.045 < sum(p["outside"] for p in plans) / (8 * 2000) < 0.055
    assert all(sum(p.values()) == 8 for p in plans)


def test_a_plan_is_never_more_tasks_than_asked():
    """Each kind's fraction rounds up by chance, and for a few tasks the round-ups passed n:
    ``synth --n-train 1`` made 2 or 3 tasks for some seeds (and its progress passed its
    total)."""
    rng = random.Random(0)
    for n in (1, 2, 3):
        plans = [tasks_module.Plan.of(n, SynthConfig().shares(), set(tasks_module.KINDS),
                                      rng).counts for _ in range(500)]
        assert all(sum(p.values()) == n and min(p.values()) >= 0 for p in plans)
    done = []
    s = synthesize(load_tools(CATALOGUE), SynthConfig(n_train=1, n_heldout=1, seed=128),
                   done=done.append)  # a seed that made 3 training tasks
    assert (len(s.train), len(s.heldout), sum(done)) == (1, 1, 2)


def test_a_catalogue_without_results_gets_no_chains_or_answers():
    s = synthesize(load_tools(CATALOGUE), SynthConfig(n_train=40, n_heldout=20,
                                                      run_tools=False))
    assert {t.kind for t in s.train} == {"call", "none"}
    assert len(s.train) == 40 and s.report["answerable"] == []


def test_outside_requests_ask_for_a_tool_the_catalogue_lacks_and_expect_no_call():
    tools = load_tools(CATALOGUE)
    s = synthesize(tools, SynthConfig(n_train=40, n_heldout=20, run_tools=False,
                                      outside_share=0.2))
    vocab = tasks_module._vocabulary(tools)
    own = {t.name for t in tools}
    pool = {t.name: t for t in generated_tools(0)}
    for side, n in ((s.train, 40), (s.heldout, 20)):
        outside = [t for t in side if t.kind == "outside"]
        assert len(outside) == round(n * 0.2)
        for t in outside:
            (name,) = t.tools
            assert name in pool and name not in own
            w = words(name)  # past a leading verb, no word of its name is the catalogue's
            assert not {singular(x) for x in (w[1:] if w[0] in phrasing.VERBS else w)} & vocab
            assert t.task["check"] == {"tool_calls": []} and not t.calls
            assert t.asked["name"] == name and not pool[name].validate(t.asked["arguments"])
            assert phrasing.action_of(name) in t.task["prompt"].lower() or name in t.task[
                "prompt"] or phrasing.purpose(pool[name]) in t.task["prompt"]
            messages = write_conversation(t, {x.name: x for x in tools}, Outcomes(run=False),
                                          random.Random(0))
            assert [m["role"] for m in messages] == ["user", "assistant"]
            assert phrasing.action_of(name) in messages[1]["content"]
    assert s.report["overlap"]["values"] == 0 and s.report["overlap"]["prompts"] == 0
    asked = [{t.tools[0] for t in side if t.kind == "outside"} for side in (s.train, s.heldout)]
    assert asked[0] and asked[1] and not asked[0] & asked[1]
    assert s.report["overlap"]["outside tools"] == 0
    assert not [t for t in synthesize(tools, SynthConfig(n_train=40, n_heldout=20,
                                                         run_tools=False)).train
                if t.kind == "outside"]  # off by default


def test_no_tool_questions_with_numbers_are_answered_worked_out_unless_tools_do_arithmetic():
    weather = [fn("get_forecast", "Get the forecast for a city.",
                  {"city": {"type": "string"}}, ["city"])]
    calculator = weather + [fn("multiply", "Multiply two numbers.",
                               {"a": {"type": "number"}, "b": {"type": "number"}}, ["a", "b"])]
    config = SynthConfig(n_train=80, n_heldout=40, no_tool_share=0.5, run_tools=False)
    s = synthesize(declared_tools(weather), config)
    worked = [t for t in s.train + s.heldout if phrasing.WORKED & set(t.templates)]
    assert {t.kind for t in worked} == {"none"} and len(worked) >= 10
    for t in worked:
        assert t.task["check"] == {"tool_calls": []}
    answers = {t.task["prompt"]: conversations.no_tool_answer(t) for t in s.train
               if phrasing.WORKED & set(t.templates)}
    for prompt, answer in answers.items():
        a, b = (int(n) for n in (re.findall(r"\d+", prompt) + ["0"])[:2])
        expected = {"times": a * b, "area": a * b, "plus": a + b, "minutes": a * 60}
        said = next((v for k, v in expected.items() if k in prompt), None)
        if said is None:  # even or odd
            assert answer.startswith("Yes" if a % 2 == 0 else "No")
        else:
            assert str(said) in answer, (prompt, answer)
    s = synthesize(declared_tools(calculator), config)
    assert not [t for t in s.train + s.heldout if phrasing.WORKED & set(t.templates)]
    # every worked training template has its answer, keyed by the template it answers
    assert set(conversations.WORKED_ANSWERS) == {t for t in phrasing.WORKED
                                                 if t.startswith("none-a/")}


def test_flags_read_as_words_of_their_side():
    assert phrasing.flag("include_photos", True, pools.TRAIN) == "include photos"
    assert phrasing.flag("include_photos", False, pools.TRAIN) == "do not include photos"
    assert phrasing.flag("awayMode", False, pools.TRAIN) == "away mode off"
    assert phrasing.flag("include_photos", True, pools.HELDOUT) == "please include photos"
    assert phrasing.flag("away_mode", True, pools.HELDOUT) == "with away mode"
    train, held = ({phrasing.flag(n, v, side) for n in ("skip_x", "x_mode") for v in (True, False)}
                   for side in (pools.TRAIN, pools.HELDOUT))
    assert not train & held


def test_a_label_from_a_description_drops_its_article():
    # templates say "the {label}": "The text to count" must not read "the the text to count"
    schema = {"type": "string", "description": "The text to count."}
    labels = {phrasing.label("text", schema, random.Random(seed)) for seed in range(20)}
    assert labels == {"text to count", "text"}
    assert phrasing.label("x", {"description": "An ISO date"}, random.Random(1)) in {
        "ISO date", "x"}


def test_chain_connectors_are_many_and_none_is_shared_by_the_sides():
    train, held = (set(phrasing.CHAINS[side]["chain-a" if side == pools.TRAIN else "chain-b"])
                   for side in (pools.TRAIN, pools.HELDOUT))
    assert len(train) >= 6 and len(held) >= 2 and not train & held
    for template in train | held:
        assert {"{first}", "{second}", "{label}"} <= set(re.findall(r"{\w+}", template))


def test_a_value_that_names_itself_is_sometimes_said_without_its_label():
    weather = declared_tools([fn("get_forecast", "Get the forecast.", {
        "city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "kelvin"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 9}}, ["city"])])[0]
    trip = declared_tools([fn("plan_trip", "Plan a trip.", {
        "origin": {"type": "string"}, "destination": {"type": "string"}},
        ["origin", "destination"])])[0]
    args = {"city": "Denver", "unit": "kelvin", "days": 3}
    for side in pools.SIDES:
        style = phrasing.ARG_STYLES[side][0]
        forms = phrasing.BARE[side]
        texts = []
        for seed in range(60):
            used = []
            text = phrasing.args_text(args, weather.parameters, frozenset(),
                                      random.Random(seed), style, used)
            texts.append(text)
            # a value said without its label is a bare form recorded, in this side's words
            bare = {f"bare-{side}/{kind}" for kind, label in (("city", "city"), ("enum", "unit"))
                    if label not in text}
            assert bare == set(used)
            assert "bare-train/city" not in used or forms["city"].format(v="Denver") in text
            assert "bare-heldout/enum" not in used or forms["enum"].format(v="kelvin") in text
        assert any(forms["city"].format(v="Denver") in t for t in texts)
        assert any("unit" not in t for t in texts) and any("unit" in t for t in texts)
        assert any("city" in t for t in texts)
        # two values of one kind keep their labels: a bare city would not say which it is
        for seed in range(30):
            used = []
            text = phrasing.args_text({"origin": "Oslo", "destination": "Lima"},
                                      trip.parameters, frozenset(), random.Random(seed),
                                      style, used)
            assert not used and "origin" in text and "destination" in text
    assert not set(phrasing.BARE[pools.TRAIN].values()) & set(phrasing.BARE[pools.HELDOUT].values())


def test_a_parameter_name_picks_the_most_specific_value_kind():
    from mlx_agent.synth.values import kind_of

    text = {"type": "string"}
    kinds = {n: kind_of(n, text).pool for n in ("destination_country", "destination",
                                                "pickup_city", "user_id", "customer_email")}
    assert kinds == {"destination_country": "country", "destination": "city",
                     "pickup_city": "city", "user_id": "id", "customer_email": "email"}


def test_a_city_and_state_parameter_gets_the_whole_place_comma_and_all():
    from mlx_agent.synth.catalogues import generate_tools
    from mlx_agent.synth.values import Sampler

    weather = declared_tools([fn("get_current_weather", "Get the current weather.", {
        "location": {"type": "string",
                     "description": "The city and state, e.g. San Francisco, CA"},
        "city": {"type": "string", "description": "The city and country"},
        "town": {"type": "string", "description": "A town"}}, ["location", "city", "town"])])
    rng = random.Random(0)
    for side in pools.SIDES:
        sampler = Sampler(rng, side)
        drawn = [sampler.arguments(weather[0]) for _ in range(40)]
        assert {a["location"] for a in drawn} <= set(pools.split(pools.STATE_PLACES, side))
        assert {a["city"] for a in drawn} <= set(pools.split(pools.COUNTRY_PLACES, side))
        assert {a["town"] for a in drawn} <= set(pools.split(pools.CITIES, side))
    # generated catalogues ask for places in some city fields, never with a value as example
    asked = [p["description"] for _, t in generate_tools(0)
             for p in t["function"]["parameters"]["properties"].values()
             if ": the city and " in p.get("description", "")]
    assert len(asked) >= 10
    examples = {e for es in pools.PLACE_EXAMPLES.values() for e in es}
    assert {d.split("e.g. ")[1] for d in asked} <= examples
    assert not examples & set(pools.STATE_PLACES + pools.COUNTRY_PLACES)


def test_an_outside_tool_may_share_only_a_leading_verb_with_the_catalogue():
    def tool(name):
        return declared_tools([fn(name, "Does a thing.", {})])[0]

    catalogue = [tool("create_standing_order"), tool("get_balance")]
    pool = [tool("get_weather"), tool("create_purchase_order"), tool("order_pizza"),
            tool("list_orders")]
    names = [t.name for t in tasks_module.outside_tools(catalogue, pool)]
    assert names == ["get_weather", "order_pizza"]  # "order" leads as a verb: allowed


def test_held_out_shares_no_value_template_prompt_or_call(catalogue_run, bfcl_file):
    for tools, s in ((load_tools(CATALOGUE), catalogue_run),
                     (load_tools(bfcl_file), synthesize(load_tools(bfcl_file), SynthConfig(
                         n_train=120, n_heldout=60, run_tools=False)))):
        by_name = {t.name: t for t in tools}

        def values(side):  # recomputed from the calls, not taken from the generator
            return {v for t in side for c in map(json.loads, t.calls)
                    for v in free_leaves(by_name[c["name"]].parameters, c["arguments"])}

        train, held = values(s.train), values(s.heldout)
        assert len(train) > 50 and len(held) > 20  # not vacuous
        assert not train & held
        assert not {t.task["prompt"] for t in s.train} & {t.task["prompt"] for t in s.heldout}
        assert not {c for t in s.train for c in t.calls} & {c for t in s.heldout for c in t.calls}
        assert not {i for t in s.train for i in t.templates} & {
            i for t in s.heldout for i in t.templates}
        assert s.report["overlap"] == {"values": 0, "templates": 0, "prompts": 0, "calls": 0,
                                       "outside tools": 0}
    assert not phrasing.template_ids(pools.TRAIN) & phrasing.template_ids(pools.HELDOUT)
    for pool in (pools.CITIES, pools.PEOPLE, pools.SENTENCES, pools.TOPICS):
        assert not set(pools.split(pool, pools.TRAIN)) & set(pools.split(pool, pools.HELDOUT))


def test_path_arguments_name_the_fixtures_files_split_between_the_sides(tmp_path):
    """With the tools' directory known (specialize --fixture), a path parameter draws the
    files that exist there, training and held-out tasks naming different ones."""
    from mlx_agent.synth.values import files_under

    for i in range(8):
        (tmp_path / "docs" / f"d{i}").mkdir(parents=True)
        (tmp_path / "docs" / f"d{i}" / f"notes{i}.txt").write_text(str(i))
    (tmp_path / ".hidden").write_text("x")
    files = files_under(tmp_path)
    assert len(files) == 8 and all(f.startswith("docs/d") for f in files)
    read = fn("read_file", "Read a text file.", {"path": {"type": "string",
                                                         "description": "File to read"}},
              required=["path"])
    tools_file = tmp_path / "tools.json"
    tools_file.write_text(json.dumps([read]))
    s = synthesize(load_tools(tools_file), SynthConfig(n_train=20, n_heldout=10,
                                                       run_tools=False, files=files))

    def paths(side):
        return {json.loads(c)["arguments"]["path"] for t in side for c in t.calls}

    assert paths(s.train) <= set(files) and paths(s.heldout) <= set(files)
    assert paths(s.train) and paths(s.heldout) and not paths(s.train) & paths(s.heldout)


def test_cli_is_deterministic_and_eval_loads_what_it_writes(tmp_path):
    outs = {}
    for name, seed in (("a", "3"), ("b", "3"), ("c", "4")):
        r = cli("--tools", str(CATALOGUE), "--out", str(tmp_path / name), "--seed", seed,
                "--n-train", "50", "--n-heldout", "20")
        assert r.returncode == 0, r.stderr
        outs[name] = {p.name: p.read_bytes() for p in (tmp_path / name).iterdir()}
    assert set(outs["a"]) == {"train.jsonl", "heldout.jsonl", "tools.json", "report.json"}
    assert outs["a"] == outs["b"]
    assert outs["a"]["train.jsonl"] != outs["c"]["train.jsonl"]
    assert outs["a"]["tools.json"] == CATALOGUE.read_bytes()
    assert "values 0, templates 0, prompts 0, calls 0, outside tools 0" in r.stdout
    progress = r.stderr.splitlines()  # a line a task on a pipe, as eval's
    assert len(progress) == 70 and progress[0].startswith("synth 1/70 1% ")
    assert progress[-1].startswith("synth 70/70 100% ") and " in 0:" in progress[-1]
    for split, n in (("train", 50), ("heldout", 20)):
        tasks = load_tasks(tmp_path / "a" / f"{split}.jsonl")
        assert len(tasks) == n and all(t.tools == "tools.json" for t in tasks)
    report = json.loads(outs["a"]["report.json"])
    assert report["overlap"] == {"values": 0, "templates": 0, "prompts": 0, "calls": 0,
                                 "outside tools": 0}


def test_eval_runs_synthesised_tasks(tiny_lm, tmp_path):
    """A scripted model on a call task and two no-tool tasks: the right call passes, an
    answer passes the no-tool task, and a call fails it."""
    from .test_agent_loop import Script

    s = synthesize(load_tools(CATALOGUE), SynthConfig(n_train=20, n_heldout=10,
                                                      run_tools=False))
    call = next(t.task for t in s.heldout if t.kind == "call")
    none = next(t.task for t in s.heldout if t.kind == "none")
    path = tmp_path / "tasks.jsonl"
    again = {**none, "id": none["id"] + "-again"}  # ids are unique in a tasks file
    path.write_text("".join(json.dumps(t) + "\n" for t in (call, none, again)))
    (tmp_path / "tools.json").write_bytes(CATALOGUE.read_bytes())
    (want,) = calls_of(call)
    replies = [json.dumps({"tool": want["name"], "arguments": want["arguments"]}),
               '{"answer": "done"}', '{"answer": "Happy to help."}',
               '{"tool": "search_web", "arguments": {"query": "x"}}', '{"answer": "ok"}']
    script = Script(tiny_lm, *replies)
    summary = run(tiny_lm, path, config_overrides={"grammar": False, "max_steps": 2},
                  sampler_for=lambda seed: script)
    assert [r.reward for r in summary.runs] == [1.0, 1.0, 0.0]


def test_cli_bad_input_is_one_line_and_writes_nothing(tmp_path):
    out = tmp_path / "out"
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    cases = [("--tools", str(tmp_path / "missing.json"), "--out", str(out)),
             ("--tools", str(bad), "--out", str(out)),
             ("--tools", str(CATALOGUE), "--out", str(out), "--no-tool-share", "0.6",
              "--answer-share", "0.6")]
    for args in cases:
        r = cli(*args)
        assert r.returncode == 2, r.stderr
        assert "Traceback" not in r.stderr and r.stderr.strip()
        assert not out.exists()
    blocker = tmp_path / "file"
    blocker.write_text("x")
    r = cli("--tools", str(CATALOGUE), "--out", str(blocker / "sub"), "--no-run-tools")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "cannot create the directory" \
        in r.stderr
    # a file that cannot be replaced: none of the others appear either
    (out / "report.json").mkdir(parents=True)
    r = cli("--tools", str(CATALOGUE), "--out", str(out), "--no-run-tools")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert sorted(p.name for p in out.iterdir()) == ["report.json"]


def test_odd_schemas_are_sampled_or_skipped_with_a_reason(tmp_path):
    odd = [fn("anything", "Takes anything.", {"x": True, "y": {"type": "string"}},
              ["y"]),
           fn("never", "Cannot be called.", {"z": {"enum": []}}, ["z"]),
           # drawn from the pattern, the one range value, four decimals: all three were
           # skipped ("no pool value satisfies its schema", "no number in range")
           fn("strict_code", "Needs a code.", {"code": {"type": "string",
                                                        "pattern": "^zz[0-9]{9}$"}}, ["code"]),
           fn("book", "Book a day.", {"day": {"type": "string",
                                              "pattern": "^\\d{2}/\\d{2}/\\d{4}$"}}, ["day"]),
           fn("level", "Set the level.", {"n": {"type": "number", "minimum": 5, "maximum": 5}},
              ["n"]),
           fn("dose", "Set a dose.", {"mg": {"type": "number", "minimum": 0.001,
                                             "maximum": 0.004}}, ["mg"]),
           fn("ping", "Ping the host.", {}),
           # a hostile tester's: memory until the process was killed, an OverflowError
           fn("huge", "Many items.", {"x": {"type": "array", "minItems": 10**9,
                                            "items": {"type": "string"}}}, ["x"]),
           fn("fine", "Fine steps.", {"y": {"type": "number", "multipleOf": 1e-300,
                                            "minimum": 0, "maximum": 1e300}}, ["y"]),
           # valid JSON Schema the tool-call grammar cannot be built from: its tasks were
           # written, and agent and eval refused them at start-up
           fn("other", "Anything but a.", {"x": {"type": "string", "not": {"enum": ["a"]}}},
              ["x"])]
    path = tmp_path / "odd.json"
    path.write_text(json.dumps(odd))
    tools = load_tools(path)
    s = synthesize(tools, SynthConfig(n_train=30, n_heldout=30, run_tools=False))
    assert sorted(s.report["skipped"]) == ["fine", "huge", "never", "other"]
    assert "more than synthesis writes (64)" in s.report["skipped"]["huge"]
    called = {c["name"]: c["arguments"] for t in s.train + s.heldout
              for c in t.task["check"].get("tool_calls", [])}
    assert {"strict_code", "book", "level", "dose"} <= set(called), sorted(called)
    assert called["level"] == {"n": 5} and re.fullmatch(r"\d\d/\d\d/\d{4}", called["book"]["day"])
    assert s.report["skipped"]["other"] == ("the tool-call grammar cannot be built from its "
                                           'schema (Unimplemented keys: ["not"])')
    assert_valid(tools, s)
    # every call of "ping" is {}, so it is training's alone; the held-out side stops short
    assert not any("ping" in t.tools for t in s.heldout)
    assert s.report["heldout"]["tasks"] == len(s.heldout)
    assert {t.kind for t in s.train} == {"call", "none"}


def test_local_refs_are_followed_as_pydantic_writes_them(tmp_path):
    """Pydantic (and so FastMCP) puts every enum and nested model in $defs behind a $ref:
    each such tool was skipped ("$ref is not followed"), a catalogue of them made no call."""
    defs = {"Unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "Place": {"type": "object", "properties": {
                "city": {"type": "string", "description": "The city"},
                "country": {"$ref": "#/$defs/Country"}}, "required": ["city", "country"]},
            "Country": {"type": "string", "maxLength": 40},
            "Node": {"type": "object", "properties": {  # recursive, with a way out
                "label": {"type": "string"},
                "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}}},
                "required": ["label"]}}
    weather = fn("get_weather", "Get the weather for a place.",
                 {"place": {"$ref": "#/$defs/Place"},
                  "unit": {"$ref": "#/$defs/Unit", "description": "Temperature unit"},
                  "days": {"anyOf": [{"$ref": "#/$defs/Days"}, {"type": "null"}]}},
                 ["place", "unit"])
    tree = fn("add_tree", "Add a tree of labels.", {"root": {"$ref": "#/$defs/Node"}},
              ["root"])
    weather["function"]["parameters"]["$defs"] = {
        **defs, "Days": {"type": "integer", "minimum": 1, "maximum": 14}}
    tree["function"]["parameters"]["$defs"] = defs
    path = tmp_path / "pydantic.json"
    path.write_text(json.dumps([weather, tree]))
    tools = load_tools(path)
    s = synthesize(tools, SynthConfig(n_train=30, n_heldout=12, run_tools=False))
    assert s.report["skipped"] == {}
    assert_valid(tools, s)
    assert {t.tools for t in s.heldout if t.kind == "call"} == {("get_weather",),
                                                                ("add_tree",)}
    # an enum behind a $ref is the schema's, not a value the sides keep apart
    assert not any('"celsius"' in t.values or '"fahrenheit"' in t.values
                   for t in s.train + s.heldout)


def test_a_tool_whose_first_draw_fails_is_drawn_again_not_skipped(tmp_path):
    """"An id or an email" (anyOf of required lists, every property optional) fails when
    the sampler leaves both out; one such probe skipped the tool for the whole catalogue
    (seed 5), though the tasks draw again until arguments validate."""
    either = fn("get_user", "Look up a user by id or by email.",
                {"user_id": {"type": "string"}, "email": {"type": "string", "format": "email"}})
    either["function"]["parameters"]["anyOf"] = [{"required": ["user_id"]},
                                                 {"required": ["email"]}]
    path = tmp_path / "either.json"
    path.write_text(json.dumps([either]))
    tools = load_tools(path)
    for seed in range(8):
        s = synthesize(tools, SynthConfig(n_train=6, n_heldout=2, seed=seed, run_tools=False))
        assert s.report["skipped"] == {}, (seed, s.report["skipped"])
        assert s.report["train"]["kinds"]["call"] > 0
        assert_valid(tools, s)


def test_a_catalogue_of_unusable_tools_gets_only_no_tool_tasks_and_ends(tmp_path):
    """With no tool that can be given arguments, the call slots are skipped (they looped
    forever over an empty list of tools)."""
    never = tmp_path / "never.json"
    never.write_text(json.dumps([fn("never", "Cannot be called.", {"z": {"enum": []}}, ["z"])]))
    r = cli("--tools", str(never), "--out", str(tmp_path / "out"), "--n-train", "20",
            "--n-heldout", "5")
    assert r.returncode == 0, r.stderr
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert list(report["skipped"]) == ["never"]
    assert report["train"]["kinds"]["call"] == 0 and report["train"]["kinds"]["none"] > 0


def test_a_ctrl_c_while_the_files_are_renamed_leaves_all_four_or_none(tmp_path, monkeypatch):
    """The four files are renamed into place one after another: a Ctrl-C (or SIGTERM) that
    came between two renames left some new and others missing. It now waits for the last."""
    import os
    import signal

    from mlx_agent import fileio
    from mlx_agent.synth.synthesis import Synthesis, write

    real, renamed = os.replace, []

    def replace(src, dst):  # the first rename done, the signal comes
        real(src, dst)
        renamed.append(dst)
        if len(renamed) == 1:
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(fileio.os, "replace", replace)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            write(Synthesis([], [], {}), b"[]", tmp_path / "out")
    finally:
        signal.signal(signal.SIGINT, previous)
    assert len(renamed) == 4
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == \
        ["heldout.jsonl", "report.json", "tools.json", "train.jsonl"]


@pytest.mark.parametrize("pattern", [
    r"^\d{2}/\d{2}/\d{4}$", r"^[A-Z]{2}[0-9]{3,4}$", r"^(ab|cd)\w+\s?.[^x]$", r"ORD-\d{6}",
    r"^[a-z0-9._%+-]+@[a-z0-9.-]+\.[a-z]{2,}$", r"^#[0-9a-fA-F]{6}$", r"^v\d+(\.\d+){2}$",
    r"^(?:[01]\d|2[0-3]):[0-5]\d$", r"^[^\s]+$", r"^\+?[1-9]\d{1,14}$", r"^[A-Z][a-z]*?$"])
def test_a_pattern_draws_strings_that_match_it(pattern):
    from mlx_agent.synth import patterns

    drawn = [patterns.draw(pattern, random.Random(seed)) for seed in range(20)]
    assert all(re.search(pattern, v) for v in drawn), drawn
    assert drawn == [patterns.draw(pattern, random.Random(seed)) for seed in range(20)]
    assert len(set(drawn)) > 1 or pattern.count("[") == 0
    with pytest.raises(patterns.NoMatch):
        patterns.draw("^(unclosed$", random.Random(0))
    for hostile in ("^a{10000}$", r"^((\b{999}){999}){999}$", "^((a{999}){999}){999}$"):
        with pytest.raises(patterns.NoMatch):  # no 10,000-character strings, no hang
            patterns.draw(hostile, random.Random(0))



def test_a_hostile_pattern_is_drawn_or_refused_at_once(tmp_path):
    """A repeat of an empty group walked nothing and so spent nothing of the step budget
    ('(?:){99999999}': 43 s a draw, synth hung on the tool), and a class was listed again at
    each character drawn (6,000 ranges, 200 characters: 94 s). Each now ends at once."""
    import time

    from mlx_agent.synth import patterns

    huge = "^[" + "".join(f"\\u{i:04x}-\\u{i + 999:04x}" for i in range(256, 60000, 10)) + \
        "]{200}$"
    start = time.perf_counter()
    assert re.search(huge, patterns.draw(huge, random.Random(0)))
    with pytest.raises(patterns.NoMatch):
        patterns.draw("^(?:){99999999}$", random.Random(0))
    assert time.perf_counter() - start < 10  # about 0.1 s
    tools = tmp_path / "hostile.json"
    # (the tools file refuses '(?:){99999999}' itself now, as regex compiles it for
    # minutes; 30,000 turns it still takes, and the draw's budget refuses)
    tools.write_text(json.dumps([fn("empty", "Nothing repeated.", {
        "z": {"type": "string", "pattern": "^(?:){30000}$"}}, ["z"])]))
    start = time.perf_counter()
    r = cli("--tools", str(tools), "--out", str(tmp_path / "out"), "--n-train", "6",
            "--n-heldout", "2", "--no-run-tools")
    assert r.returncode == 0, r.stderr
    assert time.perf_counter() - start < 30  # about 2 s
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["skipped"] == {"empty": "z: no pool value satisfies its schema"}
