#include "norm_rope.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "mlx/backend/common/utils.h"
#include "pool.h"
#include "primitive.h"

namespace mlx_agent {

namespace {

void check(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("[mlx_agent] " + what);
}

// Where row r (of the last dimension's length) of x starts, for x whose last dimension is
// contiguous; rows are read through x's strides, so transposed views need no copy.
size_t row_start(const mx::array& x, size_t r) {
  if (x.flags().row_contiguous) return r * x.shape(-1);
  return mx::elem_to_loc(r * x.shape(-1), x.shape(), x.strides());
}

mx::cpu::CommandEncoder& setup(const mx::Stream& stream, const std::vector<mx::array>& inputs,
                               mx::array& out) {
  check(inputs[0].strides().back() == 1 || inputs[0].shape(-1) == 1,
        "the last dimension must be contiguous");
  return begin_eval(stream, inputs, out);
}

}  // namespace

void rms_norm_row(const float* x, const float* weight, float eps, size_t D, float* out) {
  float ss = 0.0f;
  for (size_t i = 0; i < D; ++i) ss += x[i] * x[i];
  const float inv = 1.0f / std::sqrt(ss / static_cast<float>(D) + eps);
  for (size_t i = 0; i < D; ++i) out[i] = weight[i] * (x[i] * inv);
}

RopeTable::RopeTable(int dims, float base, float scale, int position)
    : cos(dims / 2), sin(dims / 2) {
  const int half = dims / 2;
  for (int i = 0; i < half; ++i) {
    const float inv_freq = std::exp(-static_cast<float>(i) * (std::log(base) / half));
    const float theta = scale * static_cast<float>(position) * inv_freq;
    cos[i] = std::cos(theta);
    sin[i] = std::sin(theta);
  }
}

void rope_row(float* v, bool traditional, const RopeTable& t) {
  const size_t half = t.cos.size();
  for (size_t i = 0; i < half; ++i) {
    const size_t a = traditional ? 2 * i : i, b = traditional ? 2 * i + 1 : i + half;
    const float xa = v[a], xb = v[b];
    v[a] = xa * t.cos[i] - xb * t.sin[i];
    v[b] = xa * t.sin[i] + xb * t.cos[i];
  }
}

mx::array rms_norm(const mx::array& x, const mx::array& weight, float eps,
                   mx::StreamOrDevice s) {
  check(x.dtype() == mx::float32 && weight.dtype() == mx::float32, "rms_norm takes float32");
  check(x.ndim() >= 1 && weight.ndim() == 1 && weight.shape(0) == x.shape(-1),
        "weight must be [D] for x [..., D]");
  auto stream = mx::to_stream(s, mx::Device::cpu);
  return mx::array(x.shape(), mx::float32, std::make_shared<RMSNormCPU>(stream, eps),
                   {x, weight});
}

void RMSNormCPU::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  check(inputs[1].flags().row_contiguous, "the weight must be contiguous");
  const auto& x = inputs[0];
  const auto& w = inputs[1];
  setup(stream(), inputs, out).dispatch([x = mx::array::unsafe_weak_copy(x), w = mx::array::unsafe_weak_copy(w), out = mx::array::unsafe_weak_copy(out), eps = eps_]() mutable {
    const size_t D = x.shape(-1), rows = D ? x.size() / D : 0;
    const float* src = x.data<float>();
    float* dst = out.data<float>();
    constexpr size_t kRowsPerTask = 64;  // a prefill chunk's rows split over the pool
    pool().run(static_cast<int>((rows + kRowsPerTask - 1) / kRowsPerTask), [&](int t) {
      for (size_t r = t * kRowsPerTask; r < std::min(rows, (t + 1) * kRowsPerTask); ++r)
        rms_norm_row(src + row_start(x, r), w.data<float>(), eps, D, dst + r * D);
    });
  });
}

void RMSNormCPU::eval_gpu(const std::vector<mx::array>&, mx::array&) {
  throw std::runtime_error("[mlx_agent.rms_norm] runs on the CPU only");
}

mx::array rope(const mx::array& x, int dims, bool traditional, float base, float scale,
               int offset, mx::StreamOrDevice s) {
  check(x.dtype() == mx::float32, "rope takes float32");
  check(x.ndim() >= 2, "rope needs x [..., L, D]");
  check(dims > 0 && dims % 2 == 0 && dims <= x.shape(-1), "dims must be even and at most D");
  check(offset >= 0, "the offset must not be negative");
  auto stream = mx::to_stream(s, mx::Device::cpu);
  return mx::array(x.shape(), mx::float32,
                   std::make_shared<RoPECPU>(stream, dims, traditional, base, scale, offset),
                   {x});
}

void RoPECPU::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  const auto& x = inputs[0];
  setup(stream(), inputs, out).dispatch(
      [x = mx::array::unsafe_weak_copy(x), out = mx::array::unsafe_weak_copy(out), dims = dims_, trad = traditional_, base = base_, scale = scale_,
       offset = offset_]() mutable {
        const size_t D = x.shape(-1), L = x.shape(-2), rows = x.size() / D;
        std::vector<RopeTable> tables;  // one per position of the L
        for (size_t l = 0; l < L; ++l)
          tables.emplace_back(dims, base, scale, offset + static_cast<int>(l));
        const float* src = x.data<float>();
        float* dst = out.data<float>();
        for (size_t r = 0; r < rows; ++r) {
          float* yr = dst + r * D;
          std::copy_n(src + row_start(x, r), D, yr);
          rope_row(yr, trad, tables[r % L]);
        }
      });
}

void RoPECPU::eval_gpu(const std::vector<mx::array>&, mx::array&) {
  throw std::runtime_error("[mlx_agent.rope] runs on the CPU only");
}

}  // namespace mlx_agent
