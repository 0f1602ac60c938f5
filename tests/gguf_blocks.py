"""GGUF files with Q4_0, Q4_1 and Q8_0 tensors, written in the test (``mx.save_gguf`` writes
only float tensors): llama.cpp's reference block quantizers in numpy, and a GGUF v3 writer."""

from __future__ import annotations

import struct

import mlx.core as mx
import numpy as np

GGML_TYPES = {"f32": 0, "q4_0": 2, "q4_1": 3, "q8_0": 8}
QUANTS = ("q4_0", "q4_1", "q8_0")
_ALIGN = 32


def quantize(w: np.ndarray, kind: str) -> tuple[bytes, np.ndarray]:
    """``w`` ([rows, K], K a multiple of 32) as GGUF blocks, and what they dequantize to."""
    blocks = w.astype(np.float32).reshape(-1, 32)
    if kind == "q8_0":
        d = (np.abs(blocks).max(axis=1) / 127).astype(np.float16)
        inv = np.divide(1.0, d.astype(np.float32), out=np.zeros(len(d), np.float32), where=d != 0)
        q = np.round(blocks * inv[:, None]).astype(np.int8)
        raw = np.concatenate([d.view(np.uint8).reshape(-1, 2), q.view(np.uint8)], axis=1)
        deq = q.astype(np.float32) * d.astype(np.float32)[:, None]
    else:
        if kind == "q4_0":
            idx = np.abs(blocks).argmax(axis=1)
            d = (blocks[np.arange(len(blocks)), idx] / -8).astype(np.float16)
            low, offset = np.zeros(len(blocks), np.float32), 8.5
        else:
            low = blocks.min(axis=1)
            d = ((blocks.max(axis=1) - low) / 15).astype(np.float16)
            offset = 0.5
        inv = np.divide(1.0, d.astype(np.float32), out=np.zeros(len(d), np.float32), where=d != 0)
        q = np.minimum(15, ((blocks - low[:, None]) * inv[:, None] + offset).astype(np.int32))
        q = q.astype(np.uint8)
        packed = q[:, :16] | (q[:, 16:] << 4)
        head = [d.view(np.uint8).reshape(-1, 2)]
        if kind == "q4_0":
            deq = (q.astype(np.float32) - 8) * d.astype(np.float32)[:, None]
        else:
            m = low.astype(np.float16)
            head.append(m.view(np.uint8).reshape(-1, 2))
            deq = q.astype(np.float32) * d.astype(np.float32)[:, None] + m.astype(np.float32)[:, None]
        raw = np.concatenate(head + [packed], axis=1)
    return raw.tobytes(), deq.reshape(w.shape)


def _string(s: str) -> bytes:
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def _value(v) -> bytes:
    if isinstance(v, str):
        return struct.pack("<I", 8) + _string(v)
    if isinstance(v, list):
        return struct.pack("<IIQ", 9, 8, len(v)) + b"".join(_string(s) for s in v)
    a = np.array(v)
    code, fmt = {np.dtype(np.uint32): (4, "<I"), np.dtype(np.int32): (5, "<i"),
                 np.dtype(np.float32): (6, "<f"), np.dtype(np.bool_): (7, "<?")}[a.dtype]
    if a.ndim == 0:
        return struct.pack("<I", code) + struct.pack(fmt, a.item())
    return struct.pack("<IIQ", 9, code, a.size) + a.astype(fmt).tobytes()


def write(path, tensors: dict[str, tuple[np.ndarray, str]], meta: dict) -> dict[str, np.ndarray]:
    """Write ``name -> (array, kind)`` with ``meta``; returns each tensor as it dequantizes."""
    header = struct.pack("<4sIQQ", b"GGUF", 3, len(tensors), len(meta))
    header += b"".join(_string(k) + _value(v) for k, v in meta.items())
    infos, data, dequantized = b"", b"", {}
    for name, (w, kind) in tensors.items():
        if kind == "f32":
            raw, deq = w.astype(np.float32).tobytes(), w.astype(np.float32)
        else:
            raw, deq = quantize(w, kind)
        dequantized[name] = deq
        dims = w.shape[::-1]  # GGUF lists the innermost dimension first
        infos += _string(name) + struct.pack("<I", len(dims))
        infos += struct.pack(f"<{len(dims)}Q", *dims)
        infos += struct.pack("<IQ", GGML_TYPES[kind], len(data))
        data += raw + b"\0" * (-len(raw) % _ALIGN)
    head = header + infos
    with open(path, "wb") as f:
        f.write(head + b"\0" * (-len(head) % _ALIGN) + data)
    return dequantized


def float_meta(path) -> dict:
    """The metadata of a GGUF file, as :func:`write` takes it."""
    _, meta = mx.load(str(path), format="gguf", return_metadata=True)
    return {k: (np.array(v) if isinstance(v, mx.array) else v) for k, v in meta.items()}
