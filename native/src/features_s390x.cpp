// s390x ISA detection from the kernel's hwcaps (getauxval): the vector facility and its
// enhancements, which Linux reports only when it also saves the vector registers. Built
// for the baseline z/Architecture so the caller can choose which ck_<isa>_* to bind.
#include <sys/auxv.h>

#include "features.h"

// feature bits, shared with Python (plugins/src/plugins/cpu_native/library.py)
enum {
  CK_HAS_VX = 1 << 0,    // vector facility (z13)
  CK_HAS_VXE = 1 << 1,   // vector-enhancements facility 1 (z14): vector float32
  CK_HAS_VXE2 = 1 << 2,  // vector-enhancements facility 2 (z15): vector int32 <-> float32
};

const CKIsa kIsas[] = {
    {"z15", CK_HAS_VX | CK_HAS_VXE | CK_HAS_VXE2},
    {"z14", CK_HAS_VX | CK_HAS_VXE},
    {"scalar", 0},
};
const int kNumIsas = sizeof(kIsas) / sizeof(kIsas[0]);

extern "C" {

// Bit set of CK_HAS_*, as the kernel reports them.
int ck_cpu_features(void) {
  const unsigned long hw = getauxval(AT_HWCAP);
  int f = 0;
  if (hw & HWCAP_S390_VXRS) f |= CK_HAS_VX;
  if (hw & HWCAP_S390_VXRS_EXT) f |= CK_HAS_VXE;
  if (hw & HWCAP_S390_VXRS_EXT2) f |= CK_HAS_VXE2;
  return f;
}

}  // extern "C"
