// A llama decoder layer's decode step in two CPU primitives around the attention, instead of
// about twenty graph nodes: on the CPU a node costs microseconds of scheduling, allocation
// and Python, and a decoded token of the bundled model runs 30 layers.
//
//   attention_inputs: rms_norm -> q, k, v projections -> RoPE (q, k) -> k, v in the cache's
//                     dtype; outputs q [B, H, 1, D] and k, v [B, KVH, 1, D]
//   layer_tail:       h = x + o_proj(attn); h + down(silu(gate(n)) * up(n)), n = rms_norm(h)
//
// The cache update and the attention between them stay as they are (mlx-lm's cache, the
// attention kernel), so every cache keeps its own semantics. Each projection is the
// quantized matmul kernel's (run_matmuls); the arithmetic is the separate kernels', so
// results agree with them to float32 rounding.
#pragma once

#include <optional>
#include <vector>

#include "mlx/ops.h"
#include "mlx/primitives.h"

namespace mlx_agent {

namespace mx = mlx::core;

struct RopeSpec {
  int dims;
  bool traditional;
  float base, scale;
  int offset;
};

// x [B, 1, E] float32; norm [E]; qkv: w, scales, biases of q, k and v in that order (MLX
// affine layout, group size 32), bits of each. B at most 16. With `offsets` ([B] integers: a
// batch's rows at their own positions, as mlx-lm's BatchKVCache keeps them), row b's RoPE
// position is offsets[b] instead of rope.offset. `lora` holds a LoRA adapter's A [E, r] and
// B [r, N] for each projection listed in `lora_targets` (0: q, 1: k, 2: v), which then adds
// lora_scales[i] * (n @ A) @ B to it before RoPE, as mlx-lm's LoRALinear does.
std::vector<mx::array> attention_inputs(const mx::array& x, const mx::array& norm, float eps,
                                        const std::vector<mx::array>& qkv,
                                        const std::vector<int>& bits, int n_heads,
                                        int n_kv_heads, RopeSpec rope, mx::Dtype kv_dtype,
                                        const std::optional<mx::array>& offsets = std::nullopt,
                                        const std::vector<mx::array>& lora = {},
                                        const std::vector<int>& lora_targets = {},
                                        const std::vector<float>& lora_scales = {},
                                        const std::vector<mx::array>& packed = {},
                                        mx::StreamOrDevice s = {});

// attn [B, 1, H * D] and x [B, 1, E] float32; weights: w, scales, biases of o, gate, up and
// down in that order; bits of each; packed: none, or each W packed (quantized_matmul's).
mx::array layer_tail(const mx::array& attn, const mx::array& x, const mx::array& norm, float eps,
                     const std::vector<mx::array>& weights, const std::vector<int>& bits,
                     const std::vector<mx::array>& packed = {}, mx::StreamOrDevice s = {});

class AttentionInputs : public mx::Primitive {
 public:
  AttentionInputs(mx::Stream stream, float eps, std::vector<int> bits, int n_heads,
                  int n_kv_heads, RopeSpec rope, mx::Dtype kv_dtype, bool has_offsets,
                  std::vector<int> lora_targets, std::vector<float> lora_scales)
      : mx::Primitive(stream), eps_(eps), bits_(std::move(bits)), n_heads_(n_heads),
        n_kv_heads_(n_kv_heads), rope_(rope), kv_dtype_(kv_dtype), has_offsets_(has_offsets),
        lora_targets_(std::move(lora_targets)), lora_scales_(std::move(lora_scales)) {}
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  void eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  const char* name() const override { return "MlxAgentAttentionInputs"; }
  bool is_equivalent(const mx::Primitive& other) const override;

 private:
  float eps_;
  std::vector<int> bits_;
  int n_heads_, n_kv_heads_;
  RopeSpec rope_;
  mx::Dtype kv_dtype_;
  bool has_offsets_;
  std::vector<int> lora_targets_;
  std::vector<float> lora_scales_;
};

class LayerTail : public mx::UnaryPrimitive {
 public:
  LayerTail(mx::Stream stream, float eps, std::vector<int> bits)
      : mx::UnaryPrimitive(stream), eps_(eps), bits_(std::move(bits)) {}
  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  void eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  const char* name() const override { return "MlxAgentLayerTail"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    auto& o = static_cast<const LayerTail&>(other);
    return eps_ == o.eps_ && bits_ == o.bits_;
  }

 private:
  float eps_;
  std::vector<int> bits_;
};

}  // namespace mlx_agent
