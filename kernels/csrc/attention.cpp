#include "attention.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "pool.h"
#include "primitive.h"
#include "simd16.h"
#include "widen.h"

namespace mlx_agent {

namespace {

using namespace simd16;

constexpr int kMinKeysPerTask = 128;  // below this, splitting a head's keys costs more than it saves

void check(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("[mlx_agent.decode_attention] " + what);
}

// One task: keys [t0, t1) of one (batch, kv head) for the group of query heads that share it.
// Leaves the group's unnormalised partial softmax: the score maximum, the sum of exp(s - max)
// and sum of exp(s - max) * v per query head, which the caller merges across tasks.
struct Task {
  const float* q;  // the group's queries, head g at q + g * q_head
  const void* k;   // key row t at k + t * k_row elements
  const void* v;
  int64_t q_head, k_row, v_row;
  int t0, t1, G, D, Dv;  // D and Dv multiples of kLanes
  float scale;
  float* max;  // [G]
  float* sum;  // [G]
  float* out;  // [G, Dv]
};

// The sums of eight vectors' lanes, r[j] = sum(a[j]), by halving and pairing: about 37
// shuffles and adds where eight separate sums take about 70.
template <int W>
MLX_AGENT_INLINE F8x sum8(const Vec<W>* a) {
  F8x b[8];
  for (int j = 0; j < 8; ++j) b[j] = fold8(a[j]);
  F8x t[4];  // t[p]: four partial sums of b[2p], then four of b[2p + 1]
  for (int p = 0; p < 4; ++p)
    t[p] = __builtin_shufflevector(b[2 * p], b[2 * p + 1], 0, 1, 2, 3, 8, 9, 10, 11) +
           __builtin_shufflevector(b[2 * p], b[2 * p + 1], 4, 5, 6, 7, 12, 13, 14, 15);
  F8x u[2];  // u[p]: two partial sums each of vectors 4p, 4p + 2, 4p + 1, 4p + 3
  for (int p = 0; p < 2; ++p)
    u[p] = __builtin_shufflevector(t[2 * p], t[2 * p + 1], 0, 1, 8, 9, 4, 5, 12, 13) +
           __builtin_shufflevector(t[2 * p], t[2 * p + 1], 2, 3, 10, 11, 6, 7, 14, 15);
  return __builtin_shufflevector(u[0], u[1], 0, 4, 2, 6, 8, 12, 10, 14) +
         __builtin_shufflevector(u[0], u[1], 1, 5, 3, 7, 9, 13, 11, 15);
}

// s[j] = scale * q . k_j for the 16 key rows at k (row stride k_row floats; rows past the
// tile's end hold zeros), KEYS keys' accumulators at a time: eight in zmm, four in ymm
// (eight would take all sixteen), one in xmm, summed by sum8 or alone.
template <Regs R>
MLX_AGENT_INLINE void score_tile(const float* q, const float* k, int64_t k_row, int D,
                                 float scale, float* s) {
  using Vt = V<R>;
  if constexpr (R == Regs::kXmm) {
    for (int j = 0; j < kLanes; ++j) {
      Vt acc{};
      for (int c = 0; c < D; c += kLanes) acc += load<Vt>(q + c) * load<Vt>(k + j * k_row + c);
      s[j] = sum(acc) * scale;
    }
    return;
  }
  constexpr int KEYS = R == Regs::kZmm ? 8 : 4;
  for (int h = 0; h < 2; ++h) {  // eight keys' sums at a time, KEYS in registers
    const float* kh = k + 8 * h * k_row;
    Vt acc[8];
    for (int j0 = 0; j0 < 8; j0 += KEYS) {
      Vt part[KEYS] = {};
      for (int c = 0; c < D; c += kLanes) {
        const Vt qc = load<Vt>(q + c);
        for (int j = 0; j < KEYS; ++j) part[j] += qc * load<Vt>(kh + (j0 + j) * k_row + c);
      }
      for (int j = 0; j < KEYS; ++j) acc[j0 + j] = part[j];
    }
    const F8x r = sum8(acc) * scale;
    std::memcpy(s + 8 * h, &r, sizeof r);
  }
}

// out[g0 .. g0 + NQ)[i0 .. i0 + 16 NC) += the weights w[g][0 .. n) times the n value rows at
// v (row stride v_row floats), with the sums in registers across the rows.
template <typename Vt, int NQ, int NC>
MLX_AGENT_INLINE void weigh_tile(const float* v, int64_t v_row, int n, const float* w,
                                 int64_t w_head, float* out, int Dv, int g0, int i0) {
  Vt o[NQ][NC];
  for (int g = 0; g < NQ; ++g)
    for (int c = 0; c < NC; ++c) o[g][c] = load<Vt>(out + (g0 + g) * Dv + i0 + c * kLanes);
  for (int j = 0; j < n; ++j) {
    Vt vv[NC];
    for (int c = 0; c < NC; ++c) vv[c] = load<Vt>(v + j * v_row + i0 + c * kLanes);
    for (int g = 0; g < NQ; ++g) {
      const float wg = w[(g0 + g) * w_head + j];
      for (int c = 0; c < NC; ++c) o[g][c] += vv[c] * wg;
    }
  }
  for (int g = 0; g < NQ; ++g)
    for (int c = 0; c < NC; ++c) store(out + (g0 + g) * Dv + i0 + c * kLanes, o[g][c]);
}

// NC: 64 features (4 vectors) a tile in zmm, where four heads' sums take 16 of 32
// registers; 32 in ymm (two heads, 8 of 16).
template <typename Vt, int NQ, int NC>
MLX_AGENT_INLINE void weigh_heads(const float* v, int64_t v_row, int n, const float* w,
                                  int64_t w_head, float* out, int Dv, int g0) {
  int i0 = 0;
  for (; i0 + NC * kLanes <= Dv; i0 += NC * kLanes)
    weigh_tile<Vt, NQ, NC>(v, v_row, n, w, w_head, out, Dv, g0, i0);
  for (; i0 < Dv; i0 += kLanes) weigh_tile<Vt, NQ, 1>(v, v_row, n, w, w_head, out, Dv, g0, i0);
}

// Scores sixteen keys at a time (eight accumulators, summed by sum8), a vectorised exp, then
// the values sixteen rows at a time with up to four heads' sums of 64 features in registers
// (zmm; two heads and 32 features in ymm). float16 rows are widened once per tile of 16
// (widen: VCVTPH2PS where the CPU has it), float32 rows read in place. In xmm (CPUs without
// AVX2, whose 16 registers hold four of these vectors): scores a key at a time and values a
// head and 16 features at a time, so nothing spills.
template <typename T, Regs R>
MLX_AGENT_CLONES void attend(const Task& a, WidenFn widen, std::vector<float>& buf) {
  using Vt = V<R>;
  constexpr bool kHalf = sizeof(T) == 2;
  const int n = a.t1 - a.t0, G = a.G, np = (n + kLanes - 1) / kLanes * kLanes;
  const int width = std::max(a.D, a.Dv);
  buf.resize(static_cast<size_t>(G) * np + kLanes * static_cast<size_t>(width));
  float* s = buf.data();  // scores [G, np], then their exps (the padding stays 0)
  float* tile = s + static_cast<size_t>(G) * np;  // 16 rows widened, or a zero-padded tail
  const T* k = static_cast<const T*>(a.k) + a.t0 * a.k_row;
  const T* v = static_cast<const T*>(a.v) + a.t0 * a.v_row;
  // a tile of 16 rows of keys or values [j0, j0 + 16) as float32, with its row stride
  auto rows = [&](const T* src, int64_t row, int d, int j0) -> std::pair<const float*, int64_t> {
    const int m = std::min(kLanes, n - j0);
    if constexpr (kHalf) {
      widen(reinterpret_cast<const uint16_t*>(src + j0 * row), row, m, d, tile);
    } else {
      if (m == kLanes) return {reinterpret_cast<const float*>(src + j0 * row), row};
      for (int j = 0; j < m; ++j)
        std::memcpy(tile + j * d, src + (j0 + j) * row, d * sizeof(float));
    }
    std::fill(tile + m * d, tile + kLanes * d, 0.0f);
    return {tile, d};
  };
  for (int j0 = 0; j0 < n; j0 += kLanes) {
    const auto [kt, stride] = rows(k, a.k_row, a.D, j0);
    for (int g = 0; g < G; ++g)
      score_tile<R>(a.q + g * a.q_head, kt, stride, a.D, a.scale,
                        s + static_cast<size_t>(g) * np + j0);
  }
  for (int g = 0; g < G; ++g) {
    float* sg = s + static_cast<size_t>(g) * np;
    float top = -INFINITY;
    for (int j = 0; j < n; ++j) top = std::max(top, sg[j]);
    for (int j = n; j < np; ++j) sg[j] = -INFINITY;
    Vt total{};
    for (int j = 0; j < np; j += kLanes) {
      const Vt e = exp_nonpositive(load<Vt>(sg + j) - top);
      total += e;
      store(sg + j, e);
    }
    for (int j = n; j < np; ++j) sg[j] = 0.0f;  // no weight in the values below
    a.max[g] = top;
    a.sum[g] = sum(total);  // the padding adds 1e-38 each to a total of at least 1: nothing
  }
  std::fill(a.out, a.out + static_cast<size_t>(G) * a.Dv, 0.0f);
  for (int j0 = 0; j0 < n; j0 += kLanes) {
    const auto [vt, stride] = rows(v, a.v_row, a.Dv, j0);
    const int m = std::min(kLanes, n - j0);
    const float* w = s + j0;
    if constexpr (R == Regs::kXmm) {
      for (int g = 0; g < G; ++g)
        for (int i0 = 0; i0 < a.Dv; i0 += kLanes)
          weigh_tile<Vt, 1, 1>(vt, stride, m, w, np, a.out, a.Dv, g, i0);
    } else if constexpr (R == Regs::kYmm) {
      for (int g0 = 0; g0 < G; g0 += 2) {
        if (G - g0 >= 2) weigh_heads<Vt, 2, 2>(vt, stride, m, w, np, a.out, a.Dv, g0);
        else weigh_heads<Vt, 1, 2>(vt, stride, m, w, np, a.out, a.Dv, g0);
      }
    } else {
      for (int g0 = 0; g0 < G; g0 += 4) {
        switch (std::min(4, G - g0)) {
          case 4: weigh_heads<Vt, 4, 4>(vt, stride, m, w, np, a.out, a.Dv, g0); break;
          case 3: weigh_heads<Vt, 3, 4>(vt, stride, m, w, np, a.out, a.Dv, g0); break;
          case 2: weigh_heads<Vt, 2, 4>(vt, stride, m, w, np, a.out, a.Dv, g0); break;
          default: weigh_heads<Vt, 1, 4>(vt, stride, m, w, np, a.out, a.Dv, g0); break;
        }
      }
    }
  }
}

// Merges a head group's partial softmaxes into its output rows [G, Dv]. The parts lie one
// after another, each as max[G], sum[G], out[G, Dv].
void merge(const float* parts_at, int parts, int G, int Dv, float* dst) {
  const int64_t next = static_cast<int64_t>(G) * (2 + Dv);
  for (int g = 0; g < G; ++g, dst += Dv) {
    float top = -INFINITY, total = 0.0f;
    for (int j = 0; j < parts; ++j) top = std::max(top, parts_at[j * next + g]);
    std::fill(dst, dst + Dv, 0.0f);
    if (top == -INFINITY) continue;  // no key to attend (a start past the end): zeros
    for (int j = 0; j < parts; ++j) {
      const float* part = parts_at + j * next;
      const float w = std::exp(part[g] - top);
      total += w * part[G + g];
      const float* o = part + 2 * G + static_cast<size_t>(g) * Dv;
      for (int i = 0; i < Dv; ++i) dst[i] += w * o[i];
    }
    for (int i = 0; i < Dv; ++i) dst[i] /= total;
  }
}

}  // namespace

mx::array decode_attention(const mx::array& q, const mx::array& k, const mx::array& v,
                           float scale, const std::optional<mx::array>& starts,
                           mx::StreamOrDevice s) {
  check(q.ndim() == 4 && k.ndim() == 4 && v.ndim() == 4, "q, k and v must be 4-D");
  check(q.dtype() == mx::float32, "q must be float32");
  check(k.dtype() == v.dtype() && (k.dtype() == mx::float32 || k.dtype() == mx::float16),
        "k and v must be both float32 or both float16");
  check(q.shape(2) == 1, "one query position only");
  check(k.shape(0) == q.shape(0) && v.shape(0) == q.shape(0), "batch sizes differ");
  check(k.shape(1) == v.shape(1) && k.shape(1) > 0 && q.shape(1) % k.shape(1) == 0,
        "query heads must be a multiple of key/value heads");
  check(k.shape(2) == v.shape(2) && k.shape(2) > 0, "keys and values must have the same length");
  check(q.shape(3) == k.shape(3), "q and k head sizes differ");
  check(q.shape(3) % 16 == 0 && v.shape(3) % 16 == 0, "head sizes must be multiples of 16");
  auto stream = mx::to_stream(s, mx::Device::cpu);
  std::vector<mx::array> inputs{q, k, v};
  if (starts) {
    check(starts->ndim() == 1 && starts->shape(0) == q.shape(0),
          "starts must hold one key index per batch row");
    check(mx::issubdtype(starts->dtype(), mx::integer), "starts must be integers");
    inputs.push_back(mx::contiguous(mx::astype(*starts, mx::int32, stream), false, stream));
  }
  return mx::array({q.shape(0), q.shape(1), 1, v.shape(3)}, mx::float32,
                   std::make_shared<DecodeAttention>(stream, scale), std::move(inputs));
}

void DecodeAttention::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  const auto& q = inputs[0];
  const auto& k = inputs[1];
  const auto& v = inputs[2];
  using mx::array;
  std::optional<array> starts;
  if (inputs.size() > 3) starts = array::unsafe_weak_copy(inputs[3]);
  for (const auto& a : inputs) check(a.strides().back() == 1, "head dimensions must be contiguous");
  // Weak copies, as MLX's own kernels take (and primitive.h's note says why)
  begin_eval(stream(), inputs, out).dispatch([q = array::unsafe_weak_copy(q),
                                              k = array::unsafe_weak_copy(k),
                                              v = array::unsafe_weak_copy(v), starts,
                                              out = array::unsafe_weak_copy(out),
                                              scale = scale_]() mutable {
    const int B = q.shape(0), Hq = q.shape(1), Hkv = k.shape(1), G = Hq / Hkv;
    const int T = k.shape(2), D = q.shape(3), Dv = v.shape(3);
    const bool half = k.dtype() == mx::float16;
    // Each (batch, kv head) reads its keys and values once for its whole query group; its
    // keys are split into parts so that short groups still keep every thread busy.
    const int heads = B * Hkv, threads = pool().size();
    const int want = std::max(1, (4 * threads + heads - 1) / heads);
    const int most = std::max(1, T / kMinKeysPerTask);
    int parts = std::min(want, most);
    while ((heads * parts) % threads != 0 && parts < most) ++parts;  // even shares
    const int per_part = (T + parts - 1) / parts;
    const int64_t part_stride = 2 + static_cast<int64_t>(Dv);  // per query head: max, sum, out
    std::vector<float> partial(static_cast<size_t>(heads) * parts * G * part_stride);
    const int32_t* first = starts ? starts->data<int32_t>() : nullptr;  // [B] or none
    const char* kb = static_cast<const char*>(k.data<void>());
    const char* vb = static_cast<const char*>(v.data<void>());
    const size_t el = k.itemsize();
    const WidenFn widen = widen_half();
    auto slot = [&](int head, int part) {
      return partial.data() + (static_cast<size_t>(head) * parts + part) * G * part_stride;
    };
    auto run = [&](int task) {
      thread_local std::vector<float> buf;
      const int head = task / parts, part = task % parts, b = head / Hkv, kvh = head % Hkv;
      const int t1 = std::min(T, (part + 1) * per_part);
      const int t0 = std::max(part * per_part, first ? first[b] : 0);
      float* p = slot(head, part);
      if (t0 >= t1) {  // an empty tail part: weight zero in the merge
        for (int g = 0; g < G; ++g) p[g] = -INFINITY, p[G + g] = 0.0f;
        std::fill(p + 2 * G, p + G * part_stride, 0.0f);
        return;
      }
      Task a{q.data<float>() + b * q.strides(0) + kvh * G * q.strides(1),
             kb + (b * k.strides(0) + kvh * k.strides(1)) * el,
             vb + (b * v.strides(0) + kvh * v.strides(1)) * el,
             q.strides(1), k.strides(2), v.strides(2), t0, t1, G, D, Dv, scale,
             p, p + G, p + 2 * G};
      with_regs([&]<Regs R>() {
        half ? attend<uint16_t, R>(a, widen, buf) : attend<float, R>(a, widen, buf);
      });
    };
    const int tasks = heads * parts;
    if (static_cast<int64_t>(T) * D * B * Hq < (1 << 16)) {
      for (int t = 0; t < tasks; ++t) run(t);  // too little work to hand out
    } else {
      pool().run(tasks, run);
    }
    for (int head = 0; head < heads; ++head)
      merge(slot(head, 0), parts, G, Dv, out.data<float>() + static_cast<size_t>(head) * G * Dv);
  });
}

void DecodeAttention::eval_gpu(const std::vector<mx::array>&, mx::array&) {
  throw std::runtime_error("[mlx_agent.decode_attention] runs on the CPU only");
}

}  // namespace mlx_agent
