// CPU kernels for training steps, float32 and bfloat16: transduce.model.kernels builds this file together with
// decoding.cpp (one extension module; decoding.cpp's module definition calls register_training).
//
// dropout_apply: inverted dropout in one pass, its mask drawn from a counter-based hash of the element index and a
// 64-bit seed (taken from PyTorch's generator by the caller). Nothing is kept for the backward pass: it applies the
// same seed to the incoming gradient. transduce.model.fused.dropout_draws computes the same mask with PyTorch's
// operations (the fallback, and the tests' reference).
//
// smoothed_nll_forward / smoothed_nll_backward: label-smoothed cross-entropy of (N, V) logits (transduce.loss),
// one pass over each row forward (its max, sum of exponentials and sum) and one backward (softmax minus the
// smoothed target, written in the logits' dtype), where PyTorch's operations made about eight passes over a
// float32 copy of the logits.
//
// add_layer_norm_forward / add_layer_norm_backward: a post-norm residual LayerNorm(x + dropout(y)) in one pass over
// the rows each way (transduce.model.fused.add_norm), with dropout_apply's mask.

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "vecmath.h"

namespace {

// ---------------------------------------------------------------------------------------------------------------
// bfloat16 <-> float32 on the bit patterns (loops of these vectorise)

inline float bf16_to_float(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Round to nearest even, as PyTorch's conversion; NaN stays NaN (0x7FC0, PyTorch's quiet NaN).
inline uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  return f != f ? static_cast<uint16_t>(0x7FC0) : static_cast<uint16_t>(rounded);
}

// The same on a value or a row of either type (float32 values pass through).
inline float to_float(float v) { return v; }
inline float to_float(uint16_t v) { return bf16_to_float(v); }
inline void from_float(float v, float* p) { *p = v; }
inline void from_float(float v, uint16_t* p) { *p = float_to_bf16(v); }

template <class T>
void load_row(const T* src, int64_t n, float* dst) {
  for (int64_t k = 0; k < n; ++k) dst[k] = to_float(src[k]);
}

// ---------------------------------------------------------------------------------------------------------------
// dropout

// A bijective 32-bit mix with strong avalanche (Chris Wellons' "lowbias32").
inline uint32_t mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352dU;
  x ^= x >> 15;
  x *= 0x846ca68bU;
  x ^= x >> 16;
  return x;
}

// The 32 random bits of word j under the key (k0, k1), j = hi * 2^32 + lo: two keyed rounds of mix32,
// mix32(mix32(lo ^ k0) ^ (hi + k1)).
inline uint32_t draw_word(uint32_t lo, uint32_t hi, uint32_t k0, uint32_t k1) {
  return mix32(mix32(lo ^ k0) ^ (hi + k1));
}

// Element i = 16 b + l of a tensor draws 16 bits: the low half of word 8 b + l for l < 8, the high half of word
// 8 b + l - 8 for l >= 8 (blocks of 16 elements: one vector of 8 words serves two vectors of elements). It is kept
// when those bits are below `levels`: exactly `levels` of the 65,536 values keep it. block_draws writes the 16
// draws of block b (block_keep8 below: the same as two vectors of masks).
inline void block_draws(int64_t b, uint32_t k0, uint32_t k1, uint32_t bits[16]) {
  const uint64_t j = static_cast<uint64_t>(8 * b);  // words j..j+7 share their high 32 bits
  const uint32_t lo = static_cast<uint32_t>(j), hi = static_cast<uint32_t>(j >> 32);
  for (uint32_t l = 0; l < 8; ++l) {
    const uint32_t w = draw_word(lo + l, hi, k0, k1);
    bits[l] = w & 0xFFFFu;
    bits[l + 8] = w >> 16;
  }
}

#ifdef TRANSDUCE_AVX2
inline __m256i mix32x8(__m256i x) {
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
  x = _mm256_mullo_epi32(x, _mm256_set1_epi32(0x7feb352d));
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 15));
  x = _mm256_mullo_epi32(x, _mm256_set1_epi32(static_cast<int>(0x846ca68bU)));
  return _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
}

// 8 floats from 8 bfloat16 values, and back (round to nearest even; NaN to 0x7FC0).
inline __m256 load_bf16x8(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

#if defined(__AVX512BF16__) && defined(__AVX512VL__)
// The CPU's own conversion (AVX512-BF16): round to nearest even, NaN stays a NaN; unlike PyTorch's conversion it
// flushes subnormal values (below about 1.2e-38) to zero.
inline void store_bf16x8(uint16_t* p, __m256 v) {
  const __m128bh h = _mm256_cvtneps_pbh(v);
  std::memcpy(p, &h, sizeof h);
}
#else
inline void store_bf16x8(uint16_t* p, __m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7FFF))), 16);
  r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7FC0), _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
}
#endif

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p) { return load_bf16x8(p); }
inline void store8(float* p, __m256 v) { _mm256_storeu_ps(p, v); }
inline void store8(uint16_t* p, __m256 v) { store_bf16x8(p, v); }

// The keep masks of the 16 elements of block b (words 8 b .. 8 b + 7): all-ones lanes where kept, for the elements
// 16 b .. 16 b + 7 (the words' low halves) and 16 b + 8 .. 16 b + 15 (their high halves).
inline void block_keep8(int64_t b, uint32_t k0, uint32_t k1, uint32_t levels, __m256* low, __m256* high) {
  const uint64_t j = static_cast<uint64_t>(8 * b);  // words j..j+7 share their high 32 bits
  const __m256i lanes = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(j))),
                                         _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  const __m256i key0 = _mm256_set1_epi32(static_cast<int>(k0));
  const __m256i key1 = _mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(j >> 32) + k1));
  const __m256i w = mix32x8(_mm256_xor_si256(mix32x8(_mm256_xor_si256(lanes, key0)), key1));
  const __m256i lv = _mm256_set1_epi32(static_cast<int>(levels));  // all values below 2^17: signed compares
  *low = _mm256_castsi256_ps(_mm256_cmpgt_epi32(lv, _mm256_and_si256(w, _mm256_set1_epi32(0xFFFF))));
  *high = _mm256_castsi256_ps(_mm256_cmpgt_epi32(lv, _mm256_srli_epi32(w, 16)));
}
#endif

// out = x * scale where block_draws keeps an element, 0 elsewhere.
template <class T>
void dropout_blocks(const T* __restrict x, T* __restrict out, int64_t n, uint64_t seed, uint32_t levels,
                    float scale) {
  const uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  const int64_t blocks = (n + 15) / 16;
  at::parallel_for(0, blocks, 2048, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const int64_t base = 16 * b;
#ifdef TRANSDUCE_AVX2
      if (base + 16 <= n) {
        __m256 keep_lo, keep_hi;
        block_keep8(b, k0, k1, levels, &keep_lo, &keep_hi);
        const __m256 sc = _mm256_set1_ps(scale);
        store8(out + base, _mm256_and_ps(keep_lo, _mm256_mul_ps(load8(x + base), sc)));
        store8(out + base + 8, _mm256_and_ps(keep_hi, _mm256_mul_ps(load8(x + base + 8), sc)));
        continue;
      }
#endif
      uint32_t bits[16];
      block_draws(b, k0, k1, bits);
      for (int64_t i = base; i < std::min(base + 16, n); ++i)
        from_float(bits[i - base] < levels ? to_float(x[i]) * scale : 0.0f, out + i);
    }
  });
}

// x: a contiguous float32 or bfloat16 CPU tensor; returns x * scale where kept, 0 elsewhere (same dtype and
// shape). 0 <= levels <= 65536.
torch::Tensor dropout_apply(const torch::Tensor& x, int64_t seed, int64_t levels, double scale) {
  TORCH_CHECK(x.device().is_cpu() && x.is_contiguous(), "dropout_apply: x must be a contiguous CPU tensor");
  TORCH_CHECK(levels >= 0 && levels <= 65536, "dropout_apply: levels must be in [0, 65536], got ", levels);
  auto out = torch::empty_like(x);
  const int64_t n = x.numel();
  const uint64_t s = static_cast<uint64_t>(seed);
  const uint32_t lv = static_cast<uint32_t>(levels);
  const float sc = static_cast<float>(scale);
  if (x.scalar_type() == at::kFloat) {
    dropout_blocks(x.data_ptr<float>(), out.data_ptr<float>(), n, s, lv, sc);
  } else if (x.scalar_type() == at::kBFloat16) {
    dropout_blocks(reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>()),
                   reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>()), n, s, lv, sc);
  } else {
    TORCH_CHECK(false, "dropout_apply: float32 or bfloat16 only, got ", x.scalar_type());
  }
  return out;
}

// Row r's dropout multipliers (scale where kept, 0 where dropped) for the D elements r * D .. r * D + D - 1 of a
// (R, D) tensor, with dropout_blocks' draws (the mask a dropout of the whole tensor would draw).
void row_multipliers(int64_t r, int64_t D, uint64_t seed, uint32_t levels, float scale, float* mult) {
  const uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  int64_t i = r * D;
  const int64_t end = i + D;
  while (i < end) {
    const int64_t b = i / 16, base = 16 * b;
#ifdef TRANSDUCE_AVX2
    if (i == base && base + 16 <= end) {  // a whole block: 8 words at once
      __m256 keep_lo, keep_hi;
      block_keep8(b, k0, k1, levels, &keep_lo, &keep_hi);
      const __m256 sc = _mm256_set1_ps(scale);
      float* out = mult + (i - r * D);
      _mm256_storeu_ps(out, _mm256_and_ps(keep_lo, sc));
      _mm256_storeu_ps(out + 8, _mm256_and_ps(keep_hi, sc));
      i = base + 16;
      continue;
    }
#endif
    uint32_t bits[16];
    block_draws(b, k0, k1, bits);
    for (int64_t e = std::max(i, base); e < std::min(base + 16, end); ++e)
      mult[e - r * D] = bits[e - base] < levels ? scale : 0.0f;
    i = base + 16;
  }
}

// ---------------------------------------------------------------------------------------------------------------
// label-smoothed cross-entropy

// One row of V logits (float32 or bfloat16 bits): its max and its sum (NaN when a value is NaN), then the sum of
// exp(x - shift), then the gradient row g * exp(x - lse) - gc, each in one pass that reads the row in its own dtype.

template <class T>
void max_and_sum(const T* x, int64_t n, float* top, float* sum) {
  int64_t j = 0;
  float m = kNegInf, s = 0.0f;
  bool nan = false;
#ifdef TRANSDUCE_AVX2
  __m256 mv = _mm256_set1_ps(kNegInf), sv = _mm256_setzero_ps();
  for (; j + 8 <= n; j += 8) {
    const __m256 v = load8(x + j);
    mv = _mm256_max_ps(mv, v);
    sv = _mm256_add_ps(sv, v);
  }
  m = horizontal_max(mv);
  s = horizontal_sum(sv);
#endif
  for (; j < n; ++j) {
    const float v = to_float(x[j]);
    m = v > m ? v : m;
    s += v;
  }
  nan = s != s;  // a NaN anywhere (or +inf and -inf together) makes the sum NaN
  *top = nan ? std::numeric_limits<float>::quiet_NaN() : m;
  *sum = s;
}

template <class T>
float sum_exp_of(const T* x, int64_t n, float shift) {
  int64_t j = 0;
  float s = 0.0f;
#ifdef TRANSDUCE_AVX2
  __m256 acc = _mm256_setzero_ps();
  const __m256 sh = _mm256_set1_ps(shift);
  for (; j + 8 <= n; j += 8) acc = _mm256_add_ps(acc, exp_nonpositive8(_mm256_sub_ps(load8(x + j), sh)));
  s = horizontal_sum(acc);
#endif
  for (; j < n; ++j) s += exp_nonpositive(to_float(x[j]) - shift);
  return s;
}

template <class T>
void softmax_grad_row(const T* x, T* out, int64_t n, float lse, float g, float gc) {
  int64_t j = 0;
#ifdef TRANSDUCE_AVX2
  const __m256 sh = _mm256_set1_ps(lse), gv = _mm256_set1_ps(g), gcv = _mm256_set1_ps(gc);
  for (; j + 8 <= n; j += 8)
    store8(out + j, _mm256_fmsub_ps(gv, exp_nonpositive8(_mm256_sub_ps(load8(x + j), sh)), gcv));
#endif
  for (; j < n; ++j) from_float(g * exp_nonpositive(to_float(x[j]) - lse) - gc, out + j);
}

void check_loss_inputs(const torch::Tensor& x, const torch::Tensor& target, int64_t pad, const char* name) {
  TORCH_CHECK(x.dim() == 2 && x.device().is_cpu() && x.stride(1) == 1 &&
                  (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16),
              name, ": logits must be a (N, V) float32 or bfloat16 CPU tensor with dense rows");
  TORCH_CHECK(x.size(1) > 2, name, ": the vocabulary must have more than 2 entries, got ", x.size(1));
  TORCH_CHECK(target.dim() == 1 && target.size(0) == x.size(0) && target.scalar_type() == at::kLong &&
                  target.is_contiguous() && target.device().is_cpu(),
              name, ": target must be a contiguous (N,) int64 CPU tensor");
  TORCH_CHECK(pad >= 0 && pad < x.size(1), name, ": pad id ", pad, " is outside the vocabulary");
  const int64_t* t = target.data_ptr<int64_t>();
  for (int64_t r = 0; r < target.size(0); ++r)
    TORCH_CHECK(t[r] >= 0 && t[r] < x.size(1), name, ": target ", t[r], " at position ", r,
                " is outside the vocabulary of ", x.size(1));
}

}  // namespace

// x: (N, V) logits, target: (N,) ids. Returns (loss, nll, lse), each (N,) float32: the label-smoothed loss and
// the NLL of each position (0 where the target is pad), and each row's log-sum-exp for the backward pass. A row
// with a NaN or +inf logit gets NaN (PyTorch's log_softmax gives NaN there too); -inf logits are zero
// probabilities.
std::vector<torch::Tensor> smoothed_nll_forward(const torch::Tensor& x, const torch::Tensor& target, double eps,
                                                int64_t pad) {
  check_loss_inputs(x, target, pad, "smoothed_nll_forward");
  const int64_t N = x.size(0), V = x.size(1);
  auto opts = x.options().dtype(at::kFloat);
  auto loss = torch::empty({N}, opts), nll = torch::empty({N}, opts), lse = torch::empty({N}, opts);
  float *ld = loss.data_ptr<float>(), *nd = nll.data_ptr<float>(), *sd = lse.data_ptr<float>();
  const int64_t* td = target.data_ptr<int64_t>();
  const double c = eps / static_cast<double>(V - 2);
  auto rows = [&](auto* xd) {
    at::parallel_for(0, N, 4, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const int64_t t = td[r];
        if (t == pad) {
          ld[r] = nd[r] = sd[r] = 0.0f;
          continue;
        }
        const auto* xr = xd + r * x.stride(0);
        float top, sum;
        max_and_sum(xr, V, &top, &sum);
        if (top != top || top == -kNegInf || top == kNegInf) {  // NaN, +inf, or every logit -inf
          ld[r] = nd[r] = sd[r] = std::numeric_limits<float>::quiet_NaN();
          continue;
        }
        const double s = static_cast<double>(top) + std::log(static_cast<double>(sum_exp_of(xr, V, top)));
        const double xt = to_float(xr[t]), xp = to_float(xr[pad]);
        const double n = s - xt;
        double l = n;
        if (eps > 0) {  // -log p summed over the V - 2 tokens that are neither the target nor pad
          const double others = static_cast<double>(V - 2) * s - (static_cast<double>(sum) - xt - xp);
          l = (1.0 - eps) * n + c * others;
        }
        sd[r] = static_cast<float>(s);
        nd[r] = static_cast<float>(n);
        ld[r] = static_cast<float>(l);
      }
    });
  };
  if (x.scalar_type() == at::kFloat)
    rows(x.data_ptr<float>());
  else
    rows(reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>()));
  return {loss, nll, lse};
}

// The gradient of sum(grad_loss * loss) with respect to x: grad_loss[r] * (softmax(x[r]) - q[r]), q being the
// smoothed target (1 - eps on the target, eps / (V - 2) on every other token but pad, 0 on pad); zero rows where
// the target is pad; NaN rows where the forward pass gave NaN. Returned in x's dtype.
torch::Tensor smoothed_nll_backward(const torch::Tensor& x, const torch::Tensor& lse, const torch::Tensor& target,
                                    const torch::Tensor& grad_loss, double eps, int64_t pad) {
  check_loss_inputs(x, target, pad, "smoothed_nll_backward");
  const int64_t N = x.size(0), V = x.size(1);
  TORCH_CHECK(lse.is_contiguous() && lse.scalar_type() == at::kFloat && lse.numel() == N &&
                  grad_loss.is_contiguous() && grad_loss.scalar_type() == at::kFloat && grad_loss.numel() == N,
              "smoothed_nll_backward: lse and grad_loss must be contiguous (N,) float32 tensors");
  auto grad = torch::empty({N, V}, x.options());
  const float* sd = lse.data_ptr<float>();
  const float* gd = grad_loss.data_ptr<float>();
  const int64_t* td = target.data_ptr<int64_t>();
  const float c = static_cast<float>(eps / static_cast<double>(V - 2));
  auto rows = [&](const auto* xd, auto* od) {
    at::parallel_for(0, N, 4, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const auto* xr = xd + r * x.stride(0);
        auto* o = od + r * V;
        const int64_t t = td[r];
        const float g = gd[r], s = sd[r];
        if (t == pad || s != s) {
          const float fill = t == pad ? 0.0f : std::numeric_limits<float>::quiet_NaN();
          for (int64_t v = 0; v < V; ++v) from_float(fill, o + v);
          continue;
        }
        softmax_grad_row(xr, o, V, s, g, g * c);  // g * (softmax - eps / (V - 2)) everywhere, then:
        from_float(g * exp_nonpositive(to_float(xr[pad]) - s), o + pad);  // pad gets no smoothing mass
        from_float(g * (exp_nonpositive(to_float(xr[t]) - s) - static_cast<float>(1.0 - eps)), o + t);
      }
    });
  };
  if (x.scalar_type() == at::kFloat)
    rows(x.data_ptr<float>(), grad.data_ptr<float>());
  else
    rows(reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>()),
         reinterpret_cast<uint16_t*>(grad.data_ptr<at::BFloat16>()));
  return grad;
}

// Post-norm residual: out = LayerNorm(x + dropout(y)) * weight + bias over the last dimension, the dropout mask
// that of dropout_apply on y with the same seed (levels 65536: no dropout). x: (R, D) float32; y: (R, D) float32
// or bfloat16; both contiguous. Returns (out (R, D) float32, mean (R,), rstd (R,)).
std::vector<torch::Tensor> add_layer_norm_forward(const torch::Tensor& x, const torch::Tensor& y, int64_t seed,
                                                  int64_t levels, double scale, const torch::Tensor& weight,
                                                  const torch::Tensor& bias, double eps) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous() && x.device().is_cpu(),
              "add_layer_norm: x must be a contiguous (R, D) float32 CPU tensor");
  TORCH_CHECK(y.sizes() == x.sizes() && y.is_contiguous() &&
                  (y.scalar_type() == at::kFloat || y.scalar_type() == at::kBFloat16),
              "add_layer_norm: y must be a contiguous float32 or bfloat16 tensor shaped like x");
  const int64_t R = x.size(0), D = x.size(1);
  TORCH_CHECK(weight.numel() == D && bias.numel() == D && weight.scalar_type() == at::kFloat &&
                  bias.scalar_type() == at::kFloat && weight.is_contiguous() && bias.is_contiguous(),
              "add_layer_norm: weight and bias must be contiguous float32 (D,)");
  auto out = torch::empty_like(x);
  auto mean = torch::empty({R}, x.options()), rstd = torch::empty({R}, x.options());
  const float *xd = x.data_ptr<float>(), *wd = weight.data_ptr<float>(), *bd = bias.data_ptr<float>();
  float *od = out.data_ptr<float>(), *md = mean.data_ptr<float>(), *rd = rstd.data_ptr<float>();
  const uint64_t sd = static_cast<uint64_t>(seed);
  const uint32_t lv = static_cast<uint32_t>(levels);
  const float sc = static_cast<float>(scale);
  auto rows = [&](const auto* yd) {
    at::parallel_for(0, R, 16, [&](int64_t begin, int64_t end) {
      std::vector<float> mult(D), sum(D);
      for (int64_t r = begin; r < end; ++r) {
        row_multipliers(r, D, sd, lv, sc, mult.data());
        load_row(yd + r * D, D, sum.data());
        const float* xr = xd + r * D;
        float m = 0.0f;
#pragma omp simd reduction(+ : m)
        for (int64_t k = 0; k < D; ++k) {
          sum[k] = xr[k] + (mult[k] != 0.0f ? sum[k] * mult[k] : 0.0f);  // a dropped inf or NaN is dropped
          m += sum[k];
        }
        m /= static_cast<float>(D);
        float var = 0.0f;
#pragma omp simd reduction(+ : var)
        for (int64_t k = 0; k < D; ++k) var += (sum[k] - m) * (sum[k] - m);
        const float rs = 1.0f / std::sqrt(var / static_cast<float>(D) + static_cast<float>(eps));
        float* o = od + r * D;
        for (int64_t k = 0; k < D; ++k) o[k] = (sum[k] - m) * rs * wd[k] + bd[k];
        md[r] = m;
        rd[r] = rs;
      }
    });
  };
  if (y.scalar_type() == at::kFloat)
    rows(y.data_ptr<float>());
  else
    rows(reinterpret_cast<const uint16_t*>(y.data_ptr<at::BFloat16>()));
  return {out, mean, rstd};
}

// Its gradients: (grad_x float32, grad_y in y's dtype, grad_weight, grad_bias), from grad (R, D) float32.
std::vector<torch::Tensor> add_layer_norm_backward(const torch::Tensor& grad, const torch::Tensor& x,
                                                   const torch::Tensor& y, const torch::Tensor& mean,
                                                   const torch::Tensor& rstd, int64_t seed, int64_t levels,
                                                   double scale, const torch::Tensor& weight) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous() && y.sizes() == x.sizes() &&
                  y.is_contiguous() && (y.scalar_type() == at::kFloat || y.scalar_type() == at::kBFloat16),
              "add_layer_norm_backward: x and y as add_layer_norm_forward took them");
  TORCH_CHECK(grad.sizes() == x.sizes() && grad.scalar_type() == at::kFloat && grad.is_contiguous(),
              "add_layer_norm_backward: grad must be a contiguous float32 tensor shaped like x");
  TORCH_CHECK(mean.numel() == x.size(0) && rstd.numel() == x.size(0) && weight.numel() == x.size(1) &&
                  mean.scalar_type() == at::kFloat && rstd.scalar_type() == at::kFloat &&
                  weight.scalar_type() == at::kFloat && mean.is_contiguous() && rstd.is_contiguous() &&
                  weight.is_contiguous(),
              "add_layer_norm_backward: mean, rstd (R,) and weight (D,) must be contiguous float32");
  const int64_t R = x.size(0), D = x.size(1);
  auto gx = torch::empty_like(x), gy = torch::empty_like(y);
  const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), (R + 63) / 64));
  auto partial = torch::zeros({chunks, 2, D}, x.options());  // per chunk: sum of g * xhat, sum of g
  const float *gd = grad.data_ptr<float>(), *xd = x.data_ptr<float>(), *wd = weight.data_ptr<float>();
  const float *md = mean.data_ptr<float>(), *rd = rstd.data_ptr<float>();
  float *gxd = gx.data_ptr<float>(), *pd = partial.data_ptr<float>();
  const uint64_t sd = static_cast<uint64_t>(seed);
  const uint32_t lv = static_cast<uint32_t>(levels);
  const float sc = static_cast<float>(scale);
  auto rows = [&](const auto* yd, auto* gyd) {
    at::parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
      std::vector<float> mult(D), xhat(D), gxh(D);
      for (int64_t c = c0; c < c1; ++c) {
        float* gw = pd + c * 2 * D;
        float* gb = gw + D;
        for (int64_t r = c * R / chunks; r < (c + 1) * R / chunks; ++r) {
          row_multipliers(r, D, sd, lv, sc, mult.data());
          load_row(yd + r * D, D, xhat.data());
          const float *xr = xd + r * D, *g = gd + r * D;
          const float m = md[r], rs = rd[r];
          float a = 0.0f, b = 0.0f;  // mean of gxh, mean of gxh * xhat
          for (int64_t k = 0; k < D; ++k) {
            xhat[k] = (xr[k] + (mult[k] != 0.0f ? xhat[k] * mult[k] : 0.0f) - m) * rs;
            gxh[k] = g[k] * wd[k];
          }
          for (int64_t k = 0; k < D; ++k) {
            gw[k] += g[k] * xhat[k];
            gb[k] += g[k];
          }
#pragma omp simd reduction(+ : a, b)
          for (int64_t k = 0; k < D; ++k) {
            a += gxh[k];
            b += gxh[k] * xhat[k];
          }
          a /= static_cast<float>(D);
          b /= static_cast<float>(D);
          float* gxr = gxd + r * D;
          auto* gyr = gyd + r * D;
          for (int64_t k = 0; k < D; ++k) {
            const float gs = rs * (gxh[k] - a - xhat[k] * b);
            gxr[k] = gs;
            from_float(gs * mult[k], gyr + k);
          }
        }
      }
    });
  };
  if (y.scalar_type() == at::kFloat)
    rows(y.data_ptr<float>(), gy.data_ptr<float>());
  else
    rows(reinterpret_cast<const uint16_t*>(y.data_ptr<at::BFloat16>()),
         reinterpret_cast<uint16_t*>(gy.data_ptr<at::BFloat16>()));
  auto sums = partial.sum(0);
  return {gx, gy, sums[0], sums[1]};
}

// ---------------------------------------------------------------------------------------------------------------
// float32 <-> bfloat16 for the bf16 products of decoding (transduce.model.bf16). In a bf16 beam search on a Xeon
// with AMX (the Multi30k model, batch 32, one thread) PyTorch's conversions took 18% of the profiled time; with
// these (and the residual added in the same pass) the search ran 1.54x faster.

// x (float32, contiguous) as bfloat16, rounded to nearest even.
torch::Tensor to_bf16(const torch::Tensor& x) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.is_contiguous(), "to_bf16: a contiguous float32 tensor");
  auto out = torch::empty(x.sizes(), x.options().dtype(at::kBFloat16));
  const float* src = x.data_ptr<float>();
  uint16_t* dst = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  const int64_t n = x.numel();
  at::parallel_for(0, n, 1 << 16, [&](int64_t begin, int64_t end) {
    int64_t i = begin;
#ifdef TRANSDUCE_AVX2
    for (; i + 8 <= end; i += 8) store8(dst + i, load8(src + i));
#endif
    for (; i < end; ++i) dst[i] = float_to_bf16(src[i]);
  });
  return out;
}

// y (bfloat16, contiguous) as float32, plus residual (float32, y's shape) when one is given.
torch::Tensor bf16_to_float32(const torch::Tensor& y, const std::optional<torch::Tensor>& residual) {
  TORCH_CHECK(y.scalar_type() == at::kBFloat16 && y.is_contiguous(), "bf16_to_float32: a contiguous bf16 tensor");
  const bool add = residual.has_value();
  if (add)
    TORCH_CHECK(residual->scalar_type() == at::kFloat && residual->is_contiguous() && residual->numel() == y.numel(),
                "bf16_to_float32: the residual must be contiguous float32 of y's size");
  auto out = torch::empty(y.sizes(), y.options().dtype(at::kFloat));
  const uint16_t* src = reinterpret_cast<const uint16_t*>(y.data_ptr<at::BFloat16>());
  const float* res = add ? residual->data_ptr<float>() : nullptr;
  float* dst = out.data_ptr<float>();
  const int64_t n = y.numel();
  at::parallel_for(0, n, 1 << 16, [&](int64_t begin, int64_t end) {
    int64_t i = begin;
#ifdef TRANSDUCE_AVX2
    if (add)
      for (; i + 8 <= end; i += 8) store8(dst + i, _mm256_add_ps(load8(src + i), load8(res + i)));
    else
      for (; i + 8 <= end; i += 8) store8(dst + i, load8(src + i));
#endif
    for (; i < end; ++i) dst[i] = bf16_to_float(src[i]) + (add ? res[i] : 0.0f);
  });
  return out;
}

void register_training(pybind11::module_& m) {
  using release = pybind11::call_guard<pybind11::gil_scoped_release>;
  m.def("to_bf16", &to_bf16, "a float32 tensor rounded to bfloat16", pybind11::arg("x"), release());
  m.def("bf16_to_float32", &bf16_to_float32, "a bfloat16 tensor as float32, plus an optional float32 residual",
        pybind11::arg("y"), pybind11::arg("residual") = pybind11::none(), release());
  m.def("dropout_apply", &dropout_apply, "x * scale where the seeded mask keeps, 0 elsewhere", pybind11::arg("x"),
        pybind11::arg("seed"), pybind11::arg("levels"), pybind11::arg("scale"), release());
  m.def("smoothed_nll_forward", &smoothed_nll_forward, "label-smoothed cross-entropy of each row",
        pybind11::arg("x"), pybind11::arg("target"), pybind11::arg("eps"), pybind11::arg("pad"), release());
  m.def("smoothed_nll_backward", &smoothed_nll_backward, "its gradient with respect to the logits",
        pybind11::arg("x"), pybind11::arg("lse"), pybind11::arg("target"), pybind11::arg("grad_loss"),
        pybind11::arg("eps"), pybind11::arg("pad"), release());
  m.def("add_layer_norm_forward", &add_layer_norm_forward, "LayerNorm(x + dropout(y)) * weight + bias",
        pybind11::arg("x"), pybind11::arg("y"), pybind11::arg("seed"), pybind11::arg("levels"),
        pybind11::arg("scale"), pybind11::arg("weight"), pybind11::arg("bias"), pybind11::arg("eps"), release());
  m.def("add_layer_norm_backward", &add_layer_norm_backward, "its gradients", pybind11::arg("grad"),
        pybind11::arg("x"), pybind11::arg("y"), pybind11::arg("mean"), pybind11::arg("rstd"), pybind11::arg("seed"),
        pybind11::arg("levels"), pybind11::arg("scale"), pybind11::arg("weight"), release());
}
