// One CPU vector register as GCC/Clang vector extensions, and the loads every kernel of ours shares
// (paged attention, the small-row GEMM, the fused elementwise steps). The width is whatever
// -march=native gives: 16 floats with AVX-512, else 8.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__AVX__)
#include <immintrin.h>
#endif

namespace vlserve_vec {

#if defined(__AVX512F__)
#define VLSERVE_LANES 16
#else
#define VLSERVE_LANES 8
#endif
constexpr int kLanes = VLSERVE_LANES;  // floats per vector

typedef float vf __attribute__((vector_size(VLSERVE_LANES * 4)));
typedef int32_t vi __attribute__((vector_size(VLSERVE_LANES * 4)));
typedef uint32_t vu __attribute__((vector_size(VLSERVE_LANES * 4)));
typedef uint16_t vh __attribute__((vector_size(VLSERVE_LANES * 2)));
typedef float vf4 __attribute__((vector_size(16)));

inline vf splat(float x) { return vf{} + x; }
// Lane-wise max; where a is NaN, b (as vmaxps). One instruction: a compare-and-select built from
// masks is three, in a dependency chain when it runs along a row.
inline vf vmax(vf a, vf b) {
#if defined(__AVX512F__)
  return (vf)_mm512_max_ps((__m512)a, (__m512)b);
#elif defined(__AVX__)
  return (vf)_mm256_max_ps((__m256)a, (__m256)b);
#else
  return a > b ? a : b;
#endif
}
inline vf loadu(const float* p) { vf v; std::memcpy(&v, p, sizeof(v)); return v; }
inline void storeu(float* p, vf v) { std::memcpy(p, &v, sizeof(v)); }

// kLanes values of any stored dtype, widened to fp32.
inline vf load16(const float* p) { return loadu(p); }
inline vf load16(const c10::BFloat16* p) {  // bf16 is the top half of an fp32
#if defined(__AVX512F__)
  // one vpmovzxwd from memory and a shift: GCC's own code for the vector conversion below widened
  // each 8-lane half apart and joined them (bf16 rotary and SiLU ran 2.5-6x slower than fp32)
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return (vf)_mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
#else
  vh h;
  std::memcpy(&h, p, sizeof(h));
  return (vf)(__builtin_convertvector(h, vu) << 16);
#endif
}
inline vf load16(const c10::Half* p) {
  vf v;
  for (int i = 0; i < kLanes; ++i) v[i] = static_cast<float>(p[i]);
  return v;
}

// kLanes fp32 values rounded to bf16 as c10::BFloat16(float) does (to nearest even; NaN -> 0x7FC0),
// each lane's bf16 in its top 16 bits (the low 16 are not cleared).
inline vu round_bf16_high(vf v) {
#if defined(__AVX512F__)
  // in intrinsics: GCC's code for the vector extensions' compare and narrowing took several
  // instructions each (a NaN mask as a vector, permutes to narrow)
  const __m512i bits = _mm512_castps_si512((__m512)v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
  const __mmask16 nan = _mm512_cmp_ps_mask((__m512)v, (__m512)v, _CMP_UNORD_Q);
  return (vu)_mm512_mask_mov_epi32(rounded, nan, _mm512_set1_epi32(0x7FC00000));
#else
  vu bits;
  std::memcpy(&bits, &v, sizeof(bits));
  const vu rounded = bits + ((bits >> 16) & 1u) + 0x7FFFu;
  const vu nan = (vu)(v != v);  // all ones where v is NaN
  return (rounded & ~nan) | (nan & 0x7FC00000u);
#endif
}
inline vh round_bf16(vf v) {
#if defined(__AVX512F__)
  const __m256i h = _mm512_cvtepi32_epi16(_mm512_srli_epi32((__m512i)round_bf16_high(v), 16));
  vh out;
  std::memcpy(&out, &h, sizeof(out));
  return out;
#else
  return __builtin_convertvector(round_bf16_high(v) >> 16, vh);
#endif
}
inline void store16(c10::BFloat16* p, vf v) { const vh h = round_bf16(v); std::memcpy(p, &h, sizeof(h)); }
inline void store16(float* p, vf v) { storeu(p, v); }
// fp32 values rounded through bf16 and widened back: the model dtype's rounding, kLanes at a time
// (the low halves cleared, no narrowing and widening).
inline vf through_bf16(vf v) { return (vf)(round_bf16_high(v) & 0xFFFF0000u); }

inline float hsum(vf v) {
  vf4 acc{};
  for (int i = 0; i < kLanes; i += 4) {  // add the 4-float quarters, then within one
    vf4 part;
    std::memcpy(&part, reinterpret_cast<const char*>(&v) + i * sizeof(float), sizeof(part));
    acc += part;
  }
  return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

// Pool rows of slots[j] for j in [begin, end), one kv head's, asked for ahead of use: the slots are
// scattered over the pool, which defeats the hardware prefetcher.
template <typename T>
inline void prefetch_rows(const T* buffer, const int32_t* slots, int64_t begin, int64_t end, int64_t slot_stride,
                          int64_t head_offset, int64_t D) {
  for (int64_t j = begin; j < end; ++j) {
    const T* row = buffer + static_cast<int64_t>(slots[j]) * slot_stride + head_offset;
    for (int64_t d = 0; d < D; d += 64 / sizeof(T)) __builtin_prefetch(row + d, 0, 2);  // to L2, not L1
  }
}

#if defined(__AVX512F__)
// r[i][j] -> r[j][i] for a 16 x 16 block of floats: 32-bit, then 64-bit unpacks within 128-bit
// lanes (u[4m + c] lane L: rows 4m..4m+3 of column 4L + c), then two 128-bit lane shuffles gather
// column 4L + c's four row groups.
inline void transpose16x16(__m512 r[16]) {
  __m512 t[16], u[16];
  for (int k = 0; k < 8; ++k) {
    t[2 * k] = _mm512_unpacklo_ps(r[2 * k], r[2 * k + 1]);
    t[2 * k + 1] = _mm512_unpackhi_ps(r[2 * k], r[2 * k + 1]);
  }
  for (int m = 0; m < 4; ++m) {
    const __m512d a = _mm512_castps_pd(t[4 * m]), b = _mm512_castps_pd(t[4 * m + 1]);
    const __m512d c = _mm512_castps_pd(t[4 * m + 2]), d = _mm512_castps_pd(t[4 * m + 3]);
    u[4 * m] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    u[4 * m + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    u[4 * m + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    u[4 * m + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
  for (int c = 0; c < 4; ++c) {
    const __m512 lo01 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x44), lo23 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x44);
    const __m512 hi01 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xEE), hi23 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xEE);
    r[c] = _mm512_shuffle_f32x4(lo01, lo23, 0x88);
    r[4 + c] = _mm512_shuffle_f32x4(lo01, lo23, 0xDD);
    r[8 + c] = _mm512_shuffle_f32x4(hi01, hi23, 0x88);
    r[12 + c] = _mm512_shuffle_f32x4(hi01, hi23, 0xDD);
  }
}

// Lanes 0..n-1 set (n clipped to 0..16): the tail of a row whose length is not a multiple of 16.
inline __mmask16 tail_mask(int64_t n) {
  return n >= 16 ? __mmask16(0xFFFF) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1);
}

// The first n (<= 16) values of any stored dtype widened to fp32, the other lanes 0; nothing past
// p + n is read.
inline __m512 load16_tail(const float* p, int64_t n) { return _mm512_maskz_loadu_ps(tail_mask(n), p); }
inline __m512 load16_tail(const c10::BFloat16* p, int64_t n) {
  const __m256i h = _mm256_maskz_loadu_epi16(tail_mask(n), p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline __m512 load16_tail(const c10::Half* p, int64_t n) {
  c10::Half h[16] = {};
  std::memcpy(h, p, std::max<int64_t>(0, std::min<int64_t>(n, 16)) * sizeof(c10::Half));
  return (__m512)load16(h);
}

// Sixteen vectors to one: lane i = the sum of a[i]'s lanes. Pairs of vectors fold together level by
// level (unpacks within 128-bit lanes, then lane shuffles): 30 shuffles and 15 adds where sixteen
// separate horizontal sums take twice that, and write one lane at a time through memory.
inline __m512 reduce16(const __m512 a[16]) {
  __m512 t[8], u[4];
  for (int k = 0; k < 8; ++k) {  // t[k] lane L: a[2k], a[2k+1], a[2k], a[2k+1] partial sums
    t[k] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * k], a[2 * k + 1]), _mm512_unpackhi_ps(a[2 * k], a[2 * k + 1]));
  }
  for (int k = 0; k < 4; ++k) {  // u[k] lane L: a[4k] .. a[4k+3], each summed over lane L's floats
    const __m512d x = _mm512_castps_pd(t[2 * k]), y = _mm512_castps_pd(t[2 * k + 1]);
    u[k] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
  }
  // lanes (0+2, 1+3) of u[0], u[1], then of u[2], u[3]; then the remaining pair of lanes
  const __m512 w0 = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], 0x44), _mm512_shuffle_f32x4(u[0], u[1], 0xEE));
  const __m512 w1 = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], 0x44), _mm512_shuffle_f32x4(u[2], u[3], 0xEE));
  return _mm512_add_ps(_mm512_shuffle_f32x4(w0, w1, 0x88), _mm512_shuffle_f32x4(w0, w1, 0xDD));
}
#endif

}  // namespace vlserve_vec
