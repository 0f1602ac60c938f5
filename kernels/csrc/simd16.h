// Sixteen-float vectors for the attention and activation kernels, as GCC/Clang vector
// extensions, in one source for every instruction set: each target clone (MLX_AGENT_CLONES)
// compiles it for its own registers. The AVX2 clone is x86-64-v3 (AVX2 with FMA and F16C):
// GCC's plain "avx2" clone has no FMA, and multiplies and adds separately.
//
// A vector is Vec<W>: sixteen floats held as 16 / W native vectors of W lanes, W the width of
// the clone's registers (Regs: 16 in zmm, 8 in ymm, 4 in xmm). A kernel takes Regs as a
// template argument and the caller picks it at run time (with_regs): a clone cannot tell
// which it is, and one type for all would not do. GCC keeps a 64-byte vector in memory where
// the target has no 64-byte registers: the AVX2 clone of kernels written on 16-lane vectors
// ran 3-8x slower than on AVX-512 (every operation through the stack), where as two ymm
// halves they stay in registers. Kernels also size their tiles by Regs: four accumulators
// of sixteen floats take 4 of 32 zmm but 8 of 16 ymm.
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

constexpr int kLanes = 16;

// The registers a kernel's vectors live in: 32 zmm of 16 floats (AVX-512), 16 ymm of 8
// (AVX2), 16 xmm of 4.
enum class Regs { kXmm, kYmm, kZmm };

typedef float F4x __attribute__((vector_size(16)));
typedef float F8x __attribute__((vector_size(32)));

// Native vectors of W lanes: float, int32, uint32 and uint16.
template <int W> struct Native;
template <> struct Native<4> {
  typedef float F __attribute__((vector_size(16)));
  typedef int32_t I __attribute__((vector_size(16)));
  typedef uint32_t U __attribute__((vector_size(16)));
  typedef uint16_t H __attribute__((vector_size(8)));
};
template <> struct Native<8> {
  typedef float F __attribute__((vector_size(32)));
  typedef int32_t I __attribute__((vector_size(32)));
  typedef uint32_t U __attribute__((vector_size(32)));
  typedef uint16_t H __attribute__((vector_size(16)));
};
template <> struct Native<16> {
  typedef float F __attribute__((vector_size(64)));
  typedef int32_t I __attribute__((vector_size(64)));
  typedef uint32_t U __attribute__((vector_size(64)));
  typedef uint16_t H __attribute__((vector_size(32)));
};

// exp(x) for x <= 0 (scores less their maximum): 2^n * p(r) with Cephes' expf polynomial,
// within 2 ulp of expf down to exp(-87) (less is 0 to float32 anyway).
template <typename F, typename I>
MLX_AGENT_INLINE F exp_native(F x) {
  x = x < -87.0f ? F{} - 87.0f : x;
  const F y = x * 1.44269504088896341f + 0.5f;
  I n = __builtin_convertvector(y, I);                             // truncates towards zero ...
  n += reinterpret_cast<I>(__builtin_convertvector(n, F) > y);     // ... so floor: -1
  const F nf = __builtin_convertvector(n, F);
  F r = x - nf * 0.693359375f;
  r = r + nf * 2.12194440e-4f;
  F p = r * 1.9875691500e-4f + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  return p * reinterpret_cast<F>((n + 127) << 23);
}

// IEEE half to float (finite values, subnormals included) without branches: move exponent
// and mantissa into place, then rescale the exponent bias by 2^112.
template <typename N>
MLX_AGENT_INLINE typename N::F half_native(const uint16_t* p) {
  typename N::H h;
  std::memcpy(&h, p, sizeof h);
  const auto bits = __builtin_convertvector(h, typename N::U);
  const auto f = reinterpret_cast<typename N::F>((bits & 0x7fffu) << 13) * 0x1p112f;
  return reinterpret_cast<typename N::F>(reinterpret_cast<typename N::U>(f) | (bits & 0x8000u) << 16);
}

// Sixteen floats as P = 16 / W native vectors. Arithmetic is lane by lane; a float operand
// is broadcast.
template <int W>
struct Vec {
  using N = Native<W>;
  using F = typename N::F;
  static constexpr int P = kLanes / W;
  F p[P];

#define MLX_AGENT_VEC_OP(op)                                                               \
  friend MLX_AGENT_INLINE Vec operator op(Vec a, const Vec& b) {                          \
    for (int i = 0; i < P; ++i) a.p[i] = a.p[i] op b.p[i];                                 \
    return a;                                                                              \
  }                                                                                        \
  friend MLX_AGENT_INLINE Vec operator op(Vec a, float b) {                               \
    for (int i = 0; i < P; ++i) a.p[i] = a.p[i] op b;                                      \
    return a;                                                                              \
  }                                                                                        \
  friend MLX_AGENT_INLINE Vec operator op(float a, Vec b) {                               \
    for (int i = 0; i < P; ++i) b.p[i] = a op b.p[i];                                      \
    return b;                                                                              \
  }                                                                                        \
  MLX_AGENT_INLINE Vec& operator op##=(const Vec& b) { return *this = *this op b; }
  MLX_AGENT_VEC_OP(+)
  MLX_AGENT_VEC_OP(-)
  MLX_AGENT_VEC_OP(*)
  MLX_AGENT_VEC_OP(/)
#undef MLX_AGENT_VEC_OP

  MLX_AGENT_INLINE float operator[](int i) const { return p[i / W][i % W]; }
};

template <Regs R>
using V = Vec<R == Regs::kZmm ? 16 : R == Regs::kYmm ? 8 : 4>;

// (a native vector at a time: one memcpy of the whole went through the stack, a 16-byte
// piece at a time, and stalled the wide loads after it)
template <typename Vt>
MLX_AGENT_INLINE Vt load(const float* src) {
  Vt v;
  for (int i = 0; i < Vt::P; ++i) std::memcpy(&v.p[i], src + i * (kLanes / Vt::P), sizeof v.p[i]);
  return v;
}

template <typename Vt>
MLX_AGENT_INLINE Vt load(const uint16_t* src) {
  Vt v;
  for (int i = 0; i < Vt::P; ++i) v.p[i] = half_native<typename Vt::N>(src + i * (kLanes / Vt::P));
  return v;
}

template <int W>
MLX_AGENT_INLINE void store(float* dst, const Vec<W>& v) {
  for (int i = 0; i < Vec<W>::P; ++i) std::memcpy(dst + i * W, &v.p[i], sizeof v.p[i]);
}

template <int W>
MLX_AGENT_INLINE Vec<W> exp_nonpositive(Vec<W> x) {
  for (int i = 0; i < Vec<W>::P; ++i)
    x.p[i] = exp_native<typename Native<W>::F, typename Native<W>::I>(x.p[i]);
  return x;
}

// Eight partial sums whose total is the vector's.
MLX_AGENT_INLINE F8x fold8(const Vec<16>& v) {
  return __builtin_shufflevector(v.p[0], v.p[0], 0, 1, 2, 3, 4, 5, 6, 7) +
         __builtin_shufflevector(v.p[0], v.p[0], 8, 9, 10, 11, 12, 13, 14, 15);
}
MLX_AGENT_INLINE F8x fold8(const Vec<8>& v) { return v.p[0] + v.p[1]; }
MLX_AGENT_INLINE F8x fold8(const Vec<4>& v) {
  return __builtin_shufflevector(v.p[0] + v.p[2], v.p[1] + v.p[3], 0, 1, 2, 3, 4, 5, 6, 7);
}

template <int W>
MLX_AGENT_INLINE float sum(const Vec<W>& v) {
  const F8x a = fold8(v);
  const F4x b = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
  return (b[0] + b[2]) + (b[1] + b[3]);
}

}  // namespace mlx_agent::simd16
