// int8 linear layers for CPU inference with AVX512-VNNI (and AMX-INT8): transduce.model.kernels builds this file
// together with decoding.cpp (one extension module; decoding.cpp's module definition calls register_int8). Without
// VNNI at compile time the file defines nothing, and transduce.model.quantize uses PyTorch's int8 operation (fbgemm).
//
// int8_linear: y = x W^T + b for float32 rows x (M, K) and a weight quantised to int8 once per output channel
// (w[n, k] = scale[n] * wq[n, k]), as torch.ao's dynamically quantised Linear holds it. Each row of x is
// quantised at run time to uint8 with its own scale and zero point (x[m, k] ~ s[m] * (xq[m, k] - z[m]), its range
// widened to hold 0), the products are summed exactly in int32 by VPDPBUSD (four uint8 x int8 products a lane,
// no intermediate saturation), and then
//     y[m, n] = s[m] * scale[n] * (sum_k xq[m, k] wq[n, k] - z[m] * sum_k wq[n, k]) + b[n]
// (the difference exact in int32, then float32), with the ReLU and a residual added in the same pass where asked.
//
// Why: fbgemm's dynamic int8 linear (quantized::linear_dynamic) costs 10-15 us a call whatever its size (a
// tensor-wide min and max, a quantised copy, a packed copy with row offsets, the product, the output): on the
// Multi30k model's (128 x 128) x (128 x 128) products that is most of the call. Here the quantisation is one pass
// over x into a small buffer and the rest is the product, 8 rows x 48 outputs at a time in 24 registers: 8.7 us
// against fbgemm's 24.8 on that shape, 344 us against 602 on the (128 x 128) x (128 x 8,000) output projection
// (one thread, benchmarks/linear_backends.py). Per-row scales are also more exact than fbgemm's one scale per call
// (a row with small values keeps its precision).
//
// The weight is stored in VPDPBUSD's order: for each block of 16 output channels, for each group of 4 inputs, the
// 16 x 4 bytes that one instruction multiplies (pack_weight in transduce.model.quantize builds it).

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__)
#include <immintrin.h>
#define TRANSDUCE_VNNI 1
#if defined(__AMX_TILE__) && defined(__AMX_INT8__)
#include "vecmath.h"
#include "amx_tiles.h"
#endif
#endif

#ifdef TRANSDUCE_VNNI
namespace {

constexpr int kLanes = 16;  // output channels per vector (int32 / float32 lanes)
constexpr int kTileRows = 8, kTileVectors = 3;  // a tile of the product: 8 rows x 48 outputs in 24 accumulators
constexpr int64_t kMaxInputs = 65792;  // 255 * 128 * K < 2^31: no int32 sum can overflow (quantize.MAX_INPUTS)

// Row m of x (K floats) to uint8 with its scale and zero point: x ~ s * (q - z), q in [0, 255]; the range is
// widened to hold 0 (so z is a whole number in [0, 255] and 0 is exact). A row of zeros, or of values so small
// (below about 1e-35) that 1 / s would overflow, gets s = 1, z = 0 (all q = 0: the output is the bias, off by less
// than 1e-33 per weight). A row with a NaN or an infinity gets s = NaN, so that its outputs are NaN as a float
// product's would be NaN or infinite (not finite values made from a clamped row). The padding bytes K .. Kp stay
// 0 (their weights are 0).
inline void quantize_row(const float* x, int64_t K, uint8_t* q, float* scale, float* zero) {
  __m512 lo = _mm512_setzero_ps(), hi = _mm512_setzero_ps();
  __mmask16 bad = 0;  // lanes where x - x is NaN: x is NaN or infinite
  int64_t k = 0;
  for (; k + kLanes <= K; k += kLanes) {
    const __m512 v = _mm512_loadu_ps(x + k);
    bad |= _mm512_cmp_ps_mask(_mm512_sub_ps(v, v), _mm512_setzero_ps(), _CMP_UNORD_Q);
    lo = _mm512_min_ps(lo, v);
    hi = _mm512_max_ps(hi, v);
  }
  const __mmask16 tail = static_cast<__mmask16>((1u << (K - k)) - 1u);
  if (tail) {
    const __m512 v = _mm512_maskz_loadu_ps(tail, x + k);  // (zeros in the masked lanes: inside [lo, hi] already)
    bad |= _mm512_cmp_ps_mask(_mm512_sub_ps(v, v), _mm512_setzero_ps(), _CMP_UNORD_Q);
    lo = _mm512_min_ps(lo, v);
    hi = _mm512_max_ps(hi, v);
  }
  if (bad) {
    *scale = std::numeric_limits<float>::quiet_NaN();
    *zero = 0.0f;
    std::memset(q, 0, static_cast<size_t>(K));
    return;
  }
  const float mn = _mm512_reduce_min_ps(lo), mx = _mm512_reduce_max_ps(hi);
  float s = mx / 255.0f - mn / 255.0f;  // (divided first: mx - mn may overflow)
  if (!(s >= 1e-35f)) s = 1.0f;  // a row of zeros or of tiny values
  const float z = std::nearbyint(-mn / s);
  *scale = s;
  *zero = z;
  const __m512 inv = _mm512_set1_ps(1.0f / s), zv = _mm512_set1_ps(z);
  const __m512 top = _mm512_set1_ps(255.0f), bottom = _mm512_setzero_ps();
  for (k = 0; k + kLanes <= K; k += kLanes) {
    __m512 v = _mm512_fmadd_ps(_mm512_loadu_ps(x + k), inv, zv);
    v = _mm512_min_ps(_mm512_max_ps(v, bottom), top);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + k), _mm512_cvtusepi32_epi8(_mm512_cvtps_epi32(v)));
  }
  if (tail) {
    __m512 v = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, x + k), inv, zv);
    v = _mm512_min_ps(_mm512_max_ps(v, bottom), top);
    _mm_mask_storeu_epi8(q + k, tail, _mm512_cvtusepi32_epi8(_mm512_cvtps_epi32(v)));
  }
}

// acc += the four products of xv's and w's bytes in each lane, in place. (GCC 12 compiles the intrinsic
// _mm512_dpbusd_epi32 in a loop over a tile's accumulators into a register copy per instruction and spills them;
// with the accumulator an in-out operand the tile stays in registers: 1.5-2x faster.)
inline void dpbusd(__m512i& acc, __m512i xv, __m512i w) {
  asm("vpdpbusd %[w], %[x], %[acc]" : [acc] "+v"(acc) : [x] "v"(xv), [w] "v"(w));
}

struct Product {
  const uint8_t* xq;  // (M, Kp) quantised rows
  const float* xs;    // (M,) their scales
  const int32_t* xz;  // (M,) their zero points
  const int8_t* w;    // (Nv, Kq, 16, 4)
  const float* ws;    // (Nv * 16,) weight scales, 0 in the padding
  const int32_t* wsum;  // (Nv * 16,) sum_k wq[n, k]
  const float* bias;  // (N,) or nullptr
  const float* res;   // residual rows or nullptr
  float* y;           // output rows: row m, output n at y[(m - y_m0) * y_row + n - y_n0]
  int64_t Kq, Kp, N, y_row, res_row;
  bool relu;
  int64_t y_m0 = 0, y_n0 = 0;
};

// One vector of 16 outputs n0 .. n0 + 16 (fewer at the end) and what the formula reads of the weight for them.
struct OutputVector {
  int64_t n0;
  __mmask16 mask;
  __m512 ws, b;
  __m512i wsum;

  OutputVector(const Product& p, int64_t n)
      : n0(n),
        mask(p.N - n >= kLanes ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << (p.N - n)) - 1u)),
        ws(_mm512_loadu_ps(p.ws + n)),
        b(p.bias != nullptr ? _mm512_maskz_loadu_ps(mask, p.bias + n) : _mm512_setzero_ps()),
        wsum(_mm512_loadu_si512(p.wsum + n)) {}

  // Row m's outputs from its int32 sums acc: s * scale * (acc - z * wsum) + b, the difference exact in int32
  // (sum_k (q - z) w: |.| <= 255 * 128 * K), then the ReLU and the residual where asked.
  void write(const Product& p, int64_t m, __m512i acc) const {
    const __m512i exact = _mm512_sub_epi32(acc, _mm512_mullo_epi32(_mm512_set1_epi32(p.xz[m]), wsum));
    __m512 v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(exact), _mm512_mul_ps(_mm512_set1_ps(p.xs[m]), ws), b);
    if (p.relu) v = _mm512_max_ps(v, _mm512_setzero_ps());
    if (p.res != nullptr) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, p.res + m * p.res_row + n0));
    _mm512_mask_storeu_ps(p.y + (m - p.y_m0) * p.y_row + n0 - p.y_n0, mask, v);
  }
};

// Rows m0 .. m0 + R and output vectors j0 .. j0 + C of the product, R x C accumulators in registers.
template <int R, int C>
void tile(const Product& p, int64_t m0, int64_t j0) {
  __m512i acc[R][C];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_si512();
  const uint8_t* x = p.xq + m0 * p.Kp;
  const int8_t* w = p.w + j0 * p.Kq * 64;
  for (int64_t g = 0; g < p.Kq; ++g) {
    __m512i wv[C];
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) wv[c] = _mm512_loadu_si512(w + (c * p.Kq + g) * 64);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      int32_t four;
      std::memcpy(&four, x + r * p.Kp + 4 * g, 4);
      const __m512i xv = _mm512_set1_epi32(four);
#pragma GCC unroll 4
      for (int c = 0; c < C; ++c) dpbusd(acc[r][c], xv, wv[c]);
    }
  }
#pragma GCC unroll 4
  for (int c = 0; c < C; ++c) {
    if ((j0 + c) * kLanes >= p.N) break;
    const OutputVector out(p, (j0 + c) * kLanes);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) out.write(p, m0 + r, acc[r][c]);
  }
}

template <int C>
void rows_tile(const Product& p, int64_t m0, int64_t rows, int64_t j0) {
  switch (rows) {
    case 8: tile<8, C>(p, m0, j0); break;
    case 7: tile<7, C>(p, m0, j0); break;
    case 6: tile<6, C>(p, m0, j0); break;
    case 5: tile<5, C>(p, m0, j0); break;
    case 4: tile<4, C>(p, m0, j0); break;
    case 3: tile<3, C>(p, m0, j0); break;
    case 2: tile<2, C>(p, m0, j0); break;
    default: tile<1, C>(p, m0, j0); break;
  }
}

void check(const char* fn, const torch::Tensor& t, const char* name, at::ScalarType type, int64_t dims) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == type && t.dim() == dims,
              fn, ": ", name, " must be a ", dims, "-D ", c10::toString(type), " CPU tensor, got ",
              t.dim(), "-D ", t.scalar_type(), " on ", t.device());
}

// The optional bias's data, checked to be (N,) float32 and contiguous; nullptr where there is none.
const float* bias_data(const char* fn, const c10::optional<torch::Tensor>& bias, int64_t N) {
  if (!bias.has_value() || !bias->defined()) return nullptr;
  check(fn, *bias, "bias", at::kFloat, 1);
  TORCH_CHECK(bias->is_contiguous() && bias->size(0) == N, fn, ": bias must be contiguous (", N, ",)");
  return bias->data_ptr<float>();
}

// The optional residual's data, checked to be (M, N) float32 with dense rows, and its row stride; nullptr where
// there is none.
const float* residual_data(const char* fn, const c10::optional<torch::Tensor>& residual, int64_t M, int64_t N,
                           int64_t* row) {
  if (!residual.has_value() || !residual->defined()) return nullptr;
  check(fn, *residual, "residual", at::kFloat, 2);
  TORCH_CHECK(residual->size(0) == M && residual->size(1) == N && residual->stride(1) == 1, fn,
              ": residual must be (", M, ", ", N, ") with dense rows, got ", residual->sizes());
  *row = residual->stride(0);
  return residual->data_ptr<float>();
}

// The checks both products make of their arguments (each message names the function fn).
void check_product(const char* fn, const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& scales,
                   const torch::Tensor& sums, int64_t N) {
  check(fn, x, "x", at::kFloat, 2);
  check(fn, weight, "weight", at::kChar, 3);
  check(fn, scales, "scales", at::kFloat, 1);
  check(fn, sums, "sums", at::kInt, 1);
  TORCH_CHECK(x.stride(1) == 1, fn, ": x's rows must be dense");
  TORCH_CHECK(weight.is_contiguous() && weight.size(2) == 64, fn, ": weight must be contiguous (Nv, Kq, 64)");
  const int64_t K = x.size(1), Nv = weight.size(0), Kq = weight.size(1), Kp = 4 * Kq;
  TORCH_CHECK(Kq == (K + 3) / 4, fn, ": x has ", K, " inputs, the weight ", Kp, " (padded to 4)");
  TORCH_CHECK(Kp <= kMaxInputs, fn, ": at most ", kMaxInputs, " inputs (the int32 sums could overflow), got ", K);
  TORCH_CHECK(N > 0 && Nv == (N + kLanes - 1) / kLanes, fn, ": ", N, " outputs, the weight holds ", Nv * kLanes,
              " (padded to 16)");
  TORCH_CHECK(scales.is_contiguous() && sums.is_contiguous() && scales.size(0) == Nv * kLanes &&
                  sums.size(0) == Nv * kLanes,
              fn, ": scales and sums must be contiguous (", Nv * kLanes, ",)");
}

// The M rows of x quantised (quantize_row) into rows of Kp bytes, with their scales and zero points; rows M .. Mp
// and the bytes K .. Kp zero.
struct QuantisedRows {
  std::vector<uint8_t> q;
  std::vector<float> scale;
  std::vector<int32_t> zero;
};

QuantisedRows quantise_rows(const torch::Tensor& x, int64_t Kp, int64_t Mp) {
  const int64_t M = x.size(0), K = x.size(1);
  QuantisedRows rows{std::vector<uint8_t>(static_cast<size_t>(Mp * Kp), 0), std::vector<float>(Mp, 0.0f),
                     std::vector<int32_t>(Mp, 0)};
  const float* xd = x.data_ptr<float>();
  for (int64_t m = 0; m < M; ++m) {
    float zero;
    quantize_row(xd + m * x.stride(0), K, rows.q.data() + m * Kp, &rows.scale[m], &zero);
    rows.zero[m] = static_cast<int32_t>(zero);
  }
  return rows;
}

}  // namespace

// x: (M, K) float32 with dense rows; weight: (Nv, Kq, 64) int8 from pack_weight; scales: (Nv * 16,) float32;
// sums: (Nv * 16,) int32; bias: (N,) float32 or None; residual: (M, N) float32 with dense rows or None.
// Returns (M, N) float32.
torch::Tensor int8_linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& scales,
                          const torch::Tensor& sums, const c10::optional<torch::Tensor>& bias,
                          const c10::optional<torch::Tensor>& residual, bool relu, int64_t N) {
  check_product("int8_linear", x, weight, scales, sums, N);
  const int64_t M = x.size(0), Nv = weight.size(0), Kq = weight.size(1), Kp = 4 * Kq;
  const float* bd = bias_data("int8_linear", bias, N);
  int64_t res_row = 0;
  const float* rd = residual_data("int8_linear", residual, M, N, &res_row);
  auto y = torch::empty({M, N}, x.options());
  if (M == 0) return y;
  const QuantisedRows rows = quantise_rows(x, Kp, M);
  const Product p{rows.q.data(), rows.scale.data(), rows.zero.data(), weight.data_ptr<int8_t>(),
                  scales.data_ptr<float>(), sums.data_ptr<int32_t>(), bd, rd, y.data_ptr<float>(), Kq, Kp, N, N,
                  res_row, relu};
  // the threads take blocks of output vectors (each block's weights stay in its core's cache over all rows)
  const int64_t blocks = (Nv + kTileVectors - 1) / kTileVectors;
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 20) / std::max<int64_t>(1, M * Kp * kTileVectors * kLanes));
  at::parallel_for(0, blocks, grain, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const int64_t j0 = b * kTileVectors, vectors = std::min<int64_t>(kTileVectors, Nv - j0);
      for (int64_t m0 = 0; m0 < M; m0 += kTileRows) {
        const int64_t rows = std::min<int64_t>(kTileRows, M - m0);
        if (vectors == 3) rows_tile<3>(p, m0, rows, j0);
        else if (vectors == 2) rows_tile<2>(p, m0, rows, j0);
        else rows_tile<1>(p, m0, rows, j0);
      }
    }
  });
  return y;
}

#if defined(__AMX_TILE__) && defined(__AMX_INT8__)
// int8_amx_linear: int8_linear's product in AMX tiles (TDPBUSD: uint8 rows times int8 weights, summed exactly in
// int32), for weights whose Kq is a multiple of 16 (K padded to 64: every preset's layers). The weight needs no
// other layout: for 16 output channels, 16 consecutive groups of 4 inputs are 16 rows of 64 bytes, what a tile of
// TDPBUSD's second operand holds. The rows are quantised and the sums turned into the output exactly as in
// int8_linear, so the two give the same floats. Rows are taken 32 at a time, outputs 32 at a time (four int32
// accumulator tiles); a call costs a few microseconds beyond its arithmetic.
namespace {

// Rows m0 .. m0 + 16 * RM and output vectors j0 .. j0 + RN (RM, RN in {1, 2}) of the product p (p.xq: Mp rows).
template <int RM, int RN>
void amx_block(const Product& p, int64_t M, int64_t m0, int64_t j0) {
  _tile_zero(0);
  if (RN == 2) _tile_zero(1);
  if (RM == 2) _tile_zero(2);
  if (RM == 2 && RN == 2) _tile_zero(3);
  const uint8_t* x0 = p.xq + m0 * p.Kp;
  const uint8_t* x1 = x0 + 16 * p.Kp;
  const int8_t* w0 = p.w + j0 * p.Kq * 64;
  const int8_t* w1 = w0 + p.Kq * 64;
  for (int64_t g = 0; g < p.Kq; g += 16) {
    _tile_loadd(4, x0 + 4 * g, p.Kp);
    _tile_loadd(6, w0 + g * 64, 64);
    _tile_dpbusd(0, 4, 6);
    if (RN == 2) {
      _tile_loadd(7, w1 + g * 64, 64);
      _tile_dpbusd(1, 4, 7);
    }
    if (RM == 2) {
      _tile_loadd(5, x1 + 4 * g, p.Kp);
      _tile_dpbusd(2, 5, 6);
      if (RN == 2) _tile_dpbusd(3, 5, 7);
    }
  }
  alignas(64) int32_t acc[4][256];
  _tile_stored(0, acc[0], 64);
  if (RN == 2) _tile_stored(1, acc[1], 64);
  if (RM == 2) _tile_stored(2, acc[2], 64);
  if (RM == 2 && RN == 2) _tile_stored(3, acc[3], 64);
  for (int j = 0; j < RN; ++j) {
    if ((j0 + j) * kLanes >= p.N) break;
    const OutputVector out(p, (j0 + j) * kLanes);
    for (int i = 0; i < RM; ++i) {
      const int32_t* a = acc[2 * i + j];
      for (int64_t r = 0; r < 16 && m0 + i * 16 + r < M; ++r)
        out.write(p, m0 + i * 16 + r, _mm512_load_si512(a + r * 16));
    }
  }
}

// The block of rows m0 .. m0 + 32 and output vectors j0, j0 + 1, or fewer at the edges (Mp rows, Nv vectors).
inline void any_amx_block(const Product& p, int64_t M, int64_t Mp, int64_t Nv, int64_t m0, int64_t j0) {
  const bool two_rows = m0 + 16 < Mp, two_cols = j0 + 1 < Nv;
  if (two_rows && two_cols) amx_block<2, 2>(p, M, m0, j0);
  else if (two_rows) amx_block<2, 1>(p, M, m0, j0);
  else if (two_cols) amx_block<1, 2>(p, M, m0, j0);
  else amx_block<1, 1>(p, M, m0, j0);
}

}  // namespace

// int8_linear's arguments and result; the weight's Kq a multiple of 16.
torch::Tensor int8_amx_linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& scales,
                              const torch::Tensor& sums, const c10::optional<torch::Tensor>& bias,
                              const c10::optional<torch::Tensor>& residual, bool relu, int64_t N) {
  check_product("int8_amx_linear", x, weight, scales, sums, N);
  const int64_t M = x.size(0), Nv = weight.size(0), Kq = weight.size(1), Kp = 4 * Kq;
  TORCH_CHECK(Kq % 16 == 0, "int8_amx_linear: the weight's inputs must be a multiple of 64, got ", Kp);
  TORCH_CHECK(transduce_amx::request_tiles(), "int8_amx_linear: the operating system refused the AMX tile state");
  const float* bd = bias_data("int8_amx_linear", bias, N);
  int64_t res_row = 0;
  const float* rd = residual_data("int8_amx_linear", residual, M, N, &res_row);
  auto y = torch::empty({M, N}, x.options());
  if (M == 0) return y;
  const int64_t Mp = (M + 15) / 16 * 16;
  const QuantisedRows rows = quantise_rows(x, Kp, Mp);
  const Product p{rows.q.data(), rows.scale.data(), rows.zero.data(), weight.data_ptr<int8_t>(),
                  scales.data_ptr<float>(), sums.data_ptr<int32_t>(), bd, rd, y.data_ptr<float>(), Kq, Kp, N, N,
                  res_row, relu};
  const int64_t col_blocks = (Nv + 1) / 2, row_blocks = (Mp / 16 + 1) / 2, chunk = 8;
  const int64_t chunks = (col_blocks + chunk - 1) / chunk;
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 21) / std::max<int64_t>(1, Mp * Kp * 32 * chunk));
  at::parallel_for(0, chunks, grain, [&](int64_t begin, int64_t end) {
    transduce_amx::configure_tiles();
    for (int64_t h = begin; h < end; ++h) {
      const int64_t c_end = std::min(col_blocks, (h + 1) * chunk);
      for (int64_t r = 0; r < row_blocks; ++r)
        for (int64_t c = h * chunk; c < c_end; ++c) any_amx_block(p, M, Mp, Nv, 32 * r, 2 * c);
    }
    _tile_release();
  });
  return y;
}

// int8_amx_linear's logits reduced to a beam step's candidates as they are made, as amx.cpp's amx_bf16_candidates
// does for bf16 (amx_tiles.h's candidates_pass): each row's logsumexp, then its k largest logits with the ids in
// excluded left out, and their ids; the logits never written. The same values and ids as decoding.cpp's
// row_candidates on int8_amx_linear's output, the normaliser up to the order of summation.
std::vector<torch::Tensor> int8_amx_candidates(const torch::Tensor& x, const torch::Tensor& weight,
                                               const torch::Tensor& scales, const torch::Tensor& sums,
                                               const c10::optional<torch::Tensor>& bias, int64_t N, int64_t k,
                                               const torch::Tensor& excluded) {
  const char* fn = "int8_amx_candidates";
  check_product(fn, x, weight, scales, sums, N);
  const int64_t M = x.size(0), Nv = weight.size(0), Kq = weight.size(1), Kp = 4 * Kq;
  TORCH_CHECK(Kq % 16 == 0, fn, ": the weight's inputs must be a multiple of 64, got ", Kp);
  TORCH_CHECK(transduce_amx::request_tiles(), fn, ": the operating system refused the AMX tile state");
  TORCH_CHECK(k >= 1 && k <= N, fn, ": need 1 <= k <= outputs, got k=", k, ", outputs=", N);
  const float* bd = bias_data(fn, bias, N);
  const std::vector<int64_t> skip = transduce_amx::excluded_ids(fn, excluded, N);
  auto normalisers = torch::empty({M}, x.options());
  auto values = torch::empty({M, k}, x.options());
  auto indices = torch::empty({M, k}, x.options().dtype(at::kLong));
  if (M == 0) return {normalisers, values, indices};
  const int64_t Mp = (M + 15) / 16 * 16;
  const QuantisedRows rows = quantise_rows(x, Kp, Mp);
  const Product p{rows.q.data(), rows.scale.data(), rows.zero.data(), weight.data_ptr<int8_t>(),
                  scales.data_ptr<float>(), sums.data_ptr<int32_t>(), bd, nullptr, nullptr, Kq, Kp, N, 0, 0, false};
  transduce_amx::candidates_pass(
      M, Mp, N, (Nv + 1) / 2, k, skip, normalisers.data_ptr<float>(), values.data_ptr<float>(),
      indices.data_ptr<int64_t>(), [&](float* buffer, int64_t width, int64_t m0, int64_t n_start, int64_t c) {
        any_amx_block(transduce_amx::into_buffer(p, buffer, width, m0, n_start), M, Mp, Nv, m0, 2 * c);
      });
  return {normalisers, values, indices};
}
#endif

void register_int8(pybind11::module_& m) {
  using release = pybind11::call_guard<pybind11::gil_scoped_release>;
  m.def("int8_linear", &int8_linear, "x W^T + b with W in int8 and x quantised per row (AVX512-VNNI)",
        pybind11::arg("x"), pybind11::arg("weight"), pybind11::arg("scales"), pybind11::arg("sums"),
        pybind11::arg("bias"), pybind11::arg("residual"), pybind11::arg("relu"), pybind11::arg("outputs"),
        release());
#if defined(__AMX_TILE__) && defined(__AMX_INT8__)
  m.def("int8_amx_linear", &int8_amx_linear, "int8_linear's product in AMX tiles (the weight's inputs padded to 64)",
        pybind11::arg("x"), pybind11::arg("weight"), pybind11::arg("scales"), pybind11::arg("sums"),
        pybind11::arg("bias"), pybind11::arg("residual"), pybind11::arg("relu"), pybind11::arg("outputs"),
        release());
  m.def("int8_amx_candidates", &int8_amx_candidates,
        "int8_amx_linear's logits, each row's logsumexp and top k (excluded ids left out), without writing them",
        pybind11::arg("x"), pybind11::arg("weight"), pybind11::arg("scales"), pybind11::arg("sums"),
        pybind11::arg("bias"), pybind11::arg("outputs"), pybind11::arg("k"), pybind11::arg("excluded"), release());
#endif
}
#else
void register_int8(pybind11::module_&) {}  // no VNNI: quantize.py falls back to PyTorch's int8 operation
#endif
