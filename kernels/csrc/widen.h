// Rows of float16 keys or values widened to float32 for the attention kernels, with the
// CPU's conversion instruction where it has one (VCVTPH2PS: one instruction per 16 or 8
// values, where the portable bit arithmetic of simd16::load takes seven).
#pragma once

#include <cstdint>

namespace mlx_agent {

// dst[r * n + i] = src[r * stride + i] for r < rows, i < n (n a multiple of 16).
using WidenFn = void (*)(const uint16_t* src, int64_t stride, int rows, int n, float* dst);

// The widening this CPU runs best, following the quantized matmul's choice of instruction
// set (so MLX_AGENT_KERNEL_ISA=avx2|scalar picks the slower ones, as the tests do).
WidenFn widen_half();

// Whether the attention kernels may keep eight or more 16-float vectors in registers: the
// CPU has AVX2 or AVX-512 (16 or 32 registers of 8 or 16 floats). Follows the same choice:
// MLX_AGENT_KERNEL_ISA=scalar gives false.
bool wide_vectors();

}  // namespace mlx_agent
