// Sixteen-float vectors for the attention kernels, as GCC/Clang vector extensions: each
// target clone (MLX_AGENT_CLONES) lowers them to its own registers (one zmm, two ymm or four
// xmm), so one source serves every instruction set. The AVX2 clone is x86-64-v3 (AVX2 with
// FMA and F16C): GCC's plain "avx2" clone has no FMA, and multiplies and adds separately.
// How many of these vectors a loop may keep in registers differs by a factor of eight
// between the clones, so kernels take a Regs template argument (registers()) and size their
// tiles by it; a clone cannot tell which it is.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__x86_64__) && defined(__linux__)
#define MLX_AGENT_CLONES \
  __attribute__((target_clones("avx512f", "arch=x86-64-v3", "default")))
#else
#define MLX_AGENT_CLONES
#endif

// The helpers are compiled inside each clone, for its instruction set.
#define MLX_AGENT_INLINE inline __attribute__((always_inline))

namespace mlx_agent::simd16 {

// Registers for 16-float vectors: 32 zmm hold 32 (AVX-512), 16 ymm hold 8 (AVX2), 16 xmm 4.
enum class Regs { kXmm, kYmm, kZmm };

typedef float F16x __attribute__((vector_size(64)));
typedef int32_t I16x __attribute__((vector_size(64)));
typedef uint32_t U16x __attribute__((vector_size(64)));
typedef uint16_t H16x __attribute__((vector_size(32)));
constexpr int kLanes = 16;

MLX_AGENT_INLINE F16x load(const float* p) {
  F16x v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

MLX_AGENT_INLINE void store(float* p, F16x v) { std::memcpy(p, &v, sizeof v); }

// IEEE half to float (finite values, subnormals included) without branches: move exponent
// and mantissa into place, then rescale the exponent bias by 2^112.
MLX_AGENT_INLINE F16x load(const uint16_t* p) {
  H16x h;
  std::memcpy(&h, p, sizeof h);
  const U16x bits = __builtin_convertvector(h, U16x);
  const F16x f = reinterpret_cast<F16x>((bits & 0x7fffu) << 13) * 0x1p112f;
  return reinterpret_cast<F16x>(reinterpret_cast<U16x>(f) | (bits & 0x8000u) << 16);
}

MLX_AGENT_INLINE float sum(F16x v) {
  typedef float F8x __attribute__((vector_size(32)));
  typedef float F4x __attribute__((vector_size(16)));
  F8x a = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
          __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  F4x b = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
  return (b[0] + b[2]) + (b[1] + b[3]);
}

// exp(x) for x <= 0 (scores less their maximum), sixteen at a time: 2^n * p(r) with Cephes'
// expf polynomial, within 2 ulp of expf down to exp(-87) (less is 0 to float32 anyway).
MLX_AGENT_INLINE F16x exp_nonpositive(F16x x) {
  x = x < -87.0f ? F16x{} - 87.0f : x;
  const F16x y = x * 1.44269504088896341f + 0.5f;
  I16x n = __builtin_convertvector(y, I16x);           // truncates towards zero ...
  n += reinterpret_cast<I16x>(__builtin_convertvector(n, F16x) > y);  // ... so floor: -1
  const F16x nf = __builtin_convertvector(n, F16x);
  F16x r = x - nf * 0.693359375f;
  r = r + nf * 2.12194440e-4f;
  F16x p = r * 1.9875691500e-4f + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  return p * reinterpret_cast<F16x>((n + 127) << 23);
}

}  // namespace mlx_agent::simd16
