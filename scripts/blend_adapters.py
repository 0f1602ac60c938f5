"""Blend two LoRA adapters of one model into one: (1 - W) of the first's change plus W of the
second's, exactly, as a LoRA adapter of their ranks' sum.

    .venv/bin/python scripts/blend_adapters.py FIRST_DIR SECOND_DIR --weight 0.5 --out DIR

A LoRA adapter changes a weight by ``scale * A @ B``. Stacking the two adapters' ``A``
matrices side by side (the first's times 1 - W, the second's times W, rescaled to the
first's ``scale``) and their ``B`` matrices one above the other gives ``(1 - W) * change1 +
W * change2`` as one adapter in mlx-lm's format, which every command loads with
``--adapter DIR``. This is weight interpolation between two fine-tunes (as WiSE-FT
interpolates a fine-tune with its base): where two adapters trade one skill for another,
the blend's weight chooses a point between them without training again.

Both adapters must be LoRA adapters of the same model, the same layers and the same keys.
Not promised: that any blend is better than either adapter; measure it.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

import mlx.core as mx

from mlx_agent.fileio import atomic_path, write_text


def read(path: Path) -> tuple[dict, dict]:
    try:
        config = json.loads((path / "adapter_config.json").read_text())
        weights = mx.load(str(path / "adapters.safetensors"))
    except (OSError, ValueError, RuntimeError) as e:
        sys.exit(f"error: {path} is not a readable adapter ({e}); give an mlx-lm adapter "
                 "directory")
    if config.get("fine_tune_type", "lora") != "lora":
        sys.exit(f"error: {path} is a {config['fine_tune_type']} adapter; only LoRA blends")
    params = config.get("lora_parameters")
    if not isinstance(params, dict) or not {"rank", "scale"} <= set(params):
        sys.exit(f"error: {path}/adapter_config.json gives no lora_parameters rank and scale; "
                 "give an mlx-lm LoRA adapter directory")
    return config, weights


def blend(first: tuple[dict, dict], second: tuple[dict, dict], weight: float) -> tuple[dict, dict]:
    (c1, w1), (c2, w2) = first, second
    p1, p2 = c1["lora_parameters"], c2["lora_parameters"]
    if c1.get("num_layers") != c2.get("num_layers"):
        sys.exit(f"error: the adapters differ in num_layers ({c1.get('num_layers')} vs "
                 f"{c2.get('num_layers')})")
    if sorted(p1.get("keys") or []) != sorted(p2.get("keys") or []) or set(w1) != set(w2):
        sys.exit("error: the adapters train different layers or keys; they cannot blend")
    axis = {".lora_a": 0, ".lora_b": 1}  # the model's side of each matrix, not the rank's
    for name in w1:
        side = next((a for end, a in axis.items() if name.endswith(end)), None)
        if side is not None and w1[name].shape[side] != w2[name].shape[side]:
            sys.exit(f"error: {name} is {w1[name].shape} in one adapter and "
                     f"{w2[name].shape} in the other: adapters of different models")
    ratio = p2["scale"] / p1["scale"]  # the second's A, rescaled to the first's scale
    out = {}
    for name in w1:
        if name.endswith(".lora_a"):
            out[name] = mx.concatenate([(1 - weight) * w1[name], weight * ratio * w2[name]],
                                       axis=1)
        elif name.endswith(".lora_b"):
            out[name] = mx.concatenate([w1[name], w2[name]], axis=0)
        else:
            sys.exit(f"error: {name} is not a LoRA matrix; only LoRA adapters blend")
    config = copy.deepcopy(c1)
    config["lora_parameters"]["rank"] = p1["rank"] + p2["rank"]
    return config, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("first", type=Path)
    ap.add_argument("second", type=Path)
    ap.add_argument("--weight", type=float, required=True, help="the second's share, 0 to 1")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    if not 0 <= args.weight <= 1:
        ap.error("--weight takes a share from 0 to 1")
    for path in (args.first, args.second):
        if not (path / "adapters.safetensors").is_file():
            ap.error(f"{path} holds no adapters.safetensors")
    config, weights = blend(read(args.first), read(args.second), args.weight)
    config["blend"] = {"first": str(args.first), "second": str(args.second),
                       "weight": args.weight}
    args.out.mkdir(parents=True, exist_ok=True)
    with atomic_path(args.out / "adapters.safetensors", suffix=".safetensors") as tmp:
        mx.save_safetensors(str(tmp), weights)
    write_text(args.out / "adapter_config.json", json.dumps(config, indent=2) + "\n")
    print(f"wrote {args.out}: rank {config['lora_parameters']['rank']}, "
          f"{1 - args.weight:g} x {args.first} + {args.weight:g} x {args.second}")


if __name__ == "__main__":
    main()
