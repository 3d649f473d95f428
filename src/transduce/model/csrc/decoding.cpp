// CPU kernels for the decoding step, float32: transduce.model.kernels builds this file on first use
// (torch.utils.cpp_extension).
//
// attend: the attention of a step, a few queries per (sentence, head) over a short cache.
// transduce.model.step.decode_step calls it instead of torch's scaled_dot_product_attention, whose cost per
// (row, head) is made for long query blocks: for the one new query of a step it spent about 0.1-0.4 ms a call on
// the Multi30k model, of which the arithmetic is a few microseconds (see docs/benchmarks.md).
// For each (n, h): scores = q k^T * scale over the T keys (masked keys excluded), softmax, weighted sum of v. The
// same formula as scaled_dot_product_attention (max-subtracted softmax in float32); the exponential is a
// polynomial accurate to about two units in the last place, so the outputs agree to float rounding, not bit for
// bit. A query with no key left to attend (every key masked) gets zeros.

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cmath>
#include <cstring>
#include <limits>
#include <tuple>
#include <vector>

#include "vecmath.h"

namespace {

// One query over T keys; key(t) and value(t) give the addresses of key and value t. D > 0: the head size fixed
// at compile time (the loops unrolled, the accumulator in registers); D == 0: the head size d at run time.
// Dot products p[0 .. T) of a query with its keys, in place: scaled, -inf where the mask excludes the key, then
// exp(p - max); returns their sum, 0 when every key is masked (nothing to attend; the max is always one term).
inline float softmax_numerators(float* p, int64_t T, const bool* mask, int64_t mask_step, float scale) {
  float top = kNegInf;
  for (int64_t t = 0; t < T; ++t) {
    const float s = (mask == nullptr || mask[t * mask_step]) ? p[t] * scale : kNegInf;
    p[t] = s;
    top = s > top ? s : top;
  }
  return top == kNegInf ? 0.0f : sum_exp(p, top, T, p);
}

#ifdef TRANSDUCE_AVX512
// The four sums of the 16 lanes of v0 .. v3, in that order: three rounds of lane shuffles and adds for the four,
// where a reduction per vector takes about as many for one.
inline __m128 sum4(__m512 v0, __m512 v1, __m512 v2, __m512 v3) {
  // 128-bit quarters: a = [v0.0 + v0.2, v0.1 + v0.3, v1.0 + v1.2, v1.1 + v1.3], b likewise for v2, v3
  const __m512 a = _mm512_add_ps(_mm512_shuffle_f32x4(v0, v1, _MM_SHUFFLE(1, 0, 1, 0)),
                                 _mm512_shuffle_f32x4(v0, v1, _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 b = _mm512_add_ps(_mm512_shuffle_f32x4(v2, v3, _MM_SHUFFLE(1, 0, 1, 0)),
                                 _mm512_shuffle_f32x4(v2, v3, _MM_SHUFFLE(3, 2, 3, 2)));
  // quarter j of c: four partial sums of v_j
  const __m512 c = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512 d = _mm512_add_ps(c, _mm512_permute_ps(c, _MM_SHUFFLE(2, 3, 0, 1)));
  const __m512 e = _mm512_add_ps(d, _mm512_permute_ps(d, _MM_SHUFFLE(1, 0, 3, 2)));  // each quarter: its total
  return _mm512_castps512_ps128(
      _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), e));
}

// attend_one for head sizes of 32 and 64 with AVX-512: the query in registers, the scores of four keys reduced
// together (sum4), the weighted sum of the values in two sets of accumulators (even and odd keys), so that the
// additions of successive keys do not wait for each other. About 2x the compiler's vectorisation of the generic
// loops (docs/benchmarks.md).
template <int64_t D, class KeyAt, class ValueAt>
void attend_one_avx512(const float* __restrict q, KeyAt key, ValueAt value, const bool* mask, int64_t mask_step,
                       int64_t T, float scale, float* __restrict p, float* __restrict out) {
  constexpr int64_t W = D / 16;  // vectors per row
  __m512 qv[W];
  for (int64_t i = 0; i < W; ++i) qv[i] = _mm512_loadu_ps(q + 16 * i);
  const auto dot = [&](const float* k) {
    __m512 s = _mm512_mul_ps(qv[0], _mm512_loadu_ps(k));
    for (int64_t i = 1; i < W; ++i) s = _mm512_fmadd_ps(qv[i], _mm512_loadu_ps(k + 16 * i), s);
    return s;
  };
  int64_t t = 0;
  for (; t + 4 <= T; t += 4)
    _mm_storeu_ps(p + t, sum4(dot(key(t)), dot(key(t + 1)), dot(key(t + 2)), dot(key(t + 3))));
  for (; t < T; ++t) p[t] = _mm512_reduce_add_ps(dot(key(t)));
  const float sum = softmax_numerators(p, T, mask, mask_step, scale);
  if (sum == 0.0f) {  // nothing to attend
    for (int64_t i = 0; i < D; ++i) out[i] = 0.0f;
    return;
  }
  __m512 even[W], odd[W];
  for (int64_t i = 0; i < W; ++i) even[i] = odd[i] = _mm512_setzero_ps();
  for (t = 0; t + 2 <= T; t += 2) {
    const __m512 w0 = _mm512_set1_ps(p[t]), w1 = _mm512_set1_ps(p[t + 1]);
    const float* v0 = value(t);
    const float* v1 = value(t + 1);
    for (int64_t i = 0; i < W; ++i) {
      even[i] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(v0 + 16 * i), even[i]);
      odd[i] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(v1 + 16 * i), odd[i]);
    }
  }
  if (t < T) {
    const __m512 w0 = _mm512_set1_ps(p[t]);
    const float* v0 = value(t);
    for (int64_t i = 0; i < W; ++i) even[i] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(v0 + 16 * i), even[i]);
  }
  const __m512 inv = _mm512_set1_ps(1.0f / sum);
  for (int64_t i = 0; i < W; ++i) _mm512_storeu_ps(out + 16 * i, _mm512_mul_ps(_mm512_add_ps(even[i], odd[i]), inv));
}
#endif

template <int64_t D, class KeyAt, class ValueAt>
void attend_one(const float* __restrict q, KeyAt key, ValueAt value, const bool* mask, int64_t mask_step, int64_t T,
                int64_t d, float scale, float* __restrict p, float* __restrict acc, float* __restrict out) {
#if defined(TRANSDUCE_AVX512) && !defined(TRANSDUCE_GENERIC_ATTENTION)
  if constexpr (D == 32 || D == 64) return attend_one_avx512<D>(q, key, value, mask, mask_step, T, scale, p, out);
#endif
  const int64_t dim = D > 0 ? D : d;
  for (int64_t t = 0; t < T; ++t) {
    const float* __restrict kt = key(t);
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < dim; ++i) s += q[i] * kt[i];
    p[t] = s;
  }
  const float sum = softmax_numerators(p, T, mask, mask_step, scale);
  if (sum == 0.0f) {  // nothing to attend
    for (int64_t i = 0; i < dim; ++i) out[i] = 0.0f;
    return;
  }
  for (int64_t i = 0; i < dim; ++i) acc[i] = 0.0f;
  for (int64_t t = 0; t < T; ++t) {
    const float w = p[t];
    const float* __restrict vt = value(t);
#pragma omp simd
    for (int64_t i = 0; i < dim; ++i) acc[i] += w * vt[i];
  }
  const float inv = 1.0f / sum;
  for (int64_t i = 0; i < dim; ++i) out[i] = acc[i] * inv;
}

template <class KeyAt, class ValueAt>
inline void attend_any(const float* q, KeyAt key, ValueAt value, const bool* mask, int64_t mask_step, int64_t T,
                       int64_t d, float scale, float* p, float* acc, float* out) {
  switch (d) {
    case 32: attend_one<32>(q, key, value, mask, mask_step, T, d, scale, p, acc, out); break;
    case 64: attend_one<64>(q, key, value, mask, mask_step, T, d, scale, p, acc, out); break;
    case 128: attend_one<128>(q, key, value, mask, mask_step, T, d, scale, p, acc, out); break;
    default: attend_one<0>(q, key, value, mask, mask_step, T, d, scale, p, acc, out);
  }
}

void check_floats(const torch::Tensor& t, const char* name, int64_t dims, const char* kernel = "attend") {
  TORCH_CHECK(t.dim() == dims, kernel, ": ", name, " must be ", dims, "-D, got ", t.sizes());
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kFloat, kernel, ": float32 tensors only (", name, ")");
  TORCH_CHECK(t.stride(dims - 1) == 1, kernel, ": the last dimension must be dense (", name, ")");
}

}  // namespace

// q: (N, H, G, D), k and v: (N, H, T, D), mask: (N, T) bool (true: attend) or None; any strides but a unit
// stride along D (and T for the mask). Returns (N, G, H, D), contiguous: the heads of each query side by side.
torch::Tensor attend(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                     const c10::optional<torch::Tensor>& mask, double scale) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "attend: q, k and v must be 4-D");
  check_floats(q, "q", 4);
  check_floats(k, "k", 4);
  check_floats(v, "v", 4);
  const int64_t N = q.size(0), H = q.size(1), G = q.size(2), d = q.size(3), T = k.size(2);
  TORCH_CHECK(k.size(0) == N && k.size(1) == H && k.size(3) == d && v.size(0) == N && v.size(1) == H &&
                  v.size(2) == T && v.size(3) == d,
              "attend: q ", q.sizes(), ", k ", k.sizes(), " and v ", v.sizes(), " do not match");
  const bool* mask_data = nullptr;
  int64_t mask_row = 0, mask_step = 0;
  if (mask.has_value() && mask->defined()) {
    TORCH_CHECK(mask->device().is_cpu(), "attend: the mask must be on the CPU");
    TORCH_CHECK(mask->scalar_type() == at::kBool && mask->dim() == 2 && mask->size(0) == N && mask->size(1) == T,
                "attend: the mask must be (N, T) bool, got ", mask->sizes(), " ", mask->scalar_type());
    mask_data = mask->data_ptr<bool>();
    mask_row = mask->stride(0);
    mask_step = mask->stride(1);
  }
  auto out = torch::empty({N, G, H, d}, q.options());
  const float* qd = q.data_ptr<float>();
  const float* kd = k.data_ptr<float>();
  const float* vd = v.data_ptr<float>();
  float* od = out.data_ptr<float>();
  const float sc = static_cast<float>(scale);
  const int64_t q0 = q.stride(0), q1 = q.stride(1), q2 = q.stride(2);
  const int64_t k0 = k.stride(0), k1 = k.stride(1), k2 = k.stride(2);
  const int64_t v0 = v.stride(0), v1 = v.stride(1), v2 = v.stride(2);
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, G * T * d));
  at::parallel_for(0, N * H, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> scratch(T + d);
    float* p = scratch.data();
    float* acc = p + T;
    for (int64_t nh = begin; nh < end; ++nh) {
      const int64_t n = nh / H, h = nh % H;
      const float* kb = kd + n * k0 + h * k1;
      const float* vb = vd + n * v0 + h * v1;
      const auto key = [kb, k2](int64_t t) { return kb + t * k2; };
      const auto value = [vb, v2](int64_t t) { return vb + t * v2; };
      const bool* m = mask_data == nullptr ? nullptr : mask_data + n * mask_row;
      for (int64_t g = 0; g < G; ++g)
        attend_any(qd + n * q0 + h * q1 + g * q2, key, value, m, mask_step, T, d, sc, p, acc,
                   od + ((n * G + g) * H + h) * d);
    }
  });
  return out;
}

// The self-attention of a step over a cache stored by position (transduce.model.step): q (B, H, 1, D); k and v
// (P, R, H, D), the keys and values of position p written once, at that step, to the rows 0 .. of that step's
// batch; table (B, T) int64: row b's key and value at position t are k[t, table[b, t]] and v[t, table[b, t]].
// Beam search re-orders a table of B x T ids at each step instead of copying the whole cache. Returns (B, 1, H, D).
torch::Tensor attend_by_table(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                              const torch::Tensor& table, double scale) {
  check_floats(q, "q", 4);
  check_floats(k, "k", 4);
  check_floats(v, "v", 4);
  const int64_t B = q.size(0), H = q.size(1), d = q.size(3), T = table.size(1);
  TORCH_CHECK(q.size(2) == 1, "attend_by_table: one query per row, got ", q.sizes());
  TORCH_CHECK(table.device().is_cpu(), "attend_by_table: the table must be on the CPU");
  TORCH_CHECK(table.dim() == 2 && table.scalar_type() == at::kLong && table.size(0) == B && table.stride(1) == 1,
              "attend_by_table: the table must be (B, T) int64 with dense rows, got ", table.sizes());
  TORCH_CHECK(k.sizes() == v.sizes() && k.size(2) == H && k.size(3) == d && k.size(0) >= T,
              "attend_by_table: q ", q.sizes(), ", k ", k.sizes(), ", v ", v.sizes(), " and ", T,
              " positions do not match");
  const int64_t rows = k.size(1);
  const int64_t* td = table.data_ptr<int64_t>();
  for (int64_t i = 0, n = B * T; i < n; ++i) {
    const int64_t r = td[(i / T) * table.stride(0) + i % T];
    TORCH_CHECK(r >= 0 && r < rows, "attend_by_table: table entry ", r, " outside the ", rows, " rows");
  }
  auto out = torch::empty({B, 1, H, d}, q.options());
  const float* qd = q.data_ptr<float>();
  const float* kd = k.data_ptr<float>();
  const float* vd = v.data_ptr<float>();
  float* od = out.data_ptr<float>();
  const float sc = static_cast<float>(scale);
  const int64_t q0 = q.stride(0), q1 = q.stride(1), tab = table.stride(0);
  const int64_t k0 = k.stride(0), k1 = k.stride(1), k2 = k.stride(2);
  const int64_t v0 = v.stride(0), v1 = v.stride(1), v2 = v.stride(2);
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, T * d));
  at::parallel_for(0, B * H, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> scratch(T + d);
    float* p = scratch.data();
    float* acc = p + T;
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      const int64_t* row = td + b * tab;
      const float* kb = kd + h * k2;
      const float* vb = vd + h * v2;
      const auto key = [kb, row, k0, k1](int64_t t) { return kb + t * k0 + row[t] * k1; };
      const auto value = [vb, row, v0, v1](int64_t t) { return vb + t * v0 + row[t] * v1; };
      attend_any(qd + b * q0 + h * q1, key, value, nullptr, 0, T, d, sc, p, acc, od + (b * H + h) * d);
    }
  });
  return out;
}

// The self-attention of a step over a cache kept in batch-row order (transduce.model.step, for short sources),
// with the cache of the next step made on the way: past (2, B', H, T, D) contiguous, the keys and values of the T
// earlier positions in the previous step's row order (None when T = 0); order (B,) int64 or None (the identity):
// row b continues row order[b] of past; new_kv (2, B, H, D), any strides but a dense D: this step's keys and
// values; out (2, B, H, T + 1, D) contiguous, written here: past's rows in the new order, then new_kv at position
// T. q (B, H, 1, D). Returns (B, 1, H, D): the attention of q over out. Each (row, head)'s keys and values are
// copied and then attended while in the cache; gathering the whole cache first (torch.index_select over every
// layer, one call a step) and attending afterwards read it from memory twice.
torch::Tensor attend_gathered(const torch::Tensor& q, const c10::optional<torch::Tensor>& past,
                              const c10::optional<torch::Tensor>& order, const torch::Tensor& new_kv,
                              const torch::Tensor& out, double scale) {
  check_floats(q, "q", 4, "attend_gathered");
  check_floats(new_kv, "new_kv", 4, "attend_gathered");
  check_floats(out, "out", 5, "attend_gathered");
  const int64_t B = q.size(0), H = q.size(1), d = q.size(3), T = out.size(3) - 1;
  TORCH_CHECK(q.size(2) == 1, "attend_gathered: one query per row, got ", q.sizes());
  TORCH_CHECK(out.is_contiguous() && out.size(0) == 2 && out.size(1) == B && out.size(2) == H && T >= 0 &&
                  out.size(4) == d,
              "attend_gathered: out must be a contiguous (2, ", B, ", ", H, ", T + 1, ", d, ") tensor, got ",
              out.sizes());
  TORCH_CHECK(new_kv.size(0) == 2 && new_kv.size(1) == B && new_kv.size(2) == H && new_kv.size(3) == d,
              "attend_gathered: new_kv must be (2, ", B, ", ", H, ", ", d, "), got ", new_kv.sizes());
  const bool has_past = past.has_value() && past->defined();
  TORCH_CHECK(has_past == (T > 0), "attend_gathered: past is needed exactly when out holds earlier positions");
  const float* pd = nullptr;
  int64_t rows = B;
  if (has_past) {
    check_floats(*past, "past", 5, "attend_gathered");
    TORCH_CHECK(past->is_contiguous() && past->size(0) == 2 && past->size(2) == H && past->size(3) == T &&
                    past->size(4) == d,
                "attend_gathered: past must be a contiguous (2, rows, ", H, ", ", T, ", ", d, ") tensor, got ",
                past->sizes());
    pd = past->data_ptr<float>();
    rows = past->size(1);
  }
  const int64_t* od_order = nullptr;
  if (order.has_value() && order->defined()) {
    TORCH_CHECK(order->device().is_cpu() && order->scalar_type() == at::kLong && order->dim() == 1 &&
                    order->size(0) == B && order->is_contiguous(),
                "attend_gathered: order must be a contiguous (", B, ",) int64 CPU tensor, got ", order->sizes());
    od_order = order->data_ptr<int64_t>();
    for (int64_t b = 0; b < B; ++b)
      TORCH_CHECK(od_order[b] >= 0 && od_order[b] < rows, "attend_gathered: order entry ", od_order[b],
                  " outside the ", rows, " rows");
  } else {
    TORCH_CHECK(!has_past || rows == B, "attend_gathered: without an order past needs ", B, " rows, got ", rows);
  }
  auto result = torch::empty({B, 1, H, d}, q.options());
  const float* qd = q.data_ptr<float>();
  const float* nd = new_kv.data_ptr<float>();
  float* cd = out.data_ptr<float>();
  float* rd = result.data_ptr<float>();
  const float sc = static_cast<float>(scale);
  const int64_t q0 = q.stride(0), q1 = q.stride(1);
  const int64_t n0 = new_kv.stride(0), n1 = new_kv.stride(1), n2 = new_kv.stride(2);
  const int64_t span = (T + 1) * d, past_span = T * d;  // floats per (row, head) in out and in past
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, span));
  at::parallel_for(0, B * H, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> scratch(T + 1 + d);
    float* p = scratch.data();
    float* acc = p + T + 1;
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      float* keys = cd + (b * H + h) * span;
      float* values = cd + ((B + b) * H + h) * span;
      if (T > 0) {
        const int64_t src = od_order == nullptr ? b : od_order[b];
        std::memcpy(keys, pd + (src * H + h) * past_span, past_span * sizeof(float));
        std::memcpy(values, pd + ((rows + src) * H + h) * past_span, past_span * sizeof(float));
      }
      const float* nk = nd + b * n1 + h * n2;
      const float* nv = nk + n0;
      for (int64_t i = 0; i < d; ++i) {
        keys[past_span + i] = nk[i];
        values[past_span + i] = nv[i];
      }
      const auto key = [keys, d](int64_t t) { return keys + t * d; };
      const auto value = [values, d](int64_t t) { return values + t * d; };
      attend_any(qd + b * q0 + h * q1, key, value, nullptr, 0, T + 1, d, sc, p, acc, rd + (b * H + h) * d);
    }
  });
  return result;
}

// logsumexp and row_topk: what beam search needs of the next-token distribution, without writing it. The
// search's candidates are the best 2 x beam (hypothesis score + log-probability) of each sentence; within one row
// the log-probability is logit - logsumexp(logits), a constant shift, so the best candidates of a row are its
// largest logits. transduce.search.candidates takes the logsumexp of each row (before the search masks tokens),
// then the top logits of each row (after), instead of a full log-softmax, a sum and a top-k over beam x vocabulary
// values: two passes over the logits where that took five (docs/benchmarks.md); row_candidates does both a row at a
// time, when the search's masks are the same for every row (the usual step).

namespace {

// log(sum(exp(x))) of one row of n values, as max + log(sum(exp(x - max))); all -inf, a +inf or a NaN: the max,
// as torch.logsumexp gives.
float logsumexp_row(const float* x, int64_t n) {
  const float top = max_of(x, n);
  if (top == kNegInf || top == -kNegInf || top != top) return top;
  return top + std::log(sum_exp(x, top, n, nullptr));
}

// The k largest of the V values x[0 .. V), largest first, into best[0 .. k) and their indices into where[0 .. k)
// (vecmath.h's RowTopK over the whole row).
void topk_row(const float* __restrict x, int64_t V, int64_t k, float* __restrict best, int64_t* __restrict where) {
  RowTopK{best, where, k}.scan(x, V, 0);
}

void check_rows(const torch::Tensor& x, const char* name) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.device().is_cpu() && x.stride(1) == 1, name,
              ": x must be a (R, V) float32 CPU tensor with dense rows");
}

}  // namespace

// x: (R, V); returns (R,): log(sum(exp(x))) of each row.
torch::Tensor logsumexp(const torch::Tensor& x) {
  check_rows(x, "logsumexp");
  const int64_t R = x.size(0), V = x.size(1), row = x.stride(0);
  auto out = torch::empty({R}, x.options());
  const float* xd = x.data_ptr<float>();
  float* od = out.data_ptr<float>();
  at::parallel_for(0, R, 8, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) od[r] = logsumexp_row(xd + r * row, V);
  });
  return out;
}

// x: (R, V) with V >= k >= 1; returns (values (R, k) float32, indices (R, k) int64): the k largest values of each
// row, largest first; among equal values the one with the smaller index first.
std::vector<torch::Tensor> row_topk(const torch::Tensor& x, int64_t k) {
  check_rows(x, "row_topk");
  const int64_t R = x.size(0), V = x.size(1), row = x.stride(0);
  TORCH_CHECK(k >= 1 && k <= V, "row_topk: need 1 <= k <= V, got k=", k, ", V=", V);
  auto values = torch::empty({R, k}, x.options());
  auto indices = torch::empty({R, k}, x.options().dtype(at::kLong));
  const float* xd = x.data_ptr<float>();
  float* vd = values.data_ptr<float>();
  int64_t* id = indices.data_ptr<int64_t>();
  at::parallel_for(0, R, 8, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) topk_row(xd + r * row, V, k, vd + r * k, id + r * k);
  });
  return {values, indices};
}

// logsumexp and row_topk in one go, a row at a time: x (R, V) logits, k (1 <= k <= V), excluded (E,) int64 token
// ids. For each row: its logsumexp (of every value), then -inf written (in place) at the excluded ids, then its k
// largest values and their indices. Returns (normalisers (R,), values (R, k), indices (R, k)). The row is read
// from memory once: the three passes over it find it in the cache (32 KB for a vocabulary of 8,000), where
// logsumexp and row_topk called one after the other read the whole (R, V) array twice.
std::vector<torch::Tensor> row_candidates(torch::Tensor x, int64_t k, const torch::Tensor& excluded) {
  check_rows(x, "row_candidates");
  const int64_t R = x.size(0), V = x.size(1), row = x.stride(0);
  TORCH_CHECK(k >= 1 && k <= V, "row_candidates: need 1 <= k <= V, got k=", k, ", V=", V);
  TORCH_CHECK(excluded.dim() == 1 && excluded.scalar_type() == at::kLong && excluded.device().is_cpu(),
              "row_candidates: excluded must be a 1-D int64 CPU tensor");
  auto ids = excluded.contiguous();
  const int64_t E = ids.size(0);
  const int64_t* ed = ids.data_ptr<int64_t>();
  for (int64_t e = 0; e < E; ++e)
    TORCH_CHECK(ed[e] >= 0 && ed[e] < V, "row_candidates: excluded id ", ed[e], " is out of range for V=", V);
  auto normalisers = torch::empty({R}, x.options());
  auto values = torch::empty({R, k}, x.options());
  auto indices = torch::empty({R, k}, x.options().dtype(at::kLong));
  float* xd = x.data_ptr<float>();
  float* nd = normalisers.data_ptr<float>();
  float* vd = values.data_ptr<float>();
  int64_t* id = indices.data_ptr<int64_t>();
  at::parallel_for(0, R, 8, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      // (the whole row as one chunk of vecmath.h's RowCandidates, which the AMX kernels feed 256 logits at a time)
      RowCandidates state{RowTopK{vd + r * k, id + r * k, k}};
      state.feed(xd + r * row, V, 0, ed, ed + E);
      nd[r] = state.normaliser();
    }
  });
  return {normalisers, values, indices};
}

// beam_advance: the rest of a beam step once each row's best logits are known (transduce.search.beam), a sentence
// at a time: each candidate's score (its logit - the row's normaliser + the hypothesis's score, the same float
// operations as search/candidates.py's candidates_from_row_tops), the best `size` of each sentence's width x k
// (largest first; among equal scores the smaller index in width x k first), then the `beam` survivors: the best
// candidates that do not end with EOS, in score order (EOS ones only where fewer are left), with the rows they
// extend and their tokens appended to the history. values (R, k), tokens (R, k) int64, normalisers (R,), scores
// (N, width) with R = N x width, history (R, L) int64. Returns (candidate scores, tokens, beams (N, size); the
// survivors' scores (N, beam), source rows (N x beam,), tokens (N x beam, 1) and history (N x beam, L + 1)) and two
// flags: whether an EOS candidate with a finite score is within some sentence's first `beam` (hypotheses to finish),
// and whether some sentence's best survivor has a score of -inf (nothing left to extend).
std::tuple<std::vector<torch::Tensor>, bool, bool> beam_advance(const torch::Tensor& values,
                                                                const torch::Tensor& tokens,
                                                                const torch::Tensor& normalisers,
                                                                const torch::Tensor& scores,
                                                                const torch::Tensor& history, int64_t size,
                                                                int64_t beam, int64_t eos) {
  TORCH_CHECK(values.dim() == 2 && values.scalar_type() == at::kFloat && values.device().is_cpu() &&
                  values.is_contiguous(),
              "beam_advance: values must be a contiguous (R, k) float32 CPU tensor");
  const int64_t R = values.size(0), k = values.size(1);
  TORCH_CHECK(scores.dim() == 2 && scores.scalar_type() == at::kFloat && scores.is_contiguous() &&
                  scores.numel() == R && scores.size(1) >= 1,
              "beam_advance: scores must be a contiguous (N, width) float32 tensor with N x width = ", R, " rows");
  TORCH_CHECK(tokens.sizes() == values.sizes() && tokens.scalar_type() == at::kLong && tokens.is_contiguous(),
              "beam_advance: tokens must be a contiguous int64 tensor shaped like values");
  TORCH_CHECK(normalisers.dim() == 1 && normalisers.size(0) == R && normalisers.scalar_type() == at::kFloat &&
                  normalisers.is_contiguous(),
              "beam_advance: normalisers must be a contiguous (", R, ",) float32 tensor");
  TORCH_CHECK(history.dim() == 2 && history.size(0) == R && history.scalar_type() == at::kLong &&
                  history.is_contiguous(),
              "beam_advance: history must be a contiguous (", R, ", L) int64 tensor");
  TORCH_CHECK(beam >= 1 && size >= beam, "beam_advance: need 1 <= beam <= size, got beam=", beam, ", size=", size);
  const int64_t N = scores.size(0), width = scores.size(1), M = width * k, L = history.size(1);
  const int64_t kept = std::min(size, M);
  auto opts = values.options();
  auto long_opts = opts.dtype(at::kLong);
  auto cand_scores = torch::empty({N, size}, opts);
  auto cand_tokens = torch::empty({N, size}, long_opts);
  auto cand_beams = torch::empty({N, size}, long_opts);
  auto new_scores = torch::empty({N, beam}, opts);
  auto source_rows = torch::empty({N * beam}, long_opts);
  auto tokens_in = torch::empty({N * beam, 1}, long_opts);
  auto new_history = torch::empty({N * beam, L + 1}, long_opts);
  const float* vd = values.data_ptr<float>();
  const int64_t* td = tokens.data_ptr<int64_t>();
  const float* nd = normalisers.data_ptr<float>();
  const float* sd = scores.data_ptr<float>();
  const int64_t* hd = history.data_ptr<int64_t>();
  float* cs = cand_scores.data_ptr<float>();
  int64_t* ct = cand_tokens.data_ptr<int64_t>();
  int64_t* cb = cand_beams.data_ptr<int64_t>();
  float* ns = new_scores.data_ptr<float>();
  int64_t* sr = source_rows.data_ptr<int64_t>();
  int64_t* ti = tokens_in.data_ptr<int64_t>();
  int64_t* nh = new_history.data_ptr<int64_t>();
  bool finish = false, dead = false;
  std::vector<float> total(M);
  std::vector<int64_t> order(M), pick(beam);
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t b = 0; b < width; ++b) {
      const int64_t r = n * width + b;
      for (int64_t j = 0; j < k; ++j) total[b * k + j] = (vd[r * k + j] - nd[r]) + sd[r];
    }
    for (int64_t i = 0; i < M; ++i) order[i] = i;
    // largest first (NaN above every number, as torch.topk ranks it), the smaller index first among equals
    std::partial_sort(order.begin(), order.begin() + kept, order.end(), [&](int64_t a, int64_t b) {
      const float x = total[a], y = total[b];
      if (x != x || y != y) return (x != x) && (y == y || a < b);
      return x > y || (x == y && a < b);
    });
    float* row_scores = cs + n * size;
    int64_t* row_tokens = ct + n * size;
    int64_t* row_beams = cb + n * size;
    for (int64_t i = 0; i < kept; ++i) {
      const int64_t c = order[i], b = c / k;
      row_scores[i] = total[c];
      row_tokens[i] = td[(n * width + b) * k + c % k];
      row_beams[i] = b;
    }
    for (int64_t i = kept; i < size; ++i) {  // fewer candidates than asked for: invalid ones
      row_scores[i] = kNegInf;
      row_tokens[i] = 0;
      row_beams[i] = 0;
    }
    for (int64_t i = 0; i < beam; ++i)
      finish = finish || (row_tokens[i] == eos && std::isfinite(row_scores[i]));
    // the survivors: the candidates that do not end with EOS in score order, then the EOS ones
    int64_t picked = 0;
    for (int pass = 0; pass < 2 && picked < beam; ++pass)
      for (int64_t i = 0; i < size && picked < beam; ++i)
        if ((row_tokens[i] == eos) == (pass == 1)) pick[picked++] = i;
    for (int64_t p = 0; p < beam; ++p) {
      const int64_t i = pick[p], row = n * beam + p, from = n * width + row_beams[i];
      ns[row] = row_scores[i];
      sr[row] = from;
      ti[row] = row_tokens[i];
      std::memcpy(nh + row * (L + 1), hd + from * L, L * sizeof(int64_t));
      nh[row * (L + 1) + L] = row_tokens[i];
    }
    dead = dead || ns[n * beam] == kNegInf;
  }
  return {{cand_scores, cand_tokens, cand_beams, new_scores, source_rows, tokens_in, new_history}, finish, dead};
}

// layer_norm: torch.layer_norm over the last dimension of a (R, D) float32 CPU tensor with dense rows, for the
// decoding step's norms (a few per layer per step, on a few hundred rows): ATen's kernel spent about 9 us a call
// on (128, 128) in a Multi30k beam search, most of it fixed cost. Mean, then the biased variance from the row
// (in the cache) a second time, as ATen computes them in float32; weight and bias (D,) float32, or None.
torch::Tensor layer_norm(const torch::Tensor& x, const c10::optional<torch::Tensor>& weight,
                         const c10::optional<torch::Tensor>& bias, double eps) {
  check_floats(x, "x", 2, "layer_norm");
  const int64_t R = x.size(0), D = x.size(1), row = x.stride(0);
  const float* wd = nullptr;
  const float* bd = nullptr;
  for (const auto* p : {&weight, &bias}) {
    if (!p->has_value() || !(*p)->defined()) continue;
    const auto& t = **p;
    TORCH_CHECK(t.dim() == 1 && t.size(0) == D && t.scalar_type() == at::kFloat && t.is_contiguous() &&
                    t.device().is_cpu(),
                "layer_norm: weight and bias must be contiguous float32 (", D, ",) CPU tensors, got ", t.sizes());
    (p == &weight ? wd : bd) = t.data_ptr<float>();
  }
  auto out = torch::empty({R, D}, x.options());
  const float* xd = x.data_ptr<float>();
  float* od = out.data_ptr<float>();
  const float e = static_cast<float>(eps), inv_d = 1.0f / static_cast<float>(D);
  at::parallel_for(0, R, 64, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* __restrict xr = xd + r * row;
      float* __restrict o = od + r * D;
      float m = 0.0f;
#pragma omp simd reduction(+ : m)
      for (int64_t k = 0; k < D; ++k) m += xr[k];
      m *= inv_d;
      float var = 0.0f;
#pragma omp simd reduction(+ : var)
      for (int64_t k = 0; k < D; ++k) var += (xr[k] - m) * (xr[k] - m);
      const float rs = 1.0f / std::sqrt(var * inv_d + e);
      if (wd != nullptr && bd != nullptr) {
#pragma omp simd
        for (int64_t k = 0; k < D; ++k) o[k] = (xr[k] - m) * rs * wd[k] + bd[k];
      } else {
#pragma omp simd
        for (int64_t k = 0; k < D; ++k)
          o[k] = (xr[k] - m) * rs * (wd != nullptr ? wd[k] : 1.0f) + (bd != nullptr ? bd[k] : 0.0f);
      }
    }
  });
  return out;
}

// decoder_step: the decoder layers of one decoding step (transduce.model.step.decode_step), float32 on the CPU,
// in one call: the same operations in the same order as the step function's Python loop (ATen's addmm for each
// linear layer, the kernels above for the layer norms and the attention), so the same numbers bit for bit. A step of
// a 4-layer decoder makes about a hundred small operations, and from Python each costs a few microseconds of
// interpreter and binding time whatever its size: about 0.5 ms a step on the Multi30k `tiny` model, a tenth of a
// beam step at batch 32 (docs/benchmarks.md).
namespace {

// weight (K, N) as x @ weight: ``x W^T + b`` (bias: numel 0 for none), then ReLU, or the residual added as the
// step function's linear layers do it (transduce.model.step._linear): addmm into the residual, then the bias.
torch::Tensor step_linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                          const torch::Tensor* residual, bool relu) {
  const bool has_bias = bias.numel() > 0;
  if (residual != nullptr) {
    auto y = at::addmm(*residual, x, weight);
    return has_bias ? y.add_(bias) : y;
  }
  auto y = has_bias ? at::addmm(bias, x, weight) : at::mm(x, weight);
  return relu ? y.relu_() : y;
}

torch::Tensor step_norm(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias, double eps) {
  return layer_norm(x, weight.numel() > 0 ? c10::optional<torch::Tensor>(weight) : c10::nullopt,
                    bias.numel() > 0 ? c10::optional<torch::Tensor>(bias) : c10::nullopt, eps);
}

}  // namespace

// x: (B, D) the embedded new tokens. weights: 18 per layer, in the order norm1 (weight, bias), qkv (weight as
// (D, 3D), bias), self-attention output (weight (D, D), bias), norm2, cross-attention query, cross-attention output,
// norm3, the first feed-forward layer (followed by ReLU), the second; then the final norm's weight and bias (numel 0:
// none, or no final norm at all for both). eps: the layer norms' (3 per layer, then the final one). past: (L, 2, B',
// H, T, d) contiguous, the cache of the T earlier positions (None at T = 0), read in ``order`` (B,) or in row order;
// cross_k, cross_v: per layer (B / group, H, S, d); memory_mask: (B / group, S) bool or None. Returns the decoder's
// output states (B, D) and the new cache (L, 2, B, H, T + 1, d).
std::vector<torch::Tensor> decoder_step(torch::Tensor x, const std::vector<torch::Tensor>& weights,
                                        const std::vector<double>& eps, const c10::optional<torch::Tensor>& past,
                                        const c10::optional<torch::Tensor>& order,
                                        const std::vector<torch::Tensor>& cross_k,
                                        const std::vector<torch::Tensor>& cross_v,
                                        const c10::optional<torch::Tensor>& memory_mask, int64_t heads, int64_t group,
                                        bool pre_norm, double scale) {
  check_floats(x, "x", 2, "decoder_step");
  const int64_t L = static_cast<int64_t>(cross_k.size()), B = x.size(0), D = x.size(1);
  TORCH_CHECK(L >= 1 && static_cast<int64_t>(cross_v.size()) == L &&
                  static_cast<int64_t>(weights.size()) == 18 * L + 2 && static_cast<int64_t>(eps.size()) == 3 * L + 1,
              "decoder_step: need 18 weights and 3 eps per layer plus the final norm's, and cross keys and values "
              "for each of the ", L, " layers");
  TORCH_CHECK(heads >= 1 && D % heads == 0 && group >= 1 && B % group == 0,
              "decoder_step: ", B, " rows of ", D, " do not split into ", heads, " heads and groups of ", group);
  const int64_t d = D / heads;
  const bool has_past = past.has_value() && past->defined();
  const int64_t T = has_past ? past->size(4) : 0;
  if (has_past)
    TORCH_CHECK(past->dim() == 6 && past->size(0) == L && past->is_contiguous(),
                "decoder_step: past must be a contiguous (", L, ", 2, rows, heads, T, d) tensor, got ", past->sizes());
  auto self_kv = torch::empty({L, 2, B, heads, T + 1, d}, x.options());
  const c10::optional<torch::Tensor> none;
  for (int64_t i = 0; i < L; ++i) {
    const torch::Tensor* w = weights.data() + 18 * i;
    const double* e = eps.data() + 3 * i;
    // masked self-attention: the new position's keys and values into the cache, its query over all T + 1
    auto qkv = step_linear(pre_norm ? step_norm(x, w[0], w[1], e[0]) : x, w[2], w[3], nullptr, false)
                   .view({B, 3, heads, d});
    auto new_kv = qkv.narrow(1, 1, 2).transpose(0, 1);  // (2, B, H, d)
    auto q = qkv.select(1, 0).unsqueeze(2);             // (B, H, 1, d)
    auto a = attend_gathered(q, has_past ? c10::optional<torch::Tensor>(past->select(0, i)) : none, order, new_kv,
                             self_kv.select(0, i), scale);
    x = step_linear(a.view({B, D}), w[4], w[5], &x, false);
    if (!pre_norm) x = step_norm(x, w[0], w[1], e[0]);
    // attention over the encoder output: the queries of a sentence's `group` rows together
    q = step_linear(pre_norm ? step_norm(x, w[6], w[7], e[1]) : x, w[8], w[9], nullptr, false)
            .view({B / group, group, heads, d})
            .transpose(1, 2);
    a = attend(q, cross_k[i], cross_v[i], memory_mask, scale);  // (B / group, group, H, d)
    x = step_linear(a.view({B, D}), w[10], w[11], &x, false);
    if (!pre_norm) x = step_norm(x, w[6], w[7], e[1]);
    // feed-forward
    auto h = step_linear(pre_norm ? step_norm(x, w[12], w[13], e[2]) : x, w[14], w[15], nullptr, true);
    x = step_linear(h, w[16], w[17], &x, false);
    if (!pre_norm) x = step_norm(x, w[12], w[13], e[2]);
  }
  const auto& fw = weights[18 * L];
  const auto& fb = weights[18 * L + 1];
  if (fw.numel() > 0 || fb.numel() > 0) x = step_norm(x, fw, fb, eps[3 * L]);
  return {x, self_kv};
}

void register_training(pybind11::module_& m);  // training.cpp
void register_int8(pybind11::module_& m);      // int8.cpp
void register_allocator(pybind11::module_& m);  // allocator.cpp
void register_amx(pybind11::module_& m);        // amx.cpp

// The kernels touch no Python object: they let other threads (a server's) run Python meanwhile.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using release = pybind11::call_guard<pybind11::gil_scoped_release>;
  register_training(m);
  register_int8(m);
  register_allocator(m);
  register_amx(m);
  m.def("attend", &attend, "attention of a decoding step", pybind11::arg("q"), pybind11::arg("k"),
        pybind11::arg("v"), pybind11::arg("mask"), pybind11::arg("scale"), release());
  m.def("attend_by_table", &attend_by_table, "self-attention of a decoding step over a cache stored by position",
        pybind11::arg("q"), pybind11::arg("k"), pybind11::arg("v"), pybind11::arg("table"), pybind11::arg("scale"),
        release());
  m.def("layer_norm", &layer_norm, "layer normalisation over the last dimension of (R, D) rows", pybind11::arg("x"),
        pybind11::arg("weight"), pybind11::arg("bias"), pybind11::arg("eps"), release());
  m.def("attend_gathered", &attend_gathered,
        "self-attention of a step over a cache in row order, writing the next step's cache",
        pybind11::arg("q"), pybind11::arg("past"), pybind11::arg("order"), pybind11::arg("new_kv"),
        pybind11::arg("out"), pybind11::arg("scale"), release());
  m.def("decoder_step", &decoder_step, "the decoder layers of one decoding step, float32", pybind11::arg("x"),
        pybind11::arg("weights"), pybind11::arg("eps"), pybind11::arg("past"), pybind11::arg("order"),
        pybind11::arg("cross_k"), pybind11::arg("cross_v"), pybind11::arg("memory_mask"), pybind11::arg("heads"),
        pybind11::arg("group"), pybind11::arg("pre_norm"), pybind11::arg("scale"), release());
  m.def("beam_advance", &beam_advance, "a beam step's candidates and survivors from each row's best logits",
        pybind11::arg("values"), pybind11::arg("tokens"), pybind11::arg("normalisers"), pybind11::arg("scores"),
        pybind11::arg("history"), pybind11::arg("size"), pybind11::arg("beam"), pybind11::arg("eos"), release());
  m.def("logsumexp", &logsumexp, "log(sum(exp(x))) of each row", pybind11::arg("x"), release());
  m.def("row_topk", &row_topk, "the k largest values of each row and their indices", pybind11::arg("x"),
        pybind11::arg("k"), release());
  m.def("row_candidates", &row_candidates, "logsumexp of each row, then its top k with some ids excluded",
        pybind11::arg("x"), pybind11::arg("k"), pybind11::arg("excluded"), release());
}
