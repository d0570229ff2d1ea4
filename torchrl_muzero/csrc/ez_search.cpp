// The fused search for EfficientZeroMLPModel: the value-prefix network step of
// ez_net.h as a Search of fused_loop.h's fused_search. Also the step's test
// hook (ez_recurrent), bound in tree_ops.cpp.
#include <ATen/ops/empty.h>

#include "ez_net.h"
#include "dispatch.h"
#include "entry_points.h"
#include "fused_loop.h"

#ifdef MZ_HAVE_MLP_SEARCH

namespace tree_ops {

EzState check_ez_state(const EzNet& net, const at::Tensor& latent, const at::Tensor& h,
                       const at::Tensor& c, const at::Tensor& prefix, const at::Tensor& steps,
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
  const EzState in = check_ez_state(net, latent, h, c, value_prefix, steps, {B});
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
    ez_step(net, sc, n, rows, logits.data_ptr<float>() + g * A, baseline, fma);
    for (int64_t s = 0; s < n; ++s) {
      softmax_prior(logits.data_ptr<float>() + (g + s) * A, A,
                    prior.data_ptr<float>() + (g + s) * A);
      prefix.data_ptr<float>()[g + s] = rows.prefix[s];
      nsteps.data_ptr<int64_t>()[g + s] = rows.steps[s];
      reward.data_ptr<float>()[g + s] = rows.reward[s];
      value.data_ptr<float>()[g + s] = rows.value[s];
    }
  }
  return {next, nh, nc, prefix, nsteps, reward, logits, value, prior};
}

namespace {

// EfficientZeroMLPModel's Search (fused_loop.h): the node state is EzState's
// five [B, N, ...] arrays; the edge reward is the prefix difference, and the
// edge keeps its children_discount.
struct EzSearch {
  const EzNet& net;
  EzState st;
  int64_t N;
  bool fma;

  struct Group {
    const EzSearch& f;
    EzScratch& sc;
    EzRows rows;
    std::vector<float> logits;

    explicit Group(const EzSearch& search)
        : f(search), sc(thread_ez_scratch(search.net)),
          logits(static_cast<size_t>(kGroup * search.net.A)) {}
    void gather(int64_t s, int64_t b, const Leaf& l, int64_t n) {
      const int64_t from = b * f.N + l.node, to = b * f.N + n, L = f.net.L, K = f.net.K;
      rows.action[s] = l.action;
      wire_ez_rows(rows, f.st, s, from, to, L, K);
    }
    void step(int64_t count) {
      ez_step(f.net, sc, count, rows, logits.data(), /*baseline=*/false, f.fma);
    }
    NodeOutput finish(int64_t s, int64_t b, int64_t n) const {
      f.st.prefix[b * f.N + n] = rows.prefix[s];
      f.st.steps[b * f.N + n] = rows.steps[s];
      return {rows.reward[s], rows.value[s], logits.data() + s * f.net.A, nullptr};
    }
  };
};

}  // namespace

// The whole search on a fresh tree whose root (node 0: children_prior,
// children_logits, root_legal, raw_value and the node state) the caller has
// filled: simulation s creates node s + 1, for s < N - 1, writing its state
// (latent, lstm_h, lstm_c, value_prefix, steps: the [B, N, ...] leaves of
// tree.embeddings), raw value, prior logits and prior, and the edge reward
// (prefix difference); every edge keeps its children_discount.
void ez_search(const FusedCall& call, const at::Tensor& latent, const at::Tensor& lstm_h,
               const at::Tensor& lstm_c, const at::Tensor& value_prefix, const at::Tensor& steps,
               const std::vector<at::Tensor>& weights, double reward_eps, double value_eps,
               double ln_eps, int64_t horizon) {
  const TreeArrays& t = call.tree;
  const EzNet& net = pack_ez(weights, t.A, reward_eps, value_eps, ln_eps, horizon);
  const EzState st = check_ez_state(net, latent, lstm_h, lstm_c, value_prefix, steps, {t.B, t.N});
  fused_search(call, EzSearch{net, st, t.N, call.fma});
}

}  // namespace tree_ops

#endif  // MZ_HAVE_MLP_SEARCH
