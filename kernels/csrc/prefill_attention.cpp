// Causal attention for a prefill chunk (L queries at the end of T keys) as one CPU primitive.
// On the CPU, mx.fast.scaled_dot_product_attention's fallback runs its softmax with a scalar
// exp, which dominates long prompts. Here each kv head's keys are first transposed by tiles
// of 16 and its values widened to float32, once, over the pool; then a task takes a few query
// rows of one kv head's query group: scores sixteen keys at a time from the transposed tiles
// (no horizontal sums), the causal mask, a vectorised exp, then the values, four query
// vectors and 64 features at a time in registers.
#include <algorithm>
#include <cmath>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "attention.h"
#include "pool.h"
#include "primitive.h"
#include "simd16.h"
#include "widen.h"

namespace mlx_agent {

namespace {

using namespace simd16;

// Query rows a task takes, for each head of its group. A task streams its head's transposed
// keys and float32 values once (512 KB each at 2,048 keys, beyond a Zen 3 core's L2), so more
// rows a task read them fewer times: a 512-query chunk over 2,048 keys took 24-28 ms with 16
// rows against 30-36 with 4 (bench_prefill_attention.py, AVX2, two runs each; 32: 27-28).
constexpr int kRowsPerTask = 16;

void check(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("[mlx_agent.prefill_attention] " + what);
}

struct Rows {
  const float* q;  // query row i of group head g at q + g * q_head + i * q_row
  const float* kt;  // the head's keys transposed by tiles of 16 (transpose_tile), D * 16 each
  const float* vf;  // the head's values as float32 rows of Dv
  float* out;      // output row i of group head g at out + g * out_head + i * Dv
  int64_t q_head, q_row, out_head;
  int i0, i1, G, D, Dv;
  int first;       // keys row i sees: [0, first + i]
  float scale;
};

// Keys [t0, t0 + 16) of one kv head transposed, zero past n: kt[d * 16 + j] holds feature d
// of key t0 + j. Done once per head and chunk, before the query rows' tasks read them.
template <Regs R, typename T>
MLX_AGENT_CLONES void transpose_tile(const T* k, int64_t k_row, int D, int t0, int n,
                                     float* kt) {
  using Vt = V<R>;
  Vt tile[kLanes];  // keys t0 .. t0 + 15 as rows, converted, zero past n
  for (int i = 0; i < D; i += kLanes) {
    for (int j = 0; j < kLanes; ++j)
      tile[j] = t0 + j < n ? load<Vt>(k + static_cast<int64_t>(t0 + j) * k_row + i) : Vt{};
    for (int d = 0; d < kLanes; ++d)
      for (int j = 0; j < kLanes; ++j) kt[(i + d) * kLanes + j] = tile[j][d];
  }
}

// A row of n values (a multiple of 16) as float32.
template <Regs R, typename T>
MLX_AGENT_CLONES void widen_row(const T* src, int n, float* dst) {
  for (int i = 0; i < n; i += kLanes) store(dst + i, load<V<R>>(src + i));
}

// Scores of the Q = G * rows query vectors against keys [t0, t0 + 16) (transposed in kt),
// as S[v][t0 ...].
template <typename Vt>
MLX_AGENT_INLINE void score_tile(const Rows& a, int t0, const float* kt,
                                 const float* const* qs, int Q, float* S, int np) {
  int v = 0;
  for (; v + 4 <= Q; v += 4) {
    Vt acc0{}, acc1{}, acc2{}, acc3{};
    for (int d = 0; d < a.D; ++d) {
      const Vt kd = load<Vt>(kt + d * kLanes);
      acc0 += kd * qs[v][d];
      acc1 += kd * qs[v + 1][d];
      acc2 += kd * qs[v + 2][d];
      acc3 += kd * qs[v + 3][d];
    }
    store(S + static_cast<size_t>(v) * np + t0, acc0 * a.scale);
    store(S + static_cast<size_t>(v + 1) * np + t0, acc1 * a.scale);
    store(S + static_cast<size_t>(v + 2) * np + t0, acc2 * a.scale);
    store(S + static_cast<size_t>(v + 3) * np + t0, acc3 * a.scale);
  }
  for (; v < Q; ++v) {
    Vt acc{};
    for (int d = 0; d < a.D; ++d) acc += load<Vt>(kt + d * kLanes) * qs[v][d];
    store(S + static_cast<size_t>(v) * np + t0, acc * a.scale);
  }
}

// acc[v0 .. v0 + NQ)[i0 .. i0 + 16 NC) = the weights S of those query vectors times the
// values (float32, the head's, a.vf) of keys [0, n).
template <typename Vt, int NQ, int NC>
MLX_AGENT_INLINE void weigh_values(const Rows& a, const float* S, int np, int n, int v0, int i0,
                                   float* acc) {
  Vt o[NQ][NC] = {};
  for (int j = 0; j < n; ++j) {
    const float* vr = a.vf + static_cast<size_t>(j) * a.Dv + i0;
    Vt vv[NC];
    for (int c = 0; c < NC; ++c) vv[c] = load<Vt>(vr + c * kLanes);
    for (int q = 0; q < NQ; ++q) {
      const float w = S[static_cast<size_t>(v0 + q) * np + j];
      for (int c = 0; c < NC; ++c) o[q][c] += vv[c] * w;
    }
  }
  for (int q = 0; q < NQ; ++q)
    for (int c = 0; c < NC; ++c) store(acc + static_cast<size_t>(v0 + q) * a.Dv + i0 + c * kLanes, o[q][c]);
}

// REGS: the registers (simd16.h) the values' tiles are sized for: four query vectors and 64
// features in zmm (16 of 32 registers), two and 32 in ymm, one and 16 in xmm.
template <Regs REGS>
MLX_AGENT_CLONES void attend_rows(const Rows& a, std::vector<float>& buf) {
  constexpr int NQ = REGS == Regs::kZmm ? 4 : REGS == Regs::kYmm ? 2 : 1;
  constexpr int NC = NQ;  // 16-float vectors of features
  using Vt = V<REGS>;
  const int R = a.i1 - a.i0, Q = a.G * R;
  const int n = a.first + a.i1;  // keys the last row sees
  const int np = (n + kLanes - 1) / kLanes * kLanes;
  buf.resize(static_cast<size_t>(Q) * np + static_cast<size_t>(Q) * a.Dv);
  float* S = buf.data();
  float* acc = S + static_cast<size_t>(Q) * np;
  std::vector<const float*> qs(Q);  // vector v: head v / R, row i0 + v % R
  for (int v = 0; v < Q; ++v)
    qs[v] = a.q + (v / R) * a.q_head + static_cast<int64_t>(a.i0 + v % R) * a.q_row;
  for (int t0 = 0; t0 < n; t0 += kLanes)
    score_tile<Vt>(a, t0, a.kt + static_cast<size_t>(t0) * a.D, qs.data(), Q, S, np);
  std::vector<float> total(Q);
  for (int v = 0; v < Q; ++v) {
    float* s = S + static_cast<size_t>(v) * np;
    const int seen = a.first + a.i0 + v % R + 1;
    float top = -INFINITY;
    for (int j = 0; j < seen; ++j) top = std::max(top, s[j]);
    Vt sum16{};
    for (int j = 0; j < np; j += kLanes) {
      const Vt e = exp_nonpositive(load<Vt>(s + j) - top);
      store(s + j, e);
    }
    std::fill(s + seen, s + np, 0.0f);  // masked and padding: no weight
    for (int j = 0; j < np; j += kLanes) sum16 += load<Vt>(s + j);
    total[v] = sum(sum16);
  }
  // values: NQ query vectors and NC vectors of features at a time in registers, over every key
  for (int v0 = 0; v0 < Q; v0 += NQ)
    for (int i0 = 0; i0 < a.Dv; i0 += NC * kLanes) {
      if (Q - v0 >= NQ && a.Dv - i0 >= NC * kLanes) {
        weigh_values<Vt, NQ, NC>(a, S, np, n, v0, i0, acc);
      } else {
        for (int v = v0; v < std::min(Q, v0 + NQ); ++v)
          for (int i = i0; i < std::min(a.Dv, i0 + NC * kLanes); i += kLanes)
            weigh_values<Vt, 1, 1>(a, S, np, n, v, i, acc);
      }
    }
  for (int v = 0; v < Q; ++v) {
    float* dst = a.out + (v / R) * a.out_head + static_cast<int64_t>(a.i0 + v % R) * a.Dv;
    const float* o = acc + static_cast<size_t>(v) * a.Dv;
    for (int i = 0; i < a.Dv; ++i) dst[i] = o[i] / total[v];
  }
}

}  // namespace

mx::array prefill_attention(const mx::array& q, const mx::array& k, const mx::array& v,
                            float scale, mx::StreamOrDevice s) {
  check(q.ndim() == 4 && k.ndim() == 4 && v.ndim() == 4, "q, k and v must be 4-D");
  check(q.dtype() == mx::float32, "q must be float32");
  check(k.dtype() == v.dtype() && (k.dtype() == mx::float32 || k.dtype() == mx::float16),
        "k and v must be both float32 or both float16");
  check(k.shape(0) == q.shape(0) && v.shape(0) == q.shape(0), "batch sizes differ");
  check(k.shape(1) == v.shape(1) && k.shape(1) > 0 && q.shape(1) % k.shape(1) == 0,
        "query heads must be a multiple of key/value heads");
  check(k.shape(2) == v.shape(2) && k.shape(2) >= q.shape(2) && q.shape(2) > 0,
        "keys and values must have the same length, at least the queries'");
  check(q.shape(3) == k.shape(3), "q and k head sizes differ");
  check(q.shape(3) % 16 == 0 && v.shape(3) % 16 == 0, "head sizes must be multiples of 16");
  auto stream = mx::to_stream(s, mx::Device::cpu);
  return mx::array({q.shape(0), q.shape(1), q.shape(2), v.shape(3)}, mx::float32,
                   std::make_shared<PrefillAttention>(stream, scale), {q, k, v});
}

void PrefillAttention::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  const auto& q = inputs[0];
  const auto& k = inputs[1];
  const auto& v = inputs[2];
  for (const auto& a : inputs) check(a.strides().back() == 1, "head dimensions must be contiguous");
  begin_eval(stream(), inputs, out).dispatch([q = mx::array::unsafe_weak_copy(q), k = mx::array::unsafe_weak_copy(k), v = mx::array::unsafe_weak_copy(v), out = mx::array::unsafe_weak_copy(out),
                                               scale = scale_]() mutable {
    const int B = q.shape(0), Hq = q.shape(1), Hkv = k.shape(1), G = Hq / Hkv;
    const int L = q.shape(2), T = k.shape(2), D = q.shape(3), Dv = v.shape(3);
    const int blocks = (L + kRowsPerTask - 1) / kRowsPerTask;
    const bool half = k.dtype() == mx::float16;
    const char* kb = static_cast<const char*>(k.data<void>());
    const char* vb = static_cast<const char*>(v.data<void>());
    const size_t el = k.itemsize();
    // every head's keys transposed once, shared by its query rows' tasks
    const int tiles = (T + kLanes - 1) / kLanes;
    const size_t head_floats = static_cast<size_t>(tiles) * kLanes * D;
    // and its values as float32 rows, both shared by its query rows' tasks
    const size_t value_floats = static_cast<size_t>(T) * Dv;
    // (this call's own: a long prompt's buffers are not kept, and nothing is zeroed first)
    std::unique_ptr<float[]> kt_buf(new float[static_cast<size_t>(B) * Hkv * head_floats]);
    std::unique_ptr<float[]> vf_buf(new float[static_cast<size_t>(B) * Hkv * value_floats]);
    float* kt = kt_buf.get();
    float* vf = vf_buf.get();
    pool().run(B * Hkv * tiles, [&](int task) {
      const int head = task / tiles, tile = task % tiles, b = head / Hkv, kvh = head % Hkv;
      const char* kh = kb + (b * k.strides(0) + kvh * k.strides(1)) * el;
      const char* vh = vb + (b * v.strides(0) + kvh * v.strides(1)) * el;
      float* dst = kt + head * head_floats + static_cast<size_t>(tile) * kLanes * D;
      float* vdst = vf + head * value_floats;
      const int t1 = std::min(T, (tile + 1) * kLanes);
      with_regs([&]<Regs R>() {
        if (half) {
          transpose_tile<R>(reinterpret_cast<const uint16_t*>(kh), k.strides(2), D, tile * kLanes, T, dst);
          for (int t = tile * kLanes; t < t1; ++t)
            widen_row<R>(reinterpret_cast<const uint16_t*>(vh) + t * v.strides(2), Dv, vdst + static_cast<size_t>(t) * Dv);
        } else {
          transpose_tile<R>(reinterpret_cast<const float*>(kh), k.strides(2), D, tile * kLanes, T, dst);
          for (int t = tile * kLanes; t < t1; ++t)
            widen_row<R>(reinterpret_cast<const float*>(vh) + t * v.strides(2), Dv, vdst + static_cast<size_t>(t) * Dv);
        }
      });
    });
    auto run = [&](int task) {
      thread_local std::vector<float> buf;
      const int head = task / blocks, block = task % blocks, b = head / Hkv, kvh = head % Hkv;
      Rows a{q.data<float>() + b * q.strides(0) + kvh * G * q.strides(1),
             kt + head * head_floats, vf + head * value_floats,
             out.data<float>() + (static_cast<int64_t>(b) * Hq + kvh * G) * L * Dv,
             q.strides(1), q.strides(2), static_cast<int64_t>(L) * Dv,
             block * kRowsPerTask, std::min(L, (block + 1) * kRowsPerTask), G, D, Dv,
             T - L, scale};
      with_regs([&]<Regs R>() { attend_rows<R>(a, buf); });
    };
    pool().run(B * Hkv * blocks, run);
  });
}

void PrefillAttention::eval_gpu(const std::vector<mx::array>&, mx::array&) {
  throw std::runtime_error("[mlx_agent.prefill_attention] runs on the CPU only");
}

}  // namespace mlx_agent
