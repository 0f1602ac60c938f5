"""Hostile cache and session files, and the user's key: crafted files on disk, never mocks.

Each file here is what an attacker (or a stray process) can leave in a cache directory: a
header written by hand with struct and json, a FIFO, a file whose KV was edited and its
checksum recomputed, a file written with another key.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import resource
import struct
import subprocess
import sys
import time

import mlx.core as mx
import pytest

from mlx_agent import prompt_cache as pc
from mlx_agent import user_key
from mlx_agent.cache_file import CacheFile
from mlx_agent.models import load
from mlx_agent.models import tinygpt_format as fmt

from .conftest import random_tinygpt_file

PROMPT = list(range(40, 70))
KEY_HEX = "ab" * 32
META = {"format": "2", "kind": "prompt", "key": KEY_HEX, "model": "m", "tokens": "1",
        "created": "1700000000.000"}
IDS = {"dtype": "I32", "shape": [1], "data_offsets": [0, 4]}


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    path = tmp_path_factory.mktemp("m") / "tiny.tinygpt"
    fmt.write(path, random_tinygpt_file(seed=3))
    return load(path)


class Warnings(list):
    def __call__(self, message):
        self.append(message)


def write_raw(path, header, body=b"", declared=None):
    """A safetensors file by hand: ``header`` is JSON-encoded unless it is bytes already."""
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw) if declared is None else declared) + raw + body)


def read_raw(path):
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + n]), bytearray(data[8 + n :])


def recompute_sha256(header, body):
    """Format 1's checksum, as anyone who edits the file can recompute it."""
    h = hashlib.sha256()
    for name in sorted(k for k in header if k != "__metadata__"):
        start, stop = header[name]["data_offsets"]
        h.update(name.encode())
        h.update(body[start:stop])
    return h.hexdigest()


def tamper(path):
    """Zero layer 0's keys and recompute every checksum that needs no secret."""
    header, body = read_raw(path)
    start, stop = header["keys.0"]["data_offsets"]
    body[start:stop] = bytes(stop - start)
    if "sha256" in header["__metadata__"]:
        header["__metadata__"]["sha256"] = recompute_sha256(header, body)
    write_raw(path, header, bytes(body))


def as_format_1(path):
    """The same file as format 1 wrote it: a SHA-256 and no MAC."""
    header, body = read_raw(path)
    meta = header["__metadata__"]
    meta.pop("mac", None)
    meta["format"] = "1"
    meta["sha256"] = recompute_sha256(header, body)
    write_raw(path, header, bytes(body))


def prompt_path(lm, directory):
    return pc.file_for(directory, lm.identity, pc.cache_key(lm.identity, PROMPT, "preallocated"))


def saved(lm, directory, **kw):
    pc.PromptCache(directory, **kw).prime(lm.engine(), lm.identity, PROMPT)
    return prompt_path(lm, directory)


def refused_then_replaced(lm, directory, **kw):
    """The warnings of a launch that must not load the file, then prove it was replaced."""
    warn = Warnings()
    engine = lm.engine()
    hit = pc.PromptCache(directory, warn=warn, **kw).prime(engine, lm.identity, PROMPT)
    assert not hit.hit and engine.tokens == PROMPT
    assert pc.PromptCache(directory, **kw).prime(lm.engine(), lm.identity, PROMPT).hit
    return warn


# -- finding 7: authenticated files ------------------------------------------------------


def test_tampered_kv_with_a_recomputed_checksum_is_refused(lm, tmp_path):
    tamper(saved(lm, tmp_path))
    warn = refused_then_replaced(lm, tmp_path)
    assert len(warn) == 1 and "checksum does not match" in warn[0], warn


def test_a_file_written_without_the_mac_is_refused(lm, tmp_path):
    as_format_1(saved(lm, tmp_path))
    warn = refused_then_replaced(lm, tmp_path)
    assert len(warn) == 1 and "another version of mlx_agent (format 1" in warn[0], warn


def test_a_file_written_with_another_users_key_is_refused(lm, tmp_path):
    theirs, mine = tmp_path / "their.key", tmp_path / "my.key"
    saved(lm, tmp_path / "kv", key_file=theirs)
    warn = refused_then_replaced(lm, tmp_path / "kv", key_file=mine)
    assert len(warn) == 1 and "another user's key" in warn[0], warn
    assert user_key.load(theirs) != user_key.load(mine)


def test_sessions_are_authenticated_too(lm, tmp_path, monkeypatch):
    engine = lm.engine()
    engine.prefill(PROMPT)
    path = tmp_path / "s.safetensors"
    pc.save_session(path, lm.identity, engine, "json", {"ids": [1, 2]})
    assert pc.load_session(path, lm.identity)[2] == PROMPT
    tamper(path)
    with pytest.raises(ValueError, match="checksum does not match"):
        pc.load_session(path, lm.identity)
    pc.save_session(path, lm.identity, engine, "json", {"ids": [1, 2]})
    monkeypatch.setenv(user_key.ENV, str(tmp_path / "other.key"))
    with pytest.raises(ValueError, match="another user's key"):
        pc.load_session(path, lm.identity)


def test_a_session_saves_under_any_name_and_leaves_no_temporary_file(lm, tmp_path):
    # MLX appends ".safetensors" to a name without it: "chat.session" was left empty, the
    # session in a hidden temporary file beside it
    engine = lm.engine()
    engine.prefill(PROMPT)
    for name in ("chat.session", "chat", "chat.safetensors"):
        size = pc.save_session(tmp_path / name, lm.identity, engine, "json", {"ids": [1]})
        assert size == (tmp_path / name).stat().st_size > 0
        assert pc.load_session(tmp_path / name, lm.identity)[2] == PROMPT
    assert sorted(p.name for p in tmp_path.iterdir()) == \
        ["chat", "chat.safetensors", "chat.session"]


# -- the key file ------------------------------------------------------------------------


def test_the_key_is_made_once_0600_and_racing_creators_agree(tmp_path):
    path = tmp_path / "conf" / "mlx_agent" / "cache.key"
    code = "import sys; from mlx_agent import user_key; print(user_key.load(sys.argv[1]).hex())"
    procs = [subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE,
                              text=True) for _ in range(6)]
    keys = {p.communicate(timeout=60)[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs) and len(keys) == 1
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert user_key.load(path).hex() in keys
    assert os.listdir(path.parent) == ["cache.key"]  # no temporary files left


@pytest.mark.timeout(30)
@pytest.mark.parametrize("how", ["group-readable", "world-writable", "symlink", "fifo",
                                 "directory", "garbage"])
def test_an_unsafe_key_file_is_refused_and_nothing_loads(lm, tmp_path, how):
    good = tmp_path / "good.key"
    user_key.load(good)
    saved(lm, tmp_path / "kv", key_file=good)
    path = tmp_path / "bad.key"
    if how in ("group-readable", "world-writable"):
        path.write_bytes(good.read_bytes())
        path.chmod(0o640 if how == "group-readable" else 0o602)
    elif how == "symlink":
        path.symlink_to(good)
    elif how == "fifo":
        os.mkfifo(path, 0o600)
    elif how == "directory":
        path.mkdir(0o700)
    else:
        path.write_text("not a key")
        path.chmod(0o600)
    with pytest.raises(user_key.KeyFileError) as refused:
        user_key.load(path)
    hint = {"group-readable": "chmod 600", "world-writable": "chmod 600",
            "symlink": "symbolic link", "fifo": "not a regular file",
            "directory": "not a regular file", "garbage": "hex digits"}[how]
    assert hint in str(refused.value)
    warn = Warnings()
    cache = pc.PromptCache(tmp_path / "kv", warn=warn, key_file=path)
    for i in range(2):  # one warning, however many primes
        hit = cache.prime(lm.engine(), lm.identity, PROMPT + [i])
        assert not hit.hit and hit.bytes == 0
    assert cache.prime(lm.engine(), lm.identity, PROMPT).hit is False  # the good file: not read
    assert len(warn) == 1 and hint in warn[0] and "prompt cache is off" in warn[0]
    assert [e.key for e in pc.entries(tmp_path / "kv")] == [pc.cache_key(lm.identity, PROMPT,
                                                                          "preallocated")]


# -- finding 8: malformed files never crash, hang or load --------------------------------

MALFORMED = {
    "tokens-many": ({"__metadata__": {**META, "tokens": "many"}, "token_ids": IDS}, b"\0" * 4),
    "metadata-list": ({"__metadata__": ["format", "2"], "token_ids": IDS}, b"\0" * 4),
    "deep": (b'{"__metadata__":' + b"[" * 100_000 + b"]" * 100_000 + b"}", b""),
    "not-json": (b"\xff\xfe this is not JSON {", b""),
    "huge-length": (b"{}", b"", 1 << 62),
    "dtype-object": ({"__metadata__": META, "token_ids": {**IDS, "dtype": {"a": 1}}}, b"\0" * 4),
    "overlapping": ({"__metadata__": META, "token_ids": IDS,
                     "keys.0": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4),
    "short-data": ({"__metadata__": META, "token_ids": {**IDS, "shape": [1 << 28],
                                                          "data_offsets": [0, 1 << 30]}}, b"\0" * 4),
}


def plant(directory, name, spec):
    header, body, *declared = spec
    write_raw(directory / f"{name}.safetensors", header, body, *declared)


@pytest.mark.timeout(60)
def test_listing_pruning_and_removing_survive_every_malformed_file(lm, tmp_path):
    good = saved(lm, tmp_path)
    for name, spec in MALFORMED.items():
        plant(tmp_path, name, spec)
    os.mkfifo(tmp_path / "fifo.safetensors")
    (tmp_path / "link.safetensors").symlink_to(good)
    listed = {e.path.name: e for e in pc.entries(tmp_path)}
    assert len(listed) == len(MALFORMED) + 3
    assert not listed[good.name].problem and listed[good.name].tokens == len(PROMPT)
    bad = {name: e.problem for name, e in listed.items() if name != good.name}
    assert all(bad.values()), bad
    assert "prompt cache" in bad["tokens-many.safetensors"]
    assert "not a safetensors header" in bad["deep.safetensors"]
    assert "(a FIFO)" in bad["fifo.safetensors"]
    assert "(a symbolic link)" in bad["link.safetensors"]
    assert "the whole file holds" in bad["huge-length.safetensors"]
    assert pc.remove(tmp_path, KEY_HEX[:8]) == ([], 0)  # a malformed file is never "ours"
    gone = pc.prune(tmp_path, max_bytes=0)
    assert [e.path.name for e in gone] == [good.name]
    assert len(os.listdir(tmp_path)) == len(MALFORMED) + 2  # only the real cache went


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", [*MALFORMED, "fifo", "symlink", "directory"])
def test_a_malformed_file_at_the_prompts_path_is_a_warning_and_is_replaced(lm, tmp_path, name):
    path = prompt_path(lm, tmp_path / "kv")
    path.parent.mkdir()
    if name == "fifo":
        os.mkfifo(path)
    elif name == "symlink":
        path.symlink_to(saved(lm, tmp_path / "elsewhere"))
    elif name == "directory":
        path.mkdir()
    else:
        plant(path.parent, path.name.removesuffix(".safetensors"), MALFORMED[name])
    for other, spec in MALFORMED.items():  # pruning after the save reads them all
        plant(path.parent, other, spec)
    warn = Warnings()
    engine = lm.engine()
    hit = pc.PromptCache(path.parent, warn=warn, max_bytes=1 << 30).prime(engine, lm.identity,
                                                                           PROMPT)
    assert not hit.hit and engine.tokens == PROMPT
    if name == "directory":  # cannot be replaced by a rename: not used, and said so
        assert "cannot save" in warn[-1]
        return
    assert len(warn) == 1 and "not usable" in warn[0], warn
    assert pc.PromptCache(path.parent).prime(lm.engine(), lm.identity, PROMPT).hit


def _peak_rss_bytes() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def test_a_declared_2gib_tensor_is_refused_before_any_data_is_read(lm, tmp_path):
    path = saved(lm, tmp_path)
    header, body = read_raw(path)
    extra = 2 << 30
    header["extra"] = {"dtype": "F32", "shape": [extra // 4], "data_offsets": [len(body),
                                                                               len(body) + extra]}
    write_raw(path, header, bytes(body))
    with open(path, "r+b") as f:  # a sparse 2 GiB: the file really is as large as it says
        f.truncate(path.stat().st_size + extra)
    before, start = _peak_rss_bytes(), time.perf_counter()
    warn = Warnings()
    hit = pc.PromptCache(tmp_path, warn=warn).prime(lm.engine(), lm.identity, PROMPT)
    seconds, grown = time.perf_counter() - start, _peak_rss_bytes() - before
    assert seconds < 2 and grown < 256 << 20, (seconds, grown)
    assert not hit.hit and "unexpected tensor 'extra'" in warn[0], warn


def test_a_shape_that_differs_from_the_model_is_refused_from_the_header(lm, tmp_path):
    path = saved(lm, tmp_path)
    header, body = read_raw(path)
    _, heads, n, dim = header["keys.1"]["shape"]
    header["keys.1"]["shape"] = [1, 1, heads * n, dim]  # the same bytes, another shape
    write_raw(path, header, bytes(body))
    warn = refused_then_replaced(lm, tmp_path)
    assert "its keys.1 is [1, 1, " in warn[0] and "the model needs" in warn[0], warn


def test_a_kv_dtype_other_than_this_runs_says_which_and_why():
    """A file written with a float32 KV cache, read by a run that keeps float16 (the CPU
    kernels' default since files may be float16): the message names both and the cause."""
    from mlx_agent.cache_file import Layout, Tensor

    tensors = {"token_ids": Tensor("I32", (3,), (0, 12))}
    for i in range(2):
        for kind in ("keys", "values"):
            tensors[f"{kind}.{i}"] = Tensor("F32", (1, 1, 3, 4), (0, 48))
    with pytest.raises(ValueError, match=r"its KV state is F32, this run keeps F16 \(the "
                                         r"weight format or \$MLX_AGENT_KV_DTYPE differ"):
        Layout(2, 1, 4, "float16").check(tensors)
    Layout(2, 1, 4, "float32").check(tensors)  # the same settings: accepted


def test_a_path_under_a_symlink_loop_is_not_called_a_symbolic_link(tmp_path):
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    with pytest.raises(ValueError, match="it is a symbolic link, not a regular file"):
        CacheFile(tmp_path / "loop")  # the file itself is the link
    with pytest.raises(OSError) as err:  # a folder on the way loops: the system's own words
        CacheFile(tmp_path / "loop" / "x.safetensors")
    assert err.value.errno == errno.ELOOP
