"""The .tinygpt format (read/write, every layout, every corruption) and its model."""

from __future__ import annotations

import io
import json
import os
import re
import struct

import mlx.core as mx
import numpy as np
import pytest

from mlx_agent.models import ModelError, load
from mlx_agent.models import tinygpt_format as fmt
from mlx_agent.models.tinygpt_format import TinyGPTError, TinyGPTFile

from .conftest import TINY_GPT_CONFIG, random_tinygpt_file


def roundtrip(tmp_path, f: TinyGPTFile):
    path = tmp_path / f"m-{f.layout}.tinygpt"
    fmt.write(path, f)
    return path, fmt.read(path)


def test_training_layout_is_bit_exact_with_adam_state(tmp_path):
    f = random_tinygpt_file(layout="training")
    rng = np.random.default_rng(1)
    f.adam = {k: (rng.standard_normal(v.shape).astype(np.float32),
                  rng.random(v.shape).astype(np.float32)) for k, v in f.weights.items()}
    f.step = 1234
    path, back = roundtrip(tmp_path, f)
    assert back.layout == "training" and back.step == 1234
    for k, v in f.weights.items():
        assert back.weights[k].dtype == np.float32
        np.testing.assert_array_equal(back.weights[k], v)
        np.testing.assert_array_equal(back.adam[k][0], f.adam[k][0])
        np.testing.assert_array_equal(back.adam[k][1], f.adam[k][1])
    assert fmt.encode(back) == path.read_bytes()


def test_inference_layout_is_bit_exact_fp16(tmp_path):
    f = random_tinygpt_file(layout="inference", embed_norm=True)
    path, back = roundtrip(tmp_path, f)
    header = json.loads(path.read_bytes()[12 : 12 + struct.unpack_from("<I", path.read_bytes(), 8)[0]])
    assert header["weightDtype"] == "fp16" and header["includesOptimizerState"] is False
    assert all("floatOffset" in e for e in header["manifest"])
    for k, v in f.weights.items():
        np.testing.assert_array_equal(back.weights[k], v.astype(np.float16))
    assert fmt.encode(back) == path.read_bytes()


def test_int4_layout_dequantizes_and_rewrites_identically(tmp_path):
    f = random_tinygpt_file(layout="int4")
    f.weights["ln_final.bias"][:] = 0.0  # an all-zero block has scale 0
    path, back = roundtrip(tmp_path, f)
    assert back.layout == "int4" and back.int4_block == 64
    for k, v in f.weights.items():
        err = np.abs(back.weights[k] - v).max()
        assert err <= np.abs(v).max() / 7 + 1e-3, k  # within half a step of its block scale
    np.testing.assert_array_equal(back.weights["ln_final.bias"], 0.0)
    assert fmt.encode(back) == path.read_bytes()  # re-quantizing the decoded values is exact


def test_linear_weights_are_stored_transposed(tmp_path):
    """Bytes written by the original (2-D Linear weights as [in, out]) load as [out, in]."""
    cfg = {"layers": 1, "dModel": 4, "ctx": 3, "heads": 1, "dMlp": 8}
    manifest, body, offset = [], [], 0
    for name, shape in fmt.expected_manifest(cfg):
        n = int(np.prod(shape))
        values = np.arange(offset, offset + n, dtype=np.float16)
        if fmt.is_linear_weight(name, shape):
            # the original writes W[out, in] as the bytes of W.T, i.e. row-major [in, out]
            stored = values.reshape(shape).T.copy().reshape(-1)
        else:
            stored = values
        manifest.append({"name": name, "shape": list(shape), "floatOffset": offset})
        body.append(stored.tobytes())
        offset += n
    header = json.dumps({"config": cfg, "manifest": manifest, "weightDtype": "fp16",
                         "includesOptimizerState": False}).encode()
    path = tmp_path / "orig.tinygpt"
    path.write_bytes(b"TGPT" + struct.pack("<IIi", 2, len(header), 0)[:8] + header
                     + struct.pack("<i", 0) + b"".join(body))
    back = fmt.read(path)
    fc_in = back.weights["blocks.0.mlp.fc_in.weight"]
    assert fc_in.shape == (8, 4)
    start = next(e["floatOffset"] for e in manifest if e["name"] == "blocks.0.mlp.fc_in.weight")
    np.testing.assert_array_equal(fc_in, np.arange(start, start + 32, dtype=np.float16).reshape(8, 4))
    assert back.weights["token_embedding.weight"][0, 1] == 1  # embeddings are not transposed


@pytest.fixture
def good_bytes():
    return fmt.encode(random_tinygpt_file())


@pytest.mark.parametrize("mutate,message", [
    (lambda b: b[:10], "truncated"),
    (lambda b: b[:-100], "truncated"),
    (lambda b: b"TGPX" + b[4:], "not a .tinygpt file"),
    (lambda b: b[:8] + struct.pack("<I", 10**6) + b[12:], "runs past the end"),
    (lambda b: b[:4] + struct.pack("<I", 1) + b[8:], "version 1"),
    (lambda b: b[:12] + b"{" * struct.unpack_from("<I", b, 8)[0] + b[12 + struct.unpack_from("<I", b, 8)[0]:], "not valid JSON"),
])
def test_corrupt_files_give_one_line_errors(tmp_path, good_bytes, mutate, message):
    path = tmp_path / "bad.tinygpt"
    path.write_bytes(mutate(good_bytes))
    with pytest.raises(TinyGPTError, match=message) as err:
        fmt.read(path)
    assert "\n" not in str(err.value)
    with pytest.raises(ModelError, match=message if "not a" not in message else "unknown model format"):
        load(path)


def _with_header(data: bytes, edit) -> bytes:
    n = struct.unpack_from("<I", data, 8)[0]
    header = json.loads(data[12 : 12 + n])
    edit(header)
    new = json.dumps(header).encode()
    return data[:8] + struct.pack("<I", len(new)) + new + data[12 + n :]


@pytest.mark.parametrize("edit,message", [
    (lambda h: h["manifest"][0].update(shape=[256, 33]), "disagrees with config"),
    (lambda h: h["manifest"].pop(), "lacks blocks.1.mlp.fc_out.bias"),
    (lambda h: h["config"].update(layers=3), "lacks blocks.2"),
    (lambda h: h["config"].update(dMlp=32), "disagrees with config"),
    (lambda h: h.pop("manifest"), "no manifest"),
    (lambda h: h.update(weightDtype="bf16"), "unsupported weightDtype"),
    # a hostile tester's: memory until it ran out, and tracebacks
    (lambda h: h["config"].update(layers=10**8), "config says 100000000 layers"),
    (lambda h: h["config"].update(layers=float("inf")), "layers is Infinity, not a whole"),
    (lambda h: h["config"].update(heads=-1), "heads is -1, not a whole number"),
    (lambda h: h["config"].update(vocabSize=True), "vocabSize is true, not a whole number"),
    (lambda h: h["manifest"][0].update(floatOffset=[1]), "floatOffset of .* is past the body"),
    (lambda h: h.update(int4BlockSize=float("inf")), "int4BlockSize Infinity is not a whole"),
    (lambda h: h.update(sentencepieceModel=""), "sentencepieceModel is empty"),
])
def test_manifest_disagreeing_with_body_or_config_is_an_error(tmp_path, good_bytes, edit, message):
    path = tmp_path / "bad.tinygpt"
    path.write_bytes(_with_header(good_bytes, edit))
    with pytest.raises(TinyGPTError, match=message):
        fmt.read(path)


def test_an_int4_block_size_of_zero_is_refused_not_taken_as_64(tmp_path):
    f = random_tinygpt_file(layout="int4")
    f.int4_block = 64
    path = tmp_path / "q.tinygpt"
    path.write_bytes(_with_header(fmt.encode(f), lambda h: h.update(int4BlockSize=0)))
    with pytest.raises(TinyGPTError, match="int4BlockSize 0 must be a positive even number"):
        fmt.read(path)


def test_body_shorter_than_manifest_is_an_error(tmp_path, good_bytes):
    def grow(h):  # a manifest claiming a larger MLP than the body holds
        h["config"]["dMlp"] = 128
        for e in h["manifest"]:
            if "fc_in" in e["name"]:
                e["shape"][0] = 128
            if "fc_out.weight" in e["name"]:
                e["shape"][1] = 128
    path = tmp_path / "bad.tinygpt"
    path.write_bytes(_with_header(good_bytes, grow))
    with pytest.raises(TinyGPTError, match="body is .* bytes but"):
        fmt.read(path)


@pytest.mark.parametrize("layout", ["training", "inference", "int4"])
def test_a_body_far_longer_than_the_manifest_is_refused_before_it_is_read(tmp_path, layout):
    # a sparse 4 GiB file behind a tiny model's header was read whole first (30 GiB: a
    # MemoryError, or the machine out of memory)
    import resource
    import time

    path = tmp_path / "big.tinygpt"
    fmt.write(path, random_tinygpt_file(layout=layout))
    os.truncate(path, 4 << 30)
    before, start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.perf_counter()
    with pytest.raises(TinyGPTError, match="body is .* bytes but the manifest"):
        fmt.read(path)
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before  # KiB on Linux
    assert time.perf_counter() - start < 2 and grown < 256 << 10, grown


def test_a_header_length_past_the_limit_is_refused_before_it_is_read(tmp_path):
    # the header's claimed length was read (up to 4 GiB of a sparse file) before its check
    import resource
    import struct

    path = tmp_path / "big.tinygpt"
    with open(path, "wb") as f:
        f.write(fmt.MAGIC + struct.pack("<II", fmt.VERSION, 0xFFFF_FFF0))
        f.truncate(5 << 30)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(TinyGPTError, match=r"header length 4,294,967,280 is over the "
                                           r"67,108,864-byte limit"):
        fmt.read(path)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 256 << 10


def test_loaded_tinygpt_matches_a_fresh_module_in_every_layout(tmp_path):
    from mlx_agent.models import tinygpt

    def fresh_logits(weights, ids):
        m = tinygpt.Model(tinygpt.ModelArgs.from_config(f.config))
        m.load_weights(list(m.sanitize(
            {k: mx.array(v.astype(np.float32)) for k, v in weights.items()}).items()))
        return np.array(m(ids))

    f = random_tinygpt_file(layout="training")
    ids = mx.array([[1, 72, 101, 108, 108, 111, 33]])
    for layout in ("training", "inference", "int4"):
        f.layout = layout
        path = tmp_path / f"{layout}.tinygpt"
        fmt.write(path, f)
        lm = load(path)
        assert lm.identity.format == "tinygpt" and lm.context_length == 64
        stored = f.weights if layout == "training" else fmt.read(path).weights
        np.testing.assert_allclose(np.array(lm.model(ids)), fresh_logits(stored, ids), atol=1e-5)
        if layout == "training":
            assert lm.decode(lm.encode("héllo")) == "héllo"  # byte-level tokenizer
            assert lm.encode("A") == [65]


def test_tinygpt_generate_with_every_cache_mode(tmp_path):
    path = tmp_path / "m.tinygpt"
    fmt.write(path, random_tinygpt_file())
    lm = load(path)
    outs = []
    for mode in ("preallocated", "growing", "rotating"):
        e = lm.engine(cache_mode=mode, kv_window=64)
        e.prefill(lm.encode("<|im_start|>user\nhi"))
        outs.append(list(e.generate(max_tokens=10)))
    assert outs[0] == outs[1] == outs[2]
    assert lm.chat.render([{"role": "user", "content": "hi"}]).startswith("<|im_start|>user\nhi")


def _sentencepiece_model() -> tuple[bytes, int]:
    spm = pytest.importorskip("sentencepiece")
    model = io.BytesIO()
    text = ["the quick brown fox jumps over the lazy dog", "hello world", "tools call agents"] * 50
    spm.SentencePieceTrainer.train(sentence_iterator=iter(text), model_writer=model,
                                   vocab_size=288, model_type="unigram", hard_vocab_limit=False, byte_fallback=True,
                                   minloglevel=2)
    proto = model.getvalue()
    return proto, spm.SentencePieceProcessor(model_proto=proto).get_piece_size()


def test_embedded_sentencepiece_tokenizer(tmp_path):
    proto, n = _sentencepiece_model()
    f = random_tinygpt_file(config={**TINY_GPT_CONFIG, "vocabSize": n})
    f.sentencepiece = proto
    path = tmp_path / "spm.tinygpt"
    fmt.write(path, f)
    assert fmt.read(path).sentencepiece == proto
    lm = load(path)
    ids = lm.encode("hello world")
    assert ids and max(ids) < n
    assert lm.decode(ids) == "hello world"
    detok = lm.tokenizer.detokenizer
    detok.reset()
    for i in ids:
        detok.add_token(i)
    detok.finalize()
    assert detok.text == "hello world"


def test_a_sentencepiece_model_larger_than_the_embedding_is_refused(tmp_path):
    proto, n = _sentencepiece_model()  # a hostile tester's: ids past the rows, a segfault
    f = random_tinygpt_file(config={**TINY_GPT_CONFIG, "vocabSize": n - 10})
    f.sentencepiece = proto
    path = tmp_path / "spm.tinygpt"
    fmt.write(path, f)
    with pytest.raises(ModelError, match=f"the tokenizer has {n} tokens but the embedding "
                                         f"{n - 10} rows"):
        load(path)


def test_tinygpt_without_a_tokenizer_for_its_vocab_is_an_error(tmp_path):
    path = tmp_path / "v.tinygpt"
    fmt.write(path, random_tinygpt_file(config={**TINY_GPT_CONFIG, "vocabSize": 300}))
    with pytest.raises(ModelError, match="needs a tokenizer"):
        load(path)


def test_unsupported_config_flag_is_named(tmp_path):
    path = tmp_path / "y.tinygpt"
    fmt.write(path, random_tinygpt_file(config={**TINY_GPT_CONFIG, "useYOCO": True}))
    with pytest.raises(ModelError, match="useYOCO"):
        load(path)


def test_write_is_atomic_and_leaves_no_temporary_files(tmp_path):
    f = random_tinygpt_file()
    fmt.write(tmp_path / "a.tinygpt", f)
    f.weights.pop("ln_final.bias")
    with pytest.raises(TinyGPTError, match="missing tensor ln_final.bias"):
        fmt.write(tmp_path / "b.tinygpt", f)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.tinygpt"]


@pytest.mark.parametrize("name", [{"a": 1}, 7, "", None])
def test_a_header_name_that_is_not_a_string_gives_the_file_stem(tmp_path, name):
    f = random_tinygpt_file()  # a hostile tester's {"a": 1}: an AttributeError in a cache slug
    f.header = {"name": name}
    fmt.write(tmp_path / "odd.tinygpt", f)
    assert load(tmp_path / "odd.tinygpt").identity.name == "odd"


@pytest.mark.parametrize("tensor,index,value", [
    ("blocks.1.mlp.fc_in.weight", (3, 5), np.nan),
    ("blocks.0.ln1.weight", (7,), np.inf),
    ("token_embedding.weight", (200, 1), -np.inf),  # a row the probe's token is not
    ("position_embedding.weight", (5, 1), np.nan),  # a position past the probe's one token
])
def test_weights_with_nan_or_infinity_are_refused_at_load(tmp_path, tensor, index, value):
    f = random_tinygpt_file()
    f.weights[tensor][index] = value
    path = tmp_path / "damaged.tinygpt"
    fmt.write(path, f)
    with pytest.raises(ModelError, match=rf"damaged.tinygpt: the weights hold NaN or infinite "
                                         rf"values \(model\.{re.escape(tensor)}\).*the file is "
                                         r"damaged") as err:
        load(path)
    assert "\n" not in str(err.value)
