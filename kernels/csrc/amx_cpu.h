// AMX tiles (Intel Xeons from Sapphire Rapids): whether this process may use them, and a tile
// configuration held for a scope. Used by the bf16 attention blocks (bf16_dot_cpu.h) and the bf16
// decode-rows GEMM (decode_gemm_cpu.cpp). VLSERVE_AMX is defined where the build targets AMX-BF16
// (-march=native on such a CPU); usable() says whether the OS grants the tile state at run time.
#pragma once

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#define VLSERVE_AMX 1
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>

namespace vlserve_amx {

// Linux gives a process the tile registers' state only when asked (arch_prctl ARCH_REQ_XCOMP_PERM
// for XTILEDATA); asked once per process. False: the kernel refused (or predates AMX).
inline bool usable() {
  static const bool granted = [] {
    constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return granted;
}

struct TileShape {
  int rows = 0;   // 1..16; 0: the tile is not configured
  int bytes = 0;  // per row, 4..64
};

// Tiles 0-7 configured as `shapes` for the scope's life (palette 1), released after: a released
// thread costs the OS nothing to save on a context switch, and other code on the thread (oneDNN)
// loads its own configuration, so every scope loads ours again.
class Scope {
 public:
  explicit Scope(const TileShape (&shapes)[8]) {
    alignas(64) uint8_t config[64] = {};
    config[0] = 1;
    for (int t = 0; t < 8; ++t) {
      config[16 + 2 * t] = static_cast<uint8_t>(shapes[t].bytes);  // colsb[t], uint16 little-endian
      config[48 + t] = static_cast<uint8_t>(shapes[t].rows);
    }
    // GCC 12 does not see ldtilecfg read these bytes and may drop the stores above without this
    // (it did in quant_int8_cpu.cpp, whose constant shapes it folded: every tile left unconfigured)
    __asm__ volatile("" : : "r"(config) : "memory");
    _tile_loadconfig(config);
  }
  ~Scope() { _tile_release(); }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;
};

}  // namespace vlserve_amx
#endif
