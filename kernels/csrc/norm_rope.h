// RMS norm and RoPE as single CPU primitives. On the CPU, mx.fast.rms_norm and mx.fast.rope
// run as their composed fallbacks (a dozen graph nodes each, 60 of each per decoded token on
// the bundled model); one node each cuts the per-token graph overhead.
#pragma once

#include <vector>

#include "mlx/ops.h"
#include "mlx/primitives.h"

namespace mlx_agent {

namespace mx = mlx::core;

// x * rsqrt(mean(x^2, -1) + eps) * weight, in float32, for float32 x.
mx::array rms_norm(const mx::array& x, const mx::array& weight, float eps,
                   mx::StreamOrDevice s = {});

// mx.fast.rope for float32 x [..., L, D] and an integer offset: the first `dims` features
// rotated, pairs adjacent (traditional) or split in halves.
mx::array rope(const mx::array& x, int dims, bool traditional, float base, float scale,
               int offset, mx::StreamOrDevice s = {});

// The loops both the primitives here and the fused decode blocks run.

// out = x * rsqrt(mean(x^2) + eps) * weight for one row of D values.
void rms_norm_row(const float* x, const float* weight, float eps, size_t D, float* out);

// RoPE's cos and sin at one position: pair i's angle is (scale * position) * base^(-i / half),
// as MLX computes it.
struct RopeTable {
  std::vector<float> cos, sin;
  RopeTable(int dims, float base, float scale, int position);
};

// One vector's first `dims` features (2 * table size) rotated in place: pairs adjacent
// (traditional) or split in halves; the rest left as they are.
void rope_row(float* v, bool traditional, const RopeTable& t);

class RMSNormCPU : public mx::UnaryPrimitive {
 public:
  RMSNormCPU(mx::Stream stream, float eps) : mx::UnaryPrimitive(stream), eps_(eps) {}
  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  void eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  const char* name() const override { return "MlxAgentRMSNorm"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    return eps_ == static_cast<const RMSNormCPU&>(other).eps_;
  }

 private:
  float eps_;
};

class RoPECPU : public mx::UnaryPrimitive {
 public:
  RoPECPU(mx::Stream stream, int dims, bool traditional, float base, float scale, int offset)
      : mx::UnaryPrimitive(stream), dims_(dims), traditional_(traditional), base_(base),
        scale_(scale), offset_(offset) {}
  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  void eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  const char* name() const override { return "MlxAgentRoPE"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    auto& o = static_cast<const RoPECPU&>(other);
    return dims_ == o.dims_ && traditional_ == o.traditional_ && base_ == o.base_ &&
           scale_ == o.scale_ && offset_ == o.offset_;
  }

 private:
  int dims_;
  bool traditional_;
  float base_, scale_;
  int offset_;
};

}  // namespace mlx_agent
