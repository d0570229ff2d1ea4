// The fused search for MuZeroMLPModel: the network step of mlp_net.h as a
// Search of fused_loop.h's fused_search (which runs every simulation of a
// search in one call). Also the network's test and benchmark hooks
// (mlp_recurrent, mlp_unroll), bound in tree_ops.cpp.
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
             logits.data_ptr<float>() + g * net.A, baseline, fma);
  }
  for (int64_t b = 0; b < B; ++b)
    softmax_prior(logits.data_ptr<float>() + b * net.A, net.A, prior.data_ptr<float>() + b * net.A);
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
  std::vector<float> reward(kGroup), value(kGroup), logits(kGroup * net.A), prior(net.A);
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
               reward.data(), value.data(), logits.data(), /*baseline=*/false, fma);
      // The prior, as the search computes it for every new node.
      for (int64_t s = 0; s < n; ++s) softmax_prior(logits.data() + s * net.A, net.A, prior.data());
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

// MuZeroMLPModel's Search (fused_loop.h): the node state is the latent
// (embeddings [B, N, L]); the step returns no discount of its own.
struct MlpSearch {
  const MlpNet& net;
  float* latents;
  int64_t N;
  bool fma;

  struct Group {
    const MlpSearch& f;
    MlpScratch& sc;
    int64_t act[kGroup];
    float reward[kGroup], value[kGroup];
    std::vector<float> logits;
    const float* in[kGroup];
    float* out[kGroup];

    explicit Group(const MlpSearch& search)
        : f(search), sc(thread_scratch(search.net)),
          logits(static_cast<size_t>(kGroup * search.net.A)) {}
    void gather(int64_t s, int64_t b, const Leaf& l, int64_t n) {
      act[s] = l.action;
      in[s] = f.latents + (b * f.N + l.node) * f.net.L;
      out[s] = f.latents + (b * f.N + n) * f.net.L;
    }
    void step(int64_t rows) {
      mlp_step(f.net, sc, rows, in, act, out, reward, value, logits.data(), /*baseline=*/false,
               f.fma);
    }
    NodeOutput finish(int64_t s, int64_t, int64_t) const {
      return {reward[s], value[s], logits.data() + s * f.net.A, nullptr};
    }
  };
};

}  // namespace

// The whole search on a fresh tree whose root (node 0: children_prior,
// children_logits, root_legal, embeddings, raw_value) the caller has filled:
// simulation s creates node s + 1, for s < N - 1, and writes its latent, raw
// value, prior logits and prior. Every edge keeps the discount
// children_discount holds (the network returns none of its own).
void mlp_search(const FusedCall& call, const at::Tensor& embeddings,
                const std::vector<at::Tensor>& weights, double reward_eps, double value_eps) {
  const TreeArrays& t = call.tree;
  const MlpNet& net = pack_mlp(weights, t.A, reward_eps, value_eps);
  check_tensor(embeddings, "embeddings", at::kFloat, 3);
  check_shape(embeddings, "embeddings", {t.B, t.N, net.L});
  fused_search(call, MlpSearch{net, embeddings.data_ptr<float>(), t.N, call.fma});
}

// The version-1 signature (pUCT at every node with one set of constants and
// one discount for every edge), kept for callers that do not pass the rules
// yet: the search runs on per-thread discount / logits / raw-value buffers
// (the discount everywhere, zero logits: every edge selectable but the root's
// illegal ones), so the tree's own children_logits and raw_value stay as the
// caller left them. (Not torch temporaries: their cost per call at B=1 is in
// docs/performance_search.md, "Design figures quoted from the code".)
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
  const RuleSpec puct{RuleId::kPuct, {pb_c_base, pb_c_init}};
  static const Extra no_extra;
  mlp_search(FusedCall{t, puct, puct, no_extra, /*fma=*/false, "mlp_search"}, embeddings, weights,
             reward_eps, value_eps);
}

}  // namespace tree_ops

#endif  // MZ_HAVE_MLP_SEARCH
