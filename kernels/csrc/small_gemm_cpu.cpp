// y[M, N] = x[M, K] · w[N, K]^T (+ bias) for the few rows that decode batches and short prompts
// run (M up to a few dozen), where BLAS libraries tuned for big GEMMs fall to a third of the core's
// rate: the weight is read once from memory and reused from L1 by every row.
//
// Register block: kRows rows x kCols weight rows (output columns), lanes over K. Each step loads
// kCols weight vectors and one x vector per row, and does kRows * kCols FMAs; the kCols weight rows
// (kCols * K floats) stay in L1 while every row block passes over them. Each accumulator is summed
// across its lanes once at the end. Weights may be fp32 or bf16 (widened on load: half the bytes
// from memory, which is what bounds one-row decode); x and y are fp32.
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

// Rows m0 .. m0+R-1 against weight rows n0 .. n0+C-1 (K a multiple of kLanes here; the rest in tail).
template <typename W, int R, int C>
void block(const float* x, const W* w, float* y, int64_t K, int64_t N, int64_t m0, int64_t n0, int64_t k_vec) {
  vf acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = vf{};
  for (int64_t k = 0; k < k_vec; k += kLanes) {
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

template <typename W, int C>
void column_block(const float* x, const W* w, float* y, int64_t M, int64_t K, int64_t N, int64_t n0) {
  const int64_t k_vec = K - K % kLanes;
  int64_t m0 = 0;
  for (; m0 + kRows <= M; m0 += kRows) block<W, kRows, C>(x, w, y, K, N, m0, n0, k_vec);
  switch (M - m0) {
    case 3: block<W, 3, C>(x, w, y, K, N, m0, n0, k_vec); break;
    case 2: block<W, 2, C>(x, w, y, K, N, m0, n0, k_vec); break;
    case 1: block<W, 1, C>(x, w, y, K, N, m0, n0, k_vec); break;
    default: break;
  }
}

template <typename W>
void run(const float* x, const W* w, const float* bias, float* y, int64_t M, int64_t K, int64_t N) {
  const int64_t blocks = (N + kCols - 1) / kCols;
  // Grain: enough column blocks per task that a thread's share is worth waking it for.
  at::parallel_for(0, blocks, 16, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const int64_t n0 = b * kCols;
      if (n0 + kCols <= N) {
        column_block<W, kCols>(x, w, y, M, K, N, n0);
      } else {
        for (int64_t n = n0; n < N; ++n) column_block<W, 1>(x, w, y, M, K, N, n);
      }
    }
  });
  if (bias != nullptr) {
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) y[m * N + n] += bias[n];
  }
}

at::Tensor small_linear(const at::Tensor& x_in, const at::Tensor& weight_in, const c10::optional<at::Tensor>& bias_in) {
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
    run<float>(x.data_ptr<float>(), weight.data_ptr<float>(), bp, y.data_ptr<float>(), M, K, N);
  } else {
    run<c10::BFloat16>(x.data_ptr<float>(), weight.data_ptr<c10::BFloat16>(), bp, y.data_ptr<float>(), M, K, N);
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
  m.def("small_linear(Tensor x, Tensor weight, Tensor? bias) -> Tensor");
  m.def("parallel_threads(int n) -> int");
}

TORCH_LIBRARY_IMPL(vlserve_gemm, CPU, m) { m.impl("small_linear", &small_linear); }

TORCH_LIBRARY_IMPL(vlserve_gemm, CompositeExplicitAutograd, m) { m.impl("parallel_threads", &parallel_threads); }
