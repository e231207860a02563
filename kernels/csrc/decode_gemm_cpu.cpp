// y[M, N] = x[M, K] · w[N, K]^T (+ bias) for the rows decode batches run (a few dozen), where the
// BLAS libraries run at a fraction of their prefill rate: oneDNN's inner product on its own packed
// weight at 60-70% on AVX-512 (one Zen 5 core, 24 rows: bf16 306 against 481 GFLOP/s, fp32 158
// against 223); on AVX2, oneDNN and MKL on the plain weight lower still (our dot-product kernel,
// small_gemm_cpu.cpp, was the best there). y has x's dtype.
//
// The weight is packed once (pack_weight) so that 64 bytes are 16 output columns at one step of K:
// for each block of 16 columns, packed[block][step][column] holds
// - fp32: w[column][step], a step is one element of K, and the product is an FMA;
// - bf16: (w[column][2 step], w[column][2 step + 1]) as one 32-bit word, a step is a pair of K. With
//   AVX512_BF16 the product is vdpbf16ps, which multiplies 16 such pairs by x's pair broadcast and
//   adds each pair's sum into one fp32 lane; on AVX2 each word is widened in registers (a shift for
//   the low half, a mask for the high half: bf16 is the top half of an fp32) and x, widened to fp32
//   once per call, goes through two FMAs. Either way the products of bf16 values are exact in fp32;
//   the sum is rounded to bf16 once at the end (after the bias), as oneDNN does.
//
// Register block: Op::kRows rows x kColBlocks column blocks of fp32 accumulators. Per step:
// the blocks' weight loads, kRows broadcasts of x, kRows x 16 x kColBlocks products (AVX-512 6 x 4
// blocks: 24 accumulators of 32 registers; AVX2 6 x 1 block of two 8-float vectors: 12 of 16, and
// in bf16 4 x 1). K runs in chunks of kChunkSteps steps so that a column group's chunk of weights
// stays near (AVX-512: L2, AVX2: L1) while every row block passes over it; the passes also fetch
// the next chunk ahead (the first pass would otherwise wait on memory: that alone was 1.3x at 24
// rows on AVX-512) into L2 (prefetcht1: on an Intel Xeon 1.1x prefetcht0 at 22-32 rows, the whole
// model's weights streamed, whose L1 fill buffers ran short; T0 slower on a Zen 4 too; not measured
// again on the Zen 5 where T0 was first chosen). Rows go in panels of kPanelRows, whose partial sums
// wait in a small fp32 buffer between chunks; prefill rows go in blocks of kRowBlock, each block over
// every column group before the next. Threads split the column groups.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "amx_cpu.h"
#include "vec_cpu.h"

#if defined(__AVX512F__)
#define VLSERVE_DECODE_GEMM 512
#elif defined(__AVX2__) && defined(__FMA__)
#define VLSERVE_DECODE_GEMM 256
#endif
#if defined(VLSERVE_DECODE_GEMM)
#include <immintrin.h>
#endif

namespace {

constexpr int64_t kBlockCols = 16;  // output columns per packed block (one fp32 vector)

bool supports(c10::ScalarType dtype) {
#if VLSERVE_DECODE_GEMM == 512
  if (dtype == at::kFloat) return true;
#if defined(__AVX512BF16__)
  if (dtype == at::kBFloat16) return true;
#endif
#elif VLSERVE_DECODE_GEMM == 256
  if (dtype == at::kFloat || dtype == at::kBFloat16) return true;
#endif
  return false;
}

// The vector width the kernel was built for (-march=native): 512, 256, or 0 where it is not built.
int64_t vector_bits() {
#if defined(VLSERVE_DECODE_GEMM)
  return VLSERVE_DECODE_GEMM;
#else
  return 0;
#endif
}

// Elements of K per step: a bf16 pair shares one 32-bit word.
int64_t per_step(c10::ScalarType dtype) { return dtype == at::kBFloat16 ? 2 : 1; }

// w [N, K] fp32 or bf16 -> packed [ceil(N / 16), steps, 16] 32-bit words, zero padded.
at::Tensor pack_weight(const at::Tensor& w_in) {
  TORCH_CHECK(w_in.dim() == 2 && (w_in.scalar_type() == at::kFloat || w_in.scalar_type() == at::kBFloat16),
              "pack_weight: need a 2-D fp32 or bf16 weight, got ", w_in.sizes(), " ", w_in.scalar_type());
  const at::Tensor w = w_in.contiguous();
  const int64_t N = w.size(0), K = w.size(1), e = per_step(w.scalar_type());
  const int64_t blocks = (N + kBlockCols - 1) / kBlockCols, steps = (K + e - 1) / e;
  at::Tensor packed = at::zeros({blocks, steps, kBlockCols}, w.options().dtype(at::kInt));
  uint32_t* dst = reinterpret_cast<uint32_t*>(packed.data_ptr<int32_t>());
  const bool bf16 = w.scalar_type() == at::kBFloat16;
  const uint16_t* halves = bf16 ? reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>()) : nullptr;
  const uint32_t* words = bf16 ? nullptr : reinterpret_cast<const uint32_t*>(w.data_ptr<float>());
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      for (int64_t c = 0; c < kBlockCols && b * kBlockCols + c < N; ++c) {
        const int64_t n = b * kBlockCols + c;
        for (int64_t s = 0; s < steps; ++s) {
          uint32_t word;
          if (bf16) {
            const uint32_t lo = halves[n * K + 2 * s], hi = 2 * s + 1 < K ? halves[n * K + 2 * s + 1] : 0;
            word = lo | (hi << 16);
          } else {
            word = words[n * K + s];
          }
          dst[(b * steps + s) * kBlockCols + c] = word;
        }
      }
    }
  });
  return packed;
}

#if VLSERVE_DECODE_GEMM == 512

// 6 x 4 measured best of 4x4, 8x3, 4x6 at 24 rows and level at 520 (panels of 192 rows: no better;
// on a Zen 4 EPYC 8 x 3, 12 x 2 and 4 x 6 were level with it).
constexpr int kColBlocks = 4;
// 1024 steps x 4 blocks x 64 bytes = 256 KB of weights, held in L2 while the row passes go over
// them (a whole K of up to 1024 steps). On a Zen 4 EPYC (two threads, the model's weights
// streamed; benchmarks/decode_gemm_constants.py at ba1d303) this was 1.05-1.14x chunks of 128 steps (32 KB,
// in L1) from 16 to 64 rows in bf16 and fp32, level at 8-12: fewer chunks, fewer trips of the
// accumulators through memory, and the next chunk fetched over a longer stretch. The 128-step
// chunks had measured best of 64 / 128 / 256 on a Zen 5 core, whose L1 is 48 KB.
constexpr int64_t kChunkSteps = 1024;
constexpr int64_t kPanelRows = 96;    // rows whose partial sums (24 KB) and x chunk stay near

struct Fp32 {
  static constexpr int kRows = 6;
  static __m512 product(__m512 acc, __m512i x, __m512i w) {
    return _mm512_fmadd_ps(_mm512_castsi512_ps(x), _mm512_castsi512_ps(w), acc);
  }
};

#if defined(__AVX512BF16__)
struct Bf16 {
  static constexpr int kRows = 6;
  static __m512 product(__m512 acc, __m512i x, __m512i w) { return _mm512_dpbf16_ps(acc, (__m512bh)x, (__m512bh)w); }
};
#endif

#elif VLSERVE_DECODE_GEMM == 256

// Rows x one block (two 8-float vectors): fp32 6 rows, 12 accumulators, two weight vectors and a
// broadcast in the 16 registers (the BLIS Haswell shape); bf16 4 rows, since each step's words give
// two K elements' weight vectors (and a mask) before the products (Zen 3, two threads, the eight
// layers' weights streamed: fp32 6 x 1 and bf16 4 x 1 measured best of 5 and 6 rows).
constexpr int kColBlocks = 1;
constexpr int64_t kChunkSteps = 256;  // 256 steps x 64 bytes = 16 KB of weights in L1 (half of it)
constexpr int64_t kPanelRows = 96;

// A step's weights as fp32 vectors of 8 columns: a step holds kHalves elements of K (bf16: a pair
// per 32-bit word, the low one at 2 s: shifted into an fp32's top half; the high one at 2 s + 1:
// the low half masked off). x rows are fp32 (bf16 x is widened before the call).
struct Fp32 {
  static constexpr int kRows = 6;
  static constexpr int kHalves = 1;
  static inline __m256 weights(const uint32_t* p, int) { return _mm256_loadu_ps(reinterpret_cast<const float*>(p)); }
};

struct Bf16 {
  static constexpr int kRows = 4;  // 8 accumulators; with 6 rows GCC spilled two (0.7x at 24 rows)
  static constexpr int kHalves = 2;
  static inline __m256 weights(const uint32_t* p, int half) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm256_castsi256_ps(half == 0 ? _mm256_slli_epi32(v, 16)
                                         : _mm256_and_si256(v, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u))));
  }
};

#endif

#if defined(VLSERVE_DECODE_GEMM)

// The weights the next chunk will read, fetched ahead while this one computes: block c's steps
// [0, steps) from next[c] (null: nothing to fetch); this pass fetches the steps s with
// s % passes == pass, so the passes over a chunk share the fetching.
struct Ahead {
  const uint32_t* next[kColBlocks];
  int64_t steps;
  int64_t pass, passes;  // passes: how many of the chunk's passes fetch (pass >= passes: none)
};

// AVX-512: up to this many row passes a chunk, the first pass fetches the whole next chunk; more,
// and the passes share it. On a Xeon (two threads, the model's weights streamed, fp32, 32 KB
// chunks) the first pass alone was 1.2-1.3x at 7-12 rows (two passes) and 1.07-1.1x at 20-24
// (four), 0.95x at 13-18 (three) and 0.87-0.95x from 32 rows up. With the 256 KB chunks on a Zen 4
// sharing from three passes up measured level or better than from five. AVX2 (tuned on Zen 3)
// always shares.
#if VLSERVE_DECODE_GEMM == 512
constexpr int64_t kWholeChunkFetchPasses = 2;
#else
constexpr int64_t kWholeChunkFetchPasses = 0;
#endif

// Where one call's operands are: x as 32-bit words (row stride xs words), the packed weight, the
// group's fp32 partial sums (row stride kColBlocks * 16).
struct Operands {
  const uint32_t* x;
  int64_t xs;
  const uint32_t* w;
  int64_t steps;  // of the whole K
  float* acc;
};

#if VLSERVE_DECODE_GEMM == 512
// Rows [m0, m0 + R) of the panel against column blocks [b0, b0 + C), steps [s0, s1).
template <typename Op, int R, int C>
inline void micro(const Operands& o, int64_t b0, int64_t m0, int64_t s0, int64_t s1, bool first, const Ahead& ahead) {
  constexpr int64_t as = kColBlocks * kBlockCols;
  __m512 a[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c)
      a[r][c] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(o.acc + (m0 + r) * as + c * kBlockCols);
  const uint32_t* wb[C];
  for (int c = 0; c < C; ++c) wb[c] = o.w + (b0 + c) * o.steps * kBlockCols;
  const uint32_t* xr[R];
  for (int r = 0; r < R; ++r) xr[r] = o.x + (m0 + r) * o.xs;
  const int64_t fetch_end = s0 + ahead.steps;
  int64_t fetch = s0 + ahead.pass;  // steps s0 + pass, s0 + pass + passes, ...: no division per step
  for (int64_t s = s0; s < s1; ++s) {
    if (ahead.pass < ahead.passes && s == fetch && s < fetch_end) {
      for (int c = 0; c < kColBlocks; ++c)
        if (ahead.next[c] != nullptr)
          _mm_prefetch(reinterpret_cast<const char*>(ahead.next[c] + (s - s0) * kBlockCols), _MM_HINT_T1);
      fetch += ahead.passes;
    }
    __m512i wv[C];
    for (int c = 0; c < C; ++c) wv[c] = _mm512_loadu_si512(wb[c] + s * kBlockCols);
    for (int r = 0; r < R; ++r) {
      const __m512i xv = _mm512_set1_epi32(static_cast<int>(xr[r][s]));
      for (int c = 0; c < C; ++c) a[r][c] = Op::product(a[r][c], xv, wv[c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(o.acc + (m0 + r) * as + c * kBlockCols, a[r][c]);
}
#endif

#if VLSERVE_DECODE_GEMM == 256
// Rows [m0, m0 + R) of the panel against column blocks [b0, b0 + C), steps [s0, s1); x is fp32 here.
// Every loop over rows and vectors is unrolled by pragma: left to GCC, the accumulator array stayed
// in memory, stored at every step (3-4x slower).
template <typename Op, int R, int C>
inline void micro(const Operands& o, int64_t b0, int64_t m0, int64_t s0, int64_t s1, bool first, const Ahead& ahead) {
  constexpr int64_t as = kColBlocks * kBlockCols;
  __m256 a[R][2 * C];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < 2 * C; ++v)
      a[r][v] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(o.acc + (m0 + r) * as + v * 8);
  const uint32_t* wb[C];
  for (int c = 0; c < C; ++c) wb[c] = o.w + (b0 + c) * o.steps * kBlockCols;
  const float* xr[R];
  for (int r = 0; r < R; ++r) xr[r] = reinterpret_cast<const float*>(o.x + (m0 + r) * o.xs);
  const int64_t fetch_end = s0 + ahead.steps;
  int64_t fetch = s0 + ahead.pass;  // steps s0 + pass, s0 + pass + passes, ...: no division per step
  for (int64_t s = s0; s < s1; ++s) {
    if (ahead.pass < ahead.passes && s == fetch && s < fetch_end) {
      for (int c = 0; c < kColBlocks; ++c)
        if (ahead.next[c] != nullptr)
          _mm_prefetch(reinterpret_cast<const char*>(ahead.next[c] + (s - s0) * kBlockCols), _MM_HINT_T0);
      fetch += ahead.passes;
    }
#pragma GCC unroll 2
    for (int h = 0; h < Op::kHalves; ++h) {
      __m256 w[C][2];
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) {
        w[c][0] = Op::weights(wb[c] + s * kBlockCols, h);
        w[c][1] = Op::weights(wb[c] + s * kBlockCols + 8, h);
      }
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m256 xv = _mm256_broadcast_ss(xr[r] + s * Op::kHalves + h);
#pragma GCC unroll 8
        for (int c = 0; c < C; ++c) {
          a[r][2 * c] = _mm256_fmadd_ps(xv, w[c][0], a[r][2 * c]);
          a[r][2 * c + 1] = _mm256_fmadd_ps(xv, w[c][1], a[r][2 * c + 1]);
        }
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < 2 * C; ++v) _mm256_storeu_ps(o.acc + (m0 + r) * as + v * 8, a[r][v]);
}
#endif

// rows 1 .. Op::kRows, cols 1 .. kColBlocks: the remainders of M and N.
template <typename Op, int C>
inline void micro_rows(int rows, const Operands& o, int64_t b0, int64_t m0, int64_t s0, int64_t s1, bool first,
                       const Ahead& ah) {
  switch (rows) {
    case 6: micro<Op, 6, C>(o, b0, m0, s0, s1, first, ah); break;
    case 5: micro<Op, 5, C>(o, b0, m0, s0, s1, first, ah); break;
    case 4: micro<Op, 4, C>(o, b0, m0, s0, s1, first, ah); break;
    case 3: micro<Op, 3, C>(o, b0, m0, s0, s1, first, ah); break;
    case 2: micro<Op, 2, C>(o, b0, m0, s0, s1, first, ah); break;
    default: micro<Op, 1, C>(o, b0, m0, s0, s1, first, ah); break;
  }
}

template <typename Op>
inline void micro_any(int rows, int cols, const Operands& o, int64_t b0, int64_t m0, int64_t s0, int64_t s1, bool first,
                      const Ahead& ah) {
  if constexpr (kColBlocks == 1) {
    micro_rows<Op, 1>(rows, o, b0, m0, s0, s1, first, ah);
  } else {
    switch (cols) {
      case 4: micro_rows<Op, 4>(rows, o, b0, m0, s0, s1, first, ah); break;
      case 3: micro_rows<Op, 3>(rows, o, b0, m0, s0, s1, first, ah); break;
      case 2: micro_rows<Op, 2>(rows, o, b0, m0, s0, s1, first, ah); break;
      default: micro_rows<Op, 1>(rows, o, b0, m0, s0, s1, first, ah); break;
    }
  }
}

// One panel row's finished sums [n0, n1) plus the bias, into y (bf16: rounded once, to nearest even).
template <typename T>
void finish_row(const float* a, const float* bias, T* y, int64_t n0, int64_t n1) {
  using namespace vlserve_vec;
  int64_t n = n0;
  for (; n + kLanes <= n1; n += kLanes) {
    vf v = loadu(a + (n - n0));
    if (bias != nullptr) v += loadu(bias + n);
    store16(y + n, v);
  }
  for (; n < n1; ++n) y[n] = static_cast<T>(a[n - n0] + (bias != nullptr ? bias[n] : 0.0f));
}

// One column group, blocks [b0, b0 + cols), over every row: panels of kPanelRows rows (their slice
// of x and the group's weights stay in L2 from panel to panel), each panel's K in chunks, then bias
// and rounding into y. `next_cols`: column blocks of the group this thread runs next (0: none),
// whose first chunk the group's last chunk fetches ahead.
template <typename Op, typename T>
void column_group(Operands o, int64_t M, int64_t N, int64_t b0, int cols, int next_cols, const float* bias, T* y) {
  const uint32_t* x = o.x;
  for (int64_t mp = 0; mp < M; mp += kPanelRows) {
    const int64_t rows = std::min(kPanelRows, M - mp);
    const int64_t passes = (rows + Op::kRows - 1) / Op::kRows;
    const bool last_panel = mp + kPanelRows >= M;
    o.x = x + mp * o.xs;
    for (int64_t s0 = 0; s0 < o.steps; s0 += kChunkSteps) {
      const int64_t s1 = std::min(o.steps, s0 + kChunkSteps);
      Ahead ahead{{}, 0, 0, passes <= kWholeChunkFetchPasses ? 1 : passes};
      if (passes < 2) {
        // one pass reads each line once: the hardware prefetcher keeps up (fetching ahead measured slower)
      } else if (s1 < o.steps || !last_panel) {  // this group's next chunk (the next panel's first)
        const int64_t q0 = s1 < o.steps ? s1 : 0;
        ahead.steps = std::min(kChunkSteps, o.steps - q0);
        for (int c = 0; c < cols; ++c) ahead.next[c] = o.w + ((b0 + c) * o.steps + q0) * kBlockCols;
      } else if (next_cols > 0) {  // the next group's first chunk
        ahead.steps = std::min(kChunkSteps, o.steps);
        for (int c = 0; c < next_cols; ++c) ahead.next[c] = o.w + (b0 + cols + c) * o.steps * kBlockCols;
      }
      for (int64_t m0 = 0; m0 < rows; m0 += Op::kRows, ++ahead.pass) {
        micro_any<Op>(static_cast<int>(std::min<int64_t>(Op::kRows, rows - m0)), cols, o, b0, m0, s0, s1, s0 == 0,
                      ahead);
      }
    }
    const int64_t n0 = b0 * kBlockCols, n1 = std::min(N, (b0 + cols) * kBlockCols);
    for (int64_t m = 0; m < rows; ++m) finish_row(o.acc + m * kColBlocks * kBlockCols, bias, y + (mp + m) * N, n0, n1);
  }
}

// Rows in blocks of kRowBlock, each block over all of this thread's column groups: a block's x
// (512 rows x K) stays in L2/L3 while the groups pass over it, and each group's weights are read once
// per block. One pass over all rows per group lost to oneDNN's blocked layout from ~1,000 rows, its
// x re-read from memory by every group (fp32, one Zen 5 core, the 0.5 B and benchmark models' shapes
// at 4,096 rows: 0.87-0.95x oneDNN; in blocks of 512 rows 0.98-1.02x, of 1,024 0.93-0.98x).
constexpr int64_t kRowBlock = 512;

template <typename Op, typename T>
void run(const uint32_t* x, int64_t M, int64_t xs, const uint32_t* w, int64_t steps, int64_t N, const float* bias, T* y) {
  const int64_t blocks = (N + kBlockCols - 1) / kBlockCols;
  const int64_t groups = (blocks + kColBlocks - 1) / kColBlocks;
  at::parallel_for(0, groups, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> acc(static_cast<size_t>(std::min(M, kPanelRows) * kColBlocks * kBlockCols));
    for (int64_t r0 = 0; r0 < M; r0 += kRowBlock) {
      const int64_t rows = std::min(kRowBlock, M - r0);
      for (int64_t g = begin; g < end; ++g) {
        const int64_t b0 = g * kColBlocks;
        const int cols = static_cast<int>(std::min<int64_t>(kColBlocks, blocks - b0));
        const int next_cols = g + 1 < end ? static_cast<int>(std::min<int64_t>(kColBlocks, blocks - b0 - cols)) : 0;
        column_group<Op, T>(Operands{x + r0 * xs, xs, w, steps, acc.data()}, rows, N, b0, cols, next_cols, bias,
                            y + r0 * N);
      }
    }
  });
}

#endif  // VLSERVE_DECODE_GEMM

#if defined(VLSERVE_AMX)
// bf16 rows on AMX tiles, up to kAmxMaxRows: the packed weight's 16 steps of one column block are
// one B tile as they lie (16 rows of K pairs x 16 columns, 1 KB contiguous), so each thread streams
// its column blocks' weights once, in order, and the tiles' arithmetic (16 x 16 x 32 per
// instruction) keeps far ahead of memory. Row groups of 16: C tiles 0-2, their x rows as A tiles
// 3-5, the weight step in tile 6.
constexpr int64_t kAmxMaxRows = 48;
constexpr int64_t kAmxFetchAhead = 2048;  // bytes of the weight stream fetched ahead of the tiles

bool amx_takes(int64_t M, int64_t K) { return M <= kAmxMaxRows && K % 32 == 0 && vlserve_amx::usable(); }

template <int G>
void amx_blocks(const c10::BFloat16* x, int64_t M, int64_t K, const uint32_t* w, int64_t steps, int64_t N,
                const float* bias, c10::BFloat16* y, int64_t b0, int64_t b1) {
  vlserve_amx::TileShape shapes[8] = {};
  for (int g = 0; g < G; ++g) {
    const int rows = static_cast<int>(std::min<int64_t>(16, M - 16 * g));
    shapes[g] = {rows, 64};      // C: rows x 16 fp32
    shapes[3 + g] = {rows, 64};  // A: rows x 16 pairs of K
  }
  shapes[6] = {16, 64};  // B: 16 pairs of K x 16 columns
  vlserve_amx::Scope tiles(shapes);
  const int64_t xs = K * 2;  // bytes per x row
  alignas(64) float c[16 * kBlockCols];
  const char* stream_end = reinterpret_cast<const char*>(w + b1 * steps * kBlockCols);  // this thread's blocks
  for (int64_t b = b0; b < b1; ++b) {
    _tile_zero(0);
    if constexpr (G > 1) _tile_zero(1);
    if constexpr (G > 2) _tile_zero(2);
    const uint32_t* wb = w + b * steps * kBlockCols;
    for (int64_t s = 0; s < steps; s += 16) {
      const char* ahead = reinterpret_cast<const char*>(wb + s * kBlockCols) + kAmxFetchAhead;
      for (int line = 0; line < 1024 && ahead + line < stream_end; line += 64) _mm_prefetch(ahead + line, _MM_HINT_T0);
      _tile_loadd(6, wb + s * kBlockCols, 64);
      const c10::BFloat16* xk = x + 2 * s;
      _tile_loadd(3, xk, xs);
      _tile_dpbf16ps(0, 3, 6);
      if constexpr (G > 1) {
        _tile_loadd(4, xk + 16 * K, xs);
        _tile_dpbf16ps(1, 4, 6);
      }
      if constexpr (G > 2) {
        _tile_loadd(5, xk + 32 * K, xs);
        _tile_dpbf16ps(2, 5, 6);
      }
    }
    const int64_t n0 = b * kBlockCols, n1 = std::min(N, n0 + kBlockCols);
    for (int g = 0; g < G; ++g) {
      switch (g) {  // tile numbers are immediates
        case 0: _tile_stored(0, c, 64); break;
        case 1: _tile_stored(1, c, 64); break;
        default: _tile_stored(2, c, 64); break;
      }
      for (int r = 0; r < shapes[g].rows; ++r) finish_row(c + r * kBlockCols, bias, y + (16 * g + r) * N, n0, n1);
    }
  }
}

void run_amx(const c10::BFloat16* x, int64_t M, int64_t K, const uint32_t* w, int64_t steps, int64_t N,
             const float* bias, c10::BFloat16* y) {
  const int64_t blocks = (N + kBlockCols - 1) / kBlockCols;
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    switch ((M + 15) / 16) {
      case 1: amx_blocks<1>(x, M, K, w, steps, N, bias, y, begin, end); break;
      case 2: amx_blocks<2>(x, M, K, w, steps, N, bias, y, begin, end); break;
      default: amx_blocks<3>(x, M, K, w, steps, N, bias, y, begin, end); break;
    }
  });
}
#else
bool amx_takes(int64_t, int64_t) { return false; }
void run_amx(const c10::BFloat16*, int64_t, int64_t, const uint32_t*, int64_t, int64_t, const float*, c10::BFloat16*) {}
#endif

// The most bf16 rows the AMX tiles take here (K a multiple of 32); 0 where the build has no AMX or
// the OS does not grant it.
int64_t amx_max_rows() {
#if defined(VLSERVE_AMX)
  return vlserve_amx::usable() ? kAmxMaxRows : 0;
#else
  return 0;
#endif
}

at::Tensor linear(const at::Tensor& x_in, const at::Tensor& packed, int64_t N, const c10::optional<at::Tensor>& bias_in) {
  const c10::ScalarType dtype = x_in.scalar_type();
  TORCH_CHECK(x_in.device().is_cpu() && supports(dtype), "decode_gemm.linear: x must be a CPU tensor of a dtype this "
              "build supports (fp32 with AVX-512 or AVX2, bf16 with AVX512_BF16 or AVX2), got ", dtype);
  TORCH_CHECK(packed.dim() == 3 && packed.scalar_type() == at::kInt && packed.size(2) == kBlockCols &&
                  packed.size(0) * kBlockCols >= N && packed.is_contiguous(),
              "decode_gemm.linear: packed must come from pack_weight, got ", packed.sizes());
  const int64_t K = x_in.size(-1), e = per_step(dtype);
  TORCH_CHECK(K % e == 0 && packed.size(1) == K / e, "decode_gemm.linear: x has ", K, " features, the packed weight ",
              e * packed.size(1), " (and K must be even for bf16)");
  const at::Tensor x = x_in.reshape({-1, K}).contiguous();
  const int64_t M = x.size(0), steps = packed.size(1);
  at::Tensor bias;
  if (bias_in.has_value() && bias_in->defined()) {
    bias = bias_in->to(at::kFloat).contiguous();
    TORCH_CHECK(bias.dim() == 1 && bias.size(0) == N, "decode_gemm.linear: bias must be [N]");
  }
  at::Tensor y = at::empty({M, N}, x.options());
#if defined(VLSERVE_DECODE_GEMM)
  const uint32_t* ww = reinterpret_cast<const uint32_t*>(packed.data_ptr<int32_t>());
  const float* bp = bias.defined() ? bias.data_ptr<float>() : nullptr;
  if (dtype == at::kFloat) {
    run<Fp32, float>(static_cast<const uint32_t*>(x.data_ptr()), M, K, ww, steps, N, bp, y.data_ptr<float>());
  } else {
#if VLSERVE_DECODE_GEMM == 256
    const at::Tensor wide = x.to(at::kFloat);  // a few rows: widened once, broadcast from fp32
    run<Bf16, at::BFloat16>(static_cast<const uint32_t*>(wide.data_ptr()), M, K, ww, steps, N, bp,
                            y.data_ptr<at::BFloat16>());
#elif defined(__AVX512BF16__)
    if (amx_takes(M, K)) {
      run_amx(x.data_ptr<at::BFloat16>(), M, K, ww, steps, N, bp, y.data_ptr<at::BFloat16>());
    } else {
      run<Bf16, at::BFloat16>(static_cast<const uint32_t*>(x.data_ptr()), M, K / 2, ww, steps, N, bp,
                              y.data_ptr<at::BFloat16>());
    }
#endif
  }
#endif
  std::vector<int64_t> shape(x_in.sizes().begin(), x_in.sizes().end());
  shape.back() = N;
  return y.view(shape);
}

}  // namespace

TORCH_LIBRARY(vlserve_decode_gemm, m) {
  m.def("pack_weight(Tensor w) -> Tensor");
  m.def("linear(Tensor x, Tensor packed, int N, Tensor? bias) -> Tensor");
  m.def("supports(ScalarType dtype) -> bool");
  m.def("vector_bits() -> int");
  m.def("amx_max_rows() -> int");
}

TORCH_LIBRARY_IMPL(vlserve_decode_gemm, CPU, m) {
  m.impl("pack_weight", &pack_weight);
  m.impl("linear", &linear);
}

TORCH_LIBRARY_IMPL(vlserve_decode_gemm, CompositeExplicitAutograd, m) {
  m.impl("supports", &supports);
  m.impl("vector_bits", &vector_bits);
  m.impl("amx_max_rows", &amx_max_rows);
}
