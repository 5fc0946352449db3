// The tile unit's shared pieces (AMX builds): whether the process may use it and the tiles'
// configuration; and (every AVX512_BF16 build) the bfloat16 halves and 32-bit transposes that
// TDPBF16PS's operand layouts are made with (matvec_amx.h's products, attention_tiles.h's prompt
// attention, which vdpbf16ps also runs where there is no tile unit).
#pragma once

#if defined(__AVX512BF16__)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common.h"

namespace CK_NS {

#if defined(__AMX_BF16__)

// whether the tile registers may be used: Linux hands a process their state when asked (a
// process that may not, e.g. under a seccomp filter, keeps the int16 x8 kernel: quant.cpp)
static inline bool amx_ready() {
  static const bool ready = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */,
                                    18 /* XFEATURE_XTILEDATA */) == 0;
  return ready;
}

// the calling thread's tiles: all eight 16 rows x 64 bytes (ldtilecfg reads the whole struct)
static inline void amx_configure() {
  struct alignas(64) {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
  } cfg = {};
  cfg.palette = 1;
  for (int i = 0; i < 8; ++i) cfg.colsb[i] = 64, cfg.rows[i] = 16;
  __asm__ volatile("ldtilecfg %0" ::"m"(cfg));
}
#endif  // __AMX_BF16__

// hi and lo bfloat16 halves of 32 floats (hi = x rounded to nearest even, lo = x - hi rounded:
// x to ~2^-17), each as 32 16-bit lanes in order (AVX512-BF16's two-register conversion)
static inline void split32(__m512 v0, __m512 v1, __m512i *hi, __m512i *lo) {
  const __m512bh h = _mm512_cvtne2ps_pbh(v1, v0);
  const __m512i hb = (__m512i)h;
  const __m512 h0 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(hb)), 16));
  const __m512 h1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(hb, 1)), 16));
  *hi = hb;
  *lo = (__m512i)_mm512_cvtne2ps_pbh(_mm512_sub_ps(v1, h1), _mm512_sub_ps(v0, h0));
}
static inline void split32(const float *x, __m512i *hi, __m512i *lo) {
  split32(_mm512_loadu_ps(x), _mm512_loadu_ps(x + 16), hi, lo);
}

// out[j] = (r[0][j], ..., r[15][j]): a 16 x 16 transpose of 32-bit values in 64 shuffles
__attribute__((always_inline)) static inline void transpose16(const __m512i *r, __m512i *out) {
  __m512i t[16], u[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {  // u[4i + c], 128-bit lane L: column 4L + c of rows 4i .. 4i + 3
    u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int c = 0; c < 4; ++c) {  // the 4 x 4 lanes of u[c], u[4 + c], u[8 + c], u[12 + c] transposed
    const __m512i v0 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x88), v1 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xdd);
    const __m512i v2 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x88);
    const __m512i v3 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xdd);
    out[c] = _mm512_shuffle_i32x4(v0, v2, 0x88);
    out[8 + c] = _mm512_shuffle_i32x4(v0, v2, 0xdd);
    out[4 + c] = _mm512_shuffle_i32x4(v1, v3, 0x88);
    out[12 + c] = _mm512_shuffle_i32x4(v1, v3, 0xdd);
  }
}

}  // namespace CK_NS
#endif
