// Where the one-row (decode) quantized matmul loses time: a standalone probe, no MLX.
//
//     g++ -O2 -std=c++17 scripts/bench_qlayout.cpp -o /tmp/bench_qlayout
//     /tmp/bench_qlayout [LAYERS]     # default 30: the bundled model's 66 MB of Q4 layers
//
// One row of x against every matrix of LAYERS llama layers shaped as SmolLM2-135M's (q, k,
// v, o, gate, up, down), one thread, AVX-512, best of 15 passes. With 30 layers the weights
// do not fit the caches and stream from memory, as in decode; with 1 they stay in cache.
// - current: the kernel's layout and arithmetic (kernels/csrc/qmatmul_rows.cpp): MLX's
//   affine layout (codes, scales and biases in three arrays), four weight rows a pass, each
//   group dequantized (scale * q + bias) before the multiply;
// - factored: the same layout; each group's scale and bias factored out
//   (s * sum(x q) + b * sum(x)), codes made floats by a register lookup, scales converted
//   sixteen at a time;
// - packed: the factored arithmetic on a layout that puts four rows' codes, scales and
//   biases of a group next to each other, so a pass reads one contiguous stream.
// Measured on the 2-core AMD EPYC (Zen 4) this project develops on, machine idle:
//   in cache (1 layer):  current 8.1 GB/s, factored 10.1, packed 11.7-11.8;
//   from memory (30):    current 5.5-6.6 GB/s, factored 4.8-7.2, packed 8.6-10.9 (1.5-1.65x).
// The arithmetic alone helps only in cache: from memory, the three arrays' streams limit the
// current layout. (The factored arithmetic was tried in the kernel itself and gave no
// difference in decode, for this reason.)
#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <cstdint>
constexpr int G = 32;
__attribute__((target("avx512f,avx512bw,avx512vl,f16c,fma")))
inline __m512i widen16(const uint8_t* p) {
  const __m512i idx = _mm512_set_epi8(
      -1, -1, -1, 15, -1, -1, -1, 14, -1, -1, -1, 13, -1, -1, -1, 12,
      -1, -1, -1, 11, -1, -1, -1, 10, -1, -1, -1, 9, -1, -1, -1, 8,
      -1, -1, -1, 7, -1, -1, -1, 6, -1, -1, -1, 5, -1, -1, -1, 4,
      -1, -1, -1, 3, -1, -1, -1, 2, -1, -1, -1, 1, -1, -1, -1, 0);
  return _mm512_shuffle_epi8(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i*)p)), idx);
}
struct Mat { int N, K; uint8_t* w; uint16_t* s; uint16_t* b; uint8_t* packed; };
template <int PF>
__attribute__((target("avx512f,avx512bw,avx512vl,f16c,fma")))
void runA(const Mat& m, const float* x, float* y) {
  const int groups = m.K / G; const size_t rb = m.K / 2;
  for (int n = 0; n < m.N; n += 4) {
    if (PF) { for (int r = 0; r < 4; ++r) { const char* p = (const char*)(m.w + (n + 4 + r) * rb); for (size_t o = 0; o < rb; o += 64) _mm_prefetch(p + o, _MM_HINT_T0);} 
      const char* s = (const char*)(m.s + (n + 4) * groups); for (int o = 0; o < 4 * groups * 2; o += 64) { _mm_prefetch(s + o, _MM_HINT_T0); _mm_prefetch((const char*)(m.b + (n + 4) * groups) + o, _MM_HINT_T0);} }
    __m512 acc[4][2];
    for (int r = 0; r < 4; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int g = 0; g < groups; ++g) {
      __m512 x0 = _mm512_loadu_ps(x + g * G), x1 = _mm512_loadu_ps(x + g * G + 16);
      for (int r = 0; r < 4; ++r) {
        size_t at = (size_t)(n + r) * groups + g;
        __m512i v = widen16(m.w + (n + r) * rb + g * 16);
        __m512 q0 = _mm512_cvtepi32_ps(_mm512_and_si512(v, _mm512_set1_epi32(15)));
        __m512 q1 = _mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4));
        __m512 s = _mm512_set1_ps(_cvtsh_ss(m.s[at])), b = _mm512_set1_ps(_cvtsh_ss(m.b[at]));
        acc[r][0] = _mm512_fmadd_ps(x0, _mm512_fmadd_ps(q0, s, b), acc[r][0]);
        acc[r][1] = _mm512_fmadd_ps(x1, _mm512_fmadd_ps(q1, s, b), acc[r][1]);
      }
    }
    for (int r = 0; r < 4; ++r) y[n + r] = _mm512_reduce_add_ps(_mm512_add_ps(acc[r][0], acc[r][1]));
  }
}
// packed: block of 4 rows: for each group: 64 bytes codes (4 rows x 16), 8 bytes scales(4 f16), 8 bytes biases
template <int PF>
__attribute__((target("avx512f,avx512bw,avx512vl,f16c,fma")))
void runC(const Mat& m, const float* x, float* y) {
  const int groups = m.K / G; const size_t gb = 80, blk = gb * groups;
  alignas(64) float xs[64];
  for (int g = 0; g < groups; ++g) xs[g] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_loadu_ps(x + g*G), _mm512_loadu_ps(x + g*G + 16)));
  const __m512 codes = _mm512_set_ps(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  for (int n = 0; n < m.N; n += 4) {
    const uint8_t* p = m.packed + (size_t)(n / 4) * blk;
    if (PF) for (size_t o = 0; o < blk; o += 64) _mm_prefetch((const char*)p + blk * PF + o, _MM_HINT_T0);
    __m512 acc[4];
    __m128 bacc = _mm_setzero_ps();
    for (int r = 0; r < 4; ++r) acc[r] = _mm512_setzero_ps();
    for (int g = 0; g < groups; ++g, p += gb) {
      __m512 x0 = _mm512_loadu_ps(x + g * G), x1 = _mm512_loadu_ps(x + g * G + 16);
      __m128 sv = _mm_cvtph_ps(_mm_loadl_epi64((const __m128i*)(p + 64)));
      __m128 bv = _mm_cvtph_ps(_mm_loadl_epi64((const __m128i*)(p + 72)));
      bacc = _mm_fmadd_ps(bv, _mm_set1_ps(xs[g]), bacc);
      alignas(16) float ss[4]; _mm_store_ps(ss, sv);
      for (int r = 0; r < 4; ++r) {
        __m512i v = widen16(p + 16 * r);
        __m512 q0 = _mm512_permutexvar_ps(v, codes);
        __m512 q1 = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), codes);
        __m512 t = _mm512_fmadd_ps(x1, q1, _mm512_mul_ps(x0, q0));
        acc[r] = _mm512_fmadd_ps(t, _mm512_set1_ps(ss[r]), acc[r]);
      }
    }
    alignas(16) float bs[4]; _mm_store_ps(bs, bacc);
    for (int r = 0; r < 4; ++r) y[n + r] = _mm512_reduce_add_ps(acc[r]) + bs[r];
  }
}
template <int PF>
__attribute__((target("avx512f,avx512bw,avx512vl,f16c,fma")))
void runE(const Mat& m, const float* x, float* y) {
  const int groups = m.K / G; const size_t rb = m.K / 2;
  alignas(64) float xs[64]; alignas(64) float sc[4][64];
  for (int g = 0; g < groups; ++g) xs[g] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_loadu_ps(x + g*G), _mm512_loadu_ps(x + g*G + 16)));
  const __m512 codes = _mm512_set_ps(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  for (int n = 0; n < m.N; n += 4) {
    for (int r = 0; r < 4; ++r) for (int g = 0; g < groups; g += 16) {
      __mmask16 mk = groups - g >= 16 ? 0xffff : (1u << (groups - g)) - 1;
      _mm512_mask_storeu_ps(sc[r] + g, mk, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mk, m.s + (size_t)(n + r) * groups + g)));
    }
    __m512 acc[4];
    for (int r = 0; r < 4; ++r) acc[r] = _mm512_setzero_ps();
    for (int g = 0; g < groups; ++g) {
      __m512 x0 = _mm512_loadu_ps(x + g * G), x1 = _mm512_loadu_ps(x + g * G + 16);
      for (int r = 0; r < 4; ++r) {
        __m512i v = widen16(m.w + (n + r) * rb + g * 16);
        __m512 q0 = _mm512_permutexvar_ps(v, codes);
        __m512 q1 = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), codes);
        __m512 t = _mm512_fmadd_ps(x1, q1, _mm512_mul_ps(x0, q0));
        acc[r] = _mm512_fmadd_ps(t, _mm512_set1_ps(sc[r][g]), acc[r]);
      }
    }
    for (int r = 0; r < 4; ++r) {
      __m512 bacc = _mm512_setzero_ps();
      for (int g = 0; g < groups; g += 16) {
        __mmask16 mk = groups - g >= 16 ? 0xffff : (1u << (groups - g)) - 1;
        bacc = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mk, m.b + (size_t)(n + r) * groups + g)), _mm512_maskz_loadu_ps(mk, xs + g), bacc);
      }
      y[n + r] = _mm512_reduce_add_ps(_mm512_add_ps(acc[r], bacc));
    }
  }
}
int main(int argc, char** argv) {
  int shapes[][2] = {{576,576},{192,576},{192,576},{576,576},{1536,576},{1536,576},{576,1536}};
  std::vector<Mat> mats; size_t bytes = 0;
  int L = argc > 1 ? atoi(argv[1]) : 30; for (int l = 0; l < L; ++l) for (auto& sh : shapes) {
    Mat m{sh[0], sh[1]}; int groups = m.K / G;
    m.w = (uint8_t*)aligned_alloc(64, (size_t)m.N * m.K / 2); m.s = (uint16_t*)aligned_alloc(64, (size_t)m.N*groups*2 + 64); m.b = (uint16_t*)aligned_alloc(64, (size_t)m.N*groups*2 + 64);
    for (size_t i = 0; i < (size_t)m.N*m.K/2; ++i) m.w[i] = rand();
    for (size_t i = 0; i < (size_t)m.N*groups; ++i) { m.s[i] = 0x2000 + rand()%256; m.b[i] = 0xa000 + rand()%256; }
    m.packed = (uint8_t*)aligned_alloc(64, (size_t)m.N/4*groups*80 + 64);
    for (int n = 0; n < m.N; n += 4) for (int g = 0; g < groups; ++g) {
      uint8_t* p = m.packed + ((size_t)(n/4)*groups + g)*80;
      for (int r = 0; r < 4; ++r) { memcpy(p + 16*r, m.w + (size_t)(n+r)*m.K/2 + g*16, 16); memcpy(p+64+2*r, &m.s[(size_t)(n+r)*groups+g], 2); memcpy(p+72+2*r, &m.b[(size_t)(n+r)*groups+g], 2);} }
    bytes += (size_t)m.N * m.K / 2 + (size_t)m.N * groups * 4;
    mats.push_back(m);
  }
  std::vector<float> x(1536), y(1536); for (auto& v : x) v = rand() / (float)RAND_MAX;
  auto time = [&](auto fn) { double best = 1e9; for (int r = 0; r < 15; ++r) { auto t0 = std::chrono::steady_clock::now(); for (auto& m : mats) fn(m, x.data(), y.data()); double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); if (s < best) best = s; } return best; };
  for (int k = 0; k < 2; ++k) {
    double a = time(runA<0>), e = time(runE<0>), c = time(runC<0>);
    printf("%.1f MB of Q4 weights: current %.2f ms (%.1f GB/s) | factored %.2f (%.1f) | packed %.2f (%.1f), %.2fx\n",
           bytes / 1e6, a * 1e3, bytes / a / 1e9, e * 1e3, bytes / e / 1e9, c * 1e3, bytes / c / 1e9, a / c);
  }
}
