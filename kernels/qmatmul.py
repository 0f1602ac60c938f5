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
reads, where given, a copy of ``W`` that :func:`pack` made, in blocks of rows (one stream from
memory instead of three arrays):

- with AVX-512 VNNI, blocks of 16 rows, multiplied as integers: ``x`` is rounded to 16 bits
  per group of 32 (a high and a low signed byte per element) once per call, and each group's
  dot product with ``W``'s codes is exact in int32 before its scale and bias apply in
  float32. About twice the float kernel's speed at every row count here
  (``scripts/bench_matmul_rows.py``); results agree with the reference to about 5e-5
  relative, not to float32 rounding;
- otherwise (AVX-512, AVX2) blocks of four rows, dequantized in registers with the
  reference's arithmetic and activations kept in float32. For a decode step's row of ``x``
  (AVX-512: one or two) each group's scale and bias are factored out of its sum; for more
  rows each group is dequantized once for up to four rows of ``x``. The scalar code, and any
  kernel given no packed copy, reads MLX's arrays.

Past :data:`KERNEL_MAX_ROWS` rows (prefill chunks), where the work is compute-bound, the
VNNI kernel still multiplies (it measured faster than the BLAS there too); without it the
dequantize kernel writes ``W`` as float32 and the BLAS multiplies, which measured faster
than the float kernels, and the float32 copy lives for one layer's matmul only. The code
(AVX-512 VNNI, AVX-512, AVX2+FMA+F16C or scalar) is chosen at run time and runs over a small
thread pool. Not promised: bit-identical results to the reference (sums run in another
order, and the VNNI kernel rounds ``x``), or anything on Metal, where MLX's own quantized
matmul runs on the GPU.
"""

from __future__ import annotations

from typing import Sequence

import mlx.core as mx

from .ext import extension

GROUP_SIZE = 32
BITS = (4, 8)
KERNEL_MAX_ROWS = 16  # rows of x up to which the float kernels beat dequantize + BLAS


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


def packed_rows() -> int:
    """Rows per block of the packed ``W`` this process's matmul kernel reads: 16 (the
    integer kernels, AVX-512 VNNI and ``avx2int``), 4 (the float kernels, AVX-512 and AVX2),
    or 0 where it reads none (no kernel, scalar code)."""
    ext = extension()
    return ext.packed_rows() if ext is not None else 0


def reads_packed() -> bool:
    """Whether this process's matmul kernel reads the copies :func:`pack` makes (elsewhere
    they would only take memory)."""
    return packed_rows() > 0


def pack(w: mx.array, scales: mx.array, biases: mx.array, bits: int) -> mx.array | None:
    """``W`` packed for the matmul kernel (decode steps and small batches; with an integer
    kernel, prefill chunks too), in blocks of :func:`packed_rows` rows: for each block and group of 32, the
    block's codes, then its rows' float16 scales, then their float16 biases. None where the kernel does not read a
    packed ``W``: no packing kernel, N not a multiple of the block, or scales and biases not
    float16. Either layout takes as many bytes as ``W``'s three arrays.

    - 4 rows (AVX-512, AVX2): the rows' codes side by side as MLX packs them, so one pass over
      four rows reads one stream instead of three arrays' six, about 1.6x faster from memory
      here (``scripts/bench_qlayout.cpp``).
    - 16 rows (the integer kernels, AVX-512 VNNI and AVX2's ``avx2int``): codes interleaved
      four at a time, so that 64 bytes hold codes
      ``k .. k + 3`` of each of the 16 rows, one 32-bit lane per row (4-bit: the low nibbles
      hold ``8c .. 8c + 3`` and the high ones ``8c + 4 .. 8c + 7`` of chunk ``c``), as the
      integer dot products read them (``kernels/csrc/qmatmul_vnni.cpp``,
      ``qmatmul_avx2int.cpp``)."""
    rows, N = packed_rows(), w.shape[0]
    if (not rows or N % rows or bits not in BITS or scales.dtype != mx.float16
            or biases.dtype != mx.float16):
        return None
    # in C++ on the kernels' pool: a model load took 1.0-1.3 s against 1.4-2.0 s with numpy
    return extension().pack(w, scales, biases, bits, rows)


def _kernel_rows(x: mx.array, packed: bool) -> bool:
    """Whether the matmul kernel, not dequantize + BLAS, multiplies ``x``'s rows: up to
    :data:`KERNEL_MAX_ROWS` of them, or any number where an integer kernel reads a packed
    ``W`` (with VNNI, prefill measured 1.1-1.7x faster through it than through MKL, chunks
    of 128 and 512 rows, ``scripts/bench_prefill_step.py`` with and without
    ``MLX_AGENT_KERNEL_ISA=avx512``; with ``avx2int`` on an AVX2 EPYC, 1.56x in chunks of 128
    and within the runs' noise in chunks of 512, against ``MLX_AGENT_KERNEL_ISA=avx2``)."""
    return x.size // x.shape[-1] <= KERNEL_MAX_ROWS or (packed and packed_rows() == 16)


def quantized_matmul(x: mx.array, w: mx.array, scales: mx.array, biases: mx.array, bits: int,
                     use_kernel: bool = True, packed: mx.array | None = None) -> mx.array:
    """``x @ W^T`` for ``x`` of shape ``[..., K]``; ``W`` as :func:`quantized_matmul_ops`
    (``packed``: also as :func:`pack` made it, which decode steps read instead)."""
    ext = extension() if use_kernel else None
    if ext is None:
        return quantized_matmul_ops(x, w, scales, biases, bits)
    if _kernel_rows(x, packed is not None):
        return ext.quantized_matmul(x, w, scales, biases, bits, packed)
    dense = ext.dequantize(w, scales, biases, bits)
    return (x.astype(mx.float32) @ dense.T).astype(x.dtype)


QWeights = tuple[mx.array, mx.array, mx.array, int]  # w, scales, biases, bits


def quantized_matmuls(x: mx.array, weights: Sequence[QWeights], use_kernel: bool = True,
                      packed: Sequence[mx.array] = ()) -> list[mx.array]:
    """``[x @ W^T for W in weights]``, each as :func:`quantized_matmul` (``packed``: none,
    or every ``W`` packed)."""
    ext = extension() if use_kernel else None
    if ext is None or x.dtype != mx.float32 or not _kernel_rows(x, bool(packed)):
        return [quantized_matmul(x, *w, use_kernel=use_kernel, packed=p)
                for w, p in zip(weights, packed or [None] * len(weights))]
    w, scales, biases, bits = zip(*weights)
    return ext.quantized_matmuls(x, list(w), list(scales), list(biases), list(bits),
                                 list(packed))
