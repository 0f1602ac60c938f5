"""``mlx_agent specialize``: a specialist LoRA adapter for a tool catalogue, end to end.

:func:`specialize` runs the steps in order, each with one line to ``log``:

1. synthesise training and held-out tasks from the catalogue (:mod:`mlx_agent.synth`);
2. write a conversation for every training task and render it as a training row, token-exact
   with the agent's view (:mod:`mlx_agent.synth.conversations`): no rollouts;
3. evaluate the starting model (the base model, or base + ``adapter``) on the held-out tasks;
4. LoRA fine-tune (the recipe of ``models/smollm2-135m-tools``, or more training of
   ``adapter`` when one is given) within an iteration and a time budget;
5. evaluate the specialist on the same held-out tasks, the same way.

With a :class:`Cluster`, steps 3 and 5 run on a Ray cluster (``--ray``): every worker loads
the base model, and gets the held-out tasks' directory and the adapter packed in its
arguments (:mod:`mlx_agent.cluster_eval`), since they exist only here; the figures are the
local run's. Synthesis, rows and training stay here.

Everything is written into a temporary directory beside ``out`` and renamed to ``out`` at
the end, so ``out`` holds a whole result or nothing: the adapter (``--adapter OUT`` loads
it), ``tasks/`` (synth's files), ``rows.jsonl`` and ``results.json``. An existing ``out`` is
replaced only when it is itself a specialize result. Not promised: that the specialist
beats its start (``results.json`` says whether it did); anything of the held-out figures
beyond these tasks.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from .agent import agent_format
from .engine import SamplingParams
from .errors import UserFacingError
from .evaluate import Summary, run
from .fileio import cannot_create, copy_tree, temp_dir_beside, write_jsonl, write_text
from .sft import SFTConfig, train
from .synth.config import SynthConfig
from .synth.conversations import Outcomes, rows
from .synth.synthesis import report_lines, synthesize, write
from .synth.values import files_under
from .tools import Tool, builtin_tools
from .tools.sandbox import Sandbox

RESULTS = "results.json"
ADAPTER_FILES = ("adapter_config.json", "adapters.safetensors")  # what sft writes
# The recipe of models/smollm2-135m-tools (scripts/specialist_trial.py), with no validation
# split: the held-out tasks measure the result (a validation pass of 20 rows took 7 minutes)
RECIPE = SFTConfig(iters=150, batch_size=4, learning_rate=2e-4, rank=8, num_layers=16,
                   val_fraction=0.0)


class SpecializeError(UserFacingError, ValueError):
    """Input specialize cannot use (the message says what to do)."""


@dataclass(frozen=True)
class SpecializeConfig:
    synth: SynthConfig = SynthConfig()
    sft: SFTConfig = RECIPE
    protocol: str = "auto"
    max_steps: int = 4  # a two-call task needs three steps
    max_tokens: int = 128
    sandbox: Sandbox | None = None
    fixture: str | None = None  # the tools' working directory, copied fresh for every run
    builtin: bool = False  # the built-in file tools too, over each run's copy of the fixture
    extra_tools: Sequence[Tool] = field(default=())  # tools no file holds (MCP servers')
    batch: int = 1  # held-out runs decoded together (evaluate.run's batch)
    cluster: "Cluster | None" = None  # held-out runs on Ray instead


@dataclass(frozen=True)
class Cluster:
    """Where held-out runs go with ``--ray``: the cluster, its workers, what they load (the
    base model: ``load``'s arguments) and their sandbox (a ``--sandbox`` choice)."""

    address: str = "auto"
    workers: int | None = None
    spec: str | None = None
    weights: str | None = None
    context_length: int | None = None
    sandbox: str = "auto"
    allow_network: bool = False
    batch: int = 1  # runs at once on each worker

    def evaluate(self, tasks_file: Path, adapter: str | None,
                 config: "SpecializeConfig") -> Summary:
        from .cluster_eval import EvalWorker, ModelSpec, pack, run_eval  # imports Ray

        model = ModelSpec(self.spec, weights=self.weights, context_length=self.context_length,
                          adapter_files=pack(adapter, ADAPTER_FILES) if adapter else None)
        worker = EvalWorker(model, str(tasks_file.parent), config.protocol,
                            _overrides(config), sandbox=self.sandbox,
                            allow_network=self.allow_network,
                            files=pack(tasks_file.parent), batch=self.batch)
        return run_eval(worker, tasks_file, address=self.address, workers=self.workers)


@dataclass
class Models:
    """How to load the model: ``load(adapter=None)`` gives the base model, or the base
    with an adapter directory; ``start`` is the adapter training starts from, if any."""

    load: Callable[..., object]
    start: str | None = None


def prepare_out(out: str | Path) -> Path:
    """A fresh temporary directory beside ``out`` (the result is renamed to ``out``);
    an ``out`` that is a file, a directory with other things in it, or the current
    directory (or one above it: a rename cannot replace it, or leaves the shell in a removed
    folder) is refused."""
    here = Path.cwd()
    target = Path(os.path.abspath(out))
    if target in (here, *here.parents):
        where = "the current directory" if target == here else "above the current directory"
        raise SpecializeError(f"--out {str(out) or repr(str(out))} is {where}, which the "
                              "result would replace; give a new directory (say "
                              "build/specialist)")
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise SpecializeError(f"{out} is a file; give a directory for --out")
    if out.is_dir() and any(out.iterdir()) and not (out / RESULTS).is_file():
        raise SpecializeError(f"{out} is a directory with other files in it; give a new "
                              "or empty directory (a previous specialize result is replaced)")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        return temp_dir_beside(out)
    except OSError as e:
        raise SpecializeError(f"cannot write to {out.parent}: {cannot_create(e, out)}; "
                              "choose a directory you can write") from None


def _publish(tmp: Path, out: Path) -> None:
    """``tmp`` becomes ``out``; a previous result there is removed after the swap."""
    old = None
    if out.exists():
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        os.rename(out, old)
    os.rename(tmp, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _overrides(config: SpecializeConfig) -> dict:
    """The held-out runs' agent settings, the sandbox apart."""
    return {"max_steps": config.max_steps, "max_tokens": config.max_tokens, "grammar": True,
            "sampling": SamplingParams(temperature=0.0)}


def _evaluate(load_lm: Callable[[], object], adapter: str | None, tasks_file: Path,
              config: SpecializeConfig) -> Summary:
    """The held-out runs of the model ``load_lm`` gives (base + ``adapter``)."""
    if config.cluster is not None:
        return config.cluster.evaluate(tasks_file, adapter, config)
    return run(load_lm(), tasks_file, protocol=config.protocol, extra_tools=config.extra_tools,
               config_overrides={**_overrides(config), "sandbox": config.sandbox},
               batch=config.batch, handlers="import")  # its caller loaded (and chose) them


def _row(summary: Summary, kinds: dict[str, str]) -> dict:
    """Eval's row, plus success per task kind."""
    by_kind: dict[str, list[float]] = {}
    for r in summary.runs:
        by_kind.setdefault(kinds[r.task], []).append(r.reward)
    return {**summary.row(),
            "by_kind": {k: f"{sum(v):.0f}/{len(v)}" for k, v in sorted(by_kind.items())}}


def specialize(models: Models, tools: Sequence[Tool], tools_data: bytes, out: str | Path,
               config: SpecializeConfig = SpecializeConfig(),
               log: Callable[[str], None] = print) -> dict:
    """Runs the five steps (module docstring) and returns what ``results.json`` holds."""
    out, start = Path(out), time.perf_counter()
    tmp = prepare_out(out)
    try:
        with tempfile.TemporaryDirectory(prefix="mlx-agent-builtin-") as nowhere:
            # as eval lists them: the file's, the built-ins (made over an empty directory,
            # run over a fresh copy of the fixture, synthesis and eval alike), the servers'
            builtins = builtin_tools(nowhere, sandbox=config.sandbox) if config.builtin else []
            catalogue = [*tools, *builtins, *config.extra_tools]
            results = _steps(models, catalogue, tools_data, tmp, config,
                             lambda msg: log(f"[{time.perf_counter() - start:6.0f} s] {msg}"))
        results["minutes"] = round((time.perf_counter() - start) / 60, 1)
        write_text(tmp / RESULTS, json.dumps(results, indent=1) + "\n")
        _publish(tmp, out)
        return results
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _steps(models: Models, tools: list[Tool], tools_data: bytes, tmp: Path,
           config: SpecializeConfig, log: Callable[[str], None]) -> dict:
    synth = config.synth
    if config.fixture and not synth.files:  # path arguments name the fixture's files
        synth = dataclasses.replace(synth, files=files_under(config.fixture))
    synthesis = synthesize(tools, synth, sandbox=config.sandbox)
    for side, tasks in (("training", synthesis.train), ("held-out", synthesis.heldout)):
        if not any(t.calls for t in tasks):
            skipped = "; ".join(f"{k}: {v}" for k, v in synthesis.report["skipped"].items())
            raise SpecializeError(
                f"synthesis made no {side} task that calls a tool"
                + (f" (skipped {skipped})" if skipped else "")
                + "; give tools whose parameters can be sampled, with distinct calls")
    held = {}
    if config.fixture:  # the tasks run in fresh copies of it, as the rows' tools did
        try:
            copy_tree(config.fixture, tmp / "tasks" / "fixture")
        except OSError as e:
            raise SpecializeError(f"cannot copy the fixture {config.fixture}: {e.filename}: "
                                  f"{e.strerror}") from None
        held["fixture"] = "fixture"
    if config.builtin:
        held["builtin_tools"] = True
    if held:
        synthesis = dataclasses.replace(synthesis, heldout=[
            dataclasses.replace(t, task={**t.task, **held}) for t in synthesis.heldout])
    write(synthesis, tools_data, tmp / "tasks")
    for line in report_lines(synthesis.report):
        log(f"synth: {line}")
    heldout = tmp / "tasks" / "heldout.jsonl"
    kinds = {t.task["id"]: t.kind for t in synthesis.heldout}

    base = models.load()
    outcomes = Outcomes(run=config.synth.run_tools, sandbox=config.sandbox,
                        fixture=config.fixture, seed=config.synth.seed)
    written = rows(base, agent_format(config.protocol, base), tools, synthesis.train, outcomes,
                   seed=config.synth.seed)
    write_jsonl(tmp / "rows.jsonl", written)
    log(f"rows: {len(written)} written conversations; tool results "
        f"{outcomes.counts['real']} real, {outcomes.counts['synthesised']} synthesised")

    name = "base + adapter" if models.start else "base"
    log(f"evaluating the {name} model on {len(synthesis.heldout)} held-out tasks")
    before = _row(_evaluate(lambda: models.load(adapter=models.start) if models.start
                            else base, models.start, heldout, config), kinds)
    log(f"{name}: {before['success']:.0%} right")

    sft = dataclasses.replace(config.sft, init_adapter=models.start)
    stats = train(models.load(), written, tmp, sft)
    first, last = (f"{x:.4f}" if x is not None else "?"
                   for x in (stats["first_loss"], stats["last_loss"]))
    log(f"trained {stats['iters']} iterations; loss {first} → {last}")  # as `sft` says it
    after = _row(_evaluate(lambda: models.load(adapter=str(tmp)), str(tmp), heldout, config),
                 kinds)
    log(f"specialist: {after['success']:.0%} right")
    return {"start": name, "before": before, "after": after, "sft": stats,
            "rows": len(written), "tool_results": dict(outcomes.counts),
            "synth": synthesis.report}


def table(results: dict) -> list[str]:
    """The before/after table for a terminal."""
    lines = [f"{'held-out':<16} {'success':>8} {'answered':>9} {'valid calls':>12} "
             f"{'calls/run':>10}  by kind"]
    for label, row in ((results["start"], results["before"]), ("specialist", results["after"])):
        kinds = ", ".join(f"{k} {v}" for k, v in row["by_kind"].items())
        lines.append(f"{label:<16} {row['success']:>8.0%} {row['answered']:>9.0%} "
                     f"{row['valid_calls']:>12.0%} {row['mean_calls']:>10.2f}  {kinds}")
    return lines
