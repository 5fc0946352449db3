// Weight formats of the quantized linear kernels (quant.cpp, matvec.cpp): GGUF
// blocks of 32 values (Q8_0, Q4_0, Q4_1) or int8 rows with per-row float32 scales, each
// either row by row as stored (float32 activations) or repacked in groups of 8 rows
// ("x8", quant.cpp: int8 activations).
#pragma once

#include "common.h"

// weight formats, shared with Python (plugins/src/plugins/cpu_native/library.py)
// CK_F32W: plain float32 rows, read as blocks of 32 (matvec.cpp only: float activations)
enum { CK_Q8_0 = 0, CK_Q4_0 = 1, CK_Q4_1 = 2, CK_INT8 = 3, CK_F32W = 4 };
// the same formats repacked (x8 code = row code + CK_X8)
enum { CK_X8 = 8, CK_Q8_0X8 = 8, CK_Q4_0X8 = 9, CK_Q4_1X8 = 10, CK_INT8X8 = 11 };

namespace CK_NS {

static const int kBlock = 32;

static inline bool is_x8(int qt) { return qt >= CK_X8; }

// bytes of one row's block of 32 (the same in the x8 layout: 8 rows' blocks side by side)
static inline long block_bytes(int qt) {
  qt = is_x8(qt) ? qt - CK_X8 : qt;
  return qt == CK_Q8_0 ? 34 : qt == CK_Q4_0 ? 18 : qt == CK_Q4_1 ? 20 : qt == CK_F32W ? 128 : 32;
}
static inline long row_bytes(int qt, long k) { return k / kBlock * block_bytes(qt); }
static inline float load_any(const void *p, int dt, long i) {
  return dt == CK_F32 ? ((const float *)p)[i] : to_f32(((const bf16_t *)p)[i]);
}

// scale[r] and bias[r] of output rows j0 .. j0 + nr - 1 (1 and 0 where there are none)
static inline void row_params(const float *row_scale, const void *bias, int bias_dt, long j0,
                              long nr, float *scale, float *bj) {
  for (long r = 0; r < nr; ++r) {
    scale[r] = row_scale ? row_scale[j0 + r] : 1.0f;
    bj[r] = bias ? load_any(bias, bias_dt, j0 + r) : 0.0f;
  }
}

// Output rows handed to a thread at a time: small enough that a thread that got
// descheduled (a loaded machine) leaves most of its share to the others, large
// enough that the shared counter is touched rarely.
static inline long row_chunk(long n, int nthreads) {
  long c = n / ((long)nthreads * 8);
  return c < 16 ? 16 : c;
}

}  // namespace CK_NS
