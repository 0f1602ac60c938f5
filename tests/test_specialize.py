"""``specialize`` end to end on a tiny random llama (a couple of iterations), and its bad
input through the real command line."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx_lm.models import llama
from mlx_lm.tuner.utils import load_adapters

from mlx_agent.cli.options import PROCESSES
from mlx_agent.sft import SFTConfig, train
from mlx_agent.specialize import Models, SpecializeConfig, SpecializeError, specialize, table
from mlx_agent.synth.config import SynthConfig
from mlx_agent.tools import load_tools

ROOT = Path(__file__).resolve().parent.parent
CATALOGUE = ROOT / "tests" / "data" / "catalogue.json"
CLI = [sys.executable, "-m", "mlx_agent.cli.main", "specialize"]
TINY = llama.ModelArgs(model_type="llama", hidden_size=32, num_hidden_layers=1,
                       intermediate_size=64, num_attention_heads=2, num_key_value_heads=1,
                       rms_norm_eps=1e-5, vocab_size=49152, tie_word_embeddings=True)
FAST = SpecializeConfig(synth=SynthConfig(n_train=8, n_heldout=3),
                        sft=SFTConfig(iters=2, batch_size=2, steps_per_report=1),
                        max_steps=2, max_tokens=12)


@pytest.fixture
def tiny_models(tiny_lm):
    """Loads a tiny random llama behind SmolLM2's tokenizer, the same weights each time,
    with an adapter directory applied when given (as ``models.load`` does)."""
    loads = []

    def load_tiny(adapter=None):
        mx.random.seed(0)
        model = llama.Model(TINY)
        if adapter is not None:
            load_adapters(model, str(adapter))
        mx.eval(model.parameters())
        loads.append(adapter)
        return replace(tiny_lm, model=model)

    return Models(load_tiny), loads


def test_specialize_writes_a_whole_result_and_its_adapter_loads(tiny_models, tmp_path):
    models, loads = tiny_models
    tools = load_tools(CATALOGUE)
    out = tmp_path / "out"
    lines = []
    results = specialize(models, tools, CATALOGUE.read_bytes(), out, FAST, log=lines.append)
    assert sorted(p.name for p in out.iterdir()) == [
        "adapter_config.json", "adapters.safetensors", "results.json", "rows.jsonl", "tasks"]
    assert sorted(p.name for p in (out / "tasks").iterdir()) == [
        "heldout.jsonl", "report.json", "tools.json", "train.jsonl"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no temporary left beside it
    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o777 & ~umask  # as mkdir makes it, not 0700
    saved = json.loads((out / "results.json").read_text())
    assert saved["rows"] == 8 and saved["sft"]["iters"] == 2
    assert saved["before"]["runs"] == saved["after"]["runs"] == 3
    assert saved["tool_results"]["real"] > 0  # the catalogue's tools ran
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    assert all(len(r["input_ids"]) == len(r["loss_mask"]) and any(r["loss_mask"]) for r in rows)
    assert loads[:2] == [None, None] and Path(loads[2]).name.startswith(".out.")  # specialist
    adapter = json.loads((out / "adapter_config.json").read_text())
    assert adapter["lora_parameters"]["rank"] == 8
    assert "specialist" in table(results)[2] and any("rows:" in line for line in lines)
    trained = [line for line in lines if "] trained " in line]  # after "[   3 s]"
    assert re.fullmatch(r"\[ *\d+ s\] trained 2 iterations; loss \d+\.\d{4} → \d+\.\d{4}",
                        trained[0]), trained


def test_specialize_trains_on_from_a_given_adapter(tiny_models, tmp_path):
    models, _ = tiny_models
    tools = load_tools(CATALOGUE)
    first = tmp_path / "general"
    specialize(models, tools, CATALOGUE.read_bytes(), first, FAST, log=lambda m: None)
    start = mx.load(str(first / "adapters.safetensors"))
    again = replace(FAST, sft=replace(FAST.sft, rank=2))  # ignored: the adapter's own shape
    results = specialize(Models(models.load, str(first)), tools, CATALOGUE.read_bytes(),
                         tmp_path / "special", again, log=lambda m: None)
    after = mx.load(str(tmp_path / "special" / "adapters.safetensors"))
    assert results["start"] == "base + adapter"
    assert set(after) == set(start) and all(after[k].shape == start[k].shape for k in start)
    assert any(not mx.array_equal(after[k], start[k]) for k in start)  # trained further


def test_batched_held_out_evals_give_the_results_of_unbatched_ones(tiny_models, tmp_path):
    models, _ = tiny_models
    tools = load_tools(CATALOGUE)

    def figures(batch):
        r = specialize(models, tools, CATALOGUE.read_bytes(), tmp_path / f"b{batch}",
                       replace(FAST, batch=batch), log=lambda m: None)
        return [{k: v for k, v in r[side].items() if k != "seconds"}
                for side in ("before", "after")]

    assert figures(3) == figures(1)


def test_a_failure_midway_leaves_no_output(tiny_models, tmp_path):
    models, _ = tiny_models

    def broken(adapter=None):
        if adapter is not None:
            raise RuntimeError("the specialist does not load")
        return models.load()

    out = tmp_path / "out"
    with pytest.raises(RuntimeError):
        specialize(Models(broken), load_tools(CATALOGUE), CATALOGUE.read_bytes(), out, FAST,
                   log=lambda m: None)
    assert list(tmp_path.iterdir()) == []


def test_a_previous_result_is_replaced_and_other_directories_are_refused(tiny_models,
                                                                        tmp_path):
    models, _ = tiny_models
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.json").write_text("{}")
    (out / "stale.txt").write_text("old")
    specialize(models, load_tools(CATALOGUE), CATALOGUE.read_bytes(), out, FAST,
               log=lambda m: None)
    assert not (out / "stale.txt").exists() and (out / "adapters.safetensors").exists()
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    with pytest.raises(SpecializeError, match="other files"):
        specialize(models, load_tools(CATALOGUE), CATALOGUE.read_bytes(), mine, FAST)
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]


@pytest.mark.parametrize("out, where", [(".", "the current directory"),
                                        ("{cwd}", "the current directory"),
                                        ("{cwd}/sub/..", "the current directory"),
                                        ("..", "above the current directory")])
def test_an_out_that_is_the_current_directory_is_refused_before_the_work(tiny_models,
                                                                         tmp_path, out, where,
                                                                         monkeypatch):
    """The result replaces --out by a rename, which the current directory cannot take: an
    empty one passed the checks, and after synthesis, evals and training the run ended in
    "PosixPath('.') has an empty name", the result deleted (a path naming it otherwise
    would leave the shell in a removed folder)."""
    models, loads = tiny_models
    work = tmp_path / "work"
    (work / "sub").mkdir(parents=True)
    (work / "sub").rmdir()
    (tmp_path / "results.json").write_text("{}")  # "..": a previous result, replaceable
    monkeypatch.chdir(work)
    with pytest.raises(SpecializeError, match=f"is {where}, which the result would "
                                              "replace; give a new directory"):
        specialize(models, load_tools(CATALOGUE), CATALOGUE.read_bytes(),
                   out.format(cwd=work), FAST, log=lambda m: None)
    assert loads == [] and list(work.iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json", "work"]


def test_a_minutes_budget_ends_training_early_and_still_writes_the_adapter(tiny_models,
                                                                          tmp_path):
    models, _ = tiny_models
    lm = models.load()
    ids = lm.encode('<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n{"answer":"hello"}')
    rows = [{"input_ids": ids, "loss_mask": [0] * 8 + [1] * (len(ids) - 8)}] * 4
    start = time.monotonic()
    stats = train(lm, rows, tmp_path / "a", SFTConfig(iters=100_000, batch_size=2,
                                                       minutes=0.03, val_fraction=0.0))
    assert 0 < stats["iters"] < 100_000 and time.monotonic() - start < 30
    assert (stats["train_rows"], stats["val_rows"]) == (4, 0)  # no validation pass asked
    assert models.load(adapter=tmp_path / "a")  # written, and it loads


def test_sft_trains_a_quantized_model_on_the_cpu_kernels(tiny_models, tmp_path):
    """A model as loaded on a CPU (quantized, its layers on the kernels, which have no
    gradients) trains: sft dequantizes it and puts MLX's own layers back."""
    from mlx_agent.kernels import kernel_status
    from mlx_agent.models.cpu_layers import use_cpu_kernels

    if not kernel_status().available:
        pytest.skip(f"no CPU kernels here: {kernel_status().reason}")
    models, _ = tiny_models
    lm = models.load()
    nn.quantize(lm.model, group_size=32, bits=4)
    assert use_cpu_kernels(lm.model) > 0
    ids = lm.encode('<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n{"answer":"hello"}')
    rows = [{"input_ids": ids, "loss_mask": [0] * 8 + [1] * (len(ids) - 8)}] * 4
    stats = train(lm, rows, tmp_path / "a", SFTConfig(iters=2, batch_size=2))
    assert stats["iters"] == 2
    assert not any("Kernel" in type(m).__name__ or "Quantized" in type(m).__name__
                   for _, m in lm.model.named_modules())


def cli(*args, cwd=ROOT):
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120, cwd=cwd,
                          env={**os.environ})


def test_bad_input_is_one_line_and_leaves_nothing(tmp_path):
    out = tmp_path / "out"
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    never = tmp_path / "never.json"
    never.write_text(json.dumps([{"name": "never", "description": "Cannot be called.",
                                  "parameters": {"type": "object", "required": ["z"],
                                                 "properties": {"z": {"enum": []}}},
                                  "_exec": "echo hi"}]))
    blocker = tmp_path / "file"
    blocker.write_text("x")
    cases = [(("--tools", str(tmp_path / "missing.json"), "--out", str(out)), "cannot read"),
             (("--tools", str(bad), "--out", str(out)), "not valid JSON"),
             (("--tools", str(never), "--out", str(out)), "no training task that calls"),
             (("--tools", str(CATALOGUE), "--out", str(blocker / "sub")), "cannot write"),
             (("--tools", str(CATALOGUE), "--out", str(blocker)), "is a file"),
             (("--tools", str(CATALOGUE), "--out", str(out), "--processes", "3"),
              # --processes is at most the CPUs: on fewer than 3, 3 is refused for that
              "--processes must divide the batch of 4 rows (1, 2, 4)" if PROCESSES.max >= 3
              else "is not in the range 1<=x<=")]
    for args, message in cases:
        r = cli(*args)
        assert r.returncode == 2, (args, r.stderr)
        assert r.stderr.count("\n") == 1 and message in r.stderr, (args, r.stderr)
        assert "Traceback" not in r.stderr
        assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.json", "file", "never.json"]
    r = cli("--out", str(out))
    assert r.returncode == 2 and "give --tools FILE" in r.stderr and not out.exists()


def test_the_built_in_tools_run_over_a_fresh_copy_of_the_fixture(tiny_models, tmp_path):
    """specialize --builtin-tools: the rows' results are the built-ins' own, run over a copy
    of the fixture (never the fixture itself), and the held-out tasks run with them too."""
    models, _ = tiny_models
    fixture = tmp_path / "fixture"
    (fixture / "docs").mkdir(parents=True)
    (fixture / "notes.txt").write_text("launch on March 3\n")
    (fixture / "docs" / "agenda.md").write_text("meet Dana\n")
    before = sorted(p.relative_to(fixture) for p in fixture.rglob("*"))
    config = replace(FAST, synth=SynthConfig(n_train=12, n_heldout=3), builtin=True,
                     fixture=str(fixture))
    results = specialize(models, [], b'{"tools": []}\n', tmp_path / "out", config,
                         log=lambda m: None)
    assert sorted(p.relative_to(fixture) for p in fixture.rglob("*")) == before  # untouched
    assert (fixture / "notes.txt").read_text() == "launch on March 3\n"
    rows = [json.loads(line) for line in (tmp_path / "out" / "rows.jsonl").read_text().splitlines()]
    text = json.dumps([r["messages"] for r in rows])
    assert "read_file" in text and results["tool_results"].get("real", 0) > 0
    results_seen = [m["content"] for r in rows for m in r["messages"] if m["role"] == "tool"]
    assert any("launch on March 3" in c or "meet Dana" in c for c in results_seen)  # real
    held = [json.loads(line) for line in
            (tmp_path / "out" / "tasks" / "heldout.jsonl").read_text().splitlines()]
    assert held and all(t["builtin_tools"] and t["fixture"] == "fixture" for t in held)
    assert results["before"]["runs"] == results["after"]["runs"] == 3
