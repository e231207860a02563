// W8A8 int8 GEMM: y[M, N] = (xq[M, K] · wq[N, K]^T) · x_scale[m] · w_scale[n] (+ bias[n]), the integer
// sums exact in int32, then one fp32 epilogue. x is quantized per row (per token) at run time,
// symmetric, as compressed-tensors does it: scale = max|x| / 127.5, q = round-half-even(x / scale)
// clamped to [-128, 127] (quantize_rows).
//
// The weight is packed once (pack_int8) so that 64 bytes are 16 output columns at one step of four
// K elements: packed[block][step][column][4], K zero padded to a multiple of 4, N to a multiple of 16.
// Two paths, chosen at run time by the CPU's flags (the file is built for AVX2; the AVX-512 functions
// carry a target attribute):
// - AVX512-VNNI: vpdpbusd multiplies 64 unsigned bytes by 64 signed bytes and adds each four
//   products into one int32 lane. Activations are signed, so each broadcast x word is XORed with
//   0x80808080 (q + 128, as u8) and the surplus 128 · Σ_k w[n][k] (comp, computed at packing) is
//   taken off the sums. Register tile by the call's rows (vnni_tile): 6 rows x 4 column blocks up to
//   6 rows, 8 rows x 3 blocks from 7 (24 accumulators of 32 registers either way).
// - AVX2: each 8-column half of a block's step (32 bytes) is sign-extended to int16 and multiplied
//   by x's four int16 values with vpmaddwd (exact: no saturation, unlike vpmaddubsw), two int32
//   lanes per column folded at the end. Register block: 4 rows x 8 columns.
// - AMX (Intel Xeons from Sapphire Rapids; K a multiple of 64): the packed weight's 16 steps of one block
//   are one 16 x 64-byte tile as tdpbssd reads it, signed x signed (no q + 128, no comp); the rows go
//   in tiles of 16 (a copy padded with zero rows), 32 rows x 2 blocks a pass (tiles 0-3 the sums,
//   4-5 the rows, 6-7 the weights). Chosen from kAmxMinRows rows (below, VNNI is as fast: the weights'
//   stream is the bound).
// Threads split the column groups (the tile's blocks; 4 on AVX2; 2 on AMX); within one, row blocks pass over the
// group's weights (48-64 x K bytes, held in L2). A group's first pass fetches its own lines ahead into
// L1, 1 KB on the 6-row tile, 2 KB on the 8-row one (the hardware prefetcher alone ran 1-8 rows ~20%
// slower). Where there are two passes or
// more, they also fetch the thread's next group into L2 (Ahead), spread over the passes, so that its
// first pass finds it there (as decode_gemm_cpu.cpp does for bf16).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <immintrin.h>

#include <cpuid.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "amx_cpu.h"

#define VLSERVE_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))
#define VLSERVE_AVX2 __attribute__((target("avx2,fma")))
// The AMX path needs a compiler that knows its intrinsics (VLSERVE_AMX_TILES, amx_cpu.h); built
// without one, the CPU's AMX goes unused and VNNI runs every row count.
#ifdef VLSERVE_AMX_TILES
#define VLSERVE_AMX_INT8 \
  __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))
#endif

namespace {

constexpr int64_t kCols = 16;       // output columns per packed block
constexpr int64_t kGroupBlocks = 4;  // blocks per thread task on AVX2 (64 columns)
// a first pass fetches its blocks' lines this many steps ahead: 1 KB on the 6-row tile, 2 KB on the 8-row
// one, whose 8 rows take longer over each line (measured: 1 KB ahead 4% slower at 8 rows, 2 KB 1% slower
// at 1 row)
constexpr int64_t stream_steps(int rows) { return rows > 6 ? 32 : 16; }
constexpr int kIsaAvx2 = 1, kIsaVnni = 2, kIsaAmx = 3;
constexpr int64_t kAmxSteps = 16;       // K steps (of four) in one tile: 64 bytes of a row
constexpr int64_t kAmxGroupBlocks = 2;  // blocks per thread task on AMX (32 columns: tiles 6-7)
// The automatic choice takes AMX from this many rows: up to 8 the VNNI tile is one pass over streamed
// weights and level or faster (a Xeon with AMX, 2 threads, 1536 x 4096: 111 against 127 us at 8 rows),
// from 9 it takes two passes (16 rows: 186 against 128 us; 32 rows 322 against 142).
constexpr int64_t kAmxMinRows = 9;

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

bool has_vnni() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vnni");
}

bool has_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

// AMX-INT8 (CPUID 7.0 EDX bit 25) and the tile state granted to this process (vlserve_amx::usable).
bool has_amx_int8() {
#ifdef VLSERVE_AMX_TILES
  static const bool flag = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __get_cpuid_count(7, 0, &a, &b, &c, &d) && ((d >> 25) & 1);
  }();
  return flag && vlserve_amx::usable() && has_vnni();
#else
  return false;
#endif
}

// The best path here: 3 (AMX, with VNNI for decode rows), 2 (AVX512-VNNI), 1 (AVX2), 0 (none: the
// PyTorch reference runs).
int64_t int8_isa() { return has_amx_int8() ? kIsaAmx : has_vnni() ? kIsaVnni : has_avx2() ? kIsaAvx2 : 0; }

int resolve_isa(int64_t requested) {
  const int64_t best = int8_isa();
  const int64_t isa = requested < 0 ? best : requested;
  TORCH_CHECK(isa == kIsaAmx || isa == kIsaVnni || isa == kIsaAvx2, "int8 GEMM: no path for isa ", isa);
  TORCH_CHECK(isa <= best || (isa == kIsaAvx2 && has_avx2()), "int8 GEMM: this CPU lacks the flags for isa ", isa);
  return static_cast<int>(isa);
}

// The path one call takes: AMX needs K in whole tiles (64 bytes); left to choose (requested < 0), rows
// under kAmxMinRows go to VNNI.
int call_isa(int64_t requested, int64_t M, int64_t steps) {
  const int isa = resolve_isa(requested);
  if (isa != kIsaAmx) return isa;
  if (steps % kAmxSteps != 0 || (requested < 0 && M < kAmxMinRows)) return kIsaVnni;
  return kIsaAmx;
}

// w [N, K] int8 -> (packed [N/16, K/4, 16, 4] int8, comp [N/16 * 16] int32 = 128 · Σ_k w[n][k]).
std::tuple<at::Tensor, at::Tensor> pack_int8(const at::Tensor& w_in) {
  TORCH_CHECK(w_in.dim() == 2 && w_in.scalar_type() == at::kChar, "pack_int8: need a 2-D int8 weight, got ",
              w_in.sizes(), " ", w_in.scalar_type());
  const at::Tensor w = w_in.contiguous();
  const int64_t N = w.size(0), K = w.size(1);
  const int64_t blocks = (N + kCols - 1) / kCols, steps = round_up(K, 4) / 4;
  at::Tensor packed = at::zeros({blocks, steps, kCols, 4}, w.options());
  at::Tensor comp = at::zeros({blocks * kCols}, w.options().dtype(at::kInt));
  const int8_t* src = w.data_ptr<int8_t>();
  int8_t* dst = packed.data_ptr<int8_t>();
  int32_t* cs = comp.data_ptr<int32_t>();
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      for (int64_t c = 0; c < kCols && b * kCols + c < N; ++c) {
        const int8_t* row = src + (b * kCols + c) * K;
        int32_t sum = 0;
        for (int64_t k = 0; k < K; ++k) {
          dst[((b * steps + k / 4) * kCols + c) * 4 + k % 4] = row[k];
          sum += row[k];
        }
        cs[b * kCols + c] = 128 * sum;
      }
    }
  });
  return {packed, comp};
}

// One row (fp32 or bf16): its scale, and q written to out[0, K).
template <typename T>
float quantize_row_scalar(const T* row, int64_t K, int8_t* out) {
  float amax = 0.f;
  for (int64_t k = 0; k < K; ++k) amax = std::max(amax, std::fabs(static_cast<float>(row[k])));
  // compressed-tensors: the scale never below fp32's epsilon, so an all-zero row quantizes to zeros
  const float s = std::max(amax / 127.5f, 1.1920928955078125e-07f);
  for (int64_t k = 0; k < K; ++k) {
    const float v = std::nearbyint(static_cast<float>(row[k]) / s);  // the default rounding mode: half to even
    out[k] = static_cast<int8_t>(std::min(127.f, std::max(-128.f, v)));
  }
  return s;
}

VLSERVE_VNNI inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }

VLSERVE_VNNI inline __m512 load16(const at::BFloat16* p) {  // bf16 is the top half of an fp32
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

template <typename T>
VLSERVE_VNNI float quantize_row_512(const T* row, int64_t K, int8_t* out) {
  __m512 vmax = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) vmax = _mm512_max_ps(vmax, _mm512_abs_ps(load16(row + k)));
  float amax = _mm512_reduce_max_ps(vmax);
  for (int64_t t = k; t < K; ++t) amax = std::max(amax, std::fabs(static_cast<float>(row[t])));
  const float s = std::max(amax / 127.5f, 1.1920928955078125e-07f);
  const __m512 sv = _mm512_set1_ps(s), lo = _mm512_set1_ps(-128.f), hi = _mm512_set1_ps(127.f);
  for (k = 0; k + 16 <= K; k += 16) {
    __m512 v = _mm512_div_ps(load16(row + k), sv);  // x / scale, as compressed-tensors divides
    v = _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);  // half to even
    v = _mm512_min_ps(_mm512_max_ps(v, lo), hi);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + k), _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(v)));
  }
  for (; k < K; ++k)
    out[k] = static_cast<int8_t>(std::min(127.f, std::max(-128.f, std::nearbyint(static_cast<float>(row[k]) / s))));
  return s;
}

template <typename T>
void quantize_into(const T* xs, int64_t M, int64_t K, int64_t Kp, int8_t* qs, float* ss) {
  const bool vnni = has_vnni();
  at::parallel_for(0, M, 16, [&](int64_t begin, int64_t end) {
    for (int64_t m = begin; m < end; ++m)
      ss[m] = vnni ? quantize_row_512(xs + m * K, K, qs + m * Kp) : quantize_row_scalar(xs + m * K, K, qs + m * Kp);
  });
}

// x [M, K] fp32 or bf16 (others widened to fp32) -> (q [M, round_up(K, 4)] int8, zero padded; scale [M] fp32).
std::tuple<at::Tensor, at::Tensor> quantize_rows(const at::Tensor& x_in) {
  TORCH_CHECK(x_in.dim() == 2, "quantize_rows: need [M, K], got ", x_in.sizes());
  const at::Tensor x = x_in.scalar_type() == at::kBFloat16 ? x_in.contiguous() : x_in.to(at::kFloat).contiguous();
  const int64_t M = x.size(0), K = x.size(1), Kp = round_up(K, 4);
  at::Tensor q = Kp == K ? at::empty({M, Kp}, x.options().dtype(at::kChar))  // every byte written
                         : at::zeros({M, Kp}, x.options().dtype(at::kChar));  // the padding stays 0
  at::Tensor scale = at::empty({M}, x.options().dtype(at::kFloat));
  if (x.scalar_type() == at::kBFloat16) {
    quantize_into(x.data_ptr<at::BFloat16>(), M, K, Kp, q.data_ptr<int8_t>(), scale.data_ptr<float>());
  } else {
    quantize_into(x.data_ptr<float>(), M, K, Kp, q.data_ptr<int8_t>(), scale.data_ptr<float>());
  }
  return {q, scale};
}

// Where a block of int32 sums goes: the raw sums, or the fp32 epilogue.
struct Out {
  int32_t* raw = nullptr;  // [M, N] int32
  float* y = nullptr;      // [M, N] fp32
  at::BFloat16* y16 = nullptr;  // or [M, N] bf16 (rounded to nearest even)
  const float* x_scale = nullptr;
  const float* w_scale = nullptr;
  const float* bias = nullptr;
  int64_t N = 0;

  // 16 (or fewer, at N's edge) sums of row m from column n0
  void store(int64_t m, int64_t n0, const int32_t* sums) const {
    const int64_t n = std::min<int64_t>(kCols, N - n0);
    for (int64_t c = 0; c < n; ++c) {
      if (raw) {
        raw[m * N + n0 + c] = sums[c];
      } else {
        float v = static_cast<float>(sums[c]) * (x_scale[m] * w_scale[n0 + c]);
        v = bias ? v + bias[n0 + c] : v;
        if (y16) {
          y16[m * N + n0 + c] = at::BFloat16(v);
        } else {
          y[m * N + n0 + c] = v;
        }
      }
    }
  }
};

// rows x C blocks of sums from column block b0, less comp (the VNNI path's 128 · Σ w; null: nothing to
// take off) -> out
template <int C>
VLSERVE_VNNI void epilogue_512(const int32_t (*res)[C][kCols], int rows, const int32_t* comp, int64_t m0,
                                int64_t b0, const Out& out) {
  alignas(64) int32_t sums[kCols];
  for (int c = 0; c < C; ++c) {
    const int64_t n0 = (b0 + c) * kCols;
    const __m512i cv = comp ? _mm512_loadu_si512(comp + n0) : _mm512_setzero_si512();
    const __mmask16 edge = static_cast<__mmask16>((1u << std::min<int64_t>(kCols, out.N - n0)) - 1);
    const bool scaled = out.y || out.y16;
    const __m512 ws = scaled ? _mm512_maskz_loadu_ps(edge, out.w_scale + n0) : _mm512_setzero_ps();
    const __m512 bias = out.bias ? _mm512_maskz_loadu_ps(edge, out.bias + n0) : _mm512_setzero_ps();
    for (int r = 0; r < rows; ++r) {
      const __m512i v = _mm512_sub_epi32(_mm512_load_si512(res[r][c]), cv);
      if (scaled) {  // the fp32 epilogue: sums · x_scale · w_scale + bias
        const __m512 scale = _mm512_mul_ps(_mm512_set1_ps(out.x_scale[m0 + r]), ws);
        const __m512 y = _mm512_fmadd_ps(_mm512_cvtepi32_ps(v), scale, bias);
        if (out.y) {
          _mm512_mask_storeu_ps(out.y + (m0 + r) * out.N + n0, edge, y);
        } else {  // bf16, rounded to nearest even
          const __m512i bits = _mm512_castps_si512(y);
          const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
          const __m512i rounded =
              _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(bits, lsb), _mm512_set1_epi32(0x7FFF)), 16);
          _mm256_mask_storeu_epi16(out.y16 + (m0 + r) * out.N + n0, edge, _mm512_cvtepi32_epi16(rounded));
        }
      } else {
        _mm512_store_si512(sums, v);
        out.store(m0 + r, n0, sums);
      }
    }
  }
}

// The next column group's weights, fetched into L2 while this group's row blocks run: pass `pass` of
// `passes` fetches its blocks' lines at the steps s with s % passes == pass (all of them over the passes).
struct Ahead {
  const int8_t* next = nullptr;  // the next group's first block (blocks follow each other, steps x 64 bytes)
  int64_t blocks = 0;
  int64_t pass = 0;
  int64_t passes = 1;
};

template <int R, int C>
VLSERVE_VNNI void block_vnni(const uint8_t* xu, int64_t ldx, const int8_t* packed, const int32_t* comp,
                             int64_t steps, int64_t m0, int64_t b0, const Out& out, const Ahead& ahead) {
  __m512i acc[R][C];
  _Pragma("GCC unroll 8") for (int r = 0; r < R; ++r)
    _Pragma("GCC unroll 8") for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_si512();
  const int8_t* w0 = packed + b0 * steps * 64;
  int64_t fetch = ahead.next != nullptr ? ahead.pass : steps;
  const bool stream = ahead.pass == 0;
  for (int64_t s = 0; s < steps; ++s) {
    if (s == fetch) {
      for (int64_t c = 0; c < ahead.blocks; ++c)
        _mm_prefetch(reinterpret_cast<const char*>(ahead.next + (c * steps + s) * 64), _MM_HINT_T1);
      fetch += ahead.passes;
    }
    if (stream) {
      _Pragma("GCC unroll 8") for (int c = 0; c < C; ++c)
        _mm_prefetch(reinterpret_cast<const char*>(w0 + (c * steps + s + stream_steps(R)) * 64), _MM_HINT_T0);
    }
    __m512i w[C];
    _Pragma("GCC unroll 8") for (int c = 0; c < C; ++c) w[c] = _mm512_loadu_si512(w0 + (c * steps + s) * 64);
    _Pragma("GCC unroll 8") for (int r = 0; r < R; ++r) {
      int32_t word;
      std::memcpy(&word, xu + (m0 + r) * ldx + 4 * s, 4);  // four activations as u8 (q + 128)
      const __m512i x = _mm512_set1_epi32(word);
      _Pragma("GCC unroll 8") for (int c = 0; c < C; ++c) acc[r][c] = _mm512_dpbusd_epi32(acc[r][c], x, w[c]);
    }
  }
  // the sums leave the registers before the epilogue, whose calls would otherwise make the compiler
  // keep the accumulators in memory through the whole loop
  alignas(64) int32_t res[R][C][kCols];
  _Pragma("GCC unroll 8") for (int r = 0; r < R; ++r)
    _Pragma("GCC unroll 8") for (int c = 0; c < C; ++c) _mm512_store_si512(res[r][c], acc[r][c]);
  epilogue_512<C>(res, R, comp, m0, b0, out);
}

#ifdef VLSERVE_AMX_TILES
// The tiles of a thread's task, all 16 rows x 64 bytes: 0-3 16 x 16 int32 sums; 4-5 16 rows of 64
// activations; 6-7 16 steps of one block's 16 columns x 4.
constexpr vlserve_amx::TileShape kInt8Tiles[8] = {{16, 64}, {16, 64}, {16, 64}, {16, 64},
                                                   {16, 64}, {16, 64}, {16, 64}, {16, 64}};

// Rows m0 .. m0 + 16·RT of xa (padded: every tile's 16 rows exist) against blocks b0 .. b0 + C, the sums
// of the first `rows` rows to out.
template <int RT, int C>
VLSERVE_AMX_INT8 void block_amx(const int8_t* xa, int64_t ldx, const int8_t* packed, int64_t steps, int64_t m0,
                                int64_t b0, int rows, const Out& out) {
  static_assert((RT == 1 || RT == 2) && (C == 1 || C == 2), "two row tiles and two weight tiles at most");
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  const int8_t* w0 = packed + b0 * steps * 64;
  const int8_t* x0 = xa + m0 * ldx;
  for (int64_t s = 0; s < steps; s += kAmxSteps) {
    _tile_loadd(6, w0 + s * 64, 64);
    if (C > 1) _tile_loadd(7, w0 + (steps + s) * 64, 64);
    _tile_loadd(4, x0 + 4 * s, ldx);
    _tile_dpbssd(0, 4, 6);
    if (C > 1) _tile_dpbssd(1, 4, 7);
    if (RT > 1) {
      _tile_loadd(5, x0 + 16 * ldx + 4 * s, ldx);
      _tile_dpbssd(2, 5, 6);
      if (C > 1) _tile_dpbssd(3, 5, 7);
    }
  }
  alignas(64) int32_t res[16 * RT][C][kCols];
  constexpr int64_t stride = C * kCols * 4;
  _tile_stored(0, &res[0][0][0], stride);
  if (C > 1) _tile_stored(1, &res[0][1][0], stride);
  if (RT > 1) {
    _tile_stored(2, &res[16][0][0], stride);
    if (C > 1) _tile_stored(3, &res[16][1][0], stride);
  }
  epilogue_512<C>(res, rows, nullptr, m0, b0, out);
}

// Every row of one column group (nb blocks, 1 or 2) on AMX: 32 rows a pass, the last 16 alone.
void amx_group(const int8_t* xa, int64_t M, int64_t ldx, const int8_t* packed, int64_t steps, int64_t b0,
               int64_t nb, const Out& out) {
  for (int64_t m = 0; m < M; m += 32) {
    const int rows = static_cast<int>(std::min<int64_t>(32, M - m));
    if (rows > 16) {
      nb == 2 ? block_amx<2, 2>(xa, ldx, packed, steps, m, b0, rows, out)
              : block_amx<2, 1>(xa, ldx, packed, steps, m, b0, rows, out);
    } else {
      nb == 2 ? block_amx<1, 2>(xa, ldx, packed, steps, m, b0, rows, out)
              : block_amx<1, 1>(xa, ldx, packed, steps, m, b0, rows, out);
    }
  }
}

#endif  // VLSERVE_AMX_TILES

template <int R>
VLSERVE_AVX2 void half_block_avx2(const int8_t* xq, int64_t ldx, const int8_t* packed, int64_t steps, int64_t m0,
                                  int64_t b, int half, int32_t (*sums)[kCols]) {
  __m256i lo[R], hi[R];
  for (int r = 0; r < R; ++r) lo[r] = hi[r] = _mm256_setzero_si256();
  const int8_t* w0 = packed + b * steps * 64 + half * 32;
  for (int64_t s = 0; s < steps; ++s) {
    const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w0 + s * 64));
    const __m256i wl = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(w));       // columns 0-3, k 0-3
    const __m256i wh = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(w, 1));  // columns 4-7
    for (int r = 0; r < R; ++r) {
      int32_t word;
      std::memcpy(&word, xq + (m0 + r) * ldx + 4 * s, 4);
      const __m128i x16 = _mm_cvtepi8_epi16(_mm_cvtsi32_si128(word));
      const __m256i x = _mm256_set1_epi64x(_mm_cvtsi128_si64(x16));
      lo[r] = _mm256_add_epi32(lo[r], _mm256_madd_epi16(wl, x));
      hi[r] = _mm256_add_epi32(hi[r], _mm256_madd_epi16(wh, x));
    }
  }
  const __m256i order = _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7);
  for (int r = 0; r < R; ++r) {
    const __m256i folded = _mm256_permutevar8x32_epi32(_mm256_hadd_epi32(lo[r], hi[r]), order);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(sums[r] + half * 8), folded);
  }
}

template <int R>
VLSERVE_AVX2 void block_avx2(const int8_t* xq, int64_t ldx, const int8_t* packed, int64_t steps, int64_t m0,
                             int64_t b, const Out& out) {
  int32_t sums[R][kCols];
  half_block_avx2<R>(xq, ldx, packed, steps, m0, b, 0, sums);
  half_block_avx2<R>(xq, ldx, packed, steps, m0, b, 1, sums);
  for (int r = 0; r < R; ++r) out.store(m0 + r, b * kCols, sums[r]);
}

// The VNNI register tile: rows per pass and blocks (16 columns each) per column group, chosen by the
// call's rows. Up to 6 rows: 6 x 4 (24 accumulators). From 7 rows: 8 x 3, whose passes load each
// weight vector for 8 rows instead of 6, and 7-8 rows are one pass over the weights, not a 6-row pass
// from memory and a second from L2 (measured on Zen 5, 2 threads, the 32 int8 layers of
// QUANT_BENCH_SPEC's decode step: at 8 rows 4.67 ms against 6 x 4's 5.05, at 32 rows 8 x 3 by 12%).
struct VnniTile {
  int rows;
  int64_t blocks;
};

VnniTile vnni_tile(int64_t M) { return M <= 6 ? VnniTile{6, 4} : VnniTile{8, 3}; }

template <int R, int CMax>
void vnni_rows(const uint8_t* xq, int64_t ldx, const int8_t* packed, const int32_t* comp, int64_t steps, int64_t m0,
               int64_t b0, int64_t nb, const Out& out, const Ahead& ahead) {
  static_assert(CMax == 3 || CMax == 4, "column groups of 3 or 4 blocks");
  switch (nb) {
    case 1: return block_vnni<R, 1>(xq, ldx, packed, comp, steps, m0, b0, out, ahead);
    case 2: return block_vnni<R, 2>(xq, ldx, packed, comp, steps, m0, b0, out, ahead);
    case 3: return block_vnni<R, 3>(xq, ldx, packed, comp, steps, m0, b0, out, ahead);
    default: return block_vnni<R, CMax>(xq, ldx, packed, comp, steps, m0, b0, out, ahead);
  }
}

// Every row of one column group on VNNI, in passes of `Rows` rows (the last one shorter).
template <int Rows, int CMax>
void vnni_group(const uint8_t* xu, int64_t M, int64_t ldx, const int8_t* packed, const int32_t* comp, int64_t steps,
                int64_t b0, int64_t nb, int64_t next_nb, const Out& out) {
  Ahead ahead;
  ahead.passes = (M + Rows - 1) / Rows;
  if (ahead.passes >= 2 && next_nb > 0) {
    ahead.next = packed + (b0 + nb) * steps * 64;
    ahead.blocks = next_nb;
  }
  int64_t m = 0;
  for (; m + Rows <= M; m += Rows, ++ahead.pass)
    vnni_rows<Rows, CMax>(xu, ldx, packed, comp, steps, m, b0, nb, out, ahead);
  switch (M - m) {
    case 7: vnni_rows<std::min(7, Rows), CMax>(xu, ldx, packed, comp, steps, m, b0, nb, out, ahead); break;
    case 6: vnni_rows<std::min(6, Rows), CMax>(xu, ldx, packed, comp, steps, m, b0, nb, out, ahead); break;
    case 5: vnni_rows<5, CMax>(xu, ldx, packed, comp, steps, m, b0, nb, out, ahead); break;
    case 4: vnni_rows<4, CMax>(xu, ldx, packed, comp, steps, m, b0, nb, out, ahead); break;
    case 3: vnni_rows<3, CMax>(xu, ldx, packed, comp, steps, m, b0, nb, out, ahead); break;
    case 2: vnni_rows<2, CMax>(xu, ldx, packed, comp, steps, m, b0, nb, out, ahead); break;
    case 1: vnni_rows<1, CMax>(xu, ldx, packed, comp, steps, m, b0, nb, out, ahead); break;
    default: break;
  }
}

// One column group (blocks b0 .. b0 + nb) for every row; next_nb: the blocks of the group this thread
// runs next (0: none).
void column_group(int isa, const int8_t* xq, const uint8_t* xu, int64_t M, int64_t ldx, const int8_t* packed,
                  const int32_t* comp, int64_t steps, int64_t b0, int64_t nb, int64_t next_nb, const Out& out) {
  if (isa == kIsaVnni) {
    if (vnni_tile(M).rows == 8) {
      vnni_group<8, 3>(xu, M, ldx, packed, comp, steps, b0, nb, next_nb, out);
    } else {
      vnni_group<6, 4>(xu, M, ldx, packed, comp, steps, b0, nb, next_nb, out);
    }
    return;
  }
  for (int64_t b = b0; b < b0 + nb; ++b) {
    int64_t m = 0;
    for (; m + 4 <= M; m += 4) block_avx2<4>(xq, ldx, packed, steps, m, b, out);
    switch (M - m) {
      case 3: block_avx2<3>(xq, ldx, packed, steps, m, b, out); break;
      case 2: block_avx2<2>(xq, ldx, packed, steps, m, b, out); break;
      case 1: block_avx2<1>(xq, ldx, packed, steps, m, b, out); break;
      default: break;
    }
  }
}

// u[i] = q[i] + 128 as u8 (the sign bit flipped), 64 bytes at a time
VLSERVE_VNNI void flip_signs(const int8_t* q, int64_t n, uint8_t* u) {
  const __m512i sign = _mm512_set1_epi8(static_cast<char>(0x80));
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) _mm512_storeu_si512(u + i, _mm512_xor_si512(_mm512_loadu_si512(q + i), sign));
  for (; i < n; ++i) u[i] = static_cast<uint8_t>(q[i]) ^ 0x80u;
}

// xq's M rows as tiles read them: a copy with zero rows up to a multiple of 16
void pad_rows_to_tiles(const int8_t* x, int64_t M, int64_t K, std::vector<int8_t>& buf) {
  const size_t n = static_cast<size_t>((M + 15) / 16 * 16 * K);
  if (buf.size() < n) buf.resize(n);
  std::memcpy(buf.data(), x, static_cast<size_t>(M * K));
  std::memset(buf.data() + M * K, 0, n - static_cast<size_t>(M * K));
}

void run_gemm(int64_t requested_isa, const at::Tensor& xq, const at::Tensor& packed, const at::Tensor& comp,
              const Out& out) {
  TORCH_CHECK(xq.dim() == 2 && xq.scalar_type() == at::kChar && xq.is_contiguous(), "int8 GEMM: xq must be a "
              "contiguous [M, K/4*4] int8 tensor");
  TORCH_CHECK(packed.dim() == 4 && packed.size(2) == kCols && packed.size(3) == 4 && xq.size(1) == 4 * packed.size(1),
              "int8 GEMM: packed weight ", packed.sizes(), " does not fit activations ", xq.sizes());
  TORCH_CHECK(comp.numel() == packed.size(0) * kCols && out.N <= comp.numel(), "int8 GEMM: N / comp mismatch");
  const int64_t M = xq.size(0), steps = packed.size(1), blocks = (out.N + kCols - 1) / kCols;
  const int isa = call_isa(requested_isa, M, steps);
  const int64_t group_blocks = isa == kIsaAmx ? kAmxGroupBlocks : isa == kIsaVnni ? vnni_tile(M).blocks : kGroupBlocks;
  const int64_t groups = (blocks + group_blocks - 1) / group_blocks;
  const int8_t* x = xq.data_ptr<int8_t>();
  // the VNNI path reads the activations as u8, q + 128: the sign bit flipped, once per call; decode
  // rows into a buffer the calling thread keeps (no allocation per call), prefill rows into their own
  constexpr size_t kKeptBytes = size_t{1} << 20;
  static thread_local std::vector<uint8_t> kept;
  static thread_local std::vector<int8_t> kept_tiles;
  std::vector<uint8_t> own;
  std::vector<int8_t> own_tiles;
  uint8_t* xu = nullptr;
  [[maybe_unused]] const int8_t* xa = nullptr;  // AMX: the rows padded to whole tiles
  if (isa == kIsaAmx) {
    std::vector<int8_t>& buf = static_cast<size_t>(xq.numel()) <= kKeptBytes ? kept_tiles : own_tiles;
    pad_rows_to_tiles(x, M, xq.size(1), buf);
    xa = buf.data();
  } else if (isa == kIsaVnni) {
    const size_t n = static_cast<size_t>(xq.numel());
    std::vector<uint8_t>& buf = n <= kKeptBytes ? kept : own;
    if (buf.size() < n) buf.resize(n);
    xu = buf.data();
    flip_signs(x, xq.numel(), xu);
  }
  const int8_t* w = packed.data_ptr<int8_t>();
  const int32_t* c = comp.data_ptr<int32_t>();
#ifdef VLSERVE_AMX_TILES
  if (isa == kIsaAmx) {
    at::parallel_for(0, groups, 1, [&](int64_t begin, int64_t end) {
      const vlserve_amx::Scope tiles(kInt8Tiles);
      for (int64_t g = begin; g < end; ++g) {
        const int64_t b0 = g * group_blocks;
        amx_group(xa, M, xq.size(1), w, steps, b0, std::min(group_blocks, blocks - b0), out);
      }
    });
    return;
  }
#endif
  at::parallel_for(0, groups, 1, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) {
      const int64_t b0 = g * group_blocks, nb = std::min(group_blocks, blocks - b0);
      const int64_t next_nb = g + 1 < end ? std::min(group_blocks, blocks - b0 - nb) : 0;
      column_group(isa, x, xu, M, xq.size(1), w, c, steps, b0, nb, next_nb, out);
    }
  });
}

// The exact int32 sums Σ_k xq[m][k] · w[n][k] (for tests: the integer part of the GEMM alone).
at::Tensor int8_gemm_int32(const at::Tensor& xq, const at::Tensor& packed, const at::Tensor& comp, int64_t N,
                           int64_t isa) {
  at::Tensor raw = at::empty({xq.size(0), N}, xq.options().dtype(at::kInt));
  Out out;
  out.raw = raw.data_ptr<int32_t>();
  out.N = N;
  run_gemm(isa, xq, packed, comp, out);
  return raw;
}

// y [M, N] = the dequantized product of rows already quantized (xq, x_scale: quantize_rows, or a norm
// that quantized its output), plus bias: bf16 where asked, else fp32.
at::Tensor int8_linear_quantized(const at::Tensor& xq, const at::Tensor& x_scale, const at::Tensor& packed,
                                 const at::Tensor& comp, const at::Tensor& w_scale,
                                 const std::optional<at::Tensor>& bias, bool bf16, int64_t isa) {
  const int64_t N = w_scale.numel();
  TORCH_CHECK(x_scale.scalar_type() == at::kFloat && x_scale.is_contiguous() && x_scale.numel() == xq.size(0),
              "int8 GEMM: x_scale must be [M] fp32, one per row of xq");
  at::Tensor y = at::empty({xq.size(0), N}, xq.options().dtype(bf16 ? at::kBFloat16 : at::kFloat));
  at::Tensor ws = w_scale.to(at::kFloat).contiguous();
  at::Tensor b = bias.has_value() ? bias->to(at::kFloat).contiguous() : at::Tensor();
  TORCH_CHECK(!b.defined() || b.numel() == N, "int8_linear: bias of ", b.numel(), " for ", N, " outputs");
  Out out;
  if (bf16) {
    out.y16 = y.data_ptr<at::BFloat16>();
  } else {
    out.y = y.data_ptr<float>();
  }
  out.x_scale = x_scale.data_ptr<float>();
  out.w_scale = ws.data_ptr<float>();
  out.bias = b.defined() ? b.data_ptr<float>() : nullptr;
  out.N = N;
  run_gemm(isa, xq, packed, comp, out);
  return y;
}

// y [M, N] = the dequantized product of x quantized per row, plus bias: bf16 for a bf16 x, else fp32.
at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& comp,
                       const at::Tensor& w_scale, const std::optional<at::Tensor>& bias, int64_t isa) {
  auto [xq, x_scale] = quantize_rows(x);
  return int8_linear_quantized(xq, x_scale, packed, comp, w_scale, bias, x.scalar_type() == at::kBFloat16, isa);
}

}  // namespace

TORCH_LIBRARY(vlserve_int8, m) {
  m.def("pack_int8(Tensor w) -> (Tensor, Tensor)");
  m.def("quantize_rows(Tensor x) -> (Tensor, Tensor)");
  m.def("int8_gemm_int32(Tensor xq, Tensor packed, Tensor comp, int N, int isa=-1) -> Tensor");
  m.def("int8_linear(Tensor x, Tensor packed, Tensor comp, Tensor w_scale, Tensor? bias, int isa=-1) -> Tensor");
  m.def("int8_linear_quantized(Tensor xq, Tensor x_scale, Tensor packed, Tensor comp, Tensor w_scale, Tensor? bias, "
        "bool bf16, int isa=-1) -> Tensor");
  m.def("int8_isa() -> int");
}

TORCH_LIBRARY_IMPL(vlserve_int8, CPU, m) {
  m.impl("pack_int8", &pack_int8);
  m.impl("quantize_rows", &quantize_rows);
  m.impl("int8_gemm_int32", &int8_gemm_int32);
  m.impl("int8_linear", &int8_linear);
  m.impl("int8_linear_quantized", &int8_linear_quantized);
}

TORCH_LIBRARY_IMPL(vlserve_int8, CompositeExplicitAutograd, m) { m.impl("int8_isa", &int8_isa); }
