"""SwiGLU, ``silu(gate) * up``, as one CPU primitive.

On the CPU, mlx-lm's ``swiglu`` (an ``mx.compile``'d ``nn.silu(gate) * up``) runs as a scalar
loop with a scalar ``exp`` on MLX's one evaluation thread. In a prefill chunk of the bundled
model that was about a quarter of the CPU time, with the other core idle while it ran. The
kernel (``csrc/activation.cpp``) computes the exponential sixteen lanes at a time and splits
the elements over the kernels' thread pool; the fused decode layer runs the same loop.

- :func:`swiglu`: the kernel for float32 inputs of one shape; :func:`swiglu_ops` (mlx-lm's)
  otherwise, which is also the reference the tests compare with.

Not promised: bit-identical results to MLX's ``sigmoid`` (another exp; they agree to
float32 rounding).
"""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.activations import swiglu as swiglu_ops

from .ext import extension


def swiglu(gate: mx.array, up: mx.array, use_kernel: bool = True) -> mx.array:
    ext = extension() if use_kernel else None
    if (ext is None or gate.dtype != mx.float32 or up.dtype != mx.float32
            or gate.shape != up.shape):
        return swiglu_ops(gate, up)
    return ext.swiglu(gate, up)
