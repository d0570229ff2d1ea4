// The fused sampled search over a box action space (Sampled MuZero / Sampled
// EfficientZero, Hubert et al. 2021) for SampledModel(EfficientZeroMLPModel(
// ..., action_dim=D), BoxActionSpace): the value-prefix step of ez_net.h along
// a slot's float action, then the new node's K candidates drawn from its
// tanh-normal policy, as a Search of fused_loop.h's fused_search; the same
// for SampledModel(MuZeroMLPModel(..., action_dim=D)) on mlp_net.h's step.
// Also the EfficientZero step's test hook (sampled_ez_recurrent), bound in
// tree_ops.cpp.
// ---------------------------------------------------------------------------
// Why: the per-simulation torch path of a sampled search spends most of its
// time outside the network's matrix products: the step's ~50 aten calls, the
// TensorDict node states in and out of the tree and the K draws of every new
// node (docs/performance_sampled.md, the profile).
//
// Contract, against SampledModel.search_step (modules/sampled.py) and
// SampledProposal._draw_box (modules/sampled_proposal.py):
//   * the random numbers are the Python path's: that path calls
//     torch.randn([B, K, D], generator) once per simulation (every tree's new
//     node at once), and nothing else of the search draws between the root's
//     noise and the readout; this file makes the same N - 1 at::randn calls
//     on the same generator before the first simulation, so a search leaves
//     the generator where the Python loop leaves it, and node n of tree b
//     gets the draws eps[n - 1][b] the Python loop gives it;
//   * the network step is ez_net.h's (a few float32 ulps from torch's), with
//     the continuous action entering the dynamics' first layer as
//     W1[:, L:] a (summed over the D inputs in order), in place of the
//     one-hot column;
//   * the draws, in float32 and the Python expression order:
//       loc = params[d], scale = softplus(params[D + d]) + min_scale (learned;
//       softplus(x) = x above 20, else log1p(exp(x)), torch's threshold) or
//       sigma (fixed), times the temperature when it is not 1;
//       u = clamp(loc + scale * eps, -bound, bound);
//       a = low + ((tanh(u) + 1) / 2) * (high - low)
//     with libm's expf / log1pf / tanhf where torch uses Sleef: the candidates
//     agree with the torch path's to a few ulps, not bit for bit (the step's
//     outputs do not either);
//   * the slot logits are 0 (the uniform prior 1/K: the paper's
//     (beta_hat / beta) pi with beta = pi, or prior="uniform"); the proposals
//     that give other logits (prior="paper" at a temperature other than 1, a
//     widened mixture) never reach the kernel (SampledModel.fused_kernel_spec).
// test/test_sampled_fused.py compares the step and whole searches with the
// torch path.
// ---------------------------------------------------------------------------
#include <ATen/core/Generator.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/randn.h>

#include <cmath>
#include <optional>

#include "dispatch.h"
#include "entry_points.h"
#include "ez_net.h"
#include "fused_loop.h"
#include "mlp_net.h"

#ifdef MZ_HAVE_MLP_SEARCH

namespace tree_ops {
namespace {

// The box and the tanh-normal's scale settings (SampledModel.policy_distribution).
struct BoxDraw {
  const float* low;   // [D]
  const float* high;  // [D]
  int64_t D = 0, K = 0;
  float sigma = 0.0f;        // > 0: the fixed scale; else the learned one
  float min_scale = 1e-3f;   // TanhNormalPolicy.from_params's floor of the learned scale
  float temperature = 1.0f;  // beta's scale factor (1: beta is pi itself, no product)
  float bound = 0.0f;        // PRE_TANH_BOUND, the clamp of the pre-tanh draw
};

// F.softplus (beta 1, threshold 20).
inline float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

// A node's K candidates [K, D] from its policy head's 2D outputs `params` and
// its draws `eps` [K, D] (see the contract above).
void draw_candidates(const BoxDraw& box, const float* params, const float* eps, float* out) {
  const int64_t D = box.D;
  for (int64_t d = 0; d < D; ++d) {
    const float loc = params[d];
    float scale = box.sigma > 0.0f ? box.sigma : softplus(params[D + d]) + box.min_scale;
    if (box.temperature != 1.0f) scale = scale * box.temperature;
    const float width = box.high[d] - box.low[d];
    for (int64_t k = 0; k < box.K; ++k) {
      float u = loc + scale * eps[k * D + d];
      u = std::min(std::max(u, -box.bound), box.bound);
      out[k * D + d] = box.low[d] + ((std::tanh(u) + 1.0f) / 2.0f) * width;
    }
  }
}

// W1[:, L:] a for a continuous action a [D] into `out` (the dynamics' J
// padded hidden units), the inputs summed in order. Net: EzNet or MlpNet.
template <class Net>
void action_input(const Net& net, const float* a, float* out) {
  const int64_t J = net.dyn1.J;
  const float* rows = net.action_rows.data();
  for (int64_t j = 0; j < J; ++j) out[j] = a[0] * rows[j];
  for (int64_t d = 1; d < net.action_inputs; ++d)
    for (int64_t j = 0; j < J; ++j) out[j] = out[j] + a[d] * rows[d * J + j];
}

BoxDraw check_box(const at::Tensor& low, const at::Tensor& high, int64_t D, int64_t K,
                  double sigma, double min_scale, double temperature, double bound) {
  check_tensor(low, "low", at::kFloat, 1);
  check_shape(low, "low", {D});
  check_tensor(high, "high", at::kFloat, 1);
  check_shape(high, "high", {D});
  for (int64_t d = 0; d < D; ++d)
    TORCH_CHECK(std::isfinite(low.data_ptr<float>()[d]) && std::isfinite(high.data_ptr<float>()[d]) &&
                    high.data_ptr<float>()[d] > low.data_ptr<float>()[d],
                "sampled_ez_search: the box needs finite low < high, got [", low.data_ptr<float>()[d],
                ", ", high.data_ptr<float>()[d], "] in dimension ", d);
  TORCH_CHECK(temperature > 0.0 && std::isfinite(temperature),
              "sampled_ez_search: temperature must be > 0, got ", temperature);
  TORCH_CHECK(bound > 0.0 && std::isfinite(bound), "sampled_ez_search: bound must be > 0, got ", bound);
  BoxDraw box;
  box.low = low.data_ptr<float>();
  box.high = high.data_ptr<float>();
  box.D = D;
  box.K = K;
  box.sigma = static_cast<float>(sigma);
  box.min_scale = static_cast<float>(min_scale);
  box.temperature = static_cast<float>(temperature);
  box.bound = static_cast<float>(bound);
  return box;
}

// Whether the network of `weights` fits a box of D dims: its dynamics take
// D inputs after the latent and its policy head gives 2D numbers (a
// tanh-normal's location and scale) before the value bins. `first`,
// `second`, `head`, `bins`: the indices of the dynamics' two weights, the
// prediction head's weight and the value bins in `weights`.
void check_box_net(const char* who, const std::vector<at::Tensor>& weights, size_t count, int64_t D,
                   int first, int second, int head, int bins) {
  TORCH_CHECK(D >= 1, who, ": the box needs D >= 1 dims, got ", D);
  TORCH_CHECK(weights.size() == count, who, ": expected ", count, " weight tensors, got ", weights.size());
  for (int i : {first, second, head, bins})
    TORCH_CHECK(weights[i].dim() == (i == bins ? 1 : 2), who, ": weight ", i, " has ", weights[i].dim(),
                " dims");
  // L from dynamics.2.weight [L, Hd], V from the value bins
  const int64_t L = weights[second].size(0), V = weights[bins].size(0);
  TORCH_CHECK(weights[first].size(1) == L + D && weights[head].size(0) == 2 * D + V, who,
              ": the network does not fit a box of D = ", D, " dims: its dynamics take ",
              weights[first].size(1), " inputs (latent ", L, " + D) and its policy head gives ",
              weights[head].size(0) - V, " numbers (2D)");
}

const EzNet& pack_box_net(const std::vector<at::Tensor>& weights, int64_t D, double reward_eps,
                          double value_eps, double ln_eps, int64_t horizon) {
  check_box_net("sampled_ez_search", weights, 20, D, 0, 2, 16, 19);
  return pack_ez(weights, 2 * D, reward_eps, value_eps, ln_eps, horizon, D);
}

// The Python loop's draws, in its order: one randn [B, K, D] per simulation
// (`draws` keeps them alive, `eps` points at each), once the trees are known
// to be fresh.
void draw_noise(const FusedCall& call, int64_t D, std::optional<at::Generator> generator,
                const at::TensorOptions& opts, std::vector<at::Tensor>& draws,
                std::vector<const float*>& eps) {
  const TreeArrays& t = call.tree;
  check_fresh_trees(call);  // a rejected search draws nothing
  draws.reserve(static_cast<size_t>(std::max<int64_t>(t.N - 1, 0)));
  for (int64_t s = 0; s + 1 < t.N; ++s) {
    draws.push_back(at::randn({t.B, t.A, D}, generator, opts));
    eps.push_back(draws.back().data_ptr<float>());
  }
}

}  // namespace

// Test hook: SampledModel.search_step for a batch of states along float
// actions [B, D], with the draws `noise` [B, K, D] for the children. Returns
// (next_latent, lstm_h, lstm_c, value_prefix, steps, reward, policy_params
// [B, 2D], value, candidates [B, K, D]).
std::vector<at::Tensor> sampled_ez_recurrent(
    const std::vector<at::Tensor>& weights, int64_t D, double reward_eps, double value_eps,
    double ln_eps, int64_t horizon, const at::Tensor& latent, const at::Tensor& h,
    const at::Tensor& c, const at::Tensor& value_prefix, const at::Tensor& steps,
    const at::Tensor& action, const at::Tensor& noise, const at::Tensor& low,
    const at::Tensor& high, double sigma, double min_scale, double temperature, double bound,
    bool baseline, bool fma) {
  const EzNet& net = pack_box_net(weights, D, reward_eps, value_eps, ln_eps, horizon);
  check_tensor(action, "action", at::kFloat, 2);
  const int64_t B = action.size(0);
  check_shape(action, "action", {B, D});
  check_tensor(noise, "noise", at::kFloat, 3);
  const int64_t K = noise.size(1);
  check_shape(noise, "noise", {B, K, D});
  const BoxDraw box = check_box(low, high, D, K, sigma, min_scale, temperature, bound);
  const EzState in = check_ez_state(net, latent, h, c, value_prefix, steps, {B});
  const auto opts = latent.options();
  auto next = at::empty({B, net.L}, opts);
  auto nh = at::empty({B, net.K}, opts), nc = at::empty({B, net.K}, opts);
  auto prefix = at::empty({B}, opts), reward = at::empty({B}, opts), value = at::empty({B}, opts);
  auto nsteps = at::empty({B}, steps.options());
  auto params = at::empty({B, net.A}, opts), cand = at::empty({B, K, D}, opts);
  const float* act = action.data_ptr<float>();
  const float* eps = noise.data_ptr<float>();
  GilRelease no_gil;
  EzScratch& sc = thread_ez_scratch(net);
  AlignedFloats inputs(static_cast<size_t>(kGroup * net.dyn1.J));
  EzRows rows;
  const int64_t L = net.L, H = net.K, A = net.A, J = net.dyn1.J;
  for (int64_t g = 0; g < B; g += kGroup) {
    const int64_t n = std::min(kGroup, B - g);
    for (int64_t s = 0; s < n; ++s) {
      const int64_t b = g + s;
      action_input(net, act + b * D, inputs.data() + s * J);
      rows.action_input[s] = inputs.data() + s * J;
      rows.action[s] = 0;
      rows.latent[s] = in.latent + b * L;
      rows.h[s] = in.h + b * H;
      rows.c[s] = in.c + b * H;
      rows.parent_prefix[s] = in.prefix[b];
      rows.parent_steps[s] = in.steps[b];
      rows.next_latent[s] = next.data_ptr<float>() + b * L;
      rows.next_h[s] = nh.data_ptr<float>() + b * H;
      rows.next_c[s] = nc.data_ptr<float>() + b * H;
    }
    ez_step(net, sc, n, rows, params.data_ptr<float>() + g * A, baseline, fma);
    for (int64_t s = 0; s < n; ++s) {
      const int64_t b = g + s;
      draw_candidates(box, params.data_ptr<float>() + b * A, eps + b * K * D,
                      cand.data_ptr<float>() + b * K * D);
      prefix.data_ptr<float>()[b] = rows.prefix[s];
      nsteps.data_ptr<int64_t>()[b] = rows.steps[s];
      reward.data_ptr<float>()[b] = rows.reward[s];
      value.data_ptr<float>()[b] = rows.value[s];
    }
  }
  return {next, nh, nc, prefix, nsteps, reward, params, value, cand};
}

namespace {

// The sampled EfficientZero Search (fused_loop.h): the node state is the
// base's five [B, N, ...] arrays plus the candidates [B, N, K, D]; a leaf's
// action is its slot's candidate; the new node's prior logits are the K
// zeros of the uniform slot prior; every edge keeps its children_discount.
// What both sampled Searches keep besides their network's state: every
// node's K candidates, each simulation's draws, the box, and the uniform
// slot prior's K zero logits.
struct SampledCandidates {
  float* cand;                           // [B, N, K, D]
  const std::vector<const float*>& eps;  // per simulation s: [B, K, D]
  BoxDraw box;
  int64_t N;
  std::vector<float> slot_logits;  // K zeros

  // the env action of slot `slot` of flat node `node` (b * N + n)
  const float* action(int64_t node, int64_t slot) const { return cand + (node * box.K + slot) * box.D; }
  // node n of tree b, made by simulation n - 1: its K candidates from the
  // policy head's `params` and that simulation's draws, row b; its prior logits
  const float* draw(const float* params, int64_t b, int64_t n) const {
    const int64_t KD = box.K * box.D;
    draw_candidates(box, params, eps[n - 1] + b * KD, cand + (b * N + n) * KD);
    return slot_logits.data();
  }
};

struct SampledEzSearch {
  const EzNet& net;
  EzState st;
  SampledCandidates draws;
  bool fma;

  struct Group {
    const SampledEzSearch& f;
    EzScratch& sc;
    EzRows rows;
    AlignedFloats inputs;        // [kGroup][J]: the rows' W1[:, L:] a
    std::vector<float> params;   // [kGroup][2D]: the policy head's outputs

    explicit Group(const SampledEzSearch& search)
        : f(search), sc(thread_ez_scratch(search.net)),
          inputs(static_cast<size_t>(kGroup * search.net.dyn1.J)),
          params(static_cast<size_t>(kGroup * search.net.A)) {}
    void gather(int64_t s, int64_t b, const Leaf& l, int64_t n) {
      const int64_t N = f.draws.N, from = b * N + l.node, J = f.net.dyn1.J;
      action_input(f.net, f.draws.action(from, l.action), inputs.data() + s * J);
      rows.action_input[s] = inputs.data() + s * J;
      rows.action[s] = 0;
      wire_ez_rows(rows, f.st, s, from, b * N + n, f.net.L, f.net.K);
    }
    void step(int64_t count) {
      ez_step(f.net, sc, count, rows, params.data(), /*baseline=*/false, f.fma);
    }
    NodeOutput finish(int64_t s, int64_t b, int64_t n) {
      const int64_t node = b * f.draws.N + n;
      f.st.prefix[node] = rows.prefix[s];
      f.st.steps[node] = rows.steps[s];
      const float* slot_logits = f.draws.draw(params.data() + s * f.net.A, b, n);
      return {rows.reward[s], rows.value[s], slot_logits, nullptr};
    }
  };
};

}  // namespace

// The whole sampled search on a fresh tree whose root (node 0: its state,
// its K candidates, children_prior with the root noise mixed in,
// children_logits, root_legal, raw_value) the caller has filled: simulation
// s creates node s + 1 of every tree, writing its state, its candidates, raw
// value, the slot logits (0) and prior (1/K), and the edge reward (the prefix
// difference). The draws come from `generator` (see the contract above).
void sampled_ez_search(const FusedCall& call, const at::Tensor& latent, const at::Tensor& lstm_h,
                       const at::Tensor& lstm_c, const at::Tensor& value_prefix,
                       const at::Tensor& steps, const at::Tensor& candidates,
                       const std::vector<at::Tensor>& weights, double reward_eps,
                       double value_eps, double ln_eps, int64_t horizon, const at::Tensor& low,
                       const at::Tensor& high, double sigma, double min_scale,
                       double temperature, double bound,
                       std::optional<at::Generator> generator) {
  const TreeArrays& t = call.tree;
  check_tensor(candidates, "candidate_actions", at::kFloat, 4);
  const int64_t D = candidates.size(3);
  check_shape(candidates, "candidate_actions", {t.B, t.N, t.A, D});
  const EzNet& net = pack_box_net(weights, D, reward_eps, value_eps, ln_eps, horizon);
  const EzState st = check_ez_state(net, latent, lstm_h, lstm_c, value_prefix, steps, {t.B, t.N});
  const BoxDraw box = check_box(low, high, D, t.A, sigma, min_scale, temperature, bound);
  std::vector<at::Tensor> draws;
  std::vector<const float*> eps;
  draw_noise(call, D, generator, latent.options(), draws, eps);
  fused_search(call, SampledEzSearch{net, st,
                                     {candidates.data_ptr<float>(), eps, box, t.N,
                                      std::vector<float>(static_cast<size_t>(t.A), 0.0f)},
                                     call.fma});
}

namespace {

// The sampled MuZero MLP Search: the node state is the latent [B, N, L] plus
// the candidates [B, N, K, D]; otherwise as SampledEzSearch.
struct SampledMlpSearch {
  const MlpNet& net;
  float* latents;  // [B, N, L]
  SampledCandidates draws;
  bool fma;

  struct Group {
    const SampledMlpSearch& f;
    MlpScratch& sc;
    int64_t act[kGroup] = {};
    float reward[kGroup], value[kGroup];
    const float* in[kGroup];
    float* out[kGroup];
    const float* inputs_at[kGroup];
    AlignedFloats inputs;       // [kGroup][J]: the rows' W1[:, L:] a
    std::vector<float> params;  // [kGroup][2D]: the policy head's outputs

    explicit Group(const SampledMlpSearch& search)
        : f(search), sc(thread_scratch(search.net)),
          inputs(static_cast<size_t>(kGroup * search.net.dyn1.J)),
          params(static_cast<size_t>(kGroup * search.net.A)) {}
    void gather(int64_t s, int64_t b, const Leaf& l, int64_t n) {
      const int64_t N = f.draws.N, from = b * N + l.node, J = f.net.dyn1.J;
      action_input(f.net, f.draws.action(from, l.action), inputs.data() + s * J);
      inputs_at[s] = inputs.data() + s * J;
      in[s] = f.latents + from * f.net.L;
      out[s] = f.latents + (b * N + n) * f.net.L;
    }
    void step(int64_t rows) {
      mlp_step(f.net, sc, rows, in, act, out, reward, value, params.data(), /*baseline=*/false, f.fma,
               inputs_at);
    }
    NodeOutput finish(int64_t s, int64_t b, int64_t n) {
      return {reward[s], value[s], f.draws.draw(params.data() + s * f.net.A, b, n), nullptr};
    }
  };
};

}  // namespace

// sampled_ez_search for SampledModel(MuZeroMLPModel(action_dim=D)): the node
// state is the latent [B, N, L] (its "node" leaf), the edge reward the
// step's own.
void sampled_mlp_search(const FusedCall& call, const at::Tensor& latent,
                        const at::Tensor& candidates, const std::vector<at::Tensor>& weights,
                        double reward_eps, double value_eps, const at::Tensor& low,
                        const at::Tensor& high, double sigma, double min_scale,
                        double temperature, double bound, std::optional<at::Generator> generator) {
  const TreeArrays& t = call.tree;
  check_tensor(candidates, "candidate_actions", at::kFloat, 4);
  const int64_t D = candidates.size(3);
  check_shape(candidates, "candidate_actions", {t.B, t.N, t.A, D});
  check_box_net("sampled_mlp_search", weights, 14, D, 0, 2, 10, 13);
  const MlpNet& net = pack_mlp(weights, 2 * D, reward_eps, value_eps, D);
  check_tensor(latent, "latent", at::kFloat, 3);
  check_shape(latent, "latent", {t.B, t.N, net.L});
  const BoxDraw box = check_box(low, high, D, t.A, sigma, min_scale, temperature, bound);
  std::vector<at::Tensor> draws;
  std::vector<const float*> eps;
  draw_noise(call, D, generator, latent.options(), draws, eps);
  fused_search(call, SampledMlpSearch{net, latent.data_ptr<float>(),
                                      {candidates.data_ptr<float>(), eps, box, t.N,
                                       std::vector<float>(static_cast<size_t>(t.A), 0.0f)},
                                      call.fma});
}

}  // namespace tree_ops

#endif  // MZ_HAVE_MLP_SEARCH
