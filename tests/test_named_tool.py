"""A request that tells the agent to use a tool by name makes the first step call it.

The bundled model, asked "Use the echo tool to say hello.", greeted the user and called
nothing (issue 12's first example)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from mlx_agent.agent import Agent, AgentConfig, agent_format
from mlx_agent.agent import events as ev
from mlx_agent.agent.named_tool import named_tool
from mlx_agent.chat import ChatFormat

from .test_agent_loop import ECHO, QWEN_LIKE, Recorder
from .test_loop_guard import Obliging

NAMES = ["echo", "get_weather", "time", "search_files", "list", "math.factorial"]


@pytest.mark.parametrize("text, named", [
    ("Use the echo tool to say hello.", "echo"),
    ("Can you use the Echo Tool to repeat hi?", "echo"),
    ("Call `echo` with hi", "echo"),
    ("run search_files for TODO", "search_files"),  # a name no sentence uses as a word
    ("Use the get weather tool for Paris", "get_weather"),
    ("With the time tool, tell me the hour", "time"),
    ("Please run get_weather on Paris and then use the echo tool", "get_weather"),  # the first
    ("Use echo to say hello.", None),  # bare, a word: could be the word
    ("use the time you have wisely", None),
    ("list files", None),
    ("Don't use the echo tool, just answer.", None),
    ("How do I use the echo tool?", None),
    ("What does the echo tool do?", None),
    ("Say hello.", None),
    ("call math.factorial on 5", "math.factorial"),
    ("use the echo tools", None),  # another word
    ("run `time` now", "time"),
    # a negation written with a typographic apostrophe (macOS and phones type one), or
    # a few words further back; a sentence that opens as a question about the tool
    ("Don\u2019t use the echo tool, just answer.", None),
    ("You don't need to use the echo tool.", None),
    ("You don't have to call the echo tool here.", None),
    ("Avoid using the echo tool, just answer.", None),
    ("Instead of using the time tool, guess.", None),
    ("Don't forget to use the echo tool.", "echo"),
    ("Is it safe to run the search_files tool?", None),
    ("What can I do with the echo tool?", None),
    ("What happens if I call the echo tool?", None),
    ("Could you run the echo tool for hi?", "echo"),
    ("What is the weather in Paris? Use the get_weather tool.", "get_weather"),
])
def test_a_tool_is_named_only_when_the_request_says_to_use_it(text, named):
    assert named_tool(text, NAMES) == named


def test_a_long_request_and_a_large_catalogue_cost_one_pass():
    # a regex per tool over the whole text: 58 s for 2,000 tools and a message of
    # "how do " repeated, which the question check re-scanned to its end at every match
    import time

    names = [f"tool_{i}" for i in range(2000)] + ["echo"]
    start = time.perf_counter()
    assert named_tool("how do " * 20000 + "use the echo tool", names) is None
    assert named_tool("Use the echo tool " * 5000, names) == "echo"
    assert named_tool("x" * 200_000, names) is None
    assert time.perf_counter() - start < 5  # about 0.03 s


def ask(lm, protocol, replies, request, **config):
    rec = Recorder()
    agent = Agent(lm, lm.engine(), ECHO, agent_format(protocol, lm),
                  AgentConfig(grammar=True, max_steps=3, **config), emit=rec,
                  sampler=Obliging(lm, *replies))
    return agent.ask(request), rec


@pytest.mark.parametrize("protocol", ["json", "hermes"])
def test_the_named_tool_is_called_where_the_model_would_have_answered(tiny_lm, protocol):
    lm = tiny_lm if protocol == "json" else replace(tiny_lm, chat=ChatFormat(QWEN_LIKE))
    if protocol == "json":
        replies = ['{"answer":"Hello! How can I help?"}',
                   '{"tool":"echo","arguments":{"text":"hello"}}', '{"answer":"hello"}']
    else:
        replies = ["Hello! How can I help?",
                   '<tool_call>\n{"name":"echo","arguments":{"text":"hello"}}\n</tool_call>',
                   "hello"]
    out, rec = ask(lm, protocol, replies, "Use the echo tool to say hello.")
    assert [(c.tool, c.arguments) for c in rec.of(ev.ToolCall)] == [("echo", {"text": "hello"})]
    assert out.answer == "hello" and out.stats.named_steps == 1
    # turned off, or a request that names no tool: the model's own choice, an answer
    for request, config in (("Use the echo tool to say hello.", {"follow_named_tool": False}),
                            ("Say hello.", {})):
        out, rec = ask(lm, protocol, replies, request, **config)
        assert rec.of(ev.ToolCall) == [] and out.stats.named_steps == 0
        assert out.answer == "Hello! How can I help?"


@pytest.mark.real_model
def test_the_bundled_model_echoes_when_told_to_use_the_echo_tool():
    cli = [sys.executable, "-m", "mlx_agent.cli.main", "agent", "--tools",
           str(Path(__file__).parents[1] / "examples" / "echo.json"), "--json-out", "--single",
           "Use the echo tool to say hello."]
    r = subprocess.run(cli, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    events = [ev.decode(line) for line in r.stdout.splitlines()]
    calls = [e for e in events if isinstance(e, ev.ToolCall)]
    assert [(c.tool, c.stdout) for c in calls] == [("echo", "hello")], r.stdout
    r = subprocess.run([*cli, "--ignore-named-tool"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and '"type":"tool_call"' not in r.stdout, r.stdout  # as before
