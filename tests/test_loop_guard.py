"""The loop guard: within a turn, the grammar no longer lets a model repeat a call that ran.

A scripted model that respects the mask: it writes its scripted reply token by token while
the mask allows; where the mask refuses the next scripted token, it moves to another script
that shares what it wrote so far (or to the best token the mask allows)."""

from __future__ import annotations

import json
from dataclasses import replace

import mlx.core as mx
import pytest

from mlx_agent.agent import Agent, AgentConfig, agent_format
from mlx_agent.agent import events as ev
from mlx_agent.chat import ChatFormat
from mlx_agent.tools import parse_tools

from .test_agent_loop import ECHO, QWEN_LIKE, Recorder
from .test_serve import serve, user  # noqa: F401  (the serve fixture)

PING = parse_tools(json.dumps([{"name": "ping", "description": "Ping the server",
                                "parameters": {"type": "object", "properties": {}},
                                "_exec": "echo pong"}]))


class Obliging:
    """Scripted replies, each sampled only where the mask allows it. A reply ends with the
    end-of-turn token, or where the grammar ends it (then the end is not sampled)."""

    def __init__(self, lm, *replies: str):
        self.scripts = [lm.encode(r) for r in replies]
        self.current: list[int] | None = None
        self.written: list[int] = []
        self.end = lm.encode("<|im_end|>")[0]

    def __call__(self, logprobs):
        allowed = logprobs[0] > -float("inf")
        finished = self.current is not None and len(self.written) >= len(self.current)
        if self.current is None or finished and not allowed[self.end].item():  # a new reply
            self.current, self.written = (self.scripts.pop(0) if self.scripts else []), []
        n = len(self.written)
        want = self.current[n] if n < len(self.current) else self.end
        if not allowed[want].item():  # refused: another script that agrees so far
            other = next((s for s in self.scripts if s[:n] == self.written and len(s) > n
                          and allowed[s[n]].item()), None)
            if other is not None:
                self.scripts.remove(other)
                self.current, want = other, other[n]
            else:
                want = int(mx.argmax(logprobs[0]).item())
        self.written.append(want)
        if want == self.end:
            self.current = None
        return mx.array([want])


def run(lm, tools, protocol, replies, **config):
    rec = Recorder()
    a = Agent(lm, lm.engine(), tools, agent_format(protocol, lm),
              AgentConfig(**{"grammar": True, "max_steps": 4, **config}), emit=rec,
              sampler=Obliging(lm, *replies))
    return a.ask("go"), rec


def test_a_repeated_call_is_refused_and_the_model_answers_instead(tiny_lm):
    call = '{"tool":"ping","arguments":{}}'
    out, rec = run(tiny_lm, PING, "json", [call, call, '{"answer":"pong"}'])
    assert out.answer == "pong" and out.stats.calls == 1 and out.stats.guarded_steps == 1


def test_a_repeated_call_must_change_its_arguments(tiny_lm):
    call = '{"tool":"echo","arguments":{"text":"hi"}}'
    out, rec = run(tiny_lm, ECHO, "json",
                   [call, call, '{"tool":"echo","arguments":{"text":"hi there"}}',
                    '{"answer":"ok"}'])
    assert [c.stdout for c in rec.of(ev.ToolCall)] == ["hi", "hi there"]
    assert out.answer == "ok" and out.stats.guarded_steps == 1


def test_hermes_repeats_are_refused_too(tiny_lm):
    lm = replace(tiny_lm, chat=ChatFormat(QWEN_LIKE))
    call = '<tool_call>\n{"name":"ping","arguments":{}}\n</tool_call>'
    out, rec = run(lm, PING, "hermes", [call, call, "pong"])
    assert out.answer == "pong" and out.stats.calls == 1 and out.stats.guarded_steps == 1


def test_allow_repeat_calls_turns_the_guard_off(tiny_lm):
    call = '{"tool":"ping","arguments":{}}'
    out, _ = run(tiny_lm, PING, "json", [call, call, '{"answer":"pong"}'],
                 allow_repeat_calls=True)
    assert out.stats.calls == 2 and out.stats.guarded_steps == 0 and out.answer == "pong"


def test_the_server_refuses_calls_already_in_the_turn(tiny_lm, serve):  # noqa: F811
    call = '{"tool":"ping","arguments":{}}'
    s = serve(sampler_for=lambda sampling: Obliging(tiny_lm, call, '{"answer":"pong"}'))
    tools = [t.openai() for t in PING]
    r = s.client.chat.completions.create(model="tiny", messages=user("ping"), tools=tools)
    (tc,) = r.choices[0].message.tool_calls  # the first call goes through
    messages = user("ping") + [r.choices[0].message.model_dump(exclude_none=True),
                               {"role": "tool", "tool_call_id": tc.id, "content": "pong"}]
    r = s.client.chat.completions.create(model="tiny", messages=messages, tools=tools)
    assert r.choices[0].message.content == "pong" and not r.choices[0].message.tool_calls
    # a new user turn may make the call again
    again = messages + [{"role": "assistant", "content": "pong"}, *user("once more")]
    r = s.client.chat.completions.create(model="tiny", messages=again, tools=tools)
    assert r.choices[0].message.tool_calls[0].function.name == "ping"


def test_calls_that_share_a_path_are_refused_together(tiny_lm):
    """Each enum value was used: every way into the tool ends in a repeat, so the guard
    turns the model away before it starts the call, not at the enum where all is lost."""
    unit = parse_tools(json.dumps([{
        "name": "set_unit", "description": "Set the unit",
        "parameters": {"type": "object", "required": ["unit"], "additionalProperties": False,
                       "properties": {"unit": {"type": "string", "enum": ["c", "f"]}}},
        "_exec": 'echo "$unit"'}]))
    c, f = ('{"tool":"set_unit","arguments":{"unit":"%s"}}' % u for u in "cf")
    out, rec = run(tiny_lm, unit, "json", [c, f, c, '{"answer":"set"}'])
    assert [e.stdout.strip() for e in rec.of(ev.ToolCall)] == ["c", "f"]
    # the guard also masked "c" while the model wrote "f": that step counts too
    assert out.answer == "set" and out.stats.guarded_steps == 2


def test_a_value_written_with_the_prompts_space_runs_without_it_and_is_not_repeated(tiny_lm):
    """A value copied with the space its token had in the prompt (" Perth") runs as "Perth";
    the guard then refuses the call however the space is written."""
    def call(text):
        return '{"tool":"echo","arguments":{"text":"%s"}}' % text

    # each refused form moves to the script that shares what it wrote: "Perth!", " Perth?"
    out, rec = run(tiny_lm, ECHO, "json", [call(" Perth"), call("Perth"), call("Perth!"),
                                          call(" Perth"), call(" Perth?"), '{"answer":"ok"}'])
    assert [c.arguments["text"] for c in rec.of(ev.ToolCall)] == ["Perth", "Perth!", "Perth?"]
    assert out.answer == "ok\n\necho returned Perth?" and out.stats.guarded_steps == 2


def test_only_one_space_before_a_word_is_taken_off():
    from mlx_agent.formats import unspaced
    from mlx_agent.loop_guard import spaced_forms

    assert unspaced({"a": " Perth", "b": "  two", "c": " ", "d": [" x", {"e": " y z"}], "n": 3}) \
        == {"a": "Perth", "b": "  two", "c": " ", "d": ["x", {"e": "y z"}], "n": 3}
    forms = spaced_forms({"a": "P", "b": ["q", 1]})
    assert len(forms) == 4 and {"a": " P", "b": [" q", 1]} in forms
    assert all(unspaced(f) == {"a": "P", "b": ["q", 1]} for f in forms)
    many = spaced_forms({f"k{i}": "v" for i in range(3)})  # beyond 4: each alone, and all
    assert len(many) == 5 and {f"k{i}": " v" for i in range(3)} in many
    assert {"k0": "v", "k1": " v", "k2": "v"} in many


def test_the_server_returns_the_value_without_the_space_and_refuses_it_spaced(tiny_lm, serve):  # noqa: F811
    def call(text):
        return '{"tool":"echo","arguments":{"text":"%s"}}' % text

    s = serve(sampler_for=lambda sampling: Obliging(tiny_lm, call(" Perth"), call(" Perth?")))
    tools = [t.openai() for t in ECHO]
    # the request writes Perth: a value it does not write may be copied again from it
    r = s.client.chat.completions.create(model="tiny", messages=user("echo Perth"),
                                         tools=tools)
    (tc,) = r.choices[0].message.tool_calls
    assert json.loads(tc.function.arguments) == {"text": "Perth"}
    messages = user("echo Perth") + [r.choices[0].message.model_dump(exclude_none=True),
                               {"role": "tool", "tool_call_id": tc.id, "content": "Perth"}]
    r = s.client.chat.completions.create(model="tiny", messages=messages, tools=tools)
    (tc,) = r.choices[0].message.tool_calls  # " Perth" again is refused: " Perth?" instead
    assert json.loads(tc.function.arguments) == {"text": "Perth?"}
