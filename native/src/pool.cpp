// The kernels' thread pool. Unlike an OpenMP team, a parallel call never waits for a
// thread to show up: the caller and whichever workers are awake claim chunks from a
// shared counter, and the caller waits only for chunks already claimed. On a loaded
// machine a descheduled worker therefore costs its share of nothing, where an OpenMP
// barrier would stall the whole step until the OS runs that thread again.
// Idle workers spin briefly (the next kernel call of a decode step comes within
// microseconds), then sleep on a futex. Built for the target's baseline ISA.
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <linux/futex.h>
#include <limits.h>
#include <sched.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "pool.h"

namespace {

const auto kSpin = std::chrono::microseconds(200);  // idle spin before sleeping
const uint32_t kClosed = UINT32_MAX;                // a job's chunk counter before it opens (no chunk that high)

// a spin-wait hint to the core (lets the sibling hyperthread run, saves power)
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ volatile("yield" ::: "memory");
#else
  __asm__ volatile("" ::: "memory");
#endif
}

void futex_wait(std::atomic<uint32_t> *word, uint32_t expected) {
  syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT_PRIVATE, expected, nullptr, nullptr, 0);
}
void futex_wake_all(std::atomic<uint32_t> *word) {
  syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
}

class Pool {
 public:
  // Run fn(ctx, i) for i in [0, n) on the caller and up to nthreads - 1 workers.
  void run(ck_task fn, void *ctx, long n, int nthreads) {
    std::unique_lock<std::mutex> lock(busy_, std::try_to_lock);
    if (!lock.owns_lock() || nthreads <= 1 || n <= 1) {  // another caller has the pool
      for (long i = 0; i < n; ++i) fn(ctx, i);
      return;
    }
    grow(nthreads - 1);
    const uint32_t g = gen_.load(std::memory_order_relaxed) + 1;
    // the last job closed before this one's fields change: a worker still in its claim loop
    // (it read the last job's exhausted counter, not yet its size) would otherwise claim with
    // the old generation an index of this job, read with this job's size and function, and
    // run it twice or after this call returned (a back-to-back call, seen ~1 in 40000)
    next_.store(((uint64_t)g << 32) | kClosed);
    fn_.store(fn, std::memory_order_relaxed);
    ctx_.store(ctx, std::memory_order_relaxed);
    n_.store(n, std::memory_order_relaxed);
    active_.store(nthreads - 1, std::memory_order_relaxed);
    done_.store(0, std::memory_order_relaxed);
    next_.store((uint64_t)g << 32);  // job g open
    gen_.store(g);
    if (sleepers_.load() > 0) futex_wake_all(&gen_);
    long mine = work(g);
    while (done_.load(std::memory_order_acquire) + mine < n) cpu_relax();
  }

  // Pin worker i to cpus[(i + 1) % n] (the caller keeps cpus[0]); later workers too.
  int pin(const int *cpus, int n) {
    std::lock_guard<std::mutex> lock(busy_);
    cpus_.assign(cpus, cpus + n);
    int failed = 0;
    for (size_t i = 0; i < threads_.size(); ++i) failed += pin_one(threads_[i], i);
    return failed;
  }

 private:
  // claim and run chunks of job g until none is left; returns how many ran here.
  // Workers count each chunk done as it ends; the caller counts its own at the end.
  long work(uint32_t g, bool worker = false) {
    long ran = 0;
    for (;;) {
      uint64_t v = next_.load();
      if ((uint32_t)(v >> 32) != g) return ran;
      const long i = (long)(uint32_t)v;
      const long n = n_.load(std::memory_order_relaxed);
      ck_task fn = fn_.load(std::memory_order_relaxed);
      void *ctx = ctx_.load(std::memory_order_relaxed);
      if (i >= n) return ran;
      // success means job g is unfinished, so fn/ctx/n read above are still job g's
      if (!next_.compare_exchange_weak(v, v + 1)) continue;
      fn(ctx, i);
      ++ran;
      if (worker) done_.fetch_add(1, std::memory_order_release);
    }
  }

  void worker(int index) {
    uint32_t seen = gen_.load();
    for (;;) {
      uint32_t g = gen_.load();
      const auto start = std::chrono::steady_clock::now();
      for (int spins = 0; g == seen; g = gen_.load()) {
        cpu_relax();
        if (++spins % 256 == 0 && std::chrono::steady_clock::now() - start > kSpin) {
          sleepers_.fetch_add(1);
          futex_wait(&gen_, seen);
          sleepers_.fetch_sub(1);
        }
      }
      seen = g;
      if (index < active_.load(std::memory_order_relaxed)) work(g, true);
    }
  }

  int pin_one(pthread_t t, size_t i) {
    if (cpus_.empty()) return 0;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpus_[(i + 1) % cpus_.size()], &set);
    return pthread_setaffinity_np(t, sizeof(set), &set) != 0;
  }

  void grow(int workers) {
    while ((int)threads_.size() < workers) {
      const int index = (int)threads_.size();
      std::thread t([this, index] { worker(index); });
      threads_.push_back(t.native_handle());  // valid for good: workers never exit
      t.detach();
      pin_one(threads_.back(), index);
    }
  }

  // Three cache lines, each written by whom it says: the job (the caller, once a job; idle
  // workers spin reading gen_, and every claim reads n_, fn_, ctx_), the claim counter (every
  // thread's compare-exchange), the workers' done count (polled by the caller). Sharing one line,
  // a claim or a worker's count pulled the line from the threads spinning on it and back.
  alignas(64) std::atomic<uint32_t> gen_{0};
  std::atomic<int> active_{0}, sleepers_{0};
  std::atomic<long> n_{0};
  std::atomic<ck_task> fn_{nullptr};
  std::atomic<void *> ctx_{nullptr};
  alignas(64) std::atomic<uint64_t> next_{0};  // (job generation << 32) | next chunk
  alignas(64) std::atomic<long> done_{0};
  alignas(64) std::mutex busy_;
  std::vector<pthread_t> threads_;
  std::vector<int> cpus_;
};

Pool &pool() {
  static Pool *p = new Pool();  // never destroyed: detached workers use it until exit
  return *p;
}

}  // namespace

extern "C" {

void ck_parallel(ck_task fn, void *ctx, long n, int nthreads) { pool().run(fn, ctx, n, nthreads); }

int ck_pin_pool(const int *cpus, int n) { return pool().pin(cpus, n); }

}  // extern "C"
