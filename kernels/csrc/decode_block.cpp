#include "decode_block.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "mlx/backend/common/utils.h"
#include "mlx/backend/cpu/encoder.h"
#include "activation.h"
#include "norm_rope.h"
#include "qmatmul.h"
#include "qmatmul_rows.h"
#include "simd16.h"

namespace mlx_agent {

namespace {

constexpr int kMaxRows = 16;  // the matmul kernel's rows (decode, small batches)

void check(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("[mlx_agent.decode_block] " + what);
}

// rms_norm_row for each of M rows.
void rms_norm_rows(const float* x, const float* w, float eps, int M, int E, float* out) {
  for (int r = 0; r < M; ++r)
    rms_norm_row(x + static_cast<size_t>(r) * E, w, eps, E, out + static_cast<size_t>(r) * E);
}

// rope_row for each of `rows` vectors of D features.
void rope_rows(float* x, int rows, int D, bool traditional, const RopeTable& t) {
  for (int r = 0; r < rows; ++r) rope_row(x + static_cast<size_t>(r) * D, traditional, t);
}

// A LoRA adapter on one projection: y += scale * (n @ A) @ B.
struct Lora {
  int target, rank;
  float scale;
  const float* a;  // [E, rank]
  const float* b;  // [rank, N]
};

void add_lora(const float* n, int M, int E, const Lora& l, const QProblem& p) {
  std::vector<float> t(l.rank);
  for (int m = 0; m < M; ++m) {
    std::fill(t.begin(), t.end(), 0.0f);
    for (int e = 0; e < E; ++e) {
      const float v = n[static_cast<size_t>(m) * E + e];
      const float* row = l.a + static_cast<size_t>(e) * l.rank;
      for (int j = 0; j < l.rank; ++j) t[j] += v * row[j];
    }
    float* y = p.y + static_cast<size_t>(m) * p.N;
    for (int k = 0; k < p.N; ++k) {
      float z = 0.0f;
      for (int j = 0; j < l.rank; ++j) z += t[j] * l.b[static_cast<size_t>(j) * p.N + k];
      y[k] += l.scale * z;
    }
  }
}

// The inputs after the activations: each matrix's w, scales and biases; returns each one's
// (N, K).
std::vector<std::pair<int, int>> add_weights(std::vector<mx::array>& inputs,
                                             const std::vector<mx::array>& weights,
                                             const std::vector<int>& bits, mx::Stream stream) {
  check(weights.size() == 3 * bits.size(), "three arrays (w, scales, biases) per matrix");
  std::vector<std::pair<int, int>> shapes;
  for (size_t i = 0; i < bits.size(); ++i) {
    const auto &w = weights[3 * i], &s = weights[3 * i + 1], &b = weights[3 * i + 2];
    shapes.emplace_back(w.shape(0), check_weights(w, s, b, bits[i]));
    inputs.insert(inputs.end(), {w, as_param(s, stream), as_param(b, stream)});
  }
  return shapes;
}

void check_activations(const mx::array& x, const mx::array& norm, int E) {
  check(x.dtype() == mx::float32 && norm.dtype() == mx::float32, "activations are float32");
  check(x.ndim() == 3 && x.shape(1) == 1 && x.shape(0) <= kMaxRows,
        "x must be [B, 1, E] with B at most 16");
  check(norm.ndim() == 1 && norm.shape(0) == E && x.shape(2) == E, "norm must be [E]");
}

}  // namespace

std::vector<mx::array> attention_inputs(const mx::array& x, const mx::array& norm, float eps,
                                        const std::vector<mx::array>& qkv,
                                        const std::vector<int>& bits, int n_heads,
                                        int n_kv_heads, RopeSpec rope, mx::Dtype kv_dtype,
                                        const std::optional<mx::array>& offsets,
                                        const std::vector<mx::array>& lora,
                                        const std::vector<int>& lora_targets,
                                        const std::vector<float>& lora_scales,
                                        const std::vector<mx::array>& packed,
                                        mx::StreamOrDevice s) {
  auto stream = mx::to_stream(s, mx::Device::cpu);
  check(bits.size() == 3, "q, k and v");
  std::vector<mx::array> inputs{x, norm};
  auto shapes = add_weights(inputs, qkv, bits, stream);
  const int E = x.ndim() == 3 ? x.shape(2) : -1;
  check_activations(x, norm, E);
  for (auto [N, K] : shapes) check(K == E, "every projection reads x's features");
  check(n_heads > 0 && n_kv_heads > 0 && shapes[0].first % n_heads == 0, "q is heads * D");
  const int D = shapes[0].first / n_heads;
  check(shapes[1].first == n_kv_heads * D && shapes[2].first == n_kv_heads * D,
        "k and v are kv_heads * D");
  check(rope.dims > 0 && rope.dims % 2 == 0 && rope.dims <= D && rope.offset >= 0,
        "rope dims must be even and at most D, the offset not negative");
  check(kv_dtype == mx::float32 || kv_dtype == mx::float16, "the cache is float32 or float16");
  const int B = x.shape(0);
  if (offsets) {
    check(offsets->ndim() == 1 && offsets->shape(0) == B &&
              mx::issubdtype(offsets->dtype(), mx::integer),
          "offsets must be [B] integers");
    inputs.push_back(mx::contiguous(mx::astype(*offsets, mx::int32, stream), false, stream));
  }
  check(lora.size() == 2 * lora_targets.size() && lora_scales.size() == lora_targets.size(),
        "an A, a B and a scale per LoRA target");
  for (size_t i = 0; i < lora_targets.size(); ++i) {
    const int t = lora_targets[i];
    check(t >= 0 && t < 3, "LoRA targets are 0 (q), 1 (k) or 2 (v)");
    const auto &a = lora[2 * i], &b = lora[2 * i + 1];
    check(a.ndim() == 2 && b.ndim() == 2 && a.shape(0) == E && b.shape(0) == a.shape(1) &&
              b.shape(1) == shapes[t].first,
          "LoRA A must be [E, r] and B [r, N]");
    for (const auto* m : {&a, &b})
      inputs.push_back(mx::contiguous(mx::astype(*m, mx::float32, stream), false, stream));
  }
  add_packed(inputs, packed, {qkv[0], qkv[3], qkv[6]}, bits);
  return mx::array::make_arrays(
      {{B, n_heads, 1, D}, {B, n_kv_heads, 1, D}, {B, n_kv_heads, 1, D}},
      {mx::float32, kv_dtype, kv_dtype},
      std::make_shared<AttentionInputs>(stream, eps, bits, n_heads, n_kv_heads, rope, kv_dtype,
                                        offsets.has_value(), lora_targets, lora_scales),
      inputs);
}

bool AttentionInputs::is_equivalent(const mx::Primitive& other) const {
  auto& o = static_cast<const AttentionInputs&>(other);
  return eps_ == o.eps_ && bits_ == o.bits_ && kv_dtype_ == o.kv_dtype_ &&
         has_offsets_ == o.has_offsets_ && lora_targets_ == o.lora_targets_ &&
         lora_scales_ == o.lora_scales_ &&
         n_heads_ == o.n_heads_ && n_kv_heads_ == o.n_kv_heads_ && rope_.dims == o.rope_.dims &&
         rope_.traditional == o.rope_.traditional && rope_.base == o.rope_.base &&
         rope_.scale == o.rope_.scale && rope_.offset == o.rope_.offset;
}

void AttentionInputs::eval_cpu(const std::vector<mx::array>& inputs,
                               std::vector<mx::array>& outputs) {
  const auto& x = inputs[0];
  const auto& norm = inputs[1];
  const int M = x.shape(0), E = x.shape(2);
  check(norm.flags().row_contiguous, "the norm's weight must be contiguous");
  const size_t unpacked = 11 + has_offsets_ + 2 * lora_targets_.size();
  auto mats = weight_problems(inputs, 2, bits_, M, inputs.size() == unpacked + 3);
  auto& encoder = mx::cpu::get_command_encoder(stream());
  for (auto& o : outputs) o.set_data(mx::allocator::malloc(o.nbytes()));
  for (const auto& a : inputs) encoder.set_input_array(a);
  for (auto& o : outputs) encoder.set_output_array(o);
  const int32_t* positions = has_offsets_ ? inputs[11].data<int32_t>() : nullptr;
  std::vector<Lora> loras;
  for (size_t i = 0; i < lora_targets_.size(); ++i) {
    const auto &a = inputs[11 + has_offsets_ + 2 * i], &b = inputs[12 + has_offsets_ + 2 * i];
    loras.push_back({lora_targets_[i], static_cast<int>(a.shape(1)), lora_scales_[i],
                     a.data<float>(), b.data<float>()});
  }
  // Weak copies, as MLX's own kernels take: the encoder keeps the buffers alive, and the
  // graph is not touched from this thread.
  std::vector<mx::array> outs;
  for (const auto& o : outputs) outs.push_back(mx::array::unsafe_weak_copy(o));
  encoder.dispatch([mats, x = mx::array::unsafe_weak_copy(x),
                    norm = mx::array::unsafe_weak_copy(norm), outputs = std::move(outs), positions,
                    loras, eps = eps_, rope = rope_, H = n_heads_, KVH = n_kv_heads_, M,
                    E]() mutable {
    thread_local std::vector<float> copy, normed, kv[2];  // per call, reused (30 calls a token)
    normed.resize(static_cast<size_t>(M) * E);
    rms_norm_rows(contiguous_rows(x, copy), norm.data<float>(), eps, M, E, normed.data());
    const bool half = outputs[1].dtype() == mx::float16;
    mats[0].y = outputs[0].data<float>();
    for (int i = 0; i < 2; ++i) {
      if (half) kv[i].resize(outputs[1 + i].size());
      mats[1 + i].y = half ? kv[i].data() : outputs[1 + i].data<float>();
    }
    run_matmuls(normed.data(), mats);
    for (const auto& l : loras) add_lora(normed.data(), M, E, l, mats[l.target]);
    const int D = mats[0].N / H;
    if (positions) {  // each row at its own position
      for (int b = 0; b < M; ++b) {
        const RopeTable t(rope.dims, rope.base, rope.scale, positions[b]);
        rope_rows(mats[0].y + static_cast<size_t>(b) * H * D, H, D, rope.traditional, t);
        rope_rows(mats[1].y + static_cast<size_t>(b) * KVH * D, KVH, D, rope.traditional, t);
      }
    } else {
      const RopeTable t(rope.dims, rope.base, rope.scale, rope.offset);
      rope_rows(mats[0].y, M * H, D, rope.traditional, t);
      rope_rows(mats[1].y, M * KVH, D, rope.traditional, t);
    }
    if (half)
      for (int i = 0; i < 2; ++i) {
        auto* dst = outputs[1 + i].data<mx::float16_t>();
        for (size_t j = 0; j < kv[i].size(); ++j) dst[j] = static_cast<mx::float16_t>(kv[i][j]);
      }
  });
}

void AttentionInputs::eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  throw std::runtime_error("[mlx_agent.attention_inputs] runs on the CPU only");
}

mx::array layer_tail(const mx::array& attn, const mx::array& x, const mx::array& norm, float eps,
                     const std::vector<mx::array>& weights, const std::vector<int>& bits,
                     const std::vector<mx::array>& packed, mx::StreamOrDevice s) {
  auto stream = mx::to_stream(s, mx::Device::cpu);
  check(bits.size() == 4, "o, gate, up and down");
  std::vector<mx::array> inputs{attn, x, norm};
  auto shapes = add_weights(inputs, weights, bits, stream);
  add_packed(inputs, packed, {weights[0], weights[3], weights[6], weights[9]}, bits);
  const int E = x.ndim() == 3 ? x.shape(2) : -1;
  check_activations(x, norm, E);
  check(attn.dtype() == mx::float32 && attn.ndim() == 3 && attn.shape(0) == x.shape(0) &&
            attn.shape(1) == 1 && attn.shape(2) == shapes[0].second,
        "attn must be [B, 1, H * D], as o_proj reads");
  const int I = shapes[1].first;
  check(shapes[0].first == E && shapes[1].second == E && shapes[2] == shapes[1] &&
            shapes[3].first == E && shapes[3].second == I,
        "o: E rows; gate and up: [I, E]; down: [E, I]");
  return mx::array(x.shape(), mx::float32, std::make_shared<LayerTail>(stream, eps, bits),
                   inputs);
}

void LayerTail::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  const auto& attn = inputs[0];
  const auto& x = inputs[1];
  const auto& norm = inputs[2];
  const int M = x.shape(0), E = x.shape(2);
  check(norm.flags().row_contiguous, "the norm's weight must be contiguous");
  auto mats = weight_problems(inputs, 3, bits_, M, inputs.size() == 3 + 12 + 4);
  out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& encoder = mx::cpu::get_command_encoder(stream());
  for (const auto& a : inputs) encoder.set_input_array(a);
  encoder.set_output_array(out);
  encoder.dispatch([mats, attn = mx::array::unsafe_weak_copy(attn),
                    x = mx::array::unsafe_weak_copy(x), norm = mx::array::unsafe_weak_copy(norm),
                    out = mx::array::unsafe_weak_copy(out), eps = eps_, M, E]() mutable {
    const size_t ME = static_cast<size_t>(M) * E, MI = static_cast<size_t>(M) * mats[1].N;
    thread_local std::vector<float> copy[2], h, normed, gate, up, act;  // reused, as above
    h.resize(ME), normed.resize(ME), gate.resize(MI), up.resize(MI), act.resize(MI);
    std::vector<QProblem> o{mats[0]}, gate_up{mats[1], mats[2]}, down{mats[3]};
    o[0].y = h.data();
    run_matmuls(contiguous_rows(attn, copy[0]), o);
    const float* xr = contiguous_rows(x, copy[1]);
    for (size_t i = 0; i < ME; ++i) h[i] += xr[i];
    rms_norm_rows(h.data(), norm.data<float>(), eps, M, E, normed.data());
    gate_up[0].y = gate.data();
    gate_up[1].y = up.data();
    run_matmuls(normed.data(), gate_up);
    swiglu_span(gate.data(), up.data(), act.data(), MI);
    float* y = out.data<float>();
    down[0].y = y;
    run_matmuls(act.data(), down);
    for (size_t i = 0; i < ME; ++i) y[i] += h[i];
  });
}

void LayerTail::eval_gpu(const std::vector<mx::array>&, mx::array&) {
  throw std::runtime_error("[mlx_agent.layer_tail] runs on the CPU only");
}

}  // namespace mlx_agent
