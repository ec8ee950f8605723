// The bounded host pool (see host_pool.h).
#include "host/host_pool.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "runtime/wakeups.h"

namespace coarse::cpu {
namespace {

int ReadThreads() {
  const int hardware = std::max(1u, std::thread::hardware_concurrency());
  int cap = 8;
  if (const char* env = std::getenv("COARSE_JAX_HOST_THREADS")) {
    const int v = std::atoi(env);
    if (v > 0) cap = v;
  }
  return std::max(1, std::min(hardware, cap));
}

// One ParallelFor call: its blocks, taken by index, and how many are done.
struct Job {
  const std::function<void(int64_t, int64_t)>* fn;
  int64_t n, block, blocks;
  std::atomic<int64_t> next{0};
  std::mutex mu;
  std::condition_variable cv;
  int64_t done = 0;  // guarded by mu

  // Runs blocks until none is left; returns when this thread has no more.
  void Work() {
    for (int64_t b; (b = next.fetch_add(1)) < blocks;) {
      const int64_t lo = b * block;
      (*fn)(lo, std::min(n, lo + block));
      std::lock_guard<std::mutex> lock(mu);
      if (++done == blocks) cv.notify_all();
    }
  }
};

class Pool {
 public:
  explicit Pool(int threads) {
    for (int t = 0; t < threads; ++t) {
      CountWakeup(Wakeup::kThreadStart);
      std::thread([this] {
        pthread_setname_np(pthread_self(), "coarse pool");  // top -H, gdb, py-spy
        Loop();
      }).detach();
    }
  }
  void Offer(const std::shared_ptr<Job>& job, int64_t helpers) {
    std::lock_guard<std::mutex> lock(mu_);
    for (int64_t h = 0; h < helpers; ++h) queue_.push_back(job);
    cv_.notify_all();
  }

 private:
  void Loop() {
    for (;;) {
      std::shared_ptr<Job> job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return !queue_.empty(); });
        job = std::move(queue_.front());
        queue_.pop_front();
      }
      job->Work();  // nothing left of it: returns at once
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
};

Pool& ThePool() {
  static Pool* pool = new Pool(HostThreads() - 1);  // never destroyed, as its threads
  return *pool;
}

}  // namespace

int HostThreads() {
  static const int threads = ReadThreads();
  return threads;
}

void ParallelFor(int64_t n, int64_t min_block, const std::function<void(int64_t, int64_t)>& fn) {
  const int threads = HostThreads();
  if (threads <= 1 || n < 2 * min_block) {
    fn(0, n);
    return;
  }
  auto job = std::make_shared<Job>();
  job->fn = &fn;
  job->n = n;
  job->blocks = std::min<int64_t>(threads, n / min_block);
  job->block = ((n + job->blocks - 1) / job->blocks + 63) / 64 * 64;  // whole vectors
  job->blocks = (n + job->block - 1) / job->block;
  ThePool().Offer(job, job->blocks - 1);
  job->Work();
  std::unique_lock<std::mutex> lock(job->mu);
  job->cv.wait(lock, [&] { return job->done == job->blocks; });
}

}  // namespace coarse::cpu
