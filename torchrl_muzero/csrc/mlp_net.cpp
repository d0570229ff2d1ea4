// The fused MLP search's network step (declared in mlp_net.h; the contract
// is described there). Vector kernels over GCC/Clang vector extensions.
#include "mlp_kernels.h"

#ifdef MZ_HAVE_MLP_SEARCH

namespace tree_ops {
namespace {

// The search step for n <= kGroup rows: parent latents in[s] (L floats),
// actions act[s]; writes the scaled next latent to out[s] (L floats), the
// decoded reward and value and the policy logits [n, A]. F: the FMA path
// (mlp_kernels.h).
template <class V, bool F>
MZ_INLINE void mlp_step_impl(const MlpNet& net, MlpScratch& sc, int64_t n,
                             const float* const* in, const int64_t* act,
                             float* const* out, float* reward, float* value,
                             float* logits, const float* const* action_input) {
  const int64_t L = net.L, A = net.A;
  const float* row_in[kGroup];
  float* row_out[kGroup];
  const float* extra[kGroup];

  // Dynamics: relu((W1_latent x + b1) + W1[:, L + a]), then W2 . + b2.
  for (int64_t s = 0; s < n; ++s) {
    extra[s] = action_input != nullptr ? action_input[s]
                                       : net.action_rows.data() + act[s] * net.dyn1.J;
    row_out[s] = sc.hidden.data() + s * net.dyn1.J;
  }
  dense<V, F>(net.dyn1, n, in, extra, /*relu=*/true, row_out);
  for (int64_t s = 0; s < n; ++s) {
    row_in[s] = sc.hidden.data() + s * net.dyn1.J;
    row_out[s] = sc.raw.data() + s * net.dyn2.J;
  }
  dense<V, F>(net.dyn2, n, row_in, nullptr, false, row_out);
  // scale_latent: (x - min) / clamp_min(max - min, 1e-5), per row.
  for (int64_t s = 0; s < n; ++s)
    scale_latent_row(sc.raw.data() + s * net.dyn2.J, L, out[s]);
  // Heads: both hidden layers at once, then the two output layers.
  for (int64_t s = 0; s < n; ++s) {
    row_in[s] = out[s];
    row_out[s] = sc.trunks.data() + s * net.trunks.J;
  }
  dense<V, F>(net.trunks, n, row_in, nullptr, true, row_out);
  for (int64_t s = 0; s < n; ++s) {
    row_in[s] = sc.trunks.data() + s * net.trunks.J;
    row_out[s] = sc.reward_logits.data() + s * net.reward_out.J;
  }
  dense<V, F>(net.reward_out, n, row_in, nullptr, false, row_out);
  const int64_t hq_off = round_up16(net.Hr);
  for (int64_t s = 0; s < n; ++s) {
    row_in[s] = sc.trunks.data() + s * net.trunks.J + hq_off;
    row_out[s] = sc.pred_logits.data() + s * net.pred_out.J;
  }
  dense<V, F>(net.pred_out, n, row_in, nullptr, false, row_out);

  for (int64_t s = 0; s < n; ++s) {
    const float* rl = sc.reward_logits.data() + s * net.reward_out.J;
    const float* pl = sc.pred_logits.data() + s * net.pred_out.J;
    reward[s] = net.reward_h(bin_expectation<V, F>(rl, net.reward_bins.data(), net.R));
    value[s] = net.value_h(bin_expectation<V, F>(pl + A, net.value_bins.data(), net.V));
    std::copy_n(pl, A, logits + s * A);
  }
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
                       double reward_eps, double value_eps, int64_t action_inputs) {
  TORCH_CHECK(weights.size() == 14, "mlp_search: expected 14 weight tensors "
              "(12 parameters and the two bin vectors), got ", weights.size());
  thread_local MlpNet net;
  TORCH_CHECK(weights[0].dim() == 2 && weights[6].dim() == 2 &&
                  weights[10].dim() == 2 && weights[4].dim() == 2 &&
                  weights[8].dim() == 2,
              "mlp_search: weight matrices must be 2-d");
  const int64_t Hd = weights[0].size(0), Hr = weights[4].size(0),
                Hq = weights[8].size(0), R = weights[6].size(0);
  const int64_t Ain = action_inputs > 0 ? action_inputs : A;
  const int64_t L = weights[0].size(1) - Ain;
  TORCH_CHECK(L >= 1, "mlp_search: dynamics layer has ", weights[0].size(1),
              " inputs, fewer than the ", Ain, " action inputs plus a latent");
  const int64_t V = weights[10].size(0) - A;
  TORCH_CHECK(V >= 1, "mlp_search: prediction head has too few outputs");
  check_weight(weights[0], "dynamics.0.weight", {Hd, L + Ain});
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
  net.Hd = Hd; net.Hr = Hr; net.Hq = Hq; net.action_inputs = Ain;
  const float* w1 = weights[0].data_ptr<float>();
  const float* b1 = weights[1].data_ptr<float>();

  init_dense(net.dyn1, L, Hd);
  pack_block(net.dyn1, w1, L + Ain, 0, 0, Hd, L, b1, 0);
  net.action_rows.assign(static_cast<size_t>(Ain * net.dyn1.J), 0.0f);
  for (int64_t j = 0; j < Hd; ++j)
    for (int64_t a = 0; a < Ain; ++a)
      net.action_rows[a * net.dyn1.J + j] = w1[j * (L + Ain) + L + a];

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
      float *logits, const float *const *action_input
#define MZ_STEP_ARGS net, sc, n, in, act, out, reward, value, logits, action_input

namespace {

void mlp_step_baseline(MZ_STEP_PARAMS) { mlp_step_impl<v4f, false>(MZ_STEP_ARGS); }

#ifdef MZ_X86_AVX2_PATH
// The same templates compiled for AVX2 (inlined into this function, so they
// take its target); chosen at run time when the CPU has AVX2.
__attribute__((target("avx2"))) void mlp_step_avx2(MZ_STEP_PARAMS) {
  mlp_step_impl<v8f, false>(MZ_STEP_ARGS);
}

// The opt-in FMA copy: fused multiply-adds in the layers and the decode
// (fp-contract stays off, so nothing else is fused).
__attribute__((target("avx2,fma"))) void mlp_step_fma(MZ_STEP_PARAMS) {
  mlp_step_impl<v8f, true>(MZ_STEP_ARGS);
}
#endif

}  // namespace

// The search step for n <= kGroup rows (see mlp_step_impl); `baseline`
// forces the 4-wide build (the test hook compares the two), `fma` the FMA
// copy where the CPU runs it.
void mlp_step(const MlpNet& net, MlpScratch& sc, int64_t n, const float* const* in,
              const int64_t* act, float* const* out, float* reward, float* value, float* logits,
              bool baseline, bool fma, const float* const* action_input) {
#ifdef MZ_X86_AVX2_PATH
  if (fma && cpu_has_avx2_fma()) return mlp_step_fma(MZ_STEP_ARGS);
  if (!baseline && cpu_has_avx2()) return mlp_step_avx2(MZ_STEP_ARGS);
#endif
  mlp_step_baseline(MZ_STEP_ARGS);
}
#undef MZ_STEP_PARAMS
#undef MZ_STEP_ARGS

bool kernel_has_fma() { return cpu_has_avx2_fma(); }

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
