// x86-64 ISA detection (cpuid + xgetbv). Built for the baseline x86-64 ISA: this file
// must run on every x86-64 CPU so the caller can choose which per-ISA entry points
// (ck_<isa>_*) to bind.
#include <cpuid.h>
#include <stdint.h>

#include "features.h"

// feature bits, shared with Python (plugins/src/plugins/cpu_native/library.py)
enum {
  CK_HAS_AVX2 = 1 << 0,
  CK_HAS_FMA = 1 << 1,
  CK_HAS_F16C = 1 << 2,
  CK_HAS_AVX512F = 1 << 3,
  CK_HAS_AVX512BW = 1 << 4,
  CK_HAS_AVX512VL = 1 << 5,
  CK_HAS_AVX512DQ = 1 << 6,
  CK_HAS_AVX512VNNI = 1 << 7,
  CK_HAS_AVX512BF16 = 1 << 8,
  CK_HAS_AMX = 1 << 9,
};

static uint64_t xgetbv0(void) {
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return ((uint64_t)hi << 32) | lo;
}

static const int kAvx2 = CK_HAS_AVX2 | CK_HAS_FMA | CK_HAS_F16C;
static const int kAvx512 = kAvx2 | CK_HAS_AVX512F | CK_HAS_AVX512BW | CK_HAS_AVX512VL | CK_HAS_AVX512DQ;
const CKIsa kIsas[] = {
    {"avx512amx", kAvx512 | CK_HAS_AVX512VNNI | CK_HAS_AVX512BF16 | CK_HAS_AMX},
    {"avx512bf16", kAvx512 | CK_HAS_AVX512VNNI | CK_HAS_AVX512BF16},
    {"avx512vnni", kAvx512 | CK_HAS_AVX512VNNI},
    {"avx512", kAvx512},
    {"avx2", kAvx2},
    {"scalar", 0},
};
const int kNumIsas = sizeof(kIsas) / sizeof(kIsas[0]);

extern "C" {

// Bit set of CK_HAS_*: the CPU has the instructions AND the OS saves their state.
int ck_cpu_features(void) {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
  const bool osxsave = c & bit_OSXSAVE;
  const uint64_t xcr0 = osxsave ? xgetbv0() : 0;
  const bool ymm = (xcr0 & 0x6) == 0x6, zmm = (xcr0 & 0xe6) == 0xe6;
  const bool amx_os = (xcr0 & 0x60000) == 0x60000;
  int f = 0;
  if (ymm && (c & bit_FMA)) f |= CK_HAS_FMA;
  if (ymm && (c & bit_F16C)) f |= CK_HAS_F16C;
  unsigned a7, b7, c7, d7;
  if (!__get_cpuid_count(7, 0, &a7, &b7, &c7, &d7)) return f;
  if (ymm && (b7 & bit_AVX2)) f |= CK_HAS_AVX2;
  if (zmm) {
    if (b7 & bit_AVX512F) f |= CK_HAS_AVX512F;
    if (b7 & bit_AVX512BW) f |= CK_HAS_AVX512BW;
    if (b7 & bit_AVX512VL) f |= CK_HAS_AVX512VL;
    if (b7 & bit_AVX512DQ) f |= CK_HAS_AVX512DQ;
    if (c7 & bit_AVX512VNNI) f |= CK_HAS_AVX512VNNI;
    unsigned a71, b71, c71, d71;
    if (a7 >= 1 && __get_cpuid_count(7, 1, &a71, &b71, &c71, &d71) && (a71 & (1u << 5)))
      f |= CK_HAS_AVX512BF16;
  }
  if (amx_os && (d7 & (1u << 24)) && (d7 & (1u << 25)) && (d7 & (1u << 22)))
    f |= CK_HAS_AMX;  // AMX-TILE, -INT8 and -BF16
  return f;
}

}  // extern "C"
