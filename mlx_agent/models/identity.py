"""Who a loaded model is: the fields a cache key needs to tell two models apart.

A file fingerprint is size, mtime and a SHA-256 of the first and last MiB: cheap on a
multi-GB file, and any rewrite that changes size, mtime or either end changes it. It is not
a content hash of the middle of the file; a cache keyed on it also keys on the prompt's
token ids and the vocabulary hash.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import msgspec

_MIB = 1 << 20


class ModelIdentity(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    format: str  # gguf | hf | tinygpt
    fingerprint: str
    adapter_fingerprint: str = ""
    vocab_hash: str
    num_layers: int
    kv_dtype: str
    kv_heads: int
    head_dim: int
    weight_format: str  # quantized | float32 | float16 | as-stored


def file_fingerprint(path: str | os.PathLike) -> str:
    path = Path(path)
    st = path.stat()
    h = hashlib.sha256()
    with path.open("rb") as f:
        h.update(f.read(_MIB))
        if st.st_size > _MIB:
            f.seek(max(_MIB, st.st_size - _MIB))
            h.update(f.read(_MIB))
    return f"{st.st_size}:{st.st_mtime_ns}:{h.hexdigest()[:16]}"


def dir_fingerprint(path: str | os.PathLike, patterns=("*.safetensors", "*.json")) -> str:
    """Fingerprints of a directory's weight and config files, combined."""
    path = Path(path)
    files = sorted({p for pat in patterns for p in path.glob(pat) if p.is_file()})
    h = hashlib.sha256()
    for p in files:
        h.update(f"{p.name}={file_fingerprint(p)};".encode())
    return f"dir:{len(files)}:{h.hexdigest()[:16]}"
