// The fused search for StochasticMuZeroMLPModel: the network step of
// stochastic_net.h for the leaf's kind as a Search of fused_loop.h's
// fused_search. Stochastic MuZero fits the shared loop as it is: its interior
// rule (chance / pUCT by node kind) is a rule like any other, reading the node
// kinds this Search writes (passed as extra["is_chance"]), and its edge
// discounts (1 into a chance node) are the step's NodeOutput::discount. Also its test hook
// (stochastic_recurrent); both are bound in tree_ops.cpp.
//
// Why: the torch model's search step runs both branches (afterstate and
// chance) on the whole batch over a TensorDict state, ~60 aten calls per
// simulation; at small B that dispatch is the whole cost of the search.
#include <ATen/ops/empty.h>

#include "stochastic_net.h"
#include "dispatch.h"
#include "entry_points.h"
#include "fused_loop.h"

#ifdef MZ_HAVE_MLP_SEARCH

namespace tree_ops {

// Test hook: model.search_step(state, action, discount) for a batch.
// Returns (new_latent, reward, logits [B, A + C], value, prior [B, A + C],
// edge_discount).
std::vector<at::Tensor> stochastic_recurrent(
    const std::vector<at::Tensor>& weights, double reward_eps,
    double value_eps, const at::Tensor& latent, const at::Tensor& is_chance,
    const at::Tensor& action, double discount, bool baseline, bool fma) {
  const StochasticNet& net = pack_stochastic(weights, reward_eps, value_eps);
  const int64_t S = net.A + net.C;
  check_tensor(action, "action", at::kLong, 1);
  const int64_t B = action.size(0);
  check_tensor(latent, "latent", at::kFloat, 2);
  check_shape(latent, "latent", {B, net.L});
  check_tensor(is_chance, "is_chance", at::kBool, 1);
  check_shape(is_chance, "is_chance", {B});
  const int64_t* a = action.data_ptr<int64_t>();
  for (int64_t i = 0; i < B; ++i)
    TORCH_CHECK(a[i] >= 0 && a[i] < S, "stochastic_search: action ", a[i],
                " out of range [0, ", S, ")");
  const auto opts = latent.options();
  auto next = at::empty({B, net.L}, opts);
  auto reward = at::empty({B}, opts), value = at::empty({B}, opts);
  auto disc = at::empty({B}, opts);
  auto logits = at::empty({B, S}, opts), prior = at::empty({B, S}, opts);
  GilRelease no_gil;
  StochasticScratch& sc = stochastic_scratch(net);
  const float* in[kGroup];
  float* out[kGroup];
  for (int64_t g = 0; g < B; g += kGroup) {
    const int64_t n = std::min(kGroup, B - g);
    for (int64_t s = 0; s < n; ++s) {
      in[s] = latent.data_ptr<float>() + (g + s) * net.L;
      out[s] = next.data_ptr<float>() + (g + s) * net.L;
    }
    stochastic_step(net, sc, n, in, is_chance.data_ptr<bool>() + g, a + g,
                    static_cast<float>(discount), out,
                    reward.data_ptr<float>() + g, value.data_ptr<float>() + g,
                    disc.data_ptr<float>() + g,
                    logits.data_ptr<float>() + g * S, baseline, fma);
  }
  for (int64_t b = 0; b < B; ++b)
    softmax_prior(logits.data_ptr<float>() + b * S, S, prior.data_ptr<float>() + b * S);
  return {next, reward, logits, value, prior, disc};
}

namespace {

// StochasticMuZeroMLPModel's Search (fused_loop.h): the node state is the
// latent [B, N, L] and the kind is_chance [B, N]; a new node is of the other
// kind than its parent, and its edge gets the step's discount.
struct StochasticSearch {
  const StochasticNet& net;
  float* latents;
  bool* kind;
  int64_t N;
  float gamma;
  bool fma;

  struct Group {
    const StochasticSearch& f;
    StochasticScratch& sc;
    int64_t act[kGroup];
    bool parent_chance[kGroup];
    float reward[kGroup], value[kGroup], disc[kGroup];
    std::vector<float> logits;
    const float* in[kGroup];
    float* out[kGroup];

    explicit Group(const StochasticSearch& search)
        : f(search), sc(stochastic_scratch(search.net)),
          logits(static_cast<size_t>(kGroup * (search.net.A + search.net.C))) {}
    void gather(int64_t s, int64_t b, const Leaf& l, int64_t n) {
      act[s] = l.action;
      parent_chance[s] = f.kind[b * f.N + l.node];
      in[s] = f.latents + (b * f.N + l.node) * f.net.L;
      out[s] = f.latents + (b * f.N + n) * f.net.L;
    }
    void step(int64_t rows) {
      stochastic_step(f.net, sc, rows, in, parent_chance, act, f.gamma, out, reward, value, disc,
                      logits.data(), /*baseline=*/false, f.fma);
    }
    NodeOutput finish(int64_t s, int64_t b, int64_t n) const {
      f.kind[b * f.N + n] = !parent_chance[s];
      return {reward[s], value[s], logits.data() + s * (f.net.A + f.net.C), disc + s};
    }
  };
};

}  // namespace

// The whole search on a fresh tree whose root (node 0: children_prior,
// children_logits, root_legal, latent, is_chance, raw_value) the caller has
// filled. Simulation s creates node s + 1 for s < N - 1 and writes what the
// per-simulation loop writes: its latent and kind (the other kind than its
// parent's), raw value, prior logits and prior, its edge's reward and
// discount (1 into a chance node, `discount` into a decision node).
void stochastic_search(const FusedCall& call, const at::Tensor& latent,
                       const at::Tensor& is_chance, const std::vector<at::Tensor>& weights,
                       double reward_eps, double value_eps, double discount) {
  const TreeArrays& t = call.tree;
  const int64_t B = t.B, N = t.N, S = t.A;
  const StochasticNet& net = pack_stochastic(weights, reward_eps, value_eps);
  TORCH_CHECK(S == net.A + net.C, "stochastic_search: the tree has ", S,
              " edge slots, the network ", net.A, " actions + ", net.C,
              " chance codes");
  check_tensor(latent, "latent", at::kFloat, 3);
  check_shape(latent, "latent", {B, N, net.L});
  check_tensor(is_chance, "is_chance", at::kBool, 2);
  check_shape(is_chance, "is_chance", {B, N});
  // The interior rule must read the node kinds this search writes.
  Extra rule_extra = call.extra;
  rule_extra["is_chance"] = is_chance;
  fused_search(FusedCall{t, call.root, call.interior, rule_extra, call.fma, call.who},
               StochasticSearch{net, latent.data_ptr<float>(), is_chance.data_ptr<bool>(), N,
                                static_cast<float>(discount), call.fma});
}

}  // namespace tree_ops

#endif  // MZ_HAVE_MLP_SEARCH
