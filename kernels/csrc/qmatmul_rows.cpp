// Quantized matmul inner loops. Each weight group of 32 is dequantized in registers
// (w = scale * q + bias, exactly the reference's arithmetic) and multiplied into float32
// accumulators; activations stay float32, so results match the dequantized reference to
// float32 rounding. 4-bit groups unpack as low nibbles (even elements) then high nibbles (odd
// elements); the caller reorders x to match once per call instead of shuffling every group.

#include "qmatmul_rows.h"

#include <cstdlib>
#include <cstring>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace mlx_agent {

namespace {

constexpr int kGroup = 32;

float half_to_float(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: renormalise
      int e = -1;
      do { ++e; mant <<= 1; } while (!(mant & 0x400u));
      bits = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mant & 0x3ffu) << 13;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | mant << 13;
  } else {
    bits = sign | (exp + 112) << 23 | mant << 13;
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Row n's scales and biases as float32, in a per-thread buffer.
void row_params(const QProblem& p, int n, std::vector<float>& buf) {
  int groups = p.K / kGroup;
  buf.resize(2 * static_cast<size_t>(groups));
  size_t at = static_cast<size_t>(n) * groups;
  if (p.half) {
    auto s = static_cast<const uint16_t*>(p.scales) + at;
    auto b = static_cast<const uint16_t*>(p.biases) + at;
    for (int g = 0; g < groups; ++g) {
      buf[g] = half_to_float(s[g]);
      buf[groups + g] = half_to_float(b[g]);
    }
  } else {
    std::memcpy(buf.data(), static_cast<const float*>(p.scales) + at, groups * sizeof(float));
    std::memcpy(buf.data() + groups, static_cast<const float*>(p.biases) + at,
                groups * sizeof(float));
  }
}

}  // namespace

// Weights stream from memory once per token, faster than the hardware prefetcher fetches
// them here: ask for the rows, scales and biases a few blocks ahead of the one computing.
constexpr int kPrefetchBlocks = 2;

template <bool HALF>
inline void prefetch_rows(const QProblem& p, int n, int rows) {
#if defined(__x86_64__)
  n += (kPrefetchBlocks - 1) * rows;
  if (n + rows > p.N) return;
  const size_t groups = p.K / kGroup, row_bytes = static_cast<size_t>(p.K) * p.bits / 8;
  const char* w = reinterpret_cast<const char*>(p.w) + n * row_bytes;
  for (size_t off = 0; off < rows * row_bytes; off += 64) _mm_prefetch(w + off, _MM_HINT_T0);
  const size_t elem = HALF ? 2 : 4, param_bytes = rows * groups * elem;
  const char* s = static_cast<const char*>(p.scales) + n * groups * elem;
  const char* b = static_cast<const char*>(p.biases) + n * groups * elem;
  for (size_t off = 0; off < param_bytes; off += 64) {
    _mm_prefetch(s + off, _MM_HINT_T0);
    _mm_prefetch(b + off, _MM_HINT_T0);
  }
#endif
}

void rows_scalar(const QProblem& p, int n0, int n1) {
  thread_local std::vector<float> params;
  const int groups = p.K / kGroup, row_bytes = p.K * p.bits / 8;
  for (int n = n0; n < n1; ++n) {
    row_params(p, n, params);
    const uint8_t* wrow = p.w + static_cast<size_t>(n) * row_bytes;
    for (int m = 0; m < p.M; ++m) {
      const float* x = p.x + static_cast<size_t>(m) * p.K;
      float acc = 0.0f;
      for (int g = 0; g < groups; ++g) {
        const float s = params[g], b = params[groups + g];
        const float* xg = x + g * kGroup;
        float part = 0.0f;
        if (p.bits == 4) {
          const uint8_t* q = wrow + g * 16;
          for (int i = 0; i < 16; ++i) {
            part += xg[i] * (s * static_cast<float>(q[i] & 15) + b);
            part += xg[16 + i] * (s * static_cast<float>(q[i] >> 4) + b);
          }
        } else {
          const uint8_t* q = wrow + g * 32;
          for (int i = 0; i < 32; ++i) part += xg[i] * (s * static_cast<float>(q[i]) + b);
        }
        acc += part;
      }
      p.y[static_cast<size_t>(m) * p.N + n] = acc;
    }
  }
}

void dequant_scalar(const QProblem& p, int n0, int n1) {
  thread_local std::vector<float> params;
  const int groups = p.K / kGroup, row_bytes = p.K * p.bits / 8;
  for (int n = n0; n < n1; ++n) {
    row_params(p, n, params);
    const uint8_t* q = p.w + static_cast<size_t>(n) * row_bytes;
    float* out = p.y + static_cast<size_t>(n) * p.K;
    for (int k = 0; k < p.K; ++k) {
      const int g = k / kGroup;
      const int v = p.bits == 4 ? (q[k / 2] >> (4 * (k % 2))) & 15 : q[k];
      out[k] = params[g] * static_cast<float>(v) + params[groups + g];
    }
  }
}

#if defined(__x86_64__)

#define AVX2_TARGET __attribute__((target("avx2,fma,f16c")))
#define AVX512_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))

namespace {

// Scale or bias number i, as float32.
template <bool HALF>
AVX2_TARGET inline float param(const void* base, size_t i) {
  if constexpr (HALF) return _cvtsh_ss(static_cast<const uint16_t*>(base)[i]);
  else return static_cast<const float*>(base)[i];
}

AVX2_TARGET inline float hsum256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Weights of group g as four vectors of 8 floats, in the order x was arranged.
template <int BITS>
AVX2_TARGET inline void load_q8x4(const uint8_t* wrow, int g, __m256 q[4]) {
  if constexpr (BITS == 4) {
    __m128i v = _mm_loadu_si128((const __m128i*)(wrow + g * 16));
    const __m128i mask = _mm_set1_epi8(0x0f);
    __m128i lo = _mm_and_si128(v, mask), hi = _mm_and_si128(_mm_srli_epi16(v, 4), mask);
    q[0] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo));
    q[1] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)));
    q[2] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi));
    q[3] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8)));
  } else {
    const uint8_t* b = wrow + g * 32;
    for (int j = 0; j < 4; ++j)
      q[j] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(b + 8 * j))));
  }
}

// MB rows of x against R rows of W (n0 .. n0 + R - 1), as block_avx512 below.
template <int BITS, int MB, int R, bool HALF>
AVX2_TARGET void block_avx2(const QProblem& p, int m0, int n0) {
  const int groups = p.K / kGroup;
  const size_t row_bytes = static_cast<size_t>(p.K) * BITS / 8;
  __m256 acc[R][MB][2];
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < MB; ++i) acc[r][i][0] = acc[r][i][1] = _mm256_setzero_ps();
  prefetch_rows<HALF>(p, n0 + R, R);
  for (int g = 0; g < groups; ++g) {
    for (int r = 0; r < R; ++r) {
      const size_t at = static_cast<size_t>(n0 + r) * groups + g;
      __m256 q[4];
      load_q8x4<BITS>(p.w + (n0 + r) * row_bytes, g, q);
      const __m256 s = _mm256_set1_ps(param<HALF>(p.scales, at));
      const __m256 b = _mm256_set1_ps(param<HALF>(p.biases, at));
      for (int j = 0; j < 4; ++j) q[j] = _mm256_fmadd_ps(q[j], s, b);
      for (int i = 0; i < MB; ++i) {
        const float* xg = p.x + static_cast<size_t>(m0 + i) * p.K + g * kGroup;
        acc[r][i][0] = _mm256_fmadd_ps(_mm256_loadu_ps(xg), q[0], acc[r][i][0]);
        acc[r][i][1] = _mm256_fmadd_ps(_mm256_loadu_ps(xg + 8), q[1], acc[r][i][1]);
        acc[r][i][0] = _mm256_fmadd_ps(_mm256_loadu_ps(xg + 16), q[2], acc[r][i][0]);
        acc[r][i][1] = _mm256_fmadd_ps(_mm256_loadu_ps(xg + 24), q[3], acc[r][i][1]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < MB; ++i)
      p.y[static_cast<size_t>(m0 + i) * p.N + n0 + r] =
          hsum256(_mm256_add_ps(acc[r][i][0], acc[r][i][1]));
}

// MB rows of x against row r of packed block `blk` (so four calls cover the block, the first
// bringing it into L1 for the other three), each group dequantized once for the MB rows. One
// x row keeps four accumulators (independent FMA chains), more keep two each: with the four
// weight vectors, at most 14 of AVX2's 16 registers.
template <int BITS, int MB>
AVX2_TARGET void packed_row_avx2(const QProblem& p, int blk, int r, int m0) {
  constexpr int kCodes = 32 * BITS / 8, kBytes = packed_group_bytes(BITS);
  constexpr int A = MB == 1 ? 4 : 2;
  const int groups = p.K / kGroup;
  const uint8_t* at = p.packed + static_cast<size_t>(blk) * groups * kBytes;
  __m256 acc[MB][A];
  for (int i = 0; i < MB; ++i)
    for (int a = 0; a < A; ++a) acc[i][a] = _mm256_setzero_ps();
  for (int g = 0; g < groups; ++g, at += kBytes) {
    __m256 q[4];
    load_q8x4<BITS>(at + r * kCodes, 0, q);
    const uint16_t* params = reinterpret_cast<const uint16_t*>(at + 4 * kCodes);
    const __m256 s = _mm256_set1_ps(_cvtsh_ss(params[r]));
    const __m256 b = _mm256_set1_ps(_cvtsh_ss(params[4 + r]));
    for (int j = 0; j < 4; ++j) q[j] = _mm256_fmadd_ps(q[j], s, b);
    for (int i = 0; i < MB; ++i) {
      const float* xg = p.x + static_cast<size_t>(m0 + i) * p.K + g * kGroup;
      for (int j = 0; j < 4; ++j)
        acc[i][j % A] = _mm256_fmadd_ps(_mm256_loadu_ps(xg + 8 * j), q[j], acc[i][j % A]);
    }
  }
  for (int i = 0; i < MB; ++i) {
    __m256 sum = acc[i][0];
    for (int a = 1; a < A; ++a) sum = _mm256_add_ps(sum, acc[i][a]);
    p.y[static_cast<size_t>(m0 + i) * p.N + 4 * blk + r] = hsum256(sum);
  }
}

// One row of x against the four rows of packed block `blk`, each group's scale and bias
// factored out of its sum as in packed_avx512 below (`xsum`: x's group sums): per group and
// weight row a multiply, three FMAs and a scaling FMA, where dequantizing first takes eight.
// x's group stays in four registers for the block's four rows.
template <int BITS>
AVX2_TARGET void packed1_avx2(const QProblem& p, const float* xsum, int blk, int m) {
  constexpr int kCodes = 32 * BITS / 8, kBytes = packed_group_bytes(BITS);
  const int groups = p.K / kGroup;
  const uint8_t* at = p.packed + static_cast<size_t>(blk) * groups * kBytes;
  __m256 acc[4];
  for (int r = 0; r < 4; ++r) acc[r] = _mm256_setzero_ps();
  __m128 bias = _mm_setzero_ps();
  for (int g = 0; g < groups; ++g, at += kBytes) {
    const float* xg = p.x + static_cast<size_t>(m) * p.K + g * kGroup;
    const __m256 x0 = _mm256_loadu_ps(xg), x1 = _mm256_loadu_ps(xg + 8);
    const __m256 x2 = _mm256_loadu_ps(xg + 16), x3 = _mm256_loadu_ps(xg + 24);
    const __m128i halves = _mm_loadu_si128(reinterpret_cast<const __m128i*>(at + 4 * kCodes));
    bias = _mm_fmadd_ps(_mm_cvtph_ps(_mm_unpackhi_epi64(halves, halves)),
                        _mm_set1_ps(xsum[static_cast<size_t>(m) * groups + g]), bias);
    alignas(16) float s[4];
    _mm_store_ps(s, _mm_cvtph_ps(halves));
    for (int r = 0; r < 4; ++r) {
      __m256 q[4];
      load_q8x4<BITS>(at + r * kCodes, 0, q);
      __m256 t = _mm256_mul_ps(x0, q[0]);
      t = _mm256_fmadd_ps(x1, q[1], t);
      t = _mm256_fmadd_ps(x2, q[2], t);
      t = _mm256_fmadd_ps(x3, q[3], t);
      acc[r] = _mm256_fmadd_ps(t, _mm256_set1_ps(s[r]), acc[r]);
    }
  }
  alignas(16) float bs[4];
  _mm_store_ps(bs, bias);
  for (int r = 0; r < 4; ++r)
    p.y[static_cast<size_t>(m) * p.N + 4 * blk + r] = hsum256(acc[r]) + bs[r];
}

template <int BITS>
AVX2_TARGET void packed_rows_avx2(const QProblem& p, int n0, int n1) {
  if (p.M == 1) {  // decode: the factored kernel
    const int groups = p.K / kGroup;
    thread_local std::vector<float> xsum;
    xsum.resize(groups);
    for (int g = 0; g < groups; ++g) {
      const float* xg = p.x + g * kGroup;
      xsum[g] = hsum256(_mm256_add_ps(
          _mm256_add_ps(_mm256_loadu_ps(xg), _mm256_loadu_ps(xg + 8)),
          _mm256_add_ps(_mm256_loadu_ps(xg + 16), _mm256_loadu_ps(xg + 24))));
    }
    for (int blk = n0 / 4; blk < n1 / 4; ++blk) packed1_avx2<BITS>(p, xsum.data(), blk, 0);
    return;
  }
  for (int blk = n0 / 4; blk < n1 / 4; ++blk)
    for (int r = 0; r < 4; ++r) {
      int m = 0;
      for (; m + 4 <= p.M; m += 4) packed_row_avx2<BITS, 4>(p, blk, r, m);
      if (p.M - m >= 2) {
        packed_row_avx2<BITS, 2>(p, blk, r, m);
        m += 2;
      }
      if (m < p.M) packed_row_avx2<BITS, 1>(p, blk, r, m);
    }
}

template <int BITS, bool HALF>
AVX2_TARGET void rows_avx2_bits(const QProblem& p, int n0, int n1) {
  int n = n0;
  if (p.packed && n0 % 4 == 0 && n1 % 4 == 0)  // whole blocks: run_matmuls splits by fours
    return packed_rows_avx2<BITS>(p, n0, n1);
  if (p.M == 1) {
    for (; n + 2 <= n1; n += 2) block_avx2<BITS, 1, 2, HALF>(p, 0, n);
    for (; n < n1; ++n) block_avx2<BITS, 1, 1, HALF>(p, 0, n);
    return;
  }
  for (; n < n1; ++n) {
    int m = 0;
    for (; m + 4 <= p.M; m += 4) block_avx2<BITS, 4, 1, HALF>(p, m, n);
    for (; m < p.M; ++m) block_avx2<BITS, 1, 1, HALF>(p, m, n);
  }
}

// Sixteen bytes widened to sixteen 32-bit lanes: the bytes broadcast to every 128-bit lane,
// then an in-lane byte shuffle (cheaper than vpmovzxbd's cross-lane one).
AVX512_TARGET inline __m512i widen16(const uint8_t* p) {
  const __m512i idx = _mm512_set_epi8(
      -1, -1, -1, 15, -1, -1, -1, 14, -1, -1, -1, 13, -1, -1, -1, 12,
      -1, -1, -1, 11, -1, -1, -1, 10, -1, -1, -1, 9, -1, -1, -1, 8,
      -1, -1, -1, 7, -1, -1, -1, 6, -1, -1, -1, 5, -1, -1, -1, 4,
      -1, -1, -1, 3, -1, -1, -1, 2, -1, -1, -1, 1, -1, -1, -1, 0);
  return _mm512_shuffle_epi8(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i*)p)), idx);
}

// Weights of group g as two vectors of 16 floats, in the order x was arranged.
template <int BITS>
AVX512_TARGET inline void load_q16x2(const uint8_t* wrow, int g, __m512 q[2]) {
  if constexpr (BITS == 4) {
    const __m512i v = widen16(wrow + g * 16), mask = _mm512_set1_epi32(0x0f);
    q[0] = _mm512_cvtepi32_ps(_mm512_and_si512(v, mask));
    q[1] = _mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4));
  } else {
    const uint8_t* b = wrow + g * 32;
    q[0] = _mm512_cvtepi32_ps(widen16(b));
    q[1] = _mm512_cvtepi32_ps(widen16(b + 16));
  }
}

// MB rows of x against R rows of W (n0 .. n0 + R - 1). Several weight rows per pass share the
// loads of x and keep independent FMA chains in flight when MB is 1 (decode).
template <int BITS, int MB, int R, bool HALF>
AVX512_TARGET void block_avx512(const QProblem& p, int m0, int n0) {
  const int groups = p.K / kGroup;
  const size_t row_bytes = static_cast<size_t>(p.K) * BITS / 8;
  __m512 acc[R][MB][2];
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < MB; ++i) acc[r][i][0] = acc[r][i][1] = _mm512_setzero_ps();
  prefetch_rows<HALF>(p, n0 + R, R);
  for (int g = 0; g < groups; ++g) {
    __m512 xv[MB][2];
    for (int i = 0; i < MB; ++i) {
      const float* xg = p.x + static_cast<size_t>(m0 + i) * p.K + g * kGroup;
      xv[i][0] = _mm512_loadu_ps(xg);
      xv[i][1] = _mm512_loadu_ps(xg + 16);
    }
    for (int r = 0; r < R; ++r) {
      const size_t at = static_cast<size_t>(n0 + r) * groups + g;
      __m512 q[2];
      load_q16x2<BITS>(p.w + (n0 + r) * row_bytes, g, q);
      const __m512 s = _mm512_set1_ps(param<HALF>(p.scales, at));
      const __m512 b = _mm512_set1_ps(param<HALF>(p.biases, at));
      q[0] = _mm512_fmadd_ps(q[0], s, b);
      q[1] = _mm512_fmadd_ps(q[1], s, b);
      for (int i = 0; i < MB; ++i) {
        acc[r][i][0] = _mm512_fmadd_ps(xv[i][0], q[0], acc[r][i][0]);
        acc[r][i][1] = _mm512_fmadd_ps(xv[i][1], q[1], acc[r][i][1]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < MB; ++i)
      p.y[static_cast<size_t>(m0 + i) * p.N + n0 + r] =
          _mm512_reduce_add_ps(_mm512_add_ps(acc[r][i][0], acc[r][i][1]));
}

// Four float16 values (a packed group's scales or biases) as float32.
AVX512_TARGET inline __m128 half4(const uint8_t* p) {
  return _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}

// x's sum over each group of 32 (the factored bias term's other factor).
AVX512_TARGET inline void group_sums(const float* x, int groups, float* out) {
  for (int g = 0; g < groups; ++g)
    out[g] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_loadu_ps(x + g * kGroup),
                                                _mm512_loadu_ps(x + g * kGroup + 16)));
}

// MB rows of x (a decode step of one or two sequences) against the four rows of packed block
// `blk`, with each group's scale and bias factored out:
// sum_i x_i (s q_i + b) = s * sum_i x_i q_i + b * sum_i x_i. Per group, weight row and x row
// that is a multiply and two FMAs on the raw codes; the bias term is a dot product with x's
// group sums (`xsum`, [MB][groups]), four rows at a time. 4-bit codes become floats by a
// lookup in a register holding 0..15 (vpermps reads only an index's low four bits). The
// packed layout is what makes this pay: from memory, MLX's three arrays stream at about 6
// GB/s on one core here, one packed stream at about 10 (scripts/bench_qlayout.cpp).
template <int BITS, int MB>
AVX512_TARGET void packed_avx512(const QProblem& p, const float* xsum, int blk, int m0) {
  constexpr int kCodes = 32 * BITS / 8, kBytes = packed_group_bytes(BITS);
  const int groups = p.K / kGroup;
  const uint8_t* at = p.packed + static_cast<size_t>(blk) * groups * kBytes;
  const __m512 codes = _mm512_set_ps(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  __m512 acc[4][MB];
  __m128 bias[MB];
  for (int i = 0; i < MB; ++i) {
    bias[i] = _mm_setzero_ps();
    for (int r = 0; r < 4; ++r) acc[r][i] = _mm512_setzero_ps();
  }
  for (int g = 0; g < groups; ++g, at += kBytes) {
    __m512 xv[MB][2];
    for (int i = 0; i < MB; ++i) {
      const float* xg = p.x + static_cast<size_t>(m0 + i) * p.K + g * kGroup;
      xv[i][0] = _mm512_loadu_ps(xg);
      xv[i][1] = _mm512_loadu_ps(xg + 16);
    }
    const __m128 b = half4(at + 4 * kCodes + 8);
    for (int i = 0; i < MB; ++i)
      bias[i] = _mm_fmadd_ps(b, _mm_set1_ps(xsum[static_cast<size_t>(m0 + i) * groups + g]),
                             bias[i]);
    alignas(16) float s[4];
    _mm_store_ps(s, half4(at + 4 * kCodes));
    for (int r = 0; r < 4; ++r) {
      __m512 q0, q1;
      if constexpr (BITS == 4) {
        const __m512i v = widen16(at + 16 * r);
        q0 = _mm512_permutexvar_ps(v, codes);
        q1 = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), codes);
      } else {
        q0 = _mm512_cvtepi32_ps(widen16(at + 32 * r));
        q1 = _mm512_cvtepi32_ps(widen16(at + 32 * r + 16));
      }
      const __m512 scale = _mm512_set1_ps(s[r]);
      for (int i = 0; i < MB; ++i) {
        const __m512 t = _mm512_fmadd_ps(xv[i][1], q1, _mm512_mul_ps(xv[i][0], q0));
        acc[r][i] = _mm512_fmadd_ps(t, scale, acc[r][i]);
      }
    }
  }
  for (int i = 0; i < MB; ++i) {
    alignas(16) float bs[4];
    _mm_store_ps(bs, bias[i]);
    for (int r = 0; r < 4; ++r)
      p.y[static_cast<size_t>(m0 + i) * p.N + 4 * blk + r] =
          _mm512_reduce_add_ps(acc[r][i]) + bs[r];
  }
}

// Four rows of x (m0 on) against the four rows of packed block `blk`, each group dequantized
// once for the four: a 4-bit group's sixteen possible values (s * k + b, one FMA) fill a
// register the codes index (vpermps), an 8-bit group's codes convert and scale. Past two
// rows of x this costs less than factoring, whose work grows with every row. One
// accumulator per weight row and x row: sixteen registers (two each would spill).
template <int BITS>
AVX512_TARGET void packed4_avx512(const QProblem& p, int blk, int m0) {
  constexpr int kCodes = 32 * BITS / 8, kBytes = packed_group_bytes(BITS);
  const int groups = p.K / kGroup;
  const uint8_t* at = p.packed + static_cast<size_t>(blk) * groups * kBytes;
  const __m512 codes = _mm512_set_ps(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  __m512 acc[4][4];
  for (int r = 0; r < 4; ++r)
    for (int i = 0; i < 4; ++i) acc[r][i] = _mm512_setzero_ps();
  for (int g = 0; g < groups; ++g, at += kBytes) {
    alignas(16) float s[4], b[4];
    _mm_store_ps(s, half4(at + 4 * kCodes));
    _mm_store_ps(b, half4(at + 4 * kCodes + 8));
    for (int r = 0; r < 4; ++r) {
      const __m512 scale = _mm512_set1_ps(s[r]), bias = _mm512_set1_ps(b[r]);
      __m512 w0, w1;
      if constexpr (BITS == 4) {
        const __m512 table = _mm512_fmadd_ps(codes, scale, bias);
        const __m512i v = widen16(at + 16 * r);
        w0 = _mm512_permutexvar_ps(v, table);
        w1 = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), table);
      } else {
        w0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(widen16(at + 32 * r)), scale, bias);
        w1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(widen16(at + 32 * r + 16)), scale, bias);
      }
      for (int i = 0; i < 4; ++i) {
        const float* xg = p.x + static_cast<size_t>(m0 + i) * p.K + g * kGroup;
        acc[r][i] = _mm512_fmadd_ps(_mm512_loadu_ps(xg), w0, acc[r][i]);
        acc[r][i] = _mm512_fmadd_ps(_mm512_loadu_ps(xg + 16), w1, acc[r][i]);
      }
    }
  }
  for (int r = 0; r < 4; ++r)
    for (int i = 0; i < 4; ++i)
      p.y[static_cast<size_t>(m0 + i) * p.N + 4 * blk + r] = _mm512_reduce_add_ps(acc[r][i]);
}

template <int BITS>
AVX512_TARGET void packed_rows_avx512(const QProblem& p, int n0, int n1) {
  const int groups = p.K / kGroup;
  const int factored = p.M > 2 ? p.M / 4 * 4 : 0;  // rows before it go four at a time
  thread_local std::vector<float> xsum;  // x's group sums, for the factored rows only
  xsum.resize(static_cast<size_t>(p.M) * groups);
  for (int m = factored; m < p.M; ++m)
    group_sums(p.x + static_cast<size_t>(m) * p.K, groups, xsum.data() + m * groups);
  for (int blk = n0 / 4; blk < n1 / 4; ++blk) {
    int m = 0;
    for (; m < factored; m += 4) packed4_avx512<BITS>(p, blk, m);
    if (p.M - m >= 2) {
      packed_avx512<BITS, 2>(p, xsum.data(), blk, m);
      m += 2;
    }
    if (m < p.M) packed_avx512<BITS, 1>(p, xsum.data(), blk, m);
  }
}

template <int BITS, bool HALF>
AVX512_TARGET void rows_avx512_bits(const QProblem& p, int n0, int n1) {
  int n = n0;
  if (p.packed && n0 % 4 == 0 && n1 % 4 == 0)  // whole blocks: run_matmuls splits by fours
    return packed_rows_avx512<BITS>(p, n0, n1);
  if (p.M == 1) {
    for (; n + 4 <= n1; n += 4) block_avx512<BITS, 1, 4, HALF>(p, 0, n);
    for (; n < n1; ++n) block_avx512<BITS, 1, 1, HALF>(p, 0, n);
    return;
  }
  for (; n < n1; ++n) {
    int m = 0;
    for (; m + 4 <= p.M; m += 4) block_avx512<BITS, 4, 1, HALF>(p, m, n);
    if (p.M - m >= 2) {
      block_avx512<BITS, 2, 1, HALF>(p, m, n);
      m += 2;
    }
    if (m < p.M) block_avx512<BITS, 1, 1, HALF>(p, m, n);
  }
}

// Natural-order dequantization, for the prefill path's float32 matmul.
template <int BITS, bool HALF>
AVX512_TARGET void dequant_avx512_bits(const QProblem& p, int n0, int n1) {
  const int groups = p.K / kGroup;
  const size_t row_bytes = static_cast<size_t>(p.K) * BITS / 8;
  const __m128i mask = _mm_set1_epi8(0x0f);
  for (int n = n0; n < n1; ++n) {
    const uint8_t* wrow = p.w + n * row_bytes;
    float* out = p.y + static_cast<size_t>(n) * p.K;
    for (int g = 0; g < groups; ++g) {
      const size_t at = static_cast<size_t>(n) * groups + g;
      __m128i a, b;
      if constexpr (BITS == 4) {
        __m128i v = _mm_loadu_si128((const __m128i*)(wrow + g * 16));
        __m128i lo = _mm_and_si128(v, mask), hi = _mm_and_si128(_mm_srli_epi16(v, 4), mask);
        a = _mm_unpacklo_epi8(lo, hi);
        b = _mm_unpackhi_epi8(lo, hi);
      } else {
        a = _mm_loadu_si128((const __m128i*)(wrow + g * 32));
        b = _mm_loadu_si128((const __m128i*)(wrow + g * 32 + 16));
      }
      const __m512 s = _mm512_set1_ps(param<HALF>(p.scales, at));
      const __m512 bias = _mm512_set1_ps(param<HALF>(p.biases, at));
      _mm512_storeu_ps(out + g * kGroup,
                       _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(a)), s, bias));
      _mm512_storeu_ps(out + g * kGroup + 16,
                       _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(b)), s, bias));
    }
  }
}

}  // namespace

void dequant_avx512(const QProblem& p, int n0, int n1) {
  if (p.bits == 4)
    p.half ? dequant_avx512_bits<4, true>(p, n0, n1) : dequant_avx512_bits<4, false>(p, n0, n1);
  else
    p.half ? dequant_avx512_bits<8, true>(p, n0, n1) : dequant_avx512_bits<8, false>(p, n0, n1);
}

void rows_avx2(const QProblem& p, int n0, int n1) {
  if (p.bits == 4)
    p.half ? rows_avx2_bits<4, true>(p, n0, n1) : rows_avx2_bits<4, false>(p, n0, n1);
  else
    p.half ? rows_avx2_bits<8, true>(p, n0, n1) : rows_avx2_bits<8, false>(p, n0, n1);
}

void rows_avx512(const QProblem& p, int n0, int n1) {
  if (p.bits == 4)
    p.half ? rows_avx512_bits<4, true>(p, n0, n1) : rows_avx512_bits<4, false>(p, n0, n1);
  else
    p.half ? rows_avx512_bits<8, true>(p, n0, n1) : rows_avx512_bits<8, false>(p, n0, n1);
}

#endif  // __x86_64__

RowsKernel select_rows_kernel() {
  std::vector<RowsKernel> usable;
#if defined(__x86_64__)
  __builtin_cpu_init();
  bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
              __builtin_cpu_supports("f16c");
  bool avx512 = avx2 && __builtin_cpu_supports("avx512f") &&
                __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
  if (avx512 && __builtin_cpu_supports("avx512vnni"))
    usable.push_back({"avx512vnni", rows_vnni, dequant_avx512, 16, quantize_x_vnni, rows_avx512});
  if (avx512) usable.push_back({"avx512", rows_avx512, dequant_avx512, 4});
  if (avx2) usable.push_back({"avx2int", rows_avx2int, dequant_scalar, 16, quantize_x_avx2, rows_avx2});
  if (avx2) usable.push_back({"avx2", rows_avx2, dequant_scalar, 4});
#endif
  usable.push_back({"scalar", rows_scalar, dequant_scalar, 0});
  const char* want = std::getenv("MLX_AGENT_KERNEL_ISA");
  for (const auto& k : usable)
    if (want && std::strcmp(want, k.isa) == 0) return k;
  return usable.front();  // the fastest; an unknown or unsupported request gets it too
}

}  // namespace mlx_agent
