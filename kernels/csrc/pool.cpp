#include "pool.h"

#include <chrono>
#include <cstdlib>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define MLX_AGENT_PAUSE() _mm_pause()
#else
#define MLX_AGENT_PAUSE() std::this_thread::yield()
#endif

namespace mlx_agent {

namespace {
constexpr auto kSpin = std::chrono::microseconds(50);  // spin this long before sleeping

uint32_t job_of(uint64_t state) { return static_cast<uint32_t>(state >> 32); }

int default_threads() {
  if (const char* env = std::getenv("MLX_AGENT_KERNEL_THREADS")) {
    int n = std::atoi(env);
    if (n > 0) return n > 64 ? 64 : n;
  }
  unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n > 16 ? 16 : n);
}
}  // namespace

Pool::Pool(int threads) {
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { work(); });
}

Pool::~Pool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
    state_.fetch_add(uint64_t{1} << 32);
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

// Runs tasks of `job` (whose count and function the caller read with its number, under
// mutex_) until none are left. Reading tasks_ and fn_ here instead would race with the next
// job's run(): a worker that found this job's tasks exhausted could read the next job's
// larger count before the job number changed, claim a task index past this job's end, and
// call a function that no longer exists (or count a task the next job never gave it). It
// did: five of thirty-four processes of a BFCL-shaped run crashed, a worker calling a
// destroyed std::function for a task claimed 33 jobs before (a core dump; the README's
// kernels section).
void Pool::drain(uint32_t job, int tasks, const std::function<void(int)>* fn) {
  for (;;) {
    uint64_t s = state_.load(std::memory_order_acquire);
    int t = static_cast<int>(s & 0xffffffffu);
    if (job_of(s) != job || t >= tasks) return;
    if (!state_.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel)) continue;
    (*fn)(t);
    done_.fetch_add(1, std::memory_order_release);
  }
}

void Pool::run(int tasks, const std::function<void(int)>& fn) {
  if (workers_.empty() || tasks <= 1) {
    for (int t = 0; t < tasks; ++t) fn(t);
    return;
  }
  std::lock_guard<std::mutex> one_job(run_mutex_);
  uint32_t job;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    fn_ = &fn;
    tasks_ = tasks;
    done_.store(0, std::memory_order_relaxed);
    job = job_of(state_.load()) + 1;
    state_.store(uint64_t{job} << 32, std::memory_order_release);
  }
  if (sleeping_.load() > 0) wake_.notify_all();
  drain(job, tasks, &fn);
  // A worker still holding a task may have lost its core (the machine may be shared):
  // yield now and then instead of spinning against it.
  for (int i = 1; done_.load(std::memory_order_acquire) < tasks; ++i) {
    MLX_AGENT_PAUSE();
    if ((i & 63) == 0) std::this_thread::yield();
  }
}

void Pool::work() {
  uint32_t seen = 0;
  for (;;) {
    auto start = std::chrono::steady_clock::now();
    for (int i = 0; job_of(state_.load(std::memory_order_acquire)) == seen; ++i) {
      MLX_AGENT_PAUSE();
      if ((i & 63) == 63) std::this_thread::yield();
      if ((i & 255) == 255 && std::chrono::steady_clock::now() - start > kSpin) {
        std::unique_lock<std::mutex> lock(mutex_);
        sleeping_.fetch_add(1);
        wake_.wait(lock, [&] { return job_of(state_.load()) != seen; });
        sleeping_.fetch_sub(1);
        break;
      }
    }
    std::unique_lock<std::mutex> lock(mutex_);
    if (stop_) return;
    seen = job_of(state_.load());  // with its count and function: run() sets all three
    const int tasks = tasks_;      // under mutex_
    const std::function<void(int)>* fn = fn_;
    lock.unlock();
    drain(seen, tasks, fn);
  }
}

Pool& pool() {
  static Pool p(default_threads());
  return p;
}

}  // namespace mlx_agent
