// y[M, N] = x[M, K] · w[N, K]^T (+ bias) for the few rows that decode batches and short prompts
// run (M up to a few dozen), where BLAS libraries tuned for big GEMMs fall to a third of the core's
// rate: the weight is read once from memory and reused from L1 by every row.
//
// Register block: kRows rows x kCols weight rows (output columns), lanes over K. Each step loads
// kCols weight vectors and one x vector per row, and does kRows * kCols FMAs; the kCols weight rows
// (kCols * K floats) stay in L1 while every row block passes over them. Each accumulator is summed
// across its lanes once at the end. Weights may be fp32 or bf16 (widened on load: half the bytes
// from memory, which is what bounds one-row decode); x and y are fp32. While the row blocks pass over
// one column block, they prefetch the next block's weight rows (column_block).
//
// Threads split the output columns; each takes whole column blocks.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "vec_cpu.h"

#include <atomic>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

using namespace vlserve_vec;

constexpr int kRows = 2;  // kRows * kCols accumulators + kCols weight vectors + 1 x vector <= 16 registers
constexpr int kCols = 5;  // 2 x 5 measured best of 1x8, 2x4, 2x5, 2x6, 3x3, 4x2, 4x3 (AVX2)

inline float widen(float x) { return x; }
inline float widen(c10::BFloat16 x) { return static_cast<float>(x); }

// The next column block's weight rows, fetched ahead of use: `lines` cache lines from `next`, spread
// evenly over one pass of the k loop.
struct Prefetch {
  const char* next;
  int64_t lines;
};

// Rows m0 .. m0+R-1 against weight rows n0 .. n0+C-1 (K a multiple of kLanes here; the rest in tail).
template <typename W, int R, int C>
void block(const float* x, const W* w, float* y, int64_t K, int64_t N, int64_t m0, int64_t n0, int64_t k_vec,
           Prefetch pf) {
  vf acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = vf{};
  const int64_t steps = k_vec / kLanes;
  int64_t owed = 0;  // lines * step / steps, in units of 1 / steps
  for (int64_t k = 0; k < k_vec; k += kLanes) {
    for (owed += pf.lines; owed >= steps && steps > 0; owed -= steps, pf.next += 64) __builtin_prefetch(pf.next, 0, 3);
    vf wv[C];
    for (int c = 0; c < C; ++c) wv[c] = load16(w + (n0 + c) * K + k);
    for (int r = 0; r < R; ++r) {
      const vf xv = load16(x + (m0 + r) * K + k);
      for (int c = 0; c < C; ++c) acc[r][c] += xv * wv[c];
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) {
      float sum = hsum(acc[r][c]);
      for (int64_t k = k_vec; k < K; ++k) sum += x[(m0 + r) * K + k] * widen(w[(n0 + c) * K + k]);
      y[(m0 + r) * N + n0 + c] = sum;
    }
  }
}

// The weight streams from memory and is the bound below a dozen rows; the hardware prefetcher alone
// keeps too few lines in flight once every line is reused by several row blocks (the first pass
// waits on memory, the later ones leave it idle). So the passes over this column block also fetch
// the next block's rows (`next`: contiguous, C * K weights; null for the last), each pass its share.
template <typename W, int C>
void column_block(const float* x, const W* w, float* y, int64_t M, int64_t K, int64_t N, int64_t n0,
                  const W* next) {
  static_assert(kRows == 2, "at most one row is left after the row blocks");
  const int64_t k_vec = K - K % kLanes;
  const int64_t passes = (M + kRows - 1) / kRows;
  const int64_t lines = next == nullptr ? 0 : (C * K * static_cast<int64_t>(sizeof(W)) + 63) / 64;
  const char* cursor = reinterpret_cast<const char*>(next);
  int64_t m0 = 0;
  for (int64_t pass = 0; pass < passes; ++pass, m0 += kRows) {
    // this pass's share of the lines: [pass * lines / passes, (pass + 1) * lines / passes)
    const int64_t share = (pass + 1) * lines / passes - pass * lines / passes;
    const Prefetch pf{cursor, share};
    cursor += share * 64;
    if (m0 + kRows <= M) block<W, kRows, C>(x, w, y, K, N, m0, n0, k_vec, pf);
    else block<W, 1, C>(x, w, y, K, N, m0, n0, k_vec, pf);
  }
}

template <typename W>
void run(const float* x, const W* w, const float* bias, float* y, int64_t M, int64_t K, int64_t N, bool prefetch) {
  const int64_t blocks = (N + kCols - 1) / kCols;
  // Grain: enough column blocks per task that a thread's share is worth waking it for.
  at::parallel_for(0, blocks, 16, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const int64_t n0 = b * kCols;
      // one row block is a single pass, which the hardware prefetcher keeps up with (measured)
      const bool fetch_next = prefetch && M > kRows && b + 1 < end && n0 + 2 * kCols <= N;
      const W* next = fetch_next ? w + (n0 + kCols) * K : nullptr;
      if (n0 + kCols <= N) {
        column_block<W, kCols>(x, w, y, M, K, N, n0, next);
      } else {
        for (int64_t n = n0; n < N; ++n) column_block<W, 1>(x, w, y, M, K, N, n, nullptr);
      }
    }
  });
  if (bias != nullptr) {
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) y[m * N + n] += bias[n];
  }
}

// prefetch=false leaves the weight stream to the hardware prefetcher alone (both were measured by
// benchmarks/gemm_paths.py, retired at ba1d303; prefetch on is the default).
at::Tensor small_linear(const at::Tensor& x_in, const at::Tensor& weight_in, const c10::optional<at::Tensor>& bias_in,
                        bool prefetch) {
  TORCH_CHECK(x_in.device().is_cpu() && weight_in.device().is_cpu(), "small_linear runs on CPU tensors");
  TORCH_CHECK(x_in.scalar_type() == at::kFloat, "small_linear: x must be float32, got ", x_in.scalar_type());
  TORCH_CHECK(weight_in.dim() == 2 && x_in.dim() >= 1 && x_in.size(-1) == weight_in.size(1),
              "small_linear: need x [..., K] and weight [N, K], got ", x_in.sizes(), " and ", weight_in.sizes());
  TORCH_CHECK(weight_in.scalar_type() == at::kFloat || weight_in.scalar_type() == at::kBFloat16,
              "small_linear: weight must be float32 or bfloat16, got ", weight_in.scalar_type());
  const int64_t K = weight_in.size(1), N = weight_in.size(0);
  const at::Tensor x = x_in.reshape({-1, K}).contiguous();
  const at::Tensor weight = weight_in.contiguous();
  at::Tensor bias;
  if (bias_in.has_value() && bias_in->defined()) {
    bias = bias_in->to(at::kFloat).contiguous();
    TORCH_CHECK(bias.dim() == 1 && bias.size(0) == N, "small_linear: bias must be [N]");
  }
  const int64_t M = x.size(0);
  at::Tensor y = at::empty({M, N}, x.options());
  const float* bp = bias.defined() ? bias.data_ptr<float>() : nullptr;
  if (weight.scalar_type() == at::kFloat) {
    run<float>(x.data_ptr<float>(), weight.data_ptr<float>(), bp, y.data_ptr<float>(), M, K, N, prefetch);
  } else {
    run<c10::BFloat16>(x.data_ptr<float>(), weight.data_ptr<c10::BFloat16>(), bp, y.data_ptr<float>(), M, K, N, prefetch);
  }
  std::vector<int64_t> shape(x_in.sizes().begin(), x_in.sizes().end());
  shape.back() = N;
  return y.view(shape);
}

// How many threads at::parallel_for actually ran over n items: the extension must be built with
// OpenMP (-fopenmp) or its parallel regions run serially, silently (tests/test_small_gemm.py).
int64_t parallel_threads(int64_t n) {
  std::vector<std::atomic<int>> seen(at::get_num_threads() + 1);
  at::parallel_for(0, n, 1, [&](int64_t, int64_t) { seen[at::get_thread_num()] = 1; });
  int64_t count = 0;
  for (const auto& s : seen) count += s.load();
  return count;
}

}  // namespace

TORCH_LIBRARY(vlserve_gemm, m) {
  m.def("small_linear(Tensor x, Tensor weight, Tensor? bias, bool prefetch=True) -> Tensor");
  m.def("parallel_threads(int n) -> int");
}

TORCH_LIBRARY_IMPL(vlserve_gemm, CPU, m) { m.impl("small_linear", &small_linear); }

TORCH_LIBRARY_IMPL(vlserve_gemm, CompositeExplicitAutograd, m) { m.impl("parallel_threads", &parallel_threads); }
