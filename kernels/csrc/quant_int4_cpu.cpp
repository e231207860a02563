// W4A16 GEMM: y[M, N] = x[M, K] · wᵀ (+ bias) where w[n][k] = (q[n][k] - z[n][g]) · s[n][g] for k in
// group g (G elements of K per group; z = 0 when symmetric), x and y fp32.
//
// The weight is packed once (pack_int4) into words of eight K elements of one column — nibble j of
// a word is q + 8 of element 8·step + j — laid out packed[block][step][column] for blocks of 16
// columns, so 64 bytes are 16 columns x 8 elements of K. Beside it, per block, group and column,
// the scale s and c = s · (8 + z), so that w = nibble · s - c.
//
// Decode rows (decode_int4, AVX-512): the nibbles are unpacked and widened to fp32 in registers (a
// shift, a mask, a conversion per eight columns' element, shared by every row of the block) and
// multiplied into per-group sums Σ nibble · x; at each group's end acc += s · sums - c · Σ x (the
// row's group sums of x, passed in). Nothing of the weight is written out. Register block: up to
// 4 rows x 2 column blocks (or 2 rows x 4 blocks).
// Prefill rows (dequantize_int4): the weight is unpacked to a full-precision matrix once per call and
// the caller's BLAS runs the product, whose arithmetic then dwarfs the unpacking.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#define VLSERVE_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))

namespace {

constexpr int64_t kCols = 16;
constexpr int64_t kPerWord = 8;

bool has_avx512() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
}

bool int4_supported() { return has_avx512(); }

// q [N, K] int8 in [-8, 7]; scale [N, K/G] float; zero [N, K/G] int8 or None ->
// (packed [N/16, K/8, 16] int32, sc [N/16, K/G, 2, 16] fp32: s, then c = s · (8 + z)).
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
  at::Tensor sc = at::zeros({blocks, groups, 2, kCols}, scale.options());
  const int8_t* qs = q.data_ptr<int8_t>();
  const float* ss = scale.data_ptr<float>();
  const int8_t* zs = zero.defined() ? zero.data_ptr<int8_t>() : nullptr;
  uint32_t* dst = reinterpret_cast<uint32_t*>(packed.data_ptr<int32_t>());
  float* scd = sc.data_ptr<float>();
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      for (int64_t c = 0; c < kCols && b * kCols + c < N; ++c) {
        const int64_t n = b * kCols + c;
        for (int64_t s = 0; s < steps; ++s) {
          uint32_t word = 0;
          for (int64_t j = 0; j < kPerWord; ++j)
            word |= static_cast<uint32_t>(qs[n * K + s * kPerWord + j] + 8) << (4 * j);
          dst[(b * steps + s) * kCols + c] = word;
        }
        for (int64_t g = 0; g < groups; ++g) {
          const float s = ss[n * groups + g];
          const float z = zs ? static_cast<float>(zs[n * groups + g]) : 0.f;
          scd[((b * groups + g) * 2) * kCols + c] = s;
          scd[((b * groups + g) * 2 + 1) * kCols + c] = s * (8.f + z);
        }
      }
    }
  });
  return {packed, sc};
}

struct Int4Args {
  const float* x;       // [M, K]
  const float* xsum;    // [M, groups]: Σ x over each group
  const uint32_t* w;    // packed
  const float* sc;      // [blocks, groups, 2, 16]
  const float* bias;    // [N] or null
  float* y;             // [M, N]
  int64_t K, N, groups, steps, group_steps;
};

template <int R, int C>
VLSERVE_AVX512 void block_int4(const Int4Args& a, int64_t m0, int64_t b0) {
  __m512 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  const __m512i mask = _mm512_set1_epi32(0xF);
  for (int64_t g = 0; g < a.groups; ++g) {
    __m512 part[R][C];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) part[r][c] = _mm512_setzero_ps();
    for (int64_t s = g * a.group_steps; s < (g + 1) * a.group_steps; ++s) {
      __m512i words[C];
      for (int c = 0; c < C; ++c)
        words[c] = _mm512_loadu_si512(a.w + ((b0 + c) * a.steps + s) * kCols);
      for (int j = 0; j < kPerWord; ++j) {
        __m512 wf[C];
        for (int c = 0; c < C; ++c)
          wf[c] = _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(words[c], 4 * j), mask));
        for (int r = 0; r < R; ++r) {
          const __m512 xv = _mm512_set1_ps(a.x[(m0 + r) * a.K + s * kPerWord + j]);
          for (int c = 0; c < C; ++c) part[r][c] = _mm512_fmadd_ps(wf[c], xv, part[r][c]);
        }
      }
    }
    for (int c = 0; c < C; ++c) {
      const float* scp = a.sc + ((b0 + c) * a.groups + g) * 2 * kCols;
      const __m512 s = _mm512_loadu_ps(scp), cc = _mm512_loadu_ps(scp + kCols);
      for (int r = 0; r < R; ++r) {
        const __m512 xs = _mm512_set1_ps(a.xsum[(m0 + r) * a.groups + g]);
        acc[r][c] = _mm512_fnmadd_ps(cc, xs, _mm512_fmadd_ps(s, part[r][c], acc[r][c]));
      }
    }
  }
  alignas(64) float out[kCols];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      _mm512_store_ps(out, acc[r][c]);
      const int64_t n0 = (b0 + c) * kCols, n = std::min<int64_t>(kCols, a.N - n0);
      for (int64_t i = 0; i < n; ++i) a.y[(m0 + r) * a.N + n0 + i] = out[i] + (a.bias ? a.bias[n0 + i] : 0.f);
    }
}

template <int R>
void rows_int4(const Int4Args& a, int64_t m0, int64_t b0, int64_t nb) {
  constexpr int C = R <= 2 ? 4 : 2;
  int64_t b = b0;
  for (; b + C <= b0 + nb; b += C) block_int4<R, C>(a, m0, b);
  for (; b < b0 + nb; ++b) block_int4<R, 1>(a, m0, b);
}

// y [M, N] fp32 for x [M, K] (any float dtype; M a few rows) on the packed weight.
at::Tensor decode_int4(const at::Tensor& x_in, const at::Tensor& packed, const at::Tensor& sc,
                       const std::optional<at::Tensor>& bias_in, int64_t N) {
  TORCH_CHECK(int4_supported(), "decode_int4 needs AVX-512");
  const at::Tensor x = x_in.to(at::kFloat).contiguous();
  TORCH_CHECK(x.dim() == 2 && packed.dim() == 3 && packed.size(2) == kCols && x.size(1) == packed.size(1) * kPerWord,
              "decode_int4: x ", x.sizes(), " does not fit the packed weight ", packed.sizes());
  const int64_t M = x.size(0), K = x.size(1), groups = sc.size(1), blocks = packed.size(0);
  TORCH_CHECK(sc.dim() == 4 && sc.size(0) == blocks && K % groups == 0 && N <= blocks * kCols, "decode_int4: scales ",
              sc.sizes(), " do not fit");
  const at::Tensor xsum = x.view({M, groups, K / groups}).sum(-1).contiguous();
  at::Tensor bias = bias_in.has_value() ? bias_in->to(at::kFloat).contiguous() : at::Tensor();
  at::Tensor y = at::empty({M, N}, x.options());
  Int4Args a{x.data_ptr<float>(), xsum.data_ptr<float>(), reinterpret_cast<const uint32_t*>(packed.data_ptr<int32_t>()),
             sc.data_ptr<float>(), bias.defined() ? bias.data_ptr<float>() : nullptr, y.data_ptr<float>(),
             K, N, groups, packed.size(1), (K / groups) / kPerWord};
  constexpr int64_t kTaskBlocks = 4;
  const int64_t tasks = (blocks + kTaskBlocks - 1) / kTaskBlocks;
  at::parallel_for(0, tasks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t b0 = t * kTaskBlocks, nb = std::min(kTaskBlocks, blocks - b0);
      int64_t m = 0;
      for (; m + 4 <= M; m += 4) rows_int4<4>(a, m, b0, nb);
      switch (M - m) {
        case 3: rows_int4<3>(a, m, b0, nb); break;
        case 2: rows_int4<2>(a, m, b0, nb); break;
        case 1: rows_int4<1>(a, m, b0, nb); break;
        default: break;
      }
    }
  });
  return y;
}

// The packed weight back to a [N, K] matrix of `dtype` (w = nibble · s - c), for prefill rows.
at::Tensor dequantize_int4(const at::Tensor& packed, const at::Tensor& sc, int64_t N, c10::ScalarType dtype) {
  const int64_t blocks = packed.size(0), steps = packed.size(1), groups = sc.size(1), K = steps * kPerWord;
  const int64_t group_steps = steps / groups;
  at::Tensor w = at::empty({N, K}, packed.options().dtype(at::kFloat));
  const uint32_t* src = reinterpret_cast<const uint32_t*>(packed.data_ptr<int32_t>());
  const float* scp = sc.data_ptr<float>();
  float* dst = w.data_ptr<float>();
  at::parallel_for(0, N, 16, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const int64_t b = n / kCols, c = n % kCols;
      for (int64_t s = 0; s < steps; ++s) {
        const uint32_t word = src[(b * steps + s) * kCols + c];
        const int64_t g = s / group_steps;
        const float sv = scp[((b * groups + g) * 2) * kCols + c], cv = scp[((b * groups + g) * 2 + 1) * kCols + c];
        for (int64_t j = 0; j < kPerWord; ++j)
          dst[n * K + s * kPerWord + j] = static_cast<float>((word >> (4 * j)) & 0xF) * sv - cv;
      }
    }
  });
  (void)blocks;
  return dtype == at::kFloat ? w : w.to(dtype);
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
