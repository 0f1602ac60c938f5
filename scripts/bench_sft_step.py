"""Seconds per LoRA training step: the head on the scored positions only, against every position.

    .venv/bin/python scripts/bench_sft_step.py --rows build/general2/rows.jsonl [--steps 6]
        [--batch 4] [--rounds 2]

Builds the training model as ``mlx_agent sft`` does (the bundled model in float32, LoRA on q
and v of the top 16 layers) and runs mlx-lm's trainer for ``--steps`` steps on the same
batches of ``--rows`` twice a round: with :func:`mlx_agent.sft.masked_loss` (the output head
and its softmax on the positions the loss mask keeps) and with the head on every position,
as mlx-lm's default loss does, masked after. Prints seconds per step of each (the first two
steps of each run left out: they trace the compiled step), their ratio, and the losses,
which must agree.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time

import mlx_agent  # noqa: F401  (fast BLAS before mlx)
import mlx.core as mx
import numpy as np
import mlx.nn as nn
import mlx.optimizers as optim
from mlx_lm.tuner.trainer import TrainingArgs, TrainingCallback
from mlx_lm.tuner.trainer import train as mlx_lm_train

from mlx_agent.models import load
from mlx_agent.sft import SFTConfig, _differentiable, _lora, batches, masked_loss, read_rows

WARMUP = 2


def every_position_loss(model, tokens, mask):
    """mlx-lm's way (and ours before): logits for every position, then the mask."""
    ce = nn.losses.cross_entropy(model(tokens[:, :-1]), tokens[:, 1:]) * mask[:, 1:]
    ntoks = mask[:, 1:].sum()
    return ce.sum() / mx.maximum(ntoks, 1), ntoks


def dense(batches_):
    """(tokens, scored, weights) batches as (tokens, mask) ones, for every_position_loss."""
    for tokens, scored, weights in batches_:
        B, L = tokens.shape
        mask = np.zeros(B * (L - 1), np.float32)
        np.add.at(mask, np.array(scored), np.array(weights))
        yield tokens, mx.array(np.concatenate([np.zeros((B, 1), np.float32),
                                               mask.reshape(B, L - 1)], axis=1))


def run(rows, loss, steps: int, batch: int) -> tuple[float, float]:
    lm = load("smollm2-135m-base")
    _differentiable(lm.model)
    lm.model.freeze()
    _lora(lm.model, SFTConfig())
    mx.random.seed(0)
    stamps, losses = [], []

    class Clock(TrainingCallback):
        def on_train_loss_report(self, info):
            stamps.append(time.perf_counter())
            losses.append(info["train_loss"])

    scratch = tempfile.TemporaryDirectory()
    args = TrainingArgs(batch_size=batch, iters=steps + WARMUP, steps_per_report=1,
                        steps_per_eval=10**9, steps_per_save=10**9,
                        adapter_file=f"{scratch.name}/adapters.safetensors")

    def iterate(dataset, batch_size, max_seq_length, loop=False, seed=None, **_):
        it = batches(dataset, batch_size, max_seq_length, 0, loop)
        return it if loss is masked_loss else dense(it)

    mlx_lm_train(lm.model, optim.Adam(learning_rate=1e-4), rows, None, args=args, loss=loss,
                 iterate_batches=iterate, training_callback=Clock())
    return (stamps[-1] - stamps[WARMUP - 1]) / steps, losses[-1]


LOSSES = {"scored": masked_loss, "every": every_position_loss}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", required=True)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--one", choices=LOSSES, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:  # a child: mlx-lm's compiled step runs once per process
        print(json.dumps(run(read_rows(args.rows), LOSSES[args.one], args.steps, args.batch)))
        return
    for r in range(args.rounds):
        got = {}
        for name in LOSSES:
            out = subprocess.run([sys.executable, __file__, "--rows", args.rows, "--steps",
                                  str(args.steps), "--batch", str(args.batch), "--one", name],
                                 capture_output=True, text=True, check=True)
            got[name] = json.loads(out.stdout.strip().splitlines()[-1])
        (ours, our_loss), (peer, peer_loss) = got["scored"], got["every"]
        print(f"round {r + 1}: scored positions {ours:.2f} s/step, every position "
              f"{peer:.2f} s/step, {peer / ours:.2f}x; last loss {our_loss:.4f} against "
              f"{peer_loss:.4f}", flush=True)


if __name__ == "__main__":
    main()
