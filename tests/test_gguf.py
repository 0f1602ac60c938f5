"""GGUF loading on tiny files written in the test, and the errors bad files give."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models import llama

from mlx_agent.models import ModelError, load
from mlx_agent.tokenizer import _bytes_to_unicode

from .conftest import TINY_LLAMA, make_tiny_llama

GGUF_NAMES = {
    "model.embed_tokens": "token_embd", "model.norm": "output_norm",
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}


def to_gguf_name(name: str) -> str:
    if name.startswith("model.layers."):
        _, _, i, rest = name.split(".", 3)
        module, leaf = rest.rsplit(".", 1)
        return f"blk.{i}.{GGUF_NAMES[module]}.{leaf}"
    module, leaf = name.rsplit(".", 1)
    return f"{GGUF_NAMES[module]}.{leaf}"


def write_tiny_gguf(path, model, arch="llama", f16=False, add_bos=False, **changes):
    from mlx.utils import tree_flatten

    a = TINY_LLAMA
    tensors = {to_gguf_name(k): (v.astype(mx.float16) if f16 and v.ndim == 2 else v)
               for k, v in tree_flatten(model.parameters())}
    chars = _bytes_to_unicode()
    # printable ASCII (ids 0..93), one merged token, two specials: 97 = the vocab size
    tokens = [chars[b] for b in range(33, 127)] + ["hi", "<|im_start|>", "<|im_end|>"]
    u32 = lambda x: mx.array(x, dtype=mx.uint32)  # noqa: E731
    meta = {
        "general.architecture": arch, "general.name": "tiny",
        f"{arch}.embedding_length": u32(a["hidden_size"]),
        f"{arch}.block_count": u32(a["num_hidden_layers"]),
        f"{arch}.feed_forward_length": u32(a["intermediate_size"]),
        f"{arch}.attention.head_count": u32(a["num_attention_heads"]),
        f"{arch}.attention.head_count_kv": u32(a["num_key_value_heads"]),
        f"{arch}.attention.layer_norm_rms_epsilon": mx.array(a["rms_norm_eps"], dtype=mx.float32),
        f"{arch}.context_length": u32(a["max_position_embeddings"]),
        "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "smollm",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.merges": ["h i"],
        "tokenizer.ggml.token_type": mx.array([1] * (len(tokens) - 2) + [3, 3], dtype=mx.int32),
        "tokenizer.ggml.eos_token_id": u32(len(tokens) - 1),
        "tokenizer.ggml.bos_token_id": u32(len(tokens) - 2),
        "tokenizer.ggml.add_bos_token": mx.array(add_bos),
        "tokenizer.chat_template": "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
                                   "{{ m['content'] }}<|im_end|>\n{% endfor %}",
    }
    meta.update(changes)  # a test's hostile metadata
    mx.save_gguf(str(path), tensors, meta)


def test_tiny_gguf_loads_into_llama_with_identical_logits(tmp_path):
    model = make_tiny_llama(seed=2)
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, model)
    lm = load(path)
    assert isinstance(lm.model, llama.Model) and lm.model.args.rope_traditional
    assert lm.context_length == 256 and lm.identity.num_layers == 2
    assert lm.identity.kv_heads == 2 and lm.identity.head_dim == 16
    ids = mx.array([[1, 5, 9, 33, 2]])
    np.testing.assert_allclose(np.array(lm.model(ids)), np.array(model(ids)), atol=1e-5)
    eos, turn = lm.encode("<|im_end|>"), lm.encode("<|im_start|>")
    assert len(eos) == 1 and lm.stop_ids == frozenset(eos)  # the turn's end, as trained
    assert lm.end_ids == frozenset(eos + turn)  # a generation also stops where a turn opens
    assert lm.encode("hi") == [94]  # the one merge
    assert lm.encode("12") == [ord("1") - 33, ord("2") - 33]  # digits split one by one
    assert lm.decode(lm.encode("a+b=c")) == "a+b=c"


def test_bos_is_prepended_once_when_the_file_asks_for_it(tmp_path):
    for add_bos in (False, True):
        path = tmp_path / f"bos{add_bos}.gguf"
        write_tiny_gguf(path, make_tiny_llama(), add_bos=add_bos)
        lm = load(path)
        bos = lm.encode("<|im_start|>")
        assert lm.prompt_ids("ab") == (bos if add_bos else []) + lm.encode("ab")
        assert lm.prompt_ids("<|im_start|>ab") == lm.encode("<|im_start|>ab")  # never doubled


def test_f16_gguf_keeps_working_in_float32_on_cpu(tmp_path):
    path = tmp_path / "half.gguf"
    write_tiny_gguf(path, make_tiny_llama(seed=3), f16=True)
    lm = load(path, weights="float32")
    assert lm.identity.weight_format == "float32" and lm.identity.kv_dtype == "float32"


def test_unsupported_architecture_is_named(tmp_path):
    path = tmp_path / "q.gguf"
    write_tiny_gguf(path, make_tiny_llama(), arch="qwen2")
    with pytest.raises(ModelError, match="architecture 'qwen2' is not supported"):
        load(path)


def test_corrupt_gguf_is_a_one_line_error(tmp_path):
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, make_tiny_llama())
    data = path.read_bytes()
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelError, match="not a readable GGUF") as err:
        load(bad)
    assert "\n" not in str(err.value)


def _hostile_headers() -> dict[str, tuple[bytes, str]]:
    import struct

    def text(x: bytes) -> bytes:
        return struct.pack("<Q", len(x)) + x

    deep = (b"GGUF" + struct.pack("<IQQ", 3, 1, 1) + text(b"general.architecture")
            + struct.pack("<I", 8) + text(b"llama") + text(b"token_embd.weight")
            + struct.pack("<I", 1000) + struct.pack("<Q", 1) * 1000 + struct.pack("<IQ", 0, 0))
    def aligned(n: int) -> bytes:
        return (b"GGUF" + struct.pack("<IQQ", 3, 1, 1) + text(b"general.alignment")
                + struct.pack("<II", 4, n) + text(b"token_embd.weight")
                + struct.pack("<IQIQ", 1, 4, 0, 0) + b"\0" * 64)

    return {  # what the native reader did with each: segfault, segfault, abort, SIGFPE
        "alignment0": (aligned(0), "general.alignment is 0, not a power of two"),
        "alignment3": (aligned(3), "general.alignment is 3, not a power of two"),
        "tensors": (b"GGUF" + struct.pack("<IQQ", 3, 2**63, 0) + b"\0" * 64,
                    "claims 9223372036854775808 tensors"),
        "key": (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 2**62) + b"abc",
                "key 0 needs 4611686018427387904 bytes"),
        "dims": (deep + b"\0" * 96, "has 1000 dimensions (at most 4)"),
        "strings": (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + text(b"tok") + struct.pack(
            "<IIQ", 9, 8, 3) + text(b"a") + struct.pack("<Q", 2**40), "runs past the end"),
    }


@pytest.mark.parametrize("case", sorted(_hostile_headers()))
def test_a_hostile_header_is_refused_before_the_native_reader_sees_it(tmp_path, case):
    import subprocess
    import sys

    data, message = _hostile_headers()[case]
    path = tmp_path / "bad.gguf"
    path.write_bytes(data)
    r = subprocess.run([sys.executable, "-m", "mlx_agent.cli.main", "generate", "-m", str(path),
                        "hi"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr[-500:]
    assert "not a readable GGUF file" in r.stderr and message in r.stderr, r.stderr


@pytest.mark.parametrize("key,value,message", [
    # a second probe's: memory until it ran out, tracebacks, a load that never ended
    ("llama.block_count", 5_000_000, "llama.block_count is 5000000, not a whole number"),
    ("llama.block_count", 3, "says 3 blocks, and the file holds tensors for 2"),
    ("llama.attention.head_count", 0, "head_count is 0, not a whole number"),
    ("llama.context_length", 0, "context_length is 0, not a whole number"),
    ("tokenizer.ggml.bos_token_id", 100_000, "bos_token_id is 100000, not a token id"),
    ("tokenizer.chat_template", "{{ 1 / 0 }}", "chat template failed: ZeroDivisionError"),
    ("tokenizer.chat_template", "{% for i in range(100000) %}{% for j in range(100000) %}"
                                "{% endfor %}{% endfor %}", "loops over more than 1,000,000"),
    ("tokenizer.chat_template", "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}",
     "chat template failed: RecursionError"),
])
def test_hostile_metadata_is_one_line(tmp_path, key, value, message):
    import subprocess
    import sys

    path = tmp_path / "bad.gguf"
    write_tiny_gguf(path, make_tiny_llama(), **{key: mx.array(value, dtype=mx.uint32)
                                                if isinstance(value, int) else value})
    r = subprocess.run([sys.executable, "-m", "mlx_agent.cli.main", "generate", "--chat",
                        "-m", str(path), "hi"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and message in r.stderr, \
        r.stderr[-500:]


@pytest.mark.parametrize("key,value,message", [
    # a hostile tester's: each loaded, and generated garbage or a model that was never sane
    ("llama.attention.layer_norm_rms_epsilon", float("nan"), "layer_norm_rms_epsilon is nan"),
    ("llama.attention.layer_norm_rms_epsilon", 0.0, "layer_norm_rms_epsilon is 0.0, not a"),
    ("llama.rope.freq_base", float("inf"), "freq_base is inf, not a finite number"),
    ("llama.rope.freq_base", -10000.0, "freq_base is -10000.0, not a finite number above 0"),
])
def test_a_non_finite_config_value_is_refused(tmp_path, key, value, message):
    path = tmp_path / "bad.gguf"
    write_tiny_gguf(path, make_tiny_llama(), **{key: mx.array(value, dtype=mx.float32)})
    with pytest.raises(ModelError, match=message):
        load(path)


def test_missing_named_model_says_how_to_install(monkeypatch):
    from mlx_agent import models

    monkeypatch.setitem(models.NAMED_MODELS, "ghost", ("no_such_pkg_x", "m.gguf", "pip install ghost"))
    with pytest.raises(ModelError, match="install it with: pip install ghost"):
        load("ghost")


def _more_tokens():
    chars = _bytes_to_unicode()
    tokens = [chars[b] for b in range(33, 127)] + ["hi"] + [f"x{i}" for i in range(10)] + [
        "<|im_start|>", "<|im_end|>"]
    u32 = lambda x: mx.array(x, dtype=mx.uint32)  # noqa: E731
    return {"tokenizer.ggml.tokens": tokens, "llama.vocab_size": u32(97),
            "tokenizer.ggml.token_type": mx.array([1] * (len(tokens) - 2) + [3, 3], mx.int32),
            "tokenizer.ggml.eos_token_id": u32(len(tokens) - 1),
            "tokenizer.ggml.bos_token_id": u32(len(tokens) - 2)}


@pytest.mark.parametrize("changes,message", [
    # a hostile tester's: token ids past the embedding's rows read outside it (a segfault)
    (_more_tokens(), "the tokenizer has 107 tokens but the embedding 97 rows"),
    ({"tokenizer.ggml.eos_token_id": mx.array(-1, dtype=mx.int32)},
     "eos_token_id is -1, not a token id from 0 to 96"),
    ({"tokenizer.ggml.bos_token_id": mx.array(97, dtype=mx.uint32)},
     "bos_token_id is 97, not a token id"),
    ({"tokenizer.ggml.eos_token_id": "x"}, "eos_token_id is x, not a token id"),
    ({"tokenizer.ggml.token_type": mx.array([1, 1], dtype=mx.int32)},
     "token_type has 2 entries for 97 tokens"),
])
def test_a_tokenizer_that_does_not_fit_the_embedding_is_refused(tmp_path, changes, message):
    path = tmp_path / "bad.gguf"
    write_tiny_gguf(path, make_tiny_llama(), **changes)
    with pytest.raises(ModelError, match=message) as err:
        load(path)
    assert "\n" not in str(err.value)
