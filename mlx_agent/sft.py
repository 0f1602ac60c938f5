"""``mlx_agent sft``: LoRA fine-tuning on ``traces-to-data`` rows, with mlx-lm's trainer.

Rows carry ``input_ids`` and ``loss_mask``; the loss is the cross-entropy on exactly the tokens
the mask marks (the ones the model sampled in its trajectories), so no chat template or
re-tokenization is involved. LoRA layers come from mlx-lm (``linear_to_lora_layers``) and the
adapter is written in mlx-lm's format (``adapters.safetensors`` + ``adapter_config.json``),
so ``--adapter DIR`` loads it everywhere. The output head runs on the masked positions
only. With ``processes`` > 1, training runs data-parallel in that many processes on this
machine (MLX's ring backend on localhost). Not promised: DPO training, full fine-tuning,
training across machines.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim

from .engine import output_head
from .fileio import jsonl_lines, read_regular, temp_dir_beside, write_jsonl
from .models.cpu_layers import use_reference_layers
from .signals import held_back
from .tools.executor import Reaper


@dataclass(frozen=True)
class SFTConfig:
    iters: int = 200
    batch_size: int = 4
    learning_rate: float = 1e-4
    rank: int = 8
    scale: float = 20.0
    num_layers: int = 16  # layers from the top that get LoRA
    keys: tuple[str, ...] = ("self_attn.q_proj", "self_attn.v_proj")
    max_seq_length: int = 2048
    val_fraction: float = 0.1
    seed: int = 0
    steps_per_report: int = 10
    minutes: float | None = None  # stop early after this long (the adapter is still written)
    init_adapter: str | None = None  # go on training this adapter instead of a new one
    processes: int = 1  # data-parallel processes on this machine, each a share of every batch


MAX_ID = 2**31 - 1  # what an int32 token array holds


def read_rows(path: str | Path) -> list[dict]:
    """The rows of an sft JSONL file (``traces-to-data``'s), each checked: ``input_ids`` a
    list of token ids, ``loss_mask`` as many 0s and 1s with a 1 past the first token (the
    first is never a target). Ids are checked against a model's
    vocabulary by :func:`check_vocabulary` (an id past it crashed the process in training)."""
    rows = []
    try:
        text = read_regular(path).decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not UTF-8 text (byte {e.start}); give the JSONL file "
                         "traces-to-data writes") from None
    except OSError as e:
        raise ValueError(f"cannot read {path}: {e.strerror or e}") from None
    for i, line in enumerate(jsonl_lines(text), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            ids, mask = row["input_ids"], row["loss_mask"]
        except (ValueError, KeyError, TypeError, RecursionError):
            raise ValueError(f"{path}:{i}: not a traces-to-data sft row "
                             "(needs input_ids and loss_mask)") from None
        if not (isinstance(ids, list) and isinstance(mask, list)) or \
                not all(type(t) is int and 0 <= t <= MAX_ID for t in ids) or \
                not all(m in (0, 1) and type(m) is int for m in mask):
            raise ValueError(f"{path}:{i}: input_ids must be a list of token ids and "
                             "loss_mask a list of 0s and 1s")
        if not ids:
            raise ValueError(f"{path}:{i}: input_ids is empty: nothing to train on")
        if len(ids) != len(mask):
            raise ValueError(f"{path}:{i}: input_ids and loss_mask differ in length")
        if not any(mask[1:]):  # the loss scores targets 1..: none failed inside MLX
            raise ValueError(f"{path}:{i}: the row has no scored token after its first (a "
                             "loss_mask 1 past position 0): nothing to train on")
        rows.append(row)
    if not rows:
        raise ValueError(f"{path} has no rows")
    return rows


def check_vocabulary(rows: Sequence[dict], vocab_size: int, source: str) -> None:
    """Raises ValueError naming the first row with a token id past ``vocab_size``."""
    for i, row in enumerate(rows, 1):
        top = max(row["input_ids"])
        if top >= vocab_size:
            raise ValueError(f"{source}: row {i} holds token id {top}, past the model's "
                             f"vocabulary of {vocab_size}; were the rows made for another "
                             "model?")


def masked_loss(model, tokens: mx.array, scored: mx.array, weights: mx.array):
    """Cross-entropy on the positions ``scored`` (flat indices into ``tokens[:, 1:]``) with
    ``weights`` (0 for the padding that rounds their number up), and their count.

    Only the scored positions go through the output head: with a 49k vocabulary the head
    and its softmax over every position cost more than the layers, and the loss mask keeps
    only the assistant's tokens (a fifth of a row or so). A model whose head cannot be split
    off (see :func:`~mlx_agent.engine.output_head`) computes all logits and picks the same
    rows, the same loss."""
    inputs, targets = tokens[:, :-1], tokens[:, 1:].reshape(-1)[scored]
    head = output_head(model)
    if head is None:
        logits = model(inputs)
        logits = logits.reshape(-1, logits.shape[-1])[scored]
    else:
        hidden = model.model(inputs)
        logits = head(hidden.reshape(-1, hidden.shape[-1])[scored])
    ce = nn.losses.cross_entropy(logits, targets) * weights
    ntoks = weights.sum()
    return ce.astype(mx.float32).sum() / mx.maximum(ntoks, 1), ntoks


SCORED_STEP = 64  # scored positions per batch round up to a multiple: fewer distinct shapes
                  # for mlx-lm's compiled step to trace


def scored_positions(masks: list[list[int]]) -> tuple[mx.array, mx.array]:
    """The flat indices into ``[B, width - 1]`` of the targets a loss mask keeps (``mask[:,
    1:]``), and their weights, padded with index 0 at weight 0 to a multiple of
    :data:`SCORED_STEP`."""
    width = len(masks[0]) - 1
    index = [b * width + t for b, m in enumerate(masks) for t, on in enumerate(m[1:]) if on]
    pad = -len(index) % SCORED_STEP
    return (mx.array(index + [0] * pad, dtype=mx.uint32),
            mx.array([1.0] * len(index) + [0.0] * pad, dtype=mx.float32))


def batches(rows: list[dict], batch_size: int, max_len: int, seed: int | None = 0,
            loop: bool = True, part: tuple[int, int] = (0, 1)):
    """(tokens, scored, weights) batches (see :func:`masked_loss`), right-padded; loops
    forever when ``loop``. With ``part`` (index, count), this process's share of each
    batch: every process draws the same batches and keeps rows index, index + count, ...

    Rows of about the same length make a batch, as in mlx-lm's own ``iterate_batches``:
    each pass draws which rows are left over (fewer than a batch), sorts the rest by
    length, cuts them into batches and shuffles the batches, so a batch is padded to a
    length near each of its rows' rather than to the longest of a random draw."""
    rng = random.Random(seed)
    order = list(range(len(rows)))
    size = min(batch_size, len(rows))
    while True:
        rng.shuffle(order)
        kept = sorted(order[:len(order) - len(order) % size] if size else [],
                      key=lambda i: len(rows[i]["input_ids"]))
        cuts = [kept[k:k + size] for k in range(0, len(kept), size)]
        rng.shuffle(cuts)
        for cut in cuts:
            chosen = [rows[i] for i in cut][part[0]::part[1]]
            if not chosen:  # a batch smaller than the processes (a one-row validation set)
                continue
            width = min(max(len(r["input_ids"]) for r in chosen), max_len)
            toks = [r["input_ids"][:width] + [0] * (width - len(r["input_ids"][:width]))
                    for r in chosen]
            masks = [r["loss_mask"][:width] + [0] * (width - len(r["loss_mask"][:width]))
                     for r in chosen]
            yield (mx.array(toks), *scored_positions(masks))
        if not loop:
            return


def _until(batches_, deadline: float, done: list[int], group=None):
    """``batches_`` until ``deadline`` (``time.monotonic``), counting what it gave in
    ``done``; ending the iterator ends mlx-lm's loop, which then writes the adapter. With a
    distributed ``group``, all its processes stop at the same step (one that went on alone
    would wait for the others' gradients forever)."""
    for batch in batches_:
        late = time.monotonic() >= deadline
        if group is not None and group.size() > 1:
            late = mx.distributed.all_sum(mx.array(int(late)), group=group,
                                          stream=mx.cpu).item() > 0
        if late:
            return
        done[0] += 1
        yield batch


def _differentiable(model) -> None:
    """The model as training needs it: float32 weights (a quantized model dequantized,
    exactly) and MLX's own layers, since the CPU kernels have no gradients."""
    from mlx_lm.utils import dequantize_model

    use_reference_layers(model)
    if any(isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding))
           for _, m in model.named_modules()):
        model.set_dtype(mx.float32)  # first: float32 scales dequantize exactly
        dequantize_model(model)


def lora_keys(layer: nn.Module, keys: Sequence[str]) -> list[str]:
    """``keys`` as ``layer`` names its linear layers: each key itself where the layer has
    it, else the layer's linears with the same last name (``attn.q_proj`` for
    ``self_attn.q_proj`` in a model that names its attention ``attn``)."""
    linears = [name for name, m in layer.named_modules()
               if isinstance(m, (nn.Linear, nn.QuantizedLinear))]
    found = []
    for key in keys:
        found += [key] if key in linears else \
            [n for n in linears if n.rsplit(".", 1)[-1] == key.rsplit(".", 1)[-1]]
    if not found:
        raise ValueError(f"the model has none of the layers LoRA trains ({', '.join(keys)}); "
                         f"its linear layers are: {', '.join(linears) or 'none'}")
    return found


def _lora(model, config: SFTConfig) -> tuple[int, dict]:
    """LoRA layers on the frozen ``model``: new ones, or ``config.init_adapter``'s with its
    weights; returns their number of layers and parameters."""
    from mlx_lm.tuner.utils import linear_to_lora_layers, load_adapters

    if config.init_adapter:
        saved = json.loads((Path(config.init_adapter) / "adapter_config.json").read_text())
        load_adapters(model, str(config.init_adapter))
        return saved["num_layers"], saved["lora_parameters"]
    num_layers = min(config.num_layers, len(model.layers))
    params = {"rank": config.rank, "scale": config.scale, "dropout": 0.0,
              "keys": lora_keys(model.layers[-1], config.keys)}
    linear_to_lora_layers(model, num_layers, params)
    return num_layers, params


def train(lm, rows: list[dict], out_dir: str | Path, config: SFTConfig = SFTConfig()) -> dict:
    """Train a LoRA adapter on ``rows``; returns the first and last training losses and
    the iterations run (fewer than ``config.iters`` when ``config.minutes`` ran out).
    ``lm`` is left with the trained adapter on its float32 weights, whether the training
    ran here or, with ``config.processes`` > 1, in processes of its own.

    The adapter is written in a hidden folder inside ``out_dir`` (on its filesystem, which
    may be a mounted volume) and its files renamed into ``out_dir`` only when training is
    done: a failure or Ctrl-C leaves ``out_dir`` as it was (an adapter there, trained on, is
    not left with a new config over its old weights). A training that diverged (weights
    that are no longer finite numbers) writes nothing and raises ValueError.

    Rows are cut at ``config.max_seq_length`` tokens; a row whose scored tokens all lie past
    that has nothing to train on and is left out (counted as ``cut_rows``): a batch of only
    such rows had no target. Raises ValueError when no row is left."""
    kept = [r for r in rows if any(r["loss_mask"][1:config.max_seq_length])]
    if not kept:
        raise ValueError(f"no row has a scored token (a loss_mask 1 past position 0) within its "
                         f"first {config.max_seq_length} tokens, where training cuts rows: "
                         "nothing to train on")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    staging = temp_dir_beside(out / "adapter")  # inside out: one filesystem, so a rename
    try:
        stats = _train(lm, kept, staging, config)
        _check_finite(staging / "adapters.safetensors", stats["last_loss"])
        for name in ("adapters.safetensors", "adapter_config.json"):  # the config last
            os.replace(staging / name, out / name)
        return {**stats, "cut_rows": len(rows) - len(kept)}
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _check_finite(weights: Path, last_loss: float | None) -> None:
    """A learning rate far too high makes the weights inf or NaN: such an adapter makes the
    model's every logit NaN, and was written as if it were trained."""
    if all(mx.isfinite(w).all().item() for w in mx.load(str(weights)).values()):
        return
    raise ValueError(f"the training diverged (last loss {last_loss}): the adapter's weights "
                     "are not finite numbers, so none was written; lower the learning rate")


def _train(lm, rows: list[dict], out_dir: str | Path, config: SFTConfig) -> dict:
    if config.processes > 1 and mx.distributed.init().size() == 1:
        return _train_in_processes(lm, rows, out_dir, config)
    from mlx_lm.tuner.trainer import TrainingArgs, TrainingCallback
    from mlx_lm.tuner.trainer import train as mlx_lm_train

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(config.seed)
    rows = rows[:]
    rng.shuffle(rows)
    n_val = (max(1, int(len(rows) * config.val_fraction))
             if len(rows) > 1 and config.val_fraction > 0 else 0)
    val, train_rows = rows[:n_val], rows[n_val:] or rows
    model = lm.model
    _differentiable(model)
    model.freeze()
    num_layers, params = _lora(model, config)
    (out / "adapter_config.json").write_text(json.dumps({
        "fine_tune_type": "lora", "num_layers": num_layers, "lora_parameters": params,
        "base_model": lm.identity.name, "base_fingerprint": lm.identity.fingerprint}, indent=2))
    losses: list[float] = []

    class Progress(TrainingCallback):  # mlx-lm's own progress display shows the rest
        def on_train_loss_report(self, info):
            losses.append(info["train_loss"])

    bs = min(config.batch_size, len(train_rows))
    args = TrainingArgs(batch_size=bs, iters=config.iters, val_batches=-1,
                        steps_per_report=config.steps_per_report,
                        steps_per_eval=max(config.iters, 1), steps_per_save=config.iters + 1,
                        max_seq_length=config.max_seq_length,
                        adapter_file=str(out / "adapters.safetensors"))

    deadline = time.monotonic() + config.minutes * 60 if config.minutes else float("inf")
    done = [0]

    def iterate(dataset, batch_size, max_seq_length, loop=False, seed=None, comm_group=None,
                **_):
        many = comm_group is not None and comm_group.size() > 1
        part = (comm_group.rank(), comm_group.size()) if many else (0, 1)
        it = batches(dataset, min(batch_size, len(dataset)), max_seq_length, seed, loop, part)
        return _until(it, deadline, done, comm_group) if loop else it  # loop: training

    _colour_only_on_a_terminal()
    mlx_lm_train(model, optim.Adam(learning_rate=config.learning_rate), train_rows,
                 val or None, args=args, loss=masked_loss, iterate_batches=iterate,
                 training_callback=Progress())
    model.eval()
    return {"first_loss": losses[0] if losses else None,
            "last_loss": losses[-1] if losses else None,
            "train_rows": len(train_rows), "val_rows": len(val), "iters": done[0]}


def _colour_only_on_a_terminal() -> None:
    """mlx-lm's trainer prints through a shared rich console made with colour forced on
    (``color_system="truecolor"``), so a log file got escape codes; this turns its styles
    off unless its stream is a terminal (rich's own test, which honours FORCE_COLOR)."""
    try:
        from mlx_lm.cli_ui import make_console
    except ImportError:  # an mlx-lm without it prints plain text
        return
    console = make_console()
    if not console.is_terminal and hasattr(console, "_color_system"):
        console._color_system = None  # what color_system=None gives: no styles at all


def _train_in_processes(lm, rows: list[dict], out_dir: str | Path, config: SFTConfig) -> dict:
    """:func:`train` in ``config.processes`` processes on this machine, one thread each, over
    MLX's ring backend on localhost: each computes the gradients of its share of every batch
    and mlx-lm's trainer averages them, so the batches and steps are the one-process ones
    (each share's loss is the mean over its own tokens, and the shares count equally). On
    the CPU most of a step runs on one thread (only the BLAS matmuls use more), so two
    processes on two cores train about 1.4x as many rows a minute as one. The workers load
    ``lm``'s file, so ``lm`` must carry no adapter (``config.init_adapter`` continues one);
    then ``lm`` gets the trained adapter, as in one process."""
    n = config.processes
    if len(rows) < 2 * config.batch_size:  # too few for a share of every batch: one process
        return _train(lm, rows, out_dir, dataclasses.replace(config, processes=1))
    if lm.identity.adapter_fingerprint:
        raise ValueError("training in several processes loads the model from its file; load "
                         "it without an adapter (continue one with init_adapter)")
    if config.batch_size % n:
        raise ValueError(f"the batch size ({config.batch_size}) must be a multiple of the "
                         f"processes ({n})")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="mlx-agent-sft-") as tmp:
        work = Path(tmp)
        write_jsonl(work / "rows.jsonl", rows)
        (work / "hosts.json").write_text(json.dumps([[f"127.0.0.1:{_free_port()}"]
                                                     for _ in range(n)]))
        env = {**os.environ, "MLX_HOSTFILE": str(work / "hosts.json"), "MKL_NUM_THREADS": "1",
               "OMP_NUM_THREADS": "1", "MLX_AGENT_KERNEL_THREADS": "1"}
        args = [str(lm.path), str(work / "rows.jsonl"), str(out),
                json.dumps(dataclasses.asdict(config)), str(work / "stats.json")]
        code = "import sys; from mlx_agent.sft import _worker; _worker(sys.argv[1:])"
        reapers: list[Reaper] = []  # each process's, waited on as a tool's (see Reaper)
        try:
            for rank in range(n):
                with open(work / f"rank{rank}.err", "wb") as err:  # the child keeps its own
                    with held_back():  # a Ctrl-C here leaves no process without its reaper
                        reapers.append(Reaper(subprocess.Popen(
                            [sys.executable, "-c", code, *args],
                            env={**env, "MLX_RANK": str(rank)},
                            stdout=None if rank == 0 else subprocess.DEVNULL, stderr=err)))
                        reapers[-1].start()
            deadline = (time.monotonic() + config.minutes * 60 + FINISH_SECONDS
                        if config.minutes else None)
            _wait_all(reapers, work, deadline=deadline)
        finally:
            with held_back():  # a second Ctrl-C acts once every worker is reaped
                for reaper in reapers:
                    reaper.kill()
                for reaper in reapers:
                    reaper.reaped()
        stats = json.loads((work / "stats.json").read_text())
    model = lm.model  # as one process leaves it: float32, the adapter on
    _differentiable(model)
    model.freeze()
    _lora(model, dataclasses.replace(config, init_adapter=str(out)))
    model.eval()
    return stats


CONNECT_SECONDS = 180.0  # for every worker to load the model and join the ring
FINISH_SECONDS = 600.0  # past the minutes, for the last step and the adapter's save


def _failed(reaper: Reaper) -> bool:
    return reaper.ended and reaper.proc.returncode != 0


def _wait_all(reapers: list[Reaper], work: Path, connect_seconds: float = CONNECT_SECONDS,
              deadline: float | None = None) -> None:
    """Wait for every worker (its :class:`~mlx_agent.tools.executor.Reaper`'s); the first to
    fail stops the others, with its error. So does a ring that never forms (a worker has not
    written ``ready<rank>`` in ``work`` within ``connect_seconds``: a blocked port, a peer
    that died before connecting) and a run still going at ``deadline``
    (``time.monotonic()``), so no hang outlives them. The caller kills what is left."""
    n, start = len(reapers), time.monotonic()
    while not all(r.ended for r in reapers):
        if any(map(_failed, reapers)):
            break
        now = time.monotonic()
        ready = sum((work / f"ready{rank}").exists() for rank in range(n))
        if ready < n and now - start > connect_seconds:
            raise RuntimeError(f"{n - ready} of {n} training processes did not connect over "
                               f"MLX's ring backend on 127.0.0.1 within {connect_seconds:.0f} "
                               "s; train in one process (--processes 1)")
        if deadline is not None and now > deadline:
            raise RuntimeError(f"the {n} training processes were still running "
                               f"{FINISH_SECONDS / 60:.0f} minutes past --minutes; stopped them")
        time.sleep(0.2)
    for rank, reaper in enumerate(reapers):
        if _failed(reaper):
            tail = (work / f"rank{rank}.err").read_text(errors="replace").strip()
            last = tail.splitlines()[-1] if tail else f"exit status {reaper.proc.returncode}"
            raise RuntimeError(f"training process {rank} of {n} failed: {last}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(argv: list[str]) -> None:
    """One process of :func:`_train_in_processes` (``MLX_RANK`` and ``MLX_HOSTFILE`` set)."""
    from .models import load

    model_path, rows_path, out_dir, config_json, stats_path = argv
    group = mx.distributed.init(strict=True, backend="ring")
    (Path(stats_path).parent / f"ready{group.rank()}").touch()  # the ring formed
    fields = json.loads(config_json)
    fields["keys"] = tuple(fields["keys"])
    stats = _train(load(model_path), read_rows(rows_path), out_dir, SFTConfig(**fields))
    if group.rank() == 0:
        Path(stats_path).write_text(json.dumps(stats))
