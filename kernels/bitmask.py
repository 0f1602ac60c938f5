"""Apply a packed 32-bit allowed-token bitmask to logits: disallowed tokens become -inf.

The mask is llguidance's layout: int32 words, bit ``i % 32`` of word ``i // 32`` set when token
``i`` is allowed; tokens past the mask's last word are disallowed. Logits are ``[V]`` or
``[B, V]``; the mask ``[W]`` or ``[B, W]`` with ``W = ceil(V / 32)`` (or more).

- :func:`apply_bitmask_ops`: the pure-MLX reference, vectorised and compiled with
  ``mx.compile``; it is what CPU users run.
- :func:`_bitmask_kernel`: the Metal kernel, built once; None where Metal is absent.
- :func:`apply_bitmask`: the public entry; uses the kernel when asked and available.
"""

from __future__ import annotations

import functools

import mlx.core as mx


@mx.compile
def _apply_ops(logits: mx.array, mask: mx.array) -> mx.array:
    shifts = mx.arange(32, dtype=mx.uint32)
    bits = (mask.astype(mx.uint32)[..., None] >> shifts) & 1  # [B, W, 32]
    allowed = bits.reshape(*mask.shape[:-1], -1)[..., : logits.shape[-1]]
    return mx.where(allowed.astype(mx.bool_), logits, mx.array(-mx.inf, logits.dtype))


def _pad(logits: mx.array, mask: mx.array) -> tuple[mx.array, mx.array]:
    words = -(-logits.shape[-1] // 32)
    if mask.shape[-1] < words:  # tokens past the mask are disallowed
        pad = [(0, 0)] * (mask.ndim - 1) + [(0, words - mask.shape[-1])]
        mask = mx.pad(mask, pad)
    return logits, mask


def apply_bitmask_ops(logits: mx.array, mask: mx.array) -> mx.array:
    """Reference implementation in MLX ops (any device)."""
    logits, mask = _pad(logits, mask)
    return _apply_ops(logits, mask)


@functools.cache
def _bitmask_kernel():
    """The Metal kernel, or None where Metal is absent."""
    if not mx.metal.is_available():
        return None
    source = """
        uint row = thread_position_in_grid.y;
        uint elem = thread_position_in_grid.x;
        uint vocab = inp_shape[inp_ndim - 1];
        uint words = mask_shape[mask_ndim - 1];
        if (elem >= vocab) return;
        uint word = elem / 32;
        bool bit = word < words && ((uint(mask[row * words + word]) >> (elem % 32)) & 1u);
        out[row * vocab + elem] = bit ? inp[row * vocab + elem] : T(-INFINITY);
    """
    return mx.fast.metal_kernel(name="mlx_agent_apply_bitmask", input_names=["inp", "mask"],
                                output_names=["out"], source=source)


def apply_bitmask(logits: mx.array, mask: mx.array, use_kernel: bool = True) -> mx.array:
    """``logits`` with disallowed tokens set to -inf."""
    kernel = _bitmask_kernel() if use_kernel else None
    if kernel is None:
        return apply_bitmask_ops(logits, mask)
    squeeze = logits.ndim == 1
    inp = logits[None] if squeeze else logits
    m = mask[None] if mask.ndim == 1 else mask
    out = kernel(inputs=[inp, m], template=[("T", inp.dtype)],
                 grid=(inp.shape[1], inp.shape[0], 1), threadgroup=(256, 1, 1),
                 output_shapes=[inp.shape], output_dtypes=[inp.dtype])[0]
    return out[0] if squeeze else out
