// ISA detection (cpuid + xgetbv) and OpenMP thread pinning. Built for the baseline
// x86-64 ISA: this file must run on every x86-64 CPU so the caller can choose which
// per-ISA entry points (cx86_<isa>_*) to bind.
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <cpuid.h>
#include <omp.h>
#include <sched.h>
#include <stdint.h>

#include "pool.h"

// feature bits, shared with Python (plugin_cpu_x86/native.py)
enum {
  CX86_HAS_AVX2 = 1 << 0,
  CX86_HAS_FMA = 1 << 1,
  CX86_HAS_F16C = 1 << 2,
  CX86_HAS_AVX512F = 1 << 3,
  CX86_HAS_AVX512BW = 1 << 4,
  CX86_HAS_AVX512VL = 1 << 5,
  CX86_HAS_AVX512DQ = 1 << 6,
  CX86_HAS_AVX512VNNI = 1 << 7,
  CX86_HAS_AVX512BF16 = 1 << 8,
  CX86_HAS_AMX = 1 << 9,
};

static uint64_t xgetbv0(void) {
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return ((uint64_t)hi << 32) | lo;
}

extern "C" {

// Bit set of CX86_HAS_*: the CPU has the instructions AND the OS saves their state.
int cx86_cpu_features(void) {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
  const bool osxsave = c & bit_OSXSAVE;
  const uint64_t xcr0 = osxsave ? xgetbv0() : 0;
  const bool ymm = (xcr0 & 0x6) == 0x6, zmm = (xcr0 & 0xe6) == 0xe6;
  const bool amx_os = (xcr0 & 0x60000) == 0x60000;
  int f = 0;
  if (ymm && (c & bit_FMA)) f |= CX86_HAS_FMA;
  if (ymm && (c & bit_F16C)) f |= CX86_HAS_F16C;
  unsigned a7, b7, c7, d7;
  if (!__get_cpuid_count(7, 0, &a7, &b7, &c7, &d7)) return f;
  if (ymm && (b7 & bit_AVX2)) f |= CX86_HAS_AVX2;
  if (zmm) {
    if (b7 & bit_AVX512F) f |= CX86_HAS_AVX512F;
    if (b7 & bit_AVX512BW) f |= CX86_HAS_AVX512BW;
    if (b7 & bit_AVX512VL) f |= CX86_HAS_AVX512VL;
    if (b7 & bit_AVX512DQ) f |= CX86_HAS_AVX512DQ;
    if (c7 & bit_AVX512VNNI) f |= CX86_HAS_AVX512VNNI;
    unsigned a71, b71, c71, d71;
    if (a7 >= 1 && __get_cpuid_count(7, 1, &a71, &b71, &c71, &d71) && (a71 & (1u << 5)))
      f |= CX86_HAS_AVX512BF16;
  }
  if (amx_os && (d7 & (1u << 24)) && (d7 & (1u << 25))) f |= CX86_HAS_AMX;  // AMX-TILE, -INT8
  return f;
}

// Pin OpenMP thread i of a team of n to cpus[i] (torch's ops: later teams of the
// calling thread reuse these pooled threads) and the kernels' own pool (pool.cpp).
// Returns the number of threads that failed to pin.
int cx86_bind_threads(const int *cpus, int n) {
  int failed = cx86_pin_pool(cpus, n);
#pragma omp parallel num_threads(n) reduction(+ : failed)
  {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpus[omp_get_thread_num()], &set);
    failed += sched_setaffinity(0, sizeof(set), &set) != 0;
  }
  return failed;
}

}  // extern "C"
