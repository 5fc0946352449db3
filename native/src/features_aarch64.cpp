// aarch64 ISA detection from the kernel's hwcaps (getauxval; under qemu-user, the
// emulated CPU model's). Built for the baseline ARMv8-A so it runs everywhere and the
// caller can choose which ck_<isa>_* to bind.
#include <sys/auxv.h>

#include "features.h"

// feature bits, shared with Python (plugins/src/plugins/cpu_native/library.py)
enum {
  CK_HAS_ASIMD = 1 << 0,
  CK_HAS_FP16 = 1 << 1,  // FPHP and ASIMDHP: half-precision arithmetic
  CK_HAS_DOTPROD = 1 << 2,
  CK_HAS_BF16 = 1 << 3,
  CK_HAS_SVE = 1 << 4,
};

const CKIsa kIsas[] = {
    {"neon_bf16", CK_HAS_ASIMD | CK_HAS_DOTPROD | CK_HAS_FP16 | CK_HAS_BF16},
    {"neon_dotprod", CK_HAS_ASIMD | CK_HAS_DOTPROD},
    {"neon", CK_HAS_ASIMD},
    {"scalar", 0},
};
const int kNumIsas = sizeof(kIsas) / sizeof(kIsas[0]);

extern "C" {

// Bit set of CK_HAS_*, as the kernel reports them.
int ck_cpu_features(void) {
  const unsigned long hw = getauxval(AT_HWCAP), hw2 = getauxval(AT_HWCAP2);
  int f = 0;
  if (hw & HWCAP_ASIMD) f |= CK_HAS_ASIMD;
  if ((hw & HWCAP_FPHP) && (hw & HWCAP_ASIMDHP)) f |= CK_HAS_FP16;
  if (hw & HWCAP_ASIMDDP) f |= CK_HAS_DOTPROD;
  if (hw2 & HWCAP2_BF16) f |= CK_HAS_BF16;
  if (hw & HWCAP_SVE) f |= CK_HAS_SVE;
  return f;
}

}  // extern "C"
