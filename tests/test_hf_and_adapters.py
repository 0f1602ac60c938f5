"""Hugging Face directories through mlx-lm, and LoRA adapters on every format."""

from __future__ import annotations

import json
import re

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten
from mlx_lm.tuner.utils import linear_to_lora_layers

from mlx_agent.models import ModelError, load
from mlx_agent.models import tinygpt_format as fmt
from mlx_agent.tokenizer import byte_level

from .conftest import TINY_LLAMA, make_tiny_llama, random_tinygpt_file

IDS = mx.array([[3, 14, 15, 92, 65, 35]])


def write_hf_dir(path, model):
    path.mkdir()
    (path / "config.json").write_text(json.dumps(TINY_LLAMA))
    mx.save_safetensors(str(path / "model.safetensors"), dict(tree_flatten(model.parameters())))
    byte_level()._tokenizer.save_pretrained(str(path))


def write_adapter(path, model, lora_keys=("self_attn.q_proj", "self_attn.v_proj")):
    """A random (non-zero) LoRA adapter in mlx-lm's format, applied to ``model`` too."""
    params = {"rank": 4, "scale": 2.0, "dropout": 0.0, "keys": list(lora_keys)}
    linear_to_lora_layers(model, 2, params)
    mx.random.seed(5)
    lora = {k: mx.random.normal(v.shape) * 0.1
            for k, v in tree_flatten(model.parameters()) if "lora_" in k}
    model.load_weights(list(lora.items()), strict=False)
    path.mkdir()
    mx.save_safetensors(str(path / "adapters.safetensors"), lora)
    (path / "adapter_config.json").write_text(json.dumps(
        {"fine_tune_type": "lora", "num_layers": 2, "lora_parameters": params}))


def tinygpt_with_adapter(tmp_path):
    """``m.tinygpt`` (random weights) and a random LoRA adapter for it in ``ad/``; returns
    the adapter's weights file."""
    from mlx_agent.models import tinygpt

    f = random_tinygpt_file()
    fmt.write(tmp_path / "m.tinygpt", f)
    base = tinygpt.Model(tinygpt.ModelArgs.from_config(f.config))
    write_adapter(tmp_path / "ad", base, lora_keys=("attn.q_proj", "attn.v_proj"))
    return tmp_path / "ad" / "adapters.safetensors"


def test_hf_directory_loads_through_mlx_lm(tmp_path):
    model = make_tiny_llama(seed=4)
    write_hf_dir(tmp_path / "hf", model)
    lm = load(tmp_path / "hf")
    assert lm.identity.format == "hf" and lm.context_length == 256
    np.testing.assert_allclose(np.array(lm.model(IDS)), np.array(model(IDS)), atol=1e-5)
    assert lm.decode(lm.encode("tools!")) == "tools!"


def test_hf_directory_with_adapter_changes_logits_as_mlx_lm_does(tmp_path):
    base = make_tiny_llama(seed=4)
    write_hf_dir(tmp_path / "hf", base)
    plain = np.array(base(IDS))
    write_adapter(tmp_path / "ad", base)
    lm = load(tmp_path / "hf", adapter=tmp_path / "ad")
    got = np.array(lm.model(IDS))
    np.testing.assert_allclose(got, np.array(base(IDS)), atol=1e-5)
    assert np.abs(got - plain).max() > 1e-3  # the adapter really is applied
    assert lm.identity.adapter_fingerprint


def test_adapter_on_a_tinygpt(tmp_path):
    from mlx_agent.models import tinygpt

    f = random_tinygpt_file(layout="training")
    fmt.write(tmp_path / "m.tinygpt", f)
    base = tinygpt.Model(tinygpt.ModelArgs.from_config(f.config))
    base.load_weights(list(base.sanitize({k: mx.array(v) for k, v in f.weights.items()}).items()))
    write_adapter(tmp_path / "ad", base, lora_keys=("attn.q_proj", "attn.v_proj"))
    lm = load(tmp_path / "m.tinygpt", adapter=tmp_path / "ad")
    np.testing.assert_allclose(np.array(lm.model(IDS)), np.array(base(IDS)), atol=1e-5)


def test_adapter_directory_without_config_is_a_clear_error(tmp_path):
    (tmp_path / "ad").mkdir()
    with pytest.raises(ModelError, match="no adapter_config.json"):
        load("smollm2-135m", adapter=tmp_path / "ad")


def test_directory_without_config_json_is_a_clear_error(tmp_path):
    with pytest.raises(ModelError, match="without config.json"):
        load(tmp_path)


@pytest.mark.parametrize("kind,message", [
    # a hostile tester's: a FIFO blocked the load forever, the others were tracebacks
    ("fifo", "adapters.safetensors is not a regular file"),
    ("dir", "adapters.safetensors is not a regular file"),
    ("dangling", "has no adapters.safetensors"),
    ("missing", "has no adapters.safetensors"),
])
def test_adapter_weights_that_are_not_a_regular_file_are_refused(tmp_path, kind, message):
    import os
    import subprocess
    import sys

    fmt.write(tmp_path / "m.tinygpt", random_tinygpt_file())
    ad = tmp_path / "ad"
    ad.mkdir()
    (ad / "adapter_config.json").write_text(json.dumps(
        {"num_layers": 2, "lora_parameters": {"rank": 4, "scale": 2.0, "dropout": 0.0}}))
    weights = ad / "adapters.safetensors"
    if kind == "fifo":
        os.mkfifo(weights)
    elif kind == "dir":
        weights.mkdir()
    elif kind == "dangling":
        weights.symlink_to(tmp_path / "gone")
    r = subprocess.run([sys.executable, "-m", "mlx_agent.cli.main", "generate", "-m",
                        str(tmp_path / "m.tinygpt"), "--adapter", str(ad), "hi"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and message in r.stderr, \
        r.stderr[-500:]


_LORA = {"rank": 4, "scale": 2.0, "dropout": 0.0}


@pytest.mark.parametrize("config,message", [
    # a hostile tester's: tracebacks from inside mlx-lm, a NaN scale's garbage, a rank of
    # 2^40 an OverflowError, and num_layers 10^18 taken as "all"
    ([], "adapter_config.json is list, not an object"),
    (None, "adapter_config.json is NoneType, not an object"),
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ({"lora_parameters": _LORA}, "num_layers is null, not -1 (all) or a whole number"),
    ({"num_layers": "2", "lora_parameters": _LORA}, 'num_layers is "2", not'),
    ({"num_layers": 10**18, "lora_parameters": _LORA}, "num_layers is 1000000000000000000,"),
    ({"num_layers": 2, "lora_parameters": None}, "lora_parameters is null, not an object"),
    ({"num_layers": 2, "lora_parameters": {**_LORA, "rank": 2**40}}, "rank is 1099511627776"),
    ({"num_layers": 2, "lora_parameters": {**_LORA, "rank": 4.0}}, "rank is 4.0, not a whole"),
    ({"num_layers": 2, "lora_parameters": {**_LORA, "scale": "2"}}, 'scale is "2", not a finite'),
    ({"num_layers": 2, "lora_parameters": {**_LORA, "scale": float("nan")}}, "scale is NaN"),
    ({"num_layers": 2, "lora_parameters": {"rank": 4, "scale": 2.0}}, "dropout is null"),
    ({"num_layers": 2, "lora_parameters": {**_LORA, "keys": "q"}}, 'keys is "q", not a list'),
    ({"fine_tune_type": "qlora", "num_layers": 2, "lora_parameters": _LORA},
     'fine_tune_type "qlora" is not lora, dora or full'),
])
def test_a_hostile_adapter_config_is_one_line(tmp_path, config, message):
    fmt.write(tmp_path / "m.tinygpt", random_tinygpt_file())
    ad = tmp_path / "ad"
    ad.mkdir()
    (ad / "adapter_config.json").write_text(config if isinstance(config, str)
                                            else json.dumps(config))
    (ad / "adapters.safetensors").write_bytes(b"")
    with pytest.raises(ModelError, match=re.escape(message)) as err:
        load(tmp_path / "m.tinygpt", adapter=ad)
    assert "\n" not in str(err.value)


def test_a_corrupt_adapters_safetensors_is_one_line(tmp_path):
    weights = tinygpt_with_adapter(tmp_path)
    data = weights.read_bytes()
    for cut in (data[: len(data) // 2], b"\0" * 8, b"junk"):  # truncated, garbage: RuntimeError
        weights.write_bytes(cut)
        with pytest.raises(ModelError, match="adapter .* does not fit m.tinygpt") as err:
            load(tmp_path / "m.tinygpt", adapter=tmp_path / "ad")
        assert "\n" not in str(err.value)


def test_an_adapter_of_other_shapes_names_the_tensors_in_one_readable_line(tmp_path):
    # "contains incompatible tensors:;  layers.0...;  layers.1...": every tensor, ";;"-joined
    weights = tinygpt_with_adapter(tmp_path)
    tensors = mx.load(str(weights))
    mx.save_safetensors(str(weights), {k: mx.zeros((v.shape[0] + 1, *v.shape[1:]))
                                       for k, v in tensors.items()})
    with pytest.raises(ModelError) as err:
        load(tmp_path / "m.tinygpt", adapter=tmp_path / "ad")
    message = str(err.value)
    assert "\n" not in message and ":;" not in message and ";;" not in message, message
    assert re.search(r"contains incompatible tensors: \S+lora_\w: adapter shape \(\d+, \d+\) "
                     r"does not match model parameter shape", message), message
    assert message.endswith(f"; and {len(tensors) - 3} more"), message

def test_a_hostile_hf_directory_is_one_line(tmp_path):
    write_hf_dir(tmp_path / "hf", make_tiny_llama())
    config, weights = tmp_path / "hf" / "config.json", tmp_path / "hf" / "model.safetensors"
    good = config.read_text()
    for text, message in [("[]", "config.json is list, not an object"),
                          ("[" * 100_000, "config.json is not valid JSON"),
                          (json.dumps({**TINY_LLAMA, "max_position_embeddings": "x"}),
                           'max_position_embeddings is "x", not a whole number')]:
        config.write_text(text)  # a hostile tester's: tracebacks
        with pytest.raises(ModelError, match=re.escape(message)) as err:
            load(tmp_path / "hf")
        assert "\n" not in str(err.value)
    config.write_text(good)
    weights.write_bytes(weights.read_bytes()[:1000])  # truncated: RuntimeError from MLX
    with pytest.raises(ModelError, match="hf: ") as err:
        load(tmp_path / "hf")
    assert "\n" not in str(err.value)


def test_an_adapter_with_nan_weights_is_refused_at_load(tmp_path):
    weights = tinygpt_with_adapter(tmp_path)
    lora = mx.load(str(weights))
    name = sorted(k for k in lora if k.endswith("lora_b"))[0]
    lora[name] = mx.where(mx.arange(lora[name].size).reshape(lora[name].shape) == 3,
                          mx.array(float("nan")), lora[name])
    mx.save_safetensors(str(weights), lora)
    with pytest.raises(ModelError, match=rf"with adapter .*: the weights hold NaN or infinite "
                                         rf"values \(.*{re.escape(name)}\).*the adapter is "
                                         r"damaged"):
        load(tmp_path / "m.tinygpt", adapter=tmp_path / "ad")


def test_nan_in_an_untied_embedding_row_is_refused_at_load(tmp_path):
    """The probe's one token reads one row of the input embedding; only a tied one is the
    output head too, which reads them all: an untied model with a NaN row loaded, and
    generated NaN logits once a prompt held that token."""
    model = make_tiny_llama(seed=4)
    model.lm_head = nn.Linear(TINY_LLAMA["hidden_size"], TINY_LLAMA["vocab_size"], bias=False)
    weights = dict(tree_flatten(model.parameters()))
    table = weights["model.embed_tokens.weight"]
    weights["model.embed_tokens.weight"] = mx.where(
        mx.arange(table.size).reshape(table.shape) == 5 * table.shape[1],  # token 5's row
        mx.array(float("nan")), table)
    path = tmp_path / "hf"
    write_hf_dir(path, model)
    (path / "config.json").write_text(json.dumps({**TINY_LLAMA, "tie_word_embeddings": False}))
    mx.save_safetensors(str(path / "model.safetensors"), weights)
    with pytest.raises(ModelError, match=r"the weights hold NaN or infinite values "
                                         r"\(model\.embed_tokens\.weight\).*the file is damaged"):
        load(path)


def test_a_dora_adapter_with_nan_weights_is_named_damaged_not_the_model(tmp_path):
    """Blame went by "lora" in the tensor's name: a NaN DoRA magnitude (``….m``) said "the
    file is damaged", sending the user to download the model again."""
    f = random_tinygpt_file()
    fmt.write(tmp_path / "m.tinygpt", f)
    from mlx_agent.models import tinygpt

    base = tinygpt.Model(tinygpt.ModelArgs.from_config(f.config))
    params = {"rank": 4, "scale": 2.0, "dropout": 0.0, "keys": ["attn.q_proj"]}
    linear_to_lora_layers(base, 2, params, use_dora=True)
    weights = {k: v for k, v in tree_flatten(base.parameters())
               if "lora_" in k or k.endswith(".m")}
    name = sorted(k for k in weights if k.endswith(".m"))[0]
    weights[name] = mx.full(weights[name].shape, float("nan"))
    (tmp_path / "ad").mkdir()
    mx.save_safetensors(str(tmp_path / "ad" / "adapters.safetensors"), weights)
    (tmp_path / "ad" / "adapter_config.json").write_text(json.dumps(
        {"fine_tune_type": "dora", "num_layers": 2, "lora_parameters": params}))
    with pytest.raises(ModelError, match=rf"\({re.escape(name)}\).*the adapter is damaged"):
        load(tmp_path / "m.tinygpt", adapter=tmp_path / "ad")
