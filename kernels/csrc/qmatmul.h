// Quantized matmul for decode and small batches on the CPU: y = x @ W^T, W in MLX's affine
// layout (group size 32, 4 or 8 bits), which is how mx.load hands over GGUF Q4_0, Q4_1 and
// Q8_0 blocks: w = scale * q + bias per group of 32 weights.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "mlx/ops.h"
#include "mlx/primitives.h"
#include "qmatmul_rows.h"

namespace mlx_agent {

namespace mx = mlx::core;

// x: [..., K] floating; w: [N, K * bits / 32] uint32; scales, biases: [N, K / 32] float16 or
// float32. Returns [..., N] in x's dtype. CPU only.
// `packed`: W also packed by blocks of rows (kernels/qmatmul.py's pack), which the AVX-512
// (16-row blocks with VNNI, else 4) and AVX2 (4) kernels read instead.
mx::array quantized_matmul(const mx::array& x, const mx::array& w, const mx::array& scales,
                           const mx::array& biases, int bits,
                           const std::optional<mx::array>& packed = std::nullopt,
                           mx::StreamOrDevice s = {});

// y_i = x @ W_i^T for several W that read the same float32 x (a layer's q, k and v
// projections; an MLP's gate and up): one graph node, x staged once, one job on the pool.
// `packed`: empty, or each W packed, as quantized_matmul's.
std::vector<mx::array> quantized_matmuls(const mx::array& x, const std::vector<mx::array>& ws,
                                         const std::vector<mx::array>& scales,
                                         const std::vector<mx::array>& biases,
                                         const std::vector<int>& bits,
                                         const std::vector<mx::array>& packed = {},
                                         mx::StreamOrDevice s = {});

// W packed for the kernels in blocks of `rows` rows (4: the float kernels, 16: the integer
// ones), as kernels/qmatmul.py's pack describes the layouts: uint8 [N / rows, K / 32, bytes of
// a group]. Computed now (the inputs are evaluated), on the kernels' pool; float16 scales
// and biases only.
mx::array pack_weights(const mx::array& w, const mx::array& scales, const mx::array& biases,
                       int bits, int rows);

// W as float32 [N, K] (the prefill path dequantizes a layer at a time for the BLAS matmul).
mx::array dequantize(const mx::array& w, const mx::array& scales, const mx::array& biases,
                     int bits, mx::StreamOrDevice s = {});

// Checks W's arrays (uint32 [N, K * bits / 32], scales and biases [N, K / 32]); returns K.
int check_weights(const mx::array& w, const mx::array& scales, const mx::array& biases, int bits);

// Scales or biases as the kernel reads them: float16 or float32 (others cast to float32).
mx::array as_param(const mx::array& a, mx::Stream stream);

// One problem per matrix whose w, scales and biases are inputs[first + 3 i ...] (checked
// contiguous), for M rows of x; x and y are left for the caller. When the inputs end with
// one packed W per matrix (a primitive's last inputs), each problem reads its own. Inside an
// eval_cpu.
std::vector<QProblem> weight_problems(const std::vector<mx::array>& inputs, size_t first,
                                      const std::vector<int>& bits, int M, bool packed);

// The packed W's for `ws` appended to a primitive's inputs (checked against W's shape);
// returns whether there were any.
bool add_packed(std::vector<mx::array>& inputs, const std::vector<mx::array>& packed,
                const std::vector<mx::array>& ws, const std::vector<int>& bits);

// x's elements in row-major order: x's own data when it is row-contiguous, else a copy in
// `buf`. Inside an eval_cpu's dispatched work (x evaluated).
const float* contiguous_rows(const mx::array& x, std::vector<float>& buf);

// "avx512vnni", "avx512", "avx2int", "avx2" or "scalar": the code path chosen for this CPU at load time.
std::string isa();

// Rows per block of the packed W the chosen kernel reads: 16 (VNNI), 4, or 0 (none).
int packed_rows();

// Threads the kernel splits a matmul across (the calling thread included).
int threads();

// With dequantize_, the output is W itself (x is not an input).
class QuantizedMatmul : public mx::UnaryPrimitive {
 public:
  QuantizedMatmul(mx::Stream stream, int bits, bool dequantize = false)
      : mx::UnaryPrimitive(stream), bits_(bits), dequantize_(dequantize) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  void eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) override;

  const char* name() const override {
    return dequantize_ ? "MlxAgentDequantize" : "MlxAgentQuantizedMatmul";
  }
  bool is_equivalent(const mx::Primitive& other) const override {
    auto& o = static_cast<const QuantizedMatmul&>(other);
    return bits_ == o.bits_ && dequantize_ == o.dequantize_;
  }

 private:
  void eval_dequantize(const std::vector<mx::array>& inputs, mx::array& out);
  int bits_;
  bool dequantize_;
};

// Inputs: x, then w, scales and biases of each matrix; one output per matrix.
class QuantizedMatmuls : public mx::Primitive {
 public:
  QuantizedMatmuls(mx::Stream stream, std::vector<int> bits)
      : mx::Primitive(stream), bits_(std::move(bits)) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  void eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;

  const char* name() const override { return "MlxAgentQuantizedMatmuls"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    return bits_ == static_cast<const QuantizedMatmuls&>(other).bits_;
  }

 private:
  std::vector<int> bits_;
};

}  // namespace mlx_agent
