"""The compiled CPU kernels (``_ext``: MLX custom primitives in C++, ``kernels/csrc``, built
when the package is installed by setup.py) and whether they run in this process.

They do not run on Metal (MLX's own kernels run on the GPU there), where the build failed or
was skipped, when built against another MLX version than the one running (the C++ ABI is
MLX's), or with ``MLX_AGENT_KERNELS=0``. :func:`kernel_status` says which.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import mlx.core as mx

DISABLE_ENV = "MLX_AGENT_KERNELS"  # "0" turns the kernels off


@dataclass(frozen=True)
class KernelStatus:
    available: bool
    reason: str  # why not, when not available
    isa: str = ""
    threads: int = 0

    def describe(self) -> str:
        if self.available:
            return f"CPU kernel ({self.isa}, {self.threads} threads)"
        return f"pure MLX ({self.reason})"


@functools.cache
def _load() -> tuple[object | None, KernelStatus]:
    if os.environ.get(DISABLE_ENV, "").strip() == "0":
        return None, KernelStatus(False, f"kernels turned off by {DISABLE_ENV}=0")
    if mx.metal.is_available():
        return None, KernelStatus(False, "Metal runs MLX's own kernels")
    try:
        from . import _ext
    except ImportError as e:
        return None, KernelStatus(
            False, f"the C++ kernels are not built ({e}); reinstall with `pip install -e .`")
    if _ext.mlx_version != mx.__version__:
        return None, KernelStatus(
            False, f"kernels built for mlx {_ext.mlx_version}, running mlx {mx.__version__}; "
                   "reinstall with `pip install -e .`")
    return _ext, KernelStatus(True, "", isa=_ext.isa(), threads=_ext.threads())


def kernel_status() -> KernelStatus:
    """Whether the CPU kernels run in this process, and why not."""
    return _load()[1]


def extension():
    """The compiled module, or None where the CPU kernels do not run."""
    return _load()[0]
