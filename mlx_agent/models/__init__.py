"""Load a model from any spec: a GGUF file, a Hugging Face directory, a ``.tinygpt`` file or a name.

:func:`load` returns a :class:`LoadedModel`: the MLX module, the tokenizer (mlx-lm's
``TokenizerWrapper``), the chat format, the stop token ids, the context length, and a
:class:`ModelIdentity` that caches key on. Every user error (missing path, unknown format,
corrupt file, unsupported architecture) raises :class:`ModelError` with a one-line message.

On Metal quantized weights stay quantized. On a CPU they stay quantized too when the CPU
kernel runs (:mod:`mlx_agent.models.cpu_layers`: GGUF Q4_0, Q4_1 and Q8_0 blocks as loaded);
where it does not, they are dequantized to float32 by default: with an optimized BLAS
(:mod:`mlx_agent.blas`) that is several times faster than MLX's CPU quantized matmul (see
README). ``weights=`` forces either; :func:`weight_path` says which path runs and why.

Names resolve through :mod:`.registry`, which imports nothing heavy (the command line reads
its defaults for ``--help``; settings such as the shipped adapters' directory are patched
there); the loader (:mod:`.loader`) is imported when :func:`load`, :class:`LoadedModel` or
:func:`weight_path` is first read. Not promised: downloading anything. A name resolves only
to files already installed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import exports
from .identity import ModelIdentity
from .registry import (DEFAULT_MODEL, MODEL_ENV, NAMED_MODELS, WEIGHT_FORMATS, WEIGHTS_ENV,
                       ModelError, default_adapter, default_spec, resolve)

if TYPE_CHECKING:
    from .loader import LoadedModel, load, resolve_weight_format, weight_path

__all__ = ["LoadedModel", "ModelError", "ModelIdentity", "load", "resolve", "default_spec",
           "DEFAULT_MODEL", "NAMED_MODELS", "WEIGHT_FORMATS", "weight_path"]
__getattr__, __dir__ = exports(__name__, dict.fromkeys(
    ["LoadedModel", "load", "resolve_weight_format", "weight_path"], ".loader"))
