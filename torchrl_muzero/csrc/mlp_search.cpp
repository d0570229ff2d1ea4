// The fused search for MuZeroMLPModel: every simulation of a search in one
// call (select with the given rules, the network step of mlp_net.h, expand
// and backup), the GIL released throughout. Also the network's test and
// benchmark hooks (mlp_recurrent, mlp_unroll), bound in tree_ops.cpp.
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>

#include "mlp_net.h"
#include "dispatch.h"
#include "entry_points.h"
#include "fused_loop.h"

#include <algorithm>
#include <mutex>
#include <set>
#include <thread>

#ifdef MZ_HAVE_MLP_SEARCH

namespace tree_ops {

// Test hook: one search step, as model.recurrent_inference_scalar plus the
// prior. Returns (next_latent, reward, policy_logits, value, prior).
std::vector<at::Tensor> mlp_recurrent(const std::vector<at::Tensor>& weights,
                                      int64_t num_actions, double reward_eps,
                                      double value_eps,
                                      const at::Tensor& latent,
                                      const at::Tensor& action,
                                      bool baseline, bool fma) {
  const MlpNet& net = pack_mlp(weights, num_actions, reward_eps, value_eps);
  check_tensor(action, "action", at::kLong, 1);
  const int64_t B = action.size(0);
  check_latent_and_actions(net, latent, action, B);
  const auto opts = latent.options();
  auto next = at::empty({B, net.L}, opts);
  auto reward = at::empty({B}, opts), value = at::empty({B}, opts);
  auto logits = at::empty({B, net.A}, opts), prior = at::empty({B, net.A}, opts);
  GilRelease no_gil;
  MlpScratch& sc = thread_scratch(net);
  const float* in[kGroup];
  float* out[kGroup];
  for (int64_t g = 0; g < B; g += kGroup) {
    const int64_t n = std::min(kGroup, B - g);
    for (int64_t s = 0; s < n; ++s) {
      in[s] = latent.data_ptr<float>() + (g + s) * net.L;
      out[s] = next.data_ptr<float>() + (g + s) * net.L;
    }
    mlp_step(net, sc, n, in, action.data_ptr<int64_t>() + g, out,
             reward.data_ptr<float>() + g, value.data_ptr<float>() + g,
             prior.data_ptr<float>() + g * net.A,
             logits.data_ptr<float>() + g * net.A, baseline, fma);
  }
  return {next, reward, logits, value, prior};
}

// Network-only counterpart of mlp_search for benchmarks: actions.size(0)
// chained steps from `latent` (no tree), on the FMA path with `fma`.
// Returns the last latent.
at::Tensor mlp_unroll(const std::vector<at::Tensor>& weights,
                      int64_t num_actions, double reward_eps, double value_eps,
                      const at::Tensor& latent, const at::Tensor& actions,
                      bool fma) {
  const MlpNet& net = pack_mlp(weights, num_actions, reward_eps, value_eps);
  check_tensor(actions, "actions", at::kLong, 2);
  const int64_t S = actions.size(0), B = actions.size(1);
  check_latent_and_actions(net, latent, actions, B);
  auto cur = latent.clone(), nxt = at::empty_like(latent);
  GilRelease no_gil;
  MlpScratch& sc = thread_scratch(net);
  std::vector<float> reward(kGroup), value(kGroup), prior(kGroup * net.A);
  const float* in[kGroup];
  float* out[kGroup];
  for (int64_t t = 0; t < S; ++t) {
    for (int64_t g = 0; g < B; g += kGroup) {
      const int64_t n = std::min(kGroup, B - g);
      for (int64_t s = 0; s < n; ++s) {
        in[s] = cur.data_ptr<float>() + (g + s) * net.L;
        out[s] = nxt.data_ptr<float>() + (g + s) * net.L;
      }
      mlp_step(net, sc, n, in, actions.data_ptr<int64_t>() + t * B + g, out,
               reward.data(), value.data(), prior.data(), nullptr,
               /*baseline=*/false, fma);
    }
    std::swap(cur, nxt);
  }
  return cur;
}


// Test hook for for_row_chunks (fused_loop.h): the row ranges it gives B
// trees on torch's current thread count, sorted, and how many distinct
// threads ran them; with fail_at >= 0 the chunk holding that row throws (the
// error must reach Python once every chunk is done).
std::pair<std::vector<std::pair<int64_t, int64_t>>, int64_t> row_chunks_probe(
    int64_t B, int64_t fail_at) {
  std::mutex mu;
  std::vector<std::pair<int64_t, int64_t>> ranges;
  std::set<std::thread::id> threads;
  {
    GilRelease no_gil;
    for_row_chunks(B, [&](int64_t b0, int64_t b1) {
      {
        std::lock_guard<std::mutex> lock(mu);
        ranges.emplace_back(b0, b1);
        threads.insert(std::this_thread::get_id());
      }
      TORCH_CHECK(fail_at < b0 || fail_at >= b1, "row_chunks_probe: chunk [", b0,
                  ", ", b1, ") failed at row ", fail_at);
    });
  }
  std::sort(ranges.begin(), ranges.end());
  return {ranges, static_cast<int64_t>(threads.size())};
}

namespace {

// The simulations of mlp_search on the checked tree `t` (every pointer set).
void run_mlp_search(const TreeArrays& t, const at::Tensor& embeddings,
                    const std::vector<at::Tensor>& weights, double reward_eps,
                    double value_eps, const RuleSpec& root,
                    const RuleSpec& interior, const Extra& extra, bool fma) {
  const int64_t B = t.B, N = t.N, A = t.A;
  const MlpNet& net = pack_mlp(weights, A, reward_eps, value_eps);
  check_tensor(embeddings, "embeddings", at::kFloat, 3);
  check_shape(embeddings, "embeddings", {B, N, net.L});
  float* emb_all = embeddings.data_ptr<float>();
  // The simulations rely on a fresh tree (node s + 1 unattached when
  // simulation s starts): reject a tree that was searched already.
  for (int64_t b = 0; b < B; ++b)
    TORCH_CHECK(t.vc[b * N] == 0 && (N < 2 || t.par[b * N + 1] == -1),
                "mlp_search: tree ", b, " was searched already; pass a fresh "
                "tree from allocate_tree");
  const int64_t L = net.L;

  with_rules(root, interior, t, extra, [&](const auto& rr0, const auto& ir0) {
    GilRelease no_gil;
    for_row_chunks_with_rules(t.B, rr0, ir0, [&](int64_t b0, int64_t b1, auto& rr, auto& ir) {
      MlpScratch& sc = thread_scratch(net);
      int64_t act[kGroup];
      float reward[kGroup], value[kGroup];
      std::vector<float> prior(kGroup * A), logits(kGroup * A);
      const float* in[kGroup];
      float* out[kGroup];
      run_fused_simulations(
          t, b0, b1, rr, ir,
          [&](int64_t s, int64_t b, const Leaf& l, int64_t n) {
            act[s] = l.action;
            in[s] = emb_all + (b * N + l.node) * L;
            out[s] = emb_all + (b * N + n) * L;
          },
          [&](int64_t rows) {
            mlp_step(net, sc, rows, in, act, out, reward, value, prior.data(),
                     logits.data(), /*baseline=*/false, fma);
          },
          [&](int64_t s, int64_t, const Row& r, const Leaf& l, int64_t n) {
            std::copy_n(logits.data() + s * A, A, r.lg + n * A);
            r.rv[n] = value[s];
            expand_and_backup_in_tree(r, n, l.node, l.action, reward[s],
                                      value[s], prior.data() + s * A, nullptr);
          });
    });
  });
}

}  // namespace

// The whole search on a fresh tree whose root (node 0: children_prior,
// children_logits, root_legal, embeddings, raw_value) the caller has filled:
// simulation s creates node s + 1, for s < N - 1, and writes its latent, raw
// value, prior logits and prior. Every edge keeps the discount
// children_discount holds (the network returns none of its own).
void mlp_search(const at::Tensor& visit_count, const at::Tensor& value_sum,
                const at::Tensor& parent, const at::Tensor& action_from_parent,
                const at::Tensor& children_index,
                const at::Tensor& children_prior,
                const at::Tensor& children_reward,
                const at::Tensor& children_discount,
                const at::Tensor& children_logits, const at::Tensor& raw_value,
                const at::Tensor& min_q, const at::Tensor& max_q,
                const at::Tensor& root_legal, const at::Tensor& embeddings,
                const std::vector<at::Tensor>& weights, double reward_eps,
                double value_eps, const std::string& root_rule,
                const std::vector<double>& root_params,
                const std::string& interior_rule,
                const std::vector<double>& interior_params,
                const Extra& extra, bool fma) {
  TreeArrays t = check_tree(visit_count, value_sum, children_index,
                            children_prior, children_reward,
                            children_discount, min_q, max_q);
  check_links(t, parent, action_from_parent);
  check_descent_inputs(t, root_legal, children_logits, raw_value);
  run_mlp_search(t, embeddings, weights, reward_eps, value_eps,
                 parse_rule(root_rule, root_params, true),
                 parse_rule(interior_rule, interior_params, false), extra, fma);
}

// The version-1 signature (pUCT at every node with one set of constants and
// one discount for every edge), kept for callers that do not pass the rules
// yet: the search runs on per-thread discount / logits / raw-value buffers
// (the discount everywhere, zero logits: every edge selectable but the root's
// illegal ones), so the tree's own children_logits and raw_value stay as the
// caller left them. (Torch temporaries cost ~25 us per call at B=1.)
void mlp_search_puct(const at::Tensor& visit_count, const at::Tensor& value_sum,
                     const at::Tensor& parent,
                     const at::Tensor& action_from_parent,
                     const at::Tensor& children_index,
                     const at::Tensor& children_prior,
                     const at::Tensor& children_reward, const at::Tensor& min_q,
                     const at::Tensor& max_q, const at::Tensor& root_legal,
                     const at::Tensor& embeddings,
                     const std::vector<at::Tensor>& weights, double reward_eps,
                     double value_eps, double pb_c_base, double pb_c_init,
                     double discount) {
  // children_reward stands in for the discount array in the checks (same
  // dtype and shape); its pointer is replaced below.
  TreeArrays t = check_tree(visit_count, value_sum, children_index,
                            children_prior, children_reward, children_reward,
                            min_q, max_q);
  check_links(t, parent, action_from_parent);
  check_tensor(root_legal, "root_legal", at::kBool, 2);
  check_shape(root_legal, "root_legal", {t.B, t.A});
  t.legal = root_legal.data_ptr<bool>();
  thread_local std::vector<float> disc, logits, raw;
  const size_t edges = static_cast<size_t>(t.B * t.N * t.A);
  disc.assign(edges, static_cast<float>(discount));
  logits.assign(edges, 0.0f);
  raw.assign(static_cast<size_t>(t.B * t.N), 0.0f);
  t.cd = disc.data();
  t.lg = logits.data();
  t.rv = raw.data();
  const std::vector<double> puct{pb_c_base, pb_c_init};
  const RuleSpec spec{RuleId::kPuct, puct};
  run_mlp_search(t, embeddings, weights, reward_eps, value_eps, spec, spec,
                 Extra{}, /*fma=*/false);
}

}  // namespace tree_ops

#endif  // MZ_HAVE_MLP_SEARCH
