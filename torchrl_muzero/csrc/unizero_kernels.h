// The vector kernels of the fused UniZero step (erf, GELU, LayerNorm, softmax, dense rows, a fixed-order
// dot product), on mlp_kernels.h: included by unizero_net.cpp only (one translation unit), kept apart so
// that each file reads as one concept (the kernels here, the transformer pass and the heads there).
#pragma once

#include <cstring>
#include <type_traits>

#include "mlp_kernels.h"
#include "unizero_net.h"

#ifdef MZ_HAVE_MLP_SEARCH

namespace tree_ops {
namespace {

// erf(x) as the rational approximation of Eigen / XLA's float erf (x clamped
// to [-4, 4], where erf is +-1 in float): within ~5e-7 of erf.
template <class V>
MZ_INLINE V verf(V x) {
  x = vmin(vmax(x, vsplat<V>(-4.0f)), vsplat<V>(4.0f));
  const V x2 = x * x;
  V p = vsplat<V>(-2.72614225801306e-10f);
  p = p * x2 + 2.77068142495902e-08f;
  p = p * x2 - 2.10102402082508e-06f;
  p = p * x2 - 5.69250639462346e-05f;
  p = p * x2 - 7.34990630326855e-04f;
  p = p * x2 - 2.95459980854025e-03f;
  p = p * x2 - 1.60960333262415e-02f;
  p = p * x;
  V q = vsplat<V>(-1.45660718464996e-05f);
  q = q * x2 - 2.13374055278905e-04f;
  q = q * x2 - 1.68282697438203e-03f;
  q = q * x2 - 7.37332916720468e-03f;
  q = q * x2 - 1.42647390514189e-02f;
  return p / q;
}

// nn.GELU() (exact): x * 0.5 * (1 + erf(x / sqrt(2))), in place over m rows
// of `cols` (a multiple of 16) floats.
template <class V>
MZ_INLINE void gelu_rows(float* y, int64_t m, int64_t stride, int64_t cols) {
  constexpr int W = Lanes<V>::W;
  for (int64_t r = 0; r < m; ++r)
    for (int64_t j = 0; j < cols; j += W) {
      const V x = vload<V>(y + r * stride + j);
      vstore(y + r * stride + j, x * 0.5f * (1.0f + verf(x * 0.70710678118654752f)));
    }
}

// nn.LayerNorm over E features: biased variance, two passes.
MZ_INLINE void layer_norm(const float* x, int64_t E, const float* w,
                          const float* b, float eps, float* y) {
  float sum = 0.0f;
  for (int64_t i = 0; i < E; ++i) sum += x[i];
  const float mean = sum / static_cast<float>(E);
  float sq = 0.0f;
  for (int64_t i = 0; i < E; ++i) sq += (x[i] - mean) * (x[i] - mean);
  const float rstd = 1.0f / std::sqrt(sq / static_cast<float>(E) + eps);
  for (int64_t i = 0; i < E; ++i) y[i] = (x[i] - mean) * rstd * w[i] + b[i];
}

MZ_INLINE void softmax_into(const float* z, int64_t n, float* out) {
  float mx = z[0];
  for (int64_t i = 1; i < n; ++i) mx = std::max(mx, z[i]);
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += (out[i] = std::exp(z[i] - mx));
  for (int64_t i = 0; i < n; ++i) out[i] /= sum;
}

// y rows = layer(x rows), both contiguous with the given strides.
template <class V, bool F>
MZ_INLINE void dense_rows(const Dense& d, UzScratch& sc, int64_t m,
                          const float* x, int64_t xs, float* y, int64_t ys) {
  static thread_local std::vector<const float*> pin;
  static thread_local std::vector<float*> pout;
  pin.resize(m);
  pout.resize(m);
  for (int64_t r = 0; r < m; ++r) {
    pin[r] = x + r * xs;
    pout[r] = y + r * ys;
  }
  dense<V, F>(d, m, pin.data(), nullptr, false, pout.data());
}

// a . b over n (a multiple of 8) floats as 8 partial sums (element i to
// partial i mod 8) added in a fixed tree: the same for every vector width.
template <class V>
MZ_INLINE float dot(const float* a, const float* b, int64_t n) {
  constexpr int W = Lanes<V>::W, R = 8 / W;
  V acc[R];
  for (int r = 0; r < R; ++r) acc[r] = vsplat<V>(0.0f);
  for (int64_t i = 0; i < n; i += 8)
    for (int r = 0; r < R; ++r) acc[r] += vload<V>(a + i + r * W) * vload<V>(b + i + r * W);
  float p[8];
  for (int l = 0; l < 8; ++l) p[l] = acc[l / W][l % W];
  return ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
}

}  // namespace
}  // namespace tree_ops

#endif  // MZ_HAVE_MLP_SEARCH
