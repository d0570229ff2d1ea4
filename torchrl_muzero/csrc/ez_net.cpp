// The fused EfficientZero search's network step (declared in ez_net.h; the
// contract is described there): the MLP layers of mlp_kernels.h plus the
// LSTM cell, LayerNorm and value-prefix bookkeeping.
#include "ez_net.h"

#include "mlp_kernels.h"

#ifdef MZ_HAVE_MLP_SEARCH

namespace tree_ops {
namespace {


// 1 / (1 + exp(-x)), ATen's formula; exp's input clamped to [-87, 88]
// (beyond that the sigmoid is 0 or 1 to within 1e-38).
template <class V>
MZ_INLINE V vsigmoid(V x) {
  const V e = exp_in_range(vmin(vmax(-x, vsplat<V>(-87.0f)), vsplat<V>(88.0f)));
  return 1.0f / (1.0f + e);
}

// Cephes' tanhf: the odd polynomial below |x| = 0.625 (where 1 - 2 / (e + 1)
// would cancel), 1 - 2 / (exp(2|x|) + 1) with the sign of x above.
template <class V>
MZ_INLINE V vtanh(V x) {
  const V ax = x < 0.0f ? -x : x;
  const V e = exp_in_range(vmin(ax + ax, vsplat<V>(88.0f)));
  V big = 1.0f - 2.0f / (e + 1.0f);
  big = x < 0.0f ? -big : big;
  const V z = x * x;
  V p = vsplat<V>(-5.70498872745e-3f);
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  const V small = p * z * x + x;
  return ax > 0.625f ? big : small;
}

// Sum of x[0:n] as 8 partial sums (element i to partial i mod 8, n a
// multiple of 8) added in a fixed tree: the same for every vector width.
template <class V>
MZ_INLINE float sum8(const float* x, int64_t n) {
  constexpr int W = Lanes<V>::W, R = 8 / W;
  V s[R];
  for (int r = 0; r < R; ++r) s[r] = vsplat<V>(0.0f);
  for (int64_t i = 0; i < n; i += 8)
    for (int r = 0; r < R; ++r) s[r] += vload<V>(x + i + r * W);
  float p[8];
  for (int l = 0; l < 8; ++l) p[l] = s[l / W][l % W];
  return ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
}

template <class V, bool F>
MZ_INLINE void ez_step_impl(const EzNet& net, EzScratch& sc, int64_t n,
                            EzRows& rows, float* logits) {
  constexpr int W = Lanes<V>::W;
  const int64_t L = net.L, A = net.A, K = net.K, KP = round_up16(K);
  const float* row_in[kGroup];
  float* row_out[kGroup];
  const float* extra[kGroup];

  // Dynamics, as mlp_net.cpp: relu((W1_latent x + b1) + W1[:, L + a]), W2 . + b2.
  for (int64_t s = 0; s < n; ++s) {
    extra[s] = rows.action_input[s] != nullptr ? rows.action_input[s]
                                               : net.action_rows.data() + rows.action[s] * net.dyn1.J;
    row_out[s] = sc.hidden.data() + s * net.dyn1.J;
  }
  dense<V, F>(net.dyn1, n, rows.latent, extra, /*relu=*/true, row_out);
  for (int64_t s = 0; s < n; ++s) {
    row_in[s] = sc.hidden.data() + s * net.dyn1.J;
    row_out[s] = sc.raw.data() + s * net.dyn2.J;
  }
  dense<V, F>(net.dyn2, n, row_in, nullptr, false, row_out);
  for (int64_t s = 0; s < n; ++s) {  // scale_latent
    const float* r = sc.raw.data() + s * net.dyn2.J;
    float lo = r[0], hi = r[0];
    for (int64_t i = 1; i < L; ++i) {
      lo = std::min(lo, r[i]);
      hi = std::max(hi, r[i]);
    }
    const float range = std::max(hi - lo, 1e-5f);
    for (int64_t i = 0; i < L; ++i) rows.next_latent[s][i] = (r[i] - lo) / range;
  }

  // LSTM gates: W_ih next + b_ih and W_hh h + b_hh, each gate's K outputs
  // at offset gate * KP of a row.
  for (int64_t s = 0; s < n; ++s) {
    row_in[s] = rows.next_latent[s];
    row_out[s] = sc.gates_ih.data() + s * net.lstm_ih.J;
  }
  dense<V, F>(net.lstm_ih, n, row_in, nullptr, false, row_out);
  for (int64_t s = 0; s < n; ++s) row_out[s] = sc.gates_hh.data() + s * net.lstm_hh.J;
  dense<V, F>(net.lstm_hh, n, rows.h, nullptr, false, row_out);
  // Prediction trunk on the next latent.
  for (int64_t s = 0; s < n; ++s) {
    row_in[s] = rows.next_latent[s];
    row_out[s] = sc.trunk.data() + s * net.pred1.J;
  }
  dense<V, F>(net.pred1, n, row_in, nullptr, true, row_out);

  // The cell, then relu(LayerNorm(h')) into `normed` (KP floats a row, the
  // padding zero: the next layer's K inputs are the first K).
  for (int64_t s = 0; s < n; ++s) {
    const float* gi = sc.gates_ih.data() + s * net.lstm_ih.J;
    const float* gh = sc.gates_hh.data() + s * net.lstm_hh.J;
    float* hn = rows.next_h[s];
    float* cn = rows.next_c[s];
    const float* cp = rows.c[s];
    float* hv = sc.normed.data() + s * KP;  // h' first, normalised below
    for (int64_t k = 0; k < KP; k += W) {
      const int64_t count = std::min<int64_t>(W, K - k);
      const V ig = vsigmoid(vload<V>(gh + k) + vload<V>(gi + k));
      const V fg = vsigmoid(vload<V>(gh + KP + k) + vload<V>(gi + KP + k));
      const V gg = vtanh(vload<V>(gh + 2 * KP + k) + vload<V>(gi + 2 * KP + k));
      const V og = vsigmoid(vload<V>(gh + 3 * KP + k) + vload<V>(gi + 3 * KP + k));
      const V c = fg * vload_partial<V>(cp + k, count, 0.0f) + ig * gg;
      const V h = og * vtanh(c);
      for (int64_t i = 0; i < count; ++i) {
        cn[k + i] = c[i];
        hn[k + i] = h[i];
      }
      vstore(hv + k, h);
    }
    for (int64_t k = K; k < KP; ++k) hv[k] = 0.0f;  // padded lanes out of the sums
    const float mean = sum8<V>(hv, KP) / static_cast<float>(K);
    float* dev = sc.vp_hidden.data() + s * net.vp1.J;  // (x - mean)^2, scratch
    for (int64_t k = 0; k < KP; ++k) {
      const float d = k < K ? hv[k] - mean : 0.0f;
      dev[k] = d * d;
    }
    const float var = sum8<V>(dev, KP) / static_cast<float>(K);
    const float rstd = 1.0f / std::sqrt(var + net.ln_eps);
    for (int64_t k = 0; k < K; ++k) {
      const float y = ((hv[k] - mean) * rstd) * net.ln_gamma[k] + net.ln_beta[k];
      hv[k] = y > 0.0f ? y : 0.0f;
    }
  }
  for (int64_t s = 0; s < n; ++s) {
    row_in[s] = sc.normed.data() + s * KP;
    row_out[s] = sc.vp_hidden.data() + s * net.vp1.J;
  }
  dense<V, F>(net.vp1, n, row_in, nullptr, true, row_out);
  for (int64_t s = 0; s < n; ++s) {
    row_in[s] = sc.vp_hidden.data() + s * net.vp1.J;
    row_out[s] = sc.prefix_logits.data() + s * net.vp2.J;
  }
  dense<V, F>(net.vp2, n, row_in, nullptr, false, row_out);
  for (int64_t s = 0; s < n; ++s) {
    row_in[s] = sc.trunk.data() + s * net.pred1.J;
    row_out[s] = sc.pred_logits.data() + s * net.pred_out.J;
  }
  dense<V, F>(net.pred_out, n, row_in, nullptr, false, row_out);

  for (int64_t s = 0; s < n; ++s) {
    const float* zl = sc.prefix_logits.data() + s * net.vp2.J;
    const float* pl = sc.pred_logits.data() + s * net.pred_out.J;
    const float prefix = net.reward_h(bin_expectation<V, F>(zl, net.reward_bins.data(), net.R));
    rows.value[s] = net.value_h(bin_expectation<V, F>(pl + A, net.value_bins.data(), net.V));
    rows.reward[s] = prefix - rows.parent_prefix[s];
    const int64_t steps = rows.parent_steps[s] + 1;
    const bool reset = steps >= net.horizon;
    rows.prefix[s] = reset ? 0.0f : prefix;
    rows.steps[s] = reset ? 0 : steps;
    if (reset) {
      std::fill_n(rows.next_h[s], K, 0.0f);
      std::fill_n(rows.next_c[s], K, 0.0f);
    }
    std::copy_n(pl, A, logits + s * A);
  }
}

// The four gates of an LSTM weight [4K, in] (torch order i, f, g, o) into
// one Dense whose gate q occupies outputs [q * KP, q * KP + K).
void pack_gates(Dense& d, const at::Tensor& w, const at::Tensor& b, int64_t K,
                int64_t in) {
  const int64_t KP = round_up16(K);
  init_dense(d, in, 4 * KP);
  for (int64_t q = 0; q < 4; ++q)
    pack_block(d, w.data_ptr<float>(), in, q * K, 0, K, in, b.data_ptr<float>(),
               q * KP);
}

}  // namespace

// weights, in this order: dynamics (W1 [Hd, L + A], b1, W2 [L, Hd], b2),
// LSTM cell (W_ih [4K, L], W_hh [4K, K], b_ih [4K], b_hh [4K]), LayerNorm
// (gamma [K], beta [K]), value-prefix MLP (Wv1 [Hv, K], bv1, Wv2 [R, Hv],
// bv2), prediction (Wp1 [Hq, L], bp1, Wp2 [A + V, Hq], bp2), reward_bins [R],
// value_bins [V].
const EzNet& pack_ez(const std::vector<at::Tensor>& weights, int64_t A,
                     double reward_eps, double value_eps, double ln_eps,
                     int64_t horizon, int64_t action_inputs) {
  const char* who = "ez_search";
  TORCH_CHECK(weights.size() == 20, who, ": expected 20 weight tensors, got ",
              weights.size());
  TORCH_CHECK(horizon >= 1, who, ": lstm_horizon_len must be >= 1, got ", horizon);
  for (int i : {0, 2, 4, 5, 10, 12, 14, 16})
    TORCH_CHECK(weights[i].dim() == 2, who, ": weight matrix ", i, " must be 2-d");
  thread_local EzNet net;
  const int64_t Hd = weights[0].size(0), K = weights[5].size(1),
                Hv = weights[10].size(0), R = weights[12].size(0),
                Hq = weights[14].size(0);
  const int64_t Ain = action_inputs > 0 ? action_inputs : A;
  const int64_t L = weights[0].size(1) - Ain, V = weights[16].size(0) - A;
  TORCH_CHECK(L >= 1 && V >= 1, who, ": layer sizes do not fit ", A, " actions");
  check_weight(weights[0], "dynamics.0.weight", {Hd, L + Ain}, who);
  check_weight(weights[1], "dynamics.0.bias", {Hd}, who);
  check_weight(weights[2], "dynamics.2.weight", {L, Hd}, who);
  check_weight(weights[3], "dynamics.2.bias", {L}, who);
  check_weight(weights[4], "lstm.weight_ih", {4 * K, L}, who);
  check_weight(weights[5], "lstm.weight_hh", {4 * K, K}, who);
  check_weight(weights[6], "lstm.bias_ih", {4 * K}, who);
  check_weight(weights[7], "lstm.bias_hh", {4 * K}, who);
  check_weight(weights[8], "layer_norm.weight", {K}, who);
  check_weight(weights[9], "layer_norm.bias", {K}, who);
  check_weight(weights[10], "value_prefix.2.weight", {Hv, K}, who);
  check_weight(weights[11], "value_prefix.2.bias", {Hv}, who);
  check_weight(weights[12], "value_prefix.4.weight", {R, Hv}, who);
  check_weight(weights[13], "value_prefix.4.bias", {R}, who);
  check_weight(weights[14], "prediction.0.weight", {Hq, L}, who);
  check_weight(weights[15], "prediction.0.bias", {Hq}, who);
  check_weight(weights[16], "prediction_head.weight", {A + V, Hq}, who);
  check_weight(weights[17], "prediction_head.bias", {A + V}, who);
  check_weight(weights[18], "reward_bins", {R}, who);
  check_weight(weights[19], "value_bins", {V}, who);
  net.L = L; net.A = A; net.K = K; net.R = R; net.V = V;
  net.Hd = Hd; net.Hv = Hv; net.Hq = Hq; net.horizon = horizon; net.action_inputs = Ain;

  const float* w1 = weights[0].data_ptr<float>();
  init_dense(net.dyn1, L, Hd);
  pack_block(net.dyn1, w1, L + Ain, 0, 0, Hd, L, weights[1].data_ptr<float>(), 0);
  net.action_rows.assign(static_cast<size_t>(Ain * net.dyn1.J), 0.0f);
  for (int64_t j = 0; j < Hd; ++j)
    for (int64_t a = 0; a < Ain; ++a)
      net.action_rows[a * net.dyn1.J + j] = w1[j * (L + Ain) + L + a];
  init_dense(net.dyn2, Hd, L);
  pack_block(net.dyn2, weights[2].data_ptr<float>(), Hd, 0, 0, L, Hd,
             weights[3].data_ptr<float>(), 0);
  pack_gates(net.lstm_ih, weights[4], weights[6], K, L);
  pack_gates(net.lstm_hh, weights[5], weights[7], K, K);
  net.ln_gamma.assign(weights[8].data_ptr<float>(), weights[8].data_ptr<float>() + K);
  net.ln_beta.assign(weights[9].data_ptr<float>(), weights[9].data_ptr<float>() + K);
  init_dense(net.vp1, K, Hv);
  pack_block(net.vp1, weights[10].data_ptr<float>(), K, 0, 0, Hv, K,
             weights[11].data_ptr<float>(), 0);
  init_dense(net.vp2, Hv, R);
  pack_block(net.vp2, weights[12].data_ptr<float>(), Hv, 0, 0, R, Hv,
             weights[13].data_ptr<float>(), 0);
  init_dense(net.pred1, L, Hq);
  pack_block(net.pred1, weights[14].data_ptr<float>(), L, 0, 0, Hq, L,
             weights[15].data_ptr<float>(), 0);
  init_dense(net.pred_out, Hq, A + V);
  pack_block(net.pred_out, weights[16].data_ptr<float>(), Hq, 0, 0, A + V, Hq,
             weights[17].data_ptr<float>(), 0);
  net.reward_bins.assign(weights[18].data_ptr<float>(), weights[18].data_ptr<float>() + R);
  net.value_bins.assign(weights[19].data_ptr<float>(), weights[19].data_ptr<float>() + V);
  net.ln_eps = static_cast<float>(ln_eps);
  net.reward_h = InverseH(reward_eps);
  net.value_h = InverseH(value_eps);
  return net;
}

EzScratch& thread_ez_scratch(const EzNet& net) {
  thread_local EzScratch sc;
  const int64_t KP = round_up16(net.K);
  sc.hidden.resize(kGroup * net.dyn1.J);
  sc.raw.resize(kGroup * net.dyn2.J);
  sc.gates_ih.resize(kGroup * net.lstm_ih.J);
  sc.gates_hh.resize(kGroup * net.lstm_hh.J);
  sc.normed.resize(kGroup * KP);
  sc.vp_hidden.resize(kGroup * std::max(net.vp1.J, KP));
  sc.prefix_logits.resize(kGroup * net.vp2.J);
  sc.trunk.resize(kGroup * net.pred1.J);
  sc.pred_logits.resize(kGroup * net.pred_out.J);
  return sc;
}

namespace {

void ez_step_baseline(const EzNet& net, EzScratch& sc, int64_t n, EzRows& rows,
                      float* logits) {
  ez_step_impl<v4f, false>(net, sc, n, rows, logits);
}

#ifdef MZ_X86_AVX2_PATH
__attribute__((target("avx2"))) void ez_step_avx2(const EzNet& net,
                                                  EzScratch& sc, int64_t n,
                                                  EzRows& rows, float* logits) {
  ez_step_impl<v8f, false>(net, sc, n, rows, logits);
}

// The opt-in FMA copy (see mlp_net.cpp): the layers and the decodes fused;
// the LSTM's sigmoid / tanh and the LayerNorm stay the exact path's.
__attribute__((target("avx2,fma"))) void ez_step_fma(const EzNet& net,
                                                     EzScratch& sc, int64_t n,
                                                     EzRows& rows, float* logits) {
  ez_step_impl<v8f, true>(net, sc, n, rows, logits);
}
#endif

}  // namespace

void ez_step(const EzNet& net, EzScratch& sc, int64_t n, EzRows& rows,
             float* logits, bool baseline, bool fma) {
#ifdef MZ_X86_AVX2_PATH
  if (fma && cpu_has_avx2_fma()) return ez_step_fma(net, sc, n, rows, logits);
  static const bool has_avx2 = cpu_has_avx2();
  if (!baseline && has_avx2) return ez_step_avx2(net, sc, n, rows, logits);
#endif
  ez_step_baseline(net, sc, n, rows, logits);
}

}  // namespace tree_ops

#endif  // MZ_HAVE_MLP_SEARCH
