// What transduce's two AMX products (amx.cpp's bf16, int8.cpp's int8) share: asking the operating system for the
// tiles' state, and one tile configuration. Included only where the compiler targets AMX.
#pragma once

#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>

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

}  // namespace transduce_amx
