// A hint that bytes will be read soon: a packed weight's next groups, a KV cache's next rows.
// Both stream from memory during decode (the weights and a batch's caches are far larger than
// L2), and at one to sixteen rows of x the kernels wait on those reads more than they compute.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mlx_agent {

// The cache lines of [p + offset, p + offset + bytes) toward L1. A hint never faults, so the
// range may lie past an array's end; the address is formed as an integer, not as a pointer
// out of bounds.
inline void prefetch(const void* p, std::ptrdiff_t offset, std::size_t bytes) {
  const std::uintptr_t at = reinterpret_cast<std::uintptr_t>(p) + offset;
  for (std::uintptr_t line = at & ~std::uintptr_t{63}; line < at + bytes; line += 64)
    __builtin_prefetch(reinterpret_cast<const void*>(line), 0, 3);
}

// Groups of a packed W to prefetch ahead: a few where each group feeds four or more rows of x
// (its arithmetic hides the rest), more where it feeds one or two. Measured on the bundled
// model's shapes, weights not in cache (see the README's kernels section).
constexpr int groups_ahead(int rows) { return rows >= 4 ? 6 : 16; }

}  // namespace mlx_agent
