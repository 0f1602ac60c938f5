// Rows of float16 keys or values widened to float32 for the attention kernels, with the
// CPU's conversion instruction where it has one (VCVTPH2PS: one instruction per 16 or 8
// values, where the portable bit arithmetic of simd16::load takes seven).
#pragma once

#include <cstdint>

namespace mlx_agent {

// dst[r * n + i] = src[r * stride + i] for r < rows, i < n (n a multiple of 16).
using WidenFn = void (*)(const uint16_t* src, int64_t stride, int rows, int n, float* dst);

// The widening this CPU runs best, following the quantized matmul's choice of instruction
// set (so MLX_AGENT_KERNEL_ISA=avx2|scalar picks the slower ones for tests too).
WidenFn widen_half();

}  // namespace mlx_agent
