// bf16 linear layers in AMX tiles for CPU inference: transduce.model.kernels builds this file together with
// decoding.cpp (one extension module; decoding.cpp's module definition calls register_amx). Without AMX-BF16 at
// compile time the file defines nothing, and transduce.model.bf16 multiplies through oneDNN (or F.linear).
//
// amx_bf16_linear: y = x W^T + b for float32 rows x (M, K) and a weight held in bf16 (transduce.model.bf16's
// BF16Linear), in the layout the tiles read (amx_bf16_pack). Each row of x is rounded to bf16 (round to nearest
// even, as Tensor.to(torch.bfloat16) rounds), the products of bf16 pairs are summed in float32 by TDPBF16PS, and
// the float32 sums are the output, with the bias, the ReLU and a residual added in the same pass where asked.
//
// Why: a decoding step multiplies a few dozen to a few hundred rows by small weights ((128 x 128) to (128 x 512)
// for the `tiny` preset). oneDNN's bf16 product runs in the same tiles but costs 25-50 us a call whatever its size,
// more than the whole product of such a shape, and wants its input and output converted around it; here a call is
// one pass over x into bf16 and the product, 32 rows x 32 outputs at a time in four accumulator tiles.
//
// Layout. The weight (N, K) is padded to Np (a multiple of 16) outputs and Kp (a multiple of 32) inputs with zeros
// and stored as Np / 16 x Kp / 32 tiles of 16 rows x 64 bytes: row r of the tile for outputs n0 .. n0 + 16 and inputs
// k0 .. k0 + 32 holds, for each output n, the pair W[n, k0 + 2r], W[n, k0 + 2r + 1] (the pairs TDPBF16PS reads).
// x is rounded into a (Mp, Kp) bf16 buffer, Mp a multiple of 16, the padding zero.

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512F__) && defined(__AVX512BF16__)
#include "vecmath.h"
#include "amx_tiles.h"
#define TRANSDUCE_AMX 1
#endif

#ifdef TRANSDUCE_AMX
namespace {

constexpr int64_t kTileRows = 16;  // rows of x (and of the output) a tile holds
constexpr int64_t kTileCols = 16;  // outputs a tile holds (float32 lanes of a 64-byte row)
constexpr int64_t kTileK = 32;     // inputs a tile holds (bf16 in a 64-byte row)

using transduce_amx::configure_tiles;
using transduce_amx::request_tiles;

struct Product {
  const uint16_t* x;  // (Mp, Kp) bf16 rows
  const uint16_t* w;  // (Np / 16, Kp / 32, 16, 32) bf16 tiles
  const float* bias;  // (N,) or nullptr
  const float* res;   // residual rows or nullptr
  float* y;           // output rows: row m, output n at y[(m - y_m0) * y_row + n - y_n0]
  int64_t M, N, Kp, res_row;
  bool relu;
  int64_t y_row, y_m0 = 0, y_n0 = 0;
};

// The output block of rows m0 .. m0 + 16 * RM and outputs n0 .. n0 + 16 * RN (RM, RN in {1, 2}): the accumulators
// over all of K, then stored with the bias, the ReLU and the residual (only the rows < M and outputs < N).
template <int RM, int RN>
void block(const Product& p, int64_t m0, int64_t n0) {
  _tile_zero(0);
  if (RN == 2) _tile_zero(1);
  if (RM == 2) _tile_zero(2);
  if (RM == 2 && RN == 2) _tile_zero(3);
  const int64_t kb = p.Kp / kTileK, x_stride = p.Kp * 2;
  const uint16_t* x0 = p.x + m0 * p.Kp;
  const uint16_t* x1 = x0 + kTileRows * p.Kp;
  const uint16_t* w0 = p.w + (n0 / kTileCols) * kb * 512;
  const uint16_t* w1 = w0 + kb * 512;
  for (int64_t k = 0; k < kb; ++k) {
    _tile_loadd(4, x0 + k * kTileK, x_stride);
    _tile_loadd(6, w0 + k * 512, 64);
    _tile_dpbf16ps(0, 4, 6);
    if (RN == 2) {
      _tile_loadd(7, w1 + k * 512, 64);
      _tile_dpbf16ps(1, 4, 7);
    }
    if (RM == 2) {
      _tile_loadd(5, x1 + k * kTileK, x_stride);
      _tile_dpbf16ps(2, 5, 6);
      if (RN == 2) _tile_dpbf16ps(3, 5, 7);
    }
  }
  alignas(64) float acc[4][kTileRows * kTileCols];
  _tile_stored(0, acc[0], 64);
  if (RN == 2) _tile_stored(1, acc[1], 64);
  if (RM == 2) _tile_stored(2, acc[2], 64);
  if (RM == 2 && RN == 2) _tile_stored(3, acc[3], 64);
  for (int i = 0; i < RM; ++i) {
    for (int j = 0; j < RN; ++j) {
      const int64_t n = n0 + j * kTileCols;
      if (n >= p.N) continue;
      const __mmask16 mask = p.N - n >= kTileCols ? static_cast<__mmask16>(0xFFFF)
                                                  : static_cast<__mmask16>((1u << (p.N - n)) - 1u);
      const __m512 b = p.bias != nullptr ? _mm512_maskz_loadu_ps(mask, p.bias + n) : _mm512_setzero_ps();
      const float* a = acc[2 * i + j];
      for (int64_t r = 0; r < kTileRows; ++r) {
        const int64_t m = m0 + i * kTileRows + r;
        if (m >= p.M) break;
        __m512 v = _mm512_add_ps(_mm512_load_ps(a + r * kTileCols), b);
        if (p.relu) v = _mm512_max_ps(v, _mm512_setzero_ps());
        if (p.res != nullptr) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, p.res + m * p.res_row + n));
        _mm512_mask_storeu_ps(p.y + (m - p.y_m0) * p.y_row + n - p.y_n0, mask, v);
      }
    }
  }
}

// The output block at rows m0 and outputs n0 of 2 x 2 tiles, or fewer at the edges (Mp rows, nb output tiles).
inline void any_block(const Product& p, int64_t m0, int64_t n0, int64_t Mp, int64_t nb) {
  const bool two_rows = m0 + kTileRows < Mp, two_cols = n0 + kTileCols < nb * kTileCols;
  if (two_rows && two_cols) block<2, 2>(p, m0, n0);
  else if (two_rows) block<2, 1>(p, m0, n0);
  else if (two_cols) block<1, 2>(p, m0, n0);
  else block<1, 1>(p, m0, n0);
}

// A row of x (K floats) rounded to bf16 (to nearest, ties to even) into out.
inline void round_row(const float* x, int64_t K, uint16_t* out) {
  int64_t k = 0;
  for (; k + 32 <= K; k += 32) {
    const __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + k + 16), _mm512_loadu_ps(x + k));
    _mm512_storeu_si512(out + k, (__m512i)v);
  }
  for (; k + 16 <= K; k += 16) {
    const __m256bh v = _mm512_cvtneps_pbh(_mm512_loadu_ps(x + k));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + k), (__m256i)v);
  }
  if (k < K) {
    const __mmask16 tail = static_cast<__mmask16>((1u << (K - k)) - 1u);
    const __m256bh v = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(tail, x + k));
    _mm256_mask_storeu_epi16(out + k, tail, (__m256i)v);
  }  // (the padding K .. Kp stays as the caller zeroed it)
}

void check(const char* fn, const torch::Tensor& t, const char* name, at::ScalarType type, int64_t dims) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == type && t.dim() == dims,
              fn, ": ", name, " must be a ", dims, "-D ", c10::toString(type), " CPU tensor, got ",
              t.dim(), "-D ", t.scalar_type(), " on ", t.device());
}

}  // namespace

// Whether this process may use the AMX tiles (asked of the kernel once).
bool amx_available() { return request_tiles(); }

// weight: (N, K) bf16 -> (Np / 16, Kp / 32, 16, 32) bf16 in the tiles' layout (zeros in the padding).
torch::Tensor amx_bf16_pack(const torch::Tensor& weight) {
  check("amx_bf16_pack", weight, "weight", at::kBFloat16, 2);
  const auto w = weight.contiguous();
  const int64_t N = w.size(0), K = w.size(1);
  const int64_t nb = (N + kTileCols - 1) / kTileCols, kb = (K + kTileK - 1) / kTileK;
  auto packed = torch::zeros({nb, kb, 16, 32}, w.options());
  const uint16_t* src = reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>());
  uint16_t* dst = reinterpret_cast<uint16_t*>(packed.data_ptr<at::BFloat16>());
  for (int64_t n = 0; n < N; ++n) {
    const int64_t j = n / kTileCols, c = n % kTileCols;
    for (int64_t k = 0; k < K; ++k) {
      const int64_t b = k / kTileK, r = (k % kTileK) / 2, e = k % 2;
      dst[((j * kb + b) * 16 + r) * 32 + 2 * c + e] = src[n * K + k];
    }
  }
  return packed;
}

namespace {

// The checked inputs of a product: x's rows rounded into the (Mp, Kp) bf16 buffer the tiles read, the weight's
// tiles and the bias.
struct Inputs {
  std::vector<uint16_t> xb;
  const uint16_t* w;
  const float* bias;
  int64_t M, Mp, Kp, nb;
};

Inputs prepare(const char* fn, const torch::Tensor& x, const torch::Tensor& weight,
               const c10::optional<torch::Tensor>& bias, int64_t N) {
  check(fn, x, "x", at::kFloat, 2);
  check(fn, weight, "weight", at::kBFloat16, 4);
  TORCH_CHECK(x.stride(1) == 1, fn, ": x's rows must be dense");
  TORCH_CHECK(weight.is_contiguous() && weight.size(2) == 16 && weight.size(3) == 32, fn,
              ": weight must be contiguous (Np / 16, Kp / 32, 16, 32)");
  const int64_t M = x.size(0), K = x.size(1), nb = weight.size(0), kb = weight.size(1), Kp = kb * kTileK;
  TORCH_CHECK(kb == (K + kTileK - 1) / kTileK, fn, ": x has ", K, " inputs, the weight ", Kp, " (padded to 32)");
  TORCH_CHECK(N > 0 && nb == (N + kTileCols - 1) / kTileCols, fn, ": ", N, " outputs, the weight holds ",
              nb * kTileCols, " (padded to 16)");
  TORCH_CHECK(request_tiles(), fn, ": the operating system refused the AMX tile state");
  const float* bd = nullptr;
  if (bias.has_value() && bias->defined()) {
    check(fn, *bias, "bias", at::kFloat, 1);
    TORCH_CHECK(bias->is_contiguous() && bias->size(0) == N, fn, ": bias must be contiguous (", N, ",)");
    bd = bias->data_ptr<float>();
  }
  const int64_t Mp = (M + kTileRows - 1) / kTileRows * kTileRows;
  std::vector<uint16_t> xb(static_cast<size_t>(Mp * Kp), 0);
  const float* xd = x.data_ptr<float>();
  for (int64_t m = 0; m < M; ++m) round_row(xd + m * x.stride(0), K, xb.data() + m * Kp);
  return {std::move(xb), reinterpret_cast<const uint16_t*>(weight.data_ptr<at::BFloat16>()), bd, M, Mp, Kp, nb};
}

constexpr int64_t kChunk = 8;  // pairs of output tiles (256 outputs) a thread takes at a time

}  // namespace

// x: (M, K) float32 with dense rows; weight: from amx_bf16_pack; bias: (N,) float32 or None; residual: (M, N)
// float32 with dense rows or None. Returns (M, N) float32.
torch::Tensor amx_bf16_linear(const torch::Tensor& x, const torch::Tensor& weight,
                              const c10::optional<torch::Tensor>& bias, const c10::optional<torch::Tensor>& residual,
                              bool relu, int64_t N) {
  const char* fn = "amx_bf16_linear";
  Inputs in = prepare(fn, x, weight, bias, N);
  const int64_t M = in.M, Mp = in.Mp, nb = in.nb;
  const float* rd = nullptr;
  int64_t res_row = 0;
  if (residual.has_value() && residual->defined()) {
    check(fn, *residual, "residual", at::kFloat, 2);
    TORCH_CHECK(residual->size(0) == M && residual->size(1) == N && residual->stride(1) == 1,
                fn, ": residual must be (", M, ", ", N, ") with dense rows, got ", residual->sizes());
    rd = residual->data_ptr<float>();
    res_row = residual->stride(0);
  }
  auto y = torch::empty({M, N}, x.options());
  if (M == 0) return y;
  const Product p{in.xb.data(), in.w, in.bias, rd, y.data_ptr<float>(), M, N, in.Kp, res_row, relu, N};
  // the threads take chunks of 8 pairs of output tiles (256 outputs); in a chunk the row pairs are the outer loop,
  // so that a row pair's bf16 values stay in L1 over the chunk and the chunk's weights in L2 over the rows
  const int64_t col_blocks = (nb + 1) / 2, row_blocks = (Mp / kTileRows + 1) / 2;
  const int64_t chunks = (col_blocks + kChunk - 1) / kChunk;
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 21) / std::max<int64_t>(1, Mp * in.Kp * 32 * kChunk));
  at::parallel_for(0, chunks, grain, [&](int64_t begin, int64_t end) {
    configure_tiles();
    for (int64_t h = begin; h < end; ++h) {
      const int64_t c_end = std::min(col_blocks, (h + 1) * kChunk);
      for (int64_t r = 0; r < row_blocks; ++r) {
        const int64_t m0 = r * 2 * kTileRows;
        for (int64_t c = h * kChunk; c < c_end; ++c) any_block(p, m0, c * 2 * kTileCols, Mp, nb);
      }
    }
    _tile_release();
  });
  return y;
}

// What a beam search needs of the logits y = x W^T + b (amx_bf16_linear's, of the pre-softmax projection) without
// writing them: for each row its logsumexp (of every logit), then its k largest logits with the ids in excluded
// left out, and their ids: (normalisers (M,), values (M, k), indices (M, k)), as decoding.cpp's row_candidates
// gives them from the written logits (the same values and ids; the normaliser up to the order of summation).
//
// Why: for a small model the logits are most of a step's memory traffic (128 rows x 8,000 pieces: 4 MB written by
// the product, read again by row_candidates). Here each row pair's 256 logits of a chunk go through a 32 KB buffer
// in L1: their max and sum of exponentials update the row's running logsumexp (rescaled when the max grows), and
// the values above the row's k-th best so far enter its top k (vecmath.h's RowCandidates, fed in the order of the
// ids; amx_tiles.h's candidates_pass, shared with int8.cpp's int8_amx_candidates).
std::vector<torch::Tensor> amx_bf16_candidates(const torch::Tensor& x, const torch::Tensor& weight,
                                               const c10::optional<torch::Tensor>& bias, int64_t N, int64_t k,
                                               const torch::Tensor& excluded) {
  const char* fn = "amx_bf16_candidates";
  Inputs in = prepare(fn, x, weight, bias, N);
  TORCH_CHECK(k >= 1 && k <= N, fn, ": need 1 <= k <= outputs, got k=", k, ", outputs=", N);
  const std::vector<int64_t> skip = transduce_amx::excluded_ids(fn, excluded, N);
  const int64_t M = in.M;
  auto normalisers = torch::empty({M}, x.options());
  auto values = torch::empty({M, k}, x.options());
  auto indices = torch::empty({M, k}, x.options().dtype(at::kLong));
  if (M == 0) return {normalisers, values, indices};
  const Product p{in.xb.data(), in.w, in.bias, nullptr, nullptr, M, N, in.Kp, 0, false, 0};
  transduce_amx::candidates_pass(
      M, in.Mp, N, (in.nb + 1) / 2, k, skip, normalisers.data_ptr<float>(), values.data_ptr<float>(),
      indices.data_ptr<int64_t>(), [&](float* buffer, int64_t width, int64_t m0, int64_t n_start, int64_t c) {
        any_block(transduce_amx::into_buffer(p, buffer, width, m0, n_start), m0, c * 2 * kTileCols, in.Mp, in.nb);
      });
  return {normalisers, values, indices};
}

void register_amx(pybind11::module_& m) {
  using release = pybind11::call_guard<pybind11::gil_scoped_release>;
  m.def("amx_available", &amx_available, "whether this process may use the AMX tiles");
  m.def("amx_bf16_pack", &amx_bf16_pack, "a bf16 weight (N, K) in the AMX tiles' layout", pybind11::arg("weight"));
  m.def("amx_bf16_linear", &amx_bf16_linear, "x W^T + b with x rounded to bf16, summed in float32 in AMX tiles",
        pybind11::arg("x"), pybind11::arg("weight"), pybind11::arg("bias"), pybind11::arg("residual"),
        pybind11::arg("relu"), pybind11::arg("outputs"), release());
  m.def("amx_bf16_candidates", &amx_bf16_candidates,
        "amx_bf16_linear's logits, each row's logsumexp and top k (excluded ids left out), without writing them",
        pybind11::arg("x"), pybind11::arg("weight"), pybind11::arg("bias"), pybind11::arg("outputs"),
        pybind11::arg("k"), pybind11::arg("excluded"), release());
}
#else
void register_amx(pybind11::module_&) {}  // no AMX-BF16: bf16.py multiplies through oneDNN or F.linear
#endif
