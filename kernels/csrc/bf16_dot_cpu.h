// bf16 x bf16 -> fp32 products on CPUs with AVX512_BF16, for the long-extend attention blocks:
// S = Q K^T and O += P V where the pool is bf16. vdpbf16ps multiplies 32 bf16 pairs and adds each
// pair's sum into one of 16 fp32 lanes: twice the rate of widening both sides to fp32 and an fp32
// FMA, and no widening copy. (MKL's bf16 GEMM with fp32 output runs at fp32's rate on the AMD CPUs
// measured; oneDNN's bf16 matmul rounds its output to bf16, too coarse for scores.)
//
// The instruction reduces over adjacent pairs, so each operand is laid out in "pairs" (VNNI):
// a 32-bit word holds two consecutive elements along the reduced dimension, lower one first.
// - scores reduce over the head dim: a key row's words already are its pairs, so K is transposed
//   to [pair][key] (16 keys a vector) and each query row's pair is broadcast;
// - values reduce over keys: rows 2t and 2t+1 of V interleave into [t][dim] words, and each
//   probability row, rounded to bf16 as the softmax writes it (softmax_block_row_pairs in
//   paged_attention_cpu.cpp), is read as pairs of keys and broadcast.
// Products of bf16 values are exact in fp32, so the scores equal the fp32 path's up to summation
// order; P is rounded to bf16 for the second product (as FlashAttention does on GPUs), while the
// softmax, its sums and the output stay fp32.
//
// With AMX (Intel Xeons from Sapphire Rapids) both products run on the tile unit instead
// (namespace amx below): the pair layouts above are exactly what TDPBF16PS reads — Q's rows as the
// A tile, the transposed keys' [pair][key] words and the values' [key pair][dim] words as B tiles —
// so only the products change, 16 rows x 16 columns x 32 bf16 per instruction.
#pragma once

#if defined(__AVX512BF16__)
#define VLSERVE_BF16_DOT 1
#include <immintrin.h>

#include <c10/util/BFloat16.h>

#include "vec_cpu.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "amx_cpu.h"

namespace vlserve_bf16 {

constexpr int kKeyAlign = 32;  // keys per scores tile (two vectors); blocks are padded to this
constexpr int kRowAlign = 8;   // query rows per scores tile; row counts are padded to this
constexpr int64_t kMaxHeadDim = 512;

// Head dims this path takes: multiples of 8 (64, 72 as SigLIP's, 80, 128, ...), and a key row that
// fits pack_keys' buffer. One not a multiple of 16 ends in a partial vector, under a lane mask.
inline bool supports(int64_t head_dim) { return head_dim % 8 == 0 && head_dim <= kMaxHeadDim; }

// Row stride (in words) of the packed values: the head dim rounded up to whole vectors, the padding
// zero, so the second product loads whole vectors and only its output rows need the mask.
inline int64_t value_stride(int64_t D) { return (D + 15) / 16 * 16; }

// A row of D fp32 values (D even), pre-scaled by `scale`, back to bf16 pairs:
// dst[j] = (x[2j], x[2j+1]) for j < D / 2. The values were bf16 times `scale`, so dividing and
// rounding to bf16 gives those bf16 values back exactly.
inline void pack_row_pairs(const float* x, int64_t D, float scale, uint32_t* dst) {
  const __m512 inv = _mm512_set1_ps(1.0f / scale);
  for (int64_t d = 0; d < D; d += 16) {
    const __m512 row = _mm512_maskz_loadu_ps(vlserve_vec::tail_mask(D - d), x + d);
    const __m256bh h = _mm512_cvtneps_pbh(_mm512_mul_ps(row, inv));
    const __mmask8 words = static_cast<__mmask8>(vlserve_vec::tail_mask((D - d) / 2));
    _mm256_mask_storeu_epi32(dst + d / 2, words, (__m256i)h);
  }
}

// Keys j0..j0+n-1 of one kv head, transposed to kp[pair][key] (row stride n_pad); keys n..n_pad-1 zero.
inline void pack_keys(const c10::BFloat16* k_buffer, const int32_t* slots, int64_t j0, int64_t n, int64_t n_pad,
                      int64_t slot_stride, int64_t head_offset, int64_t D, uint32_t* kp_words) {
  float* kp = reinterpret_cast<float*>(kp_words);  // bf16 pairs moved as 32-bit floats, never computed on
  const int64_t pairs = D / 2;
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {  // 16 keys x 16 pairs at a time, transposed through registers
    vlserve_vec::prefetch_rows(k_buffer, slots, j0 + j + 16, std::min<int64_t>(j0 + j + 32, j0 + n), slot_stride,
                               head_offset, D);
    for (int64_t p0 = 0; p0 + 16 <= pairs; p0 += 16) {
      __m512 r[16];
      for (int i = 0; i < 16; ++i) {
        r[i] = _mm512_loadu_ps(k_buffer + static_cast<int64_t>(slots[j0 + j + i]) * slot_stride + head_offset + 2 * p0);
      }
      vlserve_vec::transpose16x16(r);  // 32-bit words: each a pair, moved as one float
      for (int c = 0; c < 16; ++c) _mm512_storeu_ps(kp + (p0 + c) * n_pad + j, r[c]);
    }
    for (int64_t p = pairs / 16 * 16; p < pairs; ++p) {  // D % 32 != 0: the last pairs one by one
      for (int i = 0; i < 16; ++i) {
        std::memcpy(kp_words + p * n_pad + j + i,
                    k_buffer + static_cast<int64_t>(slots[j0 + j + i]) * slot_stride + head_offset + 2 * p, 4);
      }
    }
  }
  for (; j < n; ++j) {
    uint32_t row[kMaxHeadDim / 2];
    std::memcpy(row, k_buffer + static_cast<int64_t>(slots[j0 + j]) * slot_stride + head_offset, D * 2);
    for (int64_t p = 0; p < pairs; ++p) kp_words[p * n_pad + j] = row[p];
  }
  for (int64_t p = 0; p < pairs; ++p) std::memset(kp_words + p * n_pad + n, 0, (n_pad - n) * sizeof(uint32_t));
}

// Values j0..j0+n-1 of one kv head as key pairs: vp[t][d] = (V[2t][d], V[2t+1][d]), rows of
// value_stride(D) words; a missing partner (odd n), pairs up to n_pad / 2 and dims past D are zero.
inline void pack_values(const c10::BFloat16* v_buffer, const int32_t* slots, int64_t j0, int64_t n, int64_t n_pad,
                        int64_t slot_stride, int64_t head_offset, int64_t D, uint32_t* vp) {
  for (int64_t t = 0; 2 * t < n_pad; ++t) {
    if (t % 8 == 0) {
      vlserve_vec::prefetch_rows(v_buffer, slots, std::min(j0 + 2 * t + 16, j0 + n), std::min(j0 + 2 * t + 32, j0 + n),
                                 slot_stride, head_offset, D);
    }
    uint32_t* dst = vp + t * value_stride(D);
    const int64_t a = 2 * t, b = 2 * t + 1;
    if (a >= n) {
      std::memset(dst, 0, value_stride(D) * sizeof(uint32_t));
      continue;
    }
    const uint16_t* lo = reinterpret_cast<const uint16_t*>(v_buffer + static_cast<int64_t>(slots[j0 + a]) * slot_stride +
                                                           head_offset);
    const uint16_t* hi = b < n ? reinterpret_cast<const uint16_t*>(
                                     v_buffer + static_cast<int64_t>(slots[j0 + b]) * slot_stride + head_offset)
                               : nullptr;
    for (int64_t d = 0; d < D; d += 16) {  // a partial last vector: dims past D read as 0
      const __mmask16 dims = vlserve_vec::tail_mask(D - d);
      const __m512i l = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(dims, lo + d));
      const __m512i h = hi ? _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(dims, hi + d)), 16)
                           : _mm512_setzero_si512();
      _mm512_storeu_si512(dst + d, _mm512_or_si512(l, h));
    }
  }
}

// s[r][0..n_pad) = scale * (q row r . key) for rows 0..rows_pad-1 (multiple of kRowAlign) and the
// first n_pad keys (a multiple of kKeyAlign) in tiles of kKeyAlign; qp [rows_pad][pairs], kp
// [pairs][k_stride] (k_stride >= n_pad: a tile of rows may need fewer keys than the block holds).
inline void scores(const uint32_t* qp, int64_t rows_pad, const uint32_t* kp, int64_t k_stride, int64_t n_pad,
                   int64_t pairs, float scale, float* s) {
  const __m512 sc = _mm512_set1_ps(scale);
  for (int64_t n0 = 0; n0 < n_pad; n0 += kKeyAlign) {  // the key tile stays in L1 across row tiles
    for (int64_t r0 = 0; r0 < rows_pad; r0 += kRowAlign) {
      __m512 acc[kRowAlign][2];
      for (int r = 0; r < kRowAlign; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
      const uint32_t* q = qp + r0 * pairs;
      for (int64_t p = 0; p < pairs; ++p) {
        const __m512bh k0 = (__m512bh)_mm512_loadu_si512(kp + p * k_stride + n0);
        const __m512bh k1 = (__m512bh)_mm512_loadu_si512(kp + p * k_stride + n0 + 16);
        for (int r = 0; r < kRowAlign; ++r) {
          const __m512bh qv = (__m512bh)_mm512_set1_epi32(static_cast<int>(q[r * pairs + p]));
          acc[r][0] = _mm512_dpbf16_ps(acc[r][0], qv, k0);
          acc[r][1] = _mm512_dpbf16_ps(acc[r][1], qv, k1);
        }
      }
      for (int r = 0; r < kRowAlign; ++r) {
        _mm512_storeu_ps(s + (r0 + r) * n_pad + n0, _mm512_mul_ps(acc[r][0], sc));
        _mm512_storeu_ps(s + (r0 + r) * n_pad + n0 + 16, _mm512_mul_ps(acc[r][1], sc));
      }
    }
  }
}

// out[r][d0 .. d0 + 16 NV) += sum over key pairs t of pp[r][t] . vp[t][d], for R rows from r0; the
// last vector's lanes outside `last` are neither read nor written in out (a partial vector).
template <int R, int NV>
inline void accumulate_tile(const uint32_t* pp, const uint32_t* vp, int64_t half, int64_t D, int64_t r0, int64_t d0,
                            __mmask16 last, float* out) {
  const int64_t v_stride = value_stride(D);
  __m512 acc[R][NV];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c + 1 < NV; ++c) acc[r][c] = _mm512_loadu_ps(out + (r0 + r) * D + d0 + 16 * c);
    acc[r][NV - 1] = _mm512_maskz_loadu_ps(last, out + (r0 + r) * D + d0 + 16 * (NV - 1));
  }
  for (int64_t t = 0; t < half; ++t) {
    __m512bh v[NV];
    for (int c = 0; c < NV; ++c) {
      __m512i w = _mm512_loadu_si512(vp + t * v_stride + d0 + 16 * c);
      __asm__("" : "+v"(w));  // one load per vector, not one per row (see f32_tiles_cpu.h)
      v[c] = (__m512bh)w;
    }
    for (int r = 0; r < R; ++r) {
      const __m512bh p = (__m512bh)_mm512_set1_epi32(static_cast<int>(pp[(r0 + r) * half + t]));
      for (int c = 0; c < NV; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], p, v[c]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c + 1 < NV; ++c) _mm512_storeu_ps(out + (r0 + r) * D + d0 + 16 * c, acc[r][c]);
    _mm512_mask_storeu_ps(out + (r0 + r) * D + d0 + 16 * (NV - 1), last, acc[r][NV - 1]);
  }
}

// Output vectors in one pass over the key pairs: up to 5 (4 rows x 5 accumulators fill 20 of the
// 32 registers), so a head dim of 72 or 80 is one pass, not 4 vectors and then a pass for the rest.
constexpr int kMaxPassVectors = 5;

template <int R>
inline void accumulate_rows(const uint32_t* pp, const uint32_t* vp, int64_t half, int64_t D, int64_t r0, float* out) {
  int64_t d0 = 0;
  for (; (D - d0 + 15) / 16 > kMaxPassVectors; d0 += 64) {
    accumulate_tile<R, 4>(pp, vp, half, D, r0, d0, __mmask16(0xFFFF), out);
  }
  const __mmask16 last = vlserve_vec::tail_mask(D - d0 - (D - d0 - 1) / 16 * 16);
  switch ((D - d0 + 15) / 16) {
    case 5: accumulate_tile<R, 5>(pp, vp, half, D, r0, d0, last, out); break;
    case 4: accumulate_tile<R, 4>(pp, vp, half, D, r0, d0, last, out); break;
    case 3: accumulate_tile<R, 3>(pp, vp, half, D, r0, d0, last, out); break;
    case 2: accumulate_tile<R, 2>(pp, vp, half, D, r0, d0, last, out); break;
    case 1: accumulate_tile<R, 1>(pp, vp, half, D, r0, d0, last, out); break;
    default: break;
  }
}

// out[r] += P[r] V for rows 0..rows-1 (D even); pp [rows][n_pad / 2], vp [n_pad / 2][value_stride(D)].
inline void accumulate(const uint32_t* pp, const uint32_t* vp, int64_t rows, int64_t n_pad, int64_t D, float* out) {
  const int64_t half = n_pad / 2;
  int64_t r0 = 0;
  for (; r0 + 4 <= rows; r0 += 4) accumulate_rows<4>(pp, vp, half, D, r0, out);
  for (; r0 < rows; ++r0) accumulate_rows<1>(pp, vp, half, D, r0, out);
}

#if defined(VLSERVE_AMX)
namespace amx {

constexpr int kRowAlign = 16;  // a tile's rows: row counts are padded to this

// Head dims the tile path takes: whole A tiles of 16 pairs along the head dim.
inline bool supports(int64_t head_dim) { return head_dim % 32 == 0 && head_dim <= kMaxHeadDim; }

// Every tile 16 rows x 64 bytes, for scores() and accumulate() below.
class Scope : public vlserve_amx::Scope {
 public:
  Scope() : vlserve_amx::Scope(kShapes) {}

 private:
  static constexpr vlserve_amx::TileShape kShapes[8] = {{16, 64}, {16, 64}, {16, 64}, {16, 64},
                                                         {16, 64}, {16, 64}, {16, 64}, {16, 64}};
};

// s[r][0..n_pad) = q row r . key, unscaled (the softmax applies the scale), for rows_pad rows (a
// multiple of 16) and n_pad keys (a multiple of kKeyAlign): per 16 rows x 32 keys, two C tiles
// (tmm0-1) over the head dim's 16-pair steps, A = Q (tmm4), B = two 16-key slices of K^T (tmm6-7).
inline void scores(const uint32_t* qp, int64_t rows_pad, const uint32_t* kp, int64_t k_stride, int64_t n_pad,
                   int64_t pairs, float* s) {
  for (int64_t r0 = 0; r0 < rows_pad; r0 += 16) {
    for (int64_t n0 = 0; n0 < n_pad; n0 += kKeyAlign) {
      _tile_zero(0);
      _tile_zero(1);
      for (int64_t p0 = 0; p0 < pairs; p0 += 16) {
        _tile_loadd(4, qp + r0 * pairs + p0, pairs * 4);
        _tile_loadd(6, kp + p0 * k_stride + n0, k_stride * 4);
        _tile_loadd(7, kp + p0 * k_stride + n0 + 16, k_stride * 4);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
      }
      _tile_stored(0, s + r0 * n_pad + n0, n_pad * 4);
      _tile_stored(1, s + r0 * n_pad + n0 + 16, n_pad * 4);
    }
  }
}

// out[r0 .. r0 + 16)[d0 .. d0 + 16 NC) += P V: C tiles tmm0.. (NC <= 4) kept over every key pair
// step, A = 16 probability rows x 16 key pairs (tmm4), B = the values' step (tmm5-7 in turn).
template <int NC>
inline void accumulate_tiles(const uint32_t* pp, const uint32_t* vp, int64_t half, int64_t D, int64_t r0, int64_t d0,
                             float* out) {
  float* c = out + r0 * D + d0;
  const int64_t cs = D * 4;
  _tile_loadd(0, c, cs);
  if constexpr (NC > 1) _tile_loadd(1, c + 16, cs);
  if constexpr (NC > 2) _tile_loadd(2, c + 32, cs);
  if constexpr (NC > 3) _tile_loadd(3, c + 48, cs);
  for (int64_t t0 = 0; t0 < half; t0 += 16) {
    const uint32_t* b = vp + t0 * D + d0;
    _tile_loadd(4, pp + r0 * half + t0, half * 4);
    _tile_loadd(5, b, cs);
    _tile_dpbf16ps(0, 4, 5);
    if constexpr (NC > 1) {
      _tile_loadd(6, b + 16, cs);
      _tile_dpbf16ps(1, 4, 6);
    }
    if constexpr (NC > 2) {
      _tile_loadd(7, b + 32, cs);
      _tile_dpbf16ps(2, 4, 7);
    }
    if constexpr (NC > 3) {
      _tile_loadd(5, b + 48, cs);
      _tile_dpbf16ps(3, 4, 5);
    }
  }
  _tile_stored(0, c, cs);
  if constexpr (NC > 1) _tile_stored(1, c + 16, cs);
  if constexpr (NC > 2) _tile_stored(2, c + 32, cs);
  if constexpr (NC > 3) _tile_stored(3, c + 48, cs);
}

// out[r] += P[r] V for rows 0..rows_pad-1 (a multiple of 16: the rows past the real ones are the
// scratch's padding, never read back); pp [rows_pad][n_pad / 2], vp [n_pad / 2][D], D % 16 == 0.
inline void accumulate(const uint32_t* pp, const uint32_t* vp, int64_t rows_pad, int64_t n_pad, int64_t D,
                       float* out) {
  const int64_t half = n_pad / 2;
  for (int64_t r0 = 0; r0 < rows_pad; r0 += 16) {
    int64_t d0 = 0;
    for (; d0 + 64 <= D; d0 += 64) accumulate_tiles<4>(pp, vp, half, D, r0, d0, out);
    switch ((D - d0) / 16) {
      case 3: accumulate_tiles<3>(pp, vp, half, D, r0, d0, out); break;
      case 2: accumulate_tiles<2>(pp, vp, half, D, r0, d0, out); break;
      case 1: accumulate_tiles<1>(pp, vp, half, D, r0, d0, out); break;
      default: break;
    }
  }
}

}  // namespace amx
#endif  // VLSERVE_AMX

}  // namespace vlserve_bf16

#endif  // __AVX512BF16__
