"""The float16 KV cache of the CPU kernel path: its logit drift from a float32 cache, measured
on a tiny random model and on the bundled model, and how it is chosen."""

from __future__ import annotations

import os
import subprocess
import sys

import mlx.core as mx
import numpy as np
import pytest

from mlx_agent.kernels import kernel_status
from mlx_agent.models import load
from mlx_agent.models.cpu_layers import KV_DTYPE_ENV

from . import gguf_blocks
from .test_qmatmul import tiny_quantized_gguf

KERNEL = kernel_status()
pytestmark = pytest.mark.skipif(not KERNEL.available, reason=f"CPU kernel: {KERNEL.reason}")
DRIFT = 1e-3  # the most a float16 cache may move the logits, relative to the largest


def drift(path_or_name, prompt, monkeypatch, new_tokens=8) -> tuple[float, list, list]:
    """Largest relative logit difference between a float16 and a float32 KV cache, after
    the prompt and after each greedy token; and both runs' tokens."""
    runs = []
    for dtype in ("float16", "float32"):
        monkeypatch.setenv(KV_DTYPE_ENV, dtype)
        lm = load(path_or_name, weights="quantized")
        assert lm.identity.kv_dtype == dtype  # and so the prompt-cache key differs
        engine = lm.engine(context_length=len(prompt) + new_tokens + 1)
        engine.prefill(prompt)
        logits, tokens = [np.array(engine.logits)], []
        for token in engine.generate(max_tokens=new_tokens):
            tokens.append(token)
            logits.append(np.array(engine.logits))
        assert engine.cache[0].keys.dtype == getattr(mx, dtype)
        runs.append((np.stack(logits), tokens))
    (half, t16), (full, t32) = runs
    return float(np.abs(half - full).max() / np.abs(full).max()), t16, t32


@pytest.mark.parametrize("kind", gguf_blocks.QUANTS)
def test_tiny_model_float16_cache_drifts_less_than_1e_3(tmp_path, monkeypatch, kind):
    path = tiny_quantized_gguf(tmp_path, kind)
    prompt = [int(i) for i in np.random.default_rng(3).integers(0, 97, 200)]
    err, t16, t32 = drift(path, prompt, monkeypatch)
    assert 0 < err < DRIFT  # not zero: the cache really is float16
    assert t16 == t32


@pytest.mark.real_model
def test_real_model_float16_cache_drifts_less_than_1e_3(monkeypatch):
    lm = load("smollm2-135m")
    prompt = lm.prompt_ids("Write a long story about a lighthouse keeper. " * 40)[:600]
    err, t16, t32 = drift("smollm2-135m", prompt, monkeypatch, new_tokens=16)
    assert 0 < err < DRIFT
    assert t16 == t32


def test_an_unknown_kv_dtype_is_one_line_naming_the_choices():
    env = {**os.environ, KV_DTYPE_ENV: "int4"}
    run = subprocess.run([sys.executable, "-m", "mlx_agent.cli.main", "generate", "--max-tokens",
                          "1", "hi"], capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode != 0
    assert "Traceback" not in run.stderr
    assert "unknown KV cache dtype 'int4'" in run.stderr and "float16, float32" in run.stderr
