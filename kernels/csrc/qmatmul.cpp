#include "qmatmul.h"

#include <algorithm>
#include <string>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "mlx/backend/common/utils.h"
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
  const QuantizeFn quantize = rows_kernel().quantize;
  Pool& workers = pool();
  std::vector<int> first{0}, rows;  // each matrix's first task and rows per task
  for (auto& p : problems) {
#if defined(__x86_64__)
    if (quantize && p.packed) {  // reads x quantized, not x
      if (!quantized_ready) quantize(x, p.M, p.K, quantized);
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
  const RowsFn fn = rows_kernel().fn;
  workers.run(first.back(), [&](int t) {
    const int i = static_cast<int>(std::upper_bound(first.begin(), first.end(), t) - first.begin()) - 1;
    const int n0 = (t - first[i]) * rows[i];
    fn(problems[i], n0, std::min(problems[i].N, n0 + rows[i]));
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
