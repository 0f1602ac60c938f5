"""traces-to-data rows and masks, and a few steps of LoRA SFT on a tiny model."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import mlx.core as mx
import numpy as np
import pytest

from mlx_agent import trajectory as tj
from mlx_agent.models import load
from mlx_agent.models import tinygpt_format as fmt
from mlx_agent.sft import SFTConfig, read_rows, train
from mlx_agent.training_data import convert

from .conftest import random_tinygpt_file


def write_traj(d, task, prompt, reply_ids, reward, system=(1, 2, 3), tool=None):
    rec = tj.Recorder(d, task=task)
    rec.add(tj.Step(role="system", content="sys", input_ids=list(system), prefix_len=0))
    rec.add(tj.Step(role="user", content=prompt, input_ids=[10 + len(prompt) % 7, 11]))
    call = tj.ToolCallRecord(name="echo", arguments_json='{"text": "x"}') if tool else None
    rec.add(tj.Step(role="assistant", content="reply", output_ids=list(reply_ids), tool_call=call))
    if tool:
        rec.add(tj.Step(role="tool", content=tool, input_ids=[50, 51], tool_result=tj.ToolResultRecord(
            name="echo", stdout="x", stderr="", exit_code=0, duration_sec=0.01)))
        rec.add(tj.Step(role="assistant", content="done", output_ids=[60]))
    rec.finish_turn({"stop": "answer"})
    tj.set_reward(rec.path, reward)
    return rec.path


def test_sft_rows_masks_and_filters(tmp_path):
    d = tmp_path / "traj"
    write_traj(d, "a", "add two numbers please", [20, 21], 1.0, tool='{"tool": "echo"}')
    write_traj(d, "a", "add two numbers please", [20, 21], 1.0, tool='{"tool": "echo"}')  # exact dup
    write_traj(d, "b", "add two numbers please now", [22], 1.0)  # near-dup prompt? (different)
    write_traj(d, "c", "what is the weather in paris today", [23], 0.0)  # low reward
    (d / "junk.atraj").write_text("nope")
    out = tmp_path / "sft.jsonl"
    counts = convert(d, out, mode="sft", min_reward=0.5)
    assert (counts.read, counts.unreadable, counts.low_reward, counts.exact_duplicates) == (5, 1, 1, 1)
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(rows) == counts.rows == 2 - counts.near_duplicates
    full = next(r for r in rows if r["task"] == "a")
    assert full["input_ids"] == [1, 2, 3, 10 + len("add two numbers please") % 7, 11, 20, 21, 50, 51, 60]
    assert full["loss_mask"] == [0, 0, 0, 0, 0, 1, 1, 0, 0, 1]
    roles = [m["role"] for m in full["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "assistant"]
    assert full["messages"][2]["tool_calls"][0]["function"]["name"] == "echo"
    assert read_rows(out) == rows


def test_a_reward_that_is_not_a_number_is_no_reward_and_ids_must_be_token_ids(tmp_path):
    """A hostile tester's files: "nan" passed --min-reward 1 (nan < 1 is false) and was
    written as JSON's invalid NaN; an id of -5 went into the rows."""
    d = tmp_path / "traj"
    path = write_traj(d, "a", "add two numbers please", [20, 21], 1.0)
    traj = tj.read(path)
    traj.summary["reward"] = "nan"
    tj.write(path, traj)
    counts = convert(d, tmp_path / "sft.jsonl", mode="sft", min_reward=1.0, dry_run=True)
    assert (counts.low_reward, counts.rows) == (1, 0)
    traj.summary["reward"] = "1"
    traj.steps[1].input_ids = [10, -5]
    tj.write(path, traj)
    with pytest.raises(ValueError, match="unreadable 1\\); .*Expected `int` >= 0"):
        convert(d, tmp_path / "sft.jsonl", mode="sft")


@pytest.mark.parametrize("prefix_len", [-2, 4])
def test_a_prefix_len_outside_the_sequence_makes_the_file_unreadable(tmp_path, prefix_len):
    """A negative prefix_len or one past the ids so far replayed into rows that were not the
    model's tokens, with no warning; now the file is counted unreadable, saying why."""
    d = tmp_path / "traj"
    write_traj(d, "a", "add two numbers please", [20, 21], 1.0)
    path = write_traj(d, "b", "what is the weather in paris today", [23], 1.0)
    traj = tj.read(path)
    traj.steps[1].prefix_len = prefix_len  # after the system step's 3 ids: 0..3 is valid
    tj.write(path, traj)
    counts = convert(d, tmp_path / "sft.jsonl", mode="sft")
    assert (counts.read, counts.unreadable, counts.rows) == (2, 1, 1)
    assert counts.unreadable_why == [f"{path}: {path} is not a valid .atraj file: step 1's "
                                     f"prefix_len {prefix_len} is outside 0..3"]
    traj.steps[1].prefix_len = 3  # the end of the sequence is a valid place to start
    tj.write(path, traj)
    assert convert(d, tmp_path / "sft.jsonl", mode="sft").unreadable == 0


@pytest.mark.parametrize("edit, why", [
    (lambda step: setattr(step, "role", "wizard"), "Invalid enum value 'wizard'"),
    (lambda step: setattr(step.tool_call, "arguments_json", "{not json"),
     "step 2's tool call arguments are not a JSON object"),
    (lambda step: setattr(step.tool_call, "arguments_json", "[" * 100_000 + "]" * 100_000),
     "step 2's tool call arguments are not a JSON object"),
])
def test_a_role_or_call_arguments_rows_cannot_hold_make_the_file_unreadable(tmp_path, edit, why):
    """Both were copied into training rows as they were (a tester's 'wizard' role)."""
    d = tmp_path / "traj"
    path = write_traj(d, "a", "add two numbers please", [20, 21], 1.0, tool='{"tool": "echo"}')
    traj = tj.read(path)
    edit(traj.steps[2])
    tj.write(path, traj)
    counts = convert(d, tmp_path / "sft.jsonl", mode="sft", dry_run=True)
    assert counts.unreadable == 1 and why in counts.unreadable_why[0], counts.unreadable_why


def test_near_duplicate_prompts_are_dropped(tmp_path):
    d = tmp_path / "traj"
    long = "please read the configuration file in the project root and report every key it sets"
    write_traj(d, "a", long, [20], 1.0)
    write_traj(d, "a", long + " ", [21], 1.0)  # same words, different ids
    counts = convert(d, None, dry_run=True)
    assert (counts.exact_duplicates, counts.near_duplicates, counts.kept) == (0, 1, 1)


_PEAK = """
import resource, sys
from mlx_agent.training_data import convert
counts = convert(sys.argv[1], sys.argv[2])
print(counts.rows, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def test_sft_rows_are_converted_and_written_one_trajectory_at_a_time(tmp_path):
    """A folder of large trajectories was held in memory whole, with every row (a tester's
    240 MB file took 4.3 GB; several such files, the machine's memory)."""
    def peak_kib(files: int) -> int:
        d = tmp_path / f"runs{files}"
        d.mkdir()
        for j in range(files):
            ids = [1000 + (i * 7 + j) % 40_000 for i in range(500_000)]  # 500k ids, ~3.4 MB
            (d / f"t{j}.atraj").write_text(json.dumps({"version": 1, "id": f"t{j}", "steps": [
                {"role": "user", "content": f"question {j} on zebra {13 * j}", "input_ids": ids,
                 "prefix_len": 0},
                {"role": "assistant", "content": "ok", "output_ids": [5, 6, 7]}]}))
        r = subprocess.run([sys.executable, "-c", _PEAK, str(d), str(tmp_path / "rows.jsonl")],
                           capture_output=True, text=True, cwd=tmp_path, timeout=120)
        rows, peak = map(int, r.stdout.split())
        assert rows == files, r.stderr
        return peak

    one, six = peak_kib(1), peak_kib(6)
    # held together, the five more cost some 40 MB each (330 MB against 129 MB)
    assert six - one < 60 * 1024, (one, six)


def test_dpo_pairs_higher_reward_with_lower(tmp_path):
    d = tmp_path / "traj"
    write_traj(d, "t", "same prompt", [20, 21], 1.0)
    write_traj(d, "t", "same prompt", [30], 0.0)
    write_traj(d, "t", "same prompt", [31, 32], 0.5)
    write_traj(d, "u", "other prompt entirely different", [40], 1.0)
    out = tmp_path / "dpo.jsonl"
    convert(d, out, mode="dpo")
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    pairs = {(tuple(r["chosen_ids"]), tuple(r["rejected_ids"])) for r in rows}
    assert pairs == {((20, 21), (30,)), ((20, 21), (31, 32)), ((31, 32), (30,))}
    assert all(r["prompt_ids"] == rows[0]["prompt_ids"] for r in rows)


def hello_model(tmp_path):
    """A tiny random model, one chat's ids, and eight rows that train its answer only."""
    path = tmp_path / "m.tinygpt"
    fmt.write(path, random_tinygpt_file(seed=7))
    lm = load(path)
    text = lm.encode('<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n{"answer": "hello"}')
    cut = len(lm.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"))
    return path, lm, text, [{"input_ids": text,
                             "loss_mask": [0] * cut + [1] * (len(text) - cut)}] * 8


def test_sft_lowers_the_loss_and_writes_a_loadable_adapter(tmp_path):
    path, lm, text, rows = hello_model(tmp_path)
    stats = train(lm, rows, tmp_path / "adapter",
                  SFTConfig(iters=30, batch_size=2, learning_rate=3e-3, rank=4, num_layers=2,
                            keys=("attn.q_proj", "attn.v_proj", "mlp.fc_out"),
                            steps_per_report=5))
    assert stats["last_loss"] < stats["first_loss"] * 0.7
    adapted = load(path, adapter=tmp_path / "adapter")
    base = load(path)
    ids = mx.array([text])
    np.testing.assert_allclose(np.array(adapted.model(ids)), np.array(lm.model(ids)), atol=1e-4)
    assert not np.allclose(np.array(adapted.model(ids)), np.array(base.model(ids)), atol=1e-3)


def test_the_loss_on_scored_positions_equals_the_loss_on_all_logits(tmp_path):
    """masked_loss runs the head on the masked positions only (padded to a shape step):
    the same loss and LoRA gradients as cross-entropy over every position's logits."""
    import mlx.nn as nn
    from mlx.utils import tree_flatten

    from mlx_agent.sft import SCORED_STEP, _differentiable, _lora, batches, masked_loss

    path = tmp_path / "m.tinygpt"
    fmt.write(path, random_tinygpt_file(seed=3))
    lm = load(path)
    _differentiable(lm.model)
    lm.model.freeze()
    _lora(lm.model, SFTConfig(rank=4, num_layers=2, keys=("attn.q_proj", "attn.v_proj")))
    for _, m in lm.model.named_modules():  # LoRA starts at zero: make its gradient depend on it
        if "lora_b" in m:
            m.lora_b = mx.random.normal(m.lora_b.shape, key=mx.random.key(1)) * 0.1
    rng = np.random.default_rng(0)
    rows = [{"input_ids": rng.integers(1, 200, n).tolist(),
             "loss_mask": (rng.random(n) < 0.3).astype(int).tolist()} for n in (37, 52, 18)]
    tokens, scored, weights = next(batches(rows, 3, 2048, loop=False))
    assert scored.size % SCORED_STEP == 0 and weights.sum().item() == sum(
        sum(r["loss_mask"][1:]) for r in rows)

    width = tokens.shape[1]
    order = [next(r for r in rows if r["input_ids"] == t[:len(r["input_ids"])])
             for t in tokens.tolist()]  # the batch's rows, in its (shuffled) order
    mask = mx.array([r["loss_mask"] + [0] * (width - len(r["loss_mask"])) for r in order],
                    dtype=mx.float32)[:, 1:]

    def full_loss(model, tokens, _scored, _weights):  # every position's logits, then the mask
        ce = nn.losses.cross_entropy(model(tokens[:, :-1]), tokens[:, 1:]) * mask
        return ce.sum() / mask.sum(), mask.sum()

    (ours, n), grads = nn.value_and_grad(lm.model, masked_loss)(lm.model, tokens, scored, weights)
    (ref, m), ref_grads = nn.value_and_grad(lm.model, full_loss)(lm.model, tokens, scored,
                                                                   weights)
    assert n.item() == m.item() and abs(ours.item() - ref.item()) < 1e-5 * abs(ref.item())
    flat, ref_flat = dict(tree_flatten(grads)), dict(tree_flatten(ref_grads))
    assert flat.keys() == ref_flat.keys() and len(flat) == 8  # q and v, a and b, two layers
    for k in flat:
        np.testing.assert_allclose(np.array(flat[k]), np.array(ref_flat[k]), rtol=1e-4,
                                   atol=1e-6)


def test_batches_are_rows_of_about_one_length_and_each_pass_takes_every_row_once():
    from mlx_agent.sft import batches

    lengths = [int(n) for n in np.random.default_rng(0).permutation(np.arange(20, 120))]
    rows = [{"input_ids": [i + 1] * n, "loss_mask": [1] * n} for i, n in enumerate(lengths)]
    passes = batches(rows, 4, 2048, seed=3)
    for _ in range(2):  # 100 rows: 25 full batches a pass
        seen, padding = [], 0
        for tokens, _, weights in (next(passes) for _ in range(25)):
            ids = [t[0] - 1 for t in tokens.tolist()]
            seen += ids
            padding += tokens.shape[1] * 4 - sum(lengths[i] for i in ids)
            assert weights.sum().item() == sum(lengths[i] - 1 for i in ids)
        assert sorted(seen) == list(range(100))
        assert padding < 100 * 4  # a random draw of 4 pads about 24 tokens a row
    # the two processes of a step split one batch
    a, b = (next(batches(rows, 4, 2048, seed=5, part=(k, 2)))[0] for k in (0, 1))
    assert a.shape[0] == b.shape[0] == 2 and not set(a[:, 0].tolist()) & set(b[:, 0].tolist())


def test_two_processes_train_one_adapter(tmp_path):
    """processes=2: two real processes over MLX's ring backend, each half of every batch;
    the loss falls, rank 0 writes the adapter, and the caller's model carries it after."""
    path, lm, text, rows = hello_model(tmp_path)
    config = SFTConfig(iters=30, batch_size=2, learning_rate=3e-3, rank=4, num_layers=2,
                       keys=("attn.q_proj", "attn.v_proj"), steps_per_report=5, processes=2)
    stats = train(lm, rows, tmp_path / "adapter", config)
    assert stats["iters"] == 30 and stats["last_loss"] < stats["first_loss"] * 0.7
    ids = mx.array([text])
    adapted = load(path, adapter=tmp_path / "adapter")
    np.testing.assert_allclose(np.array(adapted.model(ids)), np.array(lm.model(ids)), atol=1e-4)
    with pytest.raises(ValueError, match="without an adapter"):
        train(adapted, rows, tmp_path / "again", config)
    with pytest.raises(ValueError, match="multiple of the processes"):
        train(load(path), rows, tmp_path / "odd", SFTConfig(batch_size=3, processes=2))


def test_workers_that_never_connect_or_never_finish_are_stopped(tmp_path):
    """A ring that never forms, or a run past its deadline, is an error, not a hang."""
    import subprocess
    import time

    from mlx_agent.sft import _wait_all
    from mlx_agent.tools.executor import Reaper

    procs = [Reaper(subprocess.Popen(["sleep", "30"])) for _ in range(2)]
    for reaper in procs:
        reaper.start()
    (tmp_path / "ready0").touch()  # one of two joined
    start = time.monotonic()
    try:
        with pytest.raises(RuntimeError, match="1 of 2 training processes did not connect"):
            _wait_all(procs, tmp_path, connect_seconds=0.5)
        (tmp_path / "ready1").touch()
        with pytest.raises(RuntimeError, match="still running"):
            _wait_all(procs, tmp_path, deadline=time.monotonic() + 0.5)
        assert time.monotonic() - start < 10 and not any(r.ended for r in procs)
    finally:
        for reaper in procs:
            reaper.kill()
            reaper.reaped()
        assert all(r.proc.returncode == -9 for r in procs)


def test_bad_rows_are_a_clear_error(tmp_path):
    from mlx_agent.sft import check_vocabulary

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": []}\n')
    with pytest.raises(ValueError, match="needs input_ids and loss_mask"):
        read_rows(bad)
    # ids that are not ids: a TypeError, std::bad_cast, or (past the vocabulary) a segfault
    for ids in ("5", '"abc"', "[1, -5]", "[1, 99999999999999999999]", "[1, true]"):
        bad.write_text('{"input_ids": %s, "loss_mask": [0, 1]}\n' % ids)
        with pytest.raises(ValueError, match="bad.jsonl:1: input_ids must be a list of token"):
            read_rows(bad)
    bad.write_text('{"input_ids": [1, 2], "loss_mask": [0, 1]}\n'
                   '{"input_ids": [1, 1000000000], "loss_mask": [0, 1]}\n')
    with pytest.raises(ValueError, match="row 2 holds token id 1000000000, past the model's "
                                         "vocabulary of 49152"):
        check_vocabulary(read_rows(bad), 49152, "bad.jsonl")
    # nothing to train on: "[logsumexp] Received empty array" from inside MLX
    for ids, mask in (([1, 2], [0, 0]), ([1, 2], [1, 0]), ([1], [1])):
        bad.write_text(json.dumps({"input_ids": [5, 6], "loss_mask": [0, 1]}) + "\n"
                       + json.dumps({"input_ids": ids, "loss_mask": mask}) + "\n")
        with pytest.raises(ValueError, match="bad.jsonl:2: the row has no scored token after "
                                             "its first"):
            read_rows(bad)
    # said as its line, as every other error of the file is (a blank line made them differ)
    bad.write_text('\n{"input_ids": [1, 2], "loss_mask": [0, 0]}\n')
    with pytest.raises(ValueError, match="bad.jsonl:2: the row has no scored token"):
        read_rows(bad)
    bad.write_text('{"input_ids": [], "loss_mask": []}\n')  # empty, not of different lengths
    with pytest.raises(ValueError, match="bad.jsonl:1: input_ids is empty"):
        read_rows(bad)
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="not a regular file"):
        read_rows(fifo)  # it waited for a writer


def test_rows_are_cut_at_newlines_only(tmp_path):
    """traces-to-data writes with ensure_ascii=False: a tool output's U+2028 or \\x1c stays
    raw in a row, and str.splitlines cut the row there ("not a traces-to-data sft row")."""
    from mlx_agent.fileio import write_jsonl

    rows = [{"input_ids": [1, 2], "loss_mask": [0, 1], "text": "a\u2028b\x85c\x1dd\x0ce"},
            {"input_ids": [3, 4], "loss_mask": [0, 1]}]
    write_jsonl(tmp_path / "rows.jsonl", rows)
    assert read_rows(tmp_path / "rows.jsonl") == rows


def test_rows_scored_only_past_the_training_length_are_left_out(tmp_path):
    """Training cuts rows at max_seq_length: a batch of rows whose sampled tokens all lie
    past it had no target, and training failed inside MLX ("[logsumexp] Received empty
    array") at whatever step drew it, the adapter lost."""
    path, lm, text, rows = hello_model(tmp_path)
    late = {"input_ids": text, "loss_mask": [0] * (len(text) - 1) + [1]}
    config = SFTConfig(iters=6, batch_size=1, rank=4, num_layers=1, keys=("attn.q_proj",),
                       max_seq_length=len(text) - 1, val_fraction=0)
    stats = train(lm, [late, late, rows[0], late], tmp_path / "adapter", config)
    assert stats["train_rows"] == 1 and stats["cut_rows"] == 3 and stats["iters"] == 6
    assert (tmp_path / "adapter" / "adapters.safetensors").is_file()
    with pytest.raises(ValueError, match=f"no row has a scored token .* within its first "
                                         f"{len(text) - 1} tokens"):
        train(load(path), [late], tmp_path / "other", config)
    assert not (tmp_path / "other").exists()


def test_an_interrupted_training_leaves_the_adapter_folder_as_it_was(tmp_path, monkeypatch):
    """The config was written first and the weights at the end: Ctrl-C left a new config
    over an old adapter's weights (rank 4 said, rank 48 stored)."""
    from mlx_agent import sft

    path, lm, text, rows = hello_model(tmp_path)
    out = tmp_path / "adapter"
    out.mkdir()
    (out / "adapter_config.json").write_text("old config")
    (out / "adapters.safetensors").write_bytes(b"old weights")

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(sft, "batches", interrupted)
    with pytest.raises(KeyboardInterrupt):
        train(lm, rows, out, SFTConfig(iters=5, batch_size=2, rank=4, num_layers=1,
                                       keys=("attn.q_proj",)))
    assert (out / "adapter_config.json").read_text() == "old config"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adapter", "m.tinygpt"]


def test_a_training_that_diverges_writes_no_adapter_and_says_so(tmp_path):
    """A learning rate far too high made every weight NaN: the adapter was written and the
    command said "loss nan → nan; adapter written", exit 0; the adapter then broke the model."""
    from mlx_agent.fileio import write_jsonl

    path, lm, text, rows = hello_model(tmp_path)
    write_jsonl(tmp_path / "rows.jsonl", rows)
    out = tmp_path / "ad"
    r = subprocess.run([sys.executable, "-m", "mlx_agent.cli.main", "sft", str(path),
                        "--data", str(tmp_path / "rows.jsonl"), "--out", str(out),
                        "--iters", "3", "--batch-size", "2", "--learning-rate", "1e38"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stdout + r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("mlx_agent: error: the training diverged") and \
        "lower the learning rate" in last, r.stderr
    assert "Traceback" not in r.stderr and "adapter written" not in r.stdout
    assert not out.exists()  # no adapter, no staging folder, no folder made for them


def test_cli_traces_to_data_and_usage_errors(tmp_path):
    import os
    import subprocess
    import sys

    d = tmp_path / "traj"
    write_traj(d, "a", "add two numbers please", [20, 21], 1.0)
    cli = [sys.executable, "-m", "mlx_agent.cli.main"]
    env = dict(os.environ)
    ok = subprocess.run([*cli, "traces-to-data", str(d), "--out", str(tmp_path / "o.jsonl")],
                        capture_output=True, text=True, env=env)
    assert ok.returncode == 0 and "wrote 1 sft rows" in ok.stdout and "kept: 1" in ok.stdout
    assert ok.stderr.startswith("read 1/1 100% ") and ok.stderr.rstrip().endswith(".atraj")
    missing = subprocess.run([*cli, "traces-to-data", str(d)], capture_output=True, text=True,
                             env=env)
    assert missing.returncode == 2 and "--out FILE, or --dry-run" in missing.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{}\n")
    r = subprocess.run([*cli, "sft", "--data", str(bad), "--out", str(tmp_path / "ad")],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 2 and "needs input_ids and loss_mask" in r.stderr
    assert "Traceback" not in r.stderr
    # 2, not 3: --processes is at most the CPUs, and 3 was refused for that on 2 cores
    odd = subprocess.run([*cli, "sft", "--data", str(bad), "--out", str(tmp_path / "ad"),
                          "--processes", "2", "--batch-size", "3"], capture_output=True,
                         text=True, env=env)
    assert odd.returncode == 2 and "--processes 2 must divide --batch-size 3" in odd.stderr


def test_cli_sft_into_a_log_file_has_no_colour_codes(tmp_path):
    import os
    import subprocess
    import sys

    d = tmp_path / "traj"
    write_traj(d, "a", "add two numbers please", [20, 21], 1.0)
    cli = [sys.executable, "-m", "mlx_agent.cli.main"]
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE")}
    data = tmp_path / "o.jsonl"
    subprocess.run([*cli, "traces-to-data", str(d), "--out", str(data)], check=True, env=env,
                   capture_output=True)
    with open(tmp_path / "log", "w+") as log:  # a file, as `mlx_agent sft ... >log 2>&1`
        r = subprocess.run([*cli, "sft", "--data", str(data), "--out", str(tmp_path / "ad"),
                            "--iters", "2", "--batch-size", "1"], stdout=log, stderr=log,
                           env=env, timeout=300)
        log.seek(0)
        text = log.read()
    assert r.returncode == 0, text
    assert "train_loss" in text and "adapter written to" in text
    assert "\x1b" not in text, repr(text)
