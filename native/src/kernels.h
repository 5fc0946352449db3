// The per-ISA kernel entry points (defined in elementwise.cpp, attention.cpp, quant.cpp,
// matvec.cpp, lora.cpp, encoder.cpp), declared for the kernels that chain them (decode.cpp, moe.cpp). Arguments as
// documented at each definition.
#pragma once

#include "common.h"

extern "C" {
void CK_FN(rms_norm)(int dtype, int w_dtype, void *out, void *res_out, const void *x,
                       long x_stride, const void *res, long res_stride, const void *w,
                       long rows, long n, float eps, int nthreads);
void CK_FN(rotary)(int dtype, int cache_dtype, void *out, const void *x, long row_stride,
                     long heads, long d, const int64_t *pos, const void *cache, long rows,
                     int nthreads);
void CK_FN(silu_and_mul)(int dtype, void *out, const void *x, long x_stride, long rows,
                           long inter, int nthreads);
void CK_FN(apply_token_bitmask)(float *logits, long stride, const uint32_t *bitmask, long words,
                                  const int64_t *rows, long num_rows, long vocab);
long CK_FN(write_kv_cache)(const void *k, long k_stride_bytes, const void *v,
                             long v_stride_bytes, void *k_cache, void *v_cache,
                             const int64_t *slots, long tokens, long row_bytes, long num_slots);
long CK_FN(write_kv_cache_cast)(int dtype, int cache_dtype, const void *k, long k_stride,
                                  const void *v, long v_stride, void *k_cache, void *v_cache,
                                  const int64_t *slots, long tokens, long row, long num_slots,
                                  float k_scale, float v_scale);
int CK_FN(paged_attention)(int dtype, int cache_dtype, void *out, const void *q, long q_stride,
                             const void *k_cache, const void *v_cache, float k_scale,
                             float v_scale, const int32_t *starts, const int32_t *seq_lens,
                             const int32_t *tables, long table_stride, long tokens,
                             long num_seqs, long hq, long hk, long d, long block_size,
                             float scale, long window, int nthreads);
int CK_FN(dequant_matmul)(int qt, const void *w, const float *row_scale, long n, long k,
                            int dtype, const void *x, long x_stride, long rows, void *out,
                            const void *bias, int bias_dtype, int nthreads);
int CK_FN(linear)(int qt, const void *w, const float *row_scale, long n, long k, int dtype,
                    const void *x, long x_stride, long rows, void *out, const void *bias,
                    int bias_dtype, int nthreads);
int CK_FN(bf16_panel_min_rows)(void);
int CK_FN(linear_bf16w)(const void *w, long n, long k, int dtype, const void *x, long x_stride, long rows,
                       void *out, const void *bias, int bias_dtype, int act, int nthreads);
int CK_FN(linear_bf16w_silu_mul)(const void *w, long inter, long k, const void *x, long x_stride, long rows,
                                void *out, const void *bias, int bias_dtype, int nthreads);
int CK_FN(lora_shrink)(int dtype, const void *x, long x_stride, long rows, const void *a, long r_total,
                       long in, const int64_t *row_slots, float *h, int nthreads);
int CK_FN(lora_expand)(int dtype, void *y, long y_stride, const float *h, long h_stride, const void *b,
                       long n, long rank, const int64_t *row_slots, long rows, long num_slots,
                       int nthreads);
int CK_FN(lora_apply)(int dtype, const void *x, long x_stride, long rows, void *y, long y_stride, const void *a,
                      long k, const void *const *b, const long *n, long num_parts, long rank,
                      const int64_t *row_slots, long num_slots, int nthreads);
}
