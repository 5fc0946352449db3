// What each features_<arch>.cpp provides: ck_cpu_features() (the CPU's CK_HAS_* bits)
// and the arch's ISA variants with the bits each needs, best first (cpu_kernels.cmake
// builds the same list). features.cpp answers ck_isa_names() / ck_isa_runs() from them.
#pragma once

struct CKIsa {
  const char *name;
  int needs;  // CK_HAS_* bits of ck_cpu_features()
};

extern const CKIsa kIsas[];
extern const int kNumIsas;

extern "C" int ck_cpu_features(void);
