"""Shared fixtures: tiny random models built in the test, and the real bundled model."""

from __future__ import annotations

import mlx_agent  # noqa: F401  (loads the fast BLAS before mlx, as the CLI does)

import os

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models import llama

from mlx_agent.models import tinygpt
from mlx_agent.models.tinygpt_format import TinyGPTFile, expected_manifest

def files_cap(nbytes: int):
    """A ``preexec_fn``: in the child, files stop growing at ``nbytes`` (EFBIG, the signal
    ignored), as they do on a disk that fills."""
    def cap():
        import resource
        import signal

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, nbytes))
    return cap


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie nobody reaped yet counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return " Z " not in f.read().split(")")[-1][:4]
    except OSError:
        return True


def wait_for_line(path, proc, within: float = 120.0) -> str:
    """The text of ``path`` once a tool has written a whole line to it; fails when ``proc``
    (the command that runs the tool) ends first or ``within`` s pass."""
    import time

    deadline = time.monotonic() + within
    while not (path.exists() and path.read_text().endswith("\n")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    return path.read_text()


TINY_LLAMA = dict(
    model_type="llama", hidden_size=64, num_hidden_layers=2, intermediate_size=128,
    num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=97,
    rope_traditional=True, tie_word_embeddings=True, max_position_embeddings=256,
)
TINY_GPT_CONFIG = {"layers": 2, "dModel": 32, "ctx": 64, "heads": 4, "dMlp": 64}


def make_tiny_llama(seed: int = 0):
    mx.random.seed(seed)
    model = llama.Model(llama.ModelArgs(**TINY_LLAMA))
    model.set_dtype(mx.float32)
    mx.eval(model.parameters())
    return model


def random_tinygpt_file(config=None, seed: int = 0, layout="inference", embed_norm=False):
    config = dict(config or TINY_GPT_CONFIG)
    if embed_norm:
        config["useEmbeddingRMSNorm"] = True
    rng = np.random.default_rng(seed)
    weights = {
        name: (rng.standard_normal(shape) * (0.2 if len(shape) == 2 else 0.05)
               + (1.0 if name.endswith("weight") and len(shape) == 1 else 0.0)).astype(np.float32)
        for name, shape in expected_manifest(config)
    }
    return TinyGPTFile(config=config, weights=weights, layout=layout, header={"name": "tiny"})


def make_tiny_gpt(seed: int = 0):
    f = random_tinygpt_file(seed=seed)
    model = tinygpt.Model(tinygpt.ModelArgs.from_config(f.config))
    model.load_weights(list(model.sanitize({k: mx.array(v) for k, v in f.weights.items()}).items()))
    mx.eval(model.parameters())
    return model


@pytest.fixture(scope="session", autouse=True)
def cache_key_file(tmp_path_factory):
    """Tests (and the CLIs they start) authenticate cache files with a key of their own, not
    the user's ~/.config/mlx_agent/cache.key."""
    from mlx_agent.user_key import ENV

    path = tmp_path_factory.mktemp("key") / "cache.key"
    before = os.environ.get(ENV)
    os.environ[ENV] = str(path)
    yield path
    if before is None:
        os.environ.pop(ENV, None)
    else:
        os.environ[ENV] = before


@pytest.fixture(params=["llama", "tinygpt"])
def tiny_model(request):
    return make_tiny_llama() if request.param == "llama" else make_tiny_gpt()


@pytest.fixture(scope="session")
def real_model():
    from mlx_agent.models import load

    return load("smollm2-135m")


@pytest.fixture(scope="session")
def tiny_lm(real_model):
    """A random one-layer llama behind SmolLM2's tokenizer and chat format: the real
    tokenization and templates, a model fast enough for exhaustive tests."""
    from dataclasses import replace

    import msgspec

    mx.random.seed(0)
    args = llama.ModelArgs(model_type="llama", hidden_size=32, num_hidden_layers=1,
                           intermediate_size=64, num_attention_heads=2, num_key_value_heads=1,
                           rms_norm_eps=1e-5, vocab_size=49152, tie_word_embeddings=True)
    model = llama.Model(args)
    mx.eval(model.parameters())
    identity = msgspec.structs.replace(real_model.identity, kv_heads=1, head_dim=16, num_layers=1,
                                       name="tiny-smol")
    return replace(real_model, model=model, context_length=2048, identity=identity)
