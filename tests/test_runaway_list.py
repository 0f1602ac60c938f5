"""A call cut off by a list that repeats itself: closed, finished and run.

The default adapter, asked for "a DNA sequence with 100 bases including more G and C",
wrote ``"preferences": ["G", "C", "G", "C", "C", "C", ...`` until its 256 tokens ran out,
and the reply was no call at all.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from mlx_agent.agent import Agent, AgentConfig, agent_format
from mlx_agent.agent import events as ev
from mlx_agent.chat import ChatFormat
from mlx_agent.formats.scanner import (RUNAWAY_REPEATS, JsonObjectScanner, RunawayListScanner,
                                        ToolCallScanner)
from mlx_agent.runaway_list import runaway_cut
from mlx_agent.tools import parse_tools

from .test_agent_loop import QWEN_LIKE, Recorder
from .test_loop_guard import Obliging
from .test_serve import serve, user  # noqa: F401  (the serve fixture)

OPEN = '{"tool":"t","arguments":{"q":'


@pytest.mark.parametrize("text, expected", [
    (OPEN + '["G","C","G","C","G","C","C","C","C","', OPEN + '["G","C"]}}'),
    (OPEN + '["SERPENT","SERPENT","SERPENT","SERPENT","SERP', OPEN + '["SERPENT"]}}'),
    (OPEN + '[1,1,2,3,3,3,3,3,', OPEN + '[1,1,2,3]}}'),  # the repeats after the last new one
    (OPEN + '[[1,2],[1,2],[1,2],[1,2],[1,', OPEN + '[[1,2]]}}'),
    (OPEN + '[{"a":"x,y"},{"a":"x,y"},{"a":"x,y"},{"a":"x,y"},{"a', OPEN + '[{"a":"x,y"}]}}'),
    ('<tool_call>\n{"name":"t","arguments":{"o":{"q":["a\\"b","a\\"b","a\\"b","a\\"b",',
     '{"name":"t","arguments":{"o":{"q":["a\\"b"]}}}'),  # nested, an escaped quote
    (OPEN + '[1,2,3,4,5,6,7,', None),  # new items: a long list, not a loop
    (OPEN + '["a","b","a","a",', None),  # too few repeats to say
    (OPEN + '"[1,1,1,1,1,', None),  # inside a string
    (OPEN + '[1,1,1,1]}}', None),  # closed: the model ended it
    ("no call", None),
])
def test_where_a_runaway_list_is_cut(text, expected):
    assert runaway_cut(text) == expected


def test_a_long_runaway_is_read_in_linear_time():
    import time

    start = time.perf_counter()
    assert runaway_cut(OPEN + "[" + '"ab",' * 200_000) == OPEN + '["ab"]}}'
    assert runaway_cut(OPEN + "[" * 50_000) is None
    assert runaway_cut(OPEN + "[" + ",".join(f'"w{i}"' for i in range(100_000)) + ",") is None
    assert time.perf_counter() - start < 5


TAG = parse_tools(json.dumps([{
    "name": "tag", "description": "Tag a note.",
    "parameters": {"type": "object", "properties": {
        "labels": {"type": "array", "items": {"type": "string"}}, "note": {"type": "string"}},
        "required": ["labels", "note"]},
    "_exec": 'printf "%s" "$note"'}]))


@pytest.mark.parametrize("protocol", ["json", "hermes"])
def test_the_agent_closes_the_list_writes_the_rest_and_runs_the_call(tiny_lm, protocol):
    lm = tiny_lm if protocol == "json" else replace(tiny_lm, chat=ChatFormat(QWEN_LIKE))
    # RUNAWAY_REPEATS items the list holds already, in a row: the scanner ends the reply
    loop = '{"labels":["red","blue"' + ',"red","blue"' * (RUNAWAY_REPEATS // 2) + ","
    call = f'{{"tool":"tag","arguments":{loop}' if protocol == "json" else \
        f'<tool_call>\n{{"name":"tag","arguments":{loop}'
    answer = '{"answer":"tagged"}' if protocol == "json" else "tagged"
    rec = Recorder()
    script = Obliging(lm, call, '"urgent"}', answer)  # the probe of note writes "urgent"
    agent = Agent(lm, lm.engine(), TAG, agent_format(protocol, lm),
                  AgentConfig(grammar=True, max_steps=3), emit=rec,
                  sampler=script, probe_sampler=script)
    out = agent.ask("Tag the urgent note red and blue.")
    calls = rec.of(ev.ToolCall)
    assert [(c.arguments, c.stdout) for c in calls] == \
        [({"labels": ["red", "blue"], "note": "urgent"}, "urgent")]
    assert out.answer == "tagged"
    # the model reads the call as closed, not the loop it wrote
    assert '"red","blue","red"' not in lm.decode(agent.engine.tokens)


def test_the_agent_leaves_a_cut_off_list_of_new_items_as_it_was(tiny_lm):
    call = '{"tool":"tag","arguments":{"labels":[' + ",".join(f'"w{i}"' for i in range(60))
    rec = Recorder()
    agent = Agent(tiny_lm, tiny_lm.engine(), TAG, agent_format("json", tiny_lm),
                  AgentConfig(grammar=True, max_steps=2, max_tokens=48), emit=rec,
                  sampler=Obliging(tiny_lm, call, call))
    agent.ask("Tag it.")
    assert rec.of(ev.ToolCall) == []


@pytest.mark.parametrize("cut", ["scanner", "budget"])
def test_the_server_returns_the_closed_call(tiny_lm, serve, cut):  # noqa: F811
    tools = parse_tools(json.dumps([{"name": "tag", "parameters": {"type": "object",
        "properties": {"labels": {"type": "array", "items": {"type": "string"}}},
        "required": ["labels"]}}]), runnable=False)
    start = '{"tool":"tag","arguments":{"labels":["red","blue"'
    call = start + ',"red","blue"' * RUNAWAY_REPEATS
    # the scanner's repeats, or a budget that ends the reply after four
    budget = 256 if cut == "scanner" else len(tiny_lm.encode(start + ',"red","blue"' * 2))
    s = serve(sampler_for=lambda sampling: Obliging(tiny_lm, call))
    r = s.client.chat.completions.create(
        model="tiny", messages=user("Tag it red and blue."), max_tokens=budget,
        tools=[t.openai() for t in tools])
    (tc,) = r.choices[0].message.tool_calls
    assert (tc.function.name, json.loads(tc.function.arguments)) == \
        ("tag", {"labels": ["red", "blue"]})
    assert r.choices[0].finish_reason == "tool_calls"
    assert r.usage.completion_tokens < (120 if cut == "scanner" else budget + 1)


def test_the_scanner_ends_a_reply_at_the_comma_after_its_last_allowed_repeat_only():
    def ended_at(text, inner=JsonObjectScanner, **kw):
        scanner = RunawayListScanner(inner(), **kw)
        return next((i for i in range(len(text)) if scanner.feed(text[i])), None)

    n = RUNAWAY_REPEATS
    loop = OPEN + '["G","C"' + ',"C"' * (n + 2)
    assert ended_at(loop) == len(OPEN + '["G","C"' + ',"C"' * n)  # the comma after the last
    assert ended_at(OPEN + "[" + ",".join(f'"w{i}"' for i in range(80))) is None  # new items
    equal = OPEN + "[" + ",".join(["5"] * (n + 1)) + "]}}"  # closed by the model: its list
    assert ended_at(equal) == len(equal) - 1  # the object's end, not the list's
    assert ended_at(OPEN + '"[1' + ",1" * (n + 5)) is None  # in a string
    assert ended_at(OPEN + '["a\\",b"' + ',"a\\",b"' * (n + 1)) is not None  # an escaped quote
    hermes = '<tool_call>\n{"name":"t","arguments":{"q":[[1],[1]' + ",[1]" * (n + 2)
    assert ended_at(hermes, ToolCallScanner, start="<tool_call>") is not None
    prose = "The dict is {a: [" + "0," * (n + 5) + "0]} and more"  # hermes prose: no call
    assert ended_at(prose, ToolCallScanner, start="<tool_call>") is None
