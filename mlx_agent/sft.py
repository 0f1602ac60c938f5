"""``mlx_agent sft``: LoRA fine-tuning on ``traces-to-data`` rows, with mlx-lm's trainer.

Rows carry ``input_ids`` and ``loss_mask``; the loss is the cross-entropy on exactly the tokens
the mask marks (the ones the model sampled in its trajectories), so no chat template or
re-tokenization is involved. LoRA layers come from mlx-lm (``linear_to_lora_layers``) and the
adapter is written in mlx-lm's format (``adapters.safetensors`` + ``adapter_config.json``),
so ``--adapter DIR`` loads it everywhere. Not promised: DPO training, full fine-tuning.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim

from .engine import output_head
from .models.cpu_layers import use_reference_layers


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


def read_rows(path: str | Path) -> list[dict]:
    rows = []
    for i, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            ids, mask = row["input_ids"], row["loss_mask"]
        except (json.JSONDecodeError, KeyError, TypeError):
            raise ValueError(f"{path}:{i}: not a traces-to-data sft row "
                             "(needs input_ids and loss_mask)") from None
        if len(ids) != len(mask) or not ids:
            raise ValueError(f"{path}:{i}: input_ids and loss_mask differ in length")
        rows.append(row)
    if not rows:
        raise ValueError(f"{path} has no rows")
    return rows


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
            loop: bool = True):
    """(tokens, scored, weights) batches (see :func:`masked_loss`), right-padded; loops
    forever when ``loop``."""
    rng = random.Random(seed)
    order = list(range(len(rows)))
    while True:
        rng.shuffle(order)
        for start in range(0, len(order) - batch_size + 1 if len(order) >= batch_size else 1,
                           batch_size):
            chosen = [rows[i] for i in order[start : start + batch_size]]
            width = min(max(len(r["input_ids"]) for r in chosen), max_len)
            toks = [r["input_ids"][:width] + [0] * (width - len(r["input_ids"][:width]))
                    for r in chosen]
            masks = [r["loss_mask"][:width] + [0] * (width - len(r["loss_mask"][:width]))
                     for r in chosen]
            yield (mx.array(toks), *scored_positions(masks))
        if not loop:
            return


def _until(batches_, deadline: float, done: list[int]):
    """``batches_`` until ``deadline`` (``time.monotonic``), counting what it gave in
    ``done``; ending the iterator ends mlx-lm's loop, which then writes the adapter."""
    for batch in batches_:
        if time.monotonic() >= deadline:
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
    the iterations run (fewer than ``config.iters`` when ``config.minutes`` ran out)."""
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

    def iterate(dataset, batch_size, max_seq_length, loop=False, seed=None, **_):
        it = batches(dataset, min(batch_size, len(dataset)), max_seq_length, seed, loop)
        return _until(it, deadline, done) if loop else it  # loop: the training batches

    mlx_lm_train(model, optim.Adam(learning_rate=config.learning_rate), train_rows,
                 val or None, args=args, loss=masked_loss, iterate_batches=iterate,
                 training_callback=Progress())
    model.eval()
    return {"first_loss": losses[0] if losses else None,
            "last_loss": losses[-1] if losses else None,
            "train_rows": len(train_rows), "val_rows": len(val), "iters": done[0]}
