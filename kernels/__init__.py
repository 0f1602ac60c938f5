"""Custom kernels: each with a pure-MLX reference beside it.

- :mod:`.bitmask`: a Metal kernel where Metal is available;
- :mod:`.qmatmul`: a CPU kernel, an MLX custom primitive in C++ (``csrc/``) compiled when the
  package is installed; where it did not build, the reference runs.

Each module follows one pattern: a factory that loads the kernel once (None where it cannot
run), a ``*_ops`` reference that documents the math, and a public function with
``use_kernel``. Kernels import only MLX.
"""

from .bitmask import apply_bitmask, apply_bitmask_ops
from .qmatmul import (KernelStatus, dequantize, dequantize_ops, kernel_status, quantized_matmul,
                      quantized_matmul_ops)

__all__ = ["apply_bitmask", "apply_bitmask_ops", "KernelStatus", "dequantize", "dequantize_ops",
           "kernel_status", "quantized_matmul", "quantized_matmul_ops"]
