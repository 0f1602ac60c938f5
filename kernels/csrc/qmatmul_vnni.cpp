// The quantized matmul on AVX-512 VNNI: integer dot products for W's codes.
//
// x is quantized per group of 32, once per call (quantize_x_vnni): code = round(x / s) with
// s = max|x| / 32512, split as code = 256 * hi + lo (hi in [-127, 127], lo in [-128, 127]),
// so each of hi and lo is a signed byte that VPDPBUSD multiplies by W's unsigned codes, four
// products a lane. A group's dot product is then (256 * sum(q * hi) + sum(q * lo)) * s, exact
// in int32; W's scale and bias are applied per group in float32, the bias through x's float
// sum. x keeps 16 bits a group (an element's error is at most 1/65024 of the group's largest),
// so results agree with the float32 reference to about 1e-4 relative, not to float32
// rounding as the other kernels do. A group whose largest element is below 1e-30 adds only
// its sum's part; an infinite x gives NaN where the reference gives an infinity (NaN
// propagates, through the sum).
//
// W is read from its packed copy in blocks of 16 rows (kernels/qmatmul.py's pack): per block
// and group of 32, the codes laid out so that one 64-byte load holds four consecutive codes
// of each of the 16 rows (a 32-bit lane per row), then the rows' 16 float16 scales and 16
// float16 biases. One VPDPBUSD with four bytes of x broadcast then adds four products to each
// of 16 outputs, and a block's 16 outputs stay in one register across all of K.
//
// Rows of x go eight at a time (then four, two, one), so each group's codes are unpacked once
// for eight rows, and the groups a few ahead are prefetched: at batch 8 the weights stream from
// memory, and without the hint the kernel ran at about 80% of its rate on weights in cache
// (scripts/bench_matmul_rows.py --cold).

#include <algorithm>
#include <cmath>
#include <cstring>

#include "prefetch.h"
#include "qmatmul_rows.h"

#if defined(__x86_64__)
#include <immintrin.h>

namespace mlx_agent {

#define VNNI_TARGET \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))

namespace {

constexpr int kGroup = 32, kBlock = 16;
constexpr float kCodeMax = 127.0f * 256.0f;  // |code| of x, so that hi fits a signed byte
// (|sum(q * hi)| is at most 32 * 255 * 127 a group, so 256 times it still fits int32)

inline int32_t word(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// y[m0 : m0 + MB, block nb's 16 columns]. MB is a constant so that the loops over rows
// unroll and the MB sums stay in registers.
template <int BITS, int MB>
VNNI_TARGET void block_rows(const QProblem& p, int nb, int m0) {
  const int groups = p.K / kGroup;
  const size_t stride = vnni_group_bytes(BITS);
  const uint8_t* wb = p.packed + static_cast<size_t>(nb) * groups * stride;
  const __m512i low = _mm512_set1_epi8(0x0f);
  __m512 acc[MB];
  for (int i = 0; i < MB; ++i) acc[i] = _mm512_setzero_ps();
  for (int g = 0; g < groups; ++g, wb += stride) {
    prefetch(wb, groups_ahead(MB) * stride, stride);
    __m512i w[8];  // w[j]: codes k = 4j .. 4j + 3 of the group, for each of the 16 rows
    if constexpr (BITS == 4) {
      for (int c = 0; c < 4; ++c) {
        const __m512i v = _mm512_loadu_si512(wb + 64 * c);
        w[2 * c] = _mm512_and_si512(v, low);
        w[2 * c + 1] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
      }
    } else {
      for (int c = 0; c < 8; ++c) w[c] = _mm512_loadu_si512(wb + 64 * c);
    }
    const __m512 scale = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(wb + 64 * BITS)));
    const __m512 bias =
        _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(wb + 64 * BITS + 32)));
#pragma GCC unroll 8
    for (int i = 0; i < MB; ++i) {
      const size_t at = static_cast<size_t>(m0 + i) * groups + g;
      const int8_t* hi = p.x_hi + at * kGroup;
      const int8_t* lo = p.x_lo + at * kGroup;
      __m512i sum_hi = _mm512_setzero_si512(), sum_lo = _mm512_setzero_si512();
      for (int j = 0; j < 8; ++j) {
        sum_hi = _mm512_dpbusd_epi32(sum_hi, w[j], _mm512_set1_epi32(word(hi + 4 * j)));
        sum_lo = _mm512_dpbusd_epi32(sum_lo, w[j], _mm512_set1_epi32(word(lo + 4 * j)));
      }
      const __m512 dot =
          _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_slli_epi32(sum_hi, 8), sum_lo));
      acc[i] = _mm512_fmadd_ps(dot, _mm512_mul_ps(scale, _mm512_set1_ps(p.x_scale[at])), acc[i]);
      acc[i] = _mm512_fmadd_ps(bias, _mm512_set1_ps(p.x_sum[at]), acc[i]);
    }
  }
  for (int i = 0; i < MB; ++i)
    _mm512_storeu_ps(p.y + static_cast<size_t>(m0 + i) * p.N + nb * kBlock, acc[i]);
}

template <int BITS>
void rows_bits(const QProblem& p, int n0, int n1) {
  for (int nb = n0 / kBlock; nb < n1 / kBlock; ++nb) {
    for (int m0 = 0; m0 < p.M;) {
      const int left = p.M - m0;
      if (left >= 8) {
        block_rows<BITS, 8>(p, nb, m0);
        m0 += 8;
      } else if (left >= 4) {
        block_rows<BITS, 4>(p, nb, m0);
        m0 += 4;
      } else if (left >= 2) {
        block_rows<BITS, 2>(p, nb, m0);
        m0 += 2;
      } else {
        block_rows<BITS, 1>(p, nb, m0);
        m0 += 1;
      }
    }
  }
}

}  // namespace

VNNI_TARGET void quantize_x_vnni(const float* x, QuantizedX& out, size_t g0, size_t g1) {
  const __m512i half = _mm512_set1_epi32(128);
  for (size_t at = g0; at < g1; ++at) {
    const float* xg = x + at * kGroup;
    const __m512 a = _mm512_loadu_ps(xg), b = _mm512_loadu_ps(xg + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
    out.sum[at] = _mm512_reduce_add_ps(_mm512_add_ps(a, b));
    // a group this small (or all zero) adds only its sum's part: 1 / s would overflow
    const bool tiny = !(amax > 1e-30f);
    out.scale[at] = tiny ? 0.0f : amax / kCodeMax;
    const __m512 inv = _mm512_set1_ps(tiny ? 0.0f : kCodeMax / amax);
    for (int h = 0; h < 2; ++h) {
      const __m512i code = _mm512_cvtps_epi32(_mm512_mul_ps(h ? b : a, inv));  // nearest
      const __m512i hi = _mm512_srai_epi32(_mm512_add_epi32(code, half), 8);
      const __m512i lo = _mm512_sub_epi32(code, _mm512_slli_epi32(hi, 8));
      _mm_storeu_si128((__m128i*)(out.hi.data() + at * kGroup + 16 * h), _mm512_cvtepi32_epi8(hi));
      _mm_storeu_si128((__m128i*)(out.lo.data() + at * kGroup + 16 * h), _mm512_cvtepi32_epi8(lo));
    }
  }
}

void rows_vnni(const QProblem& p, int n0, int n1) {
  p.bits == 4 ? rows_bits<4>(p, n0, n1) : rows_bits<8>(p, n0, n1);
}

}  // namespace mlx_agent

#endif  // __x86_64__
