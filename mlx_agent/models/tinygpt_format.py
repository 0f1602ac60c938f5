"""The ``.tinygpt`` file format (version 2) of the original ``posttrainllm``: read and write.

Layout (little-endian): ``TGPT`` magic, u32 version (2), u32 header length H, H bytes of
UTF-8 JSON header, i32 training step, body. The body is one of:

- ``training`` (``weightDtype`` absent or ``fp32``): per manifest entry, the weight, then
  Adam m, then Adam v, each float32;
- ``inference`` (``weightDtype: "fp16"``, or ``includesOptimizerState: false``): one float16
  buffer, entry i starting at ``floatOffset * 2`` bytes;
- ``int4`` (``weightDtype: "int4"``, ``int4BlockSize`` default 64): every entry's float16
  block scales in manifest order, then every entry's nibbles (low nibble first, each entry
  padded to whole blocks), value = (nibble - 8) * scale.

Quirk kept for interoperability: the manifest gives PyTorch ``[out, in]`` shapes, but the
bytes of each 2-D Linear weight are stored ``[in, out]``. :func:`read` returns ``[out, in]``
arrays; :func:`write` transposes back. The original's ``embed_norm.weight`` (listed after
``position_embedding.weight``) is in the manifest exactly when the config says
``useEmbeddingRMSNorm``; :func:`write` says so whenever the weights hold that tensor. Our
extension:
``sentencepieceModel`` in the header, a base64 SentencePiece model proto, which the original
reader ignores.

Arrays are NumPy (float32, or float16 for the inference layout); the model module turns
them into MLX. Every malformed file raises :class:`TinyGPTError` with one line saying what is
wrong. Writes are atomic (temporary file, fsync, rename).
"""

from __future__ import annotations

import base64
import json
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..fileio import write_bytes

MAGIC = b"TGPT"
VERSION = 2
LAYOUTS = ("training", "inference", "int4")
SENTENCEPIECE_KEY = "sentencepieceModel"
DEFAULT_INT4_BLOCK = 64
# The JSON header: a config, a manifest and at most an embedded SentencePiece model (a few
# MB in base64). A claimed length is checked against this before it is read.
MAX_HEADER_BYTES = 64 << 20


class TinyGPTError(ValueError):
    """A ``.tinygpt`` file that cannot be read as described."""


@dataclass
class TinyGPTFile:
    config: dict  # the header's "config": layers, dModel, ctx, heads, dMlp, vocabSize, ...
    weights: dict[str, np.ndarray]  # name -> array in PyTorch [out, in] shape, manifest order
    layout: str = "inference"
    step: int = 0
    adam: dict[str, tuple[np.ndarray, np.ndarray]] | None = None  # training layout only
    sentencepiece: bytes | None = None
    header: dict = field(default_factory=dict)  # everything else in the header, kept as read
    int4_block: int = DEFAULT_INT4_BLOCK


def is_linear_weight(name: str, shape) -> bool:
    """2-D weights other than the embeddings are Linear layers, stored transposed."""
    return len(shape) == 2 and "embedding" not in name


EMBED_NORM = "embed_norm.weight"
EMBED_NORM_FLAG = "useEmbeddingRMSNorm"


# what a header's config may say: a file claiming 10^8 layers built its manifest until the
# memory ran out, and Infinity or -1 were tracebacks
_CONFIG_LIMITS = {"layers": 4096, "dModel": 1 << 16, "ctx": 1 << 20, "heads": 1024,
                  "dMlp": 1 << 18, "vocabSize": 1 << 22}


def expected_manifest(config: dict) -> list[tuple[str, tuple[int, ...]]]:
    """Entry names and shapes for a GPT-2 style model with this config, in file order."""
    for key in ("layers", "dModel", "ctx"):
        if key not in config:
            raise TinyGPTError(f"header config lacks {key!r} (needs layers, dModel, ctx)")
    for key, most in _CONFIG_LIMITS.items():
        value = config.get(key)
        if value is not None and not (type(value) is int and 1 <= value <= most):
            raise TinyGPTError(f"header config {key} is {json.dumps(value)[:40]}, not a whole "
                               f"number from 1 to {most:,}")
    L, C, ctx = config["layers"], config["dModel"], config["ctx"]
    V = config.get("vocabSize") or 256
    M = config.get("dMlp") or 4 * C
    out = [("token_embedding.weight", (V, C)), ("position_embedding.weight", (ctx, C))]
    if config.get(EMBED_NORM_FLAG):  # the original's model has it only then
        out.append((EMBED_NORM, (C,)))
    out += [("ln_final.weight", (C,)), ("ln_final.bias", (C,))]
    for i in range(L):
        b = f"blocks.{i}."
        out += [(b + "ln1.weight", (C,)), (b + "ln1.bias", (C,))]
        for p in "qkvo":
            out += [(f"{b}attn.{p}_proj.weight", (C, C)), (f"{b}attn.{p}_proj.bias", (C,))]
        out += [(b + "ln2.weight", (C,)), (b + "ln2.bias", (C,))]
        out += [(b + "mlp.fc_in.weight", (M, C)), (b + "mlp.fc_in.bias", (M,))]
        out += [(b + "mlp.fc_out.weight", (C, M)), (b + "mlp.fc_out.bias", (C,))]
    return out


def _layout_of(header: dict) -> str:
    dtype = header.get("weightDtype")
    if dtype not in (None, "fp32", "fp16", "int4"):
        raise TinyGPTError(f"unsupported weightDtype {dtype!r} (expected fp32, fp16 or int4)")
    if dtype == "int4":
        return "int4"
    if dtype == "fp16" or header.get("includesOptimizerState") is False:
        return "inference"
    return "training"


def _parse_manifest(header: dict) -> list[dict]:
    manifest = header.get("manifest")
    if not isinstance(manifest, list) or not manifest:
        raise TinyGPTError("header has no manifest (version 2 files list their tensors)")
    for e in manifest:
        if not (isinstance(e, dict) and isinstance(e.get("name"), str)
                and isinstance(e.get("shape"), list)
                and all(isinstance(d, int) and d > 0 for d in e["shape"])):
            raise TinyGPTError(f"malformed manifest entry: {json.dumps(e)[:120]}")
    return manifest


def _check_manifest(manifest: list[dict], config: dict) -> None:
    """The manifest must name the architecture's tensors."""
    have = {e["name"]: tuple(e["shape"]) for e in manifest}
    if len(have) != len(manifest):
        raise TinyGPTError("manifest names a tensor twice")
    layers = config.get("layers")
    if type(layers) is int and layers > len(manifest):  # before listing what they need
        raise TinyGPTError(f"config says {layers} layers, and the manifest lists only "
                           f"{len(manifest)} tensors")
    want = dict(expected_manifest(config))
    for name, shape in want.items():
        if name not in have:
            raise TinyGPTError(f"manifest lacks {name} that config {config} requires")
        if name in have and have[name] != shape:
            raise TinyGPTError(
                f"manifest shape {list(have[name])} for {name} disagrees with config"
                f" (expected {list(shape)})"
            )
    extra = sorted(set(have) - set(want))
    if EMBED_NORM in extra:  # the original's model would leave it out, unread
        raise TinyGPTError(f"manifest has {EMBED_NORM} but config does not say "
                           f"{EMBED_NORM_FLAG}: true")
    if extra:
        raise TinyGPTError(f"manifest has tensors this architecture lacks: {', '.join(extra[:3])}")


def _from_stored(name: str, flat: np.ndarray, shape) -> np.ndarray:
    if is_linear_weight(name, shape):
        out_dim, in_dim = shape
        return np.ascontiguousarray(flat.reshape(in_dim, out_dim).T)
    return flat.reshape(shape)


def _to_stored(name: str, arr: np.ndarray) -> np.ndarray:
    if is_linear_weight(name, arr.shape):
        return np.ascontiguousarray(arr.T).reshape(-1)
    return np.ascontiguousarray(arr).reshape(-1)


def read(path: str | os.PathLike) -> TinyGPTFile:
    path = Path(path)
    try:
        with path.open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            data = f.read(12)
            if len(data) == 12:  # the header and the step, as far as the file holds them
                hlen = struct.unpack_from("<I", data, 8)[0]
                if hlen > MAX_HEADER_BYTES:  # before it is read: a sparse file can hold it
                    raise TinyGPTError(f"{path}: header length {hlen:,} is over the "
                                       f"{MAX_HEADER_BYTES:,}-byte limit; not a .tinygpt file?")
                data += f.read(min(hlen + 4, size))
            header, hlen = _read_header(path, data, size)
            config, layout = header["config"], _layout_of(header)
            manifest = _parse_manifest(header)
            _check_manifest(manifest, config)
            sizes = [int(np.prod(e["shape"])) for e in manifest]
            # before the body is read: a sparse file of gigabytes was read whole first
            _check_body(path, size - 16 - hlen, layout, header, sizes)
            data += f.read(size - len(data))  # what was checked, even if the file grows
    except OSError as e:
        raise TinyGPTError(f"cannot read {path}: {e.strerror}") from None
    if len(data) != size:
        raise TinyGPTError(f"{path} was cut short while it was read; read it again")
    (step,) = struct.unpack_from("<i", data, 12 + hlen)
    body = _Body(path, memoryview(data)[16 + hlen :], manifest)
    block = _int4_block(path, header)
    adam = None
    if layout == "training":
        weights, adam = body.training()
    elif layout == "inference":
        weights = body.inference(header.get("weightDtype"))
    else:
        weights = body.int4(block)
    spm = header.get(SENTENCEPIECE_KEY)
    if spm is not None:
        try:
            spm = base64.b64decode(spm, validate=True)
        except (ValueError, TypeError):
            raise TinyGPTError(f"{path}: {SENTENCEPIECE_KEY} is not valid base64") from None
        if not spm:  # "" decodes to no bytes, and SentencePiece failed later, uninitialized
            raise TinyGPTError(f"{path}: {SENTENCEPIECE_KEY} is empty (leave it out, or embed "
                               "a SentencePiece model)")
    rest = {k: v for k, v in header.items() if k not in ("config", "manifest", SENTENCEPIECE_KEY)}
    return TinyGPTFile(config=config, weights=weights, layout=layout, step=step, adam=adam,
                       sentencepiece=spm, header=rest, int4_block=block)


def _int4_block(path: Path, header: dict) -> int:
    block = header.get("int4BlockSize")  # absent or null: the default; 0 is refused later
    block = DEFAULT_INT4_BLOCK if block is None else block
    if type(block) is not int:  # Infinity or a list were tracebacks, even in an fp32 file
        raise TinyGPTError(f"{path}: int4BlockSize {json.dumps(block)[:40]} is not a whole "
                           "number")
    return block


def _read_header(path: Path, data: bytes, size: int) -> tuple[dict, int]:
    """The JSON header (with a config object) and its length, checked against the file's
    ``size``; ``data`` is the file's start, the header and step included where it has them."""
    if size < 12:
        raise TinyGPTError(f"{path} is truncated ({size} bytes, no header)")
    if data[:4] != MAGIC:
        raise TinyGPTError(f"{path} is not a .tinygpt file (magic {data[:4]!r}, expected b'TGPT')")
    version, hlen = struct.unpack_from("<II", data, 4)
    if version != VERSION:
        raise TinyGPTError(f"{path}: .tinygpt version {version} is not supported (only 2)")
    if 12 + hlen + 4 > min(size, len(data)):
        raise TinyGPTError(
            f"{path}: header length {hlen} runs past the end of the {size}-byte file"
        )
    try:
        header = json.loads(data[12 : 12 + hlen].decode("utf-8"))
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError, JSONDecodeError, int()
        raise TinyGPTError(f"{path}: header is not valid JSON ({e})") from None
    if not isinstance(header, dict) or not isinstance(header.get("config"), dict):
        raise TinyGPTError(f"{path}: header has no config object")
    if isinstance(header.get("weightDtype"), str):  # the original reads "FP16" as "fp16"
        header["weightDtype"] = header["weightDtype"].lower()
    return header, hlen


def _check_body(path: Path, length: int, layout: str, header: dict, sizes: list[int]) -> None:
    """Raises unless a body of ``length`` bytes is what ``layout`` needs for tensors of
    ``sizes`` elements."""
    total = sum(sizes)
    if layout == "training":
        need, what = 12 * total, "fp32 weights with Adam state"
    elif layout == "inference":
        itemsize = _float_size(header.get("weightDtype"), length, total)
        need, what = itemsize * total, f"fp{8 * itemsize} weights"
    else:
        block = _int4_block(path, header)
        if block <= 0 or block % 2:
            raise TinyGPTError(f"{path}: int4BlockSize {block} must be a positive even number")
        blocks = sum(-(-n // block) for n in sizes)
        need, what = 2 * blocks + blocks * block // 2, "int4 scales and nibbles"
    if length != need:
        raise TinyGPTError(f"{path}: body is {length} bytes but the manifest's {what} needs "
                           f"{need}" + (" (truncated file?)" if length < need else ""))


def _float_size(weight_dtype: str | None, length: int, total: int) -> int:
    """Bytes per weight of an inference body: fp16, except that ``includesOptimizerState:
    false`` without ``weightDtype`` may hold fp32 weights (the body's length says)."""
    return 4 if weight_dtype != "fp16" and length == 4 * total else 2


class _Body:
    """The weights after the header, in one of the three layouts."""

    def __init__(self, path: Path, body: memoryview, manifest: list[dict]):
        self.path, self.body, self.manifest = path, body, manifest
        self.sizes = [int(np.prod(e["shape"])) for e in manifest]

    # the layouts' readers, after _check_body()

    def training(self) -> tuple[dict, dict]:
        weights, adam, off = {}, {}, 0
        for e, n in zip(self.manifest, self.sizes):
            parts = [np.frombuffer(self.body, "<f4", n, off + 4 * n * k) for k in range(3)]
            weights[e["name"]] = _from_stored(e["name"], parts[0], e["shape"])
            adam[e["name"]] = tuple(_from_stored(e["name"], p, e["shape"]) for p in parts[1:])
            off += 12 * n
        return weights, adam

    def inference(self, weight_dtype: str | None) -> dict:
        total = sum(self.sizes)
        itemsize = _float_size(weight_dtype, len(self.body), total)
        dtype = "<f2" if itemsize == 2 else "<f4"
        weights, off = {}, 0
        for e, n in zip(self.manifest, self.sizes):
            start = e.get("floatOffset", off)
            if type(start) is not int or start < 0 or start + n > total:
                raise TinyGPTError(f"{self.path}: floatOffset of {e['name']} is past the body")
            flat = np.frombuffer(self.body, dtype, n, itemsize * start)
            weights[e["name"]] = _from_stored(e["name"], flat, e["shape"])
            off = start + n
        return weights

    def int4(self, block: int) -> dict:
        blocks = [-(-n // block) for n in self.sizes]
        scales = np.frombuffer(self.body, "<f2", sum(blocks), 0).astype(np.float32)
        packed = np.frombuffer(self.body, np.uint8, offset=2 * sum(blocks))
        nib = np.empty(packed.size * 2, np.uint8)
        nib[0::2], nib[1::2] = packed & 0xF, packed >> 4
        weights, s_off, q_off = {}, 0, 0
        for e, n, nb in zip(self.manifest, self.sizes, blocks):
            q = nib[q_off : q_off + nb * block].astype(np.float32) - 8.0
            vals = (q.reshape(nb, block) * scales[s_off : s_off + nb, None]).reshape(-1)[:n]
            weights[e["name"]] = _from_stored(e["name"], vals, e["shape"])
            s_off += nb
            q_off += nb * block
        return weights


def _quantize_int4(flat: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric block-wise int4: scale = absmax / 7 (as fp16), q in [-7, 7]."""
    nb = -(-flat.size // block)
    padded = np.zeros(nb * block, np.float32)
    padded[: flat.size] = flat
    blocks = padded.reshape(nb, block)
    scales = (np.abs(blocks).max(axis=1) / 7).astype(np.float16)
    s = scales.astype(np.float32)[:, None]
    q = np.where(s > 0, np.rint(blocks / np.where(s > 0, s, 1)), 0).clip(-7, 7)
    nib = (q + 8).astype(np.uint8).reshape(-1)
    nib[flat.size :] = 0  # padding nibbles are zero, as the original writes them
    return scales, (nib[0::2] | (nib[1::2] << 4)).astype(np.uint8)


def encode(f: TinyGPTFile) -> bytes:
    """The bytes of ``f`` in its layout."""
    if f.layout not in LAYOUTS:
        raise TinyGPTError(f"unknown layout {f.layout!r}; choose one of {', '.join(LAYOUTS)}")
    config = dict(f.config)
    if EMBED_NORM in f.weights:  # the original's reader builds the norm only when told
        config[EMBED_NORM_FLAG] = True
    names = [n for n, _ in expected_manifest(config)]
    missing = [n for n in names if n not in f.weights]
    if missing:
        raise TinyGPTError(f"cannot write: missing tensor {missing[0]}")
    header = dict(f.header)
    header.pop("weightDtype", None)
    header.pop("includesOptimizerState", None)
    header.pop("int4BlockSize", None)
    manifest, chunks = [], []
    offset = 0
    stored = {n: _to_stored(n, np.asarray(f.weights[n])) for n in names}
    for n in names:
        entry = {"name": n, "shape": list(np.shape(f.weights[n]))}
        if f.layout == "inference":
            entry["floatOffset"] = offset
        offset += stored[n].size
        manifest.append(entry)
    if f.layout == "training":
        header["weightDtype"] = "fp32"
        header["includesOptimizerState"] = True
        for n in names:
            m, v = (f.adam or {}).get(n, (np.zeros_like(f.weights[n]),) * 2)
            for a in (stored[n], _to_stored(n, np.asarray(m)), _to_stored(n, np.asarray(v))):
                chunks.append(a.astype("<f4").tobytes())
    elif f.layout == "inference":
        header["weightDtype"] = "fp16"
        header["includesOptimizerState"] = False
        chunks = [stored[n].astype("<f2").tobytes() for n in names]
    else:
        header["weightDtype"] = "int4"
        header["includesOptimizerState"] = False
        header["int4BlockSize"] = f.int4_block
        q = [_quantize_int4(stored[n].astype(np.float32), f.int4_block) for n in names]
        chunks = [s.astype("<f2").tobytes() for s, _ in q] + [p.tobytes() for _, p in q]
    header = {"config": config, "manifest": manifest, **header}
    if f.sentencepiece is not None:
        header[SENTENCEPIECE_KEY] = base64.b64encode(f.sentencepiece).decode("ascii")
    hbytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
    return b"".join([MAGIC, struct.pack("<II", VERSION, len(hbytes)), hbytes,
                     struct.pack("<i", f.step), *chunks])


def write(path: str | os.PathLike, f: TinyGPTFile) -> None:
    """Write ``f`` atomically: a temporary file in the same directory, fsync, rename."""
    path = Path(path)
    write_bytes(path, encode(f))
