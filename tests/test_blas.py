"""The BLAS loaded before MLX: MKL's OpenMP registration file a killed process left."""

from __future__ import annotations

import subprocess
import sys

import pytest

from mlx_agent import blas


@pytest.mark.skipif(blas.status().name != "mkl", reason="MKL is not the BLAS here")
def test_a_dead_processs_empty_registration_file_is_no_bus_error():
    """A process killed while MKL's OpenMP runtime registered it leaves
    /dev/shm/__KMP_REGISTERED_LIB_<pid>_<uid> empty; the next process with that pid died of
    SIGBUS when the runtime mapped it (CI saw "Bus error" in unrelated tests)."""
    child = """if True:
        import os
        # the leftover, for this very pid, as a killed process with it leaves it
        open(f"/dev/shm/__KMP_REGISTERED_LIB_{os.getpid()}_{os.getuid()}", "w").close()
        import mlx_agent  # loads MKL before mlx
        import mlx.core as mx
        a = mx.ones((256, 256))
        print(float((a @ a).sum()))
    """
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, (out.returncode, out.stderr)  # was -7: SIGBUS
    assert out.stdout.strip() == str(256.0 ** 3)
