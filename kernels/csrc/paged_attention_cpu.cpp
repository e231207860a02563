// Batched paged attention for the CPU: one call per layer for a whole decode or extend batch.
//
// Request b's new tokens q[qo_start_loc[b] : + extend_lens[b]] attend to its tokens
// 0..seq_lens[b]-1, read through req_to_token[req_pool_indices[b]] straight from the pool (no
// gathered copy of the request's KV). Query i of request b sits at position prefix + i
// (prefix = seq_lens[b] - extend_lens[b]) and sees keys 0..prefix + i; with causal=false it sees all
// seq_lens[b] keys (a vision tower's bidirectional attention, each image or frame a request).
//
// Work item = (request, block of up to kQueryBlock new tokens, a run of kv heads). For each kv
// head its rows are every (query, q head) pair sharing it (GQA), so each key/value tile is loaded
// once for all of them. Keys go in tiles of kKeyTile with an online softmax, all in fp32; tiles are
// converted to fp32 on load, so fp16/bf16 pools work too. Threads take items, longest first, from a
// shared counter.
//
// Memory order: a pool slot holds every kv head's row side by side ([slot][kv_head][D]), so an item
// that walks all kv heads inside each key tile reads whole slots — one contiguous run per slot —
// instead of one head's short row per slot, four times over. Decode is bound by those reads (the
// arithmetic per byte is tiny), so items span all kv heads whenever there are enough items to keep
// every thread busy, and one kv head each otherwise. On AVX-512, items of one new token (decode,
// and the shared pass: see decode_path) take run_item_decode instead of the tiles: scores for a
// 256-key chunk straight from the pool, sixteen keys per vector (a bf16 pool's in bf16 dot
// products, no widened copy), then the values.
//
// Shared prefixes (decode): the radix cache gives every request that shares a prompt prefix the
// same slots for it, so a decode batch of six questions about one picture, or of 24 continuations
// of one few-shot prompt, would read the same keys six or 24 times a layer. Requests with one new
// token whose tables begin with the same slots are grouped (find_shared_prefixes); a first pass runs
// all of a group's query rows against the shared keys as one item — each key read once; from
// kSharedGemmMinRows rows a bf16 pool's groups take the bf16 dot products — and keeps every row's
// unnormalised softmax state (max, sum, output); the second pass resumes each request from that
// state over its own remaining keys. Cascade attention (FlashInfer) merges two normalised results instead; resuming the online
// softmax needs no merge step.
//
// bf16 pools on CPUs with AVX512_BF16: the BLAS blocks (long extends, big shared groups) run both
// products in bf16 dot products instead (bf16_dot_cpu.h, run_item_bf16): fp32 BLAS would widen
// every key and value and multiply at half the rate.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include "bf16_dot_cpu.h"
#include "f32_tiles_cpu.h"
#include "vec_cpu.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <optional>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

namespace {

using namespace vlserve_vec;

// Vector width: whatever -march=native gives. Registers bound the blocking: 16 of them with
// AVX2, 32 with AVX-512, so AVX2 accumulates half as many output vectors at a time.
#if defined(__AVX512F__)
constexpr int kChunk = 4;  // output vectors per row accumulated in registers
#else
constexpr int kChunk = 2;
#endif
constexpr int kKeyTile = 2 * kLanes;   // keys per tile: two vectors of scores per row
constexpr int kQueryBlock = 16;        // new tokens per work item in extend
constexpr int kRowBlock = 4;           // rows updated together, sharing each key / value load
constexpr int kTransposeRows = 16;     // from this many rows per item, transpose K tiles (extend)
// Long extends go through BLAS: blocks of kGemmQueryBlock new tokens against kGemmKeyBlock keys,
// scores and values as two GEMMs with an online softmax between them (FlashAttention-2's order).
// Below kGemmMinRows rows per kv head the register-blocked path above is faster.
constexpr int kGemmQueryBlock = 128;
// ... and at least kGemmItemRows rows per kv head (new tokens x GQA group): each item packs its key
// and value blocks once for all its rows, so with MHA (a vision tower: 16 heads, 729 tokens) 128-row
// items packed every key six times over, 10% of the fp32 kernel's time. A request's long-block
// items split its new tokens evenly (729 = 3 x 243, not 256 + 256 + 217).
constexpr int kGemmItemRows = 256;
constexpr int kGemmKeyBlock = 512;
constexpr int kGemmMinRows = 32;
// A group shares at least this many leading slots (fewer saves less than the pass costs) and has at
// most this many members (rows = members x group must fit the scratch; a bigger group is split).
constexpr int64_t kMinSharedKeys = 32;
constexpr int64_t kMaxSharedMembers = 32;
// The shared pass goes through the long-block paths (run_item_gemm) from this many rows: measured
// faster than the transposed tiles at 24 rows (six members at GQA 4). On AVX-512 only a bf16 pool's
// still do (decode_path): the others run_item_decode, faster at every group size measured.
constexpr int64_t kSharedGemmMinRows = 16;

inline vf select(vi mask, vf a, vf b) { return (vf)((mask & (vi)a) | (~mask & (vi)b)); }

inline vi lane_ids() {
  vi ids;
  for (int i = 0; i < kLanes; ++i) ids[i] = i;
  return ids;
}

inline float hmax(vf v) {
  float m = v[0];
  for (int i = 1; i < kLanes; ++i) m = std::max(m, v[i]);
  return m;
}

// e^x for x <= 0 (a score minus its row's running max): x = n ln2 + r with |r| <= ln2/2, e^r by a
// degree-6 Taylor polynomial (relative error ~1e-7), 2^n built in the exponent bits. Below -87 it
// is clamped (e^-87 ~ 1.6e-38 is 0 next to the row max's e^0 = 1, and 2^n stays a normal float);
// masked keys are zeroed by the caller, never left to this.
inline vf exp_nonpositive(vf x) {
  x = vmax(x, splat(-87.0f));
  const float shifter = 12582912.0f;  // 1.5 * 2^23: adding it rounds to the nearest integer
  const vf n = (x * 1.44269504088896341f + shifter) - shifter;
  const vf r = x - n * 0.693359375f + n * 2.12194440e-4f;
  vf p = splat(1.0f / 720.0f);
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  return p * (vf)((__builtin_convertvector(n, vi) + 127) << 23);
}

inline float exp_nonpositive(float x) { return exp_nonpositive(splat(x))[0]; }

inline float to_float(float x) { return x; }
inline float to_float(c10::BFloat16 x) { return static_cast<float>(x); }
inline float to_float(c10::Half x) { return static_cast<float>(x); }

struct Item {
  int64_t req;       // index into the batch
  int64_t kv_head;   // first kv head of the item
  int64_t heads;     // kv heads kv_head .. kv_head + heads - 1
  int64_t first;     // first new token of the block, within the request's new tokens
  int64_t count;     // new tokens in the block
  int64_t cost;      // rows x keys, for ordering
  bool gemm;         // through BLAS (run_item_gemm), else the register-blocked path
  int64_t key_begin; // keys before it were taken by the shared-prefix pass ...
  bool resume;       // ... whose per-row state (RowStates) the item starts from
};

// Decode requests members[0..] share their first `keys` slots (same slot ids in req_to_token).
struct SharedGroup {
  std::vector<int64_t> members;
  int64_t keys;
};

// The shared pass's unnormalised softmax state per (request, q head): index b * num_q_heads + head.
struct RowStates {
  std::vector<float> max, sum, out;  // out: [index][D]
};

struct Problem {
  int64_t num_q_heads, num_kv_heads, group, head_dim, slot_stride;  // slot_stride = num_kv_heads * D
  int64_t q_token_stride;  // q's elements from one token to the next (a view of a fused qkv row: wider)
  const int32_t* req_to_token;
  int64_t table_width;
  const int64_t *rows, *seq_lens, *extend_lens, *starts;
  float sm_scale;
  bool bf16_dot;  // long extends of a bf16 pool in bf16 dot products, where the CPU has them
  bool amx;       // ... and those on AMX tiles, where the CPU has them and the OS grants them
  bool causal;    // false: every new token sees all of its request's keys (a vision tower's frames)
};

// Per-thread buffers: the item's rows (q pre-scaled, output accumulators, softmax state), one key
// tile (as rows [j][d], or transposed [d][j]) and one value tile [j][d], and a block's scores.
struct Scratch {
  std::vector<float> q, out, row_max, row_sum, k, v, p, rescale;
  std::vector<float> gemm_k, gemm_v, gemm_s;  // run_item_gemm's key / value blocks and scores
  std::vector<uint32_t> pair_q, pair_k, pair_v, pair_p;  // run_item_bf16's operands in bf16 pairs
  std::vector<int> visible;
  void reserve(int64_t rows, int64_t d) {
    q.resize(rows * d);
    out.resize(rows * d);
    row_max.resize(rows);
    row_sum.resize(rows);
    visible.resize(rows);
    k.resize(d * kKeyTile);
    v.resize(kKeyTile * d);
    p.resize(kRowBlock * kKeyTile);
    rescale.resize(kRowBlock);
  }
};

// Keys j0..j0+n-1 of one kv head into fp32 tiles; the tile's unused keys are zeroed so that
// whatever the pool holds past them can never become NaN in a product.
template <typename T>
void load_tile(const Problem& pb, const T* k_buffer, const T* v_buffer, const int32_t* slots, int64_t j0, int n,
               int64_t num_keys, int64_t kv_head, bool transpose_k, Scratch& sc) {
  const int64_t D = pb.head_dim;
  // Slots are scattered over the pool, which defeats the hardware prefetcher: ask for the next
  // tile's rows now, so they arrive while this one is computed.
  const int64_t next_end = std::min<int64_t>(j0 + 2 * kKeyTile, num_keys);
  prefetch_rows(k_buffer, slots, j0 + kKeyTile, next_end, pb.slot_stride, kv_head * D, D);
  prefetch_rows(v_buffer, slots, j0 + kKeyTile, next_end, pb.slot_stride, kv_head * D, D);
  for (int j = 0; j < kKeyTile; ++j) {
    float* vr = sc.v.data() + j * D;
    float* kr = sc.k.data() + j * D;
    if (j >= n) {
      std::fill(vr, vr + D, 0.0f);
      if (transpose_k) {
        for (int64_t d = 0; d < D; ++d) sc.k[d * kKeyTile + j] = 0.0f;
      } else {
        std::fill(kr, kr + D, 0.0f);
      }
      continue;
    }
    const int64_t base = static_cast<int64_t>(slots[j0 + j]) * pb.slot_stride + kv_head * D;
    for (int64_t d = 0; d < D; d += kLanes) storeu(vr + d, load16(v_buffer + base + d));
    if (!transpose_k) {
      for (int64_t d = 0; d < D; d += kLanes) storeu(kr + d, load16(k_buffer + base + d));
    }
#if !defined(__AVX512F__)
    else {
      for (int64_t d = 0; d < D; d += kLanes) {
        const vf kv = load16(k_buffer + base + d);
        for (int i = 0; i < kLanes; ++i) sc.k[(d + i) * kKeyTile + j] = kv[i];
      }
    }
#endif
  }
#if defined(__AVX512F__)
  if (transpose_k) {  // 16 x 16 blocks through registers: 64 shuffles instead of 256 scattered stores
    for (int g = 0; g < kKeyTile; g += 16) {
      for (int64_t d0 = 0; d0 < D; d0 += 16) {
        __m512 r[16];
        for (int i = 0; i < 16; ++i) {
          const int64_t j = g + i;
          r[i] = j < n ? (__m512)load16(k_buffer + static_cast<int64_t>(slots[j0 + j]) * pb.slot_stride + kv_head * D + d0)
                       : _mm512_setzero_ps();
        }
        transpose16x16(r);
        for (int c = 0; c < 16; ++c) _mm512_storeu_ps(sc.k.data() + (d0 + c) * kKeyTile + g, r[c]);
      }
    }
  }
#endif
}

// Scores of NR rows against the tile, into s[r][0..kKeyTile).
template <int NR>
void scores(const float* q, int64_t D, const Scratch& sc, bool transposed, int n, vf s[NR][2]) {
  for (int r = 0; r < NR; ++r) s[r][0] = s[r][1] = vf{};
  if (transposed) {  // s[r][:] += q[r][d] * k[d][:], two vectors of keys per row
    for (int64_t d = 0; d < D; ++d) {
      const vf k0 = loadu(sc.k.data() + d * kKeyTile), k1 = loadu(sc.k.data() + d * kKeyTile + kLanes);
      for (int r = 0; r < NR; ++r) {
        const float qd = q[r * D + d];
        s[r][0] += qd * k0;
        s[r][1] += qd * k1;
      }
    }
    return;
  }
  for (int j = 0; j < n; ++j) {  // few rows: dot products against key rows, no transpose
    vf acc[NR];
    for (int r = 0; r < NR; ++r) acc[r] = vf{};
    for (int64_t d = 0; d < D; d += kLanes) {
      const vf k = loadu(sc.k.data() + j * D + d);
      for (int r = 0; r < NR; ++r) acc[r] += loadu(q + r * D + d) * k;
    }
    for (int r = 0; r < NR; ++r) s[r][j / kLanes][j % kLanes] = hsum(acc[r]);
  }
}

// out[r][d0 .. d0 + NV*16) = out * rescale[r] + sum_j p[r][j] v[j][..], accumulators in registers.
template <int NR, int NV>
void accumulate(float* out, int64_t D, int64_t d0, const Scratch& sc, int keys) {
  vf acc[NR][NV];
  for (int r = 0; r < NR; ++r)
    for (int c = 0; c < NV; ++c) acc[r][c] = loadu(out + r * D + d0 + c * kLanes) * sc.rescale[r];
  for (int j = 0; j < keys; ++j) {
    const float* vr = sc.v.data() + j * D + d0;
    vf vj[NV];
    for (int c = 0; c < NV; ++c) vj[c] = loadu(vr + c * kLanes);
    for (int r = 0; r < NR; ++r) {
      const float pr = sc.p[r * kKeyTile + j];
      for (int c = 0; c < NV; ++c) acc[r][c] += pr * vj[c];
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int c = 0; c < NV; ++c) storeu(out + r * D + d0 + c * kLanes, acc[r][c]);
}

// NR rows (starting at row r0) against the loaded tile: online-softmax update of their state.
template <int NR>
void update_rows(const Problem& pb, int64_t r0, int64_t j0, int n, bool transposed, Scratch& sc) {
  const int64_t D = pb.head_dim;
  vf s[NR][2];
  scores<NR>(sc.q.data() + r0 * D, D, sc, transposed, n, s);
  const vi lane = lane_ids();
  int keys = 0;  // keys any of the rows sees in this tile
  for (int r = 0; r < NR; ++r) {
    const int valid = static_cast<int>(std::min<int64_t>(n, sc.visible[r0 + r] - j0));
    float* p = sc.p.data() + r * kKeyTile;
    if (valid <= 0) {  // this row's keys ended in an earlier tile: it takes nothing from this one
      std::fill(p, p + kKeyTile, 0.0f);
      sc.rescale[r] = 1.0f;
      continue;
    }
    keys = std::max(keys, valid);
    const vi seen0 = lane < valid, seen1 = (lane + kLanes) < valid;
    const vf ninf = splat(-std::numeric_limits<float>::infinity());
    const float tile_max = std::max(hmax(select(seen0, s[r][0], ninf)), hmax(select(seen1, s[r][1], ninf)));
    float& row_max = sc.row_max[r0 + r];
    const float new_max = std::max(row_max, tile_max);
    sc.rescale[r] = exp_nonpositive(row_max - new_max);  // row_max = -inf on the first tile: 0
    const vf p0 = select(seen0, exp_nonpositive(s[r][0] - new_max), vf{});
    const vf p1 = select(seen1, exp_nonpositive(s[r][1] - new_max), vf{});
    storeu(p, p0);
    storeu(p + kLanes, p1);
    sc.row_sum[r0 + r] = sc.row_sum[r0 + r] * sc.rescale[r] + hsum(p0 + p1);
    row_max = new_max;
  }
  float* out = sc.out.data() + r0 * D;
  int64_t d0 = 0;
  for (; d0 + kChunk * kLanes <= D; d0 += kChunk * kLanes) accumulate<NR, kChunk>(out, D, d0, sc, keys);
  for (; d0 < D; d0 += kLanes) accumulate<NR, 1>(out, D, d0, sc, keys);
}

// The vector path needs head_dim % kLanes == 0; the scalar path below serves any other head_dim.
// rows = rows per kv head; head hh of the item owns rows hh * rows .. (hh + 1) * rows - 1.
template <typename T>
void run_item_vector(const Item& it, const Problem& pb, const T* k_buffer, const T* v_buffer, Scratch& sc,
                     int64_t rows, int64_t key_begin, int64_t num_keys, const int32_t* slots) {
  const bool transposed = rows >= kTransposeRows;
  for (int64_t j0 = key_begin; j0 < num_keys; j0 += kKeyTile) {
    const int n = static_cast<int>(std::min<int64_t>(kKeyTile, num_keys - j0));
    for (int64_t hh = 0; hh < it.heads; ++hh) {
      load_tile<T>(pb, k_buffer, v_buffer, slots, j0, n, num_keys, it.kv_head + hh, transposed, sc);
      const int64_t end = (hh + 1) * rows;
      int64_t r0 = hh * rows;
      for (; r0 + kRowBlock <= end; r0 += kRowBlock) update_rows<kRowBlock>(pb, r0, j0, n, transposed, sc);
      switch (end - r0) {
        case 3: update_rows<3>(pb, r0, j0, n, transposed, sc); break;
        case 2: update_rows<2>(pb, r0, j0, n, transposed, sc); break;
        case 1: update_rows<1>(pb, r0, j0, n, transposed, sc); break;
        default: break;
      }
    }
  }
}

template <typename T>
void run_item_scalar(const Item& it, const Problem& pb, const T* k_buffer, const T* v_buffer, Scratch& sc,
                     int64_t rows, int64_t key_begin, int64_t num_keys, const int32_t* slots) {
  const int64_t D = pb.head_dim;
  for (int64_t j = key_begin; j < num_keys; ++j) {  // one key at a time, online softmax per row
    for (int64_t r = 0; r < rows * it.heads; ++r) {
      const int64_t base = static_cast<int64_t>(slots[j]) * pb.slot_stride + (it.kv_head + r / rows) * D;
      if (sc.visible[r] <= j) continue;
      const float* q = sc.q.data() + r * D;
      float score = 0.0f;
      for (int64_t d = 0; d < D; ++d) score += q[d] * to_float(k_buffer[base + d]);
      const float new_max = std::max(sc.row_max[r], score);
      const float rescale = exp_nonpositive(sc.row_max[r] - new_max), p = exp_nonpositive(score - new_max);
      float* out = sc.out.data() + r * D;
      for (int64_t d = 0; d < D; ++d) out[d] = out[d] * rescale + p * to_float(v_buffer[base + d]);
      sc.row_sum[r] = sc.row_sum[r] * rescale + p;
      sc.row_max[r] = new_max;
    }
  }
}

// One kv head's key block j0 .. j0 + n - 1 as fp32 rows [n][D] (K and V alike).
template <typename T>
void gather_block(const Problem& pb, const T* buffer, const int32_t* slots, int64_t j0, int64_t n, int64_t kv_head,
                  float* dst) {
  const int64_t D = pb.head_dim;
  for (int64_t j = 0; j < n; ++j) {
    const T* src = buffer + static_cast<int64_t>(slots[j0 + j]) * pb.slot_stride + kv_head * D;
    float* row = dst + j * D;
    int64_t d = 0;
    for (; d + kLanes <= D; d += kLanes) storeu(row + d, load16(src + d));
    for (; d < D; ++d) row[d] = to_float(src[d]);
  }
}

// Online-softmax step for one row's scores s[0..n) of which the first `visible` count: s becomes
// the probabilities (0 past `visible`), the row's max and sum move on, and its output row is
// rescaled to the new max. A row that sees none of the block takes nothing from it.
inline void softmax_block_row(float* s, int64_t n, int64_t visible, float& row_max, float& row_sum, float* out,
                              int64_t D) {
  if (visible <= 0) {
    std::fill(s, s + n, 0.0f);
    return;
  }
  float block_max = -std::numeric_limits<float>::infinity();
  int64_t j = 0;
  if (visible >= kLanes) {
    vf m0 = loadu(s), m1 = m0;  // two chains of vmax
    for (j = kLanes; j + 2 * kLanes <= visible; j += 2 * kLanes) {
      m0 = vmax(loadu(s + j), m0);
      m1 = vmax(loadu(s + j + kLanes), m1);
    }
    if (j + kLanes <= visible) {
      m0 = vmax(loadu(s + j), m0);
      j += kLanes;
    }
    block_max = hmax(vmax(m0, m1));
  }
  for (; j < visible; ++j) block_max = std::max(block_max, s[j]);
  const float new_max = std::max(row_max, block_max);
  const float rescale = exp_nonpositive(row_max - new_max);  // row_max = -inf on the first block: 0
  vf sum{};
  float tail = 0.0f;
  for (j = 0; j + kLanes <= visible; j += kLanes) {
    const vf p = exp_nonpositive(loadu(s + j) - new_max);
    storeu(s + j, p);
    sum += p;
  }
  for (; j < visible; ++j) {
    s[j] = exp_nonpositive(s[j] - new_max);
    tail += s[j];
  }
  std::fill(s + visible, s + n, 0.0f);
  row_sum = row_sum * rescale + hsum(sum) + tail;
  row_max = new_max;
  if (rescale != 1.0f) {
    for (int64_t d = 0; d < D; ++d) out[d] *= rescale;
  }
}

inline int64_t round_up(int64_t x, int64_t multiple) { return (x + multiple - 1) / multiple * multiple; }

#if defined(__AVX512F__)
// Decode items: each row (one q head of the one new token) sees every key, and there are few rows
// per kv head (the GQA group). Keys go in chunks: first every row's scores for the whole chunk,
// sixteen keys at a time straight from the pool (16 dot products reduced to one vector by
// reduce16, no per-key horizontal sum and no copy of the tile), then one softmax step per row over
// the chunk, then the values summed from the pool into register accumulators. The register-blocked
// tiles above copied every key and value into scratch first and summed each score horizontally:
// 7-11 GB/s of KV a core where this path's arithmetic allows far more.
constexpr int64_t kDecodeChunk = 256;  // keys per softmax step (scores: rows x 256 floats, in L1/L2)

// Scores of one (pre-scaled) q row against sixteen keys' fp32 rows, lane i = key i.
template <int NV>
inline __m512 score16(const float* q, const float* const rows[16]) {
  __m512 qv[NV], acc[16];
  for (int c = 0; c < NV; ++c) qv[c] = _mm512_loadu_ps(q + c * 16);
  for (int i = 0; i < 16; ++i) {
    acc[i] = _mm512_mul_ps(qv[0], _mm512_loadu_ps(rows[i]));
    for (int c = 1; c < NV; ++c) acc[i] = _mm512_fmadd_ps(qv[c], _mm512_loadu_ps(rows[i] + c * 16), acc[i]);
  }
  return reduce16(acc);
}

#if defined(VLSERVE_BF16_DOT)
// The same sixteen scores from a bf16 pool's rows as they are, in bf16 dot products: q as bf16 pairs
// (the model's own q values, unscaled: pack_row_pairs recovers them exactly), each product of two
// bf16 exact in fp32 and summed in fp32 as the widened path sums them (in another order), then
// times `scale`. No widened copy of the keys and half the multiplies: on the Zen 5 measured the
// widening alone was a quarter of a short decode item's time.
template <int NV>
inline __m512 score16_pairs(const uint32_t* q, const c10::BFloat16* const rows[16], float scale) {
  constexpr int kWords = NV / 2;  // vectors of 32 bf16 per row
  __m512bh qv[kWords];
  __m512 acc[16];
  for (int c = 0; c < kWords; ++c) qv[c] = (__m512bh)_mm512_loadu_si512(q + c * 16);
  for (int i = 0; i < 16; ++i) {
    acc[i] = _mm512_dpbf16_ps(_mm512_setzero_ps(), qv[0], (__m512bh)_mm512_loadu_si512(rows[i]));
    for (int c = 1; c < kWords; ++c) {
      acc[i] = _mm512_dpbf16_ps(acc[i], qv[c], (__m512bh)_mm512_loadu_si512(rows[i] + c * 32));
    }
  }
  return _mm512_mul_ps(reduce16(acc), _mm512_set1_ps(scale));
}
#endif

// Sixteen keys' rows of one kv head as fp32 rows: an fp32 pool's own rows, read in place; any
// other dtype's widened once into `widened` (16 x 16 NV floats), not once per row of the group.
template <int NV, typename T>
inline void key_rows16(const T* const pool_rows[16], float* widened, const float* rows[16]) {
  for (int i = 0; i < 16; ++i) {
    if constexpr (std::is_same_v<T, float>) {
      rows[i] = pool_rows[i];
    } else {
      for (int c = 0; c < NV; ++c) _mm512_storeu_ps(widened + (i * NV + c) * 16, (__m512)load16(pool_rows[i] + c * 16));
      rows[i] = widened + i * NV * 16;
    }
  }
}

// out[r] = out[r] + sum_j p[r][j] v[j] for NR rows of NV vectors, keys j in [0, n), v read from
// the pool (vrow(j)), the accumulators in registers across the chunk.
template <int NR, int NV, typename T, typename Row>
inline void accumulate_pool(float* out, int64_t D, const float* p, int64_t p_stride, int64_t n, const Row& vrow) {
  __m512 acc[NR][NV];
  for (int r = 0; r < NR; ++r)
    for (int c = 0; c < NV; ++c) acc[r][c] = _mm512_loadu_ps(out + r * D + c * 16);
  for (int64_t j = 0; j < n; ++j) {  // each value vector widened once, taken by every row at once
    const T* v = vrow(j);
    __m512 pr[NR];
    for (int r = 0; r < NR; ++r) pr[r] = _mm512_set1_ps(p[r * p_stride + j]);
    for (int c = 0; c < NV; ++c) {
      const __m512 vj = (__m512)load16(v + c * 16);
      for (int r = 0; r < NR; ++r) acc[r][c] = _mm512_fmadd_ps(pr[r], vj, acc[r][c]);
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int c = 0; c < NV; ++c) _mm512_storeu_ps(out + r * D + c * 16, acc[r][c]);
}

// Rows 0 .. count - 1 of one kv head, four at a time (three at NV = 8: 24 accumulators, the
// three broadcast probabilities and one value vector fill the 32 registers; a GQA group of three
// then widens each value once, where two-row blocks widened it twice).
template <int NV, typename T, typename Row>
void accumulate_rows(float* out, int64_t D, const float* p, int64_t n, int64_t count, const Row& vrow) {
  constexpr int kMaxRows = NV >= 8 ? 3 : 4;
  int64_t r = 0;
  for (; r + kMaxRows <= count; r += kMaxRows) {
    accumulate_pool<kMaxRows, NV, T>(out + r * D, D, p + r * kDecodeChunk, kDecodeChunk, n, vrow);
  }
  switch (count - r) {
    case 3: accumulate_pool<3, NV, T>(out + r * D, D, p + r * kDecodeChunk, kDecodeChunk, n, vrow); break;
    case 2: accumulate_pool<2, NV, T>(out + r * D, D, p + r * kDecodeChunk, kDecodeChunk, n, vrow); break;
    case 1: accumulate_pool<1, NV, T>(out + r * D, D, p + r * kDecodeChunk, kDecodeChunk, n, vrow); break;
    default: break;
  }
}

// A decode item's keys key_begin .. num_keys - 1 for its rows (set up in sc: row hh * rows + r),
// whose state may resume the shared pass's. D = 16 * NV.
template <int NV, typename T>
void run_item_decode(const Item& it, const Problem& pb, const T* k_buffer, const T* v_buffer, Scratch& sc,
                     int64_t rows, int64_t key_begin, int64_t num_keys, const int32_t* slots) {
  const int64_t D = pb.head_dim, total_rows = rows * it.heads, head0 = it.kv_head * D;
  sc.gemm_s.resize(total_rows * kDecodeChunk);
  float* s = sc.gemm_s.data();
  const auto row_of = [&](const T* buffer, int64_t j, int64_t hh) {
    return buffer + static_cast<int64_t>(slots[j]) * pb.slot_stride + head0 + hh * D;
  };
#if defined(VLSERVE_BF16_DOT)
  // a bf16 pool's scores in bf16 dot products (score16_pairs); bf16_dot=false keeps the widened keys
  constexpr bool kPairs = std::is_same_v<T, c10::BFloat16>;
  const bool pairs = kPairs && pb.bf16_dot;
  if (pairs) {
    sc.pair_q.resize(total_rows * D / 2);
    for (int64_t r = 0; r < total_rows; ++r) {
      vlserve_bf16::pack_row_pairs(sc.q.data() + r * D, D, pb.sm_scale, sc.pair_q.data() + r * D / 2);
    }
  }
#endif
  for (int64_t c0 = key_begin; c0 < num_keys; c0 += kDecodeChunk) {
    const int64_t n = std::min<int64_t>(kDecodeChunk, num_keys - c0);
    for (int64_t j0 = 0; j0 < n; j0 += 16) {
      // the next sixteen keys' rows and these keys' values (summed after the chunk's scores) to L2,
      // all of the item's heads as one run per slot
      const int64_t next = c0 + j0 + 16, span = it.heads * D;
      prefetch_rows(k_buffer, slots, next, std::min<int64_t>(next + 16, num_keys), pb.slot_stride, head0, span);
      prefetch_rows(v_buffer, slots, c0 + j0, std::min<int64_t>(c0 + j0 + 16, num_keys), pb.slot_stride, head0, span);
      const int64_t valid = std::min<int64_t>(16, n - j0);
      for (int64_t hh = 0; hh < it.heads; ++hh) {
        const T* pool_rows[16];
        const float* krows[16];
        for (int i = 0; i < 16; ++i) pool_rows[i] = row_of(k_buffer, c0 + j0 + std::min<int64_t>(i, valid - 1), hh);
#if defined(VLSERVE_BF16_DOT)
        if constexpr (kPairs) {
          if (pairs) {
            for (int64_t r = hh * rows; r < (hh + 1) * rows; ++r) {
              _mm512_storeu_ps(s + r * kDecodeChunk + j0,
                               score16_pairs<NV>(sc.pair_q.data() + r * D / 2, pool_rows, pb.sm_scale));
            }
            continue;
          }
        }
#endif
        key_rows16<NV, T>(pool_rows, sc.k.data(), krows);
        for (int64_t r = hh * rows; r < (hh + 1) * rows; ++r) {
          _mm512_storeu_ps(s + r * kDecodeChunk + j0, score16<NV>(sc.q.data() + r * D, krows));
        }
      }
    }
    for (int64_t r = 0; r < total_rows; ++r) {  // keys past n: padding (repeats of the last), never seen
      softmax_block_row(s + r * kDecodeChunk, round_up(n, 16), n, sc.row_max[r], sc.row_sum[r],
                        sc.out.data() + r * D, D);
    }
    for (int64_t hh = 0; hh < it.heads; ++hh) {
      accumulate_rows<NV, T>(sc.out.data() + hh * rows * D, D, s + hh * rows * kDecodeChunk, n, rows,
                             [&](int64_t j) { return row_of(v_buffer, c0 + j, hh); });
    }
  }
}

// Whether run_item_decode serves an item: one new token, head_dim a multiple of 16 it has code for,
// and rows that all see every key (a decode row's visible count is its request's length). A big
// group's shared pass (it.gemm) too, unless it is a bf16 pool that run_item_gemm multiplies in bf16
// dot products: those were 1.5-2x faster on it; the fp32 register tiles 1.1-1.3x slower than this.
template <typename T>
bool decode_path(const Item& it, const Problem& pb) {
  if (it.count != 1 || !pb.causal || !(pb.head_dim == 32 || pb.head_dim == 64 || pb.head_dim == 128)) return false;
#if defined(VLSERVE_BF16_DOT)
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    if (it.gemm && pb.bf16_dot && vlserve_bf16::supports(pb.head_dim)) return false;
  }
#endif
  return true;
}
#endif

// Rows per tile of run_item_bf16 and run_item_f32: a tile's scores, probabilities and output
// (32 x 512 x 4 B, and less) stay in L1/L2 while it passes over the packed key and value block. A
// whole item's rows at once (512 rows x 512 keys: 1 MB of scores) spilled out of L2 between the
// two products.
constexpr int64_t kTileRows = 32;

// The rows r0 .. r0 + tile - 1 of an item see keys up to this one (exclusive) of the block that
// starts at j0, at most n: a tile on the causal diagonal scores only what its rows see. 0: none.
inline int64_t keys_seen(const Scratch& sc, int64_t r0, int64_t tile, int64_t j0, int64_t n) {
  const int64_t seen = *std::max_element(sc.visible.begin() + r0, sc.visible.begin() + r0 + tile) - j0;
  return std::max<int64_t>(0, std::min(n, seen));
}

// The long-block paths' walk over one item: key blocks of kGemmKeyBlock from key_begin, each packed
// once (pack(j0, n, n_pad)), and within a block the row tiles that see some of it:
// tile(j0, n_pad, r0, rows in the tile, rows padded to RowAlign, keys seen nt, nt padded to KeyAlign).
template <int KeyAlign, int RowAlign, typename Pack, typename Tile>
void walk_tiles(const Scratch& sc, int64_t rows, int64_t key_begin, int64_t num_keys, const Pack& pack,
                const Tile& tile) {
  static_assert(kTileRows % RowAlign == 0 && kGemmKeyBlock % KeyAlign == 0, "whole scores tiles");
  for (int64_t j0 = key_begin; j0 < num_keys; j0 += kGemmKeyBlock) {
    const int64_t n = std::min<int64_t>(kGemmKeyBlock, num_keys - j0), n_pad = round_up(n, KeyAlign);
    pack(j0, n, n_pad);
    for (int64_t r0 = 0; r0 < rows; r0 += kTileRows) {
      const int64_t count = std::min<int64_t>(kTileRows, rows - r0);
      const int64_t nt = keys_seen(sc, r0, count, j0, n);
      if (nt == 0) continue;  // no row of the tile sees this block: it would add nothing
      tile(j0, n_pad, r0, count, round_up(count, RowAlign), nt, round_up(nt, KeyAlign));
    }
  }
}

#if defined(__AVX512F__)
// e^x for x <= 0, 16 lanes: exp_nonpositive's reduction (x = n ln2 + r, |r| <= ln2/2) and degree-6
// polynomial, with 2^n applied by vscalefps, which also takes a very negative n to 0: no clamp and
// no exponent bits to build.
inline __m512 exp_nonpositive16(__m512 x) {
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.0f / 720.0f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

// One online-softmax step of the tile paths for a row of scores s[0..n_pad) (n_pad a multiple of
// 32) of which the first `visible` (>= 1) count, each times s_scale: the row's max and sum move on
// (natural-log units, as every pass keeps them: a decode row resumes the shared pass's state), its
// output row is rescaled to the new max, and emit(j, a, b) takes the probabilities of keys j .. j + 15
// (a) and j + 16 .. j + 31 (b), zero past `visible`, in one pass after the max.
template <typename Emit>
inline void softmax_row_step(const float* s, float s_scale, int64_t n_pad, int64_t visible, float& row_max,
                             float& row_sum, float* out, int64_t D, const Emit& emit) {
  const auto lanes = [&](int64_t j) { return tail_mask(visible - j); };  // which of keys j .. j + 15 the row sees
  const __m512 ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 m0 = ninf, m1 = ninf;
  int64_t j = 0;
  for (; j + 32 <= visible; j += 32) {
    m0 = _mm512_max_ps(m0, _mm512_loadu_ps(s + j));
    m1 = _mm512_max_ps(m1, _mm512_loadu_ps(s + j + 16));
  }
  for (; j < visible; j += 16) m0 = _mm512_max_ps(m0, _mm512_mask_loadu_ps(ninf, lanes(j), s + j));
  const float new_max = std::max(row_max, s_scale * _mm512_reduce_max_ps(_mm512_max_ps(m0, m1)));
  const float rescale = exp_nonpositive(row_max - new_max);  // row_max = -inf on the first block: 0
  const __m512 scale = _mm512_set1_ps(s_scale), max = _mm512_set1_ps(new_max);
  const auto p = [&](int64_t at) { return exp_nonpositive16(_mm512_fmsub_ps(_mm512_loadu_ps(s + at), scale, max)); };
  __m512 sum = _mm512_setzero_ps();
  for (j = 0; j < n_pad; j += 32) {
    const __m512 a = _mm512_maskz_mov_ps(lanes(j), p(j)), b = _mm512_maskz_mov_ps(lanes(j + 16), p(j + 16));
    sum = _mm512_add_ps(sum, _mm512_add_ps(a, b));
    emit(j, a, b);
  }
  row_sum = row_sum * rescale + _mm512_reduce_add_ps(sum);
  row_max = new_max;
  if (rescale != 1.0f) {
    for (int64_t d = 0; d < D; ++d) out[d] *= rescale;
  }
}
#endif

#if defined(VLSERVE_F32_TILES)
// softmax_row_step for run_item_f32: the probabilities replace the scores in place (zero past
// `visible` up to n_pad).
inline void softmax_block_row_f32(float* s, int64_t n_pad, int64_t visible, float& row_max, float& row_sum, float* out,
                                  int64_t D) {
  if (visible <= 0) {
    std::fill(s, s + n_pad, 0.0f);
    return;
  }
  softmax_row_step(s, 1.0f, n_pad, visible, row_max, row_sum, out, D, [&](int64_t j, __m512 a, __m512 b) {
    _mm512_storeu_ps(s + j, a);
    _mm512_storeu_ps(s + j + 16, b);
  });
}

// A long extend block of one kv head in fp32 register tiles (f32_tiles_cpu.h): key block by key
// block, and within a block row tile by row tile, with the online softmax between the products.
template <typename T>
void run_item_f32(const Item& it, const Problem& pb, const T* k_buffer, const T* v_buffer, Scratch& sc, int64_t rows,
                  int64_t key_begin, int64_t num_keys, const int32_t* slots) {
  namespace ft = vlserve_f32;
  const int64_t D = pb.head_dim, head_offset = it.kv_head * D;
  const int64_t rows_pad = round_up(rows, ft::kRowAlign);
  if (static_cast<int64_t>(sc.q.size()) < rows_pad * D) sc.q.resize(rows_pad * D);
  std::fill(sc.q.begin() + rows * D, sc.q.begin() + rows_pad * D, 0.0f);  // padding rows score 0, never read back
  sc.gemm_k.resize(D * kGemmKeyBlock);
  sc.gemm_v.resize(kGemmKeyBlock * ft::value_stride(D));
  sc.gemm_s.resize(kTileRows * kGemmKeyBlock);
  const auto pack = [&](int64_t j0, int64_t n, int64_t n_pad) {
    ft::pack_keys(k_buffer, slots, j0, n, n_pad, pb.slot_stride, head_offset, D, sc.gemm_k.data());
    ft::pack_values(v_buffer, slots, j0, n, pb.slot_stride, head_offset, D, sc.gemm_v.data());
  };
  const auto tile = [&](int64_t j0, int64_t n_pad, int64_t r0, int64_t count, int64_t count_pad, int64_t nt,
                        int64_t nt_pad) {
    ft::scores(sc.q.data() + r0 * D, count_pad, sc.gemm_k.data(), n_pad, nt_pad, D, sc.gemm_s.data());
    for (int64_t r = 0; r < count; ++r) {
      softmax_block_row_f32(sc.gemm_s.data() + r * nt_pad, nt_pad, std::min<int64_t>(nt, sc.visible[r0 + r] - j0),
                            sc.row_max[r0 + r], sc.row_sum[r0 + r], sc.out.data() + (r0 + r) * D, D);
    }
    ft::accumulate(sc.gemm_s.data(), nt_pad, sc.gemm_v.data(), count, nt, D, sc.out.data() + r0 * D);
  };
  walk_tiles<ft::kKeyAlign, ft::kRowAlign>(sc, rows, key_begin, num_keys, pack, tile);
}
#endif

#if defined(VLSERVE_BF16_DOT)
// softmax_row_step for run_item_bf16: the probabilities go straight out as the bf16 key pairs the
// second product reads (pp[0 .. n_pad / 2), zero past `visible`), never stored as fp32.
inline void softmax_block_row_pairs(const float* s, float s_scale, int64_t n_pad, int64_t visible, float& row_max,
                                    float& row_sum, float* out, int64_t D, uint32_t* pp) {
  if (visible <= 0) {
    std::memset(pp, 0, n_pad / 2 * sizeof(uint32_t));
    return;
  }
  softmax_row_step(s, s_scale, n_pad, visible, row_max, row_sum, out, D, [&](int64_t j, __m512 a, __m512 b) {
    _mm512_storeu_si512(pp + j / 2, (__m512i)_mm512_cvtne2ps_pbh(b, a));
  });
}

// run_item_gemm for a bf16 pool: both products in bf16 dot products (bf16_dot_cpu.h), key block by
// key block, and within a block row tile by row tile, the same online softmax between them. A
// tile scores only the keys its rows see (causal: a block on the diagonal is partly hidden).
// RowAlign: 16 on the AMX tiles (Amx), 8 in vdpbf16ps.
template <bool Amx>
void run_item_bf16(const Item& it, const Problem& pb, const c10::BFloat16* k_buffer, const c10::BFloat16* v_buffer,
                   Scratch& sc, int64_t rows, int64_t key_begin, int64_t num_keys, const int32_t* slots) {
  namespace bd = vlserve_bf16;
#if defined(VLSERVE_AMX)
  constexpr int kRowAlign = Amx ? bd::amx::kRowAlign : bd::kRowAlign;
#else
  static_assert(!Amx, "built without AMX");
  constexpr int kRowAlign = bd::kRowAlign;
#endif
  const int64_t D = pb.head_dim, pairs = D / 2, head_offset = it.kv_head * D;
  const int64_t rows_pad = round_up(rows, kRowAlign);
  sc.pair_q.assign(rows_pad * pairs, 0u);  // padding rows score 0 and are never read back
  for (int64_t r = 0; r < rows; ++r) bd::pack_row_pairs(sc.q.data() + r * D, D, pb.sm_scale, sc.pair_q.data() + r * pairs);
  if (static_cast<int64_t>(sc.out.size()) < rows_pad * D) sc.out.resize(rows_pad * D);  // AMX: whole 16-row tiles
  sc.pair_k.resize(pairs * kGemmKeyBlock);
  sc.pair_v.resize(kGemmKeyBlock / 2 * bd::value_stride(D));
  sc.pair_p.resize(kTileRows * kGemmKeyBlock / 2);
  sc.gemm_s.resize(kTileRows * kGemmKeyBlock);
  const auto pack = [&](int64_t j0, int64_t n, int64_t n_pad) {
    bd::pack_keys(k_buffer, slots, j0, n, n_pad, pb.slot_stride, head_offset, D, sc.pair_k.data());
    bd::pack_values(v_buffer, slots, j0, n, n_pad, pb.slot_stride, head_offset, D, sc.pair_v.data());
  };
  const auto tile = [&](int64_t j0, int64_t n_pad, int64_t r0, int64_t count, int64_t count_pad, int64_t nt,
                        int64_t nt_pad) {
    float s_scale = 1.0f;
#if defined(VLSERVE_AMX)
    if constexpr (Amx) {
      bd::amx::scores(sc.pair_q.data() + r0 * pairs, count_pad, sc.pair_k.data(), n_pad, nt_pad, pairs,
                      sc.gemm_s.data());
      s_scale = pb.sm_scale;
    }
#endif
    if constexpr (!Amx) {
      bd::scores(sc.pair_q.data() + r0 * pairs, count_pad, sc.pair_k.data(), n_pad, nt_pad, pairs, pb.sm_scale,
                 sc.gemm_s.data());
    }
    for (int64_t r = 0; r < count; ++r) {  // the padding keys past nt take no weight
      softmax_block_row_pairs(sc.gemm_s.data() + r * nt_pad, s_scale, nt_pad,
                              std::min<int64_t>(nt, sc.visible[r0 + r] - j0), sc.row_max[r0 + r], sc.row_sum[r0 + r],
                              sc.out.data() + (r0 + r) * D, D, sc.pair_p.data() + r * (nt_pad / 2));
    }
#if defined(VLSERVE_AMX)
    if constexpr (Amx) bd::amx::accumulate(sc.pair_p.data(), sc.pair_v.data(), count_pad, nt_pad, D, sc.out.data() + r0 * D);
#endif
    if constexpr (!Amx) bd::accumulate(sc.pair_p.data(), sc.pair_v.data(), count, nt_pad, D, sc.out.data() + r0 * D);
  };
#if defined(VLSERVE_AMX)
  std::optional<bd::amx::Scope> tiles;
  if constexpr (Amx) tiles.emplace();
#endif
  walk_tiles<bd::kKeyAlign, kRowAlign>(sc, rows, key_begin, num_keys, pack, tile);
}
#endif

// From this many rows a block's products go to oneDNN's inner product instead of at::mm (MKL's
// sgemm). On the AMD EPYC (Zen 5) measured, one core: oneDNN ran 512 rows x 256-512 keys x 64 at
// 222-232 GFLOP/s where MKL ran 99-111, so a 2,048-token prefill layer took 57 ms instead of 100;
// but in the engine the few-shot shared pass (96 rows) was slower through oneDNN (1.10-1.22 s
// against 1.03-1.08 for few_shot), and at 24 rows MKL was level or faster alone. Long extends
// (128-token blocks x GQA) are what cross this.
constexpr int64_t kOneDnnMinRows = 256;

// y = x w^T through oneDNN (torch's mkldnn::_linear_pointwise, what the linear layers use); an
// undefined tensor where torch was built without it.
at::Tensor onednn_linear(const at::Tensor& x, const at::Tensor& w) {
  static const auto op = c10::Dispatcher::singleton().findOp(c10::OperatorName("mkldnn::_linear_pointwise", ""));
  if (!op.has_value()) return at::Tensor();
  torch::jit::Stack stack{x, w, c10::IValue(), std::string("none"), c10::List<std::optional<at::Scalar>>(),
                          c10::IValue()};
  op->callBoxed(&stack);
  return stack[0].toTensor();
}

// A long extend block of one kv head: S = Q K^T and O += P V by BLAS, key block by key block.
template <typename T>
void run_item_gemm(const Item& it, const Problem& pb, const T* k_buffer, const T* v_buffer, Scratch& sc,
                   int64_t rows, int64_t key_begin, int64_t num_keys, const int32_t* slots) {
#if defined(VLSERVE_BF16_DOT)
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
#if defined(VLSERVE_AMX)
    if (pb.bf16_dot && pb.amx && vlserve_bf16::amx::supports(pb.head_dim) && vlserve_amx::usable()) {
      run_item_bf16<true>(it, pb, k_buffer, v_buffer, sc, rows, key_begin, num_keys, slots);
      return;
    }
#endif
    if (pb.bf16_dot && vlserve_bf16::supports(pb.head_dim)) {
      run_item_bf16<false>(it, pb, k_buffer, v_buffer, sc, rows, key_begin, num_keys, slots);
      return;
    }
  }
#endif
#if defined(VLSERVE_F32_TILES)
  if (vlserve_f32::supports(pb.head_dim)) {
    run_item_f32<T>(it, pb, k_buffer, v_buffer, sc, rows, key_begin, num_keys, slots);
    return;
  }
#endif
  const int64_t D = pb.head_dim;
  sc.gemm_k.resize(kGemmKeyBlock * D);
  sc.gemm_v.resize(kGemmKeyBlock * D);
  sc.gemm_s.resize(rows * kGemmKeyBlock);
  const auto opts = at::TensorOptions().dtype(at::kFloat);
  const at::Tensor q = at::from_blob(sc.q.data(), {rows, D}, opts);
  at::Tensor out = at::from_blob(sc.out.data(), {rows, D}, opts);
  for (int64_t j0 = key_begin; j0 < num_keys; j0 += kGemmKeyBlock) {
    const int64_t n = std::min<int64_t>(kGemmKeyBlock, num_keys - j0);
    gather_block<T>(pb, k_buffer, slots, j0, n, it.kv_head, sc.gemm_k.data());
    gather_block<T>(pb, v_buffer, slots, j0, n, it.kv_head, sc.gemm_v.data());
    const at::Tensor k = at::from_blob(sc.gemm_k.data(), {n, D}, opts);
    const at::Tensor v = at::from_blob(sc.gemm_v.data(), {n, D}, opts);
    at::Tensor scores = at::from_blob(sc.gemm_s.data(), {rows, n}, opts);
    const bool onednn = rows >= kOneDnnMinRows;
    at::Tensor dnn_scores = onednn ? onednn_linear(q, k) : at::Tensor();
    if (dnn_scores.defined()) {
      scores.copy_(dnn_scores);
    } else {
      at::mm_out(scores, q, k.t());
    }
    for (int64_t r = 0; r < rows; ++r) {
      softmax_block_row(sc.gemm_s.data() + r * n, n, std::min<int64_t>(n, sc.visible[r] - j0), sc.row_max[r],
                        sc.row_sum[r], sc.out.data() + r * D, D);
    }
    const at::Tensor dnn_values = dnn_scores.defined() ? onednn_linear(scores, v.t().contiguous()) : at::Tensor();
    if (dnn_values.defined()) {
      out.add_(dnn_values);
    } else {
      out.addmm_(scores, v);
    }
  }
}

// Rows already set up in the scratch (q scaled, state, visible) against keys key_begin..num_keys-1.
template <typename T>
void run_keys(const Item& it, const Problem& pb, const T* k_buffer, const T* v_buffer, Scratch& sc, int64_t rows,
              int64_t key_begin, int64_t num_keys, const int32_t* slots) {
#if defined(__AVX512F__)
  if (decode_path<T>(it, pb)) {
    switch (pb.head_dim) {
      case 32: run_item_decode<2, T>(it, pb, k_buffer, v_buffer, sc, rows, key_begin, num_keys, slots); return;
      case 64: run_item_decode<4, T>(it, pb, k_buffer, v_buffer, sc, rows, key_begin, num_keys, slots); return;
      default: run_item_decode<8, T>(it, pb, k_buffer, v_buffer, sc, rows, key_begin, num_keys, slots); return;
    }
  }
#endif
  if (it.gemm) {
    run_item_gemm<T>(it, pb, k_buffer, v_buffer, sc, rows, key_begin, num_keys, slots);
  } else if (pb.head_dim % kLanes == 0) {
    run_item_vector<T>(it, pb, k_buffer, v_buffer, sc, rows, key_begin, num_keys, slots);
  } else {
    run_item_scalar<T>(it, pb, k_buffer, v_buffer, sc, rows, key_begin, num_keys, slots);
  }
}

template <typename T>
void load_row(const Problem& pb, const T* q, int64_t token, int64_t head, int64_t row, int64_t visible, Scratch& sc) {
  const int64_t D = pb.head_dim;
  const T* src = q + token * pb.q_token_stride + head * D;
  float* dst = sc.q.data() + row * D;
  int64_t d = 0;
  if constexpr (!std::is_same_v<T, c10::Half>) {
    for (; d + kLanes <= D; d += kLanes) storeu(dst + d, load16(src + d) * pb.sm_scale);
  }
  for (; d < D; ++d) dst[d] = to_float(src[d]) * pb.sm_scale;
  std::fill(sc.out.data() + row * D, sc.out.data() + (row + 1) * D, 0.0f);
  sc.row_max[row] = -std::numeric_limits<float>::infinity();
  sc.row_sum[row] = 0.0f;
  sc.visible[row] = static_cast<int>(visible);
}

// First pass over a shared prefix: every member's rows for one kv head (row m * group + g is member
// m's q head kv_head * group + g), the group's shared keys, state kept unnormalised in `states`.
template <typename T>
void run_shared(const SharedGroup& g, int64_t kv_head, const Problem& pb, const T* q, const T* k_buffer,
                const T* v_buffer, Scratch& sc, RowStates& states) {
  const int64_t D = pb.head_dim, rows = static_cast<int64_t>(g.members.size()) * pb.group;
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t b = g.members[row / pb.group], head = kv_head * pb.group + row % pb.group;
    load_row<T>(pb, q, pb.starts[b], head, row, g.keys, sc);
  }
  const Item it{g.members[0], kv_head, 1, 0, 1, 0, rows >= kSharedGemmMinRows, 0, false};
  run_keys<T>(it, pb, k_buffer, v_buffer, sc, rows, 0, g.keys, pb.req_to_token + pb.rows[g.members[0]] * pb.table_width);
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t b = g.members[row / pb.group], head = kv_head * pb.group + row % pb.group;
    const int64_t at = b * pb.num_q_heads + head;
    states.max[at] = sc.row_max[row];
    states.sum[at] = sc.row_sum[row];
    std::copy(sc.out.data() + row * D, sc.out.data() + (row + 1) * D, states.out.data() + at * D);
  }
}

template <typename T>
void run_item(const Item& it, const Problem& pb, const T* q, const T* k_buffer, const T* v_buffer, T* o,
              Scratch& sc, const RowStates& states) {
  const int64_t D = pb.head_dim;
  const int64_t prefix = pb.seq_lens[it.req] - pb.extend_lens[it.req];
  const int64_t rows = it.count * pb.group;  // per kv head
  // Row hh * rows + r is new token it.first + r / group with q head (kv_head + hh) * group + r % group;
  // it sits at position prefix + it.first + r / group and sees that many keys plus one (causal), or
  // all of the request's keys.
  for (int64_t row = 0; row < rows * it.heads; ++row) {
    const int64_t hh = row / rows, r = row % rows;
    const int64_t token = pb.starts[it.req] + it.first + r / pb.group;
    const int64_t head = (it.kv_head + hh) * pb.group + r % pb.group;
    load_row<T>(pb, q, token, head, row, pb.causal ? prefix + it.first + r / pb.group + 1 : pb.seq_lens[it.req], sc);
    if (it.resume) {  // a decode row: keys 0..key_begin-1 were the shared pass's
      const int64_t at = it.req * pb.num_q_heads + head;
      sc.row_max[row] = states.max[at];
      sc.row_sum[row] = states.sum[at];
      std::copy(states.out.data() + at * D, states.out.data() + (at + 1) * D, sc.out.data() + row * D);
    }
  }
  // what the block's last token sees
  const int64_t num_keys = pb.causal ? prefix + it.first + it.count : pb.seq_lens[it.req];
  const int32_t* slots = pb.req_to_token + pb.rows[it.req] * pb.table_width;
  run_keys<T>(it, pb, k_buffer, v_buffer, sc, rows, it.key_begin, num_keys, slots);
  for (int64_t row = 0; row < rows * it.heads; ++row) {
    const int64_t hh = row / rows, r = row % rows;
    const int64_t token = pb.starts[it.req] + it.first + r / pb.group;
    const int64_t head = (it.kv_head + hh) * pb.group + r % pb.group;
    T* dst = o + (token * pb.num_q_heads + head) * D;
    const float inv = 1.0f / sc.row_sum[row];
    const float* src = sc.out.data() + row * D;
    int64_t d = 0;
    if constexpr (!std::is_same_v<T, c10::Half>) {
      for (; d + kLanes <= D; d += kLanes) store16(dst + d, loadu(src + d) * inv);
    }
    for (; d < D; ++d) dst[d] = static_cast<T>(src[d] * inv);
  }
}

// New tokens per long-block item at most: kGemmQueryBlock, or more where that gives fewer than
// kGemmItemRows rows.
inline int64_t gemm_block_tokens(int64_t group) {
  return std::max<int64_t>(kGemmQueryBlock, (kGemmItemRows + group - 1) / group);
}

// Items are pulled, longest first, from a shared counter by one task per thread. A thread claims
// its next item before running the current one and `ahead(next)` asks for that item's first keys
// while this one runs.
template <typename Work, typename Ahead>
void pull_items(int64_t count, const Problem& pb, const Work& work, const Ahead& ahead) {
  std::atomic<int64_t> next{0};
  const int64_t workers = std::min<int64_t>(at::get_num_threads(), count);
  at::parallel_for(0, workers, 1, [&](int64_t begin, int64_t end) {
    // Kept per thread across calls: its buffers are large enough (~0.6 MB) that the allocator maps
    // them fresh each time, and every call then paid a page fault per 4 KiB on first touch.
    // Every field is written before it is read in an item (load_row and run_item_gemm set them up).
    thread_local Scratch sc;
    sc.reserve(std::max({kQueryBlock * pb.num_q_heads, gemm_block_tokens(pb.group) * pb.group,
                         kMaxSharedMembers * pb.group}),
               pb.head_dim);
    for (int64_t w = begin; w < end; ++w) {
      for (int64_t i = next.fetch_add(1); i < count;) {
        const int64_t following = next.fetch_add(1);
        if (following < count) ahead(following);
        work(i, sc);
        i = following;
      }
    }
  });
}

template <typename Work>
void pull_items(int64_t count, const Problem& pb, const Work& work) {
  pull_items(count, pb, work, [](int64_t) {});
}

// The pool rows of an item's first keys (all of its kv heads), asked for into L2 before the item
// runs: a decode item of a short request reads a few dozen scattered slots, and without this its
// first keys were all misses waited for in turn (the item's own fetching runs a block of keys ahead,
// so only the first block is not covered).
constexpr int64_t kAheadKeys = 16;

template <typename T>
void prefetch_item(const Item& it, const Problem& pb, const T* k_buffer, const T* v_buffer) {
  const int64_t num_keys = pb.causal ? pb.seq_lens[it.req] - pb.extend_lens[it.req] + it.first + it.count
                                     : pb.seq_lens[it.req];
  const int32_t* slots = pb.req_to_token + pb.rows[it.req] * pb.table_width;
  const int64_t end = std::min(num_keys, it.key_begin + kAheadKeys), head0 = it.kv_head * pb.head_dim;
  prefetch_rows(k_buffer, slots, it.key_begin, end, pb.slot_stride, head0, it.heads * pb.head_dim);
  prefetch_rows(v_buffer, slots, it.key_begin, end, pb.slot_stride, head0, it.heads * pb.head_dim);
}

template <typename T>
void run_all(const std::vector<Item>& items, const std::vector<SharedGroup>& groups, const Problem& pb,
             const at::Tensor& q, const at::Tensor& k_buffer, const at::Tensor& v_buffer, const at::Tensor& o,
             int64_t batch) {
  const T* qp = q.data_ptr<T>();
  const T* kp = k_buffer.data_ptr<T>();
  const T* vp = v_buffer.data_ptr<T>();
  T* op = o.data_ptr<T>();
  RowStates states;
  if (!groups.empty()) {  // first pass: (group, kv head) items, the biggest groups first
    const int64_t cells = batch * pb.num_q_heads;
    states.max.resize(cells);
    states.sum.resize(cells);
    states.out.resize(cells * pb.head_dim);
    pull_items(static_cast<int64_t>(groups.size()) * pb.num_kv_heads, pb, [&](int64_t i, Scratch& sc) {
      run_shared<T>(groups[i / pb.num_kv_heads], i % pb.num_kv_heads, pb, qp, kp, vp, sc, states);
    });
  }
  pull_items(
      static_cast<int64_t>(items.size()), pb,
      [&](int64_t i, Scratch& sc) { run_item<T>(items[i], pb, qp, kp, vp, op, sc, states); },
      [&](int64_t i) { prefetch_item<T>(items[i], pb, kp, vp); });
}

// Every index the kernel will follow is checked first: a bad one must raise, never read out of bounds.
void check_request(const Problem& pb, int64_t b, int64_t table_rows, int64_t num_tokens, int64_t num_slots) {
  const int64_t row = pb.rows[b], seq_len = pb.seq_lens[b], new_tokens = pb.extend_lens[b], start = pb.starts[b];
  TORCH_CHECK(0 <= row && row < table_rows, "request ", b, ": req_pool_index ", row, " outside req_to_token's ",
              table_rows, " rows");
  TORCH_CHECK(1 <= new_tokens && new_tokens <= seq_len, "request ", b, ": need 1 <= extend_len (", new_tokens,
              ") <= seq_len (", seq_len, ")");
  TORCH_CHECK(seq_len <= pb.table_width, "request ", b, ": seq_len (", seq_len, ") exceeds req_to_token width (",
              pb.table_width, ")");
  TORCH_CHECK(0 <= start && start + new_tokens <= num_tokens, "request ", b, ": rows ", start, ":",
              start + new_tokens, " fall outside q's ", num_tokens, " rows");
  const int32_t* slots = pb.req_to_token + row * pb.table_width;
  for (int64_t j = 0; j < seq_len; ++j) {
    TORCH_CHECK(0 <= slots[j] && slots[j] < num_slots, "request ", b, ": position ", j, " maps to slot ", slots[j],
                " outside the pool's ", num_slots);
  }
}

// order[first..last] share their first `keys` slots.
struct Run {
  int64_t first, last, keys;
};

// Runs among order[l..r] (decode requests in slot order; adj[i] = leading slots order[i] and
// order[i + 1] share, so a run shares the minimum of its links) that save the most key reads: the
// whole run sharing its weakest link's keys, or the best runs on either side of that link.
int64_t plan_groups(const std::vector<int64_t>& adj, int64_t l, int64_t r, std::vector<Run>& out) {
  if (l >= r) return 0;
  const int64_t weakest = std::min_element(adj.begin() + l, adj.begin() + r) - adj.begin();
  std::vector<Run> split;
  const int64_t split_saving = plan_groups(adj, l, weakest, split) + plan_groups(adj, weakest + 1, r, split);
  const int64_t whole_saving = adj[weakest] >= kMinSharedKeys ? (r - l) * adj[weakest] : 0;
  if (whole_saving > 0 && whole_saving >= split_saving) {
    out.push_back({l, r, adj[weakest]});
    return whole_saving;
  }
  out.insert(out.end(), split.begin(), split.end());
  return split_saving;
}

// Decode requests (one new token) whose tables begin with the same slots; see the top. A member
// shares at most seq_len - 1 keys: the last is its own new token.
std::vector<SharedGroup> find_shared_prefixes(const Problem& pb, int64_t batch) {
  std::vector<int64_t> order;
  for (int64_t b = 0; b < batch; ++b) {
    if (pb.extend_lens[b] == 1 && pb.seq_lens[b] > kMinSharedKeys) order.push_back(b);
  }
  if (order.size() < 2) return {};
  const auto slots = [&](int64_t b) { return pb.req_to_token + pb.rows[b] * pb.table_width; };
  const auto shareable = [&](int64_t b) { return pb.seq_lens[b] - 1; };
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return std::lexicographical_compare(slots(a), slots(a) + shareable(a), slots(b), slots(b) + shareable(b));
  });
  std::vector<int64_t> adj(order.size() - 1);
  for (size_t i = 0; i + 1 < order.size(); ++i) {
    const int32_t *a = slots(order[i]), *b = slots(order[i + 1]);
    const int64_t n = std::min(shareable(order[i]), shareable(order[i + 1]));
    adj[i] = std::mismatch(a, a + n, b).first - a;
  }
  std::vector<Run> runs;
  plan_groups(adj, 0, static_cast<int64_t>(order.size()) - 1, runs);
  std::vector<SharedGroup> groups;
  for (const Run& run : runs) {
    const int64_t members = run.last - run.first + 1, parts = (members + kMaxSharedMembers - 1) / kMaxSharedMembers;
    for (int64_t p = 0; p < parts; ++p) {  // near-equal parts of at most kMaxSharedMembers
      const int64_t first = run.first + members * p / parts, last = run.first + members * (p + 1) / parts;
      if (last - first >= 2) {
        groups.push_back({std::vector<int64_t>(order.begin() + first, order.begin() + last), run.keys});
      }
    }
  }
  std::stable_sort(groups.begin(), groups.end(), [](const SharedGroup& a, const SharedGroup& b) {
    return a.members.size() * a.keys > b.members.size() * b.keys;
  });
  return groups;
}

std::vector<Item> make_items(const Problem& pb, int64_t batch, int64_t threads, const std::vector<SharedGroup>& groups) {
  std::vector<int64_t> shared_keys(batch, 0);
  for (const SharedGroup& g : groups) {
    for (int64_t b : g.members) shared_keys[b] = g.keys;
  }
  const auto use_gemm = [&](int64_t b) { return pb.extend_lens[b] * pb.group >= kGemmMinRows; };
  const auto block_tokens = [&](int64_t b) {  // the long blocks even (see kGemmItemRows)
    if (!use_gemm(b)) return static_cast<int64_t>(kQueryBlock);
    const int64_t most = gemm_block_tokens(pb.group), parts = (pb.extend_lens[b] + most - 1) / most;
    return (pb.extend_lens[b] + parts - 1) / parts;
  };
  int64_t blocks = 0;  // (request, query block) pairs
  for (int64_t b = 0; b < batch; ++b) blocks += (pb.extend_lens[b] + block_tokens(b) - 1) / block_tokens(b);
  // Whole slots per register-blocked item (see the top) when that still leaves two items a thread;
  // BLAS items are compute-bound and take one kv head each.
  const int64_t slot_heads = blocks >= 2 * threads ? pb.num_kv_heads : 1;
  std::vector<Item> items;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t new_tokens = pb.extend_lens[b], prefix = pb.seq_lens[b] - new_tokens;
    const bool gemm = use_gemm(b);
    const int64_t block = block_tokens(b), heads = gemm ? 1 : slot_heads;
    for (int64_t first = 0; first < new_tokens; first += block) {
      const int64_t count = std::min<int64_t>(block, new_tokens - first), keys = prefix + first + count;
      for (int64_t h = 0; h < pb.num_kv_heads; h += heads) {
        items.push_back({b, h, heads, first, count, heads * count * (keys - shared_keys[b]), gemm, shared_keys[b],
                         shared_keys[b] > 0});
      }
    }
  }
  std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.cost > b.cost; });
  return items;
}

// The index tensors as the kernel reads them (int32 table, int64 lists), kept alive while pb points in.
struct Tables {
  at::Tensor req_to_token, rows, lens, new_lens, starts;

  Tables(const at::Tensor& req_to_token_in, const at::Tensor& req_pool_indices, const at::Tensor& seq_lens,
         const at::Tensor& extend_lens, const at::Tensor& qo_start_loc)
      : req_to_token(req_to_token_in.to(at::kInt).contiguous()),
        rows(req_pool_indices.to(at::kLong).contiguous()),
        lens(seq_lens.to(at::kLong).contiguous()),
        new_lens(extend_lens.to(at::kLong).contiguous()),
        starts(qo_start_loc.to(at::kLong).contiguous()) {
    const int64_t batch = req_pool_indices.numel();
    TORCH_CHECK(req_to_token_in.dim() == 2, "req_to_token must be 2-D");
    for (const at::Tensor* t : {&req_pool_indices, &seq_lens, &extend_lens, &qo_start_loc}) {
      TORCH_CHECK(t->dim() == 1 && t->numel() == batch,
                  "req_pool_indices, seq_lens, extend_lens, qo_start_loc must be 1-D of one length");
    }
  }

  void point(Problem& pb) const {
    pb.req_to_token = req_to_token.data_ptr<int32_t>();
    pb.table_width = req_to_token.size(1);
    pb.rows = rows.data_ptr<int64_t>();
    pb.seq_lens = lens.data_ptr<int64_t>();
    pb.extend_lens = new_lens.data_ptr<int64_t>();
    pb.starts = starts.data_ptr<int64_t>();
  }
};

void paged_attention(const at::Tensor& q_in, const at::Tensor& k_buffer, const at::Tensor& v_buffer, const at::Tensor& o,
                     const at::Tensor& req_to_token, const at::Tensor& req_pool_indices,
                     const at::Tensor& seq_lens, const at::Tensor& extend_lens, const at::Tensor& qo_start_loc,
                     double sm_scale, bool share_prefixes, bool bf16_dot, bool causal, bool amx) {
  TORCH_CHECK(q_in.device().is_cpu(), "paged_attention_cpu runs on CPU tensors");
  TORCH_CHECK(k_buffer.is_contiguous() && v_buffer.is_contiguous() && o.is_contiguous(),
              "k_buffer, v_buffer and o must be contiguous");
  TORCH_CHECK(k_buffer.scalar_type() == q_in.scalar_type() && v_buffer.scalar_type() == q_in.scalar_type() &&
                  o.scalar_type() == q_in.scalar_type(),
              "q, o, k_buffer, v_buffer must share one dtype");
  TORCH_CHECK(q_in.dim() == 3 && k_buffer.dim() == 3 && v_buffer.sizes() == k_buffer.sizes() &&
                  o.sizes() == q_in.sizes() && k_buffer.size(2) == q_in.size(2),
              "need q, o [tokens, q_heads, D] and k_buffer, v_buffer [slots, kv_heads, D]");
  TORCH_CHECK(k_buffer.size(1) > 0 && q_in.size(1) % k_buffer.size(1) == 0,
              "num_q_heads must be a multiple of num_kv_heads");
  const int64_t batch = req_pool_indices.numel();
  const Tables tables(req_to_token, req_pool_indices, seq_lens, extend_lens, qo_start_loc);
  // q may be the leading columns of a fused qkv projection's rows: read in place, heads contiguous
  const at::Tensor q = q_in.stride(2) == 1 && q_in.stride(1) == q_in.size(2) ? q_in : q_in.contiguous();
  Problem pb;
  pb.q_token_stride = q.stride(0);
  pb.num_q_heads = q.size(1);
  pb.num_kv_heads = k_buffer.size(1);
  pb.group = pb.num_q_heads / pb.num_kv_heads;
  pb.head_dim = q.size(2);
  pb.slot_stride = pb.num_kv_heads * k_buffer.size(2);
  pb.sm_scale = static_cast<float>(sm_scale);
  pb.bf16_dot = bf16_dot;
  pb.amx = amx;
  pb.causal = causal;
  tables.point(pb);
  for (int64_t b = 0; b < batch; ++b) {
    check_request(pb, b, tables.req_to_token.size(0), q.size(0), k_buffer.size(0));
  }
  // (the shared pass resumes decode rows, which see every key either way; kept to causal calls)
  const std::vector<SharedGroup> groups =
      share_prefixes && causal ? find_shared_prefixes(pb, batch) : std::vector<SharedGroup>{};
  const std::vector<Item> items = make_items(pb, batch, at::get_num_threads(), groups);
  if (items.empty()) return;
  switch (q.scalar_type()) {
    case at::kFloat: run_all<float>(items, groups, pb, q, k_buffer, v_buffer, o, batch); break;
    case at::kBFloat16: run_all<c10::BFloat16>(items, groups, pb, q, k_buffer, v_buffer, o, batch); break;
    case at::kHalf: run_all<c10::Half>(items, groups, pb, q, k_buffer, v_buffer, o, batch); break;
    default: TORCH_CHECK(false, "paged_attention_cpu: unsupported dtype ", q.scalar_type());
  }
}

// The groups paged_attention would form, as [batch, 2] int64: (group number or -1, keys shared).
// For tests and benchmarks; indices are checked against the table only, as no pool is given.
at::Tensor shared_prefix_groups(const at::Tensor& req_to_token, const at::Tensor& req_pool_indices,
                                const at::Tensor& seq_lens, const at::Tensor& extend_lens) {
  const int64_t batch = req_pool_indices.numel();
  const Tables tables(req_to_token, req_pool_indices, seq_lens, extend_lens, at::zeros({batch}, at::kLong));
  Problem pb{};
  tables.point(pb);
  const int64_t unbounded = std::numeric_limits<int64_t>::max();  // no q rows or pool to bound them here
  for (int64_t b = 0; b < batch; ++b) check_request(pb, b, tables.req_to_token.size(0), unbounded, unbounded);
  at::Tensor out = at::full({batch, 2}, -1, at::kLong);
  out.select(1, 1).zero_();
  const std::vector<SharedGroup> groups = find_shared_prefixes(pb, batch);
  auto cell = out.accessor<int64_t, 2>();
  for (size_t g = 0; g < groups.size(); ++g) {
    for (int64_t b : groups[g].members) {
      cell[b][0] = static_cast<int64_t>(g);
      cell[b][1] = groups[g].keys;
    }
  }
  return out;
}

// Whether this build has the bf16 dot-product path (compiled for a CPU with AVX512_BF16).
bool has_bf16_dot() {
#if defined(VLSERVE_BF16_DOT)
  return true;
#else
  return false;
#endif
}

// Whether this build's bf16 path runs on AMX tiles here (compiled for a CPU with AMX-BF16, and the
// OS lets the process use them).
bool has_amx() {
#if defined(VLSERVE_AMX)
  return vlserve_amx::usable();
#else
  return false;
#endif
}

}  // namespace

TORCH_LIBRARY(vlserve_cpu, m) {
  m.def("paged_attention(Tensor q, Tensor k_buffer, Tensor v_buffer, Tensor(a!) o, Tensor req_to_token, "
        "Tensor req_pool_indices, Tensor seq_lens, Tensor extend_lens, Tensor qo_start_loc, float sm_scale, "
        "bool share_prefixes=True, bool bf16_dot=True, bool causal=True, bool amx=True) -> ()");
  m.def("has_bf16_dot() -> bool", &has_bf16_dot);
  m.def("has_amx() -> bool", &has_amx);
  m.def("shared_prefix_groups(Tensor req_to_token, Tensor req_pool_indices, Tensor seq_lens, Tensor extend_lens) "
        "-> Tensor");
}

TORCH_LIBRARY_IMPL(vlserve_cpu, CPU, m) {
  m.impl("paged_attention", &paged_attention);
  m.impl("shared_prefix_groups", &shared_prefix_groups);
}

