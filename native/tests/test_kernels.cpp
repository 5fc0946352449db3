// Kernel tests of the CPU kernel library against a scalar double-precision reference on
// random inputs, for every ISA variant the library holds that this CPU (or the emulated
// one: make test-cross runs this under qemu-user) runs.
//   test_kernels <library.so>    prints a line per failure and a summary; exit 1 on failure
// Data is made in the host's byte order, as the kernels see weights after loading (on
// s390x, big-endian: plugin_s390x converts the little-endian files at load).
#include <dlfcn.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <atomic>
#include <string>
#include <vector>

namespace {

enum { F32 = 0, BF16 = 1, F16 = 4 };  // F16: a KV cache dtype only
enum { Q8_0 = 0, Q4_0 = 1, Q4_1 = 2, INT8 = 3, F32W = 4, X8 = 8, Q5_0 = 12, Q5_1 = 13, E4M3W = 14 };
// float-scaled blocks, x8 layout only (what K-quants and Q5 formats are repacked into)
enum { Q4FX8 = 15, U8FX8 = 16, S8FX8 = 17 };
const char *kFormatNames[] = {"q8_0", "q4_0", "q4_1", "int8", "f32",  "", "", "", "", "",
                              "",     "",     "q5_0", "q5_1", "e4m3", "q4f", "u8f", "s8f"};
bool float_scaled(int qt) { return qt >= Q4FX8; }

typedef void (*RmsNorm)(int, int, void *, void *, const void *, long, const void *, long,
                        const void *, long, long, float, int);
typedef void (*Rotary)(int, int, void *, const void *, long, long, long, const int64_t *,
                       const void *, long, int);
typedef void (*SiluMul)(int, void *, const void *, long, long, long, int);
typedef long (*WriteKv)(const void *, long, const void *, long, void *, void *, const int64_t *,
                        long, long, long);
typedef int (*Attention)(int, int, void *, const void *, long, const void *, const void *, float,
                         float, const int32_t *, const int32_t *, const int32_t *, long, long, long,
                         long, long, long, long, float, long, int);
typedef long (*WriteKvCast)(int, int, const void *, long, const void *, long, void *, void *,
                           const int64_t *, long, long, long, float, float);
enum { FP8_E4M3 = 2, FP8_E5M2 = 3 };  // cache dtype codes of native/src/fp8.h
typedef int (*Linear)(int, const void *, const float *, long, long, int, const void *, long,
                      long, void *, const void *, int, int);

uint64_t rng_state = 0x9e3779b97f4a7c15ull;
uint32_t next_u32() {  // xorshift64*
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return (uint32_t)((rng_state * 0x2545f4914f6cdd1dull) >> 32);
}
float uniform(float lo, float hi) { return lo + (hi - lo) * (float)(next_u32() >> 8) / 16777216.0f; }
std::vector<float> randn(size_t n, float scale = 1.0f) {
  std::vector<float> v(n);
  for (float &x : v) x = uniform(-scale, scale);
  return v;
}

float bf16_to_f32(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
uint16_t f32_to_bf16(float f) {  // round to nearest even (finite inputs)
  uint32_t u;
  memcpy(&u, &f, 4);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
// float8 E4M3 (bias 7, 3 mantissa bits; subnormals at exponent 0) from its definition
double e4m3_value(uint8_t c) {
  const int exp = (c >> 3) & 15, man = c & 7;
  const double mag = exp == 0 ? ldexp(man / 8.0, -6) : ldexp(1.0 + man / 8.0, exp - 7);
  return c & 0x80 ? -mag : mag;
}

float half_to_f32(uint16_t h) {  // normal numbers and zero (the scales tests make)
  if ((h & 0x7fffu) == 0) return h ? -0.0f : 0.0f;
  const uint32_t u = ((uint32_t)(h & 0x8000u) << 16) | ((((h >> 10) & 0x1fu) + 112u) << 23) | ((h & 0x3ffu) << 13);
  float f;
  memcpy(&f, &u, 4);
  return f;
}
uint16_t f32_to_half(float f) {  // truncating; normal range only
  uint32_t u;
  memcpy(&u, &f, 4);
  const int e = (int)((u >> 23) & 0xff) - 112;
  return (uint16_t)(((u >> 16) & 0x8000u) | (e << 10) | ((u >> 13) & 0x3ffu));
}
std::vector<uint16_t> to_bf16(const std::vector<float> &v) {
  std::vector<uint16_t> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = f32_to_bf16(v[i]);
  return o;
}
std::vector<float> round_bf16(const std::vector<float> &v) {
  std::vector<float> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = bf16_to_f32(f32_to_bf16(v[i]));
  return o;
}

struct Suite {
  void *lib;
  std::string isa;
  int run = 0, passed = 0;

  template <typename F>
  F fn(const char *name) {
    const std::string sym = "ck_" + isa + "_" + name;
    void *p = dlsym(lib, sym.c_str());
    if (!p) {
      fprintf(stderr, "missing symbol %s\n", sym.c_str());
      exit(2);
    }
    return (F)p;
  }

  // out against ref: |out - ref| <= atol + rtol * |ref| everywhere
  void check(const std::string &name, const float *out, const std::vector<double> &ref, double rtol,
             double atol) {
    double worst = 0.0;
    size_t bad = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      const double err = fabs((double)out[i] - ref[i]), tol = atol + rtol * fabs(ref[i]);
      if (!(err <= tol)) ++bad;
      worst = err > worst ? err : worst;
    }
    ++run;
    if (bad == 0) {
      ++passed;
    } else {
      printf("FAIL %s [%s]: %zu of %zu values off, max error %.3g\n", name.c_str(), isa.c_str(), bad,
             ref.size(), worst);
    }
  }
  void check(const std::string &name, const uint16_t *out_bf16, const std::vector<double> &ref, double rtol,
             double atol) {
    std::vector<float> f(ref.size());
    for (size_t i = 0; i < f.size(); ++i) f[i] = bf16_to_f32(out_bf16[i]);
    check(name, f.data(), ref, rtol, atol);
  }
};

void test_rms_norm(Suite &s) {
  const long rows = 5, n = 96;
  const float eps = 1e-5f;
  auto x = randn(rows * n), res = randn(rows * n), w = randn(n);
  std::vector<double> ref(rows * n), ref_res(rows * n);
  for (long r = 0; r < rows; ++r) {
    double ss = 0.0;
    for (long i = 0; i < n; ++i) {
      const float sum = x[r * n + i] + res[r * n + i];  // the residual is rounded to dtype first
      ref_res[r * n + i] = sum;
      ss += (double)sum * sum;
    }
    const double inv = 1.0 / sqrt(ss / n + eps);
    for (long i = 0; i < n; ++i) ref[r * n + i] = ref_res[r * n + i] * inv * w[i];
  }
  std::vector<float> out(rows * n), res_out(rows * n);
  s.fn<RmsNorm>("rms_norm")(F32, F32, out.data(), res_out.data(), x.data(), n, res.data(), n, w.data(),
                            rows, n, eps, 2);
  s.check("fused_add_rms_norm f32", out.data(), ref, 1e-5, 1e-5);
  s.check("fused_add_rms_norm f32 residual", res_out.data(), ref_res, 0, 0);

  const auto xb = to_bf16(x), wb = to_bf16(w);
  const auto xr = round_bf16(x), wr = round_bf16(w);
  for (long r = 0; r < rows; ++r) {
    double ss = 0.0;
    for (long i = 0; i < n; ++i) ss += (double)xr[r * n + i] * xr[r * n + i];
    const double inv = 1.0 / sqrt(ss / n + eps);
    for (long i = 0; i < n; ++i) ref[r * n + i] = xr[r * n + i] * inv * wr[i];
  }
  std::vector<uint16_t> outb(rows * n);
  s.fn<RmsNorm>("rms_norm")(BF16, BF16, outb.data(), NULL, xb.data(), n, NULL, 0, wb.data(), rows, n,
                            eps, 1);
  s.check("rms_norm bf16", outb.data(), ref, 1e-2, 1e-3);
}

void test_rotary_silu(Suite &s) {
  const long rows = 4, heads = 3, d = 32, max_pos = 16, half = d / 2;
  auto x = randn(rows * heads * d);
  std::vector<float> cache(max_pos * d);
  for (long p = 0; p < max_pos; ++p)
    for (long i = 0; i < half; ++i) {
      const double a = p * pow(10000.0, -2.0 * i / d);
      cache[p * d + i] = (float)cos(a);
      cache[p * d + half + i] = (float)sin(a);
    }
  const int64_t pos[rows] = {0, 3, 15, 7};
  std::vector<double> ref(rows * heads * d);
  for (long r = 0; r < rows; ++r)
    for (long h = 0; h < heads; ++h)
      for (long i = 0; i < half; ++i) {
        const double c = cache[pos[r] * d + i], sn = cache[pos[r] * d + half + i];
        const double x1 = x[(r * heads + h) * d + i], x2 = x[(r * heads + h) * d + half + i];
        ref[(r * heads + h) * d + i] = x1 * c - x2 * sn;
        ref[(r * heads + h) * d + half + i] = x2 * c + x1 * sn;
      }
  std::vector<float> out(rows * heads * d);
  s.fn<Rotary>("rotary")(F32, F32, out.data(), x.data(), heads * d, heads, d, pos, cache.data(), rows, 2);
  s.check("rotary f32", out.data(), ref, 1e-5, 1e-6);

  const long inter = 72;
  auto g = randn(rows * 2 * inter, 4.0f);
  std::vector<double> sref(rows * inter);
  for (long r = 0; r < rows; ++r)
    for (long i = 0; i < inter; ++i) {
      const double gv = g[r * 2 * inter + i];
      sref[r * inter + i] = gv / (1.0 + exp(-gv)) * g[r * 2 * inter + inter + i];
    }
  std::vector<float> sout(rows * inter);
  s.fn<SiluMul>("silu_and_mul")(F32, sout.data(), g.data(), 2 * inter, rows, inter, 2);
  s.check("silu_and_mul f32", sout.data(), sref, 1e-5, 1e-6);
  const auto gb = to_bf16(g);
  const auto gr = round_bf16(g);
  for (long r = 0; r < rows; ++r)
    for (long i = 0; i < inter; ++i) {
      const double gv = gr[r * 2 * inter + i];
      sref[r * inter + i] = gv / (1.0 + exp(-gv)) * gr[r * 2 * inter + inter + i];
    }
  std::vector<uint16_t> soutb(rows * inter);
  s.fn<SiluMul>("silu_and_mul")(BF16, soutb.data(), gb.data(), 2 * inter, rows, inter, 1);
  s.check("silu_and_mul bf16", soutb.data(), sref, 1e-2, 1e-3);
}

// the value of one-byte code b of a one-byte cache format (written from the formats'
// definitions: sign, exponent, mantissa, subnormals below the smallest exponent)
double fp8_value(uint8_t b, int cache) {
  const bool e4m3 = cache == FP8_E4M3;
  const int man_bits = e4m3 ? 3 : 2, bias = e4m3 ? 7 : 15;
  const int e = (b & 0x7f) >> man_bits, m = b & ((1 << man_bits) - 1);
  if (e4m3 && (b & 0x7f) == 0x7f) return NAN;
  const double mag = e == 0 ? ldexp(m, 1 - bias - man_bits) : ldexp(1.0 + ldexp(m, -man_bits), e - bias);
  return b & 0x80 ? -mag : mag;
}

// the value of IEEE half h, from the format's definition (subnormals, infinities, NaN)
double half_value(uint16_t h) {
  const int e = (h >> 10) & 31, m = h & 1023;
  const double mag = e == 31 ? (m ? NAN : INFINITY) : e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
  return h & 0x8000 ? -mag : mag;
}

// float32 values written to a float16 cache (write_kv_cache_cast): each the half nearest to it,
// ties to the even half, found by trying all 63488 finite halves; from 65520 on, inf (as torch
// casts); NaN a NaN. Every ISA's conversion: F16C's, aarch64's FCVT, the software rounding
void test_half_rounding(Suite &s) {
  std::vector<float> x = {1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, -(1.0f + 0x1p-11f), 65504.0f, 65519.99f, 65520.0f,
                          -65520.0f, 1e9f, INFINITY, -INFINITY, 0x1p-14f, 0x1p-14f * 0.75f, 0x1p-24f * 1.5f,
                          0x1p-25f, 0x1p-25f * 1.01f, 0x1p-26f, -0x1p-24f * 2.5f, 0.0f, -0.0f, 1e-30f};
  const auto more = randn(44, 30.0f);
  x.insert(x.end(), more.begin(), more.end());
  x.push_back(NAN);
  const long row = (long)x.size();
  std::vector<uint16_t> kc(row), vc(row);
  const int64_t slot = 0;
  s.fn<WriteKvCast>("write_kv_cache_cast")(F32, F16, x.data(), row, x.data(), row, kc.data(), vc.data(), &slot, 1,
                                           row, 1, 1.0f, 1.0f);
  size_t bad = 0;
  for (long i = 0; i < row; ++i) {
    uint16_t want = 0;
    if (x[i] != x[i]) {
      bad += half_value(kc[i]) == half_value(kc[i]);  // not a NaN
      continue;
    }
    const float a = fabsf(x[i]);
    if (a >= 65520.0f) {
      want = 0x7c00;
    } else {
      double best = INFINITY;
      for (uint32_t h = 0; h < 0x7c00; ++h) {
        const double err = fabs(half_value((uint16_t)h) - a);
        if (err < best || (err == best && (h & 1) == 0)) best = err, want = (uint16_t)h;
      }
    }
    if (signbit(x[i])) want |= 0x8000;
    bad += kc[i] != want || vc[i] != want;
  }
  const float fbad = (float)bad;
  const std::vector<double> zero(1, 0.0);
  s.check("write_kv_cache_cast float16: nearest even half", &fbad, zero, 0, 0);
}

// Two sequences in one flattened batch (plugins/attention.py's layout): a prefill of
// `prompt` new tokens onto 3 cached ones (7 from 6 new ones), and a decode step at length 37; the caches are written
// with write_kv_cache through shuffled block tables, then attended. A one-byte cache
// (cache = FP8_*) is written with scales fp8_scale (K) and fp8_scale / 2.5 (V) and checked
// against the unrounded values within the format's rounding (the Python tests compare its
// bytes with torch's exactly), and against the values its bytes hold as closely as float32;
// a large fp8_scale writes mostly subnormal codes. A bfloat16 or float16 cache under float32
// (cache = BF16 / F16, dtype = F32) is checked likewise: against the values its rows hold as
// closely as float32, and against the rows as given within the format's rounding.
// With prompt = 45 (and 7 cached), the prefill is one the AVX512_BF16 builds attend on tiles
// (attention_tiles.h: tile_prompts, from 16 tokens; the tile unit's, or vdpbf16ps ones under
// bfloat16 compute): 3 query tiles, the last of 13 tokens, over 52 keys (a last block of 20).
void test_attention(Suite &s, long d, int dtype, int cache = -1, long window = 0, float fp8_scale = 0.05f,
                    long prompt = 5) {
  const bool fp8 = cache == FP8_E4M3 || cache == FP8_E5M2;
  const bool cast = fp8 || (dtype == F32 && (cache == BF16 || cache == F16));
  if (!cast) cache = dtype;
  const long hq = 6, hk = 2, group = hq / hk, bs = 16, blocks = 8, row = hk * d;
  const long cached = prompt > 5 ? 7 : 3, tokens = prompt + 1, lens[2] = {cached + prompt, 37};
  const int32_t seq_lens[2] = {(int32_t)lens[0], 37}, starts[3] = {0, (int32_t)prompt, (int32_t)tokens};
  const int32_t tables[2][4] = {{5, 0, 3, 6}, {2, 7, 4, 1}};
  // the K/V rows of every position of both sequences, and their slots
  std::vector<float> kv[2];
  for (auto &v : kv) v = randn((lens[0] + lens[1]) * row);
  std::vector<int64_t> slots;
  for (int sq = 0; sq < 2; ++sq)
    for (long p = 0; p < lens[sq]; ++p) slots.push_back((long)tables[sq][p / bs] * bs + p % bs);
  const long kv_rows = (long)slots.size();
  auto q = randn(tokens * hq * d);
  if (dtype == BF16) {
    q = round_bf16(q);
    for (auto &v : kv) v = round_bf16(v);
  }
  const size_t es = dtype == F32 ? 4 : 2;
  const size_t cs = fp8 ? 1 : cache == F32 ? 4 : 2;
  const float k_scale = fp8 ? fp8_scale : 1.0f, v_scale = fp8 ? fp8_scale / 2.5f : 1.0f;
  std::vector<uint8_t> kc(blocks * bs * row * cs, 0), vc(kc.size(), 0), qb(tokens * hq * d * es),
      kb(kv_rows * row * es), vb(kb.size());
  auto put = [&](std::vector<uint8_t> &dst, const std::vector<float> &src) {
    for (size_t i = 0; i < src.size(); ++i)
      if (dtype == F32) memcpy(&dst[i * 4], &src[i], 4);
      else { const uint16_t b = f32_to_bf16(src[i]); memcpy(&dst[i * 2], &b, 2); }
  };
  put(qb, q);
  put(kb, kv[0]);
  put(vb, kv[1]);
  const long bad =
      cast ? s.fn<WriteKvCast>("write_kv_cache_cast")(dtype, cache, kb.data(), row, vb.data(), row, kc.data(),
                                                      vc.data(), slots.data(), kv_rows, row, blocks * bs, k_scale,
                                                      v_scale)
          : s.fn<WriteKv>("write_kv_cache")(kb.data(), row * es, vb.data(), row * es, kc.data(), vc.data(),
                                            slots.data(), kv_rows, row * es, blocks * bs);
  const float scale = 1.0f / sqrtf((float)d);
  // the attention of q over K/V rows (double)
  auto reference = [&](const std::vector<double> (&rows)[2]) {
    std::vector<double> ref(tokens * hq * d);
    for (long t = 0; t < tokens; ++t) {
      const int sq = t < prompt ? 0 : 1;
      const long q_len = starts[sq + 1] - starts[sq], base = sq == 0 ? 0 : lens[0];
      const long n_keys = lens[sq] - q_len + (t - starts[sq]) + 1;
      const long first = window > 0 && n_keys > window ? n_keys - window : 0;  // keys before it: hidden
      for (long h = 0; h < hq; ++h) {
        const long kvh = h / group;
        std::vector<double> p(n_keys, 0.0);
        double mx = -1e300, sum = 0.0;
        for (long j = first; j < n_keys; ++j) {
          double dot = 0.0;
          for (long i = 0; i < d; ++i) dot += (double)q[(t * hq + h) * d + i] * rows[0][(base + j) * row + kvh * d + i];
          p[j] = dot * scale;
          mx = p[j] > mx ? p[j] : mx;
        }
        for (long j = first; j < n_keys; ++j) sum += p[j] = exp(p[j] - mx);
        for (long i = 0; i < d; ++i) {
          double acc = 0.0;
          for (long j = first; j < n_keys; ++j) acc += p[j] * rows[1][(base + j) * row + kvh * d + i];
          ref[(t * hq + h) * d + i] = acc / sum;
        }
      }
    }
    return ref;
  };
  std::vector<double> kvd[2], held[2];  // the rows as given, and as a one-byte cache holds them
  for (int c = 0; c < 2; ++c) {
    kvd[c].assign(kv[c].begin(), kv[c].end());
    held[c] = kvd[c];
  }
  if (fp8)
    for (long r = 0; r < kv_rows; ++r)
      for (long i = 0; i < row; ++i) {
        held[0][r * row + i] = fp8_value(kc[slots[r] * row + i], cache) * k_scale;
        held[1][r * row + i] = fp8_value(vc[slots[r] * row + i], cache) * v_scale;
      }
  if (cache == BF16 && dtype == F32)  // the rows' values rounded to nearest even
    for (int c = 0; c < 2; ++c) {
      const auto rounded = round_bf16(kv[c]);
      held[c].assign(rounded.begin(), rounded.end());
    }
  if (cache == F16)  // the halves the cache holds
    for (long r = 0; r < kv_rows; ++r)
      for (long i = 0; i < row; ++i) {
        uint16_t hk, hv;
        memcpy(&hk, &kc[(slots[r] * row + i) * 2], 2);
        memcpy(&hv, &vc[(slots[r] * row + i) * 2], 2);
        held[0][r * row + i] = half_value(hk);
        held[1][r * row + i] = half_value(hv);
      }
  const std::vector<double> ref = reference(kvd);
  std::vector<uint8_t> out(tokens * hq * d * es);
  const int status = s.fn<Attention>("paged_attention")(dtype, cache, out.data(), qb.data(), hq * d, kc.data(),
                                                        vc.data(), k_scale, v_scale, starts, seq_lens, &tables[0][0], 4,
                                                        tokens, 2, hq, hk, d, bs, scale, window, 2);
  if (status) {
    ++s.run;
    printf("FAIL paged_attention d=%ld dtype %d cache %d [%s]: returned %d\n", d, dtype, cache, s.isa.c_str(), status);
    return;
  }
  const std::string name = "paged_attention prefill " + std::to_string(prompt) + "+decode d=" + std::to_string(d) +
                           (dtype == F32 ? " f32" : " bf16") +
                           (cache == FP8_E4M3 ? " e4m3 cache" : cache == FP8_E5M2 ? " e5m2 cache"
                            : cast ? (cache == F16 ? " f16 cache" : " bf16 cache") : "") +
                           (window ? " window " + std::to_string(window) : "") +
                           (fp8 ? " scale " + std::to_string(fp8_scale) : "");
  if (cast) {
    const double rtol = cache == FP8_E4M3 ? 0.15 : cache == FP8_E5M2 ? 0.3 : cache == F16 ? 3e-3 : 2e-2;
    const double atol = fp8 ? 0.1 : cache == F16 ? 6e-4 : 5e-3;
    if (fp8_scale < 1.0f) s.check(name, (const float *)out.data(), ref, rtol, atol);
    s.check(name + " (held values)", (const float *)out.data(), reference(held), 1e-4, 1e-5);
  }
  else if (dtype == F32) s.check(name, (const float *)out.data(), ref, 1e-4, 1e-5);
  else s.check(name, (const uint16_t *)out.data(), ref, 1e-2, 2e-3);
  std::vector<double> zero(1, 0.0);
  const float fbad = (float)bad;
  s.check("write_kv_cache slots in range", &fbad, zero, 0, 0);
}

// A weight matrix [n, k] in format qt (host byte order) and its dequantized values.
struct Weights {
  std::vector<uint8_t> bytes;
  std::vector<float> scales;  // per-row, INT8 only
  std::vector<double> deq;
};

Weights make_weights(int qt, long n, long k) {
  Weights w;
  const long nb = k / 32;
  const long bb = qt == Q8_0 ? 34 : qt == Q4_0 ? 18 : qt == Q4_1 ? 20 : qt == Q5_0 ? 22 : qt == Q5_1 ? 24
                : qt == F32W ? 128 : qt == Q4FX8 ? 24 : qt == U8FX8 || qt == S8FX8 ? 40 : 32;
  w.bytes.resize(n * nb * bb);
  w.deq.resize(n * k);
  if (qt == INT8 || qt == E4M3W) w.scales = randn(n, 0.02f);
  for (long j = 0; j < n; ++j)
    for (long b = 0; b < nb; ++b) {
      uint8_t *p = &w.bytes[(j * nb + b) * bb];
      double *o = &w.deq[j * k + b * 32];
      const float m_sign = next_u32() & 1 ? 1.0f : -1.0f;  // |m| >= 0.01: a normal half
      const uint16_t dh = f32_to_half(uniform(0.005f, 0.05f)), mh = f32_to_half(m_sign * uniform(0.01f, 0.2f));
      const double d = half_to_f32(dh), m = half_to_f32(mh);
      if (float_scaled(qt)) {  // row form: float32 d and m (S8FX8: d0, d1), then the codes
        const float fd = uniform(0.005f, 0.05f), fm = qt == S8FX8 ? uniform(0.005f, 0.05f) : m_sign * uniform(0.01f, 0.2f);
        memcpy(p, &fd, 4);
        memcpy(p + 4, &fm, 4);
        for (int i = 0; i < 32; ++i) {
          int v;
          if (qt == Q4FX8) {
            v = (int)(next_u32() % 16);
            uint8_t &byte = p[8 + i % 16];
            byte = i < 16 ? (uint8_t)((byte & 0xf0) | v) : (uint8_t)((byte & 0x0f) | (v << 4));
          } else {
            v = qt == U8FX8 ? (int)(next_u32() % 64) : (int)(next_u32() % 255) - 127;
            p[8 + i] = (uint8_t)v;
          }
          o[i] = qt == S8FX8 ? (double)(i < 16 ? fd : fm) * v : (double)fd * v + fm;
        }
        continue;
      }
      if (qt != F32W && qt != INT8 && qt != E4M3W) memcpy(p, &dh, 2);
      if (qt == Q4_1 || qt == Q5_1) memcpy(p + 2, &mh, 2);
      for (int i = 0; i < 32; ++i) {
        if (qt == F32W) {
          const float v = uniform(-1.0f, 1.0f);
          memcpy(p + 4 * i, &v, 4);
          o[i] = v;
        } else if (qt == Q8_0 || qt == INT8) {
          const int8_t v = (int8_t)(next_u32() % 255 - 127);
          p[(qt == Q8_0 ? 2 : 0) + i] = (uint8_t)v;
          o[i] = qt == Q8_0 ? d * v : (double)w.scales[j] * v;
        } else if (qt == E4M3W) {  // any code but the NaNs 0x7f / 0xff: normals, subnormals, zeros
          uint8_t c = (uint8_t)(next_u32() & 0xff);
          if ((c & 0x7f) == 0x7f) c ^= 0x01;
          p[i] = c;
          o[i] = (double)w.scales[j] * e4m3_value(c);
        } else if (qt == Q5_0 || qt == Q5_1) {  // the low nibble as Q4, the high bit in qh (little-endian)
          const int v = (int)(next_u32() % 32);
          uint8_t *qh = p + (qt == Q5_1 ? 4 : 2);
          uint8_t &byte = qh[4 + i % 16];
          byte = i < 16 ? (uint8_t)((byte & 0xf0) | (v & 15)) : (uint8_t)((byte & 0x0f) | ((v & 15) << 4));
          qh[i / 8] = (uint8_t)((qh[i / 8] & ~(1 << (i % 8))) | ((v >> 4) << (i % 8)));
          o[i] = qt == Q5_0 ? d * (v - 16) : d * v + m;
        } else {
          const int v = (int)(next_u32() % 16);
          uint8_t &byte = p[(qt == Q4_1 ? 4 : 2) + i % 16];
          byte = i < 16 ? (uint8_t)((byte & 0xf0) | v) : (uint8_t)((byte & 0x0f) | (v << 4));
          o[i] = qt == Q4_0 ? d * (v - 8) : d * v + m;
        }
      }
    }
  return w;
}

// x [rows, k] @ deq [n, k]^T + bias, in double
std::vector<double> reference_linear(const std::vector<double> &deq, const std::vector<double> &x,
                                     const std::vector<float> &bias, long rows, long n, long k) {
  std::vector<double> ref(rows * n);
  for (long t = 0; t < rows; ++t)
    for (long j = 0; j < n; ++j) {
      double acc = bias[j];
      for (long i = 0; i < k; ++i) acc += deq[j * k + i] * x[t * k + i];
      ref[t * n + j] = acc;
    }
  return ref;
}

// A [n, k] matrix of GGUF K-quant super-blocks (Q4_K 144, Q5_K 176, Q6_K 210 bytes a 256
// values): random codes and 6/8-bit scales, normal f16 d (and dmin), dequantized as the GGUF
// reference (ggml's dequantize_row_q*_K) does, written here from its layout.
enum { Q4_K = 5, Q5_K = 6, Q6_K = 7 };
Weights make_k_weights(int qt, long n, long k) {
  Weights w;
  const long ns = k / 256, sb = qt == Q4_K ? 144 : qt == Q5_K ? 176 : 210;
  w.bytes.resize(n * ns * sb);
  w.deq.resize(n * k);
  for (uint8_t &b : w.bytes) b = (uint8_t)next_u32();
  for (long i = 0; i < n * ns; ++i) {
    uint8_t *p = &w.bytes[i * sb];
    double *y = &w.deq[i * 256];
    const uint16_t dh = f32_to_half(uniform(0.0005f, 0.005f)), mh = f32_to_half(uniform(0.0005f, 0.005f));
    if (qt == Q6_K) {
      memcpy(p + 208, &dh, 2);
      const double d = half_to_f32(dh);
      const uint8_t *ql = p, *qh = p + 128;
      const int8_t *sc = (const int8_t *)(p + 192);
      for (int h = 0; h < 2; ++h, y += 128, ql += 64, qh += 32, sc += 8)
        for (int l = 0; l < 32; ++l) {
          const int is = l / 16;
          y[l] = d * sc[is] * (((ql[l] & 15) | ((qh[l] >> 0) & 3) << 4) - 32);
          y[l + 32] = d * sc[is + 2] * (((ql[l + 32] & 15) | ((qh[l] >> 2) & 3) << 4) - 32);
          y[l + 64] = d * sc[is + 4] * ((ql[l] >> 4 | ((qh[l] >> 4) & 3) << 4) - 32);
          y[l + 96] = d * sc[is + 6] * ((ql[l + 32] >> 4 | ((qh[l] >> 6) & 3) << 4) - 32);
        }
      continue;
    }
    memcpy(p, &dh, 2);
    memcpy(p + 2, &mh, 2);
    const double d = half_to_f32(dh), dmin = half_to_f32(mh);
    const uint8_t *sc = p + 4, *qh = p + 16, *ql = p + (qt == Q4_K ? 16 : 48);
    for (int j = 0; j < 8; ++j) {  // sub-block j of 32: 6-bit scale and min
      const int scale = j < 4 ? sc[j] & 63 : (sc[j + 4] & 15) | ((sc[j - 4] >> 6) << 4);
      const int min = j < 4 ? sc[j + 4] & 63 : (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
      for (int l = 0; l < 32; ++l) {
        int q = j % 2 ? ql[32 * (j / 2) + l] >> 4 : ql[32 * (j / 2) + l] & 15;
        if (qt == Q5_K) q += (qh[l] >> j) & 1 ? 16 : 0;
        y[32 * j + l] = d * scale * q - dmin * min;
      }
    }
  }
  return w;
}

void test_k_linear(Suite &s, int qt, long rows) {
  const long n = 21, k = 512;
  Weights w = make_k_weights(qt, n, k);
  auto x = randn(rows * k), bias = randn(n);
  std::vector<double> ref = reference_linear(w.deq, std::vector<double>(x.begin(), x.end()), bias, rows, n, k);
  std::vector<float> out(rows * n);
  const int status = s.fn<Linear>("linear")(qt, w.bytes.data(), NULL, n, k, F32, x.data(), k, rows, out.data(),
                                            bias.data(), F32, 2);
  if (status != 0) ref.assign(ref.size(), NAN);
  double atol = 1e-4;
  if (s.isa == "avx512amx" && rows >= 24) {  // the tile unit's bfloat16 hi + lo products: 2^-15 of sum |x w|
    std::vector<double> wabs(w.deq), xabs(x.begin(), x.end());
    for (double &v : wabs) v = fabs(v);
    for (double &v : xabs) v = fabs(v);
    for (double v : reference_linear(wabs, xabs, std::vector<float>(n, 0.0f), rows, n, k)) atol = fmax(atol, v / 32768.0);
  }
  const char *names[] = {"q4_k", "q5_k", "q6_k"};
  s.check(std::string("linear ") + names[qt - Q4_K] + " rows=" + std::to_string(rows), out.data(), ref, 1e-4, atol);
}

// The x8 layout of native/src/quant.cpp: groups of 8 rows, per block the 8 rows' scales
// (f16 d, then m for Q4_1; f32 d, then m for the float-scaled blocks) and then 4 bytes of
// each row at a time.
std::vector<uint8_t> interleave_x8(int qt, const std::vector<uint8_t> &rows, long n, long k) {
  const long nb = k / 32, groups = (n + 7) / 8;
  const long bb = qt == Q8_0 ? 34 : qt == Q4_0 ? 18 : qt == Q4_1 ? 20 : qt == Q4FX8 ? 24 : float_scaled(qt) ? 40 : 32;
  const long head = qt == Q8_0 || qt == Q4_0 ? 2 : qt == Q4_1 ? 4 : float_scaled(qt) ? 8 : 0, body = bb - head;
  const long scales = head == 0 ? 0 : head == 2 ? 1 : 2, unit = scales ? head / scales : 0;  // unit: a scale's bytes
  std::vector<uint8_t> out(groups * nb * 8 * bb, 0);
  for (long g = 0; g < groups; ++g)
    for (long b = 0; b < nb; ++b) {
      uint8_t *blk = &out[(g * nb + b) * 8 * bb];
      for (long r = 0; r < 8 && g * 8 + r < n; ++r) {
        const uint8_t *src = &rows[((g * 8 + r) * nb + b) * bb];
        for (long i = 0; i < scales; ++i) memcpy(blk + 8 * unit * i + unit * r, src + unit * i, unit);
        for (long c = 0; c < body / 4; ++c) memcpy(blk + 8 * head + 32 * c + 4 * r, src + head + 4 * c, 4);
      }
    }
  return out;
}

// how test_linear calls the kernel: weights as stored (float32 activations), or in the x8
// layout with int8 activations or with CK_ACT16 (int16 below 7 rows, float32 from there)
enum Act { kFloatAct, kInt8Act, kAct16 };
const int kAct16Flag = 128;  // blocks.h: CK_ACT16

// n = 21: three groups of 8 rows in the x8 layout (a pair and a partial one on AVX-512 VNNI's
// two-group path), 13: a pair whose second group is partial
void test_linear(Suite &s, int qt, long rows, Act act, long n = 21, long k = 96) {
  const long nb = k / 32;
  Weights w = make_weights(qt, n, k);
  auto x = randn(rows * k), bias = randn(n);
  std::vector<double> xq(x.begin(), x.end());  // the activations the kernel multiplies
  // rounded per block of 32 as quant.cpp does: to int8, or to int16 (127 * 256 levels) below
  // quant.cpp's kAct16PanelMin rows: 24 in the AMX build (blocks.h kAmxMinRows), never in the
  // other AVX-512 builds and the scalar one (no panel kernel), else 7, and 64 on 4-bit codes
  // in the AVX2 build (kAct16PanelMinQ4)
  const bool q4 = qt == Q4_0 || qt == Q4_1 || qt == Q4FX8;
  const long panel_from = s.isa == "avx512amx"                                 ? 24
                          : s.isa == "scalar" || s.isa.rfind("avx512", 0) == 0 ? LONG_MAX
                          : s.isa == "avx2" && q4                              ? 64
                                                                               : 7;
  const bool int16 = act == kAct16 && rows < panel_from;
  const float levels = act == kInt8Act ? 127.0f : int16 ? 32512.0f : 0.0f;
  if (levels > 0.0f)
    for (long r = 0; r < rows; ++r)
      for (long b = 0; b < nb; ++b) {
        float amax = 0.0f;
        for (int i = 0; i < 32; ++i) amax = fmaxf(amax, fabsf(x[r * k + b * 32 + i]));
        const float dd = amax / levels, id = amax > 0 ? levels / amax : 0.0f;
        for (int i = 0; i < 32; ++i) xq[r * k + b * 32 + i] = dd * roundf(x[r * k + b * 32 + i] * id);
      }
  std::vector<double> ref = reference_linear(w.deq, xq, bias, rows, n, k);
  const std::vector<uint8_t> wbytes = act != kFloatAct ? interleave_x8(qt, w.bytes, n, k) : w.bytes;
  std::vector<float> scales = w.scales;
  if (act != kFloatAct && qt == INT8) scales.resize((n + 7) / 8 * 8, 0.0f);
  std::vector<float> out_buf(rows * n + 16);  // out on a cache line, as torch's tensors are
  float *out = (float *)(((uintptr_t)out_buf.data() + 63) & ~(uintptr_t)63);
  const int code = (float_scaled(qt) ? qt : qt + (act != kFloatAct ? X8 : 0)) + (act == kAct16 ? kAct16Flag : 0);
  const int status = s.fn<Linear>("linear")(code, wbytes.data(), qt == INT8 || qt == E4M3W ? scales.data() : NULL,
                                            n, k, F32, x.data(), k, rows, out, bias.data(), F32, 2);
  const char *mode = act == kInt8Act ? " x8/int8-act" : act == kAct16 ? " x8/act16" : "";
  const std::string name = std::string("linear ") + kFormatNames[qt] + mode + " rows=" + std::to_string(rows) +
                           (n != 21 ? " n=" + std::to_string(n) : "") + (k != 96 ? " k=" + std::to_string(k) : "");
  if (status != 0) ref.assign(ref.size(), NAN);  // fails the check
  double atol = 1e-4;
  if (act != kInt8Act && rows >= panel_from && s.isa == "avx512amx") {  // bfloat16 hi + lo products: 2^-15 of sum |x w|
    std::vector<double> wabs(w.deq), xabs(xq);
    const std::vector<float> zero(n, 0.0f);
    for (double &v : wabs) v = fabs(v);
    for (double &v : xabs) v = fabs(v);
    for (double v : reference_linear(wabs, xabs, zero, rows, n, k)) atol = fmax(atol, v / 32768.0);
  }
  s.check(name, out, ref, 1e-4, atol);
}

// native/src/moe.h's layouts
struct ExpertProj {
  const void *w;
  const float *scales;
  long expert_bytes, scale_stride, row_bytes, n, k, group;
  int qt;
};
struct Experts {
  ExpertProj gate, up, down;
  long num_experts;
};
typedef int (*FusedMoe)(const Experts *, int, const void *, long, long, const float *, const int64_t *, long, void *,
                        int);
typedef void (*MoeRoute)(int, const void *, long, long, long, int, float *, int64_t *);

// fused_moe on 4 experts (weights of qt as stored, the projections' rows in partial work items:
// 96 intermediate rows, 64 hidden) against sum_k w * down(silu(gate x) * up x) in double; and
// moe_route's softmax, top-k and renormalization
void test_fused_moe(Suite &s, int qt, int dtype, long tokens) {
  const long num = 4, hidden = 64, inter = 96, top_k = 2;
  Weights w[3] = {make_weights(qt, num * inter, hidden), make_weights(qt, num * inter, hidden),
                  make_weights(qt, num * hidden, inter)};  // gate, up, down: expert after expert
  const long dims[3][2] = {{inter, hidden}, {inter, hidden}, {hidden, inter}};
  ExpertProj proj[3];
  for (int p = 0; p < 3; ++p) {
    const long bytes = (long)w[p].bytes.size() / num;
    proj[p] = {w[p].bytes.data(), NULL, bytes, 0, bytes / dims[p][0], dims[p][0], dims[p][1], 1, qt};
  }
  const Experts experts = {proj[0], proj[1], proj[2], num};
  std::vector<float> x = randn(tokens * hidden), weights(tokens * top_k);
  if (dtype == BF16) x = round_bf16(x);
  std::vector<int64_t> ids(tokens * top_k);
  for (long t = 0; t < tokens; ++t) {
    ids[t * top_k] = next_u32() % num;
    ids[t * top_k + 1] = (ids[t * top_k] + 1 + next_u32() % (num - 1)) % num;
    for (long k = 0; k < top_k; ++k) weights[t * top_k + k] = uniform(0.1f, 1.0f);
  }
  std::vector<double> ref(tokens * hidden, 0.0), act(inter);
  for (long t = 0; t < tokens; ++t)
    for (long k = 0; k < top_k; ++k) {
      const long e = ids[t * top_k + k];
      for (long j = 0; j < inter; ++j) {
        double g = 0.0, u = 0.0;
        for (long i = 0; i < hidden; ++i) {
          g += w[0].deq[(e * inter + j) * hidden + i] * x[t * hidden + i];
          u += w[1].deq[(e * inter + j) * hidden + i] * x[t * hidden + i];
        }
        act[j] = g / (1.0 + exp(-g)) * u;
      }
      for (long j = 0; j < hidden; ++j) {
        double y = 0.0;
        for (long i = 0; i < inter; ++i) y += w[2].deq[(e * hidden + j) * inter + i] * act[i];
        ref[t * hidden + j] += weights[t * top_k + k] * y;
      }
    }
  std::vector<float> out(tokens * hidden);
  std::vector<uint16_t> xb = to_bf16(x), outb(tokens * hidden);
  const int status = s.fn<FusedMoe>("fused_moe")(&experts, dtype, dtype == BF16 ? (const void *)xb.data() : x.data(),
                                                 hidden, tokens, weights.data(), ids.data(), top_k,
                                                 dtype == BF16 ? (void *)outb.data() : out.data(), 2);
  const std::string name = std::string("fused_moe ") + kFormatNames[qt] + (dtype == BF16 ? " bf16" : "") +
                           " tokens=" + std::to_string(tokens);
  if (status != 0) ref.assign(ref.size(), NAN);
  double scale = 0.0;
  for (double v : ref) scale = fmax(scale, fabs(v));
  if (dtype == BF16)
    s.check(name, outb.data(), ref, 1e-2, 1e-2 * scale);
  else
    s.check(name, out.data(), ref, 1e-4, 1e-5 * scale);

  // the route of 9 experts' logits: top 3 (in order), renormalized or not
  const long n_exp = 9, k3 = 3;
  const std::vector<float> logits = randn(tokens * n_exp, 4.0f);
  for (int renormalize = 0; renormalize < 2; ++renormalize) {
    std::vector<float> got_w(tokens * k3);
    std::vector<int64_t> got_id(tokens * k3);
    std::vector<uint16_t> lb = to_bf16(logits);
    const std::vector<float> seen = dtype == BF16 ? round_bf16(logits) : logits;
    s.fn<MoeRoute>("moe_route")(dtype, dtype == BF16 ? (const void *)lb.data() : logits.data(), tokens, n_exp, k3,
                                renormalize, got_w.data(), got_id.data());
    std::vector<double> want(tokens * k3);
    std::vector<float> ids_ok(tokens * k3);
    for (long t = 0; t < tokens; ++t) {
      double top = -INFINITY, sum = 0.0, kept = 0.0;
      for (long j = 0; j < n_exp; ++j) top = fmax(top, seen[t * n_exp + j]);
      for (long j = 0; j < n_exp; ++j) sum += exp(seen[t * n_exp + j] - top);
      std::vector<bool> taken(n_exp, false);
      for (long k = 0; k < k3; ++k) {
        long best = -1;
        for (long j = 0; j < n_exp; ++j)
          if (!taken[j] && (best < 0 || seen[t * n_exp + j] > seen[t * n_exp + best])) best = j;
        taken[best] = true;
        want[t * k3 + k] = exp(seen[t * n_exp + best] - top) / sum;
        kept += want[t * k3 + k];
        ids_ok[t * k3 + k] = got_id[t * k3 + k] == best ? 0.0f : 1.0f;
      }
      if (renormalize)
        for (long k = 0; k < k3; ++k) want[t * k3 + k] /= kept;
    }
    const std::string route = std::string("moe_route") + (dtype == BF16 ? " bf16" : "") +
                              (renormalize ? " renormalized" : "") + " tokens=" + std::to_string(tokens);
    s.check(route + " ids", ids_ok.data(), std::vector<double>(tokens * k3, 0.0), 0, 0);
    s.check(route + " weights", got_w.data(), want, 1e-5, 1e-7);
  }
}

}  // namespace

// The pool (pool.cpp), back to back jobs of alternating sizes as a kernel's two parallel loops
// make them: every chunk of every job runs exactly once, and none after its call returned (a
// worker late to see a job end once claimed an index of the next job with the last one's
// generation, and ran it twice or after the caller left)
struct PoolJob {
  std::atomic<int> *runs;
  std::atomic<int> *returned;
  std::atomic<int> *late;
};
int test_pool(void *lib) {
  auto parallel = (void (*)(void (*)(void *, long), void *, long, int))dlsym(lib, "ck_parallel");
  if (!parallel) {
    printf("FAIL pool: ck_parallel not exported\n");
    return 1;
  }
  const long sizes[] = {3, 41, 2, 17};
  std::vector<std::atomic<int>> runs(64);
  long bad = 0;
  const long jobs = getenv("QEMU_CPU") ? 20000 : 200000;  // (the race it catches: ~1 in 40000 jobs here)
  for (long j = 0; j < jobs; ++j) {
    const long n = sizes[j % 4];
    std::atomic<int> returned{0}, late{0};
    for (long i = 0; i < n; ++i) runs[i].store(0);
    PoolJob job = {runs.data(), &returned, &late};
    parallel(
        [](void *ctx, long i) {
          PoolJob *pj = (PoolJob *)ctx;
          pj->runs[i].fetch_add(1);
          if (pj->returned->load()) pj->late->fetch_add(1);
        },
        &job, n, 2);
    returned.store(1);
    for (long i = 0; i < n; ++i) bad += runs[i].load() != 1;
    bad += late.load();
  }
  if (bad) printf("FAIL pool: %ld chunks run twice, never or after their call returned in %ld jobs\n", bad, jobs);
  return bad ? 1 : 0;
}

// a (compute, cache) dtype pair paged_attention does not read: -1, the output untouched
void test_attention_unread_pairs(Suite &s) {
  const long d = 64, hq = 2, hk = 1, bs = 4;
  const int32_t starts[2] = {0, 1}, seq_lens[1] = {1}, table[1] = {0};
  std::vector<uint8_t> q(hq * d * 4), kc(bs * hk * d * 4), vc(kc.size());
  const int pairs[][2] = {{BF16, F16}, {BF16, F32}, {F32, 7}, {F16, F16}, {7, F32}};
  for (const auto &pair : pairs) {
    std::vector<uint8_t> out(hq * d * 4, 0xAB);
    const int status = s.fn<Attention>("paged_attention")(pair[0], pair[1], out.data(), q.data(), hq * d, kc.data(),
                                                          vc.data(), 1.0f, 1.0f, starts, seq_lens, table, 1, 1, 1, hq,
                                                          hk, d, bs, 0.125f, 0, 2);
    bool untouched = true;
    for (uint8_t b : out) untouched = untouched && b == 0xAB;
    ++s.run;
    if (status == -1 && untouched)
      ++s.passed;
    else
      printf("FAIL paged_attention dtype %d cache %d [%s]: returned %d%s\n", pair[0], pair[1], s.isa.c_str(), status,
             untouched ? "" : ", wrote its output");
  }
}

// a (compute, cache) dtype pair write_kv_cache_cast does not cast (a cache of the compute
// dtype float32, an unknown code, a float16 or unknown compute dtype): -1, the caches untouched
void test_cache_cast_unwritten_pairs(Suite &s) {
  const long row = 64;
  std::vector<uint8_t> k(row * 4), v(k.size());
  const int64_t slot = 0;
  const int pairs[][2] = {{F32, F32}, {F32, 7}, {BF16, 5}, {F16, BF16}, {7, F16}};
  for (const auto &pair : pairs) {
    std::vector<uint8_t> kc(row * 4, 0xAB), vc(kc);
    const long status = s.fn<WriteKvCast>("write_kv_cache_cast")(pair[0], pair[1], k.data(), row, v.data(), row,
                                                                 kc.data(), vc.data(), &slot, 1, row, 1, 1.0f, 1.0f);
    bool untouched = true;
    for (size_t i = 0; i < kc.size(); ++i) untouched = untouched && kc[i] == 0xAB && vc[i] == 0xAB;
    ++s.run;
    if (status == -1 && untouched)
      ++s.passed;
    else
      printf("FAIL write_kv_cache_cast dtype %d cache %d [%s]: returned %ld%s\n", pair[0], pair[1], s.isa.c_str(),
             status, untouched ? "" : ", wrote the cache");
  }
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s <kernel library .so>\n", argv[0]);
    return 2;
  }
  void *lib = dlopen(argv[1], RTLD_NOW);
  if (!lib) {
    fprintf(stderr, "cannot load %s: %s\n", argv[1], dlerror());
    return 2;
  }
  auto names_fn = (const char *(*)(void))dlsym(lib, "ck_isa_names");
  auto runs_fn = (int (*)(const char *))dlsym(lib, "ck_isa_runs");
  if (!names_fn || !runs_fn) {
    fprintf(stderr, "%s exports no ck_isa_names / ck_isa_runs\n", argv[1]);
    return 2;
  }
  const char *seed = getenv("CK_TEST_SEED");
  if (seed) rng_state = strtoull(seed, NULL, 0) | 1;
  int run = 0, passed = 0;
  std::string tested, skipped;
  char names[256];
  snprintf(names, sizeof(names), "%s", names_fn());
  for (char *isa = strtok(names, " "); isa; isa = strtok(NULL, " ")) {
    if (runs_fn(isa) != 1) {
      skipped += std::string(skipped.empty() ? "" : " ") + isa;
      continue;
    }
    Suite s{lib, isa};
    test_rms_norm(s);
    test_rotary_silu(s);
    test_half_rounding(s);
    for (long d : {64L, 40L}) test_attention(s, d, F32);
    test_attention(s, 64, BF16);
    // bfloat16 decode on the vdpbf16ps scores and values (d = 128), scores only (d = 96: values need 64 | d)
    for (long d : {96L, 128L}) test_attention(s, d, BF16);
    for (int cache : {FP8_E4M3, FP8_E5M2})
      for (float fp8_scale : {0.05f, 40.0f}) test_attention(s, 64, F32, cache, 0, fp8_scale);
    for (long d : {64L, 40L})
      for (int cache : {BF16, F16}) test_attention(s, d, F32, cache);
    for (long window : {1L, 5L, 20L}) test_attention(s, 64, F32, -1, window);  // 20: the window spans 2 blocks
    test_attention(s, 64, BF16, -1, 20);
    for (long d : {64L, 96L, 128L, 40L}) test_attention(s, d, F32, -1, 0, 0.05f, 45);  // prompts on AMX's tiles
    for (long d : {64L, 128L}) test_attention(s, d, BF16, -1, 0, 0.05f, 45);  // vdpbf16ps tiles without AMX
    for (int cache : {(int)BF16, (int)F16, (int)FP8_E4M3}) test_attention(s, 64, F32, cache, 0, 0.05f, 45);
    for (long window : {1L, 20L}) test_attention(s, 64, F32, -1, window, 0.05f, 45);
    test_attention(s, 64, BF16, -1, 20, 0.05f, 45);
    test_attention_unread_pairs(s);
    test_cache_cast_unwritten_pairs(s);
    for (int qt : {Q8_0, Q4_0, Q4_1, INT8, F32W, Q5_0, Q5_1, E4M3W})
      for (long rows : {1L, 3L, 9L}) test_linear(s, qt, rows, kFloatAct);
    for (int qt : {(int)Q4_K, (int)Q5_K, (int)Q6_K})
      for (long rows : {1L, 3L, 9L, 40L}) test_k_linear(s, qt, rows);
    for (int qt : {(int)Q8_0, (int)Q4_0, (int)Q4_1, (int)INT8, (int)Q4FX8, (int)U8FX8, (int)S8FX8})
      for (long rows : {1L, 5L}) test_linear(s, qt, rows, kInt8Act);
    for (int qt : {(int)Q8_0, (int)Q4_0, (int)Q4_1, (int)INT8, (int)Q4FX8, (int)U8FX8, (int)S8FX8})
      for (long rows : {1L, 3L, 9L}) test_linear(s, qt, rows, kAct16);
    // 17 / 40 rows: several tiles of activation rows and a partial one
    for (int qt : {(int)Q8_0, (int)Q4_0, (int)Q4_1, (int)INT8, (int)Q4FX8, (int)U8FX8, (int)S8FX8}) {
      test_linear(s, qt, 5, kInt8Act, 13);
      test_linear(s, qt, 9, kAct16, 13);
      test_linear(s, qt, 17, kInt8Act);
      test_linear(s, qt, 40, kAct16, 13);
      // AMX builds (amx_gemm_few below 192 rows, amx_gemm from there): 32 + 5 columns, k in 4 + 1
      // steps of 32; 24 and 40 rows: one pass of 32 rows and a partial one, 70: two and a partial
      // one of 6, 200: 12 full tiles of 16 rows and a partial one
      for (long rows : {24L, 40L, 70L, 200L}) test_linear(s, qt, rows, kAct16, 37, 160);
    }
    // AMX builds: rows in blocks whose activation tiles fit 1 MB (k = 4096: 192 rows, then 208)
    test_linear(s, Q4_1, 400, kAct16, 21, 4096);
    // AMX builds: output rows of 48 floats, a full group's 32 streamed (amx_store_out), then 16
    for (int qt : {(int)Q8_0, (int)Q4_1}) test_linear(s, qt, 200, kAct16, 48, 160);
    // AMX builds: float32 activations on the tiles too, the blocks as stored (40 rows: amx_gemm_few;
    // 200: amx_gemm, its weight tiles packed from amx_weight_block's decode)
    for (int qt : {Q8_0, Q4_0, Q4_1, INT8, F32W, Q5_0, Q5_1, E4M3W})
      for (long rows : {40L, 200L}) test_linear(s, qt, rows, kFloatAct, 37, 160);
    for (int qt : {(int)Q4_K, (int)Q5_K, (int)Q6_K}) test_k_linear(s, qt, 200);
    for (int qt : {F32W, Q8_0})
      for (long tokens : {1L, 5L, 40L}) test_fused_moe(s, qt, F32, tokens);
    test_fused_moe(s, F32W, BF16, 9);
    run += s.run;
    passed += s.passed;
    tested += std::string(tested.empty() ? "" : " ") + isa;
  }
  const int pool_failed = test_pool(lib);
  const char *cpu = getenv("QEMU_CPU");  // set by the cross tests (native/CMakeLists.txt)
  printf("%s%s: %d tests, %d passed; ISA paths run: %s; not run on this CPU: %s\n", cpu ? "qemu -cpu " : "host",
         cpu ? cpu : "", run, passed, tested.c_str(), skipped.empty() ? "none" : skipped.c_str());
  return run > 0 && passed == run && !pool_failed ? 0 : 1;
}
