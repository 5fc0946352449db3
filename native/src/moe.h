// The experts of a mixture-of-experts layer as moe.cpp reads them (layouts shared with Python:
// plugins/src/plugins/cpu_native/moe.py, ctypes structures), and its entry points.
#pragma once

#include "common.h"

// an expert projection packed for linear_bf16w (encoder.cpp; bf16_tile.h's groups of 64 rows):
// a code of moe.cpp only, beside blocks.h's weight formats
enum { CK_MOE_BF16W = 18 };

struct CKExpertProj {  // one projection (gate, up or down) of every expert, each packed as a dense linear
  const void *w;          // expert e's rows start at w + e * expert_bytes
  const float *scales;    // per-row scales of the CK_INT8 formats (expert e's at scales + e * scale_stride), else NULL
  long expert_bytes, scale_stride;
  long row_bytes;         // row r, a multiple of group, starts r * row_bytes into its expert
  long n, k, group;       // outputs and inputs of each expert; rows of a packed group (x8: 8, bf16 tiles: 64)
  int qt;                 // a format code of linear() (quant.cpp, with its flags), or CK_MOE_BF16W
};

struct CKExperts {  // y = down(silu(gate x) * up x) for each expert
  CKExpertProj gate, up, down;
  long num_experts;
};

extern "C" {
int CK_FN(fused_moe)(const CKExperts *e, int dtype, const void *x, long x_stride, long tokens,
                     const float *topk_weights, const int64_t *topk_ids, long top_k, void *out, int nthreads);
void CK_FN(moe_route)(int dtype, const void *logits, long tokens, long num_experts, long top_k, int renormalize,
                      float *weights, int64_t *ids);
}
