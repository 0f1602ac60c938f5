"""Kernels against their pure-MLX references (the kernel half skips where Metal is absent)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from mlx_agent.kernels import apply_bitmask, apply_bitmask_ops
from mlx_agent.kernels.bitmask import _bitmask_kernel


def numpy_reference(logits, mask):
    allowed = np.zeros(logits.shape[-1], dtype=bool)
    for i in range(logits.shape[-1]):
        w = i // 32
        allowed[i] = w < mask.shape[-1] and (int(mask[w]) >> (i % 32)) & 1
    return np.where(allowed, logits, -np.inf)


@pytest.mark.parametrize("vocab", [1, 31, 32, 33, 97, 1000, 49152, 49159])
def test_reference_matches_a_bit_by_bit_reading(vocab):
    rng = np.random.default_rng(vocab)
    logits = rng.standard_normal(vocab).astype(np.float32)
    mask = rng.integers(-(2**31), 2**31, size=(vocab + 31) // 32, dtype=np.int64).astype(np.int32)
    got = np.array(apply_bitmask_ops(mx.array(logits), mx.array(mask)))
    np.testing.assert_array_equal(got, numpy_reference(logits, mask))


def test_all_allowed_changes_nothing_and_short_masks_disallow_the_rest():
    logits = mx.random.normal((3, 100))
    full = mx.full((3, 4), -1, dtype=mx.int32)
    assert mx.array_equal(apply_bitmask_ops(logits, full), logits).item()
    short = mx.full((3, 2), -1, dtype=mx.int32)  # covers tokens 0..63 only
    out = np.array(apply_bitmask_ops(logits, short))
    assert np.isneginf(out[:, 64:]).all() and (out[:, :64] == np.array(logits)[:, :64]).all()


@pytest.mark.skipif(_bitmask_kernel() is None, reason="Metal is not available")
@pytest.mark.parametrize("vocab", [33, 1000, 49159])
def test_metal_kernel_matches_reference(vocab):
    logits = mx.random.normal((2, vocab)).astype(mx.float16)
    mask = mx.random.randint(-(2**31), 2**31 - 1, ((2, (vocab + 31) // 32))).astype(mx.int32)
    assert mx.array_equal(apply_bitmask(logits, mask), apply_bitmask_ops(logits, mask)).item()
