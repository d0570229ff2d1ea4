// The fused search for EfficientZeroMLPModel: every simulation of a search in
// one call (select with the given rules, the value-prefix network step of
// ez_net.h, expand and backup), the GIL released throughout. Also the step's
// test hook (ez_recurrent), bound in tree_ops.cpp.
#include <ATen/ops/empty.h>

#include "ez_net.h"
#include "dispatch.h"
#include "entry_points.h"
#include "fused_loop.h"

#ifdef MZ_HAVE_MLP_SEARCH

namespace tree_ops {
namespace {

// The node state's five arrays (the TensorDict leaves of tree.embeddings, or
// of a search_step state) for `rows` rows.
struct EzState {
  float* latent;
  float* h;
  float* c;
  float* prefix;
  int64_t* steps;
};

EzState check_state(const EzNet& net, const at::Tensor& latent,
                    const at::Tensor& h, const at::Tensor& c,
                    const at::Tensor& prefix, const at::Tensor& steps,
                    at::IntArrayRef rows) {
  const int64_t dim = static_cast<int64_t>(rows.size());
  std::vector<int64_t> with_l(rows.begin(), rows.end()), with_k = with_l;
  with_l.push_back(net.L);
  with_k.push_back(net.K);
  check_tensor(latent, "latent", at::kFloat, dim + 1);
  check_shape(latent, "latent", with_l);
  check_tensor(h, "lstm_h", at::kFloat, dim + 1);
  check_shape(h, "lstm_h", with_k);
  check_tensor(c, "lstm_c", at::kFloat, dim + 1);
  check_shape(c, "lstm_c", with_k);
  check_tensor(prefix, "value_prefix", at::kFloat, dim);
  check_shape(prefix, "value_prefix", rows);
  check_tensor(steps, "steps", at::kLong, dim);
  check_shape(steps, "steps", rows);
  return {latent.data_ptr<float>(), h.data_ptr<float>(), c.data_ptr<float>(),
          prefix.data_ptr<float>(), steps.data_ptr<int64_t>()};
}

}  // namespace

// Test hook: search_step for a batch of states. Returns (next_latent, lstm_h,
// lstm_c, value_prefix, steps, reward, policy_logits, value, prior).
std::vector<at::Tensor> ez_recurrent(
    const std::vector<at::Tensor>& weights, int64_t num_actions,
    double reward_eps, double value_eps, double ln_eps, int64_t horizon,
    const at::Tensor& latent, const at::Tensor& h, const at::Tensor& c,
    const at::Tensor& value_prefix, const at::Tensor& steps,
    const at::Tensor& action, bool baseline, bool fma) {
  const EzNet& net = pack_ez(weights, num_actions, reward_eps, value_eps,
                             ln_eps, horizon);
  check_tensor(action, "action", at::kLong, 1);
  const int64_t B = action.size(0);
  const EzState in = check_state(net, latent, h, c, value_prefix, steps, {B});
  const int64_t* act = action.data_ptr<int64_t>();
  for (int64_t i = 0; i < B; ++i)
    TORCH_CHECK(act[i] >= 0 && act[i] < net.A, "ez_search: action ", act[i],
                " out of range [0, ", net.A, ")");
  const auto opts = latent.options();
  auto next = at::empty({B, net.L}, opts);
  auto nh = at::empty({B, net.K}, opts), nc = at::empty({B, net.K}, opts);
  auto prefix = at::empty({B}, opts), reward = at::empty({B}, opts),
       value = at::empty({B}, opts);
  auto nsteps = at::empty({B}, steps.options());
  auto logits = at::empty({B, net.A}, opts), prior = at::empty({B, net.A}, opts);
  GilRelease no_gil;
  EzScratch& sc = thread_ez_scratch(net);
  EzRows rows;
  const int64_t L = net.L, K = net.K, A = net.A;
  for (int64_t g = 0; g < B; g += kGroup) {
    const int64_t n = std::min(kGroup, B - g);
    for (int64_t s = 0; s < n; ++s) {
      const int64_t b = g + s;
      rows.latent[s] = in.latent + b * L;
      rows.h[s] = in.h + b * K;
      rows.c[s] = in.c + b * K;
      rows.parent_prefix[s] = in.prefix[b];
      rows.parent_steps[s] = in.steps[b];
      rows.action[s] = act[b];
      rows.next_latent[s] = next.data_ptr<float>() + b * L;
      rows.next_h[s] = nh.data_ptr<float>() + b * K;
      rows.next_c[s] = nc.data_ptr<float>() + b * K;
    }
    ez_step(net, sc, n, rows, prior.data_ptr<float>() + g * A,
            logits.data_ptr<float>() + g * A, baseline, fma);
    for (int64_t s = 0; s < n; ++s) {
      prefix.data_ptr<float>()[g + s] = rows.prefix[s];
      nsteps.data_ptr<int64_t>()[g + s] = rows.steps[s];
      reward.data_ptr<float>()[g + s] = rows.reward[s];
      value.data_ptr<float>()[g + s] = rows.value[s];
    }
  }
  return {next, nh, nc, prefix, nsteps, reward, logits, value, prior};
}

// The whole search on a fresh tree whose root (node 0: children_prior,
// children_logits, root_legal, raw_value and the node state) the caller has
// filled: simulation s creates node s + 1, for s < N - 1, writing its state
// (latent, lstm_h, lstm_c, value_prefix, steps: the [B, N, ...] leaves of
// tree.embeddings), raw value, prior logits and prior, and the edge reward
// (prefix difference); every edge keeps its children_discount.
void ez_search(const at::Tensor& visit_count, const at::Tensor& value_sum,
               const at::Tensor& parent, const at::Tensor& action_from_parent,
               const at::Tensor& children_index,
               const at::Tensor& children_prior,
               const at::Tensor& children_reward,
               const at::Tensor& children_discount,
               const at::Tensor& children_logits, const at::Tensor& raw_value,
               const at::Tensor& min_q, const at::Tensor& max_q,
               const at::Tensor& root_legal, const at::Tensor& latent,
               const at::Tensor& lstm_h, const at::Tensor& lstm_c,
               const at::Tensor& value_prefix, const at::Tensor& steps,
               const std::vector<at::Tensor>& weights, double reward_eps,
               double value_eps, double ln_eps, int64_t horizon,
               const std::string& root_rule,
               const std::vector<double>& root_params,
               const std::string& interior_rule,
               const std::vector<double>& interior_params,
               const Extra& extra, bool fma) {
  TreeArrays t = check_tree(visit_count, value_sum, children_index,
                            children_prior, children_reward,
                            children_discount, min_q, max_q);
  check_links(t, parent, action_from_parent);
  check_descent_inputs(t, root_legal, children_logits, raw_value);
  const RuleSpec root = parse_rule(root_rule, root_params, true);
  const RuleSpec interior = parse_rule(interior_rule, interior_params, false);
  const int64_t B = t.B, N = t.N, A = t.A;
  const EzNet& net = pack_ez(weights, A, reward_eps, value_eps, ln_eps, horizon);
  const EzState st = check_state(net, latent, lstm_h, lstm_c, value_prefix,
                                 steps, {B, N});
  // As mlp_search: simulation s relies on node s + 1 being unattached.
  for (int64_t b = 0; b < B; ++b)
    TORCH_CHECK(t.vc[b * N] == 0 && (N < 2 || t.par[b * N + 1] == -1),
                "ez_search: tree ", b, " was searched already; pass a fresh "
                "tree from allocate_tree");
  const int64_t L = net.L, K = net.K;

  with_rules(root, interior, t, extra, [&](const auto& rr0, const auto& ir0) {
    GilRelease no_gil;
    for_row_chunks_with_rules(t.B, rr0, ir0, [&](int64_t b0, int64_t b1, auto& rr, auto& ir) {
      EzScratch& sc = thread_ez_scratch(net);
      EzRows rows;
      std::vector<float> prior(kGroup * A), logits(kGroup * A);
      run_fused_simulations(
          t, b0, b1, rr, ir,
          [&](int64_t s, int64_t b, const Leaf& l, int64_t n) {
            const int64_t from = b * N + l.node, to = b * N + n;
            rows.action[s] = l.action;
            rows.latent[s] = st.latent + from * L;
            rows.h[s] = st.h + from * K;
            rows.c[s] = st.c + from * K;
            rows.parent_prefix[s] = st.prefix[from];
            rows.parent_steps[s] = st.steps[from];
            rows.next_latent[s] = st.latent + to * L;
            rows.next_h[s] = st.h + to * K;
            rows.next_c[s] = st.c + to * K;
          },
          [&](int64_t count) {
            ez_step(net, sc, count, rows, prior.data(), logits.data(), /*baseline=*/false, fma);
          },
          [&](int64_t s, int64_t b, const Row& r, const Leaf& l, int64_t n) {
            st.prefix[b * N + n] = rows.prefix[s];
            st.steps[b * N + n] = rows.steps[s];
            std::copy_n(logits.data() + s * A, A, r.lg + n * A);
            r.rv[n] = rows.value[s];
            expand_and_backup_in_tree(r, n, l.node, l.action, rows.reward[s],
                                      rows.value[s], prior.data() + s * A, nullptr);
          });
    });
  });
}

}  // namespace tree_ops

#endif  // MZ_HAVE_MLP_SEARCH
