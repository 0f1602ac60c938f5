"""Quantized matmul ``y = x @ W^T`` on the CPU, for decode and small batches.

``W`` is in MLX's affine layout with group size 32 and 4 or 8 bits: ``weight`` packed uint32,
``scales`` and ``biases`` per group of 32, each weight ``scale * q + bias``. It is the layout
``mx.load`` gives GGUF Q4_0, Q4_1 and Q8_0 tensors (Q4_1 exactly: ``d``, ``m``; Q4_0 and Q8_0
with bias ``-8 d`` and ``-128 d``), so weights stay as the file stores them.

- :func:`quantized_matmul_ops`, :func:`dequantize_ops`: the reference, in MLX ops: dequantize
  to float32 (scales in float32, so exactly), matmul.
- :func:`quantized_matmul`, :func:`dequantize`: the public entries; the kernels when asked
  and available.
- :func:`quantized_matmuls`: several matrices that read the same ``x`` (a layer's q, k and
  v projections; an MLP's gate and up) as one graph node and one job on the thread pool,
  where the matmul kernel runs; one :func:`quantized_matmul` each otherwise.

For up to :data:`KERNEL_MAX_ROWS` rows of ``x`` (decode, small batches) the matmul kernel
dequantizes each group in registers with the reference's arithmetic and keeps activations in
float32. On AVX-512 and AVX2 it reads, where given, a copy of ``W`` that :func:`pack` made:
four rows' codes, scales and biases side by side per group, one stream from memory instead
of six. For a decode step's row of ``x`` (AVX-512: one or two) each group's scale and bias
are factored out of its sum; for more rows each group is dequantized once for up to four
rows of ``x`` (the scalar code reads MLX's arrays). Past :data:`KERNEL_MAX_ROWS` rows
(prefill chunks), where the work is compute-bound, the dequantize kernel writes ``W`` as
float32 and the BLAS multiplies: that measured faster than the matmul kernel there, and the
float32 copy lives for one layer's matmul only. Both run AVX-512, AVX2+FMA+F16C or scalar
code, chosen at run time, over a small thread pool. Not promised:
bit-identical results to the reference (sums run in another order; they agree to float32
rounding), or anything on Metal, where MLX's own quantized matmul runs on the GPU.
"""

from __future__ import annotations

from typing import Sequence

import mlx.core as mx
import numpy as np

from .ext import extension

GROUP_SIZE = 32
BITS = (4, 8)
KERNEL_MAX_ROWS = 16  # rows of x up to which the matmul kernel beats dequantize + BLAS


def dequantize_ops(w: mx.array, scales: mx.array, biases: mx.array, bits: int) -> mx.array:
    """Reference: ``W`` as float32 ``[N, K]``."""
    return mx.dequantize(w, scales.astype(mx.float32), biases.astype(mx.float32),
                         group_size=GROUP_SIZE, bits=bits)


def quantized_matmul_ops(x: mx.array, w: mx.array, scales: mx.array, biases: mx.array,
                         bits: int) -> mx.array:
    """Reference: ``x @ dequantize(W)^T`` in float32, cast back to ``x``'s dtype."""
    return (x.astype(mx.float32) @ dequantize_ops(w, scales, biases, bits).T).astype(x.dtype)


def dequantize(w: mx.array, scales: mx.array, biases: mx.array, bits: int,
               use_kernel: bool = True) -> mx.array:
    """``W`` as float32 ``[N, K]``, as :func:`dequantize_ops`."""
    ext = extension() if use_kernel else None
    if ext is None:
        return dequantize_ops(w, scales, biases, bits)
    return ext.dequantize(w, scales, biases, bits)


PACKED_ISAS = ("avx512", "avx2")  # the instruction sets whose kernel reads a packed W


def reads_packed() -> bool:
    """Whether this process's matmul kernel reads the copies :func:`pack` makes (elsewhere
    they would only take memory)."""
    ext = extension()
    return ext is not None and ext.isa() in PACKED_ISAS


def pack(w: mx.array, scales: mx.array, biases: mx.array, bits: int) -> mx.array | None:
    """``W`` packed by blocks of four rows, for the matmul kernel's decode steps: for each
    block and group of 32, the four rows' codes, then their four float16 scales and four
    float16 biases (``[N / 4, K / 32, 4 * 32 * bits / 8 + 16]`` bytes). One pass of the
    kernel over four rows then reads one stream instead of three arrays' six, about 1.6x
    faster from memory here (``scripts/bench_qlayout.cpp``). None where the kernel does not
    read a packed ``W``: N not a multiple of 4, or scales and biases not float16."""
    N = w.shape[0]
    if N % 4 or bits not in BITS or scales.dtype != mx.float16 or biases.dtype != mx.float16:
        return None
    groups, width = scales.shape[1], GROUP_SIZE * bits // 8

    def blocks(a: np.ndarray, per_row: int) -> np.ndarray:  # [N, groups, per_row] bytes
        return (a.view(np.uint8).reshape(N // 4, 4, groups, per_row).transpose(0, 2, 1, 3)
                .reshape(N // 4, groups, 4 * per_row))

    return mx.array(np.concatenate([blocks(np.array(w), width), blocks(np.array(scales), 2),
                                    blocks(np.array(biases), 2)], axis=2))


def quantized_matmul(x: mx.array, w: mx.array, scales: mx.array, biases: mx.array, bits: int,
                     use_kernel: bool = True, packed: mx.array | None = None) -> mx.array:
    """``x @ W^T`` for ``x`` of shape ``[..., K]``; ``W`` as :func:`quantized_matmul_ops`
    (``packed``: also as :func:`pack` made it, which decode steps read instead)."""
    ext = extension() if use_kernel else None
    if ext is None:
        return quantized_matmul_ops(x, w, scales, biases, bits)
    if x.size // x.shape[-1] <= KERNEL_MAX_ROWS:
        return ext.quantized_matmul(x, w, scales, biases, bits, packed)
    dense = ext.dequantize(w, scales, biases, bits)
    return (x.astype(mx.float32) @ dense.T).astype(x.dtype)


QWeights = tuple[mx.array, mx.array, mx.array, int]  # w, scales, biases, bits


def quantized_matmuls(x: mx.array, weights: Sequence[QWeights], use_kernel: bool = True,
                      packed: Sequence[mx.array] = ()) -> list[mx.array]:
    """``[x @ W^T for W in weights]``, each as :func:`quantized_matmul` (``packed``: none,
    or every ``W`` packed)."""
    ext = extension() if use_kernel else None
    if ext is None or x.dtype != mx.float32 or x.size // x.shape[-1] > KERNEL_MAX_ROWS:
        return [quantized_matmul(x, *w, use_kernel=use_kernel) for w in weights]
    w, scales, biases, bits = zip(*weights)
    return ext.quantized_matmuls(x, list(w), list(scales), list(biases), list(bits),
                                 list(packed))
