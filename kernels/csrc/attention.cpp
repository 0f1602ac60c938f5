#include "attention.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "mlx/backend/cpu/encoder.h"
#include "pool.h"

// Plain loops, vectorised by the compiler for each instruction set and picked at load time.
#if defined(__x86_64__) && defined(__linux__)
#define MLX_AGENT_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define MLX_AGENT_CLONES
#endif

namespace mlx_agent {

namespace {

void check(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("[mlx_agent.decode_attention] " + what);
}

struct Head {
  const float* q;   // [D]
  const float* k;   // row t at k + t * k_row
  const float* v;   // row t at v + t * v_row
  float* out;       // [Dv]
  int64_t k_row, v_row;
  int T, D, Dv;
  float scale;
};

MLX_AGENT_CLONES void attend(const Head& h, std::vector<float>& p) {
  p.resize(h.T);
  float top = -INFINITY;
  for (int t = 0; t < h.T; ++t) {
    const float* kt = h.k + t * h.k_row;
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int i = 0; i < h.D; ++i) s += h.q[i] * kt[i];
    p[t] = s * h.scale;
    top = std::max(top, p[t]);
  }
  float total = 0.0f;
  for (int t = 0; t < h.T; ++t) {
    p[t] = std::exp(p[t] - top);
    total += p[t];
  }
  std::fill(h.out, h.out + h.Dv, 0.0f);
  for (int t = 0; t < h.T; ++t) {
    const float* vt = h.v + t * h.v_row;
    const float w = p[t] / total;
#pragma omp simd
    for (int i = 0; i < h.Dv; ++i) h.out[i] += w * vt[i];
  }
}

}  // namespace

mx::array decode_attention(const mx::array& q, const mx::array& k, const mx::array& v,
                           float scale, mx::StreamOrDevice s) {
  check(q.ndim() == 4 && k.ndim() == 4 && v.ndim() == 4, "q, k and v must be 4-D");
  check(q.dtype() == mx::float32 && k.dtype() == mx::float32 && v.dtype() == mx::float32,
        "q, k and v must be float32");
  check(q.shape(2) == 1, "one query position only");
  check(k.shape(0) == q.shape(0) && v.shape(0) == q.shape(0), "batch sizes differ");
  check(k.shape(1) == v.shape(1) && k.shape(1) > 0 && q.shape(1) % k.shape(1) == 0,
        "query heads must be a multiple of key/value heads");
  check(k.shape(2) == v.shape(2) && k.shape(2) > 0, "keys and values must have the same length");
  check(q.shape(3) == k.shape(3), "q and k head sizes differ");
  auto stream = mx::to_stream(s, mx::Device::cpu);
  return mx::array({q.shape(0), q.shape(1), 1, v.shape(3)}, mx::float32,
                   std::make_shared<DecodeAttention>(stream, scale), {q, k, v});
}

void DecodeAttention::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  const auto& q = inputs[0];
  const auto& k = inputs[1];
  const auto& v = inputs[2];
  for (const auto& a : inputs) check(a.strides().back() == 1, "head dimensions must be contiguous");
  out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& encoder = mx::cpu::get_command_encoder(stream());
  for (const auto& a : inputs) encoder.set_input_array(a);
  encoder.set_output_array(out);
  encoder.dispatch([q, k, v, out, scale = scale_]() mutable {
    const int B = q.shape(0), Hq = q.shape(1), Hkv = k.shape(1), group = Hq / Hkv;
    const int T = k.shape(2), D = q.shape(3), Dv = v.shape(3);
    auto run = [&](int task) {
      thread_local std::vector<float> p;
      const int b = task / Hq, h = task % Hq, kvh = h / group;
      Head head{q.data<float>() + b * q.strides(0) + h * q.strides(1),
                k.data<float>() + b * k.strides(0) + kvh * k.strides(1),
                v.data<float>() + b * v.strides(0) + kvh * v.strides(1),
                out.data<float>() + static_cast<size_t>(task) * Dv,
                k.strides(2), v.strides(2), T, D, Dv, scale};
      attend(head, p);
    };
    if (static_cast<int64_t>(T) * D * B * Hq < (1 << 16)) {
      for (int t = 0; t < B * Hq; ++t) run(t);  // too little work to hand out
    } else {
      pool().run(B * Hq, run);
    }
  });
}

void DecodeAttention::eval_gpu(const std::vector<mx::array>&, mx::array&) {
  throw std::runtime_error("[mlx_agent.decode_attention] runs on the CPU only");
}

}  // namespace mlx_agent
