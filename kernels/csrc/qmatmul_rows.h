// The inner loops of the quantized matmul, one per instruction set, chosen at run time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace mlx_agent {

// One call computes y[:, n0:n1] for all M rows of x.
struct QProblem {
  const float* x;         // [M, K]; for 4 bits each group of 32 is reordered evens-then-odds
  const uint8_t* w;       // [N, K * bits / 8], MLX's packing (low bits first)
  const void* scales;     // [N, K / 32]
  const void* biases;     // [N, K / 32]
  bool half;              // scales and biases are float16 (else float32)
  float* y;               // [M, N]
  int M, N, K, bits;
  // Optional: the same W packed by blocks of rows (kernels/qmatmul.py's pack). Four rows
  // (AVX-512, AVX2): for each block and group, the four rows' codes (4 x 16 or 4 x 32
  // bytes), then their four float16 scales and four float16 biases, so that a pass over
  // four rows reads one stream. Sixteen rows (the integer kernels): see qmatmul_vnni.cpp.
  // Null when W is not packed (N not a multiple of the block, or float32 scales); the kernels that
  // do not read it use the arrays above.
  const uint8_t* packed = nullptr;
  // The integer kernels' x (RowsKernel::quantize), when they read a packed W: per row and
  // group of 32, the codes' high and low signed bytes ([M, K] each), the scale and x's float sum.
  const int8_t* x_hi = nullptr;
  const int8_t* x_lo = nullptr;
  const float* x_scale = nullptr;
  const float* x_sum = nullptr;
};

// x quantized for the integer kernels (see qmatmul_vnni.cpp).
struct QuantizedX {
  std::vector<int8_t> hi, lo;
  std::vector<float> scale, sum;
};

// Bytes of one packed group of four rows.
constexpr int packed_group_bytes(int bits) { return 4 * 32 * bits / 8 + 16; }

// Bytes of one group of a 16-row block of the integer kernels' packed W: the codes, then 16
// float16 scales and 16 float16 biases. A W takes as many bytes packed either way.
constexpr int vnni_group_bytes(int bits) { return 16 * 32 * bits / 8 + 64; }

using RowsFn = void (*)(const QProblem&, int n0, int n1);
// x's groups of 32 [g0, g1) (counted over all its rows) rounded into out, which is sized for
// all of x (run_matmuls sizes it and splits the groups over the pool).
using QuantizeFn = void (*)(const float* x, QuantizedX& out, size_t g0, size_t g1);

struct RowsKernel {
  const char* isa;
  RowsFn fn;       // y[:, n0:n1] = x @ W[n0:n1]^T
  RowsFn dequant;  // y[n0:n1] = W[n0:n1] as float32 ([N, K]; x and M unused)
  int packed_rows;  // rows per block of the packed W it reads: 4, 16 (integer), 0 (none)
  // The integer kernels only: fn reads x rounded by `quantize` and W packed; a W that is not
  // packed (N not a multiple of 16, float32 scales) goes to the float kernel `unpacked`.
  QuantizeFn quantize = nullptr;
  RowsFn unpacked = nullptr;
};

// y_i = x @ W_i^T for each problem (x: M rows of K, contiguous, float32; each problem's x is
// filled in here): x staged once per bit width, all the problems' rows split over
// the kernels' pool as one job. Runs on the calling thread and the pool; no graph node.
void run_matmuls(const float* x, std::vector<QProblem>& problems);

// The fastest kernel this CPU runs: "avx512vnni", "avx512", "avx2int", "avx2" or "scalar"
// (the integer kernels first, each before its float one). MLX_AGENT_KERNEL_ISA names a slower
// one (tests compare them all).
RowsKernel select_rows_kernel();

void rows_scalar(const QProblem& p, int n0, int n1);
void dequant_scalar(const QProblem& p, int n0, int n1);
#if defined(__x86_64__)
void rows_avx2(const QProblem& p, int n0, int n1);
void rows_avx512(const QProblem& p, int n0, int n1);
void dequant_avx512(const QProblem& p, int n0, int n1);
// The integer kernels: W packed, n0 and n1 multiples of 16, x_* filled in from quantize_x_*.
void rows_vnni(const QProblem& p, int n0, int n1);
void quantize_x_vnni(const float* x, QuantizedX& out, size_t g0, size_t g1);
// The same on AVX2 (qmatmul_avx2int.cpp).
void rows_avx2int(const QProblem& p, int n0, int n1);
void quantize_x_avx2(const float* x, QuantizedX& out, size_t g0, size_t g1);
#endif

}  // namespace mlx_agent
