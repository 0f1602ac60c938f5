"""scripts/blend_adapters.py: a blend of two LoRA adapters changes each weight by exactly
(1 - W) of the first's change plus W of the second's, and the blend loads and runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import mlx.core as mx

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "blend_adapters.py"
LAYERS = ("model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.v_proj")


def adapter(path: Path, seed: int, rank: int, scale: float, keys=("self_attn.q_proj",
                                                                   "self_attn.v_proj")) -> Path:
    mx.random.seed(seed)
    path.mkdir()
    mx.save_safetensors(str(path / "adapters.safetensors"), {
        **{f"{n}.lora_a": mx.random.normal((16, rank)) for n in LAYERS},
        **{f"{n}.lora_b": mx.random.normal((rank, 8)) for n in LAYERS}})
    (path / "adapter_config.json").write_text(json.dumps({
        "fine_tune_type": "lora", "num_layers": 1,
        "lora_parameters": {"rank": rank, "scale": scale, "dropout": 0.0, "keys": list(keys)}}))
    return path


def change(path: Path, name: str) -> mx.array:
    w = mx.load(str(path / "adapters.safetensors"))
    scale = json.loads((path / "adapter_config.json").read_text())["lora_parameters"]["scale"]
    return scale * w[f"{name}.lora_a"] @ w[f"{name}.lora_b"]


def blend(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True,
                          text=True, cwd=ROOT)


def test_a_blend_is_the_weighted_sum_of_the_two_changes(tmp_path):
    first = adapter(tmp_path / "a", 0, rank=4, scale=20.0)
    second = adapter(tmp_path / "b", 1, rank=8, scale=10.0)  # another rank and scale
    out = tmp_path / "blend"
    done = blend(first, second, "--weight", "0.25", "--out", out)
    assert done.returncode == 0, done.stderr
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["lora_parameters"]["rank"] == 12 and config["blend"]["weight"] == 0.25
    for name in LAYERS:
        want = 0.75 * change(first, name) + 0.25 * change(second, name)
        assert mx.allclose(change(out, name), want, atol=1e-4, rtol=1e-5)


def test_adapters_that_train_other_keys_or_bad_weights_are_refused(tmp_path):
    first = adapter(tmp_path / "a", 0, rank=4, scale=20.0)
    other = adapter(tmp_path / "b", 1, rank=4, scale=20.0, keys=("self_attn.k_proj",))
    done = blend(first, other, "--weight", "0.5", "--out", tmp_path / "x")
    assert done.returncode != 0 and "different layers or keys" in done.stderr
    assert not (tmp_path / "x").exists()
    wider = tmp_path / "w"
    wider.mkdir()
    mx.save_safetensors(str(wider / "adapters.safetensors"), {
        **{f"{n}.lora_a": mx.zeros((32, 4)) for n in LAYERS},
        **{f"{n}.lora_b": mx.zeros((4, 8)) for n in LAYERS}})
    (wider / "adapter_config.json").write_text((first / "adapter_config.json").read_text())
    done = blend(first, wider, "--weight", "0.5", "--out", tmp_path / "z")
    assert done.returncode != 0 and "adapters of different models" in done.stderr
    (wider / "adapters.safetensors").write_bytes(b"not safetensors")
    done = blend(first, wider, "--weight", "0.5", "--out", tmp_path / "z")
    assert done.returncode != 0 and "not a readable adapter" in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "z").exists()
    (wider / "adapter_config.json").write_text(json.dumps({"lora_parameters": {"rank": 4}}))
    mx.save_safetensors(str(wider / "adapters.safetensors"), {})
    done = blend(first, wider, "--weight", "0.5", "--out", tmp_path / "z")
    assert done.returncode != 0 and "no lora_parameters rank and scale" in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "z").exists()
    done = blend(first, first, "--weight", "1.5", "--out", tmp_path / "y")
    assert done.returncode != 0 and "from 0 to 1" in done.stderr
    assert "Traceback" not in done.stderr
