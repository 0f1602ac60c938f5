// Attention for one query position (decode) as a single CPU primitive: on the CPU,
// mx.fast.scaled_dot_product_attention runs as its composed fallback (about ten graph nodes
// per layer and token with grouped heads).
#pragma once

#include <optional>

#include "mlx/ops.h"
#include "mlx/primitives.h"

namespace mlx_agent {

namespace mx = mlx::core;

// softmax(scale * q k^T) v for float32 q [B, Hq, 1, D], k [B, Hkv, T, D], v [B, Hkv, T, Dv]
// (both float32 or both float16), Hq a multiple of Hkv (grouped-query attention), D and Dv
// multiples of 16. No mask, or with ``starts`` (integers [B]) row b attends keys
// [starts[b], T) only: a left-padded batch's rows. k and v may be views with strided rows
// (a preallocated cache's slice). Output float32.
mx::array decode_attention(const mx::array& q, const mx::array& k, const mx::array& v,
                           float scale, const std::optional<mx::array>& starts = std::nullopt,
                           mx::StreamOrDevice s = {});

class DecodeAttention : public mx::UnaryPrimitive {
 public:
  DecodeAttention(mx::Stream stream, float scale) : mx::UnaryPrimitive(stream), scale_(scale) {}
  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  void eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  const char* name() const override { return "MlxAgentDecodeAttention"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    return scale_ == static_cast<const DecodeAttention&>(other).scale_;
  }

 private:
  float scale_;
};

// Causal attention of a prefill chunk: q [B, Hq, L, D] holds the last L of the T positions in
// k and v (T >= L), and query i sees keys [0, T - L + i]; otherwise as decode_attention.
mx::array prefill_attention(const mx::array& q, const mx::array& k, const mx::array& v,
                            float scale, mx::StreamOrDevice s = {});

class PrefillAttention : public mx::UnaryPrimitive {
 public:
  PrefillAttention(mx::Stream stream, float scale) : mx::UnaryPrimitive(stream), scale_(scale) {}
  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  void eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  const char* name() const override { return "MlxAgentPrefillAttention"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    return scale_ == static_cast<const PrefillAttention&>(other).scale_;
  }

 private:
  float scale_;
};

}  // namespace mlx_agent
