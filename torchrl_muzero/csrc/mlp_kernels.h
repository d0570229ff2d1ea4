// The vector kernels of the fused searches' network steps (mlp_net.cpp,
// stochastic_net.cpp): a linear layer over k-major weights and the
// categorical-support decode, templated on the vector width. Internal header:
// include it from a .cpp only, after mlp_net.h.
//
// Why an anonymous namespace in a header: each translation unit instantiates
// these templates inside its own baseline and target("avx2") entry points
// (always_inline), so every TU must keep its own copies; a shared inline
// definition could be merged by the linker into one compiled for the wrong
// target. The arithmetic (and so the float32 contract of mlp_net.h) is the
// same in every TU.
//
// The opt-in FMA path (template flag F, mcts.kernel_precision="fma"): the
// same loops with every multiply-add of a linear layer, of the decode's exp
// polynomial and of its expectation sum fused (one rounding instead of two),
// instantiated only inside target("avx2,fma") entry points. The loops are
// written once: each of those multiply-adds is a madd<F> call, the only place
// where the two paths differ (so they cannot drift apart). Its results are
// still independent of the batch size (every row runs the same fused ops in
// the same k order) but not bit-identical to the exact path's: within a few
// ulps per layer (test/test_fma_kernels.py measures it).
#pragma once

#include "mlp_net.h"

#include <cstring>

#ifdef MZ_HAVE_MLP_SEARCH

#if defined(__x86_64__) || defined(__i386__)
#define MZ_X86_AVX2_PATH 1
#endif
#define MZ_INLINE inline __attribute__((always_inline))

namespace tree_ops {
namespace {

typedef float v4f __attribute__((vector_size(16)));
typedef int32_t v4i __attribute__((vector_size(16)));
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));

// The kernels are templates over the vector type: 4 floats for the baseline
// build (SSE2 / NEON registers), 8 for the AVX2 instantiation. Every result
// is the same for both (checked by test_fused_search.py): a linear layer's
// outputs are independent lanes, and the decode's sums are split into 8
// partial sums whatever the width.
template <class V>
struct Lanes;
template <>
struct Lanes<v4f> {
  using I = v4i;
  static constexpr int W = 4;
};
template <>
struct Lanes<v8f> {
  using I = v8i;
  static constexpr int W = 8;
};

template <class V>
MZ_INLINE V vload(const float* p) {
  V v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
template <class V>
MZ_INLINE void vstore(float* p, V v) {
  std::memcpy(p, &v, sizeof(v));
}
template <class V>
MZ_INLINE V vsplat(float x) {
  return x - V{};  // x - 0 == x for every x, -0 included
}
// The first `count` (0 .. W) floats of p, the other lanes `fill`.
template <class V>
MZ_INLINE V vload_partial(const float* p, int64_t count, float fill) {
  V v = vsplat<V>(fill);
  for (int64_t i = 0; i < count; ++i) v[i] = p[i];
  return v;
}
template <class V>
MZ_INLINE V vmax(V a, V b) {
  return a > b ? a : b;
}
template <class V>
MZ_INLINE V vmin(V a, V b) {
  return a < b ? a : b;
}

// a * b + c, lane by lane: rounded twice (the product, then the sum) on the
// exact path, once with F. The exact path relies on -ffp-contract=off (setup.py
// and the pragma of tree_common.h) to keep the compiler from fusing it. With F,
// __builtin_fmaf is a fused multiply-add whatever the compiler emits for it
// (GCC turns the unrolled lanes into one vfmadd inside a target("fma")
// function), so the FMA path's results do not depend on the vectoriser;
// madd<true> is instantiated only inside such functions.
template <bool F, class V>
MZ_INLINE V madd(V a, V b, V c) {
  if constexpr (F) {
    V r;
#pragma GCC unroll 8
    for (int l = 0; l < Lanes<V>::W; ++l) r[l] = __builtin_fmaf(a[l], b[l], c[l]);
    return r;
  } else {
    return a * b + c;
  }
}
// The same with a scalar b, for every lane: the exact path multiplies by the
// scalar itself (GCC broadcasts it once with vbroadcastss; a vsplat here made
// it build each broadcast lane by lane in the AVX2 copy).
template <bool F, class V>
MZ_INLINE V madd(V a, float b, V c) {
  if constexpr (F) {
    return madd<F>(a, vsplat<V>(b), c);
  } else {
    return a * b + c;
  }
}

// exp(x) for x in [-87, 88], as Cephes' expf:
// x = n ln2 + r with n = round(x / ln2) and |r| <= ln2 / 2, exp(r) from its
// polynomial, times 2^n built in the exponent bits. Rounding uses the
// 1.5 * 2^23 shifter (the float sum's last bits are n + 127), which needs no
// float-int conversion or floor. Exactly 1 at 0. (The LSTM's sigmoid / tanh
// of ez_net.cpp call it on clamped inputs of both signs.)
// The range reduction x - n * c is written kf * -c + x: the same rounded
// result (x - y is x + -y in IEEE arithmetic, and -(n * c) == n * -c), in the
// operand order of a fused multiply-add.
template <class V, bool F = false>
MZ_INLINE V exp_in_range(V x) {
  using I = typename Lanes<V>::I;
  const float shifter = 12582912.0f + 127.0f;  // 1.5 * 2^23, plus the exponent bias
  V kf = madd<F>(x, vsplat<V>(1.44269504088896341f), vsplat<V>(shifter));
  const I biased_n = (I)kf;  // a vector cast reinterprets the bits
  kf = kf - shifter;         // n, as a float
  x = madd<F>(kf, vsplat<V>(-0.693359375f), x);
  x = madd<F>(kf, vsplat<V>(2.12194440e-4f), x);
  const V z = x * x;
  V y = vsplat<V>(1.9875691500e-4f);
  y = madd<F>(y, x, vsplat<V>(1.3981999507e-3f));
  y = madd<F>(y, x, vsplat<V>(8.3334519073e-3f));
  y = madd<F>(y, x, vsplat<V>(4.1665795894e-2f));
  y = madd<F>(y, x, vsplat<V>(1.6666665459e-1f));
  y = madd<F>(y, x, vsplat<V>(5.0000001201e-1f));
  y = madd<F>(y, z, x) + 1.0f;
  return y * (V)((biased_n & 0xff) << 23);  // 2^n
}

// exp(x) for x <= 0 (a logit minus its row maximum). Inputs below -87
// (exp(-inf) included) are clamped there: exp(-87) ~ 1.6e-38 vanishes next to
// the row maximum's 1.
template <class V, bool F = false>
MZ_INLINE V exp_nonpos(V x) {
  return exp_in_range<V, F>(vmax(x, vsplat<V>(-87.0f)));
}

// E[bin] under softmax(z[0:n]): sum(e_i * bin_i) / sum(e_i), each sum kept
// as 8 partial sums (element i goes to partial i mod 8) added up in a fixed
// tree at the end. With F, exp and the e_i * bin_i sum use fused multiply-adds.
template <class V, bool F = false>
MZ_INLINE float bin_expectation(const float* z, const float* bins, int64_t n) {
  constexpr int W = Lanes<V>::W, R = 8 / W;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const int64_t full = n & ~int64_t{7};
  V m = vsplat<V>(neg_inf);
  for (int64_t i = 0; i < n; i += W)
    m = vmax(m, i + W <= n ? vload<V>(z + i)
                           : vload_partial<V>(z + i, n - i, neg_inf));
  float mx = m[0];
  for (int l = 1; l < W; ++l) mx = m[l] > mx ? m[l] : mx;
  V s0[R], s1[R];
  for (int r = 0; r < R; ++r) s0[r] = s1[r] = vsplat<V>(0.0f);
  for (int64_t i = 0; i < full; i += 8) {
    for (int r = 0; r < R; ++r) {
      const V e = exp_nonpos<V, F>(vload<V>(z + i + r * W) - mx);
      s0[r] += e;
      s1[r] = madd<F>(e, vload<V>(bins + i + r * W), s1[r]);
    }
  }
  if (full < n) {  // every partial sum takes one more term, padding included
    for (int r = 0; r < R; ++r) {
      const int64_t at = full + r * W;
      const int64_t count = std::max<int64_t>(0, std::min<int64_t>(W, n - at));
      const V e = exp_nonpos<V, F>(vload_partial<V>(z + at, count, neg_inf) - mx);
      s0[r] += e;
      s1[r] = madd<F>(e, vload_partial<V>(bins + at, count, 0.0f), s1[r]);
    }
  }
  float p0[8], p1[8];
  for (int l = 0; l < 8; ++l) {
    p0[l] = s0[l / W][l % W];
    p1[l] = s1[l / W][l % W];
  }
  const float sum0 = ((p0[0] + p0[1]) + (p0[2] + p0[3])) + ((p0[4] + p0[5]) + (p0[6] + p0[7]));
  const float sum1 = ((p1[0] + p1[1]) + (p1[2] + p1[3])) + ((p1[4] + p1[5]) + (p1[6] + p1[7]));
  return sum1 / sum0;
}

// The NS x (W * NV) output tile (rows x[s], outputs j0 ..): accumulate over
// k, then + bias, + extra[s] (the action column), ReLU. With F each step of
// the k loop is one fused multiply-add per output.
template <class V, int NS, int NV, bool F = false>
MZ_INLINE void dense_tile(const Dense& d, const float* const* x, int64_t j0,
                          const float* const* extra, bool relu,
                          float* const* y) {
  constexpr int W = Lanes<V>::W;
  V acc[NS][NV];
  for (int s = 0; s < NS; ++s)
    for (int v = 0; v < NV; ++v) acc[s][v] = vsplat<V>(0.0f);
  const float* w = d.wt.data() + j0;
  for (int64_t k = 0; k < d.K; ++k, w += d.J) {
    V wv[NV];
    for (int v = 0; v < NV; ++v) wv[v] = vload<V>(w + W * v);
    // Unrolled explicitly: with madd<true>'s lane loop inside, GCC's own
    // complete unrolling gives up and the accumulators go to the stack (~3x
    // slower).
#pragma GCC unroll 8
    for (int s = 0; s < NS; ++s) {
      const float xs = x[s][k];
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[s][v] = madd<F>(wv[v], xs, acc[s][v]);
    }
  }
  for (int s = 0; s < NS; ++s) {
    for (int v = 0; v < NV; ++v) {
      const int64_t j = j0 + W * v;
      V out = acc[s][v] + vload<V>(d.bias.data() + j);
      if (extra != nullptr) out += vload<V>(extra[s] + j);
      if (relu) out = out > 0.0f ? out : vsplat<V>(0.0f);
      vstore(y[s] + j, out);
    }
  }
}

// Fewer than 4 rows: wide tiles, so that 8-9 independent accumulators hide
// the addition (or FMA) latency.
template <class V, int NS, bool F>
MZ_INLINE void dense_few(const Dense& d, const float* const* x,
                         const float* const* extra, bool relu,
                         float* const* y) {
  constexpr int W = Lanes<V>::W;
  constexpr int NV = NS == 1 ? 8 : (NS == 2 ? 4 : 3);
  int64_t j0 = 0;
  for (; j0 + W * NV <= d.J; j0 += W * NV)
    dense_tile<V, NS, NV, F>(d, x, j0, extra, relu, y);
  for (; j0 < d.J; j0 += W) dense_tile<V, NS, 1, F>(d, x, j0, extra, relu, y);
}

// y[s] = layer(x[s]) for n rows. With 4+ rows: column panels of 2 vectors in
// the outer loop (a panel's weights, K x 64 bytes at most, stay in L1 while
// every row block uses them), 4-row blocks inside: 8 accumulators, 2 weight
// loads and 4 broadcasts per k. (4 x 3 tiles were no faster: the loop is
// bound by the multiply and add ports.) The FMA path keeps 4 x 2: 8
// accumulators cover FMA's 4-cycle latency on 2 ports, and 4 x 3, 3 x 4 and
// 6 x 2 were no faster on the canonical layers (docs/performance_search.md,
// "The opt-in FMA network path").
template <class V, bool F = false>
MZ_INLINE void dense(const Dense& d, int64_t n, const float* const* x,
                     const float* const* extra, bool relu, float* const* y) {
  constexpr int W = Lanes<V>::W;
  if (n < 4) {
    if (n == 3) dense_few<V, 3, F>(d, x, extra, relu, y);
    if (n == 2) dense_few<V, 2, F>(d, x, extra, relu, y);
    if (n == 1) dense_few<V, 1, F>(d, x, extra, relu, y);
    return;
  }
  for (int64_t j0 = 0; j0 < d.J; j0 += 2 * W) {
    int64_t s = 0;
    for (; s + 4 <= n; s += 4)
      dense_tile<V, 4, 2, F>(d, x + s, j0, extra ? extra + s : nullptr, relu, y + s);
    const float* const* ex = extra ? extra + s : nullptr;
    switch (n - s) {
      case 3: dense_tile<V, 3, 2, F>(d, x + s, j0, ex, relu, y + s); break;
      case 2: dense_tile<V, 2, 2, F>(d, x + s, j0, ex, relu, y + s); break;
      case 1: dense_tile<V, 1, 2, F>(d, x + s, j0, ex, relu, y + s); break;
      default: break;
    }
  }
}

// scale_latent (model.py): out = (r - min r) / max(max r - min r, 1e-5)
// over the L floats of r, in the torch op order.
MZ_INLINE void scale_latent_row(const float* r, int64_t L, float* out) {
  float lo = r[0], hi = r[0];
  for (int64_t i = 1; i < L; ++i) {
    lo = std::min(lo, r[i]);
    hi = std::max(hi, r[i]);
  }
  const float range = std::max(hi - lo, 1e-5f);
  for (int64_t i = 0; i < L; ++i) out[i] = (r[i] - lo) / range;
}

// Weight packing (shared by the networks' pack functions).
inline void check_weight(const at::Tensor& t, const char* name,
                         at::IntArrayRef shape, const char* fn = "mlp_search") {
  TORCH_CHECK(t.defined() && t.device().is_cpu() &&
                  t.scalar_type() == at::kFloat && t.is_contiguous(),
              fn, ": `", name,
              "` must be a contiguous float32 CPU tensor, got ", t.scalar_type(),
              " on ", t.device());
  TORCH_CHECK(t.sizes() == shape, fn, ": `", name, "` must have shape ",
              shape, ", got ", t.sizes());
}

// Copy rows [row0, row0 + J) x columns [col0, col0 + K) of the [out, in]
// matrix w (row stride ld) into d.wt (k-major) at output offset j_off.
inline void pack_block(Dense& d, const float* w, int64_t ld, int64_t row0,
                       int64_t col0, int64_t J, int64_t K, const float* bias,
                       int64_t j_off) {
  for (int64_t j = 0; j < J; ++j) {
    const float* src = w + (row0 + j) * ld + col0;
    for (int64_t k = 0; k < K; ++k) d.wt[k * d.J + j_off + j] = src[k];
  }
  for (int64_t j = 0; j < J; ++j) d.bias[j_off + j] = bias[row0 + j];
}

inline void init_dense(Dense& d, int64_t K, int64_t J) {
  d.K = K;
  d.J = round_up16(J);
  d.wt.assign(static_cast<size_t>(K * d.J), 0.0f);
  d.bias.assign(static_cast<size_t>(d.J), 0.0f);
}

inline bool cpu_has_avx2() {
#ifdef MZ_X86_AVX2_PATH
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
#else
  return false;
#endif
}

// Whether the FMA copies can run here (x86 with AVX2 and FMA).
inline bool cpu_has_avx2_fma() {
#ifdef MZ_X86_AVX2_PATH
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
#else
  return false;
#endif
}

}  // namespace
}  // namespace tree_ops

#endif  // MZ_HAVE_MLP_SEARCH
