// The quantized matmul on AVX2 CPUs without VNNI: the VNNI kernel's integer dot products
// (qmatmul_vnni.cpp: the same 16-row packed W, the same x rounded to 16 bits a group and
// split into two signed bytes), each VPDPBUSD done as VPMADDUBSW (W's unsigned codes times
// x's signed bytes, adjacent pairs summed to int16) and one VPMADDWD by ones per group (pairs
// of int16 summed to int32), eight rows a 256-bit register. An 8-bit W (the output head)
// takes another route (block_rows8): 8-bit codes times a byte of x would overflow
// VPMADDUBSW's int16 pairs (255 * 128 * 2), so each code is widened to int16 and multiplied
// by x's whole 16-bit code with VPMADDWD.
//
// Exactness: as the VNNI kernel's, results agree with the float32 reference to about 1e-4
// relative (x keeps 16 bits a group), and the integer sums are exact: VPMADDUBSW saturates
// at 32,767, which no sum here reaches. A 4-bit code times a byte of x is at most 15 * 128,
// a pair 3,840, and a group's eight pairs summed in int16 30,720.
//
// Why not floats: AVX2's float kernel (qmatmul_rows.cpp) widens each code to float32 before
// its FMA, four instructions per eight weights, and reached about 9 GFLOP/s a core on an
// AMD EPYC here, a fraction of its FMA peak; here VPMADDUBSW does 32 byte products an
// instruction, and a group's codes are unpacked once for every row of x.

#include <algorithm>
#include <cstring>

#include "prefetch.h"
#include "qmatmul_rows.h"

#if defined(__x86_64__)
#include <immintrin.h>

namespace mlx_agent {

#define AVX2_INT_TARGET __attribute__((target("avx2,fma,f16c")))

namespace {

constexpr int kGroup = 32, kBlock = 16;
constexpr float kCodeMax = 127.0f * 256.0f;  // as the VNNI kernel: hi fits a signed byte

AVX2_INT_TARGET inline __m256i broadcast_word(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof v);
  return _mm256_set1_epi32(v);
}

// int16 pair sums of W's codes (unsigned, at most 15) times x's bytes, added to `sum`.
AVX2_INT_TARGET inline __m256i dot_add(__m256i sum, __m256i codes, __m256i x) {
  return _mm256_add_epi16(sum, _mm256_maddubs_epi16(codes, x));
}

// Group g's integer dot products (dot[i][h]: x row m0 + i, the block's half h) scaled into
// acc: dot * scale * x's scale + bias * x's sum, W's 16 float16 scales and then 16 biases
// being the last 64 bytes before `group_end`.
template <int MB>
AVX2_INT_TARGET __attribute__((always_inline)) inline void add_group(
    const QProblem& p, const uint8_t* group_end, int m0, int groups, int g,
    const __m256i (&dot)[MB][2], __m256 (&acc)[MB][2]) {
  __m256 scale[2], bias[2];
  for (int h = 0; h < 2; ++h) {
    scale[h] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(group_end - 64 + 16 * h)));
    bias[h] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(group_end - 32 + 16 * h)));
  }
  for (int i = 0; i < MB; ++i) {
    const size_t at = static_cast<size_t>(m0 + i) * groups + g;
    const __m256 xs = _mm256_set1_ps(p.x_scale[at]), xsum = _mm256_set1_ps(p.x_sum[at]);
    for (int h = 0; h < 2; ++h) {
      acc[i][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[i][h]), _mm256_mul_ps(scale[h], xs),
                                  acc[i][h]);
      acc[i][h] = _mm256_fmadd_ps(bias[h], xsum, acc[i][h]);
    }
  }
}

template <int MB>
AVX2_INT_TARGET inline void store_rows(const QProblem& p, int nb, int m0, const __m256 (&acc)[MB][2]) {
  for (int i = 0; i < MB; ++i)
    for (int h = 0; h < 2; ++h)
      _mm256_storeu_ps(p.y + static_cast<size_t>(m0 + i) * p.N + nb * kBlock + 8 * h, acc[i][h]);
}

// y[m0 : m0 + MB, block nb's 16 columns] for a 4-bit W: the block's two halves of eight
// rows, each group's codes unpacked once for the MB rows of x.
template <int MB>
AVX2_INT_TARGET void block_rows(const QProblem& p, int nb, int m0) {
  const int groups = p.K / kGroup;
  const size_t stride = vnni_group_bytes(4);
  const uint8_t* wb = p.packed + static_cast<size_t>(nb) * groups * stride;
  const __m256i low = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
  __m256 acc[MB][2];
  for (int i = 0; i < MB; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
  for (int g = 0; g < groups; ++g, wb += stride) {
    prefetch(wb, groups_ahead(MB) * stride, stride);
    // sums[i][h][plane]: x row i, half h, x's high (0) or low (1) byte
    __m256i sums[MB][2][2];
    for (int i = 0; i < MB; ++i)
      for (int h = 0; h < 2; ++h) sums[i][h][0] = sums[i][h][1] = _mm256_setzero_si256();
    for (int j = 0; j < 8; ++j) {  // codes 4j .. 4j + 3 of each row
      __m256i w[2];
      for (int h = 0; h < 2; ++h) {  // chunk j / 2: low nibbles hold 4j.., high ones 4j + 4..
        const __m256i v = _mm256_loadu_si256((const __m256i*)(wb + 64 * (j / 2) + 32 * h));
        w[h] = _mm256_and_si256(j % 2 ? _mm256_srli_epi16(v, 4) : v, low);
      }
      for (int i = 0; i < MB; ++i) {
        const size_t at = (static_cast<size_t>(m0 + i) * groups + g) * kGroup + 4 * j;
        const __m256i xh = broadcast_word(p.x_hi + at), xl = broadcast_word(p.x_lo + at);
        for (int h = 0; h < 2; ++h) {
          sums[i][h][0] = dot_add(sums[i][h][0], w[h], xh);
          sums[i][h][1] = dot_add(sums[i][h][1], w[h], xl);
        }
      }
    }
    __m256i dot[MB][2];
    for (int i = 0; i < MB; ++i)
      for (int h = 0; h < 2; ++h)  // 256 * hi + lo
        dot[i][h] = _mm256_add_epi32(_mm256_slli_epi32(_mm256_madd_epi16(sums[i][h][0], ones), 8),
                                     _mm256_madd_epi16(sums[i][h][1], ones));
    add_group<MB>(p, wb + stride, m0, groups, g, dot, acc);
  }
  store_rows<MB>(p, nb, m0, acc);
}

// An 8-bit W (the output head) in one pass: each code widened to int16 and multiplied by x's
// whole 16-bit code with VPMADDWD (pairs of products summed to int32: 255 * 32,512 * 2 fits
// easily, and so do a group's eight such pairs a lane). Per 32 codes (a chunk's half) and
// row of x that is 2 VPMADDWD and 2 adds, against the nibble passes' 4 VPMADDUBSW and 4 adds
// (and their 4-bit unpacking); each code is widened once for the MB rows of x. The integer sums are the same as two nibble passes'
// (the route before this one: the same logits, bit for bit, on the bundled model).
//
// The block's group holds, for each chunk j of four codes and half h, 32 bytes: eight rows of
// W (columns of y) by four codes. Widened, the low 16 bytes are columns 0-3 (four codes each)
// and the high 16 columns 4-7; VPMADDWD against x's four 16-bit codes (broadcast) leaves two
// partial sums a column, which VPHADDD adds at the end of the group.
template <int MB>
AVX2_INT_TARGET void block_rows8(const QProblem& p, int nb, int m0) {
  const int groups = p.K / kGroup;
  const size_t stride = vnni_group_bytes(8);
  const uint8_t* wb = p.packed + static_cast<size_t>(nb) * groups * stride;
  // VPHADDD of columns 0-3 (a) and 4-7 (b) leaves a0 a1 b0 b1 | a2 a3 b2 b3 (in columns)
  const __m256i order = _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7);
  __m256 acc[MB][2];
  for (int i = 0; i < MB; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
  for (int g = 0; g < groups; ++g, wb += stride) {
    prefetch(wb, groups_ahead(MB) * stride, stride);
    alignas(32) int16_t code[MB][kGroup];  // x's 16-bit codes: 256 * hi + lo
    for (int i = 0; i < MB; ++i) {
      const size_t at = (static_cast<size_t>(m0 + i) * groups + g) * kGroup;
      for (int c = 0; c < 2; ++c) {
        const __m256i hi = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(p.x_hi + at + 16 * c)));
        const __m256i lo = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(p.x_lo + at + 16 * c)));
        _mm256_store_si256((__m256i*)(code[i] + 16 * c), _mm256_add_epi16(_mm256_slli_epi16(hi, 8), lo));
      }
    }
    __m256i sums[MB][2][2];  // row i, half h, columns 0-3 (0) or 4-7 (1): two partial sums each
    for (int i = 0; i < MB; ++i)
      for (int h = 0; h < 2; ++h) sums[i][h][0] = sums[i][h][1] = _mm256_setzero_si256();
    for (int j = 0; j < 8; ++j) {
      __m256i x[MB];
      for (int i = 0; i < MB; ++i) {
        int64_t four;
        std::memcpy(&four, code[i] + 4 * j, sizeof four);
        x[i] = _mm256_set1_epi64x(four);
      }
      for (int h = 0; h < 2; ++h) {
        const __m128i* w = (const __m128i*)(wb + 64 * j + 32 * h);
        const __m256i w03 = _mm256_cvtepu8_epi16(_mm_loadu_si128(w));
        const __m256i w47 = _mm256_cvtepu8_epi16(_mm_loadu_si128(w + 1));
        for (int i = 0; i < MB; ++i) {
          sums[i][h][0] = _mm256_add_epi32(sums[i][h][0], _mm256_madd_epi16(w03, x[i]));
          sums[i][h][1] = _mm256_add_epi32(sums[i][h][1], _mm256_madd_epi16(w47, x[i]));
        }
      }
    }
    __m256i dot[MB][2];
    for (int i = 0; i < MB; ++i)
      for (int h = 0; h < 2; ++h)
        dot[i][h] = _mm256_permutevar8x32_epi32(
            _mm256_hadd_epi32(sums[i][h][0], sums[i][h][1]), order);
    add_group<MB>(p, wb + stride, m0, groups, g, dot, acc);
  }
  store_rows<MB>(p, nb, m0, acc);
}

template <int BITS>
void rows_bits(const QProblem& p, int n0, int n1) {
  for (int nb = n0 / kBlock; nb < n1 / kBlock; ++nb) {
    int m0 = 0;
    if constexpr (BITS == 8) {
      for (; m0 + 2 <= p.M; m0 += 2) block_rows8<2>(p, nb, m0);
      if (m0 < p.M) block_rows8<1>(p, nb, m0);
    } else {
      for (; m0 + 2 <= p.M; m0 += 2) block_rows<2>(p, nb, m0);
      if (m0 < p.M) block_rows<1>(p, nb, m0);
    }
  }
}

// Four vectors of eight int32 (each fitting a signed byte) as 32 bytes in order: the packs
// work within 128-bit lanes, the permute puts the bytes back in order.
AVX2_INT_TARGET inline __m256i narrow(const __m256i q[4]) {
  const __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
  return _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

}  // namespace

// As the VNNI kernel's quantize_x_vnni.
AVX2_INT_TARGET void quantize_x_avx2(const float* x, QuantizedX& out, size_t g0, size_t g1) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256i half = _mm256_set1_epi32(128);
  for (size_t at = g0; at < g1; ++at) {
    const float* xg = x + at * kGroup;
    __m256 v[4];
    for (int c = 0; c < 4; ++c) v[c] = _mm256_loadu_ps(xg + 8 * c);
    __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                             _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);
    const __m256 s = _mm256_add_ps(_mm256_add_ps(v[0], v[1]), _mm256_add_ps(v[2], v[3]));
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    s4 = _mm_add_ss(s4, _mm_movehdup_ps(s4));
    out.sum[at] = _mm_cvtss_f32(s4);
    const bool tiny = !(amax > 1e-30f);  // adds only its sum's part (1 / s would overflow)
    out.scale[at] = tiny ? 0.0f : amax / kCodeMax;
    const __m256 inv = _mm256_set1_ps(tiny ? 0.0f : kCodeMax / amax);
    __m256i hi[4], lo[4];
    for (int c = 0; c < 4; ++c) {
      const __m256i code = _mm256_cvtps_epi32(_mm256_mul_ps(v[c], inv));  // nearest
      hi[c] = _mm256_srai_epi32(_mm256_add_epi32(code, half), 8);
      lo[c] = _mm256_sub_epi32(code, _mm256_slli_epi32(hi[c], 8));
    }
    _mm256_storeu_si256((__m256i*)(out.hi.data() + at * kGroup), narrow(hi));
    _mm256_storeu_si256((__m256i*)(out.lo.data() + at * kGroup), narrow(lo));
  }
}

void rows_avx2int(const QProblem& p, int n0, int n1) {
  p.bits == 4 ? rows_bits<4>(p, n0, n1) : rows_bits<8>(p, n0, n1);
}

}  // namespace mlx_agent

#endif  // __x86_64__
