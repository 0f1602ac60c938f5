// Python bindings: mlx_agent.kernels._ext (nanobind, in MLX's nanobind domain so mx.array
// passes through unchanged).
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/variant.h>
#include <nanobind/stl/vector.h>

#include "activation.h"
#include "attention.h"
#include "decode_block.h"
#include "norm_rope.h"
#include "qmatmul.h"

namespace nb = nanobind;
using namespace nb::literals;

NB_MODULE(_ext, m) {
  m.doc() = "mlx_agent CPU kernels (MLX custom primitives)";
  m.def("quantized_matmul", &mlx_agent::quantized_matmul, "x"_a, "w"_a, "scales"_a, "biases"_a,
        "bits"_a, "packed"_a = nb::none(), nb::kw_only(), "stream"_a = nb::none(),
        "y = x @ W^T with W in MLX's affine layout (group size 32, 4 or 8 bits); CPU only. "
        "packed: W also packed by blocks of rows (kernels/qmatmul.py's pack), which the "
        "AVX-512 VNNI, AVX-512 and AVX2 kernels read instead.");
  m.def("quantized_matmuls", &mlx_agent::quantized_matmuls, "x"_a, "ws"_a, "scales"_a,
        "biases"_a, "bits"_a, "packed"_a = std::vector<mlx::core::array>{}, nb::kw_only(),
        "stream"_a = nb::none(),
        "[x @ W^T for each W] for float32 x, one graph node; W as quantized_matmul's.");
  m.def("pack", &mlx_agent::pack_weights, "w"_a, "scales"_a, "biases"_a, "bits"_a, "rows"_a,
        "W packed in blocks of `rows` rows (4 or 16) as the kernels read it (float16 scales "
        "and biases): uint8 [N / rows, K / 32, bytes of a group], computed now.");
  m.def("dequantize", &mlx_agent::dequantize, "w"_a, "scales"_a, "biases"_a, "bits"_a,
        nb::kw_only(), "stream"_a = nb::none(),
        "W in MLX's affine layout (group size 32, 4 or 8 bits) as float32 [N, K]; CPU only.");
  m.def("rms_norm", &mlx_agent::rms_norm, "x"_a, "weight"_a, "eps"_a, nb::kw_only(),
        "stream"_a = nb::none(), "mx.fast.rms_norm as one CPU primitive (float32).");
  m.def("rope", &mlx_agent::rope, "x"_a, "dims"_a, "traditional"_a, "base"_a, "scale"_a,
        "offset"_a, nb::kw_only(), "stream"_a = nb::none(),
        "mx.fast.rope as one CPU primitive (float32, integer offset).");
  m.def("swiglu", &mlx_agent::swiglu, "gate"_a, "up"_a, nb::kw_only(), "stream"_a = nb::none(),
        "silu(gate) * up as one CPU primitive (float32), split over the kernels' threads.");
  m.def("decode_attention", &mlx_agent::decode_attention, "q"_a, "k"_a, "v"_a, "scale"_a,
        "starts"_a = nb::none(), nb::kw_only(), "stream"_a = nb::none(),
        "softmax(scale q k^T) v for one query position (float32 q, float32 or float16 k "
        "and v, grouped heads; no mask, or row b sees keys from starts[b] on).");
  m.def("prefill_attention", &mlx_agent::prefill_attention, "q"_a, "k"_a, "v"_a, "scale"_a,
        nb::kw_only(), "stream"_a = nb::none(),
        "Causal softmax(scale q k^T) v for the last L of T positions (float32 q, float32 or "
        "float16 k and v, grouped heads).");
  m.def(
      "attention_inputs",
      [](const mlx::core::array& x, const mlx::core::array& norm, float eps,
         const std::vector<mlx::core::array>& qkv, const std::vector<int>& bits, int n_heads,
         int n_kv_heads, int rope_dims, bool traditional, float base, float scale, int offset,
         mlx::core::Dtype kv_dtype, const std::optional<mlx::core::array>& offsets,
         const std::vector<mlx::core::array>& lora, const std::vector<int>& lora_targets,
         const std::vector<float>& lora_scales, const std::vector<mlx::core::array>& packed,
         mlx::core::StreamOrDevice s) {
        return mlx_agent::attention_inputs(x, norm, eps, qkv, bits, n_heads, n_kv_heads,
                                           {rope_dims, traditional, base, scale, offset},
                                           kv_dtype, offsets, lora, lora_targets, lora_scales,
                                           packed, s);
      },
      "x"_a, "norm"_a, "eps"_a, "qkv"_a, "bits"_a, "n_heads"_a, "n_kv_heads"_a, "rope_dims"_a,
      "traditional"_a, "base"_a, "scale"_a, "offset"_a, "kv_dtype"_a, "offsets"_a = nb::none(),
      "lora"_a = std::vector<mlx::core::array>{}, "lora_targets"_a = std::vector<int>{},
      "lora_scales"_a = std::vector<float>{},
      "packed"_a = std::vector<mlx::core::array>{}, nb::kw_only(), "stream"_a = nb::none(),
      "A decode step's rms_norm, q/k/v projections and RoPE as one node: [q, k, v] with q "
      "[B, H, 1, D] float32, k and v [B, KVH, 1, D] in kv_dtype; with offsets ([B] "
      "integers), row b's RoPE position is offsets[b]; lora: A, B pairs for the projections "
      "in lora_targets (0 q, 1 k, 2 v), each adding lora_scales[i] * (n @ A) @ B.");
  m.def("layer_tail", &mlx_agent::layer_tail, "attn"_a, "x"_a, "norm"_a, "eps"_a, "weights"_a,
        "bits"_a, "packed"_a = std::vector<mlx::core::array>{}, nb::kw_only(),
        "stream"_a = nb::none(),
        "h = x + o(attn); h + down(silu(gate(n)) * up(n)) with n = rms_norm(h), as one node "
        "(weights: w, scales, biases of o, gate, up, down).");
  m.def("isa", &mlx_agent::isa, "The instruction set the kernel runs with on this CPU.");
  m.def("packed_rows", &mlx_agent::packed_rows,
        "Rows per block of the packed W the kernel reads (16, 4; 0: it reads none).");
  m.def("threads", &mlx_agent::threads, "Threads a matmul is split across.");
  m.attr("mlx_version") = MLX_AGENT_MLX_VERSION;
}
