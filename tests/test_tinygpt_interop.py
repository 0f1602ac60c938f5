""".tinygpt interoperability with the original posttrainllm: files built byte by byte as its
writers lay them out (Python's struct, not our writer), run against a NumPy forward pass of
its model; and what we write, parsed by a reader written from the format's description."""

from __future__ import annotations

import json
import math
import struct

import mlx.core as mx
import numpy as np
import pytest

from mlx_agent.models import ModelError, load
from mlx_agent.models import tinygpt_format as fmt

C, L, CTX, H, M, V = 32, 2, 16, 4, 48, 256
IDS = [0, 72, 105, 255, 33, 10, 200]


def original_manifest(rms_embed=False):
    """The Swift trainer's manifestEntries(): names and PyTorch [out, in] shapes, in order."""
    out = [("token_embedding.weight", [V, C]), ("position_embedding.weight", [CTX, C])]
    if rms_embed:
        out.append(("embed_norm.weight", [C]))
    out += [("ln_final.weight", [C]), ("ln_final.bias", [C])]
    for i in range(L):
        b = f"blocks.{i}."
        out += [(b + "ln1.weight", [C]), (b + "ln1.bias", [C])]
        for p in "qkvo":
            out += [(f"{b}attn.{p}_proj.weight", [C, C]), (f"{b}attn.{p}_proj.bias", [C])]
        out += [(b + "ln2.weight", [C]), (b + "ln2.bias", [C]),
                (b + "mlp.fc_in.weight", [M, C]), (b + "mlp.fc_in.bias", [M]),
                (b + "mlp.fc_out.weight", [C, M]), (b + "mlp.fc_out.bias", [C])]
    return out


def random_weights(manifest, seed=0):
    rng = np.random.default_rng(seed)
    w = {}
    for name, shape in manifest:
        a = rng.standard_normal(shape).astype(np.float32) * (0.3 if len(shape) == 2 else 0.1)
        w[name] = a + (1.0 if len(shape) == 1 and name.endswith("weight") else 0.0)
    return w


def stored(name, a):
    """The bytes' order: every 2-D weight but the embeddings is stored [in, out]."""
    if a.ndim == 2 and "embedding" not in name:
        a = a.T
    return np.ascontiguousarray(a, dtype="<f4").reshape(-1)


def original_bytes(config, manifest, weights, *, layout="training", step=7, extra=None):
    """A file laid out as TinyGPTFileWriter / the browser's export write it."""
    entries, body, offset = [], [], 0
    for name, shape in manifest:
        entries.append({"floatOffset": offset, "name": name, "shape": shape})
        offset += int(np.prod(shape))
    if layout == "training":
        for name, _ in manifest:
            flat = stored(name, weights[name])
            body += [flat.tobytes(), np.full_like(flat, 0.5).tobytes(),
                     np.full_like(flat, 0.25).tobytes()]
        dtype = {"weightDtype": "fp32", "includesOptimizerState": True}
    else:
        body = [stored(n, weights[n]).astype("<f2").tobytes() for n, _ in manifest]
        dtype = {"weightDtype": "fp16", "includesOptimizerState": False}
    header = {"config": config, "manifest": entries, "savedAt": "2025-01-02T03:04:05Z",
              "finalLoss": {"step": step, "train": 1.25},
              "stateByteLength": 4 + sum(map(len, body)), **dtype, **(extra or {})}
    # Swift's JSONEncoder with .sortedKeys: compact, sorted, "/" escaped
    text = json.dumps(header, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    hbytes = text.replace("/", "\\/").encode("utf-8")
    return (b"TGPT" + struct.pack("<II", 2, len(hbytes)) + hbytes + struct.pack("<i", step)
            + b"".join(body))


# The original's forward pass (TinyGPTModel.swift, TransformerBlock.swift), in NumPy.

def _layer_norm(x, w, b):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + 1e-5) * w + b


def _rms_norm(x, w):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-5) * w


_erf = np.vectorize(math.erf)


def original_logits(w, ids, *, heads=H, rms_embed=False, deep_norm=False):
    w = {k: v.astype(np.float64) for k, v in w.items()}
    T = len(ids)
    tok = w["token_embedding.weight"][ids]
    if rms_embed:  # on the token embedding, before the positions are added
        tok = _rms_norm(tok, w["embed_norm.weight"])
    x = tok + w["position_embedding.weight"][:T]
    alpha = (2.0 * L) ** 0.25 if deep_norm else 1.0
    causal = np.triu(np.full((T, T), -np.inf), 1)
    for i in range(L):
        p = f"blocks.{i}."

        def lin(h, n):
            return h @ w[p + n + ".weight"].T + w[p + n + ".bias"]

        h = _layer_norm(x, w[p + "ln1.weight"], w[p + "ln1.bias"])
        q, k, v = (lin(h, f"attn.{n}_proj").reshape(T, heads, -1).transpose(1, 0, 2)
                   for n in "qkv")
        s = q @ k.transpose(0, 2, 1) / math.sqrt(C // heads) + causal
        s = np.exp(s - s.max(-1, keepdims=True))
        a = (s / s.sum(-1, keepdims=True)) @ v
        x = x * alpha + lin(a.transpose(1, 0, 2).reshape(T, C), "attn.o_proj")
        h = lin(_layer_norm(x, w[p + "ln2.weight"], w[p + "ln2.bias"]), "mlp.fc_in")
        x = x * alpha + lin(0.5 * h * (1 + _erf(h / math.sqrt(2))), "mlp.fc_out")
    x = _layer_norm(x, w["ln_final.weight"], w["ln_final.bias"])
    return x @ w["token_embedding.weight"].T


def our_logits(path):
    lm = load(path)
    return np.array(lm.model(mx.array([IDS]))[0].astype(mx.float32))


CONFIG = {"layers": L, "dModel": C, "ctx": CTX, "heads": H, "dMlp": M, "batchSize": 8,
          "backend": "mlx-swift"}


def test_an_original_training_file_reads_exactly_and_runs_as_the_original(tmp_path):
    manifest = original_manifest()
    w = random_weights(manifest)
    path = tmp_path / "orig.tinygpt"
    path.write_bytes(original_bytes(CONFIG, manifest, w, step=-3))
    f = fmt.read(path)
    assert f.layout == "training" and f.step == -3 and f.config == CONFIG
    assert f.header["savedAt"] == "2025-01-02T03:04:05Z"
    for name, _ in manifest:
        np.testing.assert_array_equal(f.weights[name], w[name])
        np.testing.assert_array_equal(f.adam[name][0], np.full_like(w[name], 0.5))
        np.testing.assert_array_equal(f.adam[name][1], np.full_like(w[name], 0.25))
    np.testing.assert_allclose(our_logits(path), original_logits(w, IDS), atol=2e-4)


def test_an_original_fp16_file_whose_manifest_is_not_in_offset_order(tmp_path):
    """TinyGPTFileWriter concatenates tensors sorted by floatOffset, whatever the manifest's
    order: each entry is read where its floatOffset points."""
    manifest = original_manifest()
    w = random_weights(manifest, seed=1)
    data = original_bytes(CONFIG, manifest, w, layout="inference")
    hlen = struct.unpack_from("<I", data, 8)[0]
    header = json.loads(data[12 : 12 + hlen])
    header["manifest"].reverse()
    hbytes = json.dumps(header).encode()
    path = tmp_path / "fp16.tinygpt"
    path.write_bytes(data[:4] + struct.pack("<II", 2, len(hbytes)) + hbytes + data[12 + hlen :])
    f = fmt.read(path)
    assert f.layout == "inference"
    for name, _ in manifest:
        np.testing.assert_array_equal(f.weights[name], w[name].astype(np.float16))


def test_the_embedding_rmsnorm_is_the_originals(tmp_path):
    """useEmbeddingRMSNorm: an RMSNorm (no mean, no bias) on the token embedding, before the
    positions are added. A LayerNorm of the sum loaded it without error and ran another
    model."""
    manifest = original_manifest(rms_embed=True)
    w = random_weights(manifest, seed=2)
    w["embed_norm.weight"] = np.linspace(0.5, 2.0, C).astype(np.float32)
    path = tmp_path / "rms.tinygpt"
    path.write_bytes(original_bytes({**CONFIG, "useEmbeddingRMSNorm": True}, manifest, w))
    np.testing.assert_allclose(our_logits(path), original_logits(w, IDS, rms_embed=True),
                               atol=2e-4)


def test_deepnorm_scales_the_residual_as_the_original_does(tmp_path):
    """useDeepNorm: each sub-layer adds to the residual times (2L)^(1/4); it loaded without
    error and ran without the scaling."""
    manifest = original_manifest()
    w = random_weights(manifest, seed=3)
    path = tmp_path / "deep.tinygpt"
    path.write_bytes(original_bytes({**CONFIG, "useDeepNorm": True}, manifest, w))
    np.testing.assert_allclose(our_logits(path), original_logits(w, IDS, deep_norm=True),
                               atol=2e-4)


def test_a_dense_model_that_states_one_expert_loads(tmp_path):
    """nExperts 1 is the original's dense model (MoE is nExperts > 1)."""
    manifest = original_manifest()
    w = random_weights(manifest, seed=4)
    path = tmp_path / "dense.tinygpt"
    path.write_bytes(original_bytes({**CONFIG, "nExperts": 1, "moeTopK": 1}, manifest, w))
    np.testing.assert_allclose(our_logits(path), original_logits(w, IDS), atol=2e-4)
    path.write_bytes(original_bytes({**CONFIG, "nExperts": 4}, manifest, w))
    with pytest.raises(ModelError, match="nExperts"):
        load(path)


@pytest.mark.parametrize("version", [1, 3, 0x02000000])
def test_other_versions_are_refused_in_one_line(tmp_path, version):
    manifest = original_manifest()
    data = bytearray(original_bytes(CONFIG, manifest, random_weights(manifest)))
    struct.pack_into("<I", data, 4, version)  # 0x02000000: version 2 written big-endian
    path = tmp_path / "v.tinygpt"
    path.write_bytes(bytes(data))
    with pytest.raises(ModelError) as e:
        load(path)
    assert f"version {version} is not supported" in str(e.value)
    assert "\n" not in str(e.value)


def independent_read(data: bytes):
    """A reader written from the format's description, sharing no code with ours."""
    assert data[:4] == b"TGPT"
    version, hlen = struct.unpack_from("<II", data, 4)
    header = json.loads(data[12 : 12 + hlen].decode("utf-8"))
    (step,) = struct.unpack_from("<i", data, 12 + hlen)
    body = data[16 + hlen :]
    weights, off = {}, 0
    training = header.get("weightDtype", "fp32") == "fp32" and \
        header.get("includesOptimizerState", True)
    for e in header["manifest"]:
        n = int(np.prod(e["shape"]))
        if training:
            flat = np.frombuffer(body, "<f4", n, off)
            off += 12 * n
        else:
            flat = np.frombuffer(body, "<f2", n, 2 * e["floatOffset"]).astype(np.float32)
            off += 2 * n
        shape = e["shape"]
        if len(shape) == 2 and "embedding" not in e["name"]:
            flat = flat.reshape(shape[1], shape[0]).T
        weights[e["name"]] = flat.reshape(shape)
    assert off == len(body)
    return version, header, step, weights


@pytest.mark.parametrize("layout", ["training", "inference"])
def test_what_we_write_parses_as_the_format_says(tmp_path, layout):
    manifest = original_manifest(rms_embed=True)
    w = random_weights(manifest, seed=5)
    config = {**CONFIG, "useEmbeddingRMSNorm": True, "tokenizerSource": "/tok/dir é"}
    f = fmt.TinyGPTFile(config=config, weights=w, layout=layout, step=2**31 - 1,
                        header={"sample": "héllo ✓", "savedAt": "now"})
    path = tmp_path / "ours.tinygpt"
    fmt.write(path, f)
    version, header, step, back = independent_read(path.read_bytes())
    assert version == 2 and step == 2**31 - 1
    assert header["config"] == config and header["sample"] == "héllo ✓"
    assert [e["name"] for e in header["manifest"]] == [n for n, _ in manifest]
    assert [e["shape"] for e in header["manifest"]] == [s for _, s in manifest]
    for name, _ in manifest:
        want = w[name] if layout == "training" else w[name].astype(np.float16).astype(np.float32)
        np.testing.assert_array_equal(back[name], want)


def test_an_embedding_norm_is_written_with_the_flag_the_original_builds_it_from(tmp_path):
    """The original's reader builds embed_norm from the config's flag, and skips a manifest
    tensor its model lacks: a file with the tensor and not the flag ran without the norm."""
    manifest = original_manifest(rms_embed=True)
    w = random_weights(manifest, seed=6)
    path = tmp_path / "ours.tinygpt"
    fmt.write(path, fmt.TinyGPTFile(config=dict(CONFIG), weights=w, layout="training"))
    _, header, _, _ = independent_read(path.read_bytes())
    assert header["config"]["useEmbeddingRMSNorm"] is True
    np.testing.assert_allclose(our_logits(path), original_logits(w, IDS, rms_embed=True),
                               atol=2e-4)
    path.write_bytes(original_bytes(CONFIG, manifest, w))  # the tensor, not the flag
    with pytest.raises(ModelError, match="embed_norm.weight but config does not say "
                                         "useEmbeddingRMSNorm"):
        load(path)
    path.write_bytes(original_bytes({**CONFIG, "useEmbeddingRMSNorm": True},
                                    original_manifest(), w))  # the flag, not the tensor
    with pytest.raises(ModelError, match="manifest lacks embed_norm.weight"):
        load(path)


def test_a_config_without_heads_runs_with_the_originals_eight(tmp_path):
    manifest = original_manifest()
    w = random_weights(manifest, seed=7)
    config = {k: v for k, v in CONFIG.items() if k != "heads"}
    path = tmp_path / "noheads.tinygpt"
    path.write_bytes(original_bytes(config, manifest, w))
    np.testing.assert_allclose(our_logits(path), original_logits(w, IDS, heads=8), atol=2e-4)


def test_weight_dtype_is_read_in_either_case_as_the_original_reads_it(tmp_path):
    """The original lowercases weightDtype: "FP16" was refused here as unsupported."""
    manifest = original_manifest()
    w = random_weights(manifest, seed=5)
    path = tmp_path / "upper.tinygpt"
    path.write_bytes(original_bytes(CONFIG, manifest, w, layout="inference",
                                    extra={"weightDtype": "FP16"}))
    f = fmt.read(path)
    assert f.layout == "inference"
    for name, _ in manifest:
        np.testing.assert_array_equal(f.weights[name], w[name].astype(np.float16))
