// What transduce's two AMX products (amx.cpp's bf16, int8.cpp's int8) share: asking the operating system for the
// tiles' state, one tile configuration, and the pass that reduces a pre-softmax projection's logits to a beam
// step's candidates as it makes them. Included only where the compiler targets AMX, after torch/extension.h,
// ATen/Parallel.h and vecmath.h.
#pragma once

#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace transduce_amx {

// Linux gives a process the AMX tile state only on request (arch_prctl ARCH_REQ_XCOMP_PERM for XTILEDATA);
// PyTorch and oneDNN ask the same way, and asking twice is harmless. Asked once per process.
inline bool request_tiles() {
  static const bool granted = [] {
    constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return granted;
}

struct alignas(64) TileConfig {
  uint8_t palette_id = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Every one of the eight tiles 16 rows of 64 bytes (both products: tiles 0-3 the accumulators, 4 and 5 the rows,
// 6 and 7 the weight), for the calling thread.
inline void configure_tiles() {
  TileConfig config;
  for (int t = 0; t < 8; ++t) {
    config.colsb[t] = 64;
    config.rows[t] = 16;
  }
  _tile_loadconfig(&config);
}

// The excluded ids of a candidates pass, checked to lie in [0, N) and sorted (fn names the function in messages).
inline std::vector<int64_t> excluded_ids(const char* fn, const torch::Tensor& excluded, int64_t N) {
  TORCH_CHECK(excluded.dim() == 1 && excluded.scalar_type() == at::kLong && excluded.device().is_cpu(), fn,
              ": excluded must be a 1-D int64 CPU tensor");
  const auto ids = excluded.contiguous();
  std::vector<int64_t> skip(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + ids.size(0));
  for (const int64_t e : skip) TORCH_CHECK(e >= 0 && e < N, fn, ": excluded id ", e, " is out of range for ", N);
  std::sort(skip.begin(), skip.end());
  return skip;
}

// A product p (amx.cpp's or int8.cpp's Product) writing its output into a candidates pass's buffer: rows from m0 and
// outputs from n_start, width floats a row.
template <typename Product>
Product into_buffer(Product p, float* buffer, int64_t width, int64_t m0, int64_t n_start) {
  p.y = buffer;
  p.y_row = width;
  p.y_m0 = m0;
  p.y_n0 = n_start;
  return p;
}

// The pass both AMX products' candidates functions make (amx.cpp's bf16, int8.cpp's int8): the threads take pairs
// of 16-row blocks (each row's RowCandidates stays with one thread); for each chunk of 8 pairs of output tiles (256
// outputs, in the order of the ids), pair(buffer, width, m0, n_start, c) writes the logits of rows m0 .. m0 + 32 and
// the outputs of tile pair c into buffer (row m at (m - m0) * width, output n at n - n_start), and each row's state
// takes them from there. M rows (Mp padded to 16), N outputs in `pairs` tile pairs; the results go to nd (M,),
// vd (M, k) and id (M, k).
template <typename Pair>
void candidates_pass(int64_t M, int64_t Mp, int64_t N, int64_t pairs, int64_t k, const std::vector<int64_t>& skip,
                     float* nd, float* vd, int64_t* id, const Pair& pair) {
  constexpr int64_t kChunkPairs = 8, kRows = 32, width = kChunkPairs * 32;
  const int64_t row_blocks = (Mp / 16 + 1) / 2;
  at::parallel_for(0, row_blocks, 1, [&](int64_t begin, int64_t end) {
    configure_tiles();
    const int64_t first = begin * kRows, rows = std::min(M, end * kRows) - first;
    std::vector<float> buffer(static_cast<size_t>(kRows * width));
    std::vector<RowCandidates> state;
    for (int64_t m = first; m < first + rows; ++m) state.push_back(RowCandidates{RowTopK{vd + m * k, id + m * k, k}});
    for (int64_t c0 = 0; c0 < pairs; c0 += kChunkPairs) {
      const int64_t n_start = c0 * 32, count = std::min(width, N - n_start);
      const auto first_skip = std::lower_bound(skip.begin(), skip.end(), n_start);
      const int64_t* skip_begin = skip.data() + (first_skip - skip.begin());
      const int64_t* skip_end = skip.data() + (std::lower_bound(first_skip, skip.end(), n_start + count) - skip.begin());
      for (int64_t r = begin; r < end; ++r) {
        const int64_t m0 = r * kRows;
        for (int64_t c = c0; c < std::min(pairs, c0 + kChunkPairs); ++c) pair(buffer.data(), width, m0, n_start, c);
        for (int64_t m = m0; m < std::min(M, m0 + kRows); ++m)
          state[m - first].feed(buffer.data() + (m - m0) * width, count, n_start, skip_begin, skip_end);
      }
    }
    for (int64_t i = 0; i < rows; ++i) nd[first + i] = state[i].normaliser();
    _tile_release();
  });
}

}  // namespace transduce_amx
