""".atraj interoperability with the original posttrainllm: its files (JSONEncoder,
.prettyPrinted and .sortedKeys) read field for field; what we write checked against its
Codable structs' required keys and types; and the ids a trajectory records, from the agent's
command line through traces-to-data, are exactly the conversation the model was fed."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from mlx_agent import trajectory as tj

CLI = [sys.executable, "-m", "mlx_agent.cli.main"]

# the original's evals/traces-to-data-fixtures/05-tool-echo-drop.atraj, as its encoder lays
# it out ("key" : value, "/" escaped), with a tool result whose duration the original left out
# (ToolResultPayload.durationSec is optional) and the fields a recorder stamps
ORIGINAL = r"""{
  "checkpoint_path" : "\/models\/fixture.tinygpt",
  "id" : "5E0C7F5A-1B0C-4C59-9E54-0A0D2B4C6F11",
  "model_fingerprint" : "sha256:ab12",
  "steps" : [
    {
      "content" : "Look up the weather in Paris \u00e9 😀",
      "input_ids" : [
        50,
        51,
        2147483647
      ],
      "role" : "user",
      "timestamp" : 1714000000.125
    },
    {
      "content" : "{\"tool\": \"weather\", \"arguments\": {\"city\": \"Paris\"}}",
      "output_ids" : [
        0,
        61
      ],
      "role" : "assistant",
      "timestamp" : 1714000001,
      "tool_call" : {
        "arguments_json" : "{\"city\":\"Paris\"}",
        "name" : "weather"
      }
    },
    {
      "content" : "",
      "reward" : 1,
      "role" : "tool",
      "tool_result" : {
        "exit_code" : -9,
        "name" : "weather",
        "stderr" : "killed\n",
        "stdout" : ""
      }
    }
  ],
  "summary" : {
    "reward" : "1.0"
  },
  "task" : "weather",
  "version" : 1
}"""


def test_an_original_file_reads_field_for_field(tmp_path):
    path = tmp_path / "5E0C7F5A-1B0C-4C59-9E54-0A0D2B4C6F11.atraj"
    path.write_text(ORIGINAL, encoding="utf-8")
    t = tj.read(path)
    assert (t.version, t.id, t.task) == (1, "5E0C7F5A-1B0C-4C59-9E54-0A0D2B4C6F11", "weather")
    assert t.checkpoint_path == "/models/fixture.tinygpt" and t.model_fingerprint == "sha256:ab12"
    assert t.summary == {"reward": "1.0"}
    user, call, tool = t.steps
    assert user.content == "Look up the weather in Paris é 😀"
    assert user.input_ids == [50, 51, 2**31 - 1] and user.output_ids is None
    assert user.timestamp == 1714000000.125 and user.reward is None
    assert call.output_ids == [0, 61] and call.input_ids is None
    assert (call.tool_call.name, call.tool_call.arguments_json) == ("weather", '{"city":"Paris"}')
    r = tool.tool_result
    assert (r.name, r.stdout, r.stderr, r.exit_code) == ("weather", "", "killed\n", -9)
    assert r.duration_sec is None and tool.reward == 1.0 and tool.content == ""
    assert t.replay() == ([50, 51, 2**31 - 1, 0, 61], [0, 0, 0, 1, 1])


def check_original_schema(doc: dict) -> None:
    """What the original's JSONDecoder needs (AgentTrajectory.swift): non-optional keys
    present with their types; optional ones absent, null or of their type."""
    def opt(obj, key, kind):
        assert obj.get(key) is None or isinstance(obj[key], kind), (key, obj.get(key))

    assert type(doc["version"]) is int and isinstance(doc["id"], str)
    assert isinstance(doc["steps"], list)
    assert isinstance(doc["summary"], dict) and all(
        isinstance(v, str) for v in doc["summary"].values())
    for key in ("checkpoint_path", "model_fingerprint", "task"):
        opt(doc, key, str)
    for s in doc["steps"]:
        assert isinstance(s["role"], str) and isinstance(s["content"], str)
        for key in ("input_ids", "output_ids"):
            assert s.get(key) is None or all(type(i) is int for i in s[key])
        opt(s, "reward", (int, float))
        opt(s, "timestamp", (int, float))
        if s.get("tool_call") is not None:
            assert isinstance(s["tool_call"]["name"], str)
            assert isinstance(s["tool_call"]["arguments_json"], str)
        if s.get("tool_result") is not None:
            r = s["tool_result"]
            assert all(isinstance(r[k], str) for k in ("name", "stdout", "stderr"))
            assert type(r["exit_code"]) is int
            opt(r, "duration_sec", (int, float))


def test_what_we_write_has_every_key_the_original_requires(tmp_path):
    """The original's decoder requires steps and summary: a file whose summary was still
    empty (every file until the end of the first turn, and one a crash cut there) left it
    out, and the original could not load it."""
    rec = tj.Recorder(tmp_path)
    rec.add(tj.Step(role="user", content="hi", input_ids=[1, 2]))
    check_original_schema(json.loads(rec.path.read_bytes()))
    bare = tmp_path / "bare.atraj"
    tj.write(bare, tj.Trajectory(id="x"))
    check_original_schema(json.loads(bare.read_bytes()))
    assert tj.read(bare).steps == [] and tj.read(bare).summary == {}


@pytest.mark.parametrize("version", [2, 0, -1])
def test_other_versions_are_refused_in_one_line(tmp_path, version):
    path = tmp_path / "v.atraj"
    path.write_text(ORIGINAL.replace('"version" : 1', f'"version" : {version}'))
    r = subprocess.run([*CLI, "traj", "show", str(path)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert f".atraj version {version} is not supported" in r.stderr


def test_agent_to_rows_is_the_rendered_conversation_token_for_token(tmp_path, real_model):
    """The original recorded a user step's ids without the ChatML wrapper it fed, and fed
    no <|im_end|> after a reply. Here: agent --trajectory-dir, then traces-to-data, and the
    row's ids decode to exactly the conversation in the original's framing, the loss mask
    on the assistant's replies and nothing else."""
    runs, rows = tmp_path / "runs", tmp_path / "sft.jsonl"
    env = {**os.environ, "MLX_AGENT_MODEL": "smollm2-135m"}
    r = subprocess.run([*CLI, "agent", "--tools", "examples/echo.json", "--protocol", "json",
                        "--single", "Echo hello and tell me what it said", "-t", "0",
                        "--max-tokens", "60", "--max-steps", "3", "--trajectory-dir", str(runs)],
                       capture_output=True, text=True, timeout=300, env=env,
                       cwd=os.path.dirname(os.path.dirname(__file__)))
    assert r.returncode == 0, r.stderr
    r = subprocess.run([*CLI, "traces-to-data", str(runs), "--out", str(rows)],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    (row,) = [json.loads(line) for line in rows.read_text().splitlines()]
    ids, mask = row["input_ids"], row["loss_mask"]
    roles = [m["role"] for m in row["messages"]]
    assert roles[:2] == ["system", "user"] and "tool" in roles and roles[-1] == "assistant"

    text, sampled = "", []
    for i, m in enumerate(row["messages"]):
        role, content = m["role"], m["content"]
        if role == "assistant":
            sampled.append(content)
            text += content
        else:  # the end of the reply before it, then this turn, then the assistant's turn
            text += ("<|im_end|>\n" if i and roles[i - 1] == "assistant" else "")
            text += f"<|im_start|>{role}\n{content}<|im_end|>\n"
            text += "<|im_start|>assistant\n" if role != "system" else ""
    decode = real_model.tokenizer.decode
    assert decode(ids) == text
    runs_of_ones, cur = [], []
    for t, m in zip(ids, mask):
        if m:
            cur.append(t)
        elif cur:
            runs_of_ones, cur = runs_of_ones + [cur], []
    runs_of_ones += [cur] if cur else []
    assert [decode(x) for x in runs_of_ones] == sampled


def test_the_originals_trajectories_make_no_training_rows(tmp_path):
    """The original's ids are not what its model was fed (a user's text without the chat
    framing, none for tool results): traces-to-data turned them into rows that taught
    sequences the model never reads. They are left out, counted and named in a warning; ours
    in the same folder still make their row."""
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "original.atraj").write_text(ORIGINAL)
    rec = tj.Recorder(runs, task="ours")
    rec.add(tj.Step(role="user", content="hi", input_ids=[1, 2], prefix_len=0))
    rec.add(tj.Step(role="assistant", content="yo", output_ids=[3, 4]))
    rec.finish_turn({"stop": "answer"})
    rows = tmp_path / "sft.jsonl"
    r = subprocess.run([*CLI, "traces-to-data", str(runs), "--out", str(rows)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "not token exact: 1" in r.stdout and "1 trajectories left out" in r.stderr
    (row,) = [json.loads(line) for line in rows.read_text().splitlines()]
    assert row["task"] == "ours" and row["input_ids"] == [1, 2, 3, 4]
