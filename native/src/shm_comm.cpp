// All-reduce and all-gather between the tensor-parallel ranks of one host, through a
// shared-memory buffer (plugins/src/plugins/cpu_native/shm.py maps it; every rank calls
// the collectives in the same order, as with any communicator).
//
// Layout of the buffer: a header line, one flag line per (parity, rank), then one data
// slot of `capacity` bytes per (parity, rank). Collective number `seq` (counted by each
// rank, so equal on all of them) uses parity seq & 1: a rank copies its part into its
// slot, publishes seq in its flag, waits until every flag of that parity has reached seq,
// then reads every slot. Two parities make the slots safe to reuse without a second
// barrier: a rank that starts collective seq + 2 has seen every rank publish seq + 1,
// which each did only after it had finished reading the slots of seq. Tensors larger than
// a slot go through in slot-sized pieces, one seq each. Sums run in rank order, in float32,
// on every rank: the ranks' results are identical bit for bit (their residual streams
// must not drift apart). A waiting rank spins briefly (the others are usually
// microseconds behind in a decode step), then sleeps on the flag's futex. A rank that
// learns a peer died (its process's owner watches it) aborts the buffer: every waiting
// and later collective of every rank then fails at once instead of at the timeout.
// Built for the target's baseline ISA.
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <limits.h>
#include <linux/futex.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>

namespace {

enum { kF32 = 0, kBF16 = 1 };           // dtype codes of native/src/common.h
const long kLine = 64;                  // one flag per cache line
const long kPage = 4096;                // the data slots start on a page
const auto kSpin = std::chrono::microseconds(100);  // spin before sleeping on the futex
const long kSleepNs = 50 * 1000 * 1000;             // a sleep's limit: the deadline is checked after each

struct Header {  // the buffer's first line
  std::atomic<uint32_t> sleepers;  // ranks asleep (or about to be) on some flag's futex
  std::atomic<uint32_t> aborted;   // set by ck_shm_abort: no collective waits any more
};

enum Wait { kArrived, kLate, kAborted };

struct Ctx {
  char *base;
  int rank, world_size;
  long capacity;
  uint32_t seq;  // collectives run so far
  double timeout_s;
};

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ volatile("yield" ::: "memory");
#else
  __asm__ volatile("" ::: "memory");
#endif
}

long flags_offset() { return kLine; }
long data_offset(int world_size) { return (kLine + 2L * world_size * kLine + kPage - 1) / kPage * kPage; }

Header *header(const Ctx *c) { return (Header *)c->base; }
std::atomic<uint32_t> *flag(const Ctx *c, uint32_t parity, int rank) {
  return (std::atomic<uint32_t> *)(c->base + flags_offset() + (parity * c->world_size + rank) * kLine);
}
char *slot(const Ctx *c, uint32_t parity, int rank) {
  return c->base + data_offset(c->world_size) + (parity * c->world_size + rank) * c->capacity;
}

// whether a flag holding `value` has reached collective `seq` (modulo 2^32)
bool reached(uint32_t value, uint32_t seq) { return (int32_t)(value - seq) >= 0; }

// Wait until rank's flag of seq's parity reaches seq, the deadline, or an abort.
Wait wait_for(const Ctx *c, int rank, uint32_t seq, std::chrono::steady_clock::time_point deadline) {
  std::atomic<uint32_t> *f = flag(c, seq & 1, rank);
  Header *h = header(c);
  const auto spin_until = std::chrono::steady_clock::now() + kSpin;
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      if (reached(f->load(std::memory_order_acquire), seq)) return kArrived;
      cpu_relax();
    }
    if (h->aborted.load(std::memory_order_relaxed)) return kAborted;
    if (std::chrono::steady_clock::now() >= spin_until) break;
  }
  for (;;) {
    h->sleepers.fetch_add(1, std::memory_order_seq_cst);
    const uint32_t seen = f->load(std::memory_order_seq_cst);
    if (!reached(seen, seq)) {
      struct timespec limit = {0, kSleepNs};
      syscall(SYS_futex, (uint32_t *)f, FUTEX_WAIT, seen, &limit, nullptr, 0);
    }
    h->sleepers.fetch_sub(1, std::memory_order_seq_cst);
    if (reached(f->load(std::memory_order_acquire), seq)) return kArrived;
    if (h->aborted.load(std::memory_order_seq_cst)) return kAborted;
    if (std::chrono::steady_clock::now() >= deadline) return kLate;
  }
}

// Publish this rank's part of collective seq (already in its slot) and wait for every
// rank's. Returns 0, 1 + the first rank that did not arrive within the timeout, or
// 1 + world_size + the rank awaited when the buffer was aborted.
int exchange(const Ctx *c, uint32_t seq) {
  std::atomic<uint32_t> *mine = flag(c, seq & 1, c->rank);
  mine->store(seq, std::memory_order_seq_cst);
  if (header(c)->sleepers.load(std::memory_order_seq_cst))  // pairs with the sleeper's add, then re-check
    syscall(SYS_futex, (uint32_t *)mine, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(c->timeout_s));
  for (int r = 0; r < c->world_size; ++r) {
    if (r == c->rank) continue;
    switch (wait_for(c, r, seq, deadline)) {
      case kArrived: break;
      case kLate: return 1 + r;
      case kAborted: return 1 + c->world_size + r;
    }
  }
  return 0;
}

inline float bf16_to_f32(uint16_t x) {
  uint32_t u = (uint32_t)x << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

// round-to-nearest-even like torch; NaN stays a (quiet) NaN
inline uint16_t f32_to_bf16(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

void sum_f32(const Ctx *c, uint32_t parity, float *out, long n) {
  const float *first = (const float *)slot(c, parity, 0);
  for (long i = 0; i < n; ++i) out[i] = first[i];
  for (int r = 1; r < c->world_size; ++r) {
    const float *part = (const float *)slot(c, parity, r);
    for (long i = 0; i < n; ++i) out[i] += part[i];
  }
}

void sum_bf16(const Ctx *c, uint32_t parity, uint16_t *out, long n) {
  for (long i = 0; i < n; ++i) {
    float acc = 0.0f;
    for (int r = 0; r < c->world_size; ++r) acc += bf16_to_f32(((const uint16_t *)slot(c, parity, r))[i]);
    out[i] = f32_to_bf16(acc);
  }
}

}  // namespace

extern "C" {

// Bytes of the shared buffer for world_size ranks with data slots of capacity bytes
// (capacity a multiple of 64).
long ck_shm_size(int world_size, long capacity) { return data_offset(world_size) + 2L * world_size * capacity; }

// This rank's handle on a mapped shared buffer of ck_shm_size(world_size, capacity) bytes,
// zero-filled when the first rank maps it; NULL if the handle cannot be allocated.
// A collective waits up to timeout_s for the other ranks.
void *ck_shm_open(void *base, int rank, int world_size, long capacity, double timeout_s) {
  Ctx *c = (Ctx *)malloc(sizeof(Ctx));
  if (!c) return nullptr;
  *c = Ctx{(char *)base, rank, world_size, capacity, 0, timeout_s};
  return c;
}

void ck_shm_close(void *ctx) { free(ctx); }

// Make every rank's waiting and later collectives on this buffer fail (a peer died):
// they return 1 + world_size + the rank they awaited.
void ck_shm_abort(void *ctx) {
  Ctx *c = (Ctx *)ctx;
  header(c)->aborted.store(1, std::memory_order_seq_cst);
  for (uint32_t parity = 0; parity < 2; ++parity)
    for (int r = 0; r < c->world_size; ++r)
      syscall(SYS_futex, (uint32_t *)flag(c, parity, r), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

// Sum buf (count elements of dtype 0: float32 or 1: bfloat16) over the ranks, in place.
// Returns 0, -1 for another dtype, or a failure code of exchange.
int ck_shm_all_reduce(void *ctx, void *buf, long count, int dtype) {
  Ctx *c = (Ctx *)ctx;
  if (dtype != kF32 && dtype != kBF16) return -1;
  const long esize = dtype == kF32 ? 4 : 2, per_piece = c->capacity / esize;
  for (long start = 0; start < count; start += per_piece) {
    const long n = count - start < per_piece ? count - start : per_piece;
    const uint32_t seq = ++c->seq, parity = seq & 1;
    char *piece = (char *)buf + start * esize;
    memcpy(slot(c, parity, c->rank), piece, n * esize);
    if (int late = exchange(c, seq)) return late;
    if (dtype == kF32)
      sum_f32(c, parity, (float *)piece, n);
    else
      sum_bf16(c, parity, (uint16_t *)piece, n);
  }
  return 0;
}

// Every rank's bytes of `in`, in rank order, into out (world_size * bytes).
// Returns 0, or a failure code of exchange.
int ck_shm_all_gather(void *ctx, const void *in, long bytes, void *out) {
  Ctx *c = (Ctx *)ctx;
  for (long start = 0; start < bytes; start += c->capacity) {
    const long n = bytes - start < c->capacity ? bytes - start : c->capacity;
    const uint32_t seq = ++c->seq, parity = seq & 1;
    memcpy(slot(c, parity, c->rank), (const char *)in + start, n);
    if (int late = exchange(c, seq)) return late;
    for (int r = 0; r < c->world_size; ++r) memcpy((char *)out + r * bytes + start, slot(c, parity, r), n);
  }
  return 0;
}

}  // extern "C"
