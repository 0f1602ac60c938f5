// Rows of float16 keys or values widened to float32 for the attention kernels, with the
// CPU's conversion instruction where it has one (VCVTPH2PS: one instruction per 16 or 8
// values, where the portable bit arithmetic of simd16::load takes seven).
#pragma once

#include <cstdint>

#include "simd16.h"

namespace mlx_agent {

// dst[r * n + i] = src[r * stride + i] for r < rows, i < n (n a multiple of 16).
using WidenFn = void (*)(const uint16_t* src, int64_t stride, int rows, int n, float* dst);

// The widening this CPU runs best, following the quantized matmul's choice of instruction
// set (so MLX_AGENT_KERNEL_ISA=avx2|scalar picks the slower ones, as the tests do).
WidenFn widen_half();

// The registers the attention kernels size their tiles for (simd16.h): zmm with AVX-512,
// ymm with AVX2, else xmm. Follows the same choice: MLX_AGENT_KERNEL_ISA=scalar gives xmm.
simd16::Regs registers();

// fn.template operator()<R>() for R = registers(): a kernel templated on its registers,
// called as with_regs([&]<simd16::Regs R>() { kernel<R>(...); }).
template <typename Fn>
void with_regs(Fn&& fn) {
  switch (registers()) {
    case simd16::Regs::kZmm: return fn.template operator()<simd16::Regs::kZmm>();
    case simd16::Regs::kYmm: return fn.template operator()<simd16::Regs::kYmm>();
    default: return fn.template operator()<simd16::Regs::kXmm>();
  }
}

}  // namespace mlx_agent
