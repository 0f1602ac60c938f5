"""mlx_agent: run small language models as on-device agents with MLX.

Importing this package loads an optimized BLAS before MLX when MLX runs on the CPU (see
:mod:`mlx_agent.blas`; ``MLX_AGENT_BLAS=none`` turns it off). That is the one import-time
effect, and it must come first: MLX binds its BLAS when ``mlx.core`` is imported.
"""

from . import blas as _blas

_blas.activate()

__version__ = "0.1.0"
