#include "widen.h"

#include <cstring>

#include "prefetch.h"
#include "qmatmul_rows.h"
#include "simd16.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace mlx_agent {

namespace {

void widen_portable(const uint16_t* src, int64_t stride, int rows, int n, float* dst) {
  for (int r = 0; r < rows; ++r, src += stride, dst += n) {
    prefetch(src, 16 * stride * 2, 2 * n);  // this row of the next tile
    for (int i = 0; i < n; i += simd16::kLanes)
      simd16::store(dst + i, simd16::load<simd16::Vec<4>>(src + i));
  }
}

#if defined(__x86_64__)
__attribute__((target("avx512f"))) void widen_avx512(const uint16_t* src, int64_t stride,
                                                     int rows, int n, float* dst) {
  for (int r = 0; r < rows; ++r, src += stride, dst += n) {
    prefetch(src, 16 * stride * 2, 2 * n);  // this row of the next tile
    for (int i = 0; i < n; i += 16)
      _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(src + i))));
  }
}

__attribute__((target("avx2,f16c"))) void widen_f16c(const uint16_t* src, int64_t stride,
                                                     int rows, int n, float* dst) {
  for (int r = 0; r < rows; ++r, src += stride, dst += n) {
    prefetch(src, 16 * stride * 2, 2 * n);  // this row of the next tile
    for (int i = 0; i < n; i += 8)
      _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(src + i))));
  }
}
#endif

WidenFn choose() {
#if defined(__x86_64__)
  const char* isa = select_rows_kernel().isa;
  if (std::strncmp(isa, "avx512", 6) == 0) return widen_avx512;
  if (std::strncmp(isa, "avx2", 4) == 0) return widen_f16c;  // the AVX2 kernels require F16C
#endif
  return widen_portable;
}

}  // namespace

WidenFn widen_half() {
  static const WidenFn chosen = choose();
  return chosen;
}

simd16::Regs registers() {
  static const simd16::Regs regs = [] {
    const char* isa = select_rows_kernel().isa;
    if (std::strncmp(isa, "avx512", 6) == 0) return simd16::Regs::kZmm;
    if (std::strncmp(isa, "avx2", 4) == 0) return simd16::Regs::kYmm;
    return simd16::Regs::kXmm;
  }();
  return regs;
}

}  // namespace mlx_agent
