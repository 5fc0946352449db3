// A mixture-of-experts layer's expert products for a batch (Kernels.fused_moe), and the routing of
// the fused decoder (core/models/moe.py's route).
//
// fused_moe: the (token, expert) pairs are grouped by expert (a counting sort, tokens in order), the
// pairs' input rows gathered once as float32. At batch 1 (one pair an expert) with the active experts
// a whole number a thread, one pass on the kernels' pool whose work items are whole experts (gate and
// up, SiLU, down into the pair's own row), the weighted sum after it in expert id order. Else two
// passes:
//  1. work items (expert, block of intermediate rows): the block's gate and up rows times all of the
//     expert's rows, through the dense linears' own kernel (quant.cpp's linear, or encoder.cpp's
//     linear_bf16w for bfloat16 tiles), then SiLU(gate) * up into the pairs' activations;
//  2. work items (block of hidden outputs): each active expert's down rows of the block times its
//     pairs' activations, weighted and summed into the tokens' float32 rows, experts in id order
//     (as the SDK's grouped default adds them), so no two items write the same output.
// Gate and up rows stored as one run (plugins/cpu_native/moe.py packs them so) are one linear call
// where an item takes an expert's whole intermediate.
// Each expert's weights are read once per call for all of its tokens (once per kMaxPairs pairs of a
// long prefill, which bounds the scratch). The math is float32 throughout; the output is rounded
// to dtype once.
#include <math.h>
#include <stdlib.h>

#include "kernels.h"
#include "moe.h"

namespace CK_NS {

static const long kBlockRows = 64;   // a work item's rows: whole x8 groups (8) and bf16 tiles (64)
static const long kMaxPairs = 4096;  // (token, expert) pairs a pass takes at most

// out[rows, nb] (float32) = x[rows, p.k] (float32, row stride xs) @ rows [r0, r0 + nb) of expert e's p
static int expert_rows(const CKExpertProj &p, long e, long r0, long nb, const float *x, long xs, long rows,
                       float *out) {
  const char *w = (const char *)p.w + e * p.expert_bytes + r0 * p.row_bytes;
  const float *scales = p.scales ? p.scales + e * p.scale_stride + r0 : NULL;
  if (p.qt == CK_MOE_BF16W) return CK_FN(linear_bf16w)(w, nb, p.k, CK_F32, x, xs, rows, out, NULL, CK_F32, 0, 1);
  return CK_FN(linear)(p.qt, w, scales, nb, p.k, CK_F32, x, xs, rows, out, NULL, CK_F32, 1);
}

// whether gate's rows run straight on into up's in every expert (no padding between): then rows
// [0, 2 inter) of gate are one matrix, gate then up
static bool gate_up_adjacent(const CKExperts &m) {
  const CKExpertProj &g = m.gate, &u = m.up;
  const bool scales = g.scales ? u.scales == g.scales + g.n && u.scale_stride == g.scale_stride : !u.scales;
  return g.qt == u.qt && g.k == u.k && g.n == u.n && g.row_bytes == u.row_bytes && g.expert_bytes == u.expert_bytes &&
         (const char *)u.w == (const char *)g.w + g.n * g.row_bytes && scales;
}

// act[count, inter] (row stride inter, from column r0) = SiLU(gate) * up of rows [r0, r0 + nb) of expert
// e for x[count, k] (float32, row stride xs); gu: scratch of 2 * count * nb floats. All of an expert's
// intermediate with adjacent gate and up rows is one linear call (one weight stream, one pass over x),
// else gate and up are one call each.
static int gate_up_act(const CKExperts &m, bool adjacent, long e, long r0, long nb, const float *x, long xs,
                       long count, float *gu, float *act) {
  long row = nb, up = count * nb;  // gate of pair t at gu + t * row, its up `up` floats after it
  if (adjacent && r0 == 0 && nb == m.gate.n) {
    CKExpertProj both = m.gate;
    both.n = 2 * nb;
    if (expert_rows(both, e, 0, 2 * nb, x, xs, count, gu)) return -1;
    row = 2 * nb;
    up = nb;
  } else if (expert_rows(m.gate, e, r0, nb, x, xs, count, gu) ||
             expert_rows(m.up, e, r0, nb, x, xs, count, gu + count * nb)) {
    return -1;
  }
  for (long t = 0; t < count; ++t) {
    const float *g = gu + t * row, *u = g + up;
    float *a = act + t * m.gate.n + r0;
    // as elementwise.cpp's silu_and_mul
    for (long i = 0; i < nb; ++i) a[i] = g[i] * u[i] / (1.0f + fast_exp(-g[i]));
  }
  return 0;
}

static long round_up(long n, long to) { return (n + to - 1) / to * to; }

// rows of a work item over `parts` runs of `size` rows each (items do not cross runs): whole
// kBlockRows. When every item costs the same per row (`even`: one pair an expert, as in batch-1
// decode), one item a thread where the items then come out a whole number a thread: each linear
// call starts a new weight stream whose first bytes wait on memory, and at batch 1 that start is a
// good part of a small item's time (bench/RESULTS.md, issue 46); else about four items a thread,
// which evens out experts with more tokens and a thread that the machine's load holds back.
static long item_rows(long size, long parts, int nthreads, bool even) {
  if (even) {
    const long share = round_up((size * parts + nthreads - 1) / nthreads, kBlockRows);
    const long rows = share < size ? share : size;
    if (parts * ((size + rows - 1) / rows) % nthreads == 0) return rows;
  }
  const long rows = round_up((size * parts + 4L * nthreads - 1) / (4L * nthreads), kBlockRows);
  return rows < kBlockRows ? kBlockRows : rows;
}

// The pass of the pairs below (moe_pass): starts [num_experts + 1], each expert's first pair;
// pair_token / pair_weight, the pairs in that order; active, the experts with pairs, in id order;
// rows [pairs, hidden], the pairs' inputs (float32); act [pairs, inter], scratch for SiLU(gate) * up;
// acc [t1 - t0, hidden] (float32, zeroed) += the weighted expert outputs of tokens [t0, t1).
struct Pass {
  const CKExperts &m;
  bool adjacent;  // gate_up_adjacent(m)
  const long *active, *starts, *pair_token;
  long num_active, t0;
  const float *pair_weight;
  float *rows, *act, *acc;

  // acc's row of pair p += its weight times y [hidden columns from c0, nb of them]
  void add(long p, long c0, long nb, const float *y) const {
    const float w = pair_weight[p];
    float *o = acc + (pair_token[p] - t0) * m.down.n + c0;
    for (long i = 0; i < nb; ++i) o[i] += w * y[i];
  }
};

// Batch 1 (each active expert one pair) with the active experts a whole number a thread: one
// dispatch whose work items are whole experts, gate and up (one call where adjacent), SiLU and down
// into the pair's own output row, then the weighted sum in expert id order. One pool barrier and two
// weight streams a thread a layer at top 2 on 2 threads.
static int whole_experts(const Pass &s, int nthreads) {
  const long hidden = s.m.down.n, inter = s.m.gate.n, pairs = s.num_active;
  float *y = (float *)malloc(sizeof(float) * pairs * hidden);
  if (!y) return -1;
  int failed = 0;
  parallel_for(s.num_active, 1, nthreads, true, [&](long lo, long hi) {
    float *gu = (float *)malloc(sizeof(float) * 2 * inter);
    for (long item = lo; item < hi && gu; ++item) {
      const long e = s.active[item], p = s.starts[e];
      if (gate_up_act(s.m, s.adjacent, e, 0, inter, s.rows + p * hidden, hidden, 1, gu, s.act + p * inter) ||
          expert_rows(s.m.down, e, 0, hidden, s.act + p * inter, inter, 1, y + p * hidden)) {
        __atomic_store_n(&failed, 1, __ATOMIC_RELAXED);
        break;
      }
    }
    if (!gu) __atomic_store_n(&failed, 1, __ATOMIC_RELAXED);
    free(gu);
  });
  for (long a = 0; a < s.num_active && !failed; ++a) {
    const long p = s.starts[s.active[a]];
    s.add(p, 0, hidden, y + p * hidden);
  }
  free(y);
  return failed ? -1 : 0;
}

// Any batch: the two passes of the header. `even`: one pair an expert (item_rows); most: the most
// pairs an expert has.
static int split_experts(const Pass &s, bool even, long most, int nthreads) {
  const long hidden = s.m.down.n, inter = s.m.gate.n;
  int failed = 0;
  const long b1 = item_rows(inter, s.num_active, nthreads, even), blocks1 = (inter + b1 - 1) / b1;
  parallel_for(s.num_active * blocks1, 1, nthreads, true, [&](long lo, long hi) {
    for (long item = lo; item < hi; ++item) {
      const long e = s.active[item / blocks1], r0 = item % blocks1 * b1, nb = inter - r0 < b1 ? inter - r0 : b1;
      const long first = s.starts[e], count = s.starts[e + 1] - first;
      float *gu = (float *)malloc(sizeof(float) * 2 * count * nb);
      const bool ok = gu && !gate_up_act(s.m, s.adjacent, e, r0, nb, s.rows + first * hidden, hidden, count, gu,
                                         s.act + first * inter);
      free(gu);
      if (!ok) {
        __atomic_store_n(&failed, 1, __ATOMIC_RELAXED);
        return;
      }
    }
  });
  const long b2 = item_rows(hidden, 1, nthreads, even), blocks2 = (hidden + b2 - 1) / b2;
  if (!failed)
    parallel_for(blocks2, 1, nthreads, true, [&](long lo, long hi) {
      float *y = (float *)malloc(sizeof(float) * most * b2);
      if (!y) {
        __atomic_store_n(&failed, 1, __ATOMIC_RELAXED);
        return;
      }
      for (long item = lo; item < hi; ++item) {
        const long c0 = item * b2, nb = hidden - c0 < b2 ? hidden - c0 : b2;
        for (long a = 0; a < s.num_active; ++a) {
          const long e = s.active[a], first = s.starts[e], count = s.starts[e + 1] - first;
          if (expert_rows(s.m.down, e, c0, nb, s.act + first * inter, inter, count, y)) {
            __atomic_store_n(&failed, 1, __ATOMIC_RELAXED);
            break;
          }
          for (long t = 0; t < count; ++t) s.add(first + t, c0, nb, y + t * nb);
        }
      }
      free(y);
    });
  return failed ? -1 : 0;
}

// One pass over tokens [t0, t1): acc [t1 - t0, hidden] (float32, zeroed) += the weighted expert outputs.
// starts [num_experts + 1]: each expert's first pair; pair_token / pair_weight: the pairs in that order.
static int moe_pass(const CKExperts &m, int dtype, const void *x, long x_stride, long t0, const long *starts,
                    const long *pair_token, const float *pair_weight, float *acc, int nthreads) {
  const long hidden = m.down.n, inter = m.gate.n, num_pairs = starts[m.num_experts];
  long *active = (long *)malloc(sizeof(long) * m.num_experts);
  float *rows = (float *)malloc(sizeof(float) * num_pairs * (hidden + inter));
  if (!active || !rows) {
    free(active);
    free(rows);
    return -1;
  }
  long num_active = 0, most = 0;
  for (long e = 0; e < m.num_experts; ++e) {
    const long count = starts[e + 1] - starts[e];
    if (count) active[num_active++] = e;
    most = count > most ? count : most;
  }
  const long esize = dtype == CK_F32 ? 4 : 2;
  for (long p = 0; p < num_pairs; ++p) {  // the pairs' input rows, as float32
    const char *src = (const char *)x + pair_token[p] * x_stride * esize;
    float *dst = rows + p * hidden;
    if (dtype == CK_F32)
      memcpy(dst, src, hidden * sizeof(float));
    else
      for (long i = 0; i < hidden; ++i) dst[i] = to_f32(((const bf16_t *)src)[i]);
  }
  const Pass pass = {m,  gate_up_adjacent(m), active, starts, pair_token, num_active, t0, pair_weight,
                     rows, rows + num_pairs * hidden, acc};
  const bool even = most == 1;
  const int status = even && num_active % nthreads == 0 ? whole_experts(pass, nthreads)
                                                        : split_experts(pass, even, most, nthreads);
  free(active);
  free(rows);
  return status;
}

}  // namespace CK_NS

using namespace CK_NS;

extern "C" {

// out[tokens, hidden] (dtype, contiguous) = sum over k of topk_weights[t, k] * expert_{topk_ids[t, k]}(x[t])
// for x [tokens, hidden] (dtype, row stride x_stride), an expert being down(silu(gate x) * up x);
// topk_weights float32 and topk_ids int64, both [tokens, top_k] contiguous. The experts' projections
// take k a multiple of 32 (the linears' kernels). Returns 0, -1 if a buffer could not be had (or an
// expert product failed), -2 for an expert id outside [0, num_experts).
int CK_FN(fused_moe)(const CKExperts *e, int dtype, const void *x, long x_stride, long tokens,
                     const float *topk_weights, const int64_t *topk_ids, long top_k, void *out, int nthreads) {
  const CKExperts &m = *e;
  const long hidden = m.down.n, num_experts = m.num_experts;
  if (tokens <= 0) return 0;
  for (long i = 0; i < tokens * top_k; ++i)
    if (topk_ids[i] < 0 || topk_ids[i] >= num_experts) return -2;
  const long chunk = top_k < kMaxPairs ? kMaxPairs / top_k : 1;  // tokens a pass
  const long most = tokens < chunk ? tokens : chunk;
  long *starts = (long *)malloc(sizeof(long) * (num_experts + 1 + most * top_k));
  float *weights = (float *)malloc(sizeof(float) * most * top_k);
  float *acc = (float *)malloc(sizeof(float) * most * hidden);
  int status = starts && weights && acc ? 0 : -1;
  long *pair_token = status ? NULL : starts + num_experts + 1;
  for (long t0 = 0; t0 < tokens && !status; t0 += chunk) {
    const long t1 = t0 + chunk < tokens ? t0 + chunk : tokens;
    memset(starts, 0, sizeof(long) * (num_experts + 1));
    for (long i = t0 * top_k; i < t1 * top_k; ++i) ++starts[topk_ids[i] + 1];
    for (long j = 0; j < num_experts; ++j) starts[j + 1] += starts[j];
    for (long i = t0 * top_k; i < t1 * top_k; ++i) {  // token order within each expert (a stable sort)
      const long p = starts[topk_ids[i]]++;
      pair_token[p] = i / top_k;
      weights[p] = topk_weights[i];
    }
    for (long j = num_experts; j > 0; --j) starts[j] = starts[j - 1];  // back to each expert's first pair
    starts[0] = 0;
    memset(acc, 0, sizeof(float) * (t1 - t0) * hidden);
    status = moe_pass(m, dtype, x, x_stride, t0, starts, pair_token, weights, acc, nthreads);
    if (status) break;
    if (dtype == CK_F32)
      memcpy((float *)out + t0 * hidden, acc, sizeof(float) * (t1 - t0) * hidden);
    else
      for (long i = 0; i < (t1 - t0) * hidden; ++i) from_f32(acc[i], (bf16_t *)out + t0 * hidden + i);
  }
  free(starts);
  free(weights);
  free(acc);
  return status;
}

// weights[t, :top_k] and ids[t, :top_k] of logits [tokens, num_experts] (dtype): the top_k largest
// softmax probabilities of each row (float32), largest first (the lower id of equal ones first),
// divided by their sum when renormalize, as core/models/moe.py's route.
void CK_FN(moe_route)(int dtype, const void *logits, long tokens, long num_experts, long top_k, int renormalize,
                      float *weights, int64_t *ids) {
  for (long t = 0; t < tokens; ++t) {
    float *w = weights + t * top_k;
    int64_t *id = ids + t * top_k;
    float top = -INFINITY;
    auto logit = [&](long j) {
      return dtype == CK_F32 ? ((const float *)logits)[t * num_experts + j]
                             : to_f32(((const bf16_t *)logits)[t * num_experts + j]);
    };
    for (long j = 0; j < num_experts; ++j) top = fmax_(top, logit(j));
    float sum = 0.0f;
    for (long j = 0; j < num_experts; ++j) sum += expf(logit(j) - top);
    for (long k = 0; k < top_k; ++k) {  // the k-th largest logit not taken yet: the k-th probability
      long best = -1;
      for (long j = 0; j < num_experts; ++j) {
        bool taken = false;
        for (long i = 0; i < k; ++i) taken |= id[i] == j;
        if (!taken && (best < 0 || logit(j) > logit(best))) best = j;
      }
      id[k] = best;
      w[k] = expf(logit(best) - top) / sum;
    }
    if (renormalize) {
      float total = 0.0f;
      for (long k = 0; k < top_k; ++k) total += w[k];
      for (long k = 0; k < top_k; ++k) w[k] /= total;
    }
  }
}

}  // extern "C"
