// The fused Stochastic MuZero search's network step (declared in
// stochastic_net.h; the contract is described there and in mlp_net.h).
#include "stochastic_net.h"

#include "mlp_kernels.h"

#ifdef MZ_HAVE_MLP_SEARCH

namespace tree_ops {
namespace {

// rows[i] -> ptr[i] = base + i * stride, for the next layer's input/output.
MZ_INLINE void rows_at(float* base, int64_t stride, int64_t n, float** ptr) {
  for (int64_t i = 0; i < n; ++i) ptr[i] = base + i * stride;
}

// One row's prior logits over the A + C slots: `z` (count floats) at slot
// `first`, -inf elsewhere (the prior, their softmax_prior, is exactly 0 there).
MZ_INLINE void write_logits(const float* z, int64_t first, int64_t count, int64_t S,
                            float* logits) {
  std::fill_n(logits, S, -std::numeric_limits<float>::infinity());
  std::copy_n(z, count, logits + first);
}

// Decision rows (idx[0..n)) -> chance nodes: afterstate dynamics, then the
// afterstate prediction (sigma, Q).
template <class V, bool F>
MZ_INLINE void afterstate_rows(const StochasticNet& net, StochasticScratch& sc,
                               int64_t n, const int64_t* idx,
                               const float* const* in, const int64_t* act,
                               float* const* out, float* reward, float* value,
                               float* discount, float* logits) {
  const int64_t L = net.L, A = net.A, C = net.C, S = A + C;
  const float* x[kGroup];
  const float* extra[kGroup];
  float* y[kGroup];
  for (int64_t i = 0; i < n; ++i) {
    const int64_t s = idx[i];
    const int64_t a = std::min<int64_t>(std::max<int64_t>(act[s], 0), A - 1);
    x[i] = in[s];
    extra[i] = net.action_rows.data() + a * net.as1.J;
  }
  rows_at(sc.hidden.data(), net.as1.J, n, y);
  dense<V, F>(net.as1, n, x, extra, /*relu=*/true, y);
  for (int64_t i = 0; i < n; ++i) x[i] = y[i];
  rows_at(sc.raw.data(), net.as2.J, n, y);
  dense<V, F>(net.as2, n, x, nullptr, false, y);
  for (int64_t i = 0; i < n; ++i) {
    scale_latent_row(y[i], L, out[idx[i]]);
    x[i] = out[idx[i]];
  }
  rows_at(sc.trunks.data(), net.as_trunk.J, n, y);
  dense<V, F>(net.as_trunk, n, x, nullptr, true, y);
  for (int64_t i = 0; i < n; ++i) x[i] = y[i];
  rows_at(sc.out_logits.data(), net.as_out.J, n, y);
  dense<V, F>(net.as_out, n, x, nullptr, false, y);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t s = idx[i];
    const float* z = y[i];  // [sigma (C) | Q logits (V)]
    value[s] = net.value_h(bin_expectation<V, F>(z + C, net.value_bins.data(), net.V));
    reward[s] = 0.0f;
    discount[s] = 1.0f;
    write_logits(z, A, C, S, logits + s * S);
  }
}

// Chance rows (idx[0..n)) -> decision nodes: dynamics with the code's
// column, then the reward head and the prediction.
template <class V, bool F>
MZ_INLINE void chance_rows(const StochasticNet& net, StochasticScratch& sc,
                           int64_t n, const int64_t* idx,
                           const float* const* in, const int64_t* act,
                           float gamma, float* const* out, float* reward,
                           float* value, float* discount, float* logits) {
  const int64_t L = net.L, A = net.A, C = net.C, S = A + C;
  const float* x[kGroup];
  const float* extra[kGroup];
  float* y[kGroup];
  for (int64_t i = 0; i < n; ++i) {
    const int64_t s = idx[i];
    const int64_t c = std::min<int64_t>(std::max<int64_t>(act[s] - A, 0), C - 1);
    x[i] = in[s];
    extra[i] = net.code_rows.data() + c * net.dyn1.J;
  }
  rows_at(sc.hidden.data(), net.dyn1.J, n, y);
  dense<V, F>(net.dyn1, n, x, extra, /*relu=*/true, y);
  for (int64_t i = 0; i < n; ++i) x[i] = y[i];
  rows_at(sc.raw.data(), net.dyn2.J, n, y);
  dense<V, F>(net.dyn2, n, x, nullptr, false, y);
  for (int64_t i = 0; i < n; ++i) {
    scale_latent_row(y[i], L, out[idx[i]]);
    x[i] = out[idx[i]];
  }
  rows_at(sc.trunks.data(), net.trunks.J, n, y);
  dense<V, F>(net.trunks, n, x, nullptr, true, y);
  float* trunk[kGroup];
  for (int64_t i = 0; i < n; ++i) {
    trunk[i] = y[i];
    x[i] = y[i];
  }
  rows_at(sc.reward_logits.data(), net.reward_out.J, n, y);
  dense<V, F>(net.reward_out, n, x, nullptr, false, y);
  for (int64_t i = 0; i < n; ++i) x[i] = trunk[i] + net.hq_off;
  float* pred[kGroup];
  rows_at(sc.out_logits.data(), net.pred_out.J, n, pred);
  dense<V, F>(net.pred_out, n, x, nullptr, false, pred);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t s = idx[i];
    const float* z = pred[i];  // [policy (A) | value logits (V)]
    reward[s] = net.reward_h(bin_expectation<V, F>(y[i], net.reward_bins.data(), net.R));
    value[s] = net.value_h(bin_expectation<V, F>(z + A, net.value_bins.data(), net.V));
    discount[s] = gamma;
    write_logits(z, 0, A, S, logits + s * S);
  }
}

// Both kinds of step for one group: the rows are split by their parent's
// kind (each row's arithmetic is independent of the others', so the split
// changes no result).
template <class V, bool F>
MZ_INLINE void stochastic_step_impl(const StochasticNet& net,
                                    StochasticScratch& sc, int64_t n,
                                    const float* const* in,
                                    const bool* is_chance, const int64_t* act,
                                    float gamma, float* const* out,
                                    float* reward, float* value,
                                    float* discount, float* logits) {
  int64_t dec[kGroup], cha[kGroup];
  int64_t nd = 0, nc = 0;
  for (int64_t s = 0; s < n; ++s) {
    if (is_chance[s]) cha[nc++] = s;
    else dec[nd++] = s;
  }
  if (nd > 0)
    afterstate_rows<V, F>(net, sc, nd, dec, in, act, out, reward, value,
                          discount, logits);
  if (nc > 0)
    chance_rows<V, F>(net, sc, nc, cha, in, act, gamma, out, reward, value,
                      discount, logits);
}

}  // namespace

// weights: the 24 tensors of StochasticMuZeroMLPModel.fused_search_weights(),
// in this order:
//   afterstate_net (Wa1 [Ha, L + A], ba1, Wa2 [L, Ha], ba2),
//   afterstate_trunk (Wt [Ht, L], bt), chance_head (Wc [C, Ht], bc),
//   afterstate_value_head (Wq [V, Ht], bq),
//   dynamics_net (Wd1 [Hd, L + C], bd1, Wd2 [L, Hd], bd2),
//   reward_head (Wr1 [Hr, L], br1, Wr2 [R, Hr], br2),
//   prediction_trunk (Wp1 [Hq, L], bp1), prediction_head (Wp2 [A + V, Hq], bp2),
//   reward_bins [R], value_bins [V].
const StochasticNet& pack_stochastic(const std::vector<at::Tensor>& weights,
                                     double reward_eps, double value_eps) {
  static const char* fn = "stochastic_search";
  TORCH_CHECK(weights.size() == 24, fn, ": expected 24 weight tensors (22 "
              "parameters and the two bin vectors), got ", weights.size());
  for (size_t i : {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20})
    TORCH_CHECK(weights[i].dim() == 2, fn, ": weight matrix ", i,
                " must be 2-d, got shape ", weights[i].sizes());
  thread_local StochasticNet net;
  const int64_t L = weights[2].size(0);
  const int64_t Ha = weights[0].size(0), Ht = weights[4].size(0),
                Hd = weights[10].size(0), Hr = weights[14].size(0),
                Hq = weights[18].size(0);
  const int64_t A = weights[0].size(1) - L, C = weights[6].size(0),
                V = weights[8].size(0), R = weights[16].size(0);
  TORCH_CHECK(A >= 1 && C >= 1, fn, ": need at least one action and one "
              "chance code (A=", A, ", C=", C, ")");
  check_weight(weights[0], "afterstate_net.0.weight", {Ha, L + A}, fn);
  check_weight(weights[1], "afterstate_net.0.bias", {Ha}, fn);
  check_weight(weights[2], "afterstate_net.2.weight", {L, Ha}, fn);
  check_weight(weights[3], "afterstate_net.2.bias", {L}, fn);
  check_weight(weights[4], "afterstate_trunk.0.weight", {Ht, L}, fn);
  check_weight(weights[5], "afterstate_trunk.0.bias", {Ht}, fn);
  check_weight(weights[6], "chance_head.weight", {C, Ht}, fn);
  check_weight(weights[7], "chance_head.bias", {C}, fn);
  check_weight(weights[8], "afterstate_value_head.weight", {V, Ht}, fn);
  check_weight(weights[9], "afterstate_value_head.bias", {V}, fn);
  check_weight(weights[10], "dynamics_net.0.weight", {Hd, L + C}, fn);
  check_weight(weights[11], "dynamics_net.0.bias", {Hd}, fn);
  check_weight(weights[12], "dynamics_net.2.weight", {L, Hd}, fn);
  check_weight(weights[13], "dynamics_net.2.bias", {L}, fn);
  check_weight(weights[14], "reward_head.0.weight", {Hr, L}, fn);
  check_weight(weights[15], "reward_head.0.bias", {Hr}, fn);
  check_weight(weights[16], "reward_head.2.weight", {R, Hr}, fn);
  check_weight(weights[17], "reward_head.2.bias", {R}, fn);
  check_weight(weights[18], "prediction_trunk.0.weight", {Hq, L}, fn);
  check_weight(weights[19], "prediction_trunk.0.bias", {Hq}, fn);
  check_weight(weights[20], "prediction_head.weight", {A + V, Hq}, fn);
  check_weight(weights[21], "prediction_head.bias", {A + V}, fn);
  check_weight(weights[22], "reward_bins", {R}, fn);
  check_weight(weights[23], "value_bins", {V}, fn);
  net.L = L; net.A = A; net.C = C; net.R = R; net.V = V;
  auto ptr = [&](size_t i) { return weights[i].data_ptr<float>(); };

  // First layers over [latent | one-hot]: the latent block as a layer, the
  // one-hot block as one row per action / code added before the ReLU.
  init_dense(net.as1, L, Ha);
  pack_block(net.as1, ptr(0), L + A, 0, 0, Ha, L, ptr(1), 0);
  net.action_rows.assign(static_cast<size_t>(A * net.as1.J), 0.0f);
  for (int64_t j = 0; j < Ha; ++j)
    for (int64_t a = 0; a < A; ++a)
      net.action_rows[a * net.as1.J + j] = ptr(0)[j * (L + A) + L + a];
  init_dense(net.as2, Ha, L);
  pack_block(net.as2, ptr(2), Ha, 0, 0, L, Ha, ptr(3), 0);
  init_dense(net.as_trunk, L, Ht);
  pack_block(net.as_trunk, ptr(4), L, 0, 0, Ht, L, ptr(5), 0);
  // sigma and the Q logits read the same trunk: one output layer.
  init_dense(net.as_out, Ht, C + V);
  pack_block(net.as_out, ptr(6), Ht, 0, 0, C, Ht, ptr(7), 0);
  pack_block(net.as_out, ptr(8), Ht, 0, 0, V, Ht, ptr(9), C);

  init_dense(net.dyn1, L, Hd);
  pack_block(net.dyn1, ptr(10), L + C, 0, 0, Hd, L, ptr(11), 0);
  net.code_rows.assign(static_cast<size_t>(C * net.dyn1.J), 0.0f);
  for (int64_t j = 0; j < Hd; ++j)
    for (int64_t c = 0; c < C; ++c)
      net.code_rows[c * net.dyn1.J + j] = ptr(10)[j * (L + C) + L + c];
  init_dense(net.dyn2, Hd, L);
  pack_block(net.dyn2, ptr(12), Hd, 0, 0, L, Hd, ptr(13), 0);
  // Both head trunks read the new state: one layer, reward units first.
  net.hq_off = round_up16(Hr);
  init_dense(net.trunks, L, net.hq_off + Hq);
  pack_block(net.trunks, ptr(14), L, 0, 0, Hr, L, ptr(15), 0);
  pack_block(net.trunks, ptr(18), L, 0, 0, Hq, L, ptr(19), net.hq_off);
  init_dense(net.reward_out, Hr, R);
  pack_block(net.reward_out, ptr(16), Hr, 0, 0, R, Hr, ptr(17), 0);
  init_dense(net.pred_out, Hq, A + V);
  pack_block(net.pred_out, ptr(20), Hq, 0, 0, A + V, Hq, ptr(21), 0);

  net.reward_bins.assign(ptr(22), ptr(22) + R);
  net.value_bins.assign(ptr(23), ptr(23) + V);
  net.reward_h = InverseH(reward_eps);
  net.value_h = InverseH(value_eps);
  return net;
}

StochasticScratch& stochastic_scratch(const StochasticNet& net) {
  thread_local StochasticScratch sc;
  sc.hidden.resize(kGroup * std::max(net.as1.J, net.dyn1.J));
  sc.raw.resize(kGroup * std::max(net.as2.J, net.dyn2.J));
  sc.trunks.resize(kGroup * std::max(net.as_trunk.J, net.trunks.J));
  sc.reward_logits.resize(kGroup * net.reward_out.J);
  sc.out_logits.resize(kGroup * std::max(net.as_out.J, net.pred_out.J));
  return sc;
}

#define MZ_STO_PARAMS                                                       \
  const StochasticNet &net, StochasticScratch &sc, int64_t n,               \
      const float *const *in, const bool *is_chance, const int64_t *act,    \
      float gamma, float *const *out, float *reward, float *value,          \
      float *discount, float *logits
#define MZ_STO_ARGS                                                         \
  net, sc, n, in, is_chance, act, gamma, out, reward, value, discount,      \
      logits

namespace {

void stochastic_step_baseline(MZ_STO_PARAMS) {
  stochastic_step_impl<v4f, false>(MZ_STO_ARGS);
}

#ifdef MZ_X86_AVX2_PATH
// The same templates compiled for AVX2 (see mlp_net.cpp).
__attribute__((target("avx2"))) void stochastic_step_avx2(MZ_STO_PARAMS) {
  stochastic_step_impl<v8f, false>(MZ_STO_ARGS);
}

// The opt-in FMA copy (see mlp_net.cpp).
__attribute__((target("avx2,fma"))) void stochastic_step_fma(MZ_STO_PARAMS) {
  stochastic_step_impl<v8f, true>(MZ_STO_ARGS);
}
#endif

}  // namespace

void stochastic_step(MZ_STO_PARAMS, bool baseline, bool fma) {
#ifdef MZ_X86_AVX2_PATH
  if (fma && cpu_has_avx2_fma()) return stochastic_step_fma(MZ_STO_ARGS);
  if (!baseline && cpu_has_avx2()) return stochastic_step_avx2(MZ_STO_ARGS);
#endif
  stochastic_step_baseline(MZ_STO_ARGS);
}
#undef MZ_STO_PARAMS
#undef MZ_STO_ARGS

}  // namespace tree_ops

#endif  // MZ_HAVE_MLP_SEARCH
