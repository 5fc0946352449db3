// Weight formats of the quantized linear kernels (quant.cpp, matvec.cpp): GGUF
// blocks (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, K-quants), int8 or E4M3 rows with per-row float32
// scales, or float32 rows: row by row as stored (float32 activations), or repacked in
// groups of 8 rows ("x8", quant.cpp: int8 activations).
#pragma once

#include "common.h"
#include "amx.h"
#include "fp8.h"

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
// CK_E4M3W: float8 E4M3 codes (FP8 checkpoints), a float32 scale per row as CK_INT8;
// matvec.cpp only (the caller rounds FP8 activations)
enum { CK_E4M3W = 14 };
// Blocks of 32 with float32 scales, only in the x8 layout (quant.cpp): what the K-quants and
// Q5 formats become for int8 activations (linear.py: float_scaled_rows), their values unchanged.
// A row's block: two float32 scales, then the codes.
//   CK_Q4FX8: d, m, 16 nibble bytes as Q4_1; value d * q + m (Q4_K)
//   CK_U8FX8: d, m, 32 code bytes 0..63; value d * q + m (Q5_0, Q5_1, Q5_K)
//   CK_S8FX8: d0, d1, 32 signed code bytes; value d0 * q (values 0-15), d1 * q (16-31) (Q6_K)
enum { CK_Q4FX8 = 15, CK_U8FX8 = 16, CK_S8FX8 = 17 };
// added to an x8 code: round activations to int8 per row instead of per block of 32
enum { CK_PER_TOKEN = 64 };
// added to an x8 code: the default path. The activations are rounded to int16 per block of 32
// (quant.cpp: to 2^-16 of the block's largest magnitude, the x8 kernel on two int8 halves), or
// where the build's int8 kernel is slow at many rows (no AVX-512: quant.cpp's
// act16_on_panel) multiplied in float32 by the panel kernel (matvec.cpp), which reads the x8
// layout as it is.
enum { CK_ACT16 = 128 };

namespace CK_NS {

static const int kBlock = 32;

static constexpr bool is_x8(int qt) {
  return (qt >= CK_X8 && qt <= CK_INT8X8) || (qt >= CK_Q4FX8 && qt <= CK_S8FX8);
}
static inline bool is_q5(int qt) { return qt == CK_Q5_0 || qt == CK_Q5_1; }

// bytes of one row's block of 32 (the same in the x8 layout: 8 rows' blocks side by side)
static inline long block_bytes(int qt) {
  if (qt >= CK_X8 && qt <= CK_INT8X8) qt -= CK_X8;
  return qt == CK_Q8_0 ? 34 : qt == CK_Q4_0 ? 18 : qt == CK_Q4_1 ? 20 : qt == CK_Q5_0 ? 22
       : qt == CK_Q5_1 ? 24 : qt == CK_F32W ? 128 : qt == CK_Q4FX8 ? 24
       : qt == CK_U8FX8 || qt == CK_S8FX8 ? 40 : 32;
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

// Unsigned codes of 32 values built 8 bytes at a time in 64-bit words (SWAR): the masks
// are the same in every byte and no shift carries a bit into another byte's kept bits, so
// this is the same on either byte order.
static const uint64_t kNibbles = 0x0f0f0f0f0f0f0f0fULL, kLowPairs = 0x0303030303030303ULL;
static inline uint64_t load_u64(const uint8_t *p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}
static inline void store_u64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

// kFifthBit[b]: 8 bytes, byte i = 16 if bit i of b is set (the 5th bit of a Q5 code)
struct FifthBitTable {
  uint64_t v[256];
  FifthBitTable() {
    for (int b = 0; b < 256; ++b) {
      uint8_t bytes[8];
      for (int i = 0; i < 8; ++i) bytes[i] = (uint8_t)(((b >> i) & 1) << 4);
      memcpy(&v[b], bytes, 8);
    }
  }
};
static const FifthBitTable kFifthBit;

// The codes q (0..31) of a Q5_0 / Q5_1 block: element i < 16 the low nibble of qs[i], i >= 16
// the high nibble of qs[i - 16]; the 5th bit is bit i of the 32 (little-endian) bits qh.
static inline void q5_codes(const uint8_t *qh, const uint8_t *qs, uint8_t *q) {
  const uint64_t lo0 = load_u64(qs), lo1 = load_u64(qs + 8);
  store_u64(q, (lo0 & kNibbles) | kFifthBit.v[qh[0]]);
  store_u64(q + 8, (lo1 & kNibbles) | kFifthBit.v[qh[1]]);
  store_u64(q + 16, ((lo0 >> 4) & kNibbles) | kFifthBit.v[qh[2]]);
  store_u64(q + 24, ((lo1 >> 4) & kNibbles) | kFifthBit.v[qh[3]]);
}

// Sub-block s (0..7) of a Q6_K super-block p: the codes q (0..63) of its 32 values and the
// two scales d * sc (values 0-15, 16-31); a value is scale * (q - 32).
static inline void q6k_codes(const uint8_t *p, int s, uint8_t *q, float *scales) {
  const int h = s / 4, g = s % 4;
  const uint8_t *ql = p + 64 * h + (g & 1) * 32, *qh = p + 128 + 32 * h;
  for (int j = 0; j < 32; j += 8) {
    const uint64_t lo = g < 2 ? load_u64(ql + j) & kNibbles : (load_u64(ql + j) >> 4) & kNibbles;
    store_u64(q + j, lo | ((load_u64(qh + j) >> (2 * g)) & kLowPairs) << 4);
  }
  const int8_t *sc = (const int8_t *)(p + 192) + 8 * h + 2 * g;
  const float d = read_half(p + 208);
  scales[0] = d * (float)sc[0];
  scales[1] = d * (float)sc[1];
}

// Values 32 b .. 32 b + 31 of a K-quant row, as the GGUF reference dequantizes them:
// Q4_K/Q5_K (d * scale) * q - dmin * min; Q6_K (d * scale) * (q - 32), a scale per 16.
template <int QT>
static inline void decode_k(const uint8_t *row, long b, float *w) {
  const uint8_t *p = row + b / 8 * super_bytes(QT);
  const int s = (int)(b % 8);
  if (QT == CK_Q6_K) {
    uint8_t q[32];
    float scales[2];
    q6k_codes(p, s, q, scales);
    for (int l = 0; l < 32; ++l) w[l] = scales[l / 16] * (float)((int)q[l] - 32);
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
// float8 E4M3 code -> float (fp8.h), a table of all 256
struct E4M3Table {
  float v[256];
  E4M3Table() {
    for (int b = 0; b < 256; ++b) v[b] = fp8_to_f32((uint8_t)b, CK_FP8_E4M3);
  }
};
static const E4M3Table kE4M3;

// Block b of a Q5_0 / Q5_1 row, as the GGUF reference dequantizes it: f16 d (and m), 32
// high bits, 16 bytes of low nibbles (q5_codes); Q5_0 d * (q - 16), Q5_1 d * q + m.
// (d * q + m with m = -16 d for Q5_0 is the same float as d * (q - 16): both exact.)
template <int QT>
static inline void q5_block(const uint8_t *row, long b, uint8_t *q, float *d, float *m) {
  const uint8_t *p = row + b * block_bytes(QT);
  *d = read_half(p);
  *m = QT == CK_Q5_1 ? read_half(p + 2) : -16.0f * *d;
  const uint8_t *qh = p + (QT == CK_Q5_1 ? 4 : 2);
  q5_codes(qh, qh + 4, q);
}
template <int QT>
static inline void decode_q5(const uint8_t *row, long b, float *w) {
  uint8_t q[32];
  float d, m;
  q5_block<QT>(row, b, q, &d, &m);
  for (int i = 0; i < 32; ++i) w[i] = d * (float)q[i] + m;
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

// From this many activation rows on, the float32 products run the panel kernel (matvec.cpp:
// there its register tile outruns row_dot, which reloads x for every weight row)
static const long kPanelMin = 7;
// AMX builds: from this many rows, the panel path's products run on the tile unit (matvec_amx.h;
// where it draws level with the int16 x8 kernel on one thread)
static const long kAmxMinRows = 24;
// AVX512_BF16 builds: from this many rows, bfloat16 products run gemm_bf16 (matvec_bf16.h; below
// it packing a group of weights costs more than the int16 x8 kernel's whole product: Zen 4, 2
// threads, 576x1536 Q4_1: 64 rows level, 96 rows 1.1x, 256 rows 1.4x)
static const long kBf16MinRows = 96;

// Block b of row r of an x8 matrix w (nb blocks a row; quant.cpp has the layout) in its row
// format QT (Q8_0, Q4_0, Q4_1, int8 as those formats store a block; a float-scaled code as its
// row form: the two float32 scales, then the codes): the row's scales from the group block's
// scale arrays, its codes from the 4-byte chunks of its lane.
template <int QT>
static inline void x8_row_block(const uint8_t *w, long nb, long r, long b, uint8_t *out) {
  const long bb = block_bytes(QT);
  const uint8_t *p = w + ((r / 8) * nb + b) * 8 * bb;
  const long unit = QT >= CK_Q4FX8 ? 4 : 2;  // bytes of a scale
  const long head = QT == CK_INT8 ? 0 : QT == CK_Q4_1 || QT >= CK_Q4FX8 ? 2 * unit : unit;  // a row's scales
  const long lane = r % 8;
  for (long i = 0; i < head / unit; ++i) memcpy(out + unit * i, p + 8 * unit * i + unit * lane, unit);
  const uint8_t *q = p + 8 * head;
  for (long c = 0; c < (bb - head) / 4; ++c) memcpy(out + head + 4 * c, q + 32 * c + 4 * lane, 4);
}

// Output rows handed to a thread at a time: small enough that a thread that got
// descheduled (a loaded machine) leaves most of its share to the others, large
// enough that the shared counter is touched rarely.
static inline long row_chunk(long n, int nthreads) {
  long c = n / ((long)nthreads * 8);
  return c < 16 ? 16 : c;
}

}  // namespace CK_NS
