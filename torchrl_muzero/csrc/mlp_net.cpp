// The fused MLP search's network step (declared in mlp_net.h; the contract
// is described there). Vector kernels over GCC/Clang vector extensions.
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

// exp(x) for x <= 0 (a logit minus its row maximum), as Cephes' expf:
// x = n ln2 + r with n = round(x / ln2) and |r| <= ln2 / 2, exp(r) from its
// polynomial, times 2^n built in the exponent bits. Rounding uses the
// 1.5 * 2^23 shifter (the float sum's last bits are n + 127), which needs no
// float-int conversion or floor. Inputs below -87 (exp(-inf) included) are
// clamped there: exp(-87) ~ 1.6e-38 vanishes next to the row maximum's 1.
// Exactly 1 at 0.
template <class V>
MZ_INLINE V exp_nonpos(V x) {
  using I = typename Lanes<V>::I;
  x = vmax(x, vsplat<V>(-87.0f));
  const float shifter = 12582912.0f + 127.0f;  // 1.5 * 2^23, plus the exponent bias
  V kf = x * 1.44269504088896341f + shifter;
  const I biased_n = (I)kf;  // a vector cast reinterprets the bits
  kf = kf - shifter;         // n, as a float
  x = x - kf * 0.693359375f;
  x = x - kf * -2.12194440e-4f;
  const V z = x * x;
  V y = vsplat<V>(1.9875691500e-4f);
  y = y * x + 1.3981999507e-3f;
  y = y * x + 8.3334519073e-3f;
  y = y * x + 4.1665795894e-2f;
  y = y * x + 1.6666665459e-1f;
  y = y * x + 5.0000001201e-1f;
  y = y * z + x + 1.0f;
  return y * (V)((biased_n & 0xff) << 23);  // 2^n
}

// E[bin] under softmax(z[0:n]): sum(e_i * bin_i) / sum(e_i), each sum kept
// as 8 partial sums (element i goes to partial i mod 8) added up in a fixed
// tree at the end.
template <class V>
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
      const V e = exp_nonpos(vload<V>(z + i + r * W) - mx);
      s0[r] += e;
      s1[r] += e * vload<V>(bins + i + r * W);
    }
  }
  if (full < n) {  // every partial sum takes one more term, padding included
    for (int r = 0; r < R; ++r) {
      const int64_t at = full + r * W;
      const int64_t count = std::max<int64_t>(0, std::min<int64_t>(W, n - at));
      const V e = exp_nonpos(vload_partial<V>(z + at, count, neg_inf) - mx);
      s0[r] += e;
      s1[r] += e * vload_partial<V>(bins + at, count, 0.0f);
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
// k, then + bias, + extra[s] (the action column), ReLU.
template <class V, int NS, int NV>
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
    for (int s = 0; s < NS; ++s) {
      const float xs = x[s][k];
      for (int v = 0; v < NV; ++v) acc[s][v] += wv[v] * xs;
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
// the addition latency.
template <class V, int NS>
MZ_INLINE void dense_few(const Dense& d, const float* const* x,
                         const float* const* extra, bool relu,
                         float* const* y) {
  constexpr int W = Lanes<V>::W;
  constexpr int NV = NS == 1 ? 8 : (NS == 2 ? 4 : 3);
  int64_t j0 = 0;
  for (; j0 + W * NV <= d.J; j0 += W * NV)
    dense_tile<V, NS, NV>(d, x, j0, extra, relu, y);
  for (; j0 < d.J; j0 += W) dense_tile<V, NS, 1>(d, x, j0, extra, relu, y);
}

// y[s] = layer(x[s]) for n rows. With 4+ rows: column panels of 2 vectors in
// the outer loop (a panel's weights, K x 64 bytes at most, stay in L1 while
// every row block uses them), 4-row blocks inside: 8 accumulators, 2 weight
// loads and 4 broadcasts per k. (4 x 3 tiles measured no faster: the loop is
// bound by the multiply and add ports.)
template <class V>
MZ_INLINE void dense(const Dense& d, int64_t n, const float* const* x,
                     const float* const* extra, bool relu, float* const* y) {
  constexpr int W = Lanes<V>::W;
  if (n < 4) {
    if (n == 3) dense_few<V, 3>(d, x, extra, relu, y);
    if (n == 2) dense_few<V, 2>(d, x, extra, relu, y);
    if (n == 1) dense_few<V, 1>(d, x, extra, relu, y);
    return;
  }
  for (int64_t j0 = 0; j0 < d.J; j0 += 2 * W) {
    int64_t s = 0;
    for (; s + 4 <= n; s += 4)
      dense_tile<V, 4, 2>(d, x + s, j0, extra ? extra + s : nullptr, relu, y + s);
    const float* const* ex = extra ? extra + s : nullptr;
    switch (n - s) {
      case 3: dense_tile<V, 3, 2>(d, x + s, j0, ex, relu, y + s); break;
      case 2: dense_tile<V, 2, 2>(d, x + s, j0, ex, relu, y + s); break;
      case 1: dense_tile<V, 1, 2>(d, x + s, j0, ex, relu, y + s); break;
      default: break;
    }
  }
}

// The search step for n <= kGroup rows: parent latents in[s] (L floats),
// actions act[s]; writes the scaled next latent to out[s] (L floats), the
// decoded reward and value, the prior [n, A] and, when `logits` is not null,
// the policy logits [n, A].
template <class V>
MZ_INLINE void mlp_step_impl(const MlpNet& net, MlpScratch& sc, int64_t n,
                             const float* const* in, const int64_t* act,
                             float* const* out, float* reward, float* value,
                             float* prior, float* logits) {
  const int64_t L = net.L, A = net.A;
  const float* row_in[kGroup];
  float* row_out[kGroup];
  const float* extra[kGroup];

  // Dynamics: relu((W1_latent x + b1) + W1[:, L + a]), then W2 . + b2.
  for (int64_t s = 0; s < n; ++s) {
    extra[s] = net.action_rows.data() + act[s] * net.dyn1.J;
    row_out[s] = sc.hidden.data() + s * net.dyn1.J;
  }
  dense<V>(net.dyn1, n, in, extra, /*relu=*/true, row_out);
  for (int64_t s = 0; s < n; ++s) {
    row_in[s] = sc.hidden.data() + s * net.dyn1.J;
    row_out[s] = sc.raw.data() + s * net.dyn2.J;
  }
  dense<V>(net.dyn2, n, row_in, nullptr, false, row_out);
  // scale_latent: (x - min) / clamp_min(max - min, 1e-5), per row.
  for (int64_t s = 0; s < n; ++s) {
    const float* r = sc.raw.data() + s * net.dyn2.J;
    float lo = r[0], hi = r[0];
    for (int64_t i = 1; i < L; ++i) {
      lo = std::min(lo, r[i]);
      hi = std::max(hi, r[i]);
    }
    const float range = std::max(hi - lo, 1e-5f);
    for (int64_t i = 0; i < L; ++i) out[s][i] = (r[i] - lo) / range;
  }
  // Heads: both hidden layers at once, then the two output layers.
  for (int64_t s = 0; s < n; ++s) {
    row_in[s] = out[s];
    row_out[s] = sc.trunks.data() + s * net.trunks.J;
  }
  dense<V>(net.trunks, n, row_in, nullptr, true, row_out);
  for (int64_t s = 0; s < n; ++s) {
    row_in[s] = sc.trunks.data() + s * net.trunks.J;
    row_out[s] = sc.reward_logits.data() + s * net.reward_out.J;
  }
  dense<V>(net.reward_out, n, row_in, nullptr, false, row_out);
  const int64_t hq_off = round_up16(net.Hr);
  for (int64_t s = 0; s < n; ++s) {
    row_in[s] = sc.trunks.data() + s * net.trunks.J + hq_off;
    row_out[s] = sc.pred_logits.data() + s * net.pred_out.J;
  }
  dense<V>(net.pred_out, n, row_in, nullptr, false, row_out);

  for (int64_t s = 0; s < n; ++s) {
    const float* rl = sc.reward_logits.data() + s * net.reward_out.J;
    const float* pl = sc.pred_logits.data() + s * net.pred_out.J;
    reward[s] = net.reward_h(bin_expectation<V>(rl, net.reward_bins.data(), net.R));
    value[s] = net.value_h(bin_expectation<V>(pl + A, net.value_bins.data(), net.V));
    // prior = softmax(policy logits); A is small, so plain libm exp.
    float mx = pl[0];
    for (int64_t a = 1; a < A; ++a) mx = std::max(mx, pl[a]);
    float* p = prior + s * A;
    float total = 0.0f;
    for (int64_t a = 0; a < A; ++a) {
      p[a] = std::exp(pl[a] - mx);
      total += p[a];
    }
    for (int64_t a = 0; a < A; ++a) p[a] /= total;
    if (logits != nullptr) std::copy_n(pl, A, logits + s * A);
  }
}

void check_weight(const at::Tensor& t, const char* name, at::IntArrayRef shape) {
  TORCH_CHECK(t.defined() && t.device().is_cpu() &&
                  t.scalar_type() == at::kFloat && t.is_contiguous(),
              "mlp_search: `", name,
              "` must be a contiguous float32 CPU tensor, got ", t.scalar_type(),
              " on ", t.device());
  TORCH_CHECK(t.sizes() == shape, "mlp_search: `", name, "` must have shape ",
              shape, ", got ", t.sizes());
}

// Copy rows [row0, row0 + J) x columns [col0, col0 + K) of the [out, in]
// matrix w (row stride ld) into d.wt (k-major) at output offset j_off.
void pack_block(Dense& d, const float* w, int64_t ld, int64_t row0,
                int64_t col0, int64_t J, int64_t K, const float* bias,
                int64_t j_off) {
  for (int64_t j = 0; j < J; ++j) {
    const float* src = w + (row0 + j) * ld + col0;
    for (int64_t k = 0; k < K; ++k) d.wt[k * d.J + j_off + j] = src[k];
  }
  for (int64_t j = 0; j < J; ++j) d.bias[j_off + j] = bias[row0 + j];
}

void init_dense(Dense& d, int64_t K, int64_t J) {
  d.K = K;
  d.J = round_up16(J);
  d.wt.assign(static_cast<size_t>(K * d.J), 0.0f);
  d.bias.assign(static_cast<size_t>(d.J), 0.0f);
}

}  // namespace

// weights: the 12 parameters of MuZeroMLPModel's search step in this order:
// dynamics (W1 [Hd, L + A], b1, W2 [L, Hd], b2), reward head (Wr1 [Hr, L],
// br1, Wr2 [R, Hr], br2), prediction (Wp1 [Hq, L], bp1, Wp2 [A + V, Hq],
// bp2), then reward_bins [R] and value_bins [V].
// Packs into a per-thread MlpNet reused across calls: its buffers keep their
// capacity, so a small search does not pay fresh allocations (page faults)
// for ~0.4 MB of weights every call.
const MlpNet& pack_mlp(const std::vector<at::Tensor>& weights, int64_t A,
                       double reward_eps, double value_eps) {
  TORCH_CHECK(weights.size() == 14, "mlp_search: expected 14 weight tensors "
              "(12 parameters and the two bin vectors), got ", weights.size());
  thread_local MlpNet net;
  TORCH_CHECK(weights[0].dim() == 2 && weights[6].dim() == 2 &&
                  weights[10].dim() == 2 && weights[4].dim() == 2 &&
                  weights[8].dim() == 2,
              "mlp_search: weight matrices must be 2-d");
  const int64_t Hd = weights[0].size(0), Hr = weights[4].size(0),
                Hq = weights[8].size(0), R = weights[6].size(0);
  const int64_t L = weights[0].size(1) - A;
  TORCH_CHECK(L >= 1, "mlp_search: dynamics layer has ", weights[0].size(1),
              " inputs, fewer than the ", A, " actions plus a latent");
  const int64_t V = weights[10].size(0) - A;
  TORCH_CHECK(V >= 1, "mlp_search: prediction head has too few outputs");
  check_weight(weights[0], "dynamics.0.weight", {Hd, L + A});
  check_weight(weights[1], "dynamics.0.bias", {Hd});
  check_weight(weights[2], "dynamics.2.weight", {L, Hd});
  check_weight(weights[3], "dynamics.2.bias", {L});
  check_weight(weights[4], "reward.0.weight", {Hr, L});
  check_weight(weights[5], "reward.0.bias", {Hr});
  check_weight(weights[6], "reward.2.weight", {R, Hr});
  check_weight(weights[7], "reward.2.bias", {R});
  check_weight(weights[8], "prediction.0.weight", {Hq, L});
  check_weight(weights[9], "prediction.0.bias", {Hq});
  check_weight(weights[10], "prediction_head.weight", {A + V, Hq});
  check_weight(weights[11], "prediction_head.bias", {A + V});
  check_weight(weights[12], "reward_bins", {R});
  check_weight(weights[13], "value_bins", {V});
  net.L = L; net.A = A; net.R = R; net.V = V;
  net.Hd = Hd; net.Hr = Hr; net.Hq = Hq;
  const float* w1 = weights[0].data_ptr<float>();
  const float* b1 = weights[1].data_ptr<float>();

  init_dense(net.dyn1, L, Hd);
  pack_block(net.dyn1, w1, L + A, 0, 0, Hd, L, b1, 0);
  net.action_rows.assign(static_cast<size_t>(A * net.dyn1.J), 0.0f);
  for (int64_t j = 0; j < Hd; ++j)
    for (int64_t a = 0; a < A; ++a)
      net.action_rows[a * net.dyn1.J + j] = w1[j * (L + A) + L + a];

  init_dense(net.dyn2, Hd, L);
  pack_block(net.dyn2, weights[2].data_ptr<float>(), Hd, 0, 0, L, Hd,
             weights[3].data_ptr<float>(), 0);
  // Both first layers of the heads read the new latent: one layer of
  // round_up16(Hr) + Hq outputs, reward hidden units first.
  const int64_t hq_off = round_up16(Hr);
  init_dense(net.trunks, L, hq_off + Hq);
  pack_block(net.trunks, weights[4].data_ptr<float>(), L, 0, 0, Hr, L,
             weights[5].data_ptr<float>(), 0);
  pack_block(net.trunks, weights[8].data_ptr<float>(), L, 0, 0, Hq, L,
             weights[9].data_ptr<float>(), hq_off);
  init_dense(net.reward_out, Hr, R);
  pack_block(net.reward_out, weights[6].data_ptr<float>(), Hr, 0, 0, R, Hr,
             weights[7].data_ptr<float>(), 0);
  init_dense(net.pred_out, Hq, A + V);
  pack_block(net.pred_out, weights[10].data_ptr<float>(), Hq, 0, 0, A + V, Hq,
             weights[11].data_ptr<float>(), 0);
  net.reward_bins.assign(weights[12].data_ptr<float>(),
                         weights[12].data_ptr<float>() + R);
  net.value_bins.assign(weights[13].data_ptr<float>(),
                        weights[13].data_ptr<float>() + V);
  net.reward_h = InverseH(reward_eps);
  net.value_h = InverseH(value_eps);
  return net;
}

MlpScratch& thread_scratch(const MlpNet& net) {
  thread_local MlpScratch sc;
  sc.hidden.resize(kGroup * net.dyn1.J);
  sc.raw.resize(kGroup * net.dyn2.J);
  sc.trunks.resize(kGroup * net.trunks.J);
  sc.reward_logits.resize(kGroup * net.reward_out.J);
  sc.pred_logits.resize(kGroup * net.pred_out.J);
  return sc;
}

#define MZ_STEP_PARAMS                                                      \
  const MlpNet &net, MlpScratch &sc, int64_t n, const float *const *in,      \
      const int64_t *act, float *const *out, float *reward, float *value,    \
      float *prior, float *logits
#define MZ_STEP_ARGS net, sc, n, in, act, out, reward, value, prior, logits

namespace {

void mlp_step_baseline(MZ_STEP_PARAMS) { mlp_step_impl<v4f>(MZ_STEP_ARGS); }

#ifdef MZ_X86_AVX2_PATH
// The same templates compiled for AVX2 (inlined into this function, so they
// take its target); chosen at run time when the CPU has AVX2.
__attribute__((target("avx2"))) void mlp_step_avx2(MZ_STEP_PARAMS) {
  mlp_step_impl<v8f>(MZ_STEP_ARGS);
}
#endif

bool cpu_has_avx2() {
#ifdef MZ_X86_AVX2_PATH
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
#else
  return false;
#endif
}

}  // namespace

// The search step for n <= kGroup rows (see mlp_step_impl); `baseline`
// forces the 4-wide build (the test hook compares the two).
void mlp_step(MZ_STEP_PARAMS, bool baseline) {
#ifdef MZ_X86_AVX2_PATH
  if (!baseline && cpu_has_avx2()) return mlp_step_avx2(MZ_STEP_ARGS);
#endif
  mlp_step_baseline(MZ_STEP_ARGS);
}
#undef MZ_STEP_PARAMS
#undef MZ_STEP_ARGS

void check_latent_and_actions(const MlpNet& net, const at::Tensor& latent,
                              const at::Tensor& action, int64_t B) {
  check_tensor(latent, "latent", at::kFloat, 2);
  check_shape(latent, "latent", {B, net.L});
  const int64_t* a = action.data_ptr<int64_t>();
  for (int64_t i = 0; i < action.numel(); ++i)
    TORCH_CHECK(a[i] >= 0 && a[i] < net.A, "mlp_search: action ", a[i],
                " out of range [0, ", net.A, ")");
}


}  // namespace tree_ops

#endif  // MZ_HAVE_MLP_SEARCH
