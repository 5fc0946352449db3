// Weight formats of the quantized linear kernels (quant.cpp, matvec.cpp): GGUF
// blocks of 32 values (Q8_0, Q4_0, Q4_1; Q5_0, Q5_1 with float activations only) or int8 rows with per-row float32 scales, each
// either row by row as stored (float32 activations) or repacked in groups of 8 rows
// ("x8", quant.cpp: int8 activations).
#pragma once

#include "common.h"

// weight formats, shared with Python (plugins/src/plugins/cpu_native/library.py)
// CK_F32W: plain float32 rows, read as blocks of 32 (matvec.cpp only: float activations)
// CK_Q4_K, CK_Q5_K, CK_Q6_K: GGUF K-quant super-blocks of 256 values, read 32 at a time
// (matvec.cpp only: float activations)
enum { CK_Q8_0 = 0, CK_Q4_0 = 1, CK_Q4_1 = 2, CK_INT8 = 3, CK_F32W = 4, CK_Q4_K = 5, CK_Q5_K = 6, CK_Q6_K = 7 };
// the first four formats repacked (x8 code = row code + CK_X8)
enum { CK_X8 = 8, CK_Q8_0X8 = 8, CK_Q4_0X8 = 9, CK_Q4_1X8 = 10, CK_INT8X8 = 11 };
// CK_Q5_0, CK_Q5_1: 5-bit GGUF blocks of 32 (what llama.cpp's K-quant mixes use for rows
// whose length is not a multiple of 256, e.g. Gemma 3 270M's 640); matvec.cpp only
enum { CK_Q5_0 = 12, CK_Q5_1 = 13 };
// added to an x8 code: round activations to int8 per row instead of per block of 32
enum { CK_PER_TOKEN = 64 };

namespace CK_NS {

static const int kBlock = 32;

static inline bool is_x8(int qt) { return qt >= CK_X8 && qt <= CK_INT8X8; }
static inline bool is_q5(int qt) { return qt == CK_Q5_0 || qt == CK_Q5_1; }

// bytes of one row's block of 32 (the same in the x8 layout: 8 rows' blocks side by side)
static inline long block_bytes(int qt) {
  qt = is_x8(qt) ? qt - CK_X8 : qt;
  return qt == CK_Q8_0 ? 34 : qt == CK_Q4_0 ? 18 : qt == CK_Q4_1 ? 20 : qt == CK_Q5_0 ? 22
       : qt == CK_Q5_1 ? 24 : qt == CK_F32W ? 128 : 32;
}
static const int kSuper = 256;  // values of a K-quant super-block
static inline bool is_k(int qt) { return qt == CK_Q4_K || qt == CK_Q5_K || qt == CK_Q6_K; }
static inline long super_bytes(int qt) { return qt == CK_Q4_K ? 144 : qt == CK_Q5_K ? 176 : 210; }
static inline long row_bytes(int qt, long k) {
  return is_k(qt) ? k / kSuper * super_bytes(qt) : k / kBlock * block_bytes(qt);
}

// The 6-bit scale and min of sub-block s (0..7) of a Q4_K/Q5_K super-block (12 packed bytes).
static inline void k_scale_min(const uint8_t *sc, int s, float *scale, float *min) {
  if (s < 4) {
    *scale = (float)(sc[s] & 63);
    *min = (float)(sc[s + 4] & 63);
  } else {
    *scale = (float)((sc[s + 4] & 0x0f) | ((sc[s - 4] >> 6) << 4));
    *min = (float)((sc[s + 4] >> 4) | ((sc[s] >> 6) << 4));
  }
}

// Values 32 b .. 32 b + 31 of a K-quant row, as the GGUF reference dequantizes them:
// Q4_K/Q5_K (d * scale) * q - dmin * min; Q6_K (d * scale) * (q - 32), a scale per 16.
template <int QT>
static inline void decode_k(const uint8_t *row, long b, float *w) {
  const uint8_t *p = row + b / 8 * super_bytes(QT);
  const int s = (int)(b % 8);
  if (QT == CK_Q6_K) {
    const int h = s / 4, g = s % 4;
    const uint8_t *ql = p + 64 * h + (g & 1) * 32, *qh = p + 128 + 32 * h;
    const int8_t *sc = (const int8_t *)(p + 192);
    const float d = read_half(p + 208);
    for (int l = 0; l < 32; ++l) {
      const int lo = g < 2 ? ql[l] & 0x0f : ql[l] >> 4, hi = (qh[l] >> (2 * g)) & 3;
      w[l] = d * (float)sc[8 * h + 2 * g + l / 16] * (float)((lo | (hi << 4)) - 32);
    }
    return;
  }
  float scale, min;
  k_scale_min(p + 4, s, &scale, &min);
  const float d = read_half(p) * scale, m = read_half(p + 2) * min;
  const uint8_t *qs = p + (QT == CK_Q4_K ? 16 : 48) + 32 * (s / 2);
  for (int l = 0; l < 32; ++l) {
    int q = s % 2 ? qs[l] >> 4 : qs[l] & 0x0f;
    if (QT == CK_Q5_K) q |= ((p[16 + l] >> s) & 1) << 4;
    w[l] = d * (float)q - m;
  }
}
// Block b of a Q5_0 / Q5_1 row, as the GGUF reference dequantizes it: f16 d (and m),
// 32 high bits (little-endian, as the file holds them), 16 bytes of low nibbles; value i
// (0..15 low nibbles, 16..31 high ones) is q = low | high << 4, Q5_0 d * (q - 16), Q5_1 d * q + m.
template <int QT>
static inline void decode_q5(const uint8_t *row, long b, float *w) {
  const uint8_t *p = row + b * block_bytes(QT);
  const float d = read_half(p), m = QT == CK_Q5_1 ? read_half(p + 2) : -16.0f * d;
  const uint8_t *qh = p + (QT == CK_Q5_1 ? 4 : 2), *qs = qh + 4;
  const uint32_t h = (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24;
  for (int i = 0; i < 16; ++i) {
    const int lo = (qs[i] & 0x0f) | (int)((h >> i) & 1) << 4, hi = (qs[i] >> 4) | (int)((h >> (i + 16)) & 1) << 4;
    if (QT == CK_Q5_0) {
      w[i] = d * (float)(lo - 16);
      w[i + 16] = d * (float)(hi - 16);
    } else {
      w[i] = d * (float)lo + m;
      w[i + 16] = d * (float)hi + m;
    }
  }
}

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
