// The fused search for UniZeroModel: the transformer step of unizero_net.h
// (with the per-node KV cache or a full recompute) as a Search of
// fused_loop.h's fused_search. Also the step's test hook (unizero_recurrent)
// and the roots' forward (unizero_root, unizero_root_window), bound in
// tree_ops.cpp.
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>

#include "unizero_net.h"
#include "dispatch.h"
#include "entry_points.h"
#include "fused_loop.h"

#ifdef MZ_HAVE_MLP_SEARCH

namespace tree_ops {
namespace {

// The node state's leaves (model.py: latents, actions, length, kv) for
// `rows` rows; kv is absent (undefined) in recompute mode.
struct UzState {
  float* latents;
  int64_t* actions;
  int64_t* length;
  float* kv;
};

UzState check_state(const UzNet& net, const at::Tensor& latents, const at::Tensor& actions,
                    const at::Tensor& length, const c10::optional<at::Tensor>& kv,
                    at::IntArrayRef rows) {
  const int64_t dim = static_cast<int64_t>(rows.size());
  std::vector<int64_t> lat(rows.begin(), rows.end()), act = lat, cache = lat;
  lat.insert(lat.end(), {net.MB, net.E});
  act.push_back(net.MB);
  cache.insert(cache.end(), {net.MT, net.L, 2, net.H, net.Dh});
  check_tensor(latents, "latents", at::kFloat, dim + 2);
  check_shape(latents, "latents", lat);
  check_tensor(actions, "actions", at::kLong, dim + 1);
  check_shape(actions, "actions", act);
  check_tensor(length, "length", at::kLong, dim);
  check_shape(length, "length", rows);
  float* kv_ptr = nullptr;
  if (kv.has_value() && kv->defined()) {
    check_tensor(*kv, "kv", at::kFloat, dim + 5);
    check_shape(*kv, "kv", cache);
    kv_ptr = kv->data_ptr<float>();
  }
  return {latents.data_ptr<float>(), actions.data_ptr<int64_t>(), length.data_ptr<int64_t>(),
          kv_ptr};
}

void check_length(const UzNet& net, int64_t len, const char* what) {
  TORCH_CHECK(len >= 1 && len % 2 == 1 && len < net.MT, "unizero_search: ", what,
              " has length ", len, "; a node's context holds an odd number of tokens below ",
              net.MT);
}

}  // namespace

// Test hook: search_step for a batch of states (kv given: cache mode, its
// slots below each length must be filled as search_root / search_step fill
// them). Returns (latents, actions, length, kv (empty in recompute mode),
// reward, policy_logits, value, prior).
std::vector<at::Tensor> unizero_recurrent(
    const std::vector<at::Tensor>& weights, const std::vector<int64_t>& ints,
    const std::vector<double>& floats, const at::Tensor& latents, const at::Tensor& actions,
    const at::Tensor& length, const c10::optional<at::Tensor>& kv, const at::Tensor& action,
    bool baseline, bool fma) {
  const UzNet& net = pack_unizero(weights, ints, floats);
  check_tensor(action, "action", at::kLong, 1);
  const int64_t B = action.size(0);
  const UzState in = check_state(net, latents, actions, length, kv, {B});
  const bool cache = in.kv != nullptr;
  const int64_t* act = action.data_ptr<int64_t>();
  for (int64_t i = 0; i < B; ++i) {
    TORCH_CHECK(act[i] >= 0 && act[i] < net.A, "unizero_search: action ", act[i],
                " out of range [0, ", net.A, ")");
    check_length(net, in.length[i], "a state");
  }
  auto out_lat = at::empty_like(latents), out_act = at::empty_like(actions);
  auto out_len = at::empty_like(length);
  auto out_kv = cache ? kv->clone() : at::empty({0}, latents.options());
  const auto opts = latents.options();
  auto reward = at::empty({B}, opts), value = at::empty({B}, opts);
  auto logits = at::empty({B, net.A}, opts), prior = at::empty({B, net.A}, opts);
  GilRelease no_gil;
  UzScratch& sc = thread_uz_scratch(net);
  const int64_t MB = net.MB, E = net.E, MT = net.MT, SF = net.slot_floats(), A = net.A;
  std::vector<const float*> tables(kGroup * MT);
  UzRows rows;
  for (int64_t g = 0; g < B; g += kGroup) {
    const int64_t n = std::min(kGroup, B - g);
    for (int64_t s = 0; s < n; ++s) {
      const int64_t b = g + s;
      rows.p_latents[s] = in.latents + b * MB * E;
      rows.p_actions[s] = in.actions + b * MB;
      rows.p_length[s] = in.length[b];
      rows.action[s] = act[b];
      rows.c_latents[s] = out_lat.data_ptr<float>() + b * MB * E;
      rows.c_actions[s] = out_act.data_ptr<int64_t>() + b * MB;
      rows.slots[s] = tables.data() + s * MT;
      rows.c_kv[s] = cache ? out_kv.data_ptr<float>() + b * MT * SF : nullptr;
      if (cache)  // the parent's slots, copied into the child's buffer with it
        for (int64_t i = 0; i < in.length[b]; ++i) rows.slots[s][i] = rows.c_kv[s] + i * SF;
    }
    uz_step(net, sc, n, rows, cache, logits.data_ptr<float>() + g * A, baseline, fma);
    for (int64_t s = 0; s < n; ++s) {
      softmax_prior(logits.data_ptr<float>() + (g + s) * A, A,
                    prior.data_ptr<float>() + (g + s) * A);
      out_len.data_ptr<int64_t>()[g + s] = rows.c_length[s];
      reward.data_ptr<float>()[g + s] = rows.reward[s];
      value.data_ptr<float>()[g + s] = rows.value[s];
    }
  }
  return {out_lat, out_act, out_len, out_kv, reward, logits, value, prior};
}

// The roots of model.root_from_latents from their packed node states (kv,
// when given, zeros in: the window's slots are written). Returns
// (policy_logits [B, A], value [B]).
std::vector<at::Tensor> unizero_root(const std::vector<at::Tensor>& weights,
                                     const std::vector<int64_t>& ints,
                                     const std::vector<double>& floats, const at::Tensor& latents,
                                     const at::Tensor& actions, const at::Tensor& length,
                                     const c10::optional<at::Tensor>& kv, bool baseline) {
  const UzNet& net = pack_unizero(weights, ints, floats);
  check_tensor(length, "length", at::kLong, 1);
  const int64_t B = length.size(0);
  const UzState st = check_state(net, latents, actions, length, kv, {B});
  for (int64_t b = 0; b < B; ++b) check_length(net, st.length[b], "a root");
  auto logits = at::empty({B, net.A}, latents.options()), value = at::empty({B}, latents.options());
  GilRelease no_gil;
  UzScratch& sc = thread_uz_scratch(net);
  const int64_t MB = net.MB, E = net.E;
  uz_roots(net, sc, B, st.latents, MB * E, st.actions, MB, st.length, st.kv,
           logits.data_ptr<float>(), value.data_ptr<float>(), baseline);
  return {logits, value};
}

// root_from_latents for full windows (every row holds K + 1 latents: the
// packing is the identity) in one call: the node state (latents [B, MB, E]
// zeros past the window, actions [B, MB] -1 past it, length 2K + 1, kv zeros
// (cache) or undefined) made here instead of by ~8 torch ops, then
// unizero_root's forward. Returns [latents, actions, length, kv, logits, value].
std::vector<at::Tensor> unizero_root_window(const std::vector<at::Tensor>& weights,
                                            const std::vector<int64_t>& ints,
                                            const std::vector<double>& floats,
                                            const at::Tensor& window, const at::Tensor& history,
                                            bool cache) {
  const UzNet& net = pack_unizero(weights, ints, floats);
  const at::Tensor lat_in = window.contiguous(), act_in = history.to(at::kLong).contiguous();
  check_tensor(lat_in, "window", at::kFloat, 3);
  const int64_t B = window.size(0), K1 = window.size(1), K = K1 - 1;
  TORCH_CHECK(K1 >= 1 && window.size(2) == net.E && K1 <= net.MB && history.dim() == 2 &&
                  history.size(0) == B && history.size(1) == K && act_in.device().is_cpu(),
              "unizero_root_window: expected a window [B, K + 1, E] and actions [B, K]");
  const int64_t MB = net.MB, E = net.E, MT = net.MT, T = 2 * K + 1;
  check_length(net, T, "a root");
  const auto f32 = window.options();
  auto latents = at::zeros({B, MB, E}, f32), actions = at::full({B, MB}, -1, act_in.options());
  auto length = at::full({B}, T, act_in.options());
  auto kv = cache ? at::zeros({B, MT, net.L, 2, net.H, net.Dh}, f32) : at::Tensor();
  auto logits = at::empty({B, net.A}, f32), value = at::empty({B}, f32);
  float* lat = latents.data_ptr<float>();
  int64_t* act = actions.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b) {
    std::copy_n(lat_in.data_ptr<float>() + b * K1 * E, K1 * E, lat + b * MB * E);
    std::copy_n(act_in.data_ptr<int64_t>() + b * K, K, act + b * MB);
  }
  {
    GilRelease no_gil;
    UzScratch& sc = thread_uz_scratch(net);
    const std::vector<int64_t> lengths(static_cast<size_t>(B), T);
    uz_roots(net, sc, B, lat, MB * E, act, MB, lengths.data(),
             cache ? kv.data_ptr<float>() : nullptr, logits.data_ptr<float>(),
             value.data_ptr<float>(), false);
  }
  return {latents, actions, length, kv, logits, value};
}

namespace {

// UniZeroModel's Search (fused_loop.h): the node state is UzState's
// [B, N, ...] arrays. In cache mode a leaf's context is gathered from the
// K/V slots of the nodes that computed them, up the parent links; own_from
// [B, N] (the first slot a node's own buffer holds: 0 for the root and for a
// node whose context slid, else its parent's length) is shared by the chunks,
// each writing its own trees' rows only.
struct UzSearch {
  const UzNet& net;
  UzState st;
  const int32_t* parent;
  int64_t* own_from;
  int64_t N;
  bool cache, fma;

  struct Group {
    const UzSearch& f;
    UzScratch& sc;  // thread_local: one per thread of the split
    UzRows rows;
    std::vector<float> logits;
    std::vector<const float*> tables;

    explicit Group(const UzSearch& search)
        : f(search), sc(thread_uz_scratch(search.net)),
          logits(static_cast<size_t>(kGroup * search.net.A)),
          tables(static_cast<size_t>(kGroup * search.net.MT)) {}
    void gather(int64_t s, int64_t b, const Leaf& l, int64_t n) {
      const UzState& st = f.st;
      const int64_t from = b * f.N + l.node, to = b * f.N + n;
      const int64_t MB = f.net.MB, E = f.net.E, MT = f.net.MT, SF = f.net.slot_floats();
      rows.action[s] = l.action;
      rows.p_latents[s] = st.latents + from * MB * E;
      rows.p_actions[s] = st.actions + from * MB;
      rows.p_length[s] = st.length[from];
      rows.c_latents[s] = st.latents + to * MB * E;
      rows.c_actions[s] = st.actions + to * MB;
      rows.slots[s] = tables.data() + s * MT;
      rows.c_kv[s] = f.cache ? st.kv + to * MT * SF : nullptr;
      if (!f.cache) return;
      // The exact cache keyed by tree node: each slot of the leaf's
      // context from the node that computed it, up the parent links.
      for (int64_t m = l.node;;) {
        const int64_t node = b * f.N + m;
        for (int64_t i = f.own_from[node]; i < st.length[node]; ++i)
          rows.slots[s][i] = st.kv + node * MT * SF + i * SF;
        if (f.own_from[node] == 0) break;
        m = f.parent[node];
      }
    }
    void step(int64_t count) {
      uz_step(f.net, sc, count, rows, f.cache, logits.data(), /*baseline=*/false, f.fma);
    }
    NodeOutput finish(int64_t s, int64_t b, int64_t n) const {
      const int64_t to = b * f.N + n;
      f.st.length[to] = rows.c_length[s];
      f.own_from[to] = rows.slid[s] ? 0 : rows.p_length[s];
      return {rows.reward[s], rows.value[s], logits.data() + s * f.net.A, nullptr};
    }
  };
};

}  // namespace

// The whole search on a fresh tree whose root (node 0: children_prior,
// children_logits, root_legal, raw_value and the node state) the caller has
// filled: simulation s creates node s + 1, for s < N - 1, writing its state
// (the [B, N, ...] leaves of tree.embeddings), raw value, prior logits and
// prior, and the edge reward; every edge keeps its children_discount.
// With kv (cache mode) each node writes only its own slots and reads its
// ancestors' through the parent links; its buffer's other slots are left as
// the tree allocation left them (uninitialised): nothing in the search reads
// them, and copying every ancestor's slots into every node moved ~65 MB per
// search at B = 64. complete_node_states (modules/unizero/node_states.py)
// rebuilds search_step's layout for whoever reads the states afterwards.
void unizero_search(const FusedCall& call, const at::Tensor& latents, const at::Tensor& actions,
                    const at::Tensor& length, const c10::optional<at::Tensor>& kv,
                    const std::vector<at::Tensor>& weights, const std::vector<int64_t>& ints,
                    const std::vector<double>& floats) {
  const TreeArrays& t = call.tree;
  const int64_t B = t.B, N = t.N;
  const UzNet& net = pack_unizero(weights, ints, floats);
  TORCH_CHECK(net.A == t.A, "unizero_search: the model has ", net.A, " actions, the tree ", t.A);
  const UzState st = check_state(net, latents, actions, length, kv, {B, N});
  for (int64_t b = 0; b < B; ++b) check_length(net, st.length[b * N], "a root");
  std::vector<int64_t> own_from(static_cast<size_t>(B * N), 0);
  fused_search(call, UzSearch{net, st, t.par, own_from.data(), N, st.kv != nullptr, call.fma});
}

}  // namespace tree_ops

#endif  // MZ_HAVE_MLP_SEARCH
