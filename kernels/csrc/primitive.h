// What every kernel primitive's eval_cpu does before its work: allocate the output and hand
// the inputs and the output to the stream's command encoder (which keeps them alive until
// the dispatched work has run). Returns the encoder to dispatch on.
//
// The work dispatched captures its arrays as array::unsafe_weak_copy, as MLX's own CPU
// kernels do, never as plain copies: a plain copy is a reference to the array's graph node,
// dropped on the stream's thread when the work has run, and when it is the last one the node
// (with its inputs) is destroyed there while the evaluating thread may still be detaching or
// reading the same nodes.
#pragma once

#include <vector>

#include "mlx/allocator.h"
#include "mlx/array.h"
#include "mlx/backend/cpu/encoder.h"

namespace mlx_agent {

inline mlx::core::cpu::CommandEncoder& begin_eval(const mlx::core::Stream& stream,
                                                  const std::vector<mlx::core::array>& inputs,
                                                  mlx::core::array& out) {
  out.set_data(mlx::core::allocator::malloc(out.nbytes()));
  auto& encoder = mlx::core::cpu::get_command_encoder(stream);
  for (const auto& a : inputs) encoder.set_input_array(a);
  encoder.set_output_array(out);
  return encoder;
}

}  // namespace mlx_agent
