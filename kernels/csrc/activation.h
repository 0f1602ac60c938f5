// SwiGLU, silu(gate) * up, as one CPU primitive. On the CPU, MLX runs mlx-lm's compiled
// swiglu as a scalar loop with a scalar exp on its one evaluation thread: in a prefill chunk
// that took about a quarter of the CPU time, while the other core waited.
#pragma once

#include <cstddef>

#include "mlx/ops.h"
#include "mlx/primitives.h"

namespace mlx_agent {

namespace mx = mlx::core;

// silu(gate) * up for float32 gate and up of one shape; split over the kernels' pool.
mx::array swiglu(const mx::array& gate, const mx::array& up, mx::StreamOrDevice s = {});

// out[i] = silu(g[i]) * u[i] for i < n, sixteen at a time: sigmoid from exp(-|g|), so the
// exponential never overflows. The loop the primitive and the fused decode layer run.
void swiglu_span(const float* g, const float* u, float* out, size_t n);

class SwiGLU : public mx::UnaryPrimitive {
 public:
  explicit SwiGLU(mx::Stream stream) : mx::UnaryPrimitive(stream) {}
  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  void eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  const char* name() const override { return "MlxAgentSwiGLU"; }
  bool is_equivalent(const mx::Primitive&) const override { return true; }
};

}  // namespace mlx_agent
