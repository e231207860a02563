// Batched paged attention for the CPU: one call per layer for a whole decode or extend batch.
//
// Request b's new tokens q[qo_start_loc[b] : + extend_lens[b]] attend to its tokens
// 0..seq_lens[b]-1, read through req_to_token[req_pool_indices[b]] straight from the pool (no
// gathered copy of the request's KV). Query i of request b sits at position prefix + i
// (prefix = seq_lens[b] - extend_lens[b]) and sees keys 0..prefix + i.
//
// Work item = (request, kv head, block of up to kQueryBlock new tokens). Its rows are every
// (query, q head) pair sharing that kv head (GQA), so each key/value tile is loaded once for all
// of them. Keys go in tiles of kKeyTile with an online softmax, all in fp32; tiles are converted to
// fp32 on load, so fp16/bf16 pools work too. Threads take items, longest first, from a shared
// counter.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace {

constexpr int kKeyTile = 32;     // keys per tile: two AVX-512 vectors of fp32 scores
constexpr int kQueryBlock = 16;  // new tokens per work item in extend

inline float to_float(float x) { return x; }
inline float to_float(c10::BFloat16 x) { return static_cast<float>(x); }
inline float to_float(c10::Half x) { return static_cast<float>(x); }

// e^x for x <= 0 (a score minus its row's running max), written so that gcc vectorises it:
// x = n ln2 + r with |r| <= ln2/2, e^r by a degree-6 Taylor polynomial (relative error ~1e-7),
// 2^n built in the exponent bits. Below -87 it is clamped (e^-87 ~ 1.6e-38 is 0 next to a row max
// of e^0 = 1); masked keys are zeroed by the caller, never by relying on this.
inline float exp_nonpositive(float x) {
  x = x < -87.0f ? -87.0f : x;
  const float shifter = 12582912.0f;  // 1.5 * 2^23: adding it rounds to the nearest integer
  float n = (x * 1.44269504088896341f + shifter) - shifter;
  float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

struct Item {
  int64_t req;       // index into the batch
  int64_t kv_head;
  int64_t first;     // first new token of the block, within the request's new tokens
  int64_t count;     // new tokens in the block
  int64_t cost;      // rows x keys, for ordering
};

struct Scratch {
  std::vector<float> q, out, row_max, row_sum, kt, v, s;
  void reserve(int64_t rows, int64_t d) {
    q.resize(rows * d);
    out.resize(rows * d);
    row_max.resize(rows);
    row_sum.resize(rows);
    kt.resize(d * kKeyTile);
    v.resize(kKeyTile * d);
    s.resize(kKeyTile);
  }
};

struct Problem {
  int64_t num_q_heads, num_kv_heads, group, slot_stride;  // slot_stride = num_kv_heads * D
  const int32_t* req_to_token;
  int64_t table_width;
  const int64_t *rows, *seq_lens, *extend_lens, *starts;
  float sm_scale;
};

// Loads keys j0..j0+n-1 of one kv head: K transposed to kt[d][j], V as v[j][d]; the tile's unused
// columns are zeroed so that garbage in them can never turn into NaN.
template <typename T, int kD>
void load_tile(const T* k_buffer, const T* v_buffer, const int32_t* slots, int64_t j0, int n,
               int64_t kv_head, int64_t slot_stride, int head_dim, float* kt, float* v) {
  const int D = kD > 0 ? kD : head_dim;
  for (int j = 0; j < kKeyTile; ++j) {
    if (j < n) {
      const int64_t base = static_cast<int64_t>(slots[j0 + j]) * slot_stride + kv_head * D;
      const T* kr = k_buffer + base;
      const T* vr = v_buffer + base;
      for (int d = 0; d < D; ++d) kt[d * kKeyTile + j] = to_float(kr[d]);
      for (int d = 0; d < D; ++d) v[j * D + d] = to_float(vr[d]);
    } else {
      for (int d = 0; d < D; ++d) kt[d * kKeyTile + j] = 0.0f;
      for (int d = 0; d < D; ++d) v[j * D + d] = 0.0f;
    }
  }
}

// One row against one tile: scores, online-softmax rescale, accumulate. `valid` keys of the tile
// (a prefix of it) are visible to the row; valid >= 1.
template <int kD>
inline void row_update(const float* q, const float* kt, const float* v, int valid, int head_dim, float* s,
                       float* out, float& row_max, float& row_sum) {
  const int D = kD > 0 ? kD : head_dim;
  for (int j = 0; j < kKeyTile; ++j) s[j] = 0.0f;
  for (int d = 0; d < D; ++d) {
    const float qd = q[d];
    const float* k = kt + d * kKeyTile;
    for (int j = 0; j < kKeyTile; ++j) s[j] += qd * k[j];
  }
  float tile_max = -std::numeric_limits<float>::infinity();
  for (int j = 0; j < valid; ++j) tile_max = std::max(tile_max, s[j]);
  const float new_max = std::max(row_max, tile_max);
  const float rescale = exp_nonpositive(row_max - new_max);  // row_max = -inf on the first tile: 0
  float tile_sum = 0.0f;
  for (int j = 0; j < kKeyTile; ++j) {
    const float p = exp_nonpositive(s[j] - new_max);
    s[j] = j < valid ? p : 0.0f;
    tile_sum += s[j];
  }
  row_sum = row_sum * rescale + tile_sum;
  row_max = new_max;
  for (int d = 0; d < D; ++d) out[d] *= rescale;
  for (int j = 0; j < valid; ++j) {
    const float p = s[j];
    const float* vr = v + j * D;
    for (int d = 0; d < D; ++d) out[d] += p * vr[d];
  }
}

template <typename T, int kD>
void run_item(const Item& it, const Problem& pb, const T* q, const T* k_buffer, const T* v_buffer, T* o,
              int head_dim, Scratch& sc) {
  const int D = kD > 0 ? kD : head_dim;
  const int64_t seq_len = pb.seq_lens[it.req], prefix = seq_len - pb.extend_lens[it.req];
  const int64_t rows = it.count * pb.group;
  const int32_t* slots = pb.req_to_token + pb.rows[it.req] * pb.table_width;
  // Row r is new token it.first + r / group, q head kv_head * group + r % group.
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t token = pb.starts[it.req] + it.first + r / pb.group;
    const int64_t head = it.kv_head * pb.group + r % pb.group;
    const T* src = q + (token * pb.num_q_heads + head) * D;
    float* dst = sc.q.data() + r * D;
    for (int d = 0; d < D; ++d) dst[d] = to_float(src[d]) * pb.sm_scale;
    std::fill(sc.out.data() + r * D, sc.out.data() + (r + 1) * D, 0.0f);
    sc.row_max[r] = -std::numeric_limits<float>::infinity();
    sc.row_sum[r] = 0.0f;
  }
  const int64_t num_keys = prefix + it.first + it.count;  // the block's last token sees this many
  for (int64_t j0 = 0; j0 < num_keys; j0 += kKeyTile) {
    const int n = static_cast<int>(std::min<int64_t>(kKeyTile, num_keys - j0));
    load_tile<T, kD>(k_buffer, v_buffer, slots, j0, n, it.kv_head, pb.slot_stride, head_dim, sc.kt.data(),
                     sc.v.data());
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t visible = prefix + it.first + r / pb.group + 1;  // keys 0..position
      if (visible <= j0) continue;  // this row's keys ended in an earlier tile
      const int valid = static_cast<int>(std::min<int64_t>(n, visible - j0));
      row_update<kD>(sc.q.data() + r * D, sc.kt.data(), sc.v.data(), valid, head_dim, sc.s.data(),
                     sc.out.data() + r * D, sc.row_max[r], sc.row_sum[r]);
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t token = pb.starts[it.req] + it.first + r / pb.group;
    const int64_t head = it.kv_head * pb.group + r % pb.group;
    T* dst = o + (token * pb.num_q_heads + head) * D;
    const float inv = 1.0f / sc.row_sum[r];
    const float* src = sc.out.data() + r * D;
    for (int d = 0; d < D; ++d) dst[d] = static_cast<T>(src[d] * inv);
  }
}

template <typename T, int kD>
void run_all(const std::vector<Item>& items, const Problem& pb, const at::Tensor& q, const at::Tensor& k_buffer,
             const at::Tensor& v_buffer, const at::Tensor& o) {
  const int head_dim = static_cast<int>(q.size(2));
  const T* qp = q.data_ptr<T>();
  const T* kp = k_buffer.data_ptr<T>();
  const T* vp = v_buffer.data_ptr<T>();
  T* op = o.data_ptr<T>();
  const int64_t max_rows = kQueryBlock * pb.group;
  std::atomic<int64_t> next{0};
  const int64_t workers = std::min<int64_t>(at::get_num_threads(), static_cast<int64_t>(items.size()));
  // One task per thread; each pulls the next item (longest first) until none are left.
  at::parallel_for(0, workers, 1, [&](int64_t begin, int64_t end) {
    Scratch sc;
    sc.reserve(max_rows, head_dim);
    for (int64_t w = begin; w < end; ++w) {
      for (int64_t i = next.fetch_add(1); i < static_cast<int64_t>(items.size()); i = next.fetch_add(1)) {
        run_item<T, kD>(items[i], pb, qp, kp, vp, op, head_dim, sc);
      }
    }
  });
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

std::vector<Item> make_items(const Problem& pb, int64_t batch, int64_t table_rows, int64_t num_tokens,
                             int64_t num_slots) {
  std::vector<Item> items;
  for (int64_t b = 0; b < batch; ++b) {
    check_request(pb, b, table_rows, num_tokens, num_slots);
    const int64_t new_tokens = pb.extend_lens[b], prefix = pb.seq_lens[b] - new_tokens;
    for (int64_t first = 0; first < new_tokens; first += kQueryBlock) {
      const int64_t count = std::min<int64_t>(kQueryBlock, new_tokens - first);
      for (int64_t h = 0; h < pb.num_kv_heads; ++h) {
        items.push_back({b, h, first, count, count * (prefix + first + count)});
      }
    }
  }
  std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.cost > b.cost; });
  return items;
}

void paged_attention(const at::Tensor& q_in, const at::Tensor& k_buffer, const at::Tensor& v_buffer, const at::Tensor& o,
                     const at::Tensor& req_to_token_in, const at::Tensor& req_pool_indices,
                     const at::Tensor& seq_lens, const at::Tensor& extend_lens, const at::Tensor& qo_start_loc,
                     double sm_scale) {
  TORCH_CHECK(q_in.device().is_cpu(), "paged_attention_cpu runs on CPU tensors");
  TORCH_CHECK(k_buffer.is_contiguous() && v_buffer.is_contiguous() && o.is_contiguous(),
              "k_buffer, v_buffer and o must be contiguous");
  TORCH_CHECK(k_buffer.scalar_type() == q_in.scalar_type() && v_buffer.scalar_type() == q_in.scalar_type() &&
                  o.scalar_type() == q_in.scalar_type(),
              "q, o, k_buffer, v_buffer must share one dtype");
  const at::Tensor q = q_in.contiguous();
  const at::Tensor req_to_token = req_to_token_in.to(at::kInt).contiguous();
  const at::Tensor rows = req_pool_indices.to(at::kLong).contiguous();
  const at::Tensor lens = seq_lens.to(at::kLong).contiguous();
  const at::Tensor new_lens = extend_lens.to(at::kLong).contiguous();
  const at::Tensor starts = qo_start_loc.to(at::kLong).contiguous();
  Problem pb;
  pb.num_q_heads = q.size(1);
  pb.num_kv_heads = k_buffer.size(1);
  pb.group = pb.num_q_heads / pb.num_kv_heads;
  pb.slot_stride = pb.num_kv_heads * k_buffer.size(2);
  pb.req_to_token = req_to_token.data_ptr<int32_t>();
  pb.table_width = req_to_token.size(1);
  pb.rows = rows.data_ptr<int64_t>();
  pb.seq_lens = lens.data_ptr<int64_t>();
  pb.extend_lens = new_lens.data_ptr<int64_t>();
  pb.starts = starts.data_ptr<int64_t>();
  pb.sm_scale = static_cast<float>(sm_scale);
  const std::vector<Item> items = make_items(pb, rows.size(0), req_to_token.size(0), q.size(0), k_buffer.size(0));
  if (items.empty()) return;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "paged_attention_cpu", [&] {
    switch (q.size(2)) {
      case 64: run_all<scalar_t, 64>(items, pb, q, k_buffer, v_buffer, o); break;
      case 128: run_all<scalar_t, 128>(items, pb, q, k_buffer, v_buffer, o); break;
      default: run_all<scalar_t, 0>(items, pb, q, k_buffer, v_buffer, o); break;
    }
  });
}

}  // namespace

TORCH_LIBRARY(vlserve_cpu, m) {
  m.def("paged_attention(Tensor q, Tensor k_buffer, Tensor v_buffer, Tensor(a!) o, Tensor req_to_token, "
        "Tensor req_pool_indices, Tensor seq_lens, Tensor extend_lens, Tensor qo_start_loc, float sm_scale) -> ()");
}

TORCH_LIBRARY_IMPL(vlserve_cpu, CPU, m) { m.impl("paged_attention", &paged_attention); }
