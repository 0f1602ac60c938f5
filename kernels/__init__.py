"""Custom kernels: each with a pure-MLX reference beside it.

- :mod:`.bitmask`: a Metal kernel where Metal is available;
- :mod:`.qmatmul` (quantized matmul), :mod:`.norm_rope` (RMS norm, RoPE),
  :mod:`.activation` (SwiGLU) and :mod:`.attention` (decode and prefill attention): CPU
  kernels,
  MLX custom primitives in C++ (``csrc/``) compiled when the package is installed
  (:mod:`.ext` says whether they run); where they do not, the reference runs.

Each module follows one pattern: a factory that loads the kernel once (None where it cannot
run), a ``*_ops`` reference that documents the math, and a public function with
``use_kernel``. Kernels import only MLX.
"""

from .activation import swiglu, swiglu_ops
from .bitmask import apply_bitmask, apply_bitmask_ops
from .attention import attention
from .ext import KernelStatus, kernel_status
from .norm_rope import rms_norm, rope
from .qmatmul import (dequantize, dequantize_ops, quantized_matmul, quantized_matmul_ops,
                      quantized_matmuls)

__all__ = ["apply_bitmask", "apply_bitmask_ops", "attention", "KernelStatus", "dequantize", "dequantize_ops",
           "kernel_status", "quantized_matmul", "quantized_matmul_ops", "quantized_matmuls",
           "rms_norm", "rope", "swiglu", "swiglu_ops"]
