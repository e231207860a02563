// AMX tiles (Intel Xeons from Sapphire Rapids): whether this process may use them, and a tile
// configuration held for a scope. Used by the bf16 attention blocks (bf16_dot_cpu.h), the bf16
// decode-rows GEMM (decode_gemm_cpu.cpp) and the int8 GEMM (quant_int8_cpu.cpp).
// - VLSERVE_AMX_TILES: the compiler knows the tile intrinsics (GCC 11, Clang 12), so Scope exists; its
//   functions carry their own target attribute, for files built without -march=native.
// - VLSERVE_AMX: the build targets AMX-BF16 (-march=native on such a CPU), for the bf16 code.
// usable() says whether the OS grants the tile state at run time.
#pragma once

#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>

namespace vlserve_amx {

// Linux gives a process the tile registers' state only when asked (arch_prctl ARCH_REQ_XCOMP_PERM
// for XTILEDATA); asked once per process. False: the kernel refused (or predates AMX, or the CPU has none).
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

}  // namespace vlserve_amx

#if defined(__x86_64__) && ((defined(__clang__) && __clang_major__ >= 12) || \
                            (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 11))
#define VLSERVE_AMX_TILES 1
#include <immintrin.h>

namespace vlserve_amx {

// Tiles 0-7 configured as `shapes` for the scope's life (palette 1), released after: a released
// thread costs the OS nothing to save on a context switch, and other code on the thread (oneDNN)
// loads its own configuration, so every scope loads ours again.
class Scope {
 public:
  __attribute__((target("amx-tile"))) explicit Scope(const TileShape (&shapes)[8]) {
    alignas(64) uint8_t config[64] = {};
    config[0] = 1;
    for (int t = 0; t < 8; ++t) {
      config[16 + 2 * t] = static_cast<uint8_t>(shapes[t].bytes);  // colsb[t], uint16 little-endian
      config[48 + t] = static_cast<uint8_t>(shapes[t].rows);
    }
    // GCC 12 does not see ldtilecfg read these bytes and drops the stores above without this where the
    // shapes are constants (the int8 GEMM's were: every tile left unconfigured, SIGILL at the first use)
    __asm__ volatile("" : : "r"(config) : "memory");
    _tile_loadconfig(config);
  }
  __attribute__((target("amx-tile"))) ~Scope() { _tile_release(); }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;
};

}  // namespace vlserve_amx
#endif

#if defined(VLSERVE_AMX_TILES) && defined(__AMX_TILE__) && defined(__AMX_BF16__)
#define VLSERVE_AMX 1
#endif
