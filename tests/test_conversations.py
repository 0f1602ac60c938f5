"""Conversations written from synthesised tasks: real results, no-tool answers, chains, and
rows token-exact with the agent's own rollout of the same conversation."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest

from mlx_agent import trajectory as tj
from mlx_agent.agent import agent_format
from mlx_agent.evaluate import run
from mlx_agent.synth.config import SynthConfig
from mlx_agent.synth.conversations import Outcomes, rows, write_conversation
from mlx_agent.synth.synthesis import synthesize
from mlx_agent.tools import load_tools, parse_tools

from .test_agent_loop import Script
from .test_written_rows import with_reply_ends

CATALOGUE = Path(__file__).resolve().parent / "data" / "catalogue.json"


@pytest.fixture(scope="module")
def made():
    tools = load_tools(CATALOGUE)
    return tools, synthesize(tools, SynthConfig(n_train=60, n_heldout=10))


def conversations(tools, tasks, outcomes=None, seed=0):
    outcomes = outcomes or Outcomes(seed=seed)
    by_name, rng = {t.name: t for t in tools}, random.Random(seed)
    return [write_conversation(t, by_name, outcomes, rng) for t in tasks]


def tool_stdout(message: dict) -> str:
    return json.loads(message["content"])["stdout"]


def test_real_results_are_used_and_the_answer_states_them(made):
    tools, s = made
    adds = [t for t in s.train if t.tools == ("add_numbers",)]
    outcomes = Outcomes()
    for task, conv in zip(adds, conversations(tools, adds, outcomes)):
        call = json.loads(conv[1]["tool_calls"][0]["function"]["arguments"])
        assert [m["role"] for m in conv] == ["user", "assistant", "tool", "assistant"]
        assert tool_stdout(conv[2]) == f"{call['a'] + call['b']}\n"  # the tool really ran
        assert str(call["a"] + call["b"]) in conv[3]["content"]
        if task.kind == "answer":  # the task's own check passes on the written answer
            assert re.search(task.task["check"]["answer_pattern"], conv[3]["content"])
    assert outcomes.counts == {"real": len(adds)}


def test_a_tool_that_fails_or_cannot_run_gets_a_synthesised_result(made):
    tools, s = made
    reads = [t for t in s.train if t.tools == ("read_file",)][:3]  # cat of a missing file
    outcomes = Outcomes()
    convs = conversations(tools, reads, outcomes)
    assert outcomes.counts == {"synthesised": 3}
    for conv in convs:
        said = tool_stdout(conv[2]).strip()
        assert said and said in conv[3]["content"]
    # not run at all: the same calls get the same made-up results, seed by seed
    again = conversations(tools, reads, Outcomes(run=False))
    assert [c[2] for c in again] == [c[2] for c in convs]
    other = conversations(tools, reads, Outcomes(run=False, seed=1), seed=1)
    assert [c[2] for c in other] != [c[2] for c in convs]


def test_no_tool_tasks_get_a_direct_answer_and_no_call(made):
    tools, s = made
    nones = [t for t in s.train if t.kind == "none"]
    assert nones
    for task, conv in zip(nones, conversations(tools, nones)):
        assert [m["role"] for m in conv] == ["user", "assistant"]
        assert "tool_calls" not in conv[1] and conv[1]["content"].strip()


def test_two_call_tasks_pass_the_first_result_to_the_second_call(made):
    tools, s = made
    chains = [t for t in s.train if t.kind == "chain"]
    assert chains
    for conv in conversations(tools, chains):
        assert [m["role"] for m in conv] == ["user", "assistant", "tool", "assistant", "tool",
                                             "assistant"]
        first = tool_stdout(conv[2]).strip()
        second = json.loads(conv[3]["tool_calls"][0]["function"]["arguments"])
        assert first in map(str, second.values())
        assert tool_stdout(conv[4]).strip() in conv[5]["content"]


def test_rows_are_token_exact_with_the_agents_rollout(tiny_lm, made, tmp_path):
    """The agent replays each written conversation (a scripted model writing its replies,
    the tools running for real); its trajectory's ids and mask equal the written row's."""
    tools, s = made
    tasks = [next(t for t in s.train if t.kind == k and "read_file" not in t.tools)
             for k in ("call", "chain", "none")]  # read_file fails here: a made-up result
    fmt = agent_format("json", tiny_lm)
    written = rows(tiny_lm, fmt, tools, tasks, Outcomes())
    (tmp_path / "tools.json").write_bytes(CATALOGUE.read_bytes())
    for task, row in zip(tasks, written):
        path = tmp_path / f"{task.kind}.jsonl"
        path.write_text(json.dumps({**task.task, "check": {"answer_pattern": ""}}) + "\n")
        replies = [fmt.reply_text(m) for m in row["messages"] if m["role"] == "assistant"]
        traj_dir = tmp_path / task.kind
        script = Script(tiny_lm, *replies)
        run(tiny_lm, path, protocol="json", trajectory_dir=traj_dir,
            config_overrides={"grammar": False, "max_steps": 3},
            sampler_for=lambda seed: script)
        ids, mask = with_reply_ends(tiny_lm, *tj.read(next(traj_dir.glob("*.atraj"))).replay())
        assert (row["input_ids"], row["loss_mask"]) == (ids, mask), task.kind
        learned = tiny_lm.decode([t for t, m in zip(ids, mask) if m])
        assert "stdout" not in learned and task.task["prompt"] not in learned  # replies only


def test_rows_are_deterministic_under_a_seed(tiny_lm, made):
    tools, s = made
    fmt = agent_format("json", tiny_lm)
    a, b = (rows(tiny_lm, fmt, tools, s.train[:12], Outcomes(), seed=3) for _ in range(2))
    c = rows(tiny_lm, fmt, tools, s.train[:12], Outcomes(), seed=4)
    assert a == b and a != c


def test_tasks_asked_in_turn_share_a_row_and_every_reply_is_trained(tiny_lm, made):
    """``per_row``: one conversation asks several tasks in turn; the system prompt is paid
    once, every task is in exactly one row, and the mask covers each reply and nothing else."""
    tools, s = made
    fmt = agent_format("json", tiny_lm)
    tasks = s.train[:10]
    single = rows(tiny_lm, fmt, tools, tasks, Outcomes())
    packed = rows(tiny_lm, fmt, tools, tasks, Outcomes(), per_row=4)
    assert [len(r["task"].split(",")) for r in packed] == [4, 4, 2]
    assert sorted(i for r in packed for i in r["task"].split(",")) == sorted(
        r["task"] for r in single)
    assert sum(len(r["input_ids"]) for r in packed) < 0.6 * sum(
        len(r["input_ids"]) for r in single)
    prompts = {t.task["id"]: t.task["prompt"] for t in tasks}
    end = min(tiny_lm.stop_ids)
    for r in packed:
        asked = [m["content"] for m in r["messages"] if m["role"] == "user"]
        assert asked == [prompts[i] for i in r["task"].split(",")]
        replies = [m for m in r["messages"] if m["role"] == "assistant"]
        learned = [t for t, m in zip(r["input_ids"], r["loss_mask"]) if m]
        assert learned == [t for m in replies
                           for t in tiny_lm.encode_text(fmt.reply_text(m)) + [end]]
        assert tiny_lm.decode(r["input_ids"]).count("<|im_start|>system") == 1


PERSON = {"type": "object", "required": ["name", "age"],
          "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}}


@pytest.mark.parametrize("who, defs", [(PERSON, None),  # behind a $ref, as Pydantic has it
                                       ({"$ref": "#/$defs/Person"}, {"Person": PERSON})])
def test_arguments_keep_the_schema_order_in_nested_objects(who, defs):
    parameters = {"type": "object", "required": ["who", "room"],
                  "properties": {"who": who, "room": {"type": "string"}}}
    if defs:
        parameters["$defs"] = defs
    tools = parse_tools(json.dumps([{"name": "book", "description": "Book a room.",
                                     "_exec": "echo booked", "parameters": parameters}]))
    s = synthesize(tools, SynthConfig(n_train=6, n_heldout=2, run_tools=False))
    call = next(t for t in s.train if t.calls)
    conv = conversations(tools, [call])[0]
    text = conv[1]["tool_calls"][0]["function"]["arguments"]
    assert text.index('"who"') < text.index('"name"') < text.index('"age"') < text.index('"room"')
    assert json.loads(text) == json.loads(call.calls[0])["arguments"]
    assert "booked" in conv[3]["content"]  # run=True by default: the real result


def test_a_slipped_task_trains_the_recovery_and_not_the_mistake(tiny_lm, made):
    """``slip_share``: the first call miscopies a string the request gives, its result says
    the value was not found, and the right call follows; the mask leaves the mistake out and
    covers the recovery and the answer, the same tokens as the unslipped row's replies."""
    tools, s = made
    fmt = agent_format("json", tiny_lm)
    tasks = [t for t in s.train if t.kind == "call" and "get_weather" in t.tools][:6]
    plain = rows(tiny_lm, fmt, tools, tasks, Outcomes())
    slipped = rows(tiny_lm, fmt, tools, tasks, Outcomes(), slip_share=1.0)
    end = min(tiny_lm.stop_ids)
    for before, after in zip(plain, slipped):
        roles = [m["role"] for m in after["messages"]]
        assert roles == ["user", "assistant", "tool"] + roles[1:4], roles
        wrong, right = (json.loads(m["tool_calls"][0]["function"]["arguments"])
                        for m in (after["messages"][1], after["messages"][3]))
        (key,) = [k for k in right if wrong[k] != right[k]]
        assert wrong.keys() == right.keys() and right[key] in after["messages"][0]["content"]
        error = json.loads(after["messages"][2]["content"])
        assert error["exit_code"] == 1 and wrong[key] in error["stderr"]
        learned = [t for t, m in zip(after["input_ids"], after["loss_mask"]) if m]
        trained = [m for m in after["messages"][3:] if m["role"] == "assistant"]
        assert learned == [t for m in trained
                           for t in tiny_lm.encode_text(fmt.reply_text(m)) + [end]]
        assert after["messages"][3:] == before["messages"][1:]
    # asked in turn in one row: each task's mistake is left out, wherever it falls
    packed = rows(tiny_lm, fmt, tools, tasks, Outcomes(), per_row=3, slip_share=1.0)
    for r in packed:
        replies = [m for m in r["messages"] if m["role"] == "assistant"]
        mistakes = [m for m in replies if m.get("tool_calls") and
                    m["tool_calls"][0]["id"] == "call_slip"]
        assert len(mistakes) == len(r["task"].split(",")) > 1
        learned = [t for t, m in zip(r["input_ids"], r["loss_mask"]) if m]
        assert learned == [t for m in replies if m not in mistakes
                           for t in tiny_lm.encode_text(fmt.reply_text(m)) + [end]]


def test_a_slip_leaves_values_the_grammar_fixes_alone(made):
    """An enum's value is never the one miscopied: the grammar would not let it be."""
    from mlx_agent.synth.conversations import slip

    tools, s = made
    by_name = {t.name: t for t in tools}
    rng = random.Random(1)
    mistakes = [m for t in s.train if "get_weather" in t.tools
                if (m := slip(t, by_name, rng))]
    assert len(mistakes) >= 3  # the city is miscopied instead
    for mistake in mistakes:
        wrong = json.loads(mistake[0]["tool_calls"][0]["function"]["arguments"])
        assert wrong.get("unit") in (None, "celsius", "fahrenheit")


def test_misspelt_values_are_never_the_value():
    from mlx_agent.synth.conversations import misspelt

    rng = random.Random(0)
    for value in ("Paris", "WOR-6312", "2024-07-03", "New York", "abcd", "aaaa"):
        for _ in range(50):
            assert misspelt(value, rng) not in (value, "")


def written_calls(lm, protocol: str, parameters: dict) -> tuple[list, list[str]]:
    """A tool of ``parameters`` and the calls its training rows write, as reply text."""
    from dataclasses import replace

    from mlx_agent.chat import ChatFormat

    from .test_agent_loop import QWEN_LIKE

    tools = parse_tools(json.dumps([{"name": "book", "description": "Book seats.",
                                     "_exec": "echo booked", "parameters": parameters}]))
    lm = lm if protocol == "json" else replace(lm, chat=ChatFormat(QWEN_LIKE))
    fmt = agent_format(protocol, lm)
    s = synthesize(tools, SynthConfig(n_train=30, n_heldout=6, run_tools=False))
    written = rows(lm, fmt, tools, [t for t in s.train if t.calls], Outcomes(run=False))
    replies = [fmt.reply_text(m) for r in written for m in r["messages"]
               if m["role"] == "assistant"]
    return lm, tools, [r for r in replies if "book" in r]


def assert_the_grammar_writes(lm, protocol: str, tools, text: str) -> None:
    """``text`` is a reply the agent could write under its grammar: each of its tokens is
    in the mask, as the engine samples them."""
    from mlx_agent.grammar import tool_constraint

    constraint = tool_constraint(lm, protocol, tools, 256)
    ids = lm.encode_text(text)
    for k, token in enumerate(ids):
        words = constraint.mask_words()
        assert int(words[token // 32]) >> (token % 32) & 1, (text, lm.decode(ids[:k + 1]))
        constraint.consume(token)
    assert constraint.matcher.is_accepting(), text


@pytest.mark.parametrize("protocol", ["json", "hermes"])
def test_written_numbers_are_spelt_as_the_grammar_spells_them(tiny_lm, protocol):
    # the grammar writes an integer enum's 1.0 as 1 and refused 2.5 for a multipleOf of
    # 0.25 (llguidance took 2.50); the rows wrote 1.0 and 2.5, which no agent could write
    lm, tools, calls = written_calls(tiny_lm, protocol, {
        "type": "object", "required": ["seats", "area"], "properties": {
            "seats": {"type": "integer", "enum": [1.0, 2.0]},
            "area": {"type": "string", "enum": ["stalls", "circle"]},
            "price": {"type": "number", "multipleOf": 0.25, "minimum": 0, "maximum": 100},
            "tip": {"type": "number", "multipleOf": 0.00001, "minimum": 0.00001,
                    "maximum": 0.00009}}})  # json.dumps writes 3e-05: no exponent here
    assert len(calls) >= 10 and all(any(f'"{p}"' in c for c in calls) for p in ("price", "tip"))
    for text in calls:
        assert_the_grammar_writes(lm, protocol, tools, text)


@pytest.mark.parametrize("protocol", ["json", "hermes"])
def test_written_arguments_come_in_the_order_the_grammar_writes_them(tiny_lm, protocol):
    # the json protocol writes the required arguments first, then the others alphabetically
    # (its prompt lists them so); its rows wrote the schema's order, which it refuses
    lm, tools, calls = written_calls(tiny_lm, protocol, {
        "type": "object", "required": ["room", "day"], "properties": {
            "zone": {"type": "string", "enum": ["north", "south"]},
            "day": {"type": "string", "enum": ["monday", "friday"]},
            "floor": {"type": "integer", "minimum": 1, "maximum": 9},
            "room": {"type": "string", "enum": ["A1", "B2"]}}})
    assert len(calls) >= 10 and any('"zone"' in c and '"floor"' in c for c in calls)
    for text in calls:
        assert_the_grammar_writes(lm, protocol, tools, text)


def test_a_tool_runs_with_the_numbers_the_agent_would_pass(tiny_lm):
    # the agent reads the 1 its grammar writes for an enum's 1.0 as 1; the rows ran the
    # tool with 1.0 and stated its "1.0" in the trained answer
    tools = parse_tools(json.dumps([{"name": "book", "description": "Book seats.",
                                     "_exec": 'echo "booked $seats seats"', "parameters": {
                                         "type": "object", "required": ["seats"],
                                         "properties": {"seats": {"type": "integer",
                                                                  "enum": [1.0, 2.0]}}}}]))
    s = synthesize(tools, SynthConfig(n_train=10, n_heldout=2))
    said = [m["content"] for c in conversations(tools, [t for t in s.train if t.calls])
            for m in c if m["role"] == "tool"]
    assert said and all(re.search(r"booked [12] seats", t) for t in said), said
