// The fused search for StochasticMuZeroMLPModel: every simulation of a
// Stochastic MuZero search in one call (select with the given rules, the
// network step of stochastic_net.h for the leaf's kind, expand and backup),
// the GIL released throughout. Also its test hook (stochastic_recurrent); both
// are bound in tree_ops.cpp.
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
                    logits.data_ptr<float>() + g * S,
                    prior.data_ptr<float>() + g * S, baseline, fma);
  }
  return {next, reward, logits, value, prior, disc};
}

// The whole search on a fresh tree whose root (node 0: children_prior,
// children_logits, root_legal, latent, is_chance, raw_value) the caller has
// filled. Simulation s creates node s + 1 for s < N - 1 and writes what the
// per-simulation loop writes: its latent and kind (the other kind than its
// parent's), raw value, prior logits and prior, its edge's reward and
// discount (1 into a chance node, `discount` into a decision node).
void stochastic_search(
    const at::Tensor& visit_count, const at::Tensor& value_sum,
    const at::Tensor& parent, const at::Tensor& action_from_parent,
    const at::Tensor& children_index, const at::Tensor& children_prior,
    const at::Tensor& children_reward, const at::Tensor& children_discount,
    const at::Tensor& children_logits, const at::Tensor& raw_value,
    const at::Tensor& min_q, const at::Tensor& max_q,
    const at::Tensor& root_legal, const at::Tensor& latent,
    const at::Tensor& is_chance, const std::vector<at::Tensor>& weights,
    double reward_eps, double value_eps, double discount,
    const std::string& root_rule, const std::vector<double>& root_params,
    const std::string& interior_rule,
    const std::vector<double>& interior_params, const Extra& extra,
    bool fma) {
  TreeArrays t = check_tree(visit_count, value_sum, children_index,
                            children_prior, children_reward,
                            children_discount, min_q, max_q);
  check_links(t, parent, action_from_parent);
  check_descent_inputs(t, root_legal, children_logits, raw_value);
  const int64_t B = t.B, N = t.N, S = t.A;
  const StochasticNet& net = pack_stochastic(weights, reward_eps, value_eps);
  const int64_t L = net.L;
  TORCH_CHECK(S == net.A + net.C, "stochastic_search: the tree has ", S,
              " edge slots, the network ", net.A, " actions + ", net.C,
              " chance codes");
  check_tensor(latent, "latent", at::kFloat, 3);
  check_shape(latent, "latent", {B, N, L});
  check_tensor(is_chance, "is_chance", at::kBool, 2);
  check_shape(is_chance, "is_chance", {B, N});
  // The simulations rely on a fresh tree (node s + 1 unattached when
  // simulation s starts): reject a tree that was searched already.
  for (int64_t b = 0; b < B; ++b)
    TORCH_CHECK(t.vc[b * N] == 0 && (N < 2 || t.par[b * N + 1] == -1),
                "stochastic_search: tree ", b, " was searched already; pass "
                "a fresh tree from allocate_tree");
  // The interior rule must read the node kinds this loop writes.
  Extra rule_extra = extra;
  rule_extra["is_chance"] = is_chance;
  float* lat = latent.data_ptr<float>();
  bool* kind = is_chance.data_ptr<bool>();
  const float gamma = static_cast<float>(discount);

  with_rules(parse_rule(root_rule, root_params, true),
             parse_rule(interior_rule, interior_params, false), t, rule_extra,
             [&](const auto& rr0, const auto& ir0) {
    GilRelease no_gil;
    for_row_chunks_with_rules(t.B, rr0, ir0, [&](int64_t b0, int64_t b1, auto& rr, auto& ir) {
      StochasticScratch& sc = stochastic_scratch(net);
      int64_t act[kGroup];
      bool parent_chance[kGroup];
      float reward[kGroup], value[kGroup], disc[kGroup];
      std::vector<float> logits(kGroup * S), prior(kGroup * S);
      const float* in[kGroup];
      float* out[kGroup];
      run_fused_simulations(
          t, b0, b1, rr, ir,
          [&](int64_t s, int64_t b, const Leaf& l, int64_t n) {
            act[s] = l.action;
            parent_chance[s] = kind[b * N + l.node];
            in[s] = lat + (b * N + l.node) * L;
            out[s] = lat + (b * N + n) * L;
          },
          [&](int64_t rows) {
            stochastic_step(net, sc, rows, in, parent_chance, act, gamma, out,
                            reward, value, disc, logits.data(), prior.data(),
                            /*baseline=*/false, fma);
          },
          [&](int64_t s, int64_t b, const Row& r, const Leaf& l, int64_t n) {
            kind[b * N + n] = !parent_chance[s];
            std::copy_n(logits.data() + s * S, S, r.lg + n * S);
            r.rv[n] = value[s];
            expand_and_backup_in_tree(r, n, l.node, l.action, reward[s],
                                      value[s], prior.data() + s * S, disc + s);
          });
    });
  });
}

}  // namespace tree_ops

#endif  // MZ_HAVE_MLP_SEARCH
