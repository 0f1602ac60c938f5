"""Retry after an error: when a call fails, the agent's next reply must be a call (another
one: the loop guard), so a small model tries another way before it answers; at most
``retry_after_error`` times a turn, and never at the turn's last step."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from mlx_agent.agent import Agent, AgentConfig, agent_format
from mlx_agent.agent import events as ev
from mlx_agent.chat import ChatFormat
from mlx_agent.tools import builtin_tools, parse_tools

from .test_agent_loop import QWEN_LIKE, Recorder
from .test_loop_guard import Obliging, run

TOOLS = parse_tools(json.dumps([
    {"name": "ping", "description": "Ping the server",
     "parameters": {"type": "object", "properties": {}}, "_exec": "echo pong"},
    {"name": "fail", "description": "Always fails",
     "parameters": {"type": "object", "properties": {}}, "_exec": "echo nope >&2; exit 3"},
    {"name": "fail_too", "description": "Fails as well",
     "parameters": {"type": "object", "properties": {}}, "_exec": "exit 4"},
]))


def replies(protocol: str) -> list[str]:
    if protocol == "json":
        call = '{{"tool":"{}","arguments":{{}}}}'.format
        return [call("fail"), '{"answer":"gave up"}', call("ping"), '{"answer":"pong"}']
    call = '<tool_call>\n{{"name":"{}","arguments":{{}}}}\n</tool_call>'.format
    return [call("fail"), "gave up", call("ping"), "pong"]


@pytest.mark.parametrize("protocol", ["json", "hermes"])
def test_a_failed_call_is_followed_by_another_call(tiny_lm, protocol):
    lm = tiny_lm if protocol == "json" else replace(tiny_lm, chat=ChatFormat(QWEN_LIKE))
    out, rec = run(lm, TOOLS, protocol, replies(protocol))
    # the answer the model tried after the failure was refused; it called ping instead
    assert [c.tool for c in rec.of(ev.ToolCall)] == ["fail", "ping"]
    assert [c.exit_code for c in rec.of(ev.ToolCall)] == [3, 0]
    assert out.stats.retried_steps == 1 and out.stats.tool_errors == 1
    assert out.answer == "pong"


@pytest.mark.parametrize("protocol", ["json", "hermes"])
def test_zero_lets_the_model_answer_after_a_failure(tiny_lm, protocol):
    lm = tiny_lm if protocol == "json" else replace(tiny_lm, chat=ChatFormat(QWEN_LIKE))
    out, rec = run(lm, TOOLS, protocol, replies(protocol), retry_after_error=0)
    assert [c.tool for c in rec.of(ev.ToolCall)] == ["fail"]
    assert out.answer == "gave up" and out.stats.retried_steps == 0


def test_retries_are_counted_per_turn_and_leave_the_last_step_free(tiny_lm):
    call = '{"tool":"fail","arguments":{}}'
    # max_steps 2: the one step after the failure is the last, so it may answer
    out, rec = run(tiny_lm, TOOLS, "json", [call, '{"answer":"stuck"}'], max_steps=2)
    assert out.answer == "stuck" and out.stats.retried_steps == 0
    # two failures, one retry allowed: the second failure may be answered
    out, rec = run(tiny_lm, TOOLS, "json",
                   [call, '{"answer":"a"}', '{"tool":"fail_too","arguments":{}}',
                    '{"answer":"b"}'], max_steps=4)
    assert [c.tool for c in rec.of(ev.ToolCall)] == ["fail", "fail_too"]
    assert out.stats.retried_steps == 1 and out.stats.tool_errors == 2 and out.answer == "b"


def test_a_call_the_user_denied_is_not_retried(tiny_lm):
    out, rec = run(tiny_lm, TOOLS, "json", replies("json"), confirm=lambda name, args: False)
    assert [c.tool for c in rec.of(ev.ToolCall)] == ["fail"]
    assert out.answer == "gave up" and out.stats.retried_steps == 0


@pytest.mark.parametrize("protocol", ["json", "hermes"])
def test_no_other_call_left_lets_the_model_answer(tiny_lm, protocol):
    """The one tool failed with the only arguments it takes: the loop guard leaves no call
    to make, so the retry does not force one and the model answers."""
    lm = tiny_lm if protocol == "json" else replace(tiny_lm, chat=ChatFormat(QWEN_LIKE))
    only = [t for t in TOOLS if t.name == "fail"]
    script = replies(protocol)
    out, rec = run(lm, only, protocol, [script[0], script[0], script[1]])
    assert [c.tool for c in rec.of(ev.ToolCall)] == ["fail"]
    assert out.answer == "gave up"


def test_a_denial_beside_a_failure_still_retries(tiny_lm):
    """Hermes, two calls in one reply: ``fail`` runs and fails, ``ping`` is denied; the
    failure still makes the next step a call."""
    lm = replace(tiny_lm, chat=ChatFormat(QWEN_LIKE))
    call = '<tool_call>\n{{"name":"{}","arguments":{{}}}}\n</tool_call>'.format
    out, rec = run(lm, TOOLS, "hermes", [call("fail") + "\n" + call("ping"), "gave up",
                                         call("fail_too"), "done"],
                   confirm=lambda name, args: name != "ping")
    assert [c.tool for c in rec.of(ev.ToolCall)] == ["fail", "ping", "fail_too"]
    assert out.stats.retried_steps == 1


@pytest.mark.parametrize("protocol", ["json", "hermes"])
def test_the_retry_calls_the_built_in_tool_a_built_in_error_advises(tiny_lm, protocol, tmp_path):
    """read_file's "no file 'TODO'; to find the files that mention 'TODO', call the grep
    tool ..." makes the retry a call of grep, and list_files' "leave the path out ..." one of
    list_files again (the guard keeps it from the same call); any other tool's error that
    says the same (an MCP server's, a test suite's) is not read."""
    lm = tiny_lm if protocol == "json" else replace(tiny_lm, chat=ChatFormat(QWEN_LIKE))
    (tmp_path / "a.txt").write_text("TODO: x\n")

    def call(name, arguments=None):
        arguments = json.dumps(arguments or {}, separators=(",", ":"))
        return f'{{"tool":"{name}","arguments":{arguments}}}' if protocol == "json" else \
            f'<tool_call>\n{{"name":"{name}","arguments":{arguments}}}\n</tool_call>'

    answer = replies(protocol)[3]
    builtins = builtin_tools(tmp_path)
    # the model would list the files next: advised grep, it greps
    script = [call("read_file", {"path": "TODO"}), call("list_files"),
              call("grep", {"pattern": "TODO"}), answer]
    out, rec = run(lm, builtins, protocol, script)
    assert [c.tool for c in rec.of(ev.ToolCall)] == ["read_file", "grep"]
    assert out.stats.retried_steps == 1
    # advised to call the tool again without the path: the model would grep (a path no one
    # wrote is dropped before it runs: the rule is off here)
    out, rec = run(lm, builtins, protocol, [call("list_files", {"path": "nope"}),
                                            call("grep", {"pattern": "x"}), call("list_files"),
                                            answer], stated_arguments=False)
    assert [(c.tool, c.arguments) for c in rec.of(ev.ToolCall)] == \
        [("list_files", {"path": "nope"}), ("list_files", {})]
    # the same words from a tool that is not built in: read as nothing
    mimic = parse_tools(json.dumps([{
        "name": "lookup", "parameters": {"type": "object", "properties": {}},
        "_exec": "echo \"no file 'TODO'; to find the files that mention 'TODO', call the grep "
                 "tool with it as the pattern\" >&2; exit 1"}]))
    out, rec = run(lm, builtins + mimic, protocol, [call("lookup"), *script[1:]])
    assert [c.tool for c in rec.of(ev.ToolCall)] == ["lookup", "list_files", "grep"]
    # the switch that leaves tool choice to the model leaves this too
    out, rec = run(lm, builtins, protocol, script, follow_named_tool=False)
    assert [c.tool for c in rec.of(ev.ToolCall)] == ["read_file", "list_files", "grep"]


def test_a_made_up_path_probed_back_into_a_call_that_ran_is_left_out(tiny_lm, tmp_path):
    """"List all the files here." wrote list_files(path="here"), which failed; advised to
    call it again without the path, the model wrote "here,". That path is dropped (no one
    wrote it), and probed back in (the request writes "here") it would be the call that
    failed: the call goes without it."""
    (tmp_path / "a.txt").write_text("x\n")

    def call(path):
        return '{"tool":"list_files","arguments":{"path":"%s"}}' % path

    rec = Recorder()
    script = Obliging(tiny_lm, call("here"), call("here,"), '"here"}', '{"answer":"a.txt"}')
    agent = Agent(tiny_lm, tiny_lm.engine(), builtin_tools(tmp_path),
                  agent_format("json", tiny_lm), AgentConfig(grammar=True, max_steps=4),
                  emit=rec, sampler=script, probe_sampler=script)
    out = agent.ask("List all the files here.")
    assert [c.arguments for c in rec.of(ev.ToolCall)] == [{"path": "here"}, {}]
    assert out.answer == "a.txt"
