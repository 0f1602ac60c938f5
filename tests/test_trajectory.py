"""Token-exact trajectories: the ids fed and sampled replay to exactly the cached ids."""

from __future__ import annotations

import json
import os

import pytest

from mlx_agent import trajectory as tj
from mlx_agent.chat import ChatFormat
from mlx_agent.prompt_cache import PromptCache

from .test_agent_loop import QWEN_LIKE, Script, agent


def recorder(tmp_path, **kw):
    return tj.Recorder(tmp_path, task="t", model_fingerprint="fp", sampling={"temperature": 0}, **kw)


def test_json_protocol_trajectory_replays_to_the_cache(tiny_lm, tmp_path):
    rec = recorder(tmp_path)
    script = Script(tiny_lm, '{"tool": "echo", "arguments": {"text": "héllo\\n"}}',
                    '{"answer": "one"}', '{"answer": "two"}')
    a, _, _ = agent(tiny_lm, script, recorder=rec)
    a.ask("first")
    a.ask("second")
    t = tj.read(rec.path)
    assert [s.role for s in t.steps] == ["system", "user", "assistant", "tool", "assistant",
                                         "user", "assistant"]
    assert t.token_sequence() == a.engine.tokens
    # every piece is exactly what went in or came out, never re-tokenized text
    assert t.steps[2].output_ids == tiny_lm.encode('{"tool": "echo", "arguments": {"text": "héllo\\n"}}')
    assert t.steps[2].tool_call.name == "echo"
    assert json.loads(t.steps[2].tool_call.arguments_json) == {"text": "héllo\n"}
    assert t.steps[3].tool_result.stdout == "héllo\n"
    assert all(s.prefix_len in (None, len(tj.Trajectory(id="x", steps=t.steps[:i]).token_sequence()))
               for i, s in enumerate(t.steps))  # json: the cache was always reused whole
    assert t.summary == {"turns": "2", "stop": "answer"} and len(t.turn_stats) == 2
    assert t.model_fingerprint == "fp" and t.task == "t"


def test_hermes_trajectory_with_a_non_canonical_tokenization(tiny_lm, tmp_path):
    from dataclasses import replace

    lm = replace(tiny_lm, chat=ChatFormat(QWEN_LIKE))
    whole = lm.encode(" Paris")
    split = lm.encode(" Par") + lm.encode("is")
    assert len(whole) == 1 and split != whole  # the model samples a split the text never gives
    rec = recorder(tmp_path)
    script = Script(lm, lm.encode("The capital is") + split + lm.encode(".<|im_end|>"),
                    "Yes.<|im_end|>")
    a, _, _ = agent(lm, script, protocol="hermes", recorder=rec)
    a.ask("Capital of France?")
    a.ask("Sure?")
    t = tj.read(rec.path)
    assert t.token_sequence() == a.engine.tokens
    user2 = [s for s in t.steps if s.role == "user"][1]
    replayed_before = tj.Trajectory(id="x", steps=t.steps[: t.steps.index(user2)]).token_sequence()
    # the re-rendered conversation kept the split the model sampled: nothing re-prefilled
    assert user2.prefix_len == len(replayed_before)
    sampled = t.steps[2].output_ids
    assert replayed_before[-len(sampled):] == sampled and split == sampled[3:5]


def test_system_prompt_from_the_prompt_cache_is_recorded(tiny_lm, tmp_path):
    rec = recorder(tmp_path / "traj")
    a, _, _ = agent(tiny_lm, Script(tiny_lm, '{"answer": "x"}'), recorder=rec)
    a.prime(PromptCache(tmp_path / "kv"))
    a.ask("hi")
    t = tj.read(rec.path)
    system = a.conversation.system_ids
    assert t.steps[0].role == "system" and t.steps[0].input_ids == system
    assert t.steps[1].prefix_len == len(system)
    assert t.token_sequence() == a.engine.tokens


def test_reader_api_and_the_original_fields(tmp_path):
    rec = recorder(tmp_path)
    rec.add(tj.Step(role="user", content="hi", input_ids=[1, 2]))
    rec.add(tj.Step(role="assistant", content="yo", output_ids=[3]))
    rec.finish_turn({"stop": "answer"})
    (path, t), = list(tj.iter_dir(tmp_path))
    assert t.id == path.stem and t.version == 1
    tj.set_reward(path, 1.0)
    raw = json.loads(path.read_text())
    assert raw["steps"][-1]["reward"] == 1.0 and raw["summary"]["reward"] == "1.0"
    assert raw["version"] == 1  # written at the top level, as the original's reader expects
    del raw["version"]  # a file without it still reads
    (tmp_path / "old.atraj").write_text(json.dumps(raw))
    assert tj.read(tmp_path / "old.atraj").steps[0].input_ids == [1, 2]
    # a file with only the original's version-1 fields reads
    original = {"version": 1, "id": "abc", "summary": {}, "steps": [
        {"role": "user", "content": "x", "input_ids": [5]},
        {"role": "assistant", "content": "{}", "output_ids": [6],
         "tool_call": {"name": "t", "arguments_json": "{}"}}]}
    (tmp_path / "orig.atraj").write_text(json.dumps(original))
    assert tj.read(tmp_path / "orig.atraj").token_sequence() == [5, 6]
    (tmp_path / "bad.atraj").write_text("{nope")
    with pytest.raises(tj.TrajectoryError, match="not a valid .atraj"):
        tj.read(tmp_path / "bad.atraj")
    deep = dict(original, extra="@")  # a field nested past any recursion limit
    (tmp_path / "deep.atraj").write_text(json.dumps(deep).replace('"@"', "[" * 100_000 + "]" * 100_000))
    with pytest.raises(tj.TrajectoryError, match="nested too deeply"):
        tj.read(tmp_path / "deep.atraj")
    os.mkfifo(tmp_path / "fifo.atraj")
    with pytest.raises(tj.TrajectoryError, match="not a regular file"):
        tj.read(tmp_path / "fifo.atraj")


def test_a_file_past_the_size_limit_is_refused_before_it_is_read(tmp_path):
    """A 3 GB sparse .atraj was read whole (3.1 GB, 11 s) before its JSON was found bad."""
    path = tmp_path / "big.atraj"
    with open(path, "wb") as f:
        f.truncate(tj.MAX_BYTES + 1)  # sparse: no disk used
    with pytest.raises(tj.TrajectoryError, match=f"cannot read {path}: it is "
                                                 f"{tj.MAX_BYTES + 1:,} bytes, over the "
                                                 "256 MiB limit"):
        tj.read(path)


@pytest.mark.parametrize("protocol,reply", [
    ("json", '{"tool": "echo", "arguments": [1]}'),
    ("json", '{"tool": "echo", "arguments": "hi"}'),
    ("hermes", '<tool_call>{"name": "echo", "arguments": [1]}</tool_call><|im_end|>'),
    ("hermes", "<tool_call>not json</tool_call><|im_end|>"),
])
def test_a_call_whose_arguments_are_not_an_object_is_a_tool_error_on_the_record(
        tiny_lm, tmp_path, protocol, reply):
    """A model without the grammar wrote a call whose arguments were not an object: the json
    protocol ended the session (MessageError keeping the reply), and both recorded the
    arguments as they were, which made the trajectory unreadable."""
    from dataclasses import replace

    from mlx_agent.agent import events as ev

    lm = tiny_lm if protocol == "json" else replace(tiny_lm, chat=ChatFormat(QWEN_LIKE))
    answer = '{"answer": "x"}' if protocol == "json" else "x<|im_end|>"
    rec = recorder(tmp_path)
    a, events, _ = agent(lm, Script(lm, reply, answer), protocol=protocol, recorder=rec)
    out = a.ask("go")
    assert out.answer == "x" and out.stats.tool_errors == 1
    (call,) = events.of(ev.ToolCall)
    assert call.exit_code == -1 and "JSON" in call.stderr  # not an object, or not JSON
    t = tj.read(rec.path)
    assert [s.role for s in t.steps] == ["system", "user", "assistant", "tool", "assistant"]
    assert t.steps[2].tool_call is None and t.steps[2].content == reply.replace("<|im_end|>", "")
    assert t.token_sequence() == a.engine.tokens
