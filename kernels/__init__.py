"""Custom kernels: a Metal kernel where Metal is available, a pure-MLX reference elsewhere.

Each module follows one pattern: a factory that builds the kernel once (None off Metal), a
``*_ops`` reference that documents the math, and a public function with ``use_kernel``.
Kernels import only MLX.
"""

from .bitmask import apply_bitmask, apply_bitmask_ops

__all__ = ["apply_bitmask", "apply_bitmask_ops"]
