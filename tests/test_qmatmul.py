"""The CPU kernels (quantized matmul, RMS norm, RoPE, attention, the fused decode blocks)
against their pure-MLX references, from one call to whole models.

The reference half always runs; the kernel half skips only where the kernel did not build
(``kernel_status`` says why). Errors are relative to the largest reference value."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

from mlx_agent.kernels import (attention, dequantize, dequantize_ops, kernel_status,
                               quantized_matmul, quantized_matmul_ops, quantized_matmuls,
                               rms_norm, rope, swiglu, swiglu_ops)
from mlx_agent.kernels.decode_block import (Lora, Rope, attention_inputs, attention_inputs_ops,
                                            layer_tail, layer_tail_ops)
from mlx_agent.kernels.ext import extension
from mlx_agent.models import load
from mlx_agent.models import cpu_layers
from mlx_agent.models.cpu_layers import (KernelLlamaAttention, KernelLlamaBlock, KernelLlamaMLP,
                                         KernelQuantizedEmbedding, KernelQuantizedLinear,
                                         KernelRMSNorm, KernelRoPE)

from . import gguf_blocks
from .conftest import make_tiny_llama
from .test_gguf import to_gguf_name, write_tiny_gguf

KERNEL = kernel_status()
needs_kernel = pytest.mark.skipif(not KERNEL.available, reason=f"CPU kernel: {KERNEL.reason}")
TOL = 1e-3
# Two kernel paths that compute the same thing agree to float32 rounding (under AVX2 a fused
# decode step measured 2e-5 from the same layers a node at a time), except with the integer
# kernels: they round x to 16 bits a group, and a last-bit difference in x (a norm fused or
# not) can move a code by one.
SAME = {"avx512vnni": 3e-4, "avx2int": 3e-4, "avx2": 5e-5}.get(KERNEL.isa, 1e-5)


def rel_err(a, b) -> float:
    a, b = np.array(a, dtype=np.float64), np.array(b, dtype=np.float64)
    return float(np.abs(a - b).max() / np.abs(b).max())


def quantized_tensor(tmp_path, kind, rows, k, seed=0):
    """(w, scales, biases) as mx.load gives a GGUF tensor of ``kind``, and its float values."""
    w = np.random.default_rng(seed).standard_normal((rows, k)).astype(np.float32)
    path = tmp_path / f"{kind}-{rows}x{k}.gguf"
    deq = gguf_blocks.write(path, {"t.weight": (w, kind)}, {})["t.weight"]
    loaded = mx.load(str(path), format="gguf")
    return (loaded["t.weight"], loaded["t.scales"], loaded["t.biases"]), deq


@pytest.mark.parametrize("kind", gguf_blocks.QUANTS)
def test_reference_is_the_gguf_dequantization(tmp_path, kind):
    (w, s, b), deq = quantized_tensor(tmp_path, kind, 40, 96)
    x = np.random.default_rng(1).standard_normal((3, 96)).astype(np.float32)
    bits = 8 if kind == "q8_0" else 4
    got = quantized_matmul_ops(mx.array(x), w, s, b, bits)
    assert rel_err(got, x @ deq.T) < 1e-5


@needs_kernel
@pytest.mark.parametrize("kind", gguf_blocks.QUANTS)
@pytest.mark.parametrize("rows,k", [(1, 32), (37, 96), (200, 576)])
def test_kernel_matches_reference(tmp_path, kind, rows, k):
    (w, s, b), _ = quantized_tensor(tmp_path, kind, rows, k)
    bits = 8 if kind == "q8_0" else 4
    np.testing.assert_allclose(np.array(dequantize(w, s, b, bits)),
                               np.array(dequantize_ops(w, s, b, bits)), rtol=1e-6, atol=1e-6)
    for m in (1, 2, 3, 5, 16, 17, 40):  # up to 16 rows the matmul kernel, then dequantize
        x = mx.random.normal((m, k), key=mx.random.key(m))
        ref = quantized_matmul_ops(x, w, s, b, bits)
        assert rel_err(quantized_matmul(x, w, s, b, bits), ref) < TOL
    xt = mx.random.normal((k, 4)).T  # not contiguous
    assert rel_err(quantized_matmul(xt, w, s, b, bits), quantized_matmul_ops(xt, w, s, b, bits)) < TOL
    x3 = mx.random.normal((2, 3, k))  # leading dimensions and float16 activations
    assert quantized_matmul(x3, w, s, b, bits).shape == (2, 3, rows)
    half = quantized_matmul(x3.astype(mx.float16), w, s, b, bits)
    assert half.dtype == mx.float16
    assert rel_err(half, quantized_matmul_ops(x3.astype(mx.float16), w, s, b, bits)) < 1e-2


@needs_kernel
def test_several_matrices_in_one_node_match_the_reference(tmp_path):
    """q, k and v (or gate and up) as one kernel call: every kind and size in one call, each
    output as its own reference, for rows up to the kernel's limit and x in any layout."""
    mats = [(*quantized_tensor(tmp_path, kind, rows, 96, seed=rows)[0], 8 if kind == "q8_0" else 4)
            for kind, rows in (("q4_1", 37), ("q8_0", 64), ("q4_0", 5), ("q4_1", 1))]
    for x in (mx.random.normal((1, 1, 96)), mx.random.normal((16, 96)),
              mx.random.normal((96, 3)).T):
        got = extension().quantized_matmuls(x, *[list(m) for m in zip(*mats)])
        assert len(got) == len(mats)
        for y, (w, s, b, bits) in zip(got, mats):
            assert y.shape == (*x.shape[:-1], w.shape[0])
            assert rel_err(y, quantized_matmul_ops(x, w, s, b, bits)) < TOL
        for y, ref in zip(quantized_matmuls(x, mats), got):  # the public entry: the same node
            assert mx.array_equal(y, ref).item()
    big = mx.random.normal((17, 96))  # past the kernel's rows: one matmul each, same numbers
    for y, (w, s, b, bits) in zip(quantized_matmuls(big, mats), mats):
        assert rel_err(y, quantized_matmul_ops(big, w, s, b, bits)) < TOL


def pack_reference(w, scales, biases, bits, rows):
    """kernels/qmatmul.py's pack layouts in numpy (the extension's pack is checked against
    it): per block of ``rows`` rows and group of 32, the codes, the float16 scales, the
    float16 biases. 4 rows: each row's group as MLX packs it, side by side. 16 rows: 64-byte
    chunks holding four consecutive codes of each row (4-bit: low nibbles ``8c .. 8c + 3``,
    high nibbles ``8c + 4 .. 8c + 7``)."""
    N, groups = w.shape[0], scales.shape[1]

    def blocks(a, per_row):  # [N / rows, groups, rows * per_row]
        return (a.view(np.uint8).reshape(N // rows, rows, groups, per_row).transpose(0, 2, 1, 3)
                .reshape(N // rows, groups, rows * per_row))

    params = [blocks(np.array(scales), 2), blocks(np.array(biases), 2)]
    if rows == 4:
        return np.concatenate([blocks(np.array(w), 32 * bits // 8), *params], axis=2)
    codes = np.array(w).view(np.uint8)
    if bits == 4:  # MLX packs the low nibble first: codes 2i and 2i + 1 share byte i
        codes = np.stack([codes & 0x0F, codes >> 4], axis=-1)
    codes = codes.reshape(N // 16, 16, groups, 32)  # [block, row, group, k]
    if bits == 4:  # [block, group, chunk, row, k in chunk]: nibbles 0-3 low, 4-7 high
        c = codes.reshape(N // 16, 16, groups, 4, 2, 4).transpose(0, 2, 3, 1, 5, 4)
        codes = c[..., 0] | (c[..., 1] << 4)
    else:
        codes = codes.reshape(N // 16, 16, groups, 8, 4).transpose(0, 2, 3, 1, 4)
    codes = np.ascontiguousarray(codes).reshape(N // 16, groups, -1)
    return np.concatenate([codes, *params], axis=2)


@needs_kernel
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("rows", [4, 16])
def test_pack_is_the_documented_layout(bits, rows):
    w, s, b = mx.quantize(mx.random.normal((48, 96), key=mx.random.key(bits)), group_size=32,
                          bits=bits)
    s, b = s.astype(mx.float16), b.astype(mx.float16)
    got = np.array(extension().pack(w, s, b, bits, rows))
    assert np.array_equal(got, pack_reference(w, s, b, bits, rows))
    # strided views (columns of wider arrays), as a GGUF's tensors need not be contiguous
    def wide(a):
        return mx.concatenate([a, a], axis=1)[:, : a.shape[1]]

    assert np.array_equal(np.array(extension().pack(wide(w), wide(s), wide(b), bits, rows)), got)
    with pytest.raises(ValueError, match="multiple of the block"):
        extension().pack(w[:40], s[:40], b[:40], bits, 16)
    with pytest.raises(ValueError, match="float16"):
        extension().pack(w, s.astype(mx.float32), b, bits, rows)


@needs_kernel
def test_packed_weights_give_the_reference_results(tmp_path):
    """W packed by blocks of rows (what decode steps and small batches read: 16 rows for
    the VNNI kernel, else 4), at 1, 2, 3, 8, 13 and 16 rows of x (every tile of rows the
    kernels take: 8, 4, 2, 1); every kind, 5 and 19 groups (every tail), alone and several in
    a node. W that cannot be packed is left as it is."""
    from mlx_agent.kernels.qmatmul import pack, packed_rows, reads_packed

    block = packed_rows()
    if not block:
        pytest.skip("this CPU's kernel reads no packed W")
    mats, packs = [], []
    for kind, rows, k in (("q4_1", 48, 160), ("q8_0", 64, 608), ("q4_0", 16, 608)):
        (w, s, b), _ = quantized_tensor(tmp_path, kind, rows, k, seed=rows)
        bits = 8 if kind == "q8_0" else 4
        packed = pack(w, s, b, bits)
        # as many bytes as W's codes, scales and biases
        assert packed.shape == (rows // block, k // 32, block * (32 * bits // 8 + 4))
        for m in (1, 2, 3, 8, 13, 16):
            x = mx.random.normal((m, k), key=mx.random.key(m))
            ref = quantized_matmul_ops(x, w, s, b, bits)
            assert rel_err(quantized_matmul(x, w, s, b, bits, packed=packed), ref) < TOL
        mats.append((w, s, b, bits))
        packs.append(packed)
    x = mx.random.normal((2, 608), key=mx.random.key(5))
    both = mats[1:]
    for y, (w, s, b, bits) in zip(quantized_matmuls(x, both, packed=packs[1:]), both):
        assert rel_err(y, quantized_matmul_ops(x, w, s, b, bits)) < TOL
    (w, s, b), _ = quantized_tensor(tmp_path, "q4_1", 37, 96)
    assert pack(w, s, b, 4) is None  # 37 rows: not whole blocks
    assert pack(w[:36], s[:36].astype(mx.float32), b[:36].astype(mx.float32), 4) is None
    lm = load(tiny_quantized_gguf(tmp_path, "q4_1"), weights="quantized")
    linears = [m for _, m in lm.model.named_modules() if isinstance(m, KernelQuantizedLinear)]
    if not reads_packed():  # no copies where the kernel would not read them
        assert linears and all(cpu_layers._packed(m) is None for m in linears)
        return
    assert linears and all(cpu_layers._packed(m) is not None for m in linears)
    first = linears[0]
    first.weight = mx.array(first.weight)  # new weights: the packed copy is stale, not read
    assert cpu_layers._packed(first) is None


@needs_kernel
def test_packed_weights_past_the_small_batch_rows_match_the_reference(tmp_path):
    """Past KERNEL_MAX_ROWS rows (a prefill chunk) a packed W is multiplied by the kernel
    where it reads packed W's of any row count (VNNI), by dequantize + BLAS otherwise; alone
    and several in a node, 4 and 8 bits, either way the reference's result."""
    from mlx_agent.kernels.qmatmul import KERNEL_MAX_ROWS, pack

    mats = [(*quantized_tensor(tmp_path, kind, 48, 160, seed=n)[0], 8 if kind == "q8_0" else 4)
            for n, kind in enumerate(("q4_1", "q8_0"))]
    packs = [pack(*m) for m in mats]
    for rows in (KERNEL_MAX_ROWS + 1, 130):
        x = mx.random.normal((rows, 160), key=mx.random.key(rows))
        refs = [quantized_matmul_ops(x, *m) for m in mats]
        for m, p, ref in zip(mats, packs, refs):
            assert rel_err(quantized_matmul(x, *m, packed=p), ref) < TOL
        for y, ref in zip(quantized_matmuls(x, mats, packed=packs), refs):
            assert rel_err(y, ref) < TOL


@needs_kernel
def test_packed_path_matches_reference_on_zero_tiny_and_huge_groups_of_x(tmp_path):
    """The VNNI kernel scales x per group of 32: a group of zeros, one of denormal-sized
    values (whose inverse scale would overflow), and one of huge values each give the
    reference's result, with every other group ordinary."""
    from mlx_agent.kernels.qmatmul import pack

    (w, s, b), _ = quantized_tensor(tmp_path, "q4_1", 32, 160, seed=4)
    packed = pack(w, s, b, 4)
    x = np.array(mx.random.normal((3, 160), key=mx.random.key(2)))
    x[0, :32] = 0.0
    x[1, 32:64] = 1e-38 * np.linspace(-1, 1, 32)
    x[2, 64:96] = 1e30 * np.linspace(-1, 1, 32)
    x = mx.array(x)
    ref = quantized_matmul_ops(x, w, s, b, 4)
    for row in range(3):  # each row against its own magnitude
        got = quantized_matmul(x[row:row + 1], w, s, b, 4, packed=packed)
        assert rel_err(got, ref[row:row + 1]) < TOL


ISA_CHECK = textwrap.dedent("""
    import mlx_agent, mlx.core as mx, numpy as np
    from mlx_agent.kernels import (attention, dequantize, dequantize_ops, kernel_status,
                               quantized_matmul, quantized_matmul_ops, quantized_matmuls,
                               rms_norm, rope)
    from mlx_agent.kernels.qmatmul import pack
    print(kernel_status().isa)
    worst = 0.0
    for bits, k in ((4, 160), (8, 160), (4, 608), (8, 608)):  # 5 and 19 groups: every tail
        for m in (1, 2, 5, 16):
            w = mx.random.normal((67, k), key=mx.random.key(bits))
            q, s, b = mx.quantize(w, group_size=32, bits=bits)
            for dtype in (mx.float16, mx.float32):
                s, b = s.astype(dtype), b.astype(dtype)
                x = mx.random.normal((m, k), key=mx.random.key(m))
                ref = np.array(quantized_matmul_ops(x, q, s, b, bits))
                for packed in (None, pack(q[:64], s[:64], b[:64], bits)):
                    rows = 67 if packed is None else 64
                    got = np.array(quantized_matmul(x, q[:rows], s[:rows], b[:rows], bits,
                                                    packed=packed))
                    worst = max(worst, float(np.abs(got - ref[:, :rows]).max()
                                             / np.abs(ref).max()))
    from mlx_agent.kernels.decode_block import (Rope, attention_inputs, attention_inputs_ops,
                                                layer_tail, layer_tail_ops)
    def weights(n, k, bits, seed):
        q, s, b = mx.quantize(mx.random.normal((n, k), key=mx.random.key(seed)) * 0.1,
                              group_size=32, bits=bits)
        return q, s.astype(mx.float16), b.astype(mx.float16), bits
    x = mx.random.normal((3, 1, 64), key=mx.random.key(7))
    norm = mx.random.uniform(0.5, 1.5, (64,), key=mx.random.key(8))
    qkv = [weights(128, 64, 4, 1), weights(64, 64, 8, 2), weights(64, 64, 4, 3)]
    rope = Rope(32, False, 10000.0, 1.0, 9)
    got = attention_inputs(x, norm, 1e-5, qkv, 4, 2, rope, mx.float32)
    ref = attention_inputs_ops(x, norm, 1e-5, qkv, 4, 2, rope, mx.float32)
    mats = [weights(64, 128, 4, 4), weights(96, 64, 4, 5), weights(96, 64, 8, 6),
            weights(64, 96, 4, 7)]
    attn = mx.random.normal((3, 1, 128), key=mx.random.key(9))
    for g, r in zip([*got, layer_tail(attn, x, norm, 1e-5, *mats)],
                    [*ref, layer_tail_ops(attn, x, norm, 1e-5, *mats)]):
        worst = max(worst, float(mx.abs(g - r).max() / mx.abs(r).max()))
    from mlx_agent.kernels.ext import extension
    q = mx.random.normal((2, 12, 1, 32), key=mx.random.key(10))  # six heads a kv head
    for dtype in (mx.float16, mx.float32):  # float16 widened by this instruction set's code
        k, v = (3 * mx.random.normal((2, 2, 2, 333, 80), key=mx.random.key(11))).astype(dtype)
        k = k[..., :32]
        starts = mx.array([0, 101])  # a range that starts inside a tile
        mask = (mx.arange(333)[None] >= starts[:, None])[:, None, None, :]
        ref = mx.fast.scaled_dot_product_attention(
            q, k.astype(mx.float32), v.astype(mx.float32), scale=0.2, mask=mask)
        got = extension().decode_attention(q, k, v, 0.2, starts)
        worst = max(worst, float(mx.abs(got - ref).max() / mx.abs(ref).max()))
    # prefill attention and SwiGLU, each instantiated for this instruction set's registers:
    # 37 query rows (a partial task), 50 keys (a partial tile), heads of 80 (a partial tile
    # of values), float16 and float32
    q = mx.random.normal((1, 6, 37, 80), key=mx.random.key(12))
    for dtype in (mx.float16, mx.float32):
        k, v = (3 * mx.random.normal((2, 1, 3, 50, 80), key=mx.random.key(13))).astype(dtype)
        ref = mx.fast.scaled_dot_product_attention(
            q, k.astype(mx.float32), v.astype(mx.float32), scale=0.2, mask="causal")
        got = extension().prefill_attention(q, k, v, 0.2)
        worst = max(worst, float(mx.abs(got - ref).max() / mx.abs(ref).max()))
    g, u = 8 * mx.random.normal((2, 3, 77), key=mx.random.key(14))
    ref = g * mx.sigmoid(g) * u
    worst = max(worst, float(mx.abs(extension().swiglu(g, u) - ref).max() / mx.abs(ref).max()))
    print(worst)
""")


@needs_kernel
@pytest.mark.parametrize("shape", [(1, 512, 1536), (2, 1, 576), (3, 7), (17,)])
def test_swiglu_kernel_matches_mlx_lm(shape):
    """Every tail length, a transposed view (made contiguous first), and the exponential's
    extremes: silu(g) is g for large g, -0 to tiny for very negative g, NaN stays NaN."""
    g = 8 * mx.random.normal(shape)
    u = mx.random.normal(shape)
    assert rel_err(swiglu(g, u), swiglu_ops(g, u)) < 1e-6
    assert rel_err(extension().swiglu(g.T, u.T), swiglu_ops(g.T, u.T)) < 1e-6
    edge = mx.array([-1e4, -100.0, -87.0, -20.0, -1e-30, 0.0, 1e-30, 20.0, 88.0, 1e4, 3.0,
                     -3.0, 0.5, -0.5, 7.0, -7.0, float("nan")])
    got, ref = swiglu(edge, mx.ones_like(edge)), swiglu_ops(edge, mx.ones_like(edge))
    assert mx.allclose(got, ref, rtol=1e-6, atol=1e-30, equal_nan=True).item()
    assert swiglu(g.astype(mx.float16), u.astype(mx.float16)).dtype == mx.float16  # reference


@needs_kernel
@pytest.mark.parametrize("traditional", [True, False])
@pytest.mark.parametrize("dims", [64, 32])
def test_norm_and_rope_kernels_match_mx_fast(traditional, dims):
    x = mx.random.normal((1, 5, 9, 64)).transpose(0, 2, 1, 3)  # a transposed view, as in attention
    # float32 angles: MLX's CPU exp is not libm's, so far positions differ more
    for offset, tol in ((0, 1e-6), (37, 1e-5), (4000, 1e-4)):
        ref = mx.fast.rope(x, dims, traditional=traditional, base=1e5, scale=0.5, offset=offset)
        got = rope(x, dims, traditional=traditional, base=1e5, scale=0.5, offset=offset)
        assert rel_err(got, ref) < tol
    w = mx.random.normal((64,))
    assert rel_err(rms_norm(x, w, 1e-5), mx.fast.rms_norm(x, w, 1e-5)) < 1e-6
    assert rms_norm(x, w, 1e-5, use_kernel=False).shape == x.shape


@needs_kernel
@pytest.mark.parametrize("dtype", [mx.float32, mx.float16])
@pytest.mark.parametrize("keys", [1, 7, 640, 3000])
def test_decode_attention_kernel_matches_mx_fast(keys, dtype):
    q = mx.random.normal((1, 9, 1, 64))
    # keys and values read through a slice of a cache buffer, in place; scores spread wide
    cache_k, cache_v = (3 * mx.random.normal((2, 1, 3, 4096, 64))).astype(dtype)
    k, v = cache_k[..., :keys, :], cache_v[..., :keys, :]
    ref = mx.fast.scaled_dot_product_attention(q, k.astype(mx.float32), v.astype(mx.float32),
                                               scale=0.125)
    assert rel_err(extension().decode_attention(q, k, v, 0.125), ref) < 1e-5  # the kernel
    assert rel_err(attention(q, k, v, 0.125), ref) < 1e-5
    if dtype == mx.float32:
        assert rel_err(attention(q, k, v, 0.125, use_kernel=False), ref) == 0


@needs_kernel
@pytest.mark.parametrize("dtype", [mx.float32, mx.float16])
@pytest.mark.parametrize("queries,keys", [(1, 1), (5, 5), (7, 40), (128, 700), (3, 1000)])
def test_prefill_attention_kernel_matches_mx_fast_causal(queries, keys, dtype):
    """The last ``queries`` positions of ``keys``, causally masked, as mx.fast computes them."""
    q = mx.random.normal((1, 9, queries, 64))
    cache_k, cache_v = (3 * mx.random.normal((2, 1, 3, 1024, 64))).astype(dtype)
    k, v = cache_k[..., :keys, :], cache_v[..., :keys, :]
    ref = mx.fast.scaled_dot_product_attention(q, k.astype(mx.float32), v.astype(mx.float32),
                                               scale=0.125, mask="causal")
    assert rel_err(extension().prefill_attention(q, k, v, 0.125), ref) < 1e-5
    assert rel_err(attention(q, k, v, 0.125, mask="causal"), ref) < 1e-5


@needs_kernel
def test_prefill_attention_kernel_reads_batches_and_head_groups_apart():
    q = mx.random.normal((2, 6, 8, 32)).transpose(0, 2, 1, 3)  # a transposed view, as in layers
    k, v = mx.random.normal((2, 2, 2, 50, 32))
    ref = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.2, mask="causal")
    assert rel_err(extension().prefill_attention(q, k, v, 0.2), ref) < 1e-5
    # heads of 128 (values weighed 64 features at a time: two passes), float16 cache
    q = mx.random.normal((1, 4, 21, 128))
    k, v = mx.random.normal((2, 1, 2, 77, 128)).astype(mx.float16)
    ref = mx.fast.scaled_dot_product_attention(q, k.astype(mx.float32), v.astype(mx.float32),
                                               scale=0.1, mask="causal")
    assert rel_err(extension().prefill_attention(q, k, v, 0.1), ref) < 1e-5


@needs_kernel
def test_decode_attention_kernel_reads_batches_and_head_groups_apart():
    """Two sequences, four query heads per key/value head: each output row from its own."""
    q = mx.random.normal((2, 8, 1, 32))
    k, v = mx.random.normal((2, 2, 2, 300, 32))
    ref = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.2)
    assert rel_err(extension().decode_attention(q, k, v, 0.2), ref) < 1e-5


@needs_kernel
@pytest.mark.parametrize("dtype", [mx.float32, mx.float16])
@pytest.mark.parametrize("keys", [9, 333])
def test_decode_attention_kernel_takes_any_head_group_and_value_size(keys, dtype):
    """Six query heads a key/value head (sums for four heads, then two), values of 80
    features (64 in registers, then 16), keys of 32, a key count that leaves a tail tile."""
    q = mx.random.normal((2, 12, 1, 32))
    k = (3 * mx.random.normal((2, 2, keys, 32))).astype(dtype)
    v = mx.random.normal((2, 2, keys + 50, 80)).astype(dtype)[..., :keys, :]
    ref = mx.fast.scaled_dot_product_attention(q, k.astype(mx.float32), v.astype(mx.float32),
                                               scale=0.2)
    assert rel_err(extension().decode_attention(q, k, v, 0.2), ref) < 1e-5


@needs_kernel
@pytest.mark.parametrize("dtype", [mx.float32, mx.float16])
@pytest.mark.parametrize("keys", [5, 700, 3000])
def test_decode_attention_kernel_with_row_starts_matches_the_padding_mask(keys, dtype):
    """A left-padded batch's step: row b sees keys from starts[b] on (the rest is padding),
    as mx.fast computes it with the boolean mask mlx-lm's BatchKVCache makes; key ranges
    split into parts that lie wholly in the padding are empty."""
    q = mx.random.normal((4, 9, 1, 64))
    cache_k, cache_v = (3 * mx.random.normal((2, 4, 3, 4096, 64))).astype(dtype)
    k, v = cache_k[..., :keys, :], cache_v[..., :keys, :]
    starts = mx.array([0, keys // 3, keys - 1, keys // 2])
    mask = (mx.arange(keys)[None] >= starts[:, None])[:, None, None, :]
    ref = mx.fast.scaled_dot_product_attention(q, k.astype(mx.float32), v.astype(mx.float32),
                                               scale=0.125, mask=mask)
    assert rel_err(extension().decode_attention(q, k, v, 0.125, starts), ref) < 1e-5
    assert rel_err(attention(q, k, v, 0.125, mask=mask, starts=starts), ref) < 1e-5
    with pytest.raises(ValueError, match="one key index per batch row"):
        extension().decode_attention(q, k, v, 0.125, mx.array([0, 1]))


@needs_kernel
@pytest.mark.parametrize("isa", ["avx512vnni", "avx512", "avx2int", "avx2", "scalar"])
@pytest.mark.parametrize("threads", ["1", "2"])
def test_every_instruction_set_and_thread_count_matches_reference(isa, threads):
    env = {**os.environ, "MLX_AGENT_KERNEL_ISA": isa, "MLX_AGENT_KERNEL_THREADS": threads}
    out = subprocess.run([sys.executable, "-c", ISA_CHECK], env=env, capture_output=True,
                         text=True, timeout=120, check=True).stdout.split()
    if out[0] != isa:
        pytest.skip(f"this CPU runs {out[0]}, not {isa}")
    assert float(out[1]) < TOL


def quantized(n, k, bits, seed, dtype=mx.float16):
    q, s, b = mx.quantize(mx.random.normal((n, k), key=mx.random.key(seed)) * 0.1,
                          group_size=32, bits=bits)
    return q, s.astype(dtype), b.astype(dtype), bits


@needs_kernel
@pytest.mark.parametrize("rows", [1, 2, 16])
@pytest.mark.parametrize("kv_dtype", [mx.float32, mx.float16])
@pytest.mark.parametrize("traditional", [False, True])
def test_decode_blocks_match_their_reference(rows, kv_dtype, traditional):
    E, H, KVH, D, I = 96, 6, 2, 32, 160
    x = mx.random.normal((rows, 1, E), key=mx.random.key(rows)) * 3
    norm = mx.random.uniform(0.5, 1.5, (E,), key=mx.random.key(1))
    qkv = [quantized(H * D, E, 4, 2), quantized(KVH * D, E, 8, 3, mx.float32),
           quantized(KVH * D, E, 4, 4)]
    per_row = mx.arange(rows, dtype=mx.int32) * 7 + 3  # a batch's rows at their own positions
    for dims, offset, tol in ((D, 0, 1e-5), (D // 2, 4000, 1e-4), (D, per_row, 1e-5)):
        rope = Rope(dims, traditional, 10000.0, 0.5, offset)
        got = attention_inputs(x, norm, 1e-5, qkv, H, KVH, rope, kv_dtype)
        ref = attention_inputs_ops(x, norm, 1e-5, qkv, H, KVH, rope, kv_dtype)
        assert [(a.shape, a.dtype) for a in got] == [(a.shape, a.dtype) for a in ref]
        assert [a.shape for a in got] == [(rows, H, 1, D), (rows, KVH, 1, D), (rows, KVH, 1, D)]
        for g, r in zip(got, ref):
            ulp = 1e-3 if g.dtype == mx.float16 else 0.0  # a rounding either side of a half
            assert rel_err(g.astype(mx.float32), r.astype(mx.float32)) < max(tol, ulp)
    # LoRA on q and v (as the bundled model's default adapter has), added before RoPE
    lora = [Lora(t, mx.random.normal((E, 8), key=mx.random.key(10 + t)) * 0.1,
                 mx.random.normal((8, n), key=mx.random.key(20 + t)) * 0.1, 2.0)
            for t, n in ((0, H * D), (2, KVH * D))]
    rope = Rope(D, traditional, 10000.0, 1.0, 5)
    got = attention_inputs(x, norm, 1e-5, qkv, H, KVH, rope, kv_dtype, lora)
    ref = attention_inputs_ops(x, norm, 1e-5, qkv, H, KVH, rope, kv_dtype, lora)
    plain = attention_inputs_ops(x, norm, 1e-5, qkv, H, KVH, rope, kv_dtype)
    assert rel_err(ref[0], plain[0]) > 1e-3  # the adapter matters
    for g, r in zip(got, ref):
        ulp = 1e-3 if g.dtype == mx.float16 else 0.0
        assert rel_err(g.astype(mx.float32), r.astype(mx.float32)) < max(1e-5, ulp)
    o, gate, up = quantized(E, H * D, 4, 5), quantized(I, E, 4, 6), quantized(I, E, 8, 7)
    down = quantized(E, I, 4, 8)
    attn = mx.random.normal((rows, 1, H * D), key=mx.random.key(9))
    got = layer_tail(attn, x, norm, 1e-5, o, gate, up, down)
    assert got.shape == x.shape
    assert rel_err(got, layer_tail_ops(attn, x, norm, 1e-5, o, gate, up, down)) < 1e-5
    # a strided attention output (a transposed view) reads the same
    strided = attn.reshape(rows, H * D, 1).transpose(0, 2, 1)
    assert rel_err(layer_tail(strided, x, norm, 1e-5, o, gate, up, down), got) < 1e-6


def test_decode_blocks_fall_back_outside_a_decode_step():
    """Two positions, or more rows than the matmul kernel takes: the reference runs."""
    E, H, D = 64, 2, 32
    norm = mx.ones((E,))
    qkv = [quantized(H * D, E, 4, s) for s in (1, 2, 3)]
    rope = Rope(D, False, 10000.0, 1.0, 3)
    for x in (mx.random.normal((1, 2, E)), mx.random.normal((17, 1, E))):
        got = attention_inputs(x, norm, 1e-5, qkv, H, H, rope, mx.float32)
        ref = attention_inputs_ops(x, norm, 1e-5, qkv, H, H, rope, mx.float32)
        assert [a.shape for a in got] == [(x.shape[0], H, x.shape[1], D)] * 3
        assert all(rel_err(g, r) == 0.0 for g, r in zip(got, ref))
    x = mx.random.normal((17, 1, E), key=mx.random.key(0))
    mats = [quantized(E, H * D, 4, 4), quantized(96, E, 4, 5), quantized(96, E, 4, 6),
            quantized(E, 96, 4, 7)]
    attn = mx.random.normal((17, 1, H * D))
    assert rel_err(layer_tail(attn, x, norm, 1e-5, *mats),
                   layer_tail_ops(attn, x, norm, 1e-5, *mats)) < 1e-6


def tiny_quantized_gguf(tmp_path, kind, seed=5, damage=None):
    """A tiny random llama GGUF whose 2-D weights are ``kind`` blocks (``damage``: a tensor
    whose first weight is NaN, so its first block's scale is too)."""
    model = make_tiny_llama(seed=seed)
    float_path = tmp_path / "float.gguf"
    write_tiny_gguf(float_path, model)
    tensors = {to_gguf_name(k): (np.array(v), kind if v.ndim == 2 else "f32")
               for k, v in tree_flatten(model.parameters())}
    if damage:
        tensors[damage][0].flat[0] = np.nan
    path = tmp_path / f"tiny-{kind}.gguf"
    with np.errstate(invalid="ignore"):  # the damaged block's codes
        gguf_blocks.write(path, tensors, gguf_blocks.float_meta(float_path))
    return path


def greedy(lm, prompt, n):
    engine = lm.engine()
    engine.prefill(prompt)
    return list(engine.generate(max_tokens=n))


@needs_kernel
@pytest.mark.parametrize("kind", gguf_blocks.QUANTS)
def test_tiny_model_logits_and_greedy_tokens_match_float32(tmp_path, kind):
    path = tiny_quantized_gguf(tmp_path, kind)
    fast, ref = load(path, weights="quantized"), load(path, weights="float32")
    layers = [m for _, m in fast.model.named_modules()]
    assert sum(isinstance(m, KernelQuantizedLinear) for m in layers) == 14  # 7 per layer
    assert any(isinstance(m, KernelQuantizedEmbedding) for m in layers)
    assert sum(isinstance(m, KernelRMSNorm) for m in layers) == 5  # 2 per layer and the last
    assert sum(isinstance(m, KernelRoPE) for m in layers) == 2
    assert sum(isinstance(m, KernelLlamaAttention) for m in layers) == 2
    assert sum(isinstance(m, KernelLlamaMLP) for m in layers) == 2
    assert sum(isinstance(m, KernelLlamaBlock) for m in layers) == 2
    for ids in ([[1, 5, 9, 33, 2]], [list(range(40))]):  # kernel rows and prefill rows
        assert rel_err(fast.model(mx.array(ids)), ref.model(mx.array(ids))) < TOL
    prompt = [3, 14, 15, 92, 65]
    assert greedy(fast, prompt, 12) == greedy(ref, prompt, 12)


def decode_logits(lm, prompt, n):
    """Greedy tokens and each step's logits."""
    engine = lm.engine()
    engine.prefill(prompt)
    tokens, logits = [], []
    for t in engine.generate(max_tokens=n):
        tokens.append(t)
        logits.append(np.array(engine.logits))
    return tokens, np.stack(logits)


@needs_kernel
@pytest.mark.parametrize("adapter", [False, True])
def test_fused_decode_steps_match_the_layer_by_layer_kernels(tmp_path, monkeypatch, adapter):
    """A decode step through the two fused nodes gives the tokens and logits of the same
    layers run one kernel node at a time, with LoRA on q and v too (as the bundled model's
    default adapter has), which the first fused node applies."""
    lm = load(tiny_quantized_gguf(tmp_path, "q4_1"), weights="quantized")
    if adapter:
        from mlx_lm.tuner.utils import linear_to_lora_layers
        linear_to_lora_layers(lm.model, 2, {"rank": 4, "scale": 2.0, "dropout": 0.0,
                                            "keys": ["self_attn.q_proj", "self_attn.v_proj"]})
        for _, m in lm.model.named_modules():  # LoRA starts at zero: make it matter
            if "lora_b" in m:
                m.lora_b = mx.random.normal(m.lora_b.shape, key=mx.random.key(3)) * 0.1
        lm.model.eval()  # as load() leaves a model with its adapter
    prompt = [3, 14, 15, 92, 65]
    calls = []
    spy = cpu_layers.attention_inputs
    monkeypatch.setattr(cpu_layers, "attention_inputs",
                        lambda *a, **k: calls.append(a) or spy(*a, **k))
    fused = decode_logits(lm, prompt, 12)
    assert len(calls) == 2 * 12 and all(bool(a[-1]) == adapter for a in calls)  # fused, LoRA
    monkeypatch.setattr(KernelLlamaBlock, "__call__", cpu_layers.llama.TransformerBlock.__call__)
    unfused = decode_logits(lm, prompt, 12)
    assert fused[0] == unfused[0]
    assert rel_err(fused[1], unfused[1]) < SAME


@needs_kernel
@pytest.mark.real_model
def test_real_model_logits_and_greedy_tokens_match_float32(monkeypatch):
    # the kernels' exactness with a float32 KV cache, as the reference keeps; the float16
    # cache's own drift is measured in tests/test_kv_dtype.py
    monkeypatch.setenv("MLX_AGENT_KV_DTYPE", "float32")
    fast, ref = load("smollm2-135m", weights="quantized"), load("smollm2-135m", weights="float32")
    for text in ["The capital of France is", "def fibonacci(n):"]:
        ids = fast.prompt_ids(text)
        e_fast, e_ref = fast.engine(context_length=64), ref.engine(context_length=64)
        e_fast.prefill(ids)
        e_ref.prefill(ids)
        assert rel_err(e_fast.logits, e_ref.logits) < TOL
        toks_fast = list(e_fast.generate(max_tokens=16))
        toks_ref = list(e_ref.generate(max_tokens=16))
        assert toks_fast == toks_ref
        assert rel_err(e_fast.logits, e_ref.logits) < TOL  # after 16 decode steps


def test_models_command_names_the_path_and_why():
    run = lambda env: subprocess.run(  # noqa: E731
        [sys.executable, "-m", "mlx_agent.cli.main", "models"], capture_output=True, text=True,
        env={**os.environ, **env}, timeout=60, check=True).stdout
    off = run({"MLX_AGENT_KERNELS": "0", "MLX_AGENT_WEIGHTS": ""})
    assert "weights: float32 on the BLAS (CPU kernel not used: kernels turned off" in off
    if KERNEL.available:
        on = run({"MLX_AGENT_WEIGHTS": ""})
        assert f"weights: quantized on the CPU kernel ({KERNEL.isa}," in on


def test_a_failed_kernel_build_leaves_the_package_installable(tmp_path):
    """setup.py's build step reports the failure and succeeds without the extension."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "CMAKE_ARGS": "-DCMAKE_CXX_COMPILER=/nonexistent/c++"}
    out = subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--build-temp", str(tmp_path / "t"),
         "--build-lib", str(tmp_path / "lib")],
        cwd=root, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "the CPU kernels did not build" in out.stderr
    assert not list((tmp_path / "lib").rglob("_ext*"))


@pytest.mark.parametrize("kind", gguf_blocks.QUANTS)
@pytest.mark.parametrize("weights", ["quantized", "float32"])
def test_a_nan_block_scale_is_refused_at_load_not_generated_from(tmp_path, kind, weights):
    path = tiny_quantized_gguf(tmp_path, kind, damage="blk.1.ffn_down.weight")
    run = subprocess.run([sys.executable, "-m", "mlx_agent.cli.main", "generate", "-m", str(path),
                          "--weights", weights, "--max-tokens", "4", "hi"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.count("\n") == 1 and "Traceback" not in run.stderr
    assert f"{path}: the weights hold NaN or infinite values (model.layers.1.mlp.down_proj." \
        in run.stderr and "the file is damaged" in run.stderr
