// The decoder layer's elementwise steps, each one pass over memory in one parallel region: RMSNorm
// (with the residual add before it fused in), SiLU(gate) * up, rotary embedding in place, and the
// new tokens' K and V stored into the paged pool. Before W8A8 projections the norm's output, and
// SiLU * up's before a W8A8 down_proj, leave as int8 rows and per-row scales instead (rms_norm_quant,
// silu_mul_quant): one quantization per shared input; each row is computed into an fp32 row of
// scratch (in L1) with its max |x| found on the way, then coded, so no separate pass finds the scale.
// Eager PyTorch runs them as 4-10 separate ops each (a pass and a thread barrier apiece), which
// measured 5% of a prefill layer on one thread and up to 18% on two threads of a loaded machine.
//
// Rounding follows transformers' order op by op: a bf16/fp16 model rounds wherever transformers'
// eager code produces a tensor of the model's dtype, so the outputs are those of the unfused ops
// (fp32 models: no rounding at all; the sums are in another order, within fp32 rounding).

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "vec_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <vector>

namespace {

using namespace vlserve_vec;

// exp for |x| <= 88 (clamped), Cephes' expf: 2^n * e^r with r in [-ln2/2, ln2/2], relative error
// about 2e-7 (two fp32 ulps).
inline vf vexp(vf x) {
#if defined(__AVX512F__)
  // vminps/vmaxps: one instruction each where the compare-and-select is two (NaN becomes a bound
  // here; every caller's result is NaN from its other operand then)
  x = (vf)_mm512_max_ps(_mm512_min_ps((__m512)x, _mm512_set1_ps(88.3f)), _mm512_set1_ps(-87.3f));
#else
  x = x > splat(88.3f) ? splat(88.3f) : x;
  x = x < splat(-87.3f) ? splat(-87.3f) : x;
#endif
  const vf t = x * 1.44269504088896341f + 0.5f;
#if defined(__AVX512F__)
  const vf nf = (vf)_mm512_roundscale_ps((__m512)t, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);  // floor
#else
  vi n = __builtin_convertvector(t, vi);
  n += (vi)(__builtin_convertvector(n, vf) > t);  // truncation -> floor (a true compare is -1)
  const vf nf = __builtin_convertvector(n, vf);
#endif
  const vf r = x - nf * 0.693359375f - nf * -2.12194440e-4f;
  vf y = splat(1.9875691500e-4f);
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * r * r + r + 1.0f;
#if defined(__AVX512F__)
  return (vf)_mm512_scalef_ps((__m512)y, (__m512)nf);  // y * 2^n in one instruction (n in [-126, 127])
#else
  vf scale;
  const vi bits = (n + 127) << 23;
  std::memcpy(&scale, &bits, sizeof(scale));
  return y * scale;
#endif
}

inline float exp_scalar(float x) {
  float lanes[kLanes] = {x};
  storeu(lanes, vexp(loadu(lanes)));
  return lanes[0];
}

template <typename T>
inline float f32(T x) { return static_cast<float>(x); }
template <typename T>
inline float round_to(float x) { return static_cast<float>(static_cast<T>(x)); }  // the model dtype's rounding

// kLanes values rounded to the model dtype and widened back (round_to, a vector at a time).
template <typename T>
inline vf round_vec(vf v) {
  if constexpr (std::is_same_v<T, c10::BFloat16>) return through_bf16(v);
  else return v;
}
// Whether the vector paths below serve T (fp16 keeps the per-element loops).
template <typename T>
constexpr bool kVectorised = std::is_same_v<T, float> || std::is_same_v<T, c10::BFloat16>;

// Rows per task of the light passes (norms, rotary): about 16K elements. Their ~0.35 ns an element
// on one Zen 5 thread made a 128K grain keep a 32-row decode batch on one thread: 18 us for a
// 1,536-wide add_rms_norm_quant (twice a layer), 29 us for the rotary of 16 heads x 128, where two
// tasks take ~13.5 us and ~17 us on two threads (already awake: the GEMMs around them run on every
// thread). A batch of a few rows stays one task, on one thread.
inline int64_t grain(int64_t width) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(1, width)); }

// Where a norm's int8 rows go (rms_norm_quant): q [rows, ldq] (ldq = H rounded up to 4, the padding
// left zero), scale [rows]. The W8A8 GEMMs after the norm (quant_int8_cpu.cpp) read them as they are.
struct QuantOut {
  int8_t* q = nullptr;
  float* scale = nullptr;
  int64_t ldq = 0;
};

typedef int8_t vb __attribute__((vector_size(VLSERVE_LANES)));

// One row quantized per token as compressed-tensors does it and quant_int8_cpu.cpp's quantize_rows:
// scale = max(max|x| / 127.5, fp32 eps), q = round-half-even(x / scale) clamped to [-128, 127]; the
// same fp32 operations, so the same bytes. Clamping before rounding gives the same integers (the
// bounds are integers), and adding and taking off 1.5 · 2^23 rounds |v| <= 128 half to even.
// quantize_codes takes max|x| from the caller: the fused rows below find it while they compute the
// row, into an fp32 scratch row (each value already rounded to the model dtype), and quantize that.
template <typename T>
float quantize_codes(const T* row, int64_t H, float amax, int8_t* q) {
  const int64_t h_vec = kVectorised<T> ? H - H % kLanes : 0;
  const float s = std::max(amax / 127.5f, 1.1920928955078125e-07f);
  if constexpr (kVectorised<T>) {
    const vf lo = splat(-128.f), hi = splat(127.f), magic = splat(12582912.f);
    for (int64_t i = 0; i < h_vec; i += kLanes) {
      vf v = vmax(load16(row + i) / s, lo);
      v = v > hi ? hi : v;
      const vb b = __builtin_convertvector(__builtin_convertvector((v + magic) - magic, vi), vb);
      std::memcpy(q + i, &b, sizeof(b));
    }
  }
  for (int64_t i = h_vec; i < H; ++i)
    q[i] = static_cast<int8_t>(std::min(127.f, std::max(-128.f, std::nearbyint(f32(row[i]) / s))));
  return s;
}

template <typename T>
float quantize_row(const T* row, int64_t H, int8_t* q) {
  const int64_t h_vec = kVectorised<T> ? H - H % kLanes : 0;
  float amax = 0.f;
  if constexpr (kVectorised<T>) {
    vf vamax{};
    for (int64_t i = 0; i < h_vec; i += kLanes) { const vf v = load16(row + i); vamax = vmax(vamax, vmax(v, -v)); }
    for (int j = 0; j < kLanes; ++j) amax = std::max(amax, vamax[j]);
  }
  for (int64_t i = h_vec; i < H; ++i) amax = std::max(amax, std::fabs(f32(row[i])));
  return quantize_codes(row, H, amax, q);
}

// o = round(w * round(x * inv)) widened to fp32 (the values norm_rows stores), returning their max |x|
// as quantize_row finds it (kVectorised types).
template <typename T>
float norm_row_amax(const T* xr, const T* w, float inv, int64_t H, float* o) {
  const int64_t h_vec = H - H % kLanes;
  vf vamax{};
  for (int64_t i = 0; i < h_vec; i += kLanes) {
    const vf v = round_vec<T>(load16(w + i) * round_vec<T>(load16(xr + i) * inv));
    storeu(o + i, v);
    vamax = vmax(vamax, vmax(v, -v));
  }
  float amax = 0.f;
  for (int j = 0; j < kLanes; ++j) amax = std::max(amax, vamax[j]);
  for (int64_t i = h_vec; i < H; ++i) {
    o[i] = round_to<T>(f32(w[i]) * round_to<T>(f32(xr[i]) * inv));
    amax = std::max(amax, std::fabs(o[i]));
  }
  return amax;
}

// out[t] = w * round(x[t] / rms(x[t])); and, for add_rms_norm, sum[t] = round(x[t] + a[t]) first.
// With quant.q set, out[t] is a row of scratch and what leaves is its int8 quantization.
template <typename T>
void norm_rows(const T* x, const T* a, const T* w, T* sum, T* out, int64_t rows, int64_t H, int64_t x_stride,
               float eps, const QuantOut& quant = QuantOut()) {
  at::parallel_for(0, rows, grain(H), [&](int64_t begin, int64_t end) {
    std::vector<T> scratch(quant.q != nullptr && !kVectorised<T> ? H : 0);
    std::vector<float> scratch32(quant.q != nullptr && kVectorised<T> ? H : 0);
    for (int64_t t = begin; t < end; ++t) {
      const T* xr = x + t * x_stride;
      T* orow = quant.q != nullptr ? scratch.data() : out + t * H;
      float sq = 0.f;
      const int64_t h_vec = kVectorised<T> ? H - H % kLanes : 0;
      if (a != nullptr) {
        const T* ar = a + t * H;
        T* srow = sum + t * H;
        if constexpr (kVectorised<T>)
          for (int64_t i = 0; i < h_vec; i += kLanes) store16(srow + i, load16(xr + i) + load16(ar + i));
        for (int64_t i = h_vec; i < H; ++i) srow[i] = static_cast<T>(f32(xr[i]) + f32(ar[i]));
        xr = srow;
      }
      if constexpr (kVectorised<T>) {
        vf acc{};
        for (int64_t i = 0; i < h_vec; i += kLanes) { const vf v = load16(xr + i); acc += v * v; }
        for (int j = 0; j < kLanes; ++j) sq += acc[j];
      }
      for (int64_t i = h_vec; i < H; ++i) sq += f32(xr[i]) * f32(xr[i]);
      const float inv = 1.0f / std::sqrt(sq / static_cast<float>(H) + eps);
      if constexpr (kVectorised<T>) {
        if (quant.q != nullptr) {  // into fp32 scratch, finding max |x| on the way
          const float amax = norm_row_amax(xr, w, inv, H, scratch32.data());
          quant.scale[t] = quantize_codes(scratch32.data(), H, amax, quant.q + t * quant.ldq);
          continue;
        }
      }
      if constexpr (kVectorised<T>)
        for (int64_t i = 0; i < h_vec; i += kLanes)
          store16(orow + i, load16(w + i) * round_vec<T>(load16(xr + i) * inv));
      for (int64_t i = h_vec; i < H; ++i) orow[i] = static_cast<T>(f32(w[i]) * round_to<T>(f32(xr[i]) * inv));
      if (quant.q != nullptr) quant.scale[t] = quantize_row(orow, H, quant.q + t * quant.ldq);
    }
  });
}

void check_norm(const at::Tensor& x, const at::Tensor& weight) {
  TORCH_CHECK(x.device().is_cpu(), "rms_norm runs on CPU tensors");
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1, "rms_norm: x must be [T, H] with contiguous rows, got ",
              x.sizes(), " strides ", x.strides());
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == x.size(1) && weight.scalar_type() == x.scalar_type(),
              "rms_norm: weight must be [H] of x's dtype");
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_norm(x, weight);
  const at::Tensor w = weight.contiguous();
  at::Tensor out = at::empty(x.sizes(), x.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "rms_norm", [&] {
    norm_rows<scalar_t>(x.data_ptr<scalar_t>(), nullptr, w.data_ptr<scalar_t>(), nullptr,
                        out.data_ptr<scalar_t>(), x.size(0), x.size(1), x.stride(0), static_cast<float>(eps));
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const at::Tensor& a, const at::Tensor& weight,
                                                double eps) {
  check_norm(x, weight);
  TORCH_CHECK(a.sizes() == x.sizes() && a.scalar_type() == x.scalar_type(), "add_rms_norm: x and a differ");
  const at::Tensor ac = a.contiguous(), w = weight.contiguous();
  at::Tensor sum = at::empty(x.sizes(), x.options()), out = at::empty(x.sizes(), x.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "add_rms_norm", [&] {
    norm_rows<scalar_t>(x.data_ptr<scalar_t>(), ac.data_ptr<scalar_t>(), w.data_ptr<scalar_t>(),
                        sum.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), x.size(0), x.size(1), x.stride(0),
                        static_cast<float>(eps));
  });
  return {sum, out};
}

// The int8 rows of a norm's output and their per-row scales (the tensors behind QuantOut).
std::tuple<at::Tensor, at::Tensor, QuantOut> quant_out(const at::Tensor& x) {
  const int64_t rows = x.size(0), H = x.size(1), ldq = (H + 3) / 4 * 4;
  at::Tensor q = ldq == H ? at::empty({rows, ldq}, x.options().dtype(at::kChar))
                          : at::zeros({rows, ldq}, x.options().dtype(at::kChar));
  at::Tensor scale = at::empty({rows}, x.options().dtype(at::kFloat));
  return {q, scale, QuantOut{q.data_ptr<int8_t>(), scale.data_ptr<float>(), ldq}};
}

// rms_norm, its output quantized per row for a W8A8 GEMM: (q [T, H rounded up to 4] int8, scale [T]).
std::tuple<at::Tensor, at::Tensor> rms_norm_quant(const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_norm(x, weight);
  const at::Tensor w = weight.contiguous();
  auto [q, scale, quant] = quant_out(x);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "rms_norm_quant", [&] {
    norm_rows<scalar_t>(x.data_ptr<scalar_t>(), nullptr, w.data_ptr<scalar_t>(), nullptr, nullptr, x.size(0),
                        x.size(1), x.stride(0), static_cast<float>(eps), quant);
  });
  return {q, scale};
}

// add_rms_norm, the norm's output quantized per row: (x + a, q, scale).
std::tuple<at::Tensor, at::Tensor, at::Tensor> add_rms_norm_quant(const at::Tensor& x, const at::Tensor& a,
                                                                  const at::Tensor& weight, double eps) {
  check_norm(x, weight);
  TORCH_CHECK(a.sizes() == x.sizes() && a.scalar_type() == x.scalar_type(), "add_rms_norm_quant: x and a differ");
  const at::Tensor ac = a.contiguous(), w = weight.contiguous();
  at::Tensor sum = at::empty(x.sizes(), x.options());
  auto [q, scale, quant] = quant_out(x);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "add_rms_norm_quant", [&] {
    norm_rows<scalar_t>(x.data_ptr<scalar_t>(), ac.data_ptr<scalar_t>(), w.data_ptr<scalar_t>(),
                        sum.data_ptr<scalar_t>(), nullptr, x.size(0), x.size(1), x.stride(0),
                        static_cast<float>(eps), quant);
  });
  return {sum, q, scale};
}

// round(round(silu(g)) * u) for kLanes lanes, each rounded to the model dtype T (bf16: through bf16).
template <typename T>
inline vf silu_mul_vec(vf g, vf u) {
  return round_vec<T>(round_vec<T>(g / (1.0f + vexp(-g))) * u);
}

// The same for one element: the vector path's arithmetic (tails and fp16 rows).
template <typename T>
inline float silu_mul_scalar(T g, T u) {
  const float gi = f32(g);
  return round_to<T>(round_to<T>(gi / (1.0f + exp_scalar(-gi))) * f32(u));
}

// Vectors of SiLU * up per step of the row loops below: each vector is a chain of ~45 dependent
// instructions (the exp, the division, two roundings), and side by side in the code the core
// overlaps four chains where, one per loop iteration, its scheduler held too few of them to hide
// the chain: 32 x 4096 outputs in ~60 us on one Zen 5 thread, ~66 us one vector at a time.
constexpr int kSiluVectors = 4;

// o[i] = round(round(silu(g[i])) * u[i]) for one row of I.
template <typename T>
void silu_mul_row(const T* g, const T* u, T* o, int64_t I) {
  int64_t i = 0;
  if constexpr (kVectorised<T>) {
    for (; i + kSiluVectors * kLanes <= I; i += kSiluVectors * kLanes) {
      vf v[kSiluVectors];
      for (int k = 0; k < kSiluVectors; ++k) v[k] = silu_mul_vec<T>(load16(g + i + k * kLanes), load16(u + i + k * kLanes));
      for (int k = 0; k < kSiluVectors; ++k) store16(o + i + k * kLanes, v[k]);
    }
    for (; i + kLanes <= I; i += kLanes) store16(o + i, silu_mul_vec<T>(load16(g + i), load16(u + i)));
  }
  for (; i < I; ++i) o[i] = static_cast<T>(silu_mul_scalar(g[i], u[i]));
}

// silu_mul_row into an fp32 row o (the values silu_mul_row stores, widened), returning their max |x|
// as quantize_row finds it: the row is then quantized from o with no second pass to find the scale.
template <typename T>
float silu_mul_row_amax(const T* g, const T* u, float* o, int64_t I) {
  const int64_t i_vec = I - I % kLanes;
  vf vamax{};
  int64_t i = 0;
  for (; i + kSiluVectors * kLanes <= i_vec; i += kSiluVectors * kLanes) {
    vf v[kSiluVectors];
    for (int k = 0; k < kSiluVectors; ++k) v[k] = silu_mul_vec<T>(load16(g + i + k * kLanes), load16(u + i + k * kLanes));
    for (int k = 0; k < kSiluVectors; ++k) {
      storeu(o + i + k * kLanes, v[k]);
      vamax = vmax(vamax, vmax(v[k], -v[k]));
    }
  }
  for (; i < i_vec; i += kLanes) {
    const vf v = silu_mul_vec<T>(load16(g + i), load16(u + i));
    storeu(o + i, v);
    vamax = vmax(vamax, vmax(v, -v));
  }
  float amax = 0.f;
  for (int j = 0; j < kLanes; ++j) amax = std::max(amax, vamax[j]);
  for (i = i_vec; i < I; ++i) {
    o[i] = silu_mul_scalar(g[i], u[i]);
    amax = std::max(amax, std::fabs(o[i]));
  }
  return amax;
}

// Rows per task of SiLU * mul: ~32K outputs. Its exp and division cost ~0.5 ns an output on one Zen 5
// thread, ten times a norm's, so a task of 128K would keep a 32-row decode batch on one thread for
// ~80 us a layer; 32K makes a task ~20 us, past the cost of waking the second thread.
inline int64_t silu_grain(int64_t width) { return std::max<int64_t>(1, 32768 / std::max<int64_t>(1, width)); }

// out[t, i] = round(round(silu(g)) * u) with g = gate_up[t, i], u = gate_up[t, I + i]; with quant.q
// set, out[t] is a row of scratch and what leaves is its int8 quantization (for a W8A8 down_proj).
template <typename T>
void silu_mul_rows(const T* gu, T* out, int64_t rows, int64_t I, const QuantOut& quant = QuantOut()) {
  at::parallel_for(0, rows, silu_grain(I), [&](int64_t begin, int64_t end) {
    std::vector<T> scratch(quant.q != nullptr && !kVectorised<T> ? I : 0);
    std::vector<float> scratch32(quant.q != nullptr && kVectorised<T> ? I : 0);
    for (int64_t t = begin; t < end; ++t) {
      const T *g = gu + t * 2 * I, *u = g + I;
      if (quant.q == nullptr) {
        silu_mul_row(g, u, out + t * I, I);
      } else if constexpr (kVectorised<T>) {
        const float amax = silu_mul_row_amax(g, u, scratch32.data(), I);
        quant.scale[t] = quantize_codes(scratch32.data(), I, amax, quant.q + t * quant.ldq);
      } else {
        silu_mul_row(g, u, scratch.data(), I);
        quant.scale[t] = quantize_row(scratch.data(), I, quant.q + t * quant.ldq);
      }
    }
  });
}

at::Tensor check_gate_up(const at::Tensor& gate_up) {
  TORCH_CHECK(gate_up.device().is_cpu(), "silu_mul runs on CPU tensors");
  TORCH_CHECK(gate_up.dim() >= 1 && gate_up.size(-1) % 2 == 0, "silu_mul: last dimension must be even, got ",
              gate_up.sizes());
  return gate_up.contiguous();
}

at::Tensor silu_mul(const at::Tensor& gate_up_in) {
  const at::Tensor gu = check_gate_up(gate_up_in);
  const int64_t I = gu.size(-1) / 2, rows = gu.numel() / std::max<int64_t>(1, 2 * I);
  std::vector<int64_t> shape(gu.sizes().begin(), gu.sizes().end());
  shape.back() = I;
  at::Tensor out = at::empty(shape, gu.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, gu.scalar_type(), "silu_mul", [&] {
    silu_mul_rows<scalar_t>(gu.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), rows, I);
  });
  return out;
}

// silu_mul of [T, 2I], its output quantized per row for a W8A8 down_proj: (q [T, I rounded up to 4] int8,
// scale [T]), the bytes of quantize_rows(silu_mul(gate_up)).
std::tuple<at::Tensor, at::Tensor> silu_mul_quant(const at::Tensor& gate_up_in) {
  const at::Tensor gu = check_gate_up(gate_up_in);
  TORCH_CHECK(gu.dim() == 2, "silu_mul_quant: gate_up must be [T, 2I], got ", gu.sizes());
  const int64_t I = gu.size(1) / 2;
  auto [q, scale, quant] = quant_out(gu.narrow(1, 0, I));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, gu.scalar_type(), "silu_mul_quant", [&] {
    silu_mul_rows<scalar_t>(gu.data_ptr<scalar_t>(), nullptr, gu.size(0), I, quant);
  });
  return {q, scale};
}

// x[t, h] = round(round(x * cos[t]) + round(rotate_half(x) * sin[t])), in place (GPT-NeoX halves).
template <typename T>
void rotary_rows(T* x, const T* cos, const T* sin, int64_t rows, int64_t heads, int64_t D, int64_t row_stride,
                 int64_t head_stride) {
  const int64_t half = D / 2;
  at::parallel_for(0, rows, grain(heads * D), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const T* c = cos + t * D;
      const T* s = sin + t * D;
      for (int64_t h = 0; h < heads; ++h) {
        T* v = x + t * row_stride + h * head_stride;
        int64_t i = 0;
        if constexpr (kVectorised<T>) {  // the loop below, kLanes of i at a time
          for (; i + kLanes <= half; i += kLanes) {
            const vf lo = load16(v + i), hi = load16(v + i + half);
            store16(v + i, round_vec<T>(lo * load16(c + i)) + round_vec<T>(-hi * load16(s + i)));
            store16(v + i + half, round_vec<T>(hi * load16(c + i + half)) + round_vec<T>(lo * load16(s + i + half)));
          }
        }
        for (; i < half; ++i) {
          const float lo = f32(v[i]), hi = f32(v[i + half]);
          v[i] = static_cast<T>(round_to<T>(lo * f32(c[i])) + round_to<T>(-hi * f32(s[i])));
          v[i + half] = static_cast<T>(round_to<T>(hi * f32(c[i + half])) + round_to<T>(lo * f32(s[i + half])));
        }
      }
    }
  });
}

void rotary_(at::Tensor x, const at::Tensor& cos_in, const at::Tensor& sin_in) {
  TORCH_CHECK(x.device().is_cpu(), "rotary_ runs on CPU tensors");
  TORCH_CHECK(x.dim() == 3 && x.stride(2) == 1 && x.size(2) % 2 == 0,
              "rotary_: x must be [T, H, D] with contiguous, even D; got ", x.sizes(), " strides ", x.strides());
  const at::Tensor cos = cos_in.to(x.scalar_type()).contiguous(), sin = sin_in.to(x.scalar_type()).contiguous();
  TORCH_CHECK(cos.dim() == 2 && cos.size(0) == x.size(0) && cos.size(1) == x.size(2) && sin.sizes() == cos.sizes(),
              "rotary_: cos and sin must be [T, D]");
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "rotary_", [&] {
    rotary_rows<scalar_t>(x.data_ptr<scalar_t>(), cos.data_ptr<scalar_t>(), sin.data_ptr<scalar_t>(), x.size(0),
                          x.size(1), x.size(2), x.stride(0), x.stride(1));
  });
}

// buffer[slots[t]] = x[t] for one layer's K and V, x [T, H, D] with D contiguous: one parallel pass of
// row copies. index_copy_ (what KVPool.write calls otherwise) ran at 1.5-3 GB/s here: 30 us for a
// 24-token decode step's K alone, 170-300 us for a 450-token extend's, twice a layer.
template <typename T, typename Slot>
void store_rows(T* buffer, const T* x, const Slot* slots, int64_t rows, int64_t heads, int64_t D, int64_t row_stride,
                int64_t head_stride) {
  const int64_t slot_elems = heads * D;
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / (slot_elems * static_cast<int64_t>(sizeof(T))));
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      T* dst = buffer + static_cast<int64_t>(slots[t]) * slot_elems;
      const T* src = x + t * row_stride;
      if (head_stride == D) {
        std::memcpy(dst, src, slot_elems * sizeof(T));
      } else {
        for (int64_t h = 0; h < heads; ++h) std::memcpy(dst + h * D, src + h * head_stride, D * sizeof(T));
      }
    }
  });
}

template <typename Slot>
void store_kv_slots(at::Tensor& k_buffer, at::Tensor& v_buffer, const Slot* s, int64_t T, const at::Tensor& k,
                    const at::Tensor& v) {
  const auto [lo, hi] = std::minmax_element(s, s + T);
  TORCH_CHECK(*lo >= 0 && *hi < k_buffer.size(0), "store_kv: slot ", *lo < 0 ? *lo : *hi, " is outside the pool of ",
              k_buffer.size(0), " slots");
  const int64_t H = k_buffer.size(1), D = k_buffer.size(2);  // store_kv checked k and v against these
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, k_buffer.scalar_type(), "store_kv", [&] {
    store_rows<scalar_t>(k_buffer.data_ptr<scalar_t>(), k.data_ptr<scalar_t>(), s, T, H, D, k.stride(0), k.stride(1));
    store_rows<scalar_t>(v_buffer.data_ptr<scalar_t>(), v.data_ptr<scalar_t>(), s, T, H, D, v.stride(0), v.stride(1));
  });
}

void store_kv(at::Tensor k_buffer, at::Tensor v_buffer, const at::Tensor& slots_in, const at::Tensor& k,
              const at::Tensor& v) {
  TORCH_CHECK(k_buffer.device().is_cpu() && v_buffer.device().is_cpu(), "store_kv runs on CPU tensors");
  TORCH_CHECK(k_buffer.dim() == 3 && k_buffer.is_contiguous() && v_buffer.sizes() == k_buffer.sizes() &&
                  v_buffer.is_contiguous(),
              "store_kv: buffers must be contiguous [slots, H, D] of one shape");
  // the engine's slots are int32 (out_cache_loc): read as they are, no widened copy
  const at::Tensor slots = slots_in.scalar_type() == at::kInt ? slots_in.contiguous() : slots_in.to(at::kLong).contiguous();
  const int64_t T = slots.numel(), H = k_buffer.size(1), D = k_buffer.size(2);
  TORCH_CHECK(v_buffer.scalar_type() == k_buffer.scalar_type(), "store_kv: K, V and the buffers must share one dtype");
  for (const at::Tensor* x : {&k, &v}) {
    TORCH_CHECK(x->dim() == 3 && x->size(0) == T && x->size(1) == H && x->size(2) == D && x->stride(2) == 1,
                "store_kv: K and V must be [", T, ", ", H, ", ", D, "] with contiguous rows, got ", x->sizes(),
                " strides ", x->strides());
    TORCH_CHECK(x->scalar_type() == k_buffer.scalar_type(), "store_kv: K, V and the buffers must share one dtype");
  }
  if (T == 0) return;
  if (slots.scalar_type() == at::kInt) {
    store_kv_slots<int32_t>(k_buffer, v_buffer, slots.data_ptr<int32_t>(), T, k, v);
  } else {
    store_kv_slots<int64_t>(k_buffer, v_buffer, slots.data_ptr<int64_t>(), T, k, v);
  }
}

}  // namespace

TORCH_LIBRARY(vlserve_fused, m) {
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.def("add_rms_norm(Tensor x, Tensor a, Tensor weight, float eps) -> (Tensor, Tensor)");
  m.def("rms_norm_quant(Tensor x, Tensor weight, float eps) -> (Tensor, Tensor)");
  m.def("add_rms_norm_quant(Tensor x, Tensor a, Tensor weight, float eps) -> (Tensor, Tensor, Tensor)");
  m.def("silu_mul(Tensor gate_up) -> Tensor");
  m.def("silu_mul_quant(Tensor gate_up) -> (Tensor, Tensor)");
  m.def("rotary_(Tensor(a!) x, Tensor cos, Tensor sin) -> ()");
  m.def("store_kv(Tensor(a!) k_buffer, Tensor(b!) v_buffer, Tensor slots, Tensor k, Tensor v) -> ()");
}

TORCH_LIBRARY_IMPL(vlserve_fused, CPU, m) {
  m.impl("rms_norm", &rms_norm);
  m.impl("add_rms_norm", &add_rms_norm);
  m.impl("rms_norm_quant", &rms_norm_quant);
  m.impl("add_rms_norm_quant", &add_rms_norm_quant);
  m.impl("silu_mul", &silu_mul);
  m.impl("silu_mul_quant", &silu_mul_quant);
  m.impl("rotary_", &rotary_);
  m.impl("store_kv", &store_kv);
}
