"""Load an optimized BLAS into the process before MLX's CPU backend binds its own.

The Linux ``mlx[cpu]`` wheel bundles the reference (netlib) BLAS: a 1024x1024 float32
matmul runs at about 4 GFLOP/s on our 2-core x86_64 machine, against about 300 with Intel
MKL (see README, "The fast CPU path"). MLX calls ``cblas_sgemm`` through the dynamic
linker, so a library loaded with ``RTLD_GLOBAL`` *before* ``mlx.core`` is imported wins the
symbol lookup. Loaded afterwards it has no effect; :func:`activate` reports that case
instead of pretending.

Candidates, first found wins:
1. ``MLX_AGENT_BLAS``: a path to a shared library, or ``none`` to keep the bundled BLAS;
2. Intel MKL from PyPI (``libmkl_rt.so.*`` in this environment's ``lib/``), the default
   dependency on Linux x86_64;
3. Debian's ``libopenblas0-pthread``. Its CPU auto-detection picks a slow kernel on some
   virtual machines, so ``OPENBLAS_CORETYPE`` is set to ``Haswell`` when unset.

MKL's OpenMP runtime registers each process in ``/dev/shm/__KMP_REGISTERED_LIB_<pid>_<uid>``;
a process killed at the wrong moment leaves that file empty, and the next process to get
the same pid dies of SIGBUS when the runtime maps it (our killed tools and Ctrl-C'd runs left
25 such files on the test machine in a day, and CI saw "Bus error" in unrelated tests). A
file for this process's own pid and uid can only be such a leftover, so it is removed before
MKL loads (:func:`_clear_stale_registration`).

MKL's OpenMP threads spin for 200 ms after each call by default, so the first 200 ms of the
decode that follows a prefill shares the cores with them; ``KMP_BLOCKTIME`` is set to 0 (they
sleep at once) unless it is already set.

On macOS MLX uses Accelerate and Metal; nothing is loaded there. This module does not
promise a speed-up for quantized matmuls, which MLX computes without BLAS.
"""

from __future__ import annotations

import ctypes
import glob
import os
import sys
from dataclasses import dataclass
from pathlib import Path

ENV_VAR = "MLX_AGENT_BLAS"
_DEBIAN_OPENBLAS = "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0"


@dataclass(frozen=True)
class BlasStatus:
    name: str  # "mkl", "openblas", "custom", "bundled" or "accelerate"
    path: str | None
    note: str = ""

    def describe(self) -> str:
        where = f" ({self.path})" if self.path else ""
        note = f"; {self.note}" if self.note else ""
        return f"{self.name}{where}{note}"


_status: BlasStatus | None = None


def _mkl_candidates() -> list[str]:
    prefixes = {sys.prefix, sys.base_prefix, os.environ.get("CONDA_PREFIX", "")}
    found: list[str] = []
    for prefix in filter(None, prefixes):
        found += sorted(glob.glob(os.path.join(prefix, "lib", "libmkl_rt.so*")))
    return found


def _candidates() -> list[tuple[str, str]]:
    override = os.environ.get(ENV_VAR, "").strip()
    if override:
        return [] if override.lower() == "none" else [("custom", override)]
    out = [("mkl", p) for p in _mkl_candidates()]
    if os.path.exists(_DEBIAN_OPENBLAS):
        out.append(("openblas", _DEBIAN_OPENBLAS))
    return out


def _clear_stale_registration() -> None:
    """Remove the OpenMP registration file a dead process with this pid left (see above)."""
    uid = os.getuid() if hasattr(os, "getuid") else 0
    try:
        os.unlink(f"/dev/shm/__KMP_REGISTERED_LIB_{os.getpid()}_{uid}")
    except OSError:  # none (the usual case), or not ours to remove: MKL copes or says so
        pass


def activate() -> BlasStatus:
    """Load the best BLAS found (once per process) and return what is in use."""
    global _status
    if _status is not None:
        return _status
    if sys.platform == "darwin":
        _status = BlasStatus("accelerate", None)
        return _status
    if "mlx.core" in sys.modules:
        _status = BlasStatus(
            "bundled", None, "mlx was imported before mlx_agent; import mlx_agent first"
        )
        return _status
    errors = []
    for name, path in _candidates():
        if name == "openblas":
            os.environ.setdefault("OPENBLAS_CORETYPE", "Haswell")
        if name == "mkl":  # see KMP_BLOCKTIME and the registration file above
            os.environ.setdefault("KMP_BLOCKTIME", "0")
            _clear_stale_registration()
        try:
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        except OSError as e:
            errors.append(f"{path}: {e}")
            continue
        _status = BlasStatus(name, str(Path(path)))
        return _status
    note = "; ".join(errors) if errors else ""
    if os.environ.get(ENV_VAR, "").strip().lower() == "none":
        note = f"{ENV_VAR}=none"
    _status = BlasStatus("bundled", None, note or "no optimized BLAS found")
    return _status


def status() -> BlasStatus:
    return _status or activate()
