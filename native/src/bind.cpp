// Thread pinning for CORE_CPU_OMP_THREADS_BIND: the OpenMP team torch's ops run on and the
// kernels' own pool (pool.cpp). Linux only, any ISA; built for the target's baseline ISA.
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <omp.h>
#include <sched.h>

#include "pool.h"

extern "C" {

// Pin OpenMP thread i of a team of n to cpus[i] (torch's ops: later teams of the
// calling thread reuse these pooled threads) and the kernels' own pool (pool.cpp).
// Returns the number of threads that failed to pin.
int ck_bind_threads(const int *cpus, int n) {
  int failed = ck_pin_pool(cpus, n);
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
