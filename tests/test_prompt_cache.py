"""Persistent prompt caches: exact round trips, keys that never collide, and damage handling."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import mlx.core as mx
import msgspec
import numpy as np
import pytest

from mlx_agent import prompt_cache as pc
from mlx_agent.models import load
from mlx_agent.models import tinygpt_format as fmt

from .conftest import TINY_GPT_CONFIG, random_tinygpt_file

PROMPT = list(range(40, 70))
SUFFIX = [5, 6, 7, 8]


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    path = tmp_path_factory.mktemp("m") / "tiny.tinygpt"
    fmt.write(path, random_tinygpt_file(seed=3))
    return load(path)


@pytest.fixture(scope="module")
def lm32(tmp_path_factory):
    """A tiny model whose heads are 32 wide: the narrowest int8 storage takes."""
    path = tmp_path_factory.mktemp("m32") / "tiny32.tinygpt"
    fmt.write(path, random_tinygpt_file({**TINY_GPT_CONFIG, "dModel": 64, "heads": 2}, seed=4))
    return load(path)


class Warnings(list):
    def __call__(self, message):
        self.append(message)


def loaded_vs_fresh(lm, directory, mode="preallocated", prompt=PROMPT, **kw):
    """(relative logit drift of a cache loaded from disk against a fresh prefill, the file's
    bytes), after ``prompt`` and a suffix."""
    warn = Warnings()
    first = pc.PromptCache(directory, warn=warn, **kw).prime(
        lm.engine(cache_mode=mode, kv_window=60), lm.identity, prompt)
    assert not first.hit and first.tokens == len(prompt) and first.bytes > 0
    engine = lm.engine(cache_mode=mode, kv_window=60)
    second = pc.PromptCache(directory, warn=warn, **kw).prime(engine, lm.identity, prompt)
    assert second.hit and second.key == first.key and warn == []
    assert engine.cache[0].keys.dtype == getattr(mx, lm.identity.kv_dtype)
    stats = engine.sync(prompt + SUFFIX)
    assert (stats.reused, stats.prefilled) == (len(prompt), len(SUFFIX))
    fresh = lm.engine(cache_mode=mode, kv_window=60)
    fresh.prefill(prompt + SUFFIX)
    got, want = np.array(engine.logits), np.array(fresh.logits)
    return float(np.abs(got - want).max() / np.abs(want).max()), second.bytes


@pytest.mark.parametrize("mode", ["preallocated", "growing", "rotating"])
def test_loaded_float32_cache_gives_the_logits_of_a_fresh_prefill(lm, tmp_path, mode):
    drift, _ = loaded_vs_fresh(lm, tmp_path, mode, storage="float32")
    assert drift < 1e-6


@pytest.mark.parametrize("mode", ["preallocated", "growing", "rotating"])
def test_float16_files_take_half_the_bytes_and_drift_less_than_1e_3(lm, tmp_path, mode):
    assert lm.identity.kv_dtype == "float32"
    drift32, bytes32 = loaded_vs_fresh(lm, tmp_path / "32", mode, storage="float32")
    drift16, bytes16 = loaded_vs_fresh(lm, tmp_path / "16", mode)  # the default
    assert bytes16 <= bytes32 / 2 + 4096  # the header is the same size
    assert 0 < drift16 < 1e-3


@pytest.mark.parametrize("mode", ["preallocated", "growing", "rotating"])
def test_int8_files_take_about_half_of_float16s_bytes_and_drift_less_than_1e_2(lm32, tmp_path,
                                                                               mode):
    drift16, bytes16 = loaded_vs_fresh(lm32, tmp_path / "16", mode)
    drift8, bytes8 = loaded_vs_fresh(lm32, tmp_path / "8", mode, storage="int8")
    assert 0 < drift16 < drift8 < 1e-2
    (f16,), (f8,) = ((tmp_path / d).glob("*.safetensors") for d in ("16", "8"))
    with pc.CacheFile(f16) as a, pc.CacheFile(f8) as b:
        assert b.tensors["keys.0"].dtype == "U32" and b.tensors["keys.0.scales"].dtype == "F16"
        data16, data8 = (sum(t.nbytes() for n, t in f.tensors.items() if n != "token_ids")
                         for f in (a, b))
        assert data8 == data16 // 2 * 9 // 8  # a byte a value, 4 bytes per group of 32


def test_an_int8_file_is_checked_like_any_other(lm, lm32, tmp_path):
    """Its layout is checked before its data: a scales tensor of the wrong shape is refused
    with a warning, and the file is rebuilt. Heads int8 cannot take: a warning, no file."""
    warn = Warnings()
    hit = pc.PromptCache(tmp_path, warn=warn, storage="int8").prime(lm.engine(), lm.identity,
                                                                   PROMPT)
    assert not hit.hit and hit.bytes == 0 and "head size of 8" in warn[0]
    assert not list(tmp_path.glob("*"))
    lm = lm32
    pc.PromptCache(tmp_path, storage="int8").prime(lm.engine(), lm.identity, PROMPT)
    (path,) = tmp_path.glob("*.safetensors")
    with pc.CacheFile(path) as f:
        meta = dict(f.metadata)
    arrays = mx.load(str(path))
    scales = arrays["keys.0.scales"]
    arrays["keys.0.scales"] = mx.concatenate([scales, scales], axis=-1)  # groups of 16
    mx.save_safetensors(str(path), arrays, meta)
    warn = Warnings()
    hit = pc.PromptCache(tmp_path, warn=warn, storage="int8").prime(lm.engine(), lm.identity,
                                                                   PROMPT)
    assert not hit.hit and "keys.0.scales" in warn[0] and "rebuilding" in warn[0]
    again = pc.PromptCache(tmp_path, storage="int8").prime(lm.engine(), lm.identity, PROMPT)
    assert again.hit


@pytest.mark.real_model
def test_real_model_int8_files_drift_less_than_1e_2(tmp_path, monkeypatch):
    monkeypatch.setenv("MLX_AGENT_KV_DTYPE", "float32")
    real = load("smollm2-135m")
    prompt = real.prompt_ids("You are a careful assistant with tools. " * 30)
    drift, _ = loaded_vs_fresh(real, tmp_path, prompt=prompt, storage="int8")
    assert 0 < drift < 1e-2


@pytest.mark.real_model
def test_real_model_float16_files_drift_less_than_1e_3(tmp_path, monkeypatch):
    monkeypatch.setenv("MLX_AGENT_KV_DTYPE", "float32")  # a float32 cache, stored in float16
    real = load("smollm2-135m")
    prompt = real.prompt_ids("You are a careful assistant with tools. " * 30)
    drift, size = loaded_vs_fresh(real, tmp_path, prompt=prompt)
    assert 0 < drift < 1e-3
    layers, heads, dim = real.identity.num_layers, real.identity.kv_heads, real.identity.head_dim
    assert size < 2 * 2 * layers * heads * dim * len(prompt) * 1.01  # float16 keys and values


def test_a_file_of_another_storage_dtype_is_missed_cleanly(lm, tmp_path):
    """Changing the storage dtype (or reading files from before it was in the key) finds no
    file: a plain miss, no warning, and the new file is written beside the old one."""
    pc.PromptCache(tmp_path, storage="float32").prime(lm.engine(), lm.identity, PROMPT)
    warn = Warnings()
    hit = pc.PromptCache(tmp_path, warn=warn).prime(lm.engine(), lm.identity, PROMPT)
    assert not hit.hit and warn == [] and len(list(tmp_path.glob("*.safetensors"))) == 2
    with pytest.raises(ValueError, match="unknown storage dtype 'int4'"):
        pc.PromptCache(tmp_path, storage="int4")


def test_preallocated_load_fills_the_preallocated_buffers(lm, tmp_path):
    pc.PromptCache(tmp_path).prime(lm.engine(), lm.identity, PROMPT)
    engine = lm.engine()
    assert pc.PromptCache(tmp_path).prime(engine, lm.identity, PROMPT).hit
    assert all(c.keys.shape[2] == lm.context_length for c in engine.cache)


def test_one_cache_serves_many_tasks_in_a_process(lm, tmp_path):
    cache = pc.PromptCache(tmp_path)
    assert not cache.prime(lm.engine(), lm.identity, PROMPT).hit
    for _ in range(3):
        (tmp_path / next(iter(os.listdir(tmp_path)))).unlink()  # even the file gone: memory
        engine = lm.engine()
        assert cache.prime(engine, lm.identity, PROMPT).hit
        engine.sync(PROMPT + SUFFIX)
        pc.PromptCache(tmp_path).prime(lm.engine(), lm.identity, PROMPT)  # re-create the file


def test_any_change_is_a_different_key(lm):
    base = pc.cache_key(lm.identity, PROMPT, "preallocated")
    replace = msgspec.structs.replace
    variants = [
        pc.cache_key(replace(lm.identity, name="other"), PROMPT, "preallocated"),
        pc.cache_key(replace(lm.identity, fingerprint="1:2:3"), PROMPT, "preallocated"),
        pc.cache_key(replace(lm.identity, adapter_fingerprint="dir:1:ab"), PROMPT, "preallocated"),
        pc.cache_key(replace(lm.identity, vocab_hash="0" * 16), PROMPT, "preallocated"),
        pc.cache_key(replace(lm.identity, kv_dtype="float16"), PROMPT, "preallocated"),
        pc.cache_key(lm.identity, PROMPT[:-1], "preallocated"),
        pc.cache_key(lm.identity, PROMPT[:-1] + [0], "preallocated"),
        pc.cache_key(lm.identity, PROMPT, "rotating"),
        pc.cache_key(lm.identity, PROMPT, "preallocated", storage="float32"),
    ]
    assert len(set(variants + [base])) == len(variants) + 1


def test_a_file_for_another_key_is_never_used(lm, tmp_path):
    other = PROMPT[:-1] + [1]
    pc.PromptCache(tmp_path).prime(lm.engine(), lm.identity, other)
    (src,) = tmp_path.glob("*.safetensors")
    wanted = pc.file_for(tmp_path, lm.identity, pc.cache_key(lm.identity, PROMPT, "preallocated"))
    os.rename(src, wanted)  # the right name, the wrong contents
    warn = Warnings()
    engine = lm.engine()
    hit = pc.PromptCache(tmp_path, warn=warn).prime(engine, lm.identity, PROMPT)
    assert not hit.hit and "not usable" in warn[0]
    assert engine.tokens == PROMPT
    assert pc.PromptCache(tmp_path).prime(lm.engine(), lm.identity, PROMPT).hit  # replaced


def _damage(path, how):
    data = bytearray(path.read_bytes())
    if how == "truncated":
        path.write_bytes(bytes(data[: len(data) // 2]))
    elif how == "flipped":
        data[-100] ^= 0xFF
        path.write_bytes(bytes(data))
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "not safetensors":
        path.write_text("hello, I am not a cache")
    elif how == "wrong metadata":
        n = int.from_bytes(data[:8], "little")
        header = data[8 : 8 + n].replace(b'"tokens":"30"', b'"tokens":"31"').replace(
            b'"format":"2"', b'"format":"9"')
        path.write_bytes(bytes(data[:8]) + bytes(header) + bytes(data[8 + n :]))


@pytest.mark.parametrize("how", ["truncated", "flipped", "empty", "not safetensors", "wrong metadata"])
def test_damaged_files_warn_rebuild_and_are_replaced(lm, tmp_path, how):
    pc.PromptCache(tmp_path).prime(lm.engine(), lm.identity, PROMPT)
    (path,) = tmp_path.glob("*.safetensors")
    _damage(path, how)
    warn = Warnings()
    engine = lm.engine()
    hit = pc.PromptCache(tmp_path, warn=warn).prime(engine, lm.identity, PROMPT)
    assert not hit.hit and len(warn) == 1 and "rebuilding" in warn[0]
    fresh = lm.engine()
    fresh.prefill(PROMPT)
    engine.sync(PROMPT + SUFFIX)
    fresh.sync(PROMPT + SUFFIX)
    np.testing.assert_allclose(np.array(engine.logits), np.array(fresh.logits), atol=1e-5)
    assert pc.PromptCache(tmp_path, warn=warn).prime(lm.engine(), lm.identity, PROMPT).hit


def test_unwritable_directory_is_a_warning(lm, tmp_path):
    target = tmp_path / "ro"
    target.mkdir()
    target.chmod(0o500)
    try:
        if os.access(target / "x", os.W_OK) or os.geteuid() == 0:
            target = tmp_path / "file-not-dir"
            target.write_text("x")
            target = target / "sub"  # a path under a regular file cannot be created
        warn = Warnings()
        engine = lm.engine()
        hit = pc.PromptCache(target, warn=warn).prime(engine, lm.identity, PROMPT)
        assert not hit.hit and hit.bytes == 0 and "cannot save" in warn[0]
        assert engine.tokens == PROMPT
    finally:
        (tmp_path / "ro").chmod(0o700)


SAVER = """
import sys, mlx_agent
from mlx_agent import prompt_cache as pc, user_key
from mlx_agent.models import load
lm = load(sys.argv[1])
for _ in range(int(sys.argv[3])):
    pc.PromptCache(sys.argv[2])._save(
        pc.file_for(__import__("pathlib").Path(sys.argv[2]), lm.identity,
                    pc.cache_key(lm.identity, list(range(40, 70)), "preallocated")),
        lm.identity, pc.cache_key(lm.identity, list(range(40, 70)), "preallocated"),
        list(range(40, 70)), (lambda e: (e.prefill(list(range(40, 70))), e.snapshot()[1])[1])(lm.engine()),
        "preallocated", user_key.load())
print("ok")
"""


def test_concurrent_writers_and_a_killed_writer_leave_a_valid_file(lm, tmp_path):
    args = [sys.executable, "-c", SAVER, str(lm.path), str(tmp_path)]
    procs = [subprocess.Popen(args + ["5"], stdout=subprocess.PIPE) for _ in range(2)]
    assert all(p.wait(timeout=120) == 0 for p in procs)
    killed = subprocess.Popen(args + ["1000"])
    time.sleep(4)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    warn = Warnings()
    engine = lm.engine()
    hit = pc.PromptCache(tmp_path, warn=warn).prime(engine, lm.identity, PROMPT)
    assert hit.hit and warn == []
    assert [e.tokens for e in pc.entries(tmp_path)] == [len(PROMPT)]


def test_listed_metadata_with_a_final_newline_is_not_a_prompt_caches():
    """The patterns ended in "$", which also matches before a final newline."""
    import msgspec

    good = {"kind": "prompt", "key": "a" * 64, "tokens": "12", "created": "1.5"}
    assert msgspec.convert(good, pc._Listed).tokens == "12"
    for field in ("key", "tokens", "created"):
        with pytest.raises(msgspec.ValidationError, match=field):
            msgspec.convert({**good, field: good[field] + "\n"}, pc._Listed)


def test_ls_rm_and_prune_keep_the_most_recently_used(lm, tmp_path):
    cache = pc.PromptCache(tmp_path)
    for i in range(12):
        cache.prime(lm.engine(), lm.identity, PROMPT[:10] + [i])
        time.sleep(0.01)
    listed = pc.entries(tmp_path)
    assert len(listed) == 12 and listed[0].tokens == 11
    old = listed[-1]
    os.utime(old.path)  # used just now
    size = listed[0].bytes
    gone = pc.prune(tmp_path, max_bytes=5 * size)
    remaining = pc.entries(tmp_path)
    assert len(remaining) == 5 and old.key in {e.key for e in remaining}
    assert len(gone) == 7
    assert pc.remove(tmp_path, remaining[0].key[:8])[0][0].key == remaining[0].key
    assert len(pc.entries(tmp_path)) == 4
    with pytest.raises(ValueError):
        pc.remove(tmp_path, "ab")


@pytest.mark.real_model
def test_bench_scripted_task_runs_all_its_tool_rounds(tmp_path):
    from mlx_agent.bench import multi_turn_share

    share = multi_turn_share(None, str(tmp_path / "kv"))
    assert share["calls"] == 4 and share["turns"] == 5  # 4 calls, then the answer
    assert share["rendered"] > 1500 and 0.5 < share["share"] < 1


def test_a_file_removed_between_listing_and_reading_is_not_listed(tmp_path):
    """Another process pruning the folder removes files while ``cache ls`` reads them: such a
    file was listed as "bad: ... No such file or directory"."""
    kept = tmp_path / "kept.safetensors"
    kept.write_bytes(b"x")
    st = kept.stat()  # what the listing saw, before the other process removed the file
    assert pc._entry(tmp_path / "gone.safetensors", st) is None
    assert pc._entry(kept, st).problem  # a file that is there and bad is still listed


def test_kv_computed_through_a_rotating_window_is_never_saved(lm, tmp_path):
    """A rotating window holds a chunk longer than itself whole until its next step, but the
    chunk's later tokens were computed seeing only the window: that KV state was saved as a
    plain prefix's (a session resumed without a window drifted 3e-2 from a fresh prefill; a
    prompt cache keyed "rotating" served it to any other window)."""
    prompt = list(range(3, 53))
    rotating = lm.engine(cache_mode="rotating", kv_window=30)
    rotating.pin(10)
    rotating.prefill(prompt)
    with pytest.raises(ValueError, match="window"):
        rotating.snapshot()
    pc.save_session(tmp_path / "s.safetensors", lm.identity, rotating, "json", {})
    assert pc.load_session(tmp_path / "s.safetensors", lm.identity)[2:] == ([], [])
    warn = Warnings()
    engine = lm.engine(cache_mode="rotating", kv_window=30)
    engine.pin(10)
    hit = pc.PromptCache(tmp_path / "kv", warn=warn).prime(engine, lm.identity, prompt)
    assert not hit.hit and engine.tokens == prompt and "cannot save" in warn[0]
    assert not list((tmp_path / "kv").glob("*"))
    # a wider window's file (the same key: both "rotating") is not this window's state
    wide = lm.engine(cache_mode="rotating", kv_window=60)
    wide.pin(10)
    cache = pc.PromptCache(tmp_path / "kv")
    assert not cache.prime(wide, lm.identity, prompt).hit
    for source in (cache, pc.PromptCache(tmp_path / "kv")):  # from memory, from disk
        engine = lm.engine(cache_mode="rotating", kv_window=30)
        engine.pin(10)
        assert not source.prime(engine, lm.identity, prompt).hit
        engine.sync(prompt + [1])
        rotating.sync(prompt + [1])
        np.testing.assert_allclose(np.array(engine.logits), np.array(rotating.logits),
                                   atol=1e-4)
