// A small persistent thread pool for the kernels: MLX runs a CPU primitive on one thread, and
// starting threads per call (hundreds of calls per token) would cost more than the work.
// Workers spin briefly after each job (the next matmul usually follows within microseconds),
// then sleep on a condition variable so an idle process takes no CPU.
#pragma once

#include <atomic>
#include <cstdint>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace mlx_agent {

class Pool {
 public:
  explicit Pool(int threads);
  ~Pool();
  int size() const { return static_cast<int>(workers_.size()) + 1; }
  // Calls fn(t) for t in [0, tasks) across the pool and the caller; returns when all are done.
  void run(int tasks, const std::function<void(int)>& fn);

 private:
  void work();
  void drain(uint32_t job, int tasks, const std::function<void(int)>* fn);

  std::vector<std::thread> workers_;
  std::mutex run_mutex_;  // one job at a time, whichever stream asks
  std::mutex mutex_;
  std::condition_variable wake_;
  const std::function<void(int)>* fn_ = nullptr;
  int tasks_ = 0;
  // (job << 32) | next task: a worker still finishing one job can never take a task index of
  // the next, because the job number is claimed in the same compare-and-swap.
  std::atomic<uint64_t> state_{0};
  std::atomic<int> done_{0};
  std::atomic<int> sleeping_{0};
  bool stop_ = false;
};

Pool& pool();

}  // namespace mlx_agent
