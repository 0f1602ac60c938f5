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

template <typename T>
MLX_AGENT_CLONES void attend(const Task& a, std::vector<float>& buf) {
  const int n = a.t1 - a.t0, G = a.G, np = (n + kLanes - 1) / kLanes * kLanes;
  buf.resize(static_cast<size_t>(G) * np + std::max(a.D, a.Dv));
  float* s = buf.data();  // scores [G, np], then their exps (the padding stays 0)
  float* row = s + static_cast<size_t>(G) * np;
  const T* k = static_cast<const T*>(a.k) + a.t0 * a.k_row;
  const T* v = static_cast<const T*>(a.v) + a.t0 * a.v_row;
  for (int j = 0; j < n; ++j) {
    const float* kt = as_float(k + j * a.k_row, a.D, row);
    for (int g = 0; g < G; ++g) {
      const float* qg = a.q + g * a.q_head;
      F16x acc = load(qg) * load(kt);
      for (int i = kLanes; i < a.D; i += kLanes) acc += load(qg + i) * load(kt + i);
      s[static_cast<size_t>(g) * np + j] = sum(acc) * a.scale;
    }
  }
  for (int g = 0; g < G; ++g) {
    float* sg = s + static_cast<size_t>(g) * np;
    float top = -INFINITY;
    for (int j = 0; j < n; ++j) top = std::max(top, sg[j]);
    for (int j = n; j < np; ++j) sg[j] = -INFINITY;
    F16x total{};
    for (int j = 0; j < np; j += kLanes) {
      const F16x e = exp_nonpositive(load(sg + j) - top);
      total += e;
      store(sg + j, e);
    }
    for (int j = n; j < np; ++j) sg[j] = 0.0f;  // no weight in the values below
    a.max[g] = top;
    a.sum[g] = sum(total);  // the padding adds 1e-38 each to a total of at least 1: nothing
  }
  std::fill(a.out, a.out + static_cast<size_t>(G) * a.Dv, 0.0f);
  for (int j = 0; j < n; ++j) {
    const float* vt = as_float(v + j * a.v_row, a.Dv, row);
    for (int i = 0; i < a.Dv; i += kLanes) {
      const F16x x = load(vt + i);
      for (int g = 0; g < G; ++g) {
        float* o = a.out + static_cast<size_t>(g) * a.Dv + i;
        store(o, load(o) + s[static_cast<size_t>(g) * np + j] * x);
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
  const bool has_starts = inputs.size() > 3;
  const mx::array starts = has_starts ? inputs[3] : mx::array(0);
  for (const auto& a : inputs) check(a.strides().back() == 1, "head dimensions must be contiguous");
  begin_eval(stream(), inputs, out).dispatch([q, k, v, starts, has_starts, out, scale = scale_]() mutable {
    const int B = q.shape(0), Hq = q.shape(1), Hkv = k.shape(1), G = Hq / Hkv;
    const int T = k.shape(2), D = q.shape(3), Dv = v.shape(3);
    const bool half = k.dtype() == mx::float16;
    // Each (batch, kv head) reads its keys and values once for its whole query group; its
    // keys are split into parts so that short groups still keep every thread busy.
    const int heads = B * Hkv, threads = pool().size();
    const int want = std::max(1, (4 * threads + heads - 1) / heads);
    const int parts = std::max(1, std::min(want, T / kMinKeysPerTask));
    const int per_part = (T + parts - 1) / parts;
    const int64_t part_stride = 2 + static_cast<int64_t>(Dv);  // per query head: max, sum, out
    std::vector<float> partial(static_cast<size_t>(heads) * parts * G * part_stride);
    const int32_t* first = has_starts ? starts.data<int32_t>() : nullptr;  // [B] or none
    const char* kb = static_cast<const char*>(k.data<void>());
    const char* vb = static_cast<const char*>(v.data<void>());
    const size_t el = k.itemsize();
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
      if (half) {
        attend<uint16_t>(a, buf);
      } else {
        attend<float>(a, buf);
      }
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
