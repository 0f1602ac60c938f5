#include "activation.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "pool.h"
#include "primitive.h"
#include "simd16.h"
#include "widen.h"

namespace mlx_agent {

namespace {

constexpr size_t kPerTask = 16384;  // elements a pool task takes (64 KB of each input)

void check(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("[mlx_agent.swiglu] " + what);
}

template <simd16::Regs R>
MLX_AGENT_CLONES void swiglu_clones(const float* g, const float* u, float* out, size_t n) {
  using namespace simd16;
  using Vt = V<R>;
  using F = typename Vt::F;
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    Vt gv = load<Vt>(g + i);
    const Vt uv = load<Vt>(u + i);
    for (int k = 0; k < Vt::P; ++k) {  // sigmoid(x) from exp(-|x|), which cannot overflow
      const F x = gv.p[k];
      const F e = exp_native<F, typename Vt::N::I>(x < 0.0f ? x : -x);
      gv.p[k] = x * (x < 0.0f ? e / (1.0f + e) : 1.0f / (1.0f + e)) * uv.p[k];
    }
    store(out + i, gv);
  }
  for (; i < n; ++i) out[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}

}  // namespace

void swiglu_span(const float* g, const float* u, float* out, size_t n) {
  with_regs([&]<simd16::Regs R>() { swiglu_clones<R>(g, u, out, n); });
}

mx::array swiglu(const mx::array& gate, const mx::array& up, mx::StreamOrDevice s) {
  check(gate.dtype() == mx::float32 && up.dtype() == mx::float32, "gate and up must be float32");
  check(gate.shape() == up.shape(), "gate and up must have the same shape");
  auto stream = mx::to_stream(s, mx::Device::cpu);
  return mx::array(gate.shape(), mx::float32, std::make_shared<SwiGLU>(stream),
                   {mx::contiguous(gate, false, stream), mx::contiguous(up, false, stream)});
}

void SwiGLU::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  const auto& g = inputs[0];
  const auto& u = inputs[1];
  check(g.flags().row_contiguous && u.flags().row_contiguous, "inputs must be contiguous");
  begin_eval(stream(), inputs, out).dispatch([g = mx::array::unsafe_weak_copy(g), u = mx::array::unsafe_weak_copy(u), out = mx::array::unsafe_weak_copy(out)]() mutable {
    const size_t n = out.size();
    const int tasks = static_cast<int>((n + kPerTask - 1) / kPerTask);
    const float* gp = g.data<float>();
    const float* up = u.data<float>();
    float* op = out.data<float>();
    pool().run(tasks, [&](int t) {
      const size_t i0 = static_cast<size_t>(t) * kPerTask, i1 = std::min(n, i0 + kPerTask);
      swiglu_span(gp + i0, up + i0, op + i0, i1 - i0);
    });
  });
}

void SwiGLU::eval_gpu(const std::vector<mx::array>&, mx::array&) {
  throw std::runtime_error("[mlx_agent.swiglu] runs on the CPU only");
}

}  // namespace mlx_agent
