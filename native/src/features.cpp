// The ISA-variant queries every kernel library exports, over its arch's table
// (features_<arch>.cpp). Built for the baseline ISA.
#include <string.h>

#include "features.h"

extern "C" {

// The library's variants, best first, space-separated ("avx512vnni avx512 avx2 scalar").
const char *ck_isa_names(void) {
  static char names[256];
  if (!names[0])
    for (int i = 0; i < kNumIsas; ++i) {
      if (i) strcat(names, " ");
      strcat(names, kIsas[i].name);
    }
  return names;
}

// 1 if this CPU runs variant isa, 0 if not, -1 if the library holds no such variant.
int ck_isa_runs(const char *isa) {
  for (int i = 0; i < kNumIsas; ++i)
    if (!strcmp(kIsas[i].name, isa)) return (ck_cpu_features() & kIsas[i].needs) == kIsas[i].needs;
  return -1;
}

}  // extern "C"
