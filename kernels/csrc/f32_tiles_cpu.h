// fp32 products of the long-extend attention blocks on AVX-512: S = Q K^T and O += P V for a tile
// of query rows against a block of keys, in register tiles, for pools whose keys are not bf16 dot
// product material (fp32, fp16, or bf16 on a CPU without AVX512_BF16).
//
// Through BLAS (at::mm / oneDNN) each block paid a widening copy of K and V, a call's fixed cost
// for a product whose reduced dimension is only the head dim (64), and a scores matrix of a whole
// item's rows (512 x 512 floats, 1 MB) that fell out of L2 between the two products. Here a tile
// of rows (32) against the block's keys keeps its scores in L1/L2, and the block's keys, transposed
// once to [dim][key], and values stay in L2 for every tile. Same layout and loop order as
// bf16_dot_cpu.h, with one fp32 FMA where that has a bf16 pair's dot product.
#pragma once

#if defined(__AVX512F__)
#define VLSERVE_F32_TILES 1
#include <immintrin.h>

#include "vec_cpu.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace vlserve_f32 {

constexpr int kKeyAlign = 32;  // keys per scores tile (two vectors); blocks are padded to this
constexpr int kRowAlign = 8;   // query rows per scores tile; row counts are padded to this

// Head dims this path takes: multiples of 8 (64, 72 as SigLIP's, 80, 128, ...). A head dim that is
// not a multiple of 16 ends in a partial vector, loaded and stored under a lane mask.
inline bool supports(int64_t head_dim) { return head_dim % 8 == 0; }

// Row stride of the packed values: the head dim rounded up to whole vectors, the padding zero, so
// the second product loads whole vectors and only its output rows need the mask.
inline int64_t value_stride(int64_t D) { return (D + 15) / 16 * 16; }

// Keys j0..j0+n-1 of one kv head, widened to fp32 and transposed to kt[dim][key] (row stride
// n_pad); keys n..n_pad-1 are zero.
template <typename T>
inline void pack_keys(const T* k_buffer, const int32_t* slots, int64_t j0, int64_t n, int64_t n_pad, int64_t slot_stride,
                      int64_t head_offset, int64_t D, float* kt) {
  for (int64_t j = 0; j < n_pad; j += 16) {  // 16 keys x 16 dims at a time, through registers
    vlserve_vec::prefetch_rows(k_buffer, slots, j0 + j + 16, std::min<int64_t>(j0 + j + 32, j0 + n), slot_stride,
                               head_offset, D);
    for (int64_t d0 = 0; d0 < D; d0 += 16) {
      const int64_t dims = std::min<int64_t>(16, D - d0);  // a partial last vector: its dims only
      __m512 r[16];
      for (int i = 0; i < 16; ++i) {
        const T* row = k_buffer + static_cast<int64_t>(slots[j0 + j + i]) * slot_stride + head_offset + d0;
        r[i] = j + i >= n ? _mm512_setzero_ps() : dims == 16 ? (__m512)vlserve_vec::load16(row)
                                                             : vlserve_vec::load16_tail(row, dims);
      }
      vlserve_vec::transpose16x16(r);
      for (int c = 0; c < dims; ++c) _mm512_storeu_ps(kt + (d0 + c) * n_pad + j, r[c]);
    }
  }
}

// Values j0..j0+n-1 of one kv head, widened to fp32 rows vr[key][dim] of value_stride(D) floats.
template <typename T>
inline void pack_values(const T* v_buffer, const int32_t* slots, int64_t j0, int64_t n, int64_t slot_stride,
                        int64_t head_offset, int64_t D, float* vr) {
  for (int64_t j = 0; j < n; ++j) {
    if (j % 16 == 0) {
      vlserve_vec::prefetch_rows(v_buffer, slots, j0 + j + 16, std::min<int64_t>(j0 + j + 32, j0 + n), slot_stride,
                                 head_offset, D);
    }
    const T* src = v_buffer + static_cast<int64_t>(slots[j0 + j]) * slot_stride + head_offset;
    float* dst = vr + j * value_stride(D);
    int64_t d = 0;
    for (; d + 16 <= D; d += 16) vlserve_vec::storeu(dst + d, vlserve_vec::load16(src + d));
    if (d < D) _mm512_storeu_ps(dst + d, vlserve_vec::load16_tail(src + d, D - d));
  }
}

// s[r][0..n_pad) = q row r . key for rows 0..rows_pad-1 (a multiple of kRowAlign) and the first
// n_pad keys (a multiple of kKeyAlign); q [rows_pad][D] (already scaled), kt [D][k_stride].
inline void scores(const float* q, int64_t rows_pad, const float* kt, int64_t k_stride, int64_t n_pad, int64_t D,
                   float* s) {
  for (int64_t n0 = 0; n0 < n_pad; n0 += kKeyAlign) {  // the key tile stays in L1 across row tiles
    for (int64_t r0 = 0; r0 < rows_pad; r0 += kRowAlign) {
      __m512 acc[kRowAlign][2];
      for (int r = 0; r < kRowAlign; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
      const float* qr = q + r0 * D;
      for (int64_t d = 0; d < D; ++d) {
        const __m512 k0 = _mm512_loadu_ps(kt + d * k_stride + n0);
        const __m512 k1 = _mm512_loadu_ps(kt + d * k_stride + n0 + 16);
        for (int r = 0; r < kRowAlign; ++r) {
          const __m512 qv = _mm512_set1_ps(qr[r * D + d]);
          acc[r][0] = _mm512_fmadd_ps(qv, k0, acc[r][0]);
          acc[r][1] = _mm512_fmadd_ps(qv, k1, acc[r][1]);
        }
      }
      for (int r = 0; r < kRowAlign; ++r) {
        _mm512_storeu_ps(s + (r0 + r) * n_pad + n0, acc[r][0]);
        _mm512_storeu_ps(s + (r0 + r) * n_pad + n0 + 16, acc[r][1]);
      }
    }
  }
}

// out[r][d0 .. d0 + 16 NV) += sum over keys j < n of p[r][j] v[j][d], for R rows from r0; the last
// vector's lanes outside `last` are neither read nor written in out (a head dim's partial vector).
template <int R, int NV>
inline void accumulate_tile(const float* p, int64_t p_stride, const float* v, int64_t n, int64_t D, int64_t r0,
                            int64_t d0, __mmask16 last, float* out) {
  const int64_t v_stride = value_stride(D);
  __m512 acc[R][NV];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c + 1 < NV; ++c) acc[r][c] = _mm512_loadu_ps(out + (r0 + r) * D + d0 + 16 * c);
    acc[r][NV - 1] = _mm512_maskz_loadu_ps(last, out + (r0 + r) * D + d0 + 16 * (NV - 1));
  }
  for (int64_t j = 0; j < n; ++j) {
    __m512 vj[NV];
    for (int c = 0; c < NV; ++c) {
      vj[c] = _mm512_loadu_ps(v + j * v_stride + d0 + 16 * c);
      // Keep the row in a register: GCC otherwise folds this load into each of the R FMAs that
      // use it, and R loads per vector instead of one made the loop wait on the load ports.
      __asm__("" : "+v"(vj[c]));
    }
    for (int r = 0; r < R; ++r) {
      const __m512 pr = _mm512_set1_ps(p[(r0 + r) * p_stride + j]);
      for (int c = 0; c < NV; ++c) acc[r][c] = _mm512_fmadd_ps(pr, vj[c], acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c + 1 < NV; ++c) _mm512_storeu_ps(out + (r0 + r) * D + d0 + 16 * c, acc[r][c]);
    _mm512_mask_storeu_ps(out + (r0 + r) * D + d0 + 16 * (NV - 1), last, acc[r][NV - 1]);
  }
}

// Output vectors in one pass over the keys: up to 5 (4 rows x 5 accumulators fill 20 of the 32
// registers), so a head dim of 72 or 80 is one pass, not 4 vectors and then a pass for the rest.
constexpr int kMaxPassVectors = 5;

template <int R>
inline void accumulate_rows(const float* p, int64_t p_stride, const float* v, int64_t n, int64_t D, int64_t r0,
                            float* out) {
  int64_t d0 = 0;
  for (; (D - d0 + 15) / 16 > kMaxPassVectors; d0 += 64) {
    accumulate_tile<R, 4>(p, p_stride, v, n, D, r0, d0, __mmask16(0xFFFF), out);
  }
  const __mmask16 last = vlserve_vec::tail_mask(D - d0 - (D - d0 - 1) / 16 * 16);
  switch ((D - d0 + 15) / 16) {
    case 5: accumulate_tile<R, 5>(p, p_stride, v, n, D, r0, d0, last, out); break;
    case 4: accumulate_tile<R, 4>(p, p_stride, v, n, D, r0, d0, last, out); break;
    case 3: accumulate_tile<R, 3>(p, p_stride, v, n, D, r0, d0, last, out); break;
    case 2: accumulate_tile<R, 2>(p, p_stride, v, n, D, r0, d0, last, out); break;
    case 1: accumulate_tile<R, 1>(p, p_stride, v, n, D, r0, d0, last, out); break;
    default: break;
  }
}

// out[r] += P[r] V for rows 0..rows-1 over keys 0..n-1; p [rows][p_stride], v [n][value_stride(D)].
inline void accumulate(const float* p, int64_t p_stride, const float* v, int64_t rows, int64_t n, int64_t D,
                       float* out) {
  int64_t r0 = 0;
  for (; r0 + 4 <= rows; r0 += 4) accumulate_rows<4>(p, p_stride, v, n, D, r0, out);
  for (; r0 < rows; ++r0) accumulate_rows<1>(p, p_stride, v, n, D, r0, out);
}

}  // namespace vlserve_f32

#endif  // __AVX512F__
