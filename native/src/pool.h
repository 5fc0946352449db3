// The kernels' thread pool (pool.cpp) and parallel_for on top of it.
#pragma once

typedef void (*ck_task)(void *ctx, long chunk);

extern "C" {
// Run fn(ctx, i) for every i in [0, n), spread over the caller and up to nthreads - 1
// pooled workers; returns when all have run. Chunks run in no particular order.
void ck_parallel(ck_task fn, void *ctx, long n, int nthreads);
// Pin the pool's workers to cpus (worker i to cpus[(i + 1) % n]); returns failures.
int ck_pin_pool(const int *cpus, int n);
}
