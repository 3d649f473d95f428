// Vectorised float32 helpers shared by transduce's CPU kernels (decoding.cpp, training.cpp, amx.cpp): a polynomial
// e^x for x <= 0, horizontal sums and maxima, a row's max and its sum of exponentials, a row's k largest values.
// Each translation unit gets its own copy (internal linkage).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif
#if defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__)
#define TRANSDUCE_AVX512 1
#endif

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// e^x for x <= 0; 0 below -87 (where e^x leaves float's normal range) and for -inf; NaN for NaN (the vector forms
// take the max with -87 as max(-87, x), which returns x when x is NaN). Cody-Waite reduction
// x = n ln2 + r, |r| <= ln2 / 2, and a degree-6 polynomial for e^r (Cephes' expf coefficients), branch-free so
// that the loops calling it are vectorised. The 8- and 16-wide versions below take the same steps with these
// constants.
constexpr float kExpLow = -87.0f, kLog2e = 1.44269504088896341f, kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
constexpr float kExp6 = 1.9875691500e-4f, kExp5 = 1.3981999507e-3f, kExp4 = 8.3334519073e-3f,
                kExp3 = 4.1665795894e-2f, kExp2 = 1.6666665459e-1f, kExp1 = 5.0000001201e-1f;
inline float exp_nonpositive(float x) {
  const float xc = x < kExpLow ? kExpLow : x;
  const float n = __builtin_rintf(xc * kLog2e);
  float r = xc - n * kLn2Hi;
  r = r - n * kLn2Lo;
  float y = kExp6;
  y = y * r + kExp5;
  y = y * r + kExp4;
  y = y * r + kExp3;
  y = y * r + kExp2;
  y = y * r + kExp1;
  y = y * r * r + r + 1.0f;
  int32_t bits;
  std::memcpy(&bits, &y, sizeof bits);
  bits += static_cast<int32_t>(n) << 23;
  std::memcpy(&y, &bits, sizeof y);
  return x < kExpLow ? 0.0f : y;
}

#if defined(__AVX2__) && defined(__FMA__)
#define TRANSDUCE_AVX2 1
// exp_nonpositive on 8 floats at once (the same steps and constants).
inline __m256 exp_nonpositive8(__m256 x) {
  const __m256 low = _mm256_set1_ps(kExpLow);
  const __m256 under = _mm256_cmp_ps(x, low, _CMP_LT_OQ);
  const __m256 xc = _mm256_max_ps(low, x);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(kLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), xc);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), r);
  __m256 y = _mm256_set1_ps(kExp6);
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(kExp5));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(kExp4));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(kExp3));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(kExp2));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(kExp1));
  y = _mm256_fmadd_ps(_mm256_mul_ps(y, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i scale = _mm256_slli_epi32(_mm256_cvtps_epi32(n), 23);
  y = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(y), scale));
  return _mm256_andnot_ps(under, y);
}

inline float horizontal_sum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float horizontal_max(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
#endif

#ifdef TRANSDUCE_AVX512
// exp_nonpositive on 16 floats at once (the same steps and constants). Where the CPU has AVX-512 at full width
// (AMD Zen 5 here), a 16-wide step costs what an 8-wide one does: logsumexp over the rows of a beam step's logits
// took about half the time.
inline __m512 exp_nonpositive16(__m512 x) {
  const __m512 low = _mm512_set1_ps(kExpLow);
  const __mmask16 under = _mm512_cmp_ps_mask(x, low, _CMP_LT_OQ);
  const __m512 xc = _mm512_max_ps(low, x);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(kLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), xc);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), r);
  __m512 y = _mm512_set1_ps(kExp6);
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(kExp5));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(kExp4));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(kExp3));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(kExp2));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(kExp1));
  y = _mm512_fmadd_ps(_mm512_mul_ps(y, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  const __m512i scale = _mm512_slli_epi32(_mm512_cvtps_epi32(n), 23);
  y = _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(y), scale));
  return _mm512_maskz_mov_ps(static_cast<__mmask16>(~under), y);
}
#endif

// sum over j < n of exp(x[j] - shift), writing each term to out[j] when out is not null (x[j] <= shift).
inline float sum_exp(const float* x, float shift, int64_t n, float* out) {
  int64_t j = 0;
  float sum = 0.0f;
#ifdef TRANSDUCE_AVX512
  __m512 acc16 = _mm512_setzero_ps();
  const __m512 s16 = _mm512_set1_ps(shift);
  for (; j + 16 <= n; j += 16) {
    const __m512 e = exp_nonpositive16(_mm512_sub_ps(_mm512_loadu_ps(x + j), s16));
    if (out != nullptr) _mm512_storeu_ps(out + j, e);
    acc16 = _mm512_add_ps(acc16, e);
  }
  sum = _mm512_reduce_add_ps(acc16);
#endif
#ifdef TRANSDUCE_AVX2
  __m256 acc = _mm256_setzero_ps();
  const __m256 s = _mm256_set1_ps(shift);
  for (; j + 8 <= n; j += 8) {
    const __m256 e = exp_nonpositive8(_mm256_sub_ps(_mm256_loadu_ps(x + j), s));
    if (out != nullptr) _mm256_storeu_ps(out + j, e);
    acc = _mm256_add_ps(acc, e);
  }
  sum += horizontal_sum(acc);
#endif
  for (; j < n; ++j) {
    const float e = exp_nonpositive(x[j] - shift);
    if (out != nullptr) out[j] = e;
    sum += e;
  }
  return sum;
}

// max over j < n of x[j] (-inf when n == 0; NaN when any x[j] is NaN, as torch's reductions).
inline float max_of(const float* x, int64_t n) {
  int64_t j = 0;
  float top = kNegInf;
  bool nan = false;
#ifdef TRANSDUCE_AVX512
  // four running maxima: one would wait for the previous vector's max at every step
  __m512 acc0 = _mm512_set1_ps(kNegInf), acc1 = acc0, acc2 = acc0, acc3 = acc0;
  __mmask16 unordered16 = 0;
  for (; j + 64 <= n; j += 64) {
    const __m512 v0 = _mm512_loadu_ps(x + j), v1 = _mm512_loadu_ps(x + j + 16);
    const __m512 v2 = _mm512_loadu_ps(x + j + 32), v3 = _mm512_loadu_ps(x + j + 48);
    acc0 = _mm512_max_ps(acc0, v0);
    acc1 = _mm512_max_ps(acc1, v1);
    acc2 = _mm512_max_ps(acc2, v2);
    acc3 = _mm512_max_ps(acc3, v3);
    // (unordered(a, b): a lane where a or b is NaN, so two comparisons cover the four vectors)
    unordered16 |= _mm512_cmp_ps_mask(v0, v1, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(v2, v3, _CMP_UNORD_Q);
  }
  for (; j + 16 <= n; j += 16) {
    const __m512 v = _mm512_loadu_ps(x + j);
    acc0 = _mm512_max_ps(acc0, v);
    unordered16 |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  }
  top = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(acc0, acc1), _mm512_max_ps(acc2, acc3)));
  nan = unordered16 != 0;
#endif
#ifdef TRANSDUCE_AVX2
  __m256 acc = _mm256_set1_ps(kNegInf);
  __m256 unordered = _mm256_setzero_ps();
  for (; j + 8 <= n; j += 8) {
    const __m256 v = _mm256_loadu_ps(x + j);
    acc = _mm256_max_ps(acc, v);
    unordered = _mm256_or_ps(unordered, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  }
  top = std::max(top, horizontal_max(acc));
  nan |= _mm256_movemask_ps(unordered) != 0;
#endif
  for (; j < n; ++j) {
    nan |= x[j] != x[j];
    top = x[j] > top ? x[j] : top;
  }
  return nan ? std::numeric_limits<float>::quiet_NaN() : top;
}

// The k largest of a row's values seen so far, largest first, in best[0 .. k) with their indices in where[0 .. k);
// among equal values the one with the smaller index first (-inf values included, NaN not expected). The values
// are fed in increasing index order (scan, one or more calls a row); each block of 16 is compared with the k-th
// best so far and a value inserted only when larger, so that once the first few hundred values are in, a block
// costs one comparison.
struct RowTopK {
  float* best;
  int64_t* where;
  int64_t k;
  int64_t n = 0;  // filled slots

  void insert(float value, int64_t j) {
    int64_t pos = n < k ? n++ : k - 1;
    while (pos > 0 && best[pos - 1] < value) {  // strict: an equal value already there stays ahead
      best[pos] = best[pos - 1];
      where[pos] = where[pos - 1];
      --pos;
    }
    best[pos] = value;
    where[pos] = j;
  }

  // x[0 .. count) are the values of indices offset .. offset + count.
  void scan(const float* __restrict x, int64_t count, int64_t offset) {
    int64_t j = 0;
    for (; j < count && n < k; ++j) insert(x[j], offset + j);
    constexpr int64_t kBlock = 16;
    for (; j < count && j % kBlock != 0; ++j)
      if (x[j] > best[k - 1]) insert(x[j], offset + j);
#if defined(TRANSDUCE_AVX512)
    // four blocks at a time; where one holds values above the k-th best (rare once the row's first few hundred
    // values are in), only those values are looked at, the threshold rising as they enter
    for (; j + 4 * kBlock <= count; j += 4 * kBlock) {
      const __m512 t16 = _mm512_set1_ps(best[k - 1]);
      const __mmask16 m0 = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + j), t16, _CMP_GT_OQ);
      const __mmask16 m1 = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + j + 16), t16, _CMP_GT_OQ);
      const __mmask16 m2 = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + j + 32), t16, _CMP_GT_OQ);
      const __mmask16 m3 = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + j + 48), t16, _CMP_GT_OQ);
      uint64_t above = static_cast<uint64_t>(m0) | static_cast<uint64_t>(m1) << 16 | static_cast<uint64_t>(m2) << 32 |
                       static_cast<uint64_t>(m3) << 48;
      for (; above != 0; above &= above - 1) {
        const int64_t i = j + __builtin_ctzll(above);
        if (x[i] > best[k - 1]) insert(x[i], offset + i);
      }
    }
#endif
    for (; j + kBlock <= count; j += kBlock) {
      const float threshold = best[k - 1];
#if defined(TRANSDUCE_AVX512)
      const bool any = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + j), _mm512_set1_ps(threshold), _CMP_GT_OQ) != 0;
#elif defined(TRANSDUCE_AVX2)
      const __m256 t8 = _mm256_set1_ps(threshold);
      const int any = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + j), t8, _CMP_GT_OQ)) |
                      _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + j + 8), t8, _CMP_GT_OQ));
#else
      int any = 0;
      for (int64_t i = 0; i < kBlock; ++i) any |= x[j + i] > threshold;
#endif
      if (!any) continue;  // the usual case
      for (int64_t i = 0; i < kBlock; ++i)
        if (x[j + i] > best[k - 1]) insert(x[j + i], offset + j + i);
    }
    for (; j < count; ++j)
      if (x[j] > best[k - 1]) insert(x[j], offset + j);
  }
};

// One row's logits fed a chunk at a time, in the order of their ids (AMX products that reduce their logits as they
// make them: amx.cpp, int8.cpp), or as one chunk (decoding.cpp's row_candidates): the row's logsumexp over every
// value, kept as a running maximum and a sum of exponentials rescaled when the maximum grows, and its k largest
// values with the excluded ids left out (RowTopK). Fed in chunks, the logsumexp equals the one-chunk value up to the
// order of summation.
struct RowCandidates {
  RowTopK best;
  float top = kNegInf, sum = 0.0f;
  float odd = 0.0f;  // a NaN or +inf maximum met (the logsumexp is then that, as torch.logsumexp's)

  // x[0 .. count): the values of ids offset .. offset + count; skip_begin .. skip_end: the excluded ids among them,
  // written -inf in x before the top k takes its values.
  void feed(float* x, int64_t count, int64_t offset, const int64_t* skip_begin, const int64_t* skip_end) {
    const float chunk_max = max_of(x, count);
    if (chunk_max != chunk_max || chunk_max == -kNegInf) {
      odd = odd != odd ? odd : chunk_max;  // NaN stays NaN
    } else if (chunk_max != kNegInf) {
      const float new_top = std::max(top, chunk_max);
      const float kept = top == kNegInf ? 0.0f : sum * std::exp(top - new_top);
      sum = kept + sum_exp(x, new_top, count, nullptr);
      top = new_top;
    }
    for (const int64_t* e = skip_begin; e != skip_end; ++e) x[*e - offset] = kNegInf;
    best.scan(x, count, offset);
  }

  float normaliser() const { return odd != 0.0f ? odd : top == kNegInf ? kNegInf : top + std::log(sum); }
};

}  // namespace
