"""Package attributes imported when first read (PEP 562).

A package whose ``__init__`` imports its submodules makes every ``import`` of one light part
pay for all of them: reading the default of ``--max-steps`` would import MLX, mlx-lm and
transformers (about 2.5 s) before ``mlx_agent --help`` could print. :func:`exports` gives a
package a module ``__getattr__`` instead, so ``from mlx_agent.models import load`` still
works and imports the loader only then. Type checkers see the names through the package's
``if TYPE_CHECKING:`` imports.
"""

from __future__ import annotations

import importlib
import sys
from typing import Callable


def exports(package: str, where: dict[str, str]) -> tuple[Callable, Callable]:
    """``__getattr__`` and ``__dir__`` for ``package``: each name of ``where`` is read from
    the submodule it maps to (relative, such as ``".loop"``) on first use, then kept."""
    module = sys.modules[package]

    def __getattr__(name: str):
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(where[name], package), name)
        setattr(module, name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(module)) | set(where))

    return __getattr__, __dir__
