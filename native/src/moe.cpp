// A mixture-of-experts layer's expert products for a batch (Kernels.fused_moe), and the routing of
// the fused decoder (core/models/moe.py's route).
//
// fused_moe: the (token, expert) pairs are grouped by expert (a counting sort, tokens in order), the
// pairs' input rows gathered once as float32, then two passes on the kernels' pool:
//  1. work items (expert, block of intermediate rows): the block's gate and up rows times all of the
//     expert's rows, through the dense linears' own kernel (quant.cpp's linear, or encoder.cpp's
//     linear_bf16w for bfloat16 tiles), then SiLU(gate) * up into the pairs' activations;
//  2. work items (block of hidden outputs): each active expert's down rows of the block times its
//     pairs' activations, weighted and summed into the tokens' float32 rows, experts in id order
//     (as the SDK's grouped default adds them), so no two items write the same output.
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
  float *act = rows + num_pairs * hidden;  // [pairs, inter]: SiLU(gate) * up
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
  int failed = 0;
  const bool even = most == 1;
  const long b1 = item_rows(inter, num_active, nthreads, even), blocks1 = (inter + b1 - 1) / b1;
  parallel_for(num_active * blocks1, 1, nthreads, true, [&](long lo, long hi) {
    for (long item = lo; item < hi; ++item) {
      const long e = active[item / blocks1], r0 = item % blocks1 * b1, nb = inter - r0 < b1 ? inter - r0 : b1;
      const long first = starts[e], count = starts[e + 1] - first;
      float *gu = (float *)malloc(sizeof(float) * 2 * count * nb);
      if (!gu || expert_rows(m.gate, e, r0, nb, rows + first * hidden, hidden, count, gu) ||
          expert_rows(m.up, e, r0, nb, rows + first * hidden, hidden, count, gu + count * nb)) {
        __atomic_store_n(&failed, 1, __ATOMIC_RELAXED);
        free(gu);
        return;
      }
      for (long t = 0; t < count; ++t) {
        const float *g = gu + t * nb, *u = gu + (count + t) * nb;
        float *a = act + (first + t) * inter + r0;
        // as elementwise.cpp's silu_and_mul
        for (long i = 0; i < nb; ++i) a[i] = g[i] * u[i] / (1.0f + fast_exp(-g[i]));
      }
      free(gu);
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
        for (long a = 0; a < num_active; ++a) {
          const long e = active[a], first = starts[e], count = starts[e + 1] - first;
          if (expert_rows(m.down, e, c0, nb, act + first * inter, inter, count, y)) {
            __atomic_store_n(&failed, 1, __ATOMIC_RELAXED);
            break;
          }
          for (long t = 0; t < count; ++t) {
            const float w = pair_weight[first + t];
            float *o = acc + (pair_token[first + t] - t0) * hidden + c0;
            const float *yt = y + t * nb;
            for (long i = 0; i < nb; ++i) o[i] += w * yt[i];
          }
        }
      }
      free(y);
    });
  free(active);
  free(rows);
  return failed ? -1 : 0;
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
