// A whole forward pass of a Llama-family decoder over one step's batch, in one call: the
// same kernels, in the same order, as the eager model (core/models/llama.py) runs them
// one Python call at a time, so the result is identical (Qwen3's q/k head norms included;
// a mixture-of-experts layer's routing is moe.cpp's float32 softmax and top-k, within
// rounding of torch's, then the same fused_moe kernel as eager). At batch 1 the eager pass
// makes ~12 Python kernel calls a layer, whose overhead takes as long as the kernels
// themselves on a 135M model; here the only Python is one call a step.
#include <stdlib.h>

#include "kernels.h"
#include "moe.h"

// Layouts shared with Python (plugins/src/plugins/cpu_native/runner.py, ctypes structures).
struct CKLoRAStep {  // the step's rows -> adapter slots, shared by the model's adapted linears
  const int64_t *row_slots;  // [num_rows], -1: a base row; NULL: the step has no adapter rows
  long num_rows;
};

struct CKLoRA {  // a linear's adapter slots (lora.cpp): its outputs are num_parts parts
  const void *a;     // [num_slots, num_parts * rank, k] (dtype): part i's A in rows i * rank ..
  const void *b[3];  // part i's B [num_slots, n[i], rank] (dtype, scale folded in)
  long n[3], num_parts, rank, num_slots;
  const CKLoRAStep *step;
};

struct CKLinear {  // y = x @ W^T (+ bias) (+ the step's LoRA deltas), W in weight format qt (blocks.h)
  const void *w;
  const float *scales;  // per-row scales of CK_INT8, else NULL
  const void *bias;     // NULL if none
  long n, k;
  int qt, bias_dtype;  // an x8 format takes int8 activations (quant.cpp)
  const CKLoRA *lora;  // NULL: no adapters on this linear
  // W rounded to bfloat16 and packed (plugins/cpu_native/bf16.py), or NULL: bfloat16 products
  // of bf16_panel_min_rows() or more rows take it (linear_bf16w), fewer the weights in format qt
  const void *bf16w;
};

struct CKMoE {  // a sparse MLP: each token's top_k experts by the router's softmax (moe.cpp)
  CKLinear router;  // hidden -> num_experts logits
  const CKExperts *experts;
  long top_k;
  int renormalize;  // divide the top_k probabilities by their sum
};

struct CKLayer {
  const void *input_norm, *post_norm;  // RMSNorm weights [hidden] (norm_dtype)
  CKLinear qkv, o, gate_up, down;  // gate_up and down unused in a MoE layer
  void *k_cache, *v_cache;  // [num_blocks, block_size, kv_heads, head_dim] (cache_dtype)
  const float *kv_scale;    // (K, V) scales of a one-byte E4M3 cache (fp8.h), else NULL: 1
  const void *q_norm, *k_norm;  // RMSNorm weights [head_dim] (norm_dtype) of each q and k head (Qwen3), else NULL
  const CKMoE *moe;             // the layer's MLP when it is a mixture of experts, else NULL
};

struct CKDecoder {
  const CKLayer *layers;
  long num_layers, hidden, heads, kv_heads, head_dim, inter;
  long vocab, block_size, num_slots;
  const void *embed;       // [vocab, hidden] (dtype)
  const void *final_norm;  // [hidden] (norm_dtype)
  const void *cos_sin;     // [max_pos, head_dim] (cos_sin_dtype)
  float eps, scale;
  int dtype, norm_dtype, cos_sin_dtype;
  int cache_dtype;  // dtype, bfloat16 or float16 under float32, or a one-byte code of fp8.h
  long window;      // every layer's attention window (Mistral's sliding window), 0: none
  // tensor parallel: embed holds rows [vocab_start, vocab_start + vocab) of a vocabulary of
  // vocab_total ids (an id outside them embeds as zeros), and all_reduce(comm, buf, count,
  // dtype) sums count elements in place over the ranks (nonzero: it failed). Unsplit:
  // vocab_start 0, vocab_total vocab, all_reduce NULL.
  long vocab_start, vocab_total;
  int (*all_reduce)(void *comm, void *buf, long count, int dtype);
  void *comm;
};

struct CKStep {
  const int64_t *ids, *positions, *slots;  // [tokens]
  const int32_t *starts, *seq_lens, *tables;  // attention metadata (plugins/attention.py)
  long table_stride, tokens, num_seqs;
  void *out;  // [tokens, hidden] final normed hidden states (dtype)
  // pipeline parallel (the decoder holds one stage's layers): intermediate, the previous stage's
  // [tokens, 2 * hidden] hidden states | residual (dtype), stands for the embedding of ids (NULL on
  // the first stage: embed); out_intermediate nonzero (a stage before the last): out gets this
  // stage's [tokens, 2 * hidden] hidden states | residual instead of the final norm's output.
  const void *intermediate;
  int out_intermediate;
};

namespace CK_NS {

// out[t] += the LoRA delta of x[t] for the step's adapter rows (x [rows, k], out [rows, l.n]), every
// part of the linear's output in one call (lora.cpp)
static int add_lora(const CKLinear &l, int dtype, const void *x, long rows, void *out, int nt) {
  const CKLoRA &lo = *l.lora;
  rows = rows < lo.step->num_rows ? rows : lo.step->num_rows;
  return CK_FN(lora_apply)(dtype, x, l.k, rows, out, l.n, lo.a, l.k, lo.b, lo.n, lo.num_parts, lo.rank,
                           lo.step->row_slots, lo.num_slots, nt)
             ? -1
             : 0;
}

static int linear(const CKLinear &l, int dtype, const void *x, long rows, void *out, int nt) {
  const int status =
      l.bf16w && dtype == CK_BF16 && rows >= CK_FN(bf16_panel_min_rows)()
          ? CK_FN(linear_bf16w)(l.bf16w, l.n, l.k, dtype, x, l.k, rows, out, l.bias, l.bias_dtype, 0, nt)
          : CK_FN(linear)(l.qt, l.w, l.scales, l.n, l.k, dtype, x, l.k, rows, out, l.bias, l.bias_dtype, nt);
  if (status || !l.lora || !l.lora->step->row_slots) return status;
  return add_lora(l, dtype, x, rows, out, nt);
}

// act [rows, inter] = SiLU(gate) * up of gate_up's product of x: in one pass on the bfloat16
// panels (linear_bf16w_silu_mul) where linear would take them and no adapter adds to the
// product, else the product into gate_up [rows, 2 * inter], then silu_and_mul
static int gate_up_silu(const CKLinear &l, int dtype, const void *x, long rows, void *gate_up, void *act, long inter,
                        int nt) {
  if (l.bf16w && dtype == CK_BF16 && rows >= CK_FN(bf16_panel_min_rows)() && !(l.lora && l.lora->step->row_slots)) {
    const int status = CK_FN(linear_bf16w_silu_mul)(l.bf16w, inter, l.k, x, l.k, rows, act, l.bias, l.bias_dtype, nt);
    if (status != -3) return status;
  }
  const int status = linear(l, dtype, x, rows, gate_up, nt);
  if (!status) CK_FN(silu_and_mul)(dtype, act, gate_up, 2 * inter, rows, inter, nt);
  return status;
}

// out [rows, heads * d] = each d-wide head of x (row r at x + r * x_stride, heads contiguous)
// RMS-normalized with w: the heads copied out, then normalized in place (as the eager model's
// q/k norm on a contiguous copy of its head view)
static void head_norm(int dtype, int w_dtype, void *out, const void *x, long x_stride, long heads, long d,
                      const void *w, long rows, float eps, int nt) {
  const long esize = dtype == CK_F32 ? 4 : 2, width = heads * d * esize;
  for (long r = 0; r < rows; ++r) memcpy((char *)out + r * width, (const char *)x + r * x_stride * esize, width);
  CK_FN(rms_norm)(dtype, w_dtype, out, NULL, out, d, NULL, 0, w, rows * heads, d, eps, nt);
}

// out [rows, hidden] = a MoE layer's MLP of x [rows, hidden] (router, routing, experts); logits,
// weights and ids: the layer's scratch ([rows, num_experts] dtype, [rows, top_k] float32 and int64)
static int moe_mlp(const CKMoE &moe, int dtype, const void *x, long rows, void *out, void *logits, float *weights,
                   int64_t *ids, int nt) {
  const long num_experts = moe.router.n;
  int status = linear(moe.router, dtype, x, rows, logits, nt);
  if (status) return status;
  CK_FN(moe_route)(dtype, logits, rows, num_experts, moe.top_k, moe.renormalize, weights, ids);
  status = CK_FN(fused_moe)(moe.experts, dtype, x, moe.router.k, rows, weights, ids, moe.top_k, out, nt);
  return status ? -1 : 0;
}

}  // namespace CK_NS

using namespace CK_NS;

extern "C" {

// Copies rows [t, 2 * h] of hidden | residual from (to_rows 0) or into (to_rows 1) rows [t, h] of
// hidden and residual (esize bytes an element): the hand-off between pipeline stages.
static void stage_rows(int to_rows, void *rows, char *hidden, char *residual, long t, long h, long esize) {
  const long n = h * esize;
  for (long i = 0; i < t; ++i) {
    char *row = (char *)rows + 2 * i * n;
    if (to_rows) {
      memcpy(row, hidden + i * n, n);
      memcpy(row + n, residual + i * n, n);
    } else {
      memcpy(hidden + i * n, row, n);
      memcpy(residual + i * n, row + n, n);
    }
  }
}

// Runs the decoder on step->tokens tokens; writes step->out. Returns 0, -1 when a
// buffer could not be allocated, -2 for a token id outside the vocabulary, -3 for a
// slot outside the KV cache, -4 for a cache dtype the cache writes or paged_attention do not
// take under dtype, -5 when the tensor-parallel all-reduce failed.
int CK_FN(decode)(const CKDecoder *m, const CKStep *s, int nt) {
  const long t = s->tokens, h = m->hidden, d = m->head_dim;
  const long q_size = m->heads * d, kv_size = m->kv_heads * d, qkv_size = q_size + 2 * kv_size;
  const long esize = m->dtype == CK_F32 ? 4 : 2;
  for (long i = 0; i < t && !s->intermediate; ++i)
    if (s->ids[i] < 0 || s->ids[i] >= m->vocab_total) return -2;
  // [t, width] buffers (dtype): residual stream, normed input of a projection, output of
  // o_proj / down_proj, qkv, rotated q and k, attention output, gate_up, SiLU(gate) * up
  // and of MoE layers the router's logits (dtype), the routing weights (float32) and expert ids (int64)
  long num_experts = 0, top_k = 0;
  for (long li = 0; li < m->num_layers; ++li) {
    const CKMoE *moe = m->layers[li].moe;
    if (moe && moe->router.n > num_experts) num_experts = moe->router.n;
    if (moe && moe->top_k > top_k) top_k = moe->top_k;
  }
  enum { RES, NORMED, PROJ, QKV, Q, K, ATTN, GATE_UP, ACT, LOGITS, TOPW, TOPI, NUM_BUFS };
  const long bytes[NUM_BUFS] = {h * esize, h * esize, h * esize, qkv_size * esize, q_size * esize, kv_size * esize,
                                q_size * esize, 2 * m->inter * esize, m->inter * esize, num_experts * esize,
                                top_k * 4, top_k * 8};
  long offsets[NUM_BUFS + 1] = {0};
  for (int i = 0; i < NUM_BUFS; ++i) offsets[i + 1] = offsets[i] + (t * bytes[i] + 63) / 64 * 64;
  char *base = (char *)aligned_alloc(64, offsets[NUM_BUFS]);
  if (!base) return -1;
  char *b[NUM_BUFS];
  for (int i = 0; i < NUM_BUFS; ++i) b[i] = base + offsets[i];
  for (long i = 0; i < t && !s->intermediate; ++i) {
    const long row = s->ids[i] - m->vocab_start;
    if (row >= 0 && row < m->vocab)
      memcpy(b[RES] + i * h * esize, (const char *)m->embed + row * h * esize, h * esize);
    else
      memset(b[RES] + i * h * esize, 0, h * esize);
  }

  const int dt = m->dtype, ndt = m->norm_dtype;
  int status = 0;
  // the sum over the ranks of a row-parallel output [t, h] (the embedding, o, down or the experts')
  auto reduce = [&](void *buf) { return m->all_reduce && m->all_reduce(m->comm, buf, t * h, dt) ? -5 : 0; };
  if (s->intermediate)  // the previous stage's last layer output and residual, as if from a layer here
    stage_rows(0, (void *)s->intermediate, b[PROJ], b[RES], t, h, esize);
  else if ((status = reduce(b[RES]))) {
    free(base);
    return status;
  }
  for (long li = 0; li < m->num_layers; ++li) {
    const CKLayer &l = m->layers[li];
    if (li == 0 && !s->intermediate)  // residual = embeddings; later layers first add the previous layer's output
      CK_FN(rms_norm)(dt, ndt, b[NORMED], NULL, b[RES], h, NULL, 0, l.input_norm, t, h, m->eps, nt);
    else
      CK_FN(rms_norm)(dt, ndt, b[NORMED], b[RES], b[PROJ], h, b[RES], h, l.input_norm, t, h,
                        m->eps, nt);
    if ((status = linear(l.qkv, dt, b[NORMED], t, b[QKV], nt))) break;
    const char *k_in = b[QKV] + q_size * esize, *v_in = k_in + kv_size * esize;
    // the rotations' inputs: q and k of qkv, or their normed heads (rotated in place)
    const char *q_rot = b[QKV], *k_rot = k_in;
    long q_stride = qkv_size, k_stride = qkv_size;
    if (l.q_norm) {
      head_norm(dt, ndt, b[Q], b[QKV], qkv_size, m->heads, d, l.q_norm, t, m->eps, nt);
      head_norm(dt, ndt, b[K], k_in, qkv_size, m->kv_heads, d, l.k_norm, t, m->eps, nt);
      q_rot = b[Q], k_rot = b[K], q_stride = q_size, k_stride = kv_size;
    }
    CK_FN(rotary)(dt, m->cos_sin_dtype, b[Q], q_rot, q_stride, m->heads, d, s->positions,
                    m->cos_sin, t, nt);
    CK_FN(rotary)(dt, m->cos_sin_dtype, b[K], k_rot, k_stride, m->kv_heads, d, s->positions,
                    m->cos_sin, t, nt);
    const float ks = l.kv_scale ? l.kv_scale[0] : 1.0f, vs = l.kv_scale ? l.kv_scale[1] : 1.0f;
    const long bad =
        m->cache_dtype != dt
            ? CK_FN(write_kv_cache_cast)(dt, m->cache_dtype, b[K], kv_size, v_in, qkv_size, l.k_cache,
                                         l.v_cache, s->slots, t, kv_size, m->num_slots, ks, vs)
            : CK_FN(write_kv_cache)(b[K], kv_size * esize, v_in, qkv_size * esize, l.k_cache,
                                    l.v_cache, s->slots, t, kv_size * esize, m->num_slots);
    if (bad) {
      status = bad < 0 ? -4 : -3;
      break;
    }
    if (CK_FN(paged_attention)(dt, m->cache_dtype, b[ATTN], b[Q], q_size, l.k_cache, l.v_cache, ks, vs,
                               s->starts, s->seq_lens, s->tables, s->table_stride, t, s->num_seqs,
                               m->heads, m->kv_heads, d, m->block_size, m->scale, m->window, nt)) {
      status = -4;
      break;
    }
    if ((status = linear(l.o, dt, b[ATTN], t, b[PROJ], nt)) || (status = reduce(b[PROJ]))) break;
    CK_FN(rms_norm)(dt, ndt, b[NORMED], b[RES], b[PROJ], h, b[RES], h, l.post_norm, t, h,
                      m->eps, nt);
    if (l.moe) {
      status = moe_mlp(*l.moe, dt, b[NORMED], t, b[PROJ], b[LOGITS], (float *)b[TOPW], (int64_t *)b[TOPI], nt);
    } else if (!(status = gate_up_silu(l.gate_up, dt, b[NORMED], t, b[GATE_UP], b[ACT], m->inter, nt))) {
      status = linear(l.down, dt, b[ACT], t, b[PROJ], nt);
    }
    if (status || (status = reduce(b[PROJ]))) break;
  }
  if (!status && s->out_intermediate)
    stage_rows(1, s->out, b[PROJ], b[RES], t, h, esize);
  else if (!status)
    CK_FN(rms_norm)(dt, ndt, s->out, b[RES], b[PROJ], h, b[RES], h, m->final_norm, t, h,
                      m->eps, nt);
  free(base);
  return status;
}

}  // extern "C"
