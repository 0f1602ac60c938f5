#include "qmatmul.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "mlx/backend/common/utils.h"
#include "mlx/transforms.h"
#include "mlx/backend/cpu/encoder.h"
#include "pool.h"
#include "primitive.h"
#include "qmatmul_rows.h"

namespace mlx_agent {

namespace {

constexpr int kGroup = 32;

const RowsKernel& rows_kernel() {
  static const RowsKernel k = select_rows_kernel();
  return k;
}

void check(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("[mlx_agent.quantized_matmul] " + what);
}

// Rows of W per task: enough tasks for every thread to stay busy when one of them is
// delayed (the cores are shared), few enough that each task amortises its dispatch.
int rows_per_task(int N, int M, int threads) {
  int tasks = threads * 4;
  int rows = (N + tasks - 1) / tasks;
  int min_rows = std::max(8, 64 / std::max(1, M));
  return (std::max(rows, min_rows) + 15) / 16 * 16;  // whole blocks of a packed W (4 or 16)
}

// x as the kernel for `bits` reads it: 4-bit groups are read (evens, odds), so x is laid out
// that way in `buf`; 8-bit x is read as it is.
const float* staged_x(const float* x, size_t M, size_t K, int bits, std::vector<float>& buf) {
  if (bits == 8) return x;
  buf.resize(M * K);
  for (size_t r = 0; r < M; ++r)
    for (size_t k = 0; k < K; ++k) {
      size_t g = k / kGroup * kGroup, i = k % kGroup;
      buf[r * K + g + (i % 2) * (kGroup / 2) + i / 2] = x[r * K + k];
    }
  return buf.data();
}

constexpr size_t kGroupsPerTask = 1024;  // a prefill chunk's x splits over the pool

// x ([M, K]) rounded for an integer kernel into out, its groups split over the pool.
void quantize_x(QuantizeFn quantize, const float* x, int M, int K, QuantizedX& out) {
  const size_t n = static_cast<size_t>(M) * K, groups = n / kGroup;
  out.hi.resize(n);
  out.lo.resize(n);
  out.scale.resize(groups);
  out.sum.resize(groups);
  const int tasks = static_cast<int>((groups + kGroupsPerTask - 1) / kGroupsPerTask);
  pool().run(tasks, [&](int t) {
    const size_t g0 = static_cast<size_t>(t) * kGroupsPerTask;
    quantize(x, out, g0, std::min(groups, g0 + kGroupsPerTask));
  });
}

}  // namespace

// x's M rows of K as one contiguous buffer: x itself when it is row-contiguous, else a copy in
// `buf`.
const float* contiguous_rows(const mx::array& x, std::vector<float>& buf) {
  if (x.flags().row_contiguous) return x.data<float>();
  buf.resize(x.size());
  const float* src = x.data<float>();
  for (size_t i = 0; i < x.size(); ++i) buf[i] = src[mx::elem_to_loc(i, x.shape(), x.strides())];
  return buf.data();
}

void run_matmuls(const float* x, std::vector<QProblem>& problems) {
  // x for 4-bit and for 8-bit matrices, each staged once, and quantized once for an integer
  // kernel; kept per thread, since a decoded token makes a hundred calls (a call's buffers
  // are used only during the call)
  thread_local std::vector<float> staged[2];
  thread_local QuantizedX quantized;
  const float* ready[2] = {nullptr, nullptr};
  bool quantized_ready = false;
  const RowsKernel& kernel = rows_kernel();
  Pool& workers = pool();
  std::vector<int> first{0}, rows;  // each matrix's first task and rows per task
  for (auto& p : problems) {
#if defined(__x86_64__)
    if (kernel.quantize && p.packed) {  // reads x quantized, not x
      if (!quantized_ready) quantize_x(kernel.quantize, x, p.M, p.K, quantized);
      quantized_ready = true;
      p.x_hi = quantized.hi.data();
      p.x_lo = quantized.lo.data();
      p.x_scale = quantized.scale.data();
      p.x_sum = quantized.sum.data();
    } else
#endif
    {
      const int b = p.bits == 8;
      if (!ready[b]) ready[b] = staged_x(x, p.M, p.K, p.bits, staged[b]);
      p.x = ready[b];
    }
    rows.push_back(rows_per_task(p.N, p.M, workers.size()));
    first.push_back(first.back() + (p.N + rows.back() - 1) / rows.back());
  }
  workers.run(first.back(), [&](int t) {
    const int i = static_cast<int>(std::upper_bound(first.begin(), first.end(), t) - first.begin()) - 1;
    const int n0 = (t - first[i]) * rows[i];
    const QProblem& p = problems[i];
    const RowsFn fn = kernel.quantize && !p.packed ? kernel.unpacked : kernel.fn;
    fn(p, n0, std::min(p.N, n0 + rows[i]));
  });
}

std::string isa() { return rows_kernel().isa; }

int packed_rows() { return rows_kernel().packed_rows; }

int threads() { return pool().size(); }

// Checks W's arrays; returns K.
int check_weights(const mx::array& w, const mx::array& scales, const mx::array& biases, int bits) {
  check(bits == 4 || bits == 8, "bits must be 4 or 8");
  check(w.ndim() == 2 && w.dtype() == mx::uint32, "w must be a 2-D uint32 array");
  const int N = w.shape(0), K = w.shape(1) * 32 / bits;
  check(K % kGroup == 0, "K must be a multiple of 32");
  mx::Shape groups_shape{N, K / kGroup};
  check(scales.shape() == groups_shape && biases.shape() == groups_shape,
        "scales and biases must be [N, K / 32]");
  return K;
}

// Scales and biases as the kernel reads them: float16 or float32.
mx::array as_param(const mx::array& a, mx::Stream stream) {
  bool keep = a.dtype() == mx::float16 || a.dtype() == mx::float32;
  return keep ? a : mx::astype(a, mx::float32, stream);
}

mx::array pack_weights(const mx::array& w_in, const mx::array& scales_in,
                       const mx::array& biases_in, int bits, int rows) {
  const int K = check_weights(w_in, scales_in, biases_in, bits);
  check(rows == 4 || rows == 16, "rows must be 4 or 16");
  check(scales_in.dtype() == mx::float16 && biases_in.dtype() == mx::float16,
        "packing takes float16 scales and biases");
  const int N = w_in.shape(0), G = K / kGroup;
  check(N % rows == 0, "N must be a multiple of the block's rows");
  const auto cpu = mx::Device::cpu;
  auto w = mx::contiguous(w_in, false, cpu), s = mx::contiguous(scales_in, false, cpu),
       b = mx::contiguous(biases_in, false, cpu);
  mx::eval({w, s, b});
  const uint8_t* codes = w.data<uint8_t>();  // MLX's packing: 4-bit code k in byte k / 2,
  const uint16_t* sp = s.data<uint16_t>();   // the low nibble first
  const uint16_t* bp = b.data<uint16_t>();
  const size_t row_bytes = static_cast<size_t>(K) * bits / 8, per_row = kGroup * bits / 8;
  const size_t code_bytes = rows * per_row, group_bytes = code_bytes + 4 * rows;
  const size_t total = static_cast<size_t>(N / rows) * G * group_bytes;
  auto* out = static_cast<uint8_t*>(std::malloc(std::max<size_t>(total, 1)));
  check(out != nullptr, "out of memory packing W");
  auto code = [&](size_t n, int k) -> uint8_t {
    const uint8_t* row = codes + n * row_bytes;
    return bits == 8 ? row[k] : (row[k / 2] >> (4 * (k & 1))) & 15;
  };
  pool().run(N / rows, [&](int blk) {
    for (int g = 0; g < G; ++g) {
      uint8_t* dst = out + (static_cast<size_t>(blk) * G + g) * group_bytes;
      const size_t n0 = static_cast<size_t>(blk) * rows;
      if (rows == 4) {  // each row's group as MLX packs it, side by side
        for (int r = 0; r < 4; ++r)
          std::memcpy(dst + r * per_row, codes + (n0 + r) * row_bytes + g * per_row, per_row);
      } else if (bits == 4) {  // chunk c: codes 8c .. 8c + 3 low, 8c + 4 .. 8c + 7 high
        for (int c = 0; c < 4; ++c)
          for (int r = 0; r < 16; ++r)
            for (int i = 0; i < 4; ++i) {
              const int k = g * kGroup + 8 * c + i;
              dst[(c * 16 + r) * 4 + i] = code(n0 + r, k) | code(n0 + r, k + 4) << 4;
            }
      } else {  // chunk c: codes 4c .. 4c + 3
        for (int c = 0; c < 8; ++c)
          for (int r = 0; r < 16; ++r)
            for (int i = 0; i < 4; ++i) dst[(c * 16 + r) * 4 + i] = code(n0 + r, g * kGroup + 4 * c + i);
      }
      for (int r = 0; r < rows; ++r) {
        const size_t at = (n0 + r) * G + g;
        std::memcpy(dst + code_bytes + 2 * r, sp + at, 2);
        std::memcpy(dst + code_bytes + 2 * (rows + r), bp + at, 2);
      }
    }
  });
  return mx::array(out, {N / rows, G, static_cast<int>(group_bytes)}, mx::uint8,
                   [](void* p) { std::free(p); });
}

mx::array dequantize(const mx::array& w, const mx::array& scales, const mx::array& biases,
                     int bits, mx::StreamOrDevice s) {
  const int K = check_weights(w, scales, biases, bits);
  auto stream = mx::to_stream(s, mx::Device::cpu);
  return mx::array({w.shape(0), K}, mx::float32,
                   std::make_shared<QuantizedMatmul>(stream, bits, true),
                   {w, as_param(scales, stream), as_param(biases, stream)});
}

mx::array quantized_matmul(const mx::array& x, const mx::array& w, const mx::array& scales,
                           const mx::array& biases, int bits,
                           const std::optional<mx::array>& packed, mx::StreamOrDevice s) {
  const int K = check_weights(w, scales, biases, bits), N = w.shape(0);
  check(x.ndim() >= 1, "x must have at least one dimension");
  check(x.shape(-1) == K, "x's last dimension does not match w");
  check(mx::issubdtype(x.dtype(), mx::floating), "x must be floating point");

  // Few graph nodes: decode calls this hundreds of times per token. Non-contiguous x is
  // copied in eval_cpu rather than by an extra node here.
  auto stream = mx::to_stream(s, mx::Device::cpu);
  auto param = [&](const mx::array& a) { return as_param(a, stream); };
  auto x32 = x.dtype() == mx::float32 ? x : mx::astype(x, mx::float32, stream);
  auto out_shape = x.shape();
  out_shape.back() = N;
  std::vector<mx::array> inputs{x32, w, param(scales), param(biases)};
  if (packed) add_packed(inputs, {*packed}, {w}, {bits});
  auto y = mx::array(out_shape, mx::float32, std::make_shared<QuantizedMatmul>(stream, bits),
                     std::move(inputs));
  return x.dtype() == mx::float32 ? y : mx::astype(y, x.dtype(), stream);
}

void QuantizedMatmul::eval_dequantize(const std::vector<mx::array>& inputs, mx::array& out) {
  const auto& w = inputs[0];
  const auto& scales = inputs[1];
  const auto& biases = inputs[2];
  for (const auto& a : inputs)
    check(a.flags().row_contiguous, "weights, scales and biases must be contiguous");
  auto& encoder = begin_eval(stream(), inputs, out);
  QProblem p{nullptr, w.data<uint8_t>(), scales.data<void>(), biases.data<void>(),
             scales.dtype() == mx::float16, out.data<float>(), 0, static_cast<int>(w.shape(0)),
             static_cast<int>(out.shape(1)), bits_};
  encoder.dispatch([p]() {
    const RowsFn fn = rows_kernel().dequant;
    Pool& workers = pool();
    const int rows = rows_per_task(p.N, 1, workers.size());
    const int tasks = (p.N + rows - 1) / rows;
    workers.run(tasks, [&](int t) { fn(p, t * rows, std::min(p.N, (t + 1) * rows)); });
  });
}

void QuantizedMatmul::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  if (dequantize_) return eval_dequantize(inputs, out);
  const auto& x = inputs[0];
  const auto& w = inputs[1];
  const auto& scales = inputs[2];
  const auto& biases = inputs[3];
  for (size_t i = 1; i < inputs.size(); ++i)
    check(inputs[i].flags().row_contiguous, "weights, scales and biases must be contiguous");
  auto& encoder = begin_eval(stream(), inputs, out);

  const int K = x.shape(-1);
  QProblem p{x.data<float>(),
             w.data<uint8_t>(),
             scales.data<void>(),
             biases.data<void>(),
             scales.dtype() == mx::float16,
             out.data<float>(),
             static_cast<int>(x.size() / K),
             static_cast<int>(w.shape(0)),
             K,
             bits_,
             inputs.size() == 5 ? inputs[4].data<uint8_t>() : nullptr};
  encoder.dispatch([p, x = mx::array::unsafe_weak_copy(x)]() mutable {
    std::vector<float> copy;
    std::vector<QProblem> one{p};
    run_matmuls(contiguous_rows(x, copy), one);
  });
}

std::vector<mx::array> quantized_matmuls(const mx::array& x, const std::vector<mx::array>& ws,
                                         const std::vector<mx::array>& scales,
                                         const std::vector<mx::array>& biases,
                                         const std::vector<int>& bits,
                                         const std::vector<mx::array>& packed,
                                         mx::StreamOrDevice s) {
  check(!ws.empty() && scales.size() == ws.size() && biases.size() == ws.size() &&
            bits.size() == ws.size(), "one scales, biases and bits per w");
  check(x.ndim() >= 1 && x.dtype() == mx::float32, "x must be float32");
  auto stream = mx::to_stream(s, mx::Device::cpu);
  std::vector<mx::array> inputs{x};
  std::vector<mx::Shape> shapes;
  for (size_t i = 0; i < ws.size(); ++i) {
    check(check_weights(ws[i], scales[i], biases[i], bits[i]) == x.shape(-1),
          "x's last dimension does not match w");
    inputs.insert(inputs.end(), {ws[i], as_param(scales[i], stream), as_param(biases[i], stream)});
    shapes.push_back(x.shape());
    shapes.back().back() = ws[i].shape(0);
  }
  add_packed(inputs, packed, ws, bits);
  std::vector<mx::Dtype> dtypes(ws.size(), mx::float32);
  return mx::array::make_arrays(std::move(shapes), dtypes,
                                std::make_shared<QuantizedMatmuls>(stream, bits), inputs);
}

bool add_packed(std::vector<mx::array>& inputs, const std::vector<mx::array>& packed,
                const std::vector<mx::array>& ws, const std::vector<int>& bits) {
  if (packed.empty()) return false;
  check(packed.size() == ws.size(), "one packed W per matrix, or none");
  for (size_t i = 0; i < ws.size(); ++i) {
    const size_t N = ws[i].shape(0), groups = ws[i].shape(1) * 32 / bits[i] / kGroup;
    const int rows = std::max(packed_rows(), 4);
    // (both layouts take the same bytes: the first dimension tells them apart)
    check(packed[i].dtype() == mx::uint8 && N % rows == 0 && packed[i].ndim() == 3 &&
              packed[i].shape(0) == static_cast<int>(N / rows) &&
              packed[i].size() == N / 4 * groups * packed_group_bytes(bits[i]),
          "a packed W is uint8, blocks of " + std::to_string(rows) +
              " rows of K / 32 groups (kernels/qmatmul.py's pack)");
    inputs.push_back(packed[i]);
  }
  return true;
}

std::vector<QProblem> weight_problems(const std::vector<mx::array>& inputs, size_t first,
                                      const std::vector<int>& bits, int M, bool packed) {
  std::vector<QProblem> out;
  for (size_t i = 0; i < bits.size(); ++i) {
    const auto &w = inputs[first + 3 * i], &scales = inputs[first + 3 * i + 1],
               &biases = inputs[first + 3 * i + 2];
    for (const auto* a : {&w, &scales, &biases})
      check(a->flags().row_contiguous, "weights, scales and biases must be contiguous");
    out.push_back({nullptr, w.data<uint8_t>(), scales.data<void>(), biases.data<void>(),
                   scales.dtype() == mx::float16, nullptr, M, static_cast<int>(w.shape(0)),
                   static_cast<int>(w.shape(1)) * 32 / bits[i], bits[i]});
    if (packed) {
      const auto& pw = inputs[inputs.size() - bits.size() + i];
      check(pw.flags().row_contiguous, "a packed W must be contiguous");
      out.back().packed = pw.data<uint8_t>();
    }
  }
  return out;
}

void QuantizedMatmuls::eval_cpu(const std::vector<mx::array>& inputs,
                                std::vector<mx::array>& outputs) {
  const auto& x = inputs[0];
  auto& encoder = mx::cpu::get_command_encoder(stream());
  auto problems = weight_problems(inputs, 1, bits_, static_cast<int>(x.size() / x.shape(-1)),
                                  inputs.size() == 1 + 4 * bits_.size());
  for (size_t i = 0; i < outputs.size(); ++i) {
    outputs[i].set_data(mx::allocator::malloc(outputs[i].nbytes()));
    problems[i].y = outputs[i].data<float>();
  }
  for (const auto& a : inputs) encoder.set_input_array(a);
  for (auto& o : outputs) encoder.set_output_array(o);
  encoder.dispatch([problems, x = mx::array::unsafe_weak_copy(x)]() mutable {
    std::vector<float> copy;
    run_matmuls(contiguous_rows(x, copy), problems);
  });
}

void QuantizedMatmuls::eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  throw std::runtime_error("[mlx_agent.quantized_matmuls] runs on the CPU only");
}

void QuantizedMatmul::eval_gpu(const std::vector<mx::array>&, mx::array&) {
  throw std::runtime_error("[mlx_agent.quantized_matmul] runs on the CPU only");
}

}  // namespace mlx_agent
