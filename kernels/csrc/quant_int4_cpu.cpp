// W4A16 GEMM: y[M, N] = x[M, K] · wᵀ (+ bias) where w[n][k] = (q[n][k] - z[n][g]) · s[n][g] for k in
// group g (G elements of K per group; z = 0 when symmetric).
//
// The weight is packed once (pack_int4) into words of eight K elements of one column, each nibble
// q + 8; 64 bytes are 16 columns (a block) x 8 elements of K (a step), and the blocks of one thread
// task (4, 64 columns) are interleaved step by step (Int4Layout), so that the task reads one stream. Within a word, element 2j sits at bits 4j and element 2j + 1 at bits 16 + 4j: one
// shift by 4j and one mask of 0x000F000F leave, in each 32-bit lane, the pair (2j, 2j + 1) as two
// 16-bit values, the layout of vdpbf16ps's bf16 pairs. Beside the words, per block, group and
// column, the scale s and c = s · (8 + z) (symmetric: s alone, c = 8 s), so that w = nibble · s - c.
//
// Decode rows (decode_int4, AVX-512), two paths by x's dtype:
// - bf16 x (AVX512-BF16): each masked pair is ORed with 0x4300 per half (one vpternlogd), which makes
//   the bf16 values 128 + nibble exactly; vdpbf16ps multiplies them by x's pair, broadcast from
//   memory, into per-group fp32 sums Σ (128 + nibble) · x, and at each group's end
//   acc += s · sums - (c + 128 · s) · Σ x (the row's group sums of x, computed here once per call).
//   Two instructions unpack 32 weights for every row; the rows' products are one instruction per 32.
//   Output bf16, rounded once.
// - fp32 x: the nibbles are widened to fp32 (a shift, a mask, a conversion per eight columns'
//   element, shared by every row of the block) and multiplied into the same per-group sums, without
//   the 128. Output fp32.
// Nothing of the weight is written out. Register block: up to 4 rows x 2 column blocks (or 1-2 rows
// x 4 blocks).
// Prefill rows (dequantize_int4): the weight is unpacked to a full-precision matrix once per call and
// the caller's BLAS runs the product, whose arithmetic then dwarfs the unpacking.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#define VLSERVE_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
#define VLSERVE_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

namespace {

constexpr int64_t kCols = 16;
constexpr int64_t kPerWord = 8;
constexpr int64_t kPrefetchSteps = 16;  // bf16 rows fetch the stream this many steps (4 KB) ahead into L1
constexpr int64_t kTaskBlocks = 4;  // column blocks per thread task, interleaved in memory

// Where the words lie: the blocks of a task (kTaskBlocks, fewer in the last) interleaved step by step,
// so that a task's pass over K reads one contiguous stream: word (block b, step s, column c) at
// at(b, s) + c.
struct Int4Layout {
  int64_t steps, blocks;

  int64_t at(int64_t b, int64_t s) const {
    const int64_t t0 = b / kTaskBlocks * kTaskBlocks;
    return (t0 * steps + s * task_blocks(b) + (b - t0)) * kCols;
  }
  int64_t task_blocks(int64_t b) const { return std::min(kTaskBlocks, blocks - b / kTaskBlocks * kTaskBlocks); }
};

bool has_avx512() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
}

bool has_avx512_bf16() {
  __builtin_cpu_init();
  return has_avx512() && __builtin_cpu_supports("avx512bf16");
}

bool int4_supported() { return has_avx512(); }

// The bit offset of element e (0-7) in its word: pairs (2j, 2j + 1) at bits 4j and 16 + 4j.
constexpr int nibble_shift(int64_t e) { return static_cast<int>((e % 2) * 16 + (e / 2) * 4); }

// q [N, K] int8 in [-8, 7]; scale [N, K/G] float; zero [N, K/G] int8 or None ->
// (packed [N/16, K/8, 16] int32 in Int4Layout's order, sc [N/16, K/G, 2 or 1, 16] fp32: s, then
// c = s · (8 + z) where there are zero points; symmetric, c = 8 s is not stored, so that the decode
// stream carries 4 bytes of scales per 64 of weights, not 8).
std::tuple<at::Tensor, at::Tensor> pack_int4(const at::Tensor& q_in, const at::Tensor& scale_in,
                                             const std::optional<at::Tensor>& zero_in) {
  TORCH_CHECK(q_in.dim() == 2 && q_in.scalar_type() == at::kChar, "pack_int4: q must be 2-D int8");
  const at::Tensor q = q_in.contiguous(), scale = scale_in.to(at::kFloat).contiguous();
  const int64_t N = q.size(0), K = q.size(1), groups = scale.size(1);
  TORCH_CHECK(scale.dim() == 2 && scale.size(0) == N && groups > 0 && K % groups == 0, "pack_int4: scale ",
              scale.sizes(), " does not fit q ", q.sizes());
  const int64_t G = K / groups;
  TORCH_CHECK(K % kPerWord == 0 && G % kPerWord == 0, "pack_int4: K (", K, ") and the group size (", G,
              ") must be multiples of 8");
  at::Tensor zero = zero_in.has_value() ? zero_in->to(at::kChar).contiguous() : at::Tensor();
  TORCH_CHECK(!zero.defined() || zero.sizes() == scale.sizes(), "pack_int4: zero points must match the scales");
  const int64_t blocks = (N + kCols - 1) / kCols, steps = K / kPerWord;
  at::Tensor packed = at::zeros({blocks, steps, kCols}, q.options().dtype(at::kInt));
  const int64_t rows = zero.defined() ? 2 : 1;  // symmetric: c = 8 s, not stored
  at::Tensor sc = at::zeros({blocks, groups, rows, kCols}, scale.options());
  const int8_t* qs = q.data_ptr<int8_t>();
  const float* ss = scale.data_ptr<float>();
  const int8_t* zs = zero.defined() ? zero.data_ptr<int8_t>() : nullptr;
  uint32_t* dst = reinterpret_cast<uint32_t*>(packed.data_ptr<int32_t>());
  float* scd = sc.data_ptr<float>();
  const Int4Layout layout{steps, blocks};
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      for (int64_t c = 0; c < kCols && b * kCols + c < N; ++c) {
        const int64_t n = b * kCols + c;
        for (int64_t s = 0; s < steps; ++s) {
          uint32_t word = 0;
          for (int64_t j = 0; j < kPerWord; ++j)
            word |= static_cast<uint32_t>(qs[n * K + s * kPerWord + j] + 8) << nibble_shift(j);
          dst[layout.at(b, s) + c] = word;
        }
        for (int64_t g = 0; g < groups; ++g) {
          const float s = ss[n * groups + g];
          const float z = zs ? static_cast<float>(zs[n * groups + g]) : 0.f;
          scd[((b * groups + g) * rows) * kCols + c] = s;
          if (rows == 2) scd[((b * groups + g) * rows + 1) * kCols + c] = s * (8.f + z);
        }
      }
    }
  });
  return {packed, sc};
}

// Block b's scales s and c = s · (8 + z) for group g, 16 columns each (Int4Scales::c: 8 s where not stored).
struct Int4Scales {
  const float* p;  // [blocks, groups, rows, 16]
  int64_t groups, rows;

  const float* at(int64_t b, int64_t g) const { return p + (b * groups + g) * rows * kCols; }
  float c(const float* at_bg, int64_t col) const { return rows == 2 ? at_bg[kCols + col] : 8.f * at_bg[col]; }
};

template <typename T>
struct Int4Args {
  const T* x;           // [M, K], fp32 or bf16
  const float* xsum;    // [M, groups]: Σ x over each group
  const uint32_t* w;    // packed
  Int4Scales sc;
  const float* bias;    // [N] or null
  T* y;                 // [M, N], x's dtype
  int64_t K, N, groups, steps, group_steps;
  Int4Layout layout;
};

VLSERVE_AVX512 inline void store_row(const float* out, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = out[i];
}

VLSERVE_AVX512 inline void store_row(const float* out, at::BFloat16* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = at::BFloat16(out[i]);  // round to nearest even
}

// The block's accumulators (plus bias) to y, rows m0.., column blocks b0...
template <typename T, int R, int C>
VLSERVE_AVX512 void store_block(const Int4Args<T>& a, const __m512 (&acc)[R][C], int64_t m0, int64_t b0) {
  alignas(64) float out[kCols];
  _Pragma("GCC unroll 8") for (int c = 0; c < C; ++c) {
    const int64_t n0 = (b0 + c) * kCols, n = std::min<int64_t>(kCols, a.N - n0);
    const __mmask16 edge = static_cast<__mmask16>((1u << n) - 1);
    const __m512 bias = a.bias ? _mm512_maskz_loadu_ps(edge, a.bias + n0) : _mm512_setzero_ps();
    _Pragma("GCC unroll 8") for (int r = 0; r < R; ++r) {
      _mm512_store_ps(out, _mm512_add_ps(acc[r][c], bias));
      store_row(out, a.y + (m0 + r) * a.N + n0, n);
    }
  }
}

// fp32 x: nibbles widened to fp32 in registers, acc += s · Σ nibble · x - c · Σ x per group.
template <int R, int C>
VLSERVE_AVX512 void block_int4(const Int4Args<float>& a, int64_t m0, int64_t b0) {
  __m512 acc[R][C];
  _Pragma("GCC unroll 8") for (int r = 0; r < R; ++r)
    _Pragma("GCC unroll 8") for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  const __m512i mask = _mm512_set1_epi32(0xF);
  for (int64_t g = 0; g < a.groups; ++g) {
    __m512 part[R][C];
    _Pragma("GCC unroll 8") for (int r = 0; r < R; ++r)
      _Pragma("GCC unroll 8") for (int c = 0; c < C; ++c) part[r][c] = _mm512_setzero_ps();
    for (int64_t s = g * a.group_steps; s < (g + 1) * a.group_steps; ++s) {
      const uint32_t* wp = a.w + a.layout.at(b0, s);
      __m512i words[C];
      _Pragma("GCC unroll 8") for (int c = 0; c < C; ++c) words[c] = _mm512_loadu_si512(wp + c * kCols);
      _Pragma("GCC unroll 8") for (int j = 0; j < kPerWord; ++j) {
        __m512 wf[C];
        _Pragma("GCC unroll 8") for (int c = 0; c < C; ++c)
          wf[c] = _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(words[c], nibble_shift(j)), mask));
        _Pragma("GCC unroll 8") for (int r = 0; r < R; ++r) {
          const __m512 xv = _mm512_set1_ps(a.x[(m0 + r) * a.K + s * kPerWord + j]);
          _Pragma("GCC unroll 8") for (int c = 0; c < C; ++c) part[r][c] = _mm512_fmadd_ps(wf[c], xv, part[r][c]);
        }
      }
    }
    _Pragma("GCC unroll 8") for (int c = 0; c < C; ++c) {
      const float* scp = a.sc.at(b0 + c, g);
      const __m512 s = _mm512_loadu_ps(scp);
      const __m512 cc = a.sc.rows == 2 ? _mm512_loadu_ps(scp + kCols) : _mm512_mul_ps(s, _mm512_set1_ps(8.f));
      _Pragma("GCC unroll 8") for (int r = 0; r < R; ++r) {
        const __m512 xs = _mm512_set1_ps(a.xsum[(m0 + r) * a.groups + g]);
        acc[r][c] = _mm512_fnmadd_ps(cc, xs, _mm512_fmadd_ps(s, part[r][c], acc[r][c]));
      }
    }
  }
  store_block<float, R, C>(a, acc, m0, b0);
}

// bf16 x: each pair of nibbles becomes the bf16 pair 128 + nibble (one shift, one ternary logic op
// for 32 weights) and vdpbf16ps adds its products with x's pair; acc += s · sums - (c + 128 s) · Σ x per
// group. One row keeps two sets of sums (even and odd pairs) so that the adds into one register are
// not a single chain.
template <int R, int C>
VLSERVE_AVX512_BF16 void block_int4(const Int4Args<at::BFloat16>& a, int64_t m0, int64_t b0) {
  constexpr int S = R == 1 ? 2 : 1;
  __m512 acc[R][C];
  _Pragma("GCC unroll 8") for (int r = 0; r < R; ++r)
    _Pragma("GCC unroll 8") for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  const __m512i mask = _mm512_set1_epi32(0x000F000F), exponent = _mm512_set1_epi32(0x43004300);
  const int32_t* x32 = reinterpret_cast<const int32_t*>(a.x);  // bf16 pairs (K is a multiple of 8)
  const int64_t ldx = a.K / 2;
  for (int64_t g = 0; g < a.groups; ++g) {
    __m512 part[S][R][C];
    _Pragma("GCC unroll 8") for (int t = 0; t < S; ++t)
      _Pragma("GCC unroll 8") for (int r = 0; r < R; ++r)
        _Pragma("GCC unroll 8") for (int c = 0; c < C; ++c) part[t][r][c] = _mm512_setzero_ps();
    for (int64_t s = g * a.group_steps; s < (g + 1) * a.group_steps; ++s) {
      const uint32_t* wp = a.w + a.layout.at(b0, s);
      __m512i words[C];
      _Pragma("GCC unroll 8") for (int c = 0; c < C; ++c) {
        _mm_prefetch(reinterpret_cast<const char*>(wp + (c + kPrefetchSteps * kTaskBlocks) * kCols), _MM_HINT_T0);
        words[c] = _mm512_loadu_si512(wp + c * kCols);
      }
      _Pragma("GCC unroll 4") for (int j = 0; j < kPerWord / 2; ++j) {
        __m512bh wb[C];
        _Pragma("GCC unroll 8") for (int c = 0; c < C; ++c) {
          const __m512i shifted = j == 0 ? words[c] : _mm512_srli_epi32(words[c], 4 * j);
          // (shifted & mask) | exponent
          wb[c] = (__m512bh)_mm512_ternarylogic_epi32(shifted, mask, exponent, 0xEA);
        }
        _Pragma("GCC unroll 8") for (int r = 0; r < R; ++r) {
          const __m512bh xv = (__m512bh)_mm512_set1_epi32(x32[(m0 + r) * ldx + s * (kPerWord / 2) + j]);
          _Pragma("GCC unroll 8") for (int c = 0; c < C; ++c)
            part[j % S][r][c] = _mm512_dpbf16_ps(part[j % S][r][c], xv, wb[c]);
        }
      }
    }
    _Pragma("GCC unroll 8") for (int c = 0; c < C; ++c) {
      const float* scp = a.sc.at(b0 + c, g);
      const __m512 s = _mm512_loadu_ps(scp);
      const __m512 cc = a.sc.rows == 2 ? _mm512_fmadd_ps(s, _mm512_set1_ps(128.f), _mm512_loadu_ps(scp + kCols))
                                       : _mm512_mul_ps(s, _mm512_set1_ps(136.f));
      _Pragma("GCC unroll 8") for (int r = 0; r < R; ++r) {
        const __m512 xs = _mm512_set1_ps(a.xsum[(m0 + r) * a.groups + g]);
        const __m512 sums = S == 2 ? _mm512_add_ps(part[0][r][c], part[S - 1][r][c]) : part[0][r][c];
        acc[r][c] = _mm512_fnmadd_ps(cc, xs, _mm512_fmadd_ps(s, sums, acc[r][c]));
      }
    }
  }
  store_block<at::BFloat16, R, C>(a, acc, m0, b0);
}

template <typename T, int R>
void rows_int4(const Int4Args<T>& a, int64_t m0, int64_t b0, int64_t nb) {
  constexpr int C = R <= 2 ? 4 : 2;
  int64_t b = b0;
  for (; b + C <= b0 + nb; b += C) block_int4<R, C>(a, m0, b);
  for (; b < b0 + nb; ++b) block_int4<R, 1>(a, m0, b);
}

template <typename T>
void run_int4(const Int4Args<T>& a, int64_t M, int64_t blocks) {
  const int64_t tasks = (blocks + kTaskBlocks - 1) / kTaskBlocks;
  at::parallel_for(0, tasks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t b0 = t * kTaskBlocks, nb = std::min(kTaskBlocks, blocks - b0);
      int64_t m = 0;
      for (; m + 4 <= M; m += 4) rows_int4<T, 4>(a, m, b0, nb);
      switch (M - m) {
        case 3: rows_int4<T, 3>(a, m, b0, nb); break;
        case 2: rows_int4<T, 2>(a, m, b0, nb); break;
        case 1: rows_int4<T, 1>(a, m, b0, nb); break;
        default: break;
      }
    }
  });
}

VLSERVE_AVX512 inline __m512 widen16(const float* p) { return _mm512_loadu_ps(p); }

VLSERVE_AVX512 inline __m512 widen16(const at::BFloat16* p) {  // bf16 is the top half of an fp32
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// Σ x over each group of each row, in fp32, of the values the kernel multiplies: sixteen lanes at a
// time (a scalar chain of adds took ~4 us a 4096-wide row, 3% of a batch-1 decode step).
template <typename T>
VLSERVE_AVX512 at::Tensor group_sums(const T* x, int64_t M, int64_t K, int64_t groups) {
  at::Tensor sums = at::empty({M, groups}, at::TensorOptions().dtype(at::kFloat));
  float* out = sums.data_ptr<float>();
  const int64_t G = K / groups;
  for (int64_t i = 0; i < M * groups; ++i) {
    const T* row = x + i * G;
    __m512 acc = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 16 <= G; k += 16) acc = _mm512_add_ps(acc, widen16(row + k));
    float t = _mm512_reduce_add_ps(acc);
    for (; k < G; ++k) t += static_cast<float>(row[k]);
    out[i] = t;
  }
  return sums;
}

template <typename T>
at::Tensor decode_int4_typed(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& sc,
                             const at::Tensor& bias, int64_t N) {
  const int64_t M = x.size(0), K = x.size(1), groups = sc.size(1), blocks = packed.size(0);
  const T* xp = x.data_ptr<T>();
  const at::Tensor xsum = group_sums(xp, M, K, groups);
  at::Tensor y = at::empty({M, N}, x.options());
  Int4Args<T> a{xp, xsum.data_ptr<float>(), reinterpret_cast<const uint32_t*>(packed.data_ptr<int32_t>()),
                Int4Scales{sc.data_ptr<float>(), groups, sc.size(2)}, bias.defined() ? bias.data_ptr<float>() : nullptr, y.data_ptr<T>(),
                K, N, groups, packed.size(1), (K / groups) / kPerWord, Int4Layout{packed.size(1), blocks}};
  run_int4(a, M, blocks);
  return y;
}

// y [M, N] for x [M, K] (M a few rows) on the packed weight: bf16 for a bf16 x where the CPU has
// AVX512-BF16, else fp32 (x of any float dtype read as fp32).
at::Tensor decode_int4(const at::Tensor& x_in, const at::Tensor& packed, const at::Tensor& sc,
                       const std::optional<at::Tensor>& bias_in, int64_t N) {
  TORCH_CHECK(int4_supported(), "decode_int4 needs AVX-512");
  TORCH_CHECK(x_in.dim() == 2 && packed.dim() == 3 && packed.size(2) == kCols &&
              x_in.size(1) == packed.size(1) * kPerWord,
              "decode_int4: x ", x_in.sizes(), " does not fit the packed weight ", packed.sizes());
  const int64_t K = x_in.size(1), groups = sc.size(1), blocks = packed.size(0);
  TORCH_CHECK(sc.dim() == 4 && sc.size(0) == blocks && (sc.size(2) == 1 || sc.size(2) == 2) && sc.size(3) == kCols &&
              K % groups == 0 && N <= blocks * kCols, "decode_int4: scales ",
              sc.sizes(), " do not fit");
  at::Tensor bias = bias_in.has_value() ? bias_in->to(at::kFloat).contiguous() : at::Tensor();
  TORCH_CHECK(!bias.defined() || bias.numel() == N, "decode_int4: bias of ", bias.numel(), " for ", N, " outputs");
  if (x_in.scalar_type() == at::kBFloat16 && has_avx512_bf16())
    return decode_int4_typed<at::BFloat16>(x_in.contiguous(), packed, sc, bias, N);
  return decode_int4_typed<float>(x_in.to(at::kFloat).contiguous(), packed, sc, bias, N);
}

template <typename T>
void dequantize_into(const at::Tensor& packed, const at::Tensor& sc, int64_t N, T* dst) {
  const int64_t steps = packed.size(1), groups = sc.size(1), K = steps * kPerWord, group_steps = steps / groups;
  const uint32_t* src = reinterpret_cast<const uint32_t*>(packed.data_ptr<int32_t>());
  const Int4Scales scales{sc.data_ptr<float>(), groups, sc.size(2)};
  const Int4Layout layout{steps, packed.size(0)};
  at::parallel_for(0, N, 16, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const int64_t b = n / kCols, c = n % kCols;
      for (int64_t s = 0; s < steps; ++s) {
        const uint32_t word = src[layout.at(b, s) + c];
        const int64_t g = s / group_steps;
        const float* bg = scales.at(b, g);
        const float sv = bg[c], cv = scales.c(bg, c);
        for (int64_t j = 0; j < kPerWord; ++j)
          dst[n * K + s * kPerWord + j] = static_cast<T>(static_cast<float>((word >> nibble_shift(j)) & 0xF) * sv - cv);
      }
    }
  });
}

// Sixteen weights of one column, the words of two steps (one group), as fp32.
VLSERVE_AVX512 inline __m512 unpack_two_steps(uint32_t first, uint32_t second, __m512 scale, __m512 c8) {
  const __m512i words = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi32(static_cast<int>(first))),
                                           _mm256_set1_epi32(static_cast<int>(second)), 1);
  const __m512i shifts = _mm512_setr_epi32(0, 16, 4, 20, 8, 24, 12, 28, 0, 16, 4, 20, 8, 24, 12, 28);
  const __m512i nib = _mm512_and_si512(_mm512_srlv_epi32(words, shifts), _mm512_set1_epi32(0xF));
  return _mm512_fmsub_ps(_mm512_cvtepi32_ps(nib), scale, c8);
}

// Row n of the dequantized weight on AVX-512 (even steps per group): fp32, or bf16 rounded to nearest even.
template <bool kBf16>
VLSERVE_AVX512 void dequantize_row_512(const uint32_t* src, const Int4Scales& scales, int64_t n,
                                       const Int4Layout& layout, void* out) {
  const int64_t steps = layout.steps, K = steps * kPerWord, group_steps = steps / scales.groups;
  const int64_t b = n / kCols, c = n % kCols;
  const int64_t stride = layout.task_blocks(b) * kCols;  // from one step's word to the next
  const uint32_t* col = src + layout.at(b, 0) + c;
  for (int64_t s = 0; s < steps; s += 2) {
    const float* g = scales.at(b, s / group_steps);
    const __m512 w = unpack_two_steps(col[s * stride], col[(s + 1) * stride], _mm512_set1_ps(g[c]),
                                      _mm512_set1_ps(scales.c(g, c)));
    if constexpr (kBf16) {
      const __m512i bits = _mm512_castps_si512(w);
      const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
      const __m512i rounded =
          _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(bits, lsb), _mm512_set1_epi32(0x7FFF)), 16);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(out) + n * K + s * kPerWord),
                          _mm512_cvtepi32_epi16(rounded));
    } else {
      _mm512_storeu_ps(static_cast<float*>(out) + n * K + s * kPerWord, w);
    }
  }
}

template <bool kBf16>
void dequantize_512(const at::Tensor& packed, const at::Tensor& sc, int64_t N, void* out) {
  const uint32_t* src = reinterpret_cast<const uint32_t*>(packed.data_ptr<int32_t>());
  const Int4Scales scales{sc.data_ptr<float>(), sc.size(1), sc.size(2)};
  const Int4Layout layout{packed.size(1), packed.size(0)};
  at::parallel_for(0, N, 16, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) dequantize_row_512<kBf16>(src, scales, n, layout, out);
  });
}

// The packed weight back to a [N, K] matrix of `dtype` (w = nibble · s - c), for prefill rows.
at::Tensor dequantize_int4(const at::Tensor& packed, const at::Tensor& sc, int64_t N, c10::ScalarType dtype) {
  TORCH_CHECK(packed.dim() == 3 && sc.dim() == 4 && N <= packed.size(0) * kCols, "dequantize_int4: bad shapes");
  at::Tensor w = at::empty({N, packed.size(1) * kPerWord}, packed.options().dtype(dtype));
  const bool vector = has_avx512() && (packed.size(1) / sc.size(1)) % 2 == 0;
  if (vector && dtype == at::kBFloat16) {
    dequantize_512<true>(packed, sc, N, w.data_ptr());
  } else if (vector && dtype == at::kFloat) {
    dequantize_512<false>(packed, sc, N, w.data_ptr());
  } else if (dtype == at::kBFloat16) {
    dequantize_into(packed, sc, N, w.data_ptr<at::BFloat16>());
  } else if (dtype == at::kHalf) {
    dequantize_into(packed, sc, N, w.data_ptr<at::Half>());
  } else {
    TORCH_CHECK(dtype == at::kFloat, "dequantize_int4: dtype ", dtype, " not served");
    dequantize_into(packed, sc, N, w.data_ptr<float>());
  }
  return w;
}

}  // namespace

TORCH_LIBRARY(vlserve_int4, m) {
  m.def("pack_int4(Tensor q, Tensor scale, Tensor? zero) -> (Tensor, Tensor)");
  m.def("decode_int4(Tensor x, Tensor packed, Tensor sc, Tensor? bias, int N) -> Tensor");
  m.def("dequantize_int4(Tensor packed, Tensor sc, int N, ScalarType dtype) -> Tensor");
  m.def("int4_supported() -> bool");
}

TORCH_LIBRARY_IMPL(vlserve_int4, CPU, m) {
  m.impl("pack_int4", &pack_int4);
  m.impl("decode_int4", &decode_int4);
  m.impl("dequantize_int4", &dequantize_int4);
}

TORCH_LIBRARY_IMPL(vlserve_int4, CompositeExplicitAutograd, m) { m.impl("int4_supported", &int4_supported); }
