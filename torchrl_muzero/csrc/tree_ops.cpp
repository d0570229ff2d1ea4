// Tree bookkeeping of the batched MCTS (torchrl_muzero/mcts/tree.py) as plain
// loops over the B trees.
//
// Why C++: done as batched torch ops, one depth level of select/backup costs
// ~35 small aten calls (3-6 us of dispatch each on CPU), which dominates the
// search. Here one call per simulation walks every tree directly on the
// tensors' memory (select + backup ~0.2 us per tree per simulation at B=64..256,
// ~3.5 us per simulation at B=1, mostly pybind call overhead). See
// /work/shared/notes/mcts-speed-on-cpu.md.
//
// Numerical contract (the plain-torch path in mcts/puct.py, select.py and
// backup.py mirrors it, and the visit counts must match exactly):
//   * everything is float32; the double scalars (pb_c_base, pb_c_init,
//     discount) are rounded to float once, as torch does when a Python float
//     meets a float32 tensor;
//   * int32 visit counts are converted to float before use;
//   * pb_c  = pb_c_init + log((parent_visits + pb_c_base + 1) / pb_c_base)
//             evaluated as ((pv + base) + 1) / base;
//   * q     = reward + discount * (value_sum / visit_count)
//   * q_norm= (max_q - min_q > 1e-8) ? (q - min_q) / (max_q - min_q) : 0
//             (0 as well for an unexpanded edge);
//   * u     = ((prior * sqrt(parent_visits)) / (1 + child_visits)) * pb_c
//             i.e. `prior * sqrt_n / (1 + child_visits) * pb_c` left to right;
//   * score = q_norm + u; the first action (ascending) with the largest score
//     wins (strict >), as torch.argmax does. Illegal root actions are skipped;
//     if every root action is illegal, action 0 is returned (argmax of an
//     all -inf row).
// No fused multiply-add may be contracted from these expressions: the
// extension is built without -march flags (baseline x86-64 has no FMA) and,
// for GCC/Clang, fp-contract is switched off below, so every product is
// rounded before the following addition, as separate torch ops do.
// log() may differ from torch's vectorised log by an ulp; that only moves
// pb_c, never the comparison order except on exact near-ties.
// NaN inputs are not supported (std::min/max here do not propagate NaN the
// way torch.minimum/maximum do).

#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <tuple>

#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace {

// Bumped whenever the Python-visible signatures or semantics change, so the
// loader can reject a stale in-place build instead of calling it wrongly.
constexpr int kTreeOpsVersion = 1;

// The loops over B are deliberately serial. Trees are independent, so a
// parallel split would stay deterministic, but on the 2-core target a select
// over 256 full trees of 51 nodes takes ~40 us, the same as at::parallel_for
// with 2 threads measured (the extension is not built with OpenMP, and the
// search's network call is what should have the cores).

void check_tensor(const at::Tensor& t, const char* name, at::ScalarType dtype,
                  int64_t dim) {
  TORCH_CHECK(t.defined(), "tree_ops: `", name, "` is undefined");
  TORCH_CHECK(t.device().is_cpu(), "tree_ops: `", name,
              "` must be a CPU tensor (the C++ tree kernel is CPU-only; use "
              "the torch search path on ",
              t.device(), ")");
  TORCH_CHECK(t.scalar_type() == dtype, "tree_ops: `", name, "` must be ",
              dtype, ", got ", t.scalar_type());
  TORCH_CHECK(t.dim() == dim, "tree_ops: `", name, "` must have ", dim,
              " dimensions, got shape ", t.sizes());
  TORCH_CHECK(t.is_contiguous(), "tree_ops: `", name,
              "` must be contiguous (the kernel walks raw memory)");
}

void check_shape(const at::Tensor& t, const char* name,
                 at::IntArrayRef expected) {
  TORCH_CHECK(t.sizes() == expected, "tree_ops: `", name, "` must have shape ",
              expected, ", got ", t.sizes());
}

// Shared validation of the per-tree arrays; returns (B, N, A).
std::tuple<int64_t, int64_t, int64_t> check_tree(
    const at::Tensor& visit_count, const at::Tensor& value_sum,
    const at::Tensor& children_index, const at::Tensor& children_prior,
    const at::Tensor& children_reward, const at::Tensor& min_q,
    const at::Tensor& max_q) {
  check_tensor(visit_count, "visit_count", at::kInt, 2);
  check_tensor(children_index, "children_index", at::kInt, 3);
  const int64_t B = visit_count.size(0);
  const int64_t N = visit_count.size(1);
  const int64_t A = children_index.size(2);
  TORCH_CHECK(N >= 1 && A >= 1, "tree_ops: empty tree (N=", N, ", A=", A, ")");
  check_tensor(value_sum, "value_sum", at::kFloat, 2);
  check_tensor(children_prior, "children_prior", at::kFloat, 3);
  check_tensor(children_reward, "children_reward", at::kFloat, 3);
  check_tensor(min_q, "min_q", at::kFloat, 1);
  check_tensor(max_q, "max_q", at::kFloat, 1);
  check_shape(value_sum, "value_sum", {B, N});
  check_shape(children_index, "children_index", {B, N, A});
  check_shape(children_prior, "children_prior", {B, N, A});
  check_shape(children_reward, "children_reward", {B, N, A});
  check_shape(min_q, "min_q", {B});
  check_shape(max_q, "max_q", {B});
  return {B, N, A};
}

std::tuple<at::Tensor, at::Tensor> select_leaves(
    const at::Tensor& visit_count, const at::Tensor& value_sum,
    const at::Tensor& children_index, const at::Tensor& children_prior,
    const at::Tensor& children_reward, const at::Tensor& min_q,
    const at::Tensor& max_q, const at::Tensor& root_legal, double pb_c_base,
    double pb_c_init, double discount) {
  const auto [B, N, A] =
      check_tree(visit_count, value_sum, children_index, children_prior,
                 children_reward, min_q, max_q);
  check_tensor(root_legal, "root_legal", at::kBool, 2);
  check_shape(root_legal, "root_legal", {B, A});

  auto leaf_node = at::empty({B}, visit_count.options().dtype(at::kLong));
  auto leaf_action = at::empty({B}, visit_count.options().dtype(at::kLong));

  const int32_t* vc_all = visit_count.data_ptr<int32_t>();
  const float* vs_all = value_sum.data_ptr<float>();
  const int32_t* ci_all = children_index.data_ptr<int32_t>();
  const float* cp_all = children_prior.data_ptr<float>();
  const float* cr_all = children_reward.data_ptr<float>();
  const float* minq_all = min_q.data_ptr<float>();
  const float* maxq_all = max_q.data_ptr<float>();
  const bool* legal_all = root_legal.data_ptr<bool>();
  int64_t* out_node = leaf_node.data_ptr<int64_t>();
  int64_t* out_action = leaf_action.data_ptr<int64_t>();

  const float base = static_cast<float>(pb_c_base);
  const float init = static_cast<float>(pb_c_init);
  const float disc = static_cast<float>(discount);
  // Compared in float: 1e-8f is the float just below 1e-8, so the float and
  // double comparisons agree for every float delta.
  const float eps = 1e-8f;
  const float neg_inf = -std::numeric_limits<float>::infinity();

  {
    // The loop only touches raw memory; let other Python threads (actors,
    // data loaders) run meanwhile.
    pybind11::gil_scoped_release no_gil;
    for (int64_t b = 0; b < B; ++b) {
      const int32_t* vc = vc_all + b * N;
      const float* vs = vs_all + b * N;
      const int32_t* ci = ci_all + b * N * A;
      const float* cp = cp_all + b * N * A;
      const float* cr = cr_all + b * N * A;
      const bool* legal = legal_all + b * A;
      const float minq = minq_all[b];
      const float delta = maxq_all[b] - minq;
      const bool normalise = delta > eps;

      int64_t node = 0;
      int64_t best = 0;
      // A path visits each node at most once; the bound only turns a
      // corrupted (cyclic) tree into an error instead of a hang.
      for (int64_t depth = 0;; ++depth) {
        TORCH_CHECK(depth < N, "tree_ops.select: tree ", b,
                    " has a cycle in children_index");
        const float pv = static_cast<float>(vc[node]);
        const float pb_c = init + std::log((pv + base + 1.0f) / base);
        const float sqrt_n = std::sqrt(pv);
        const int32_t* node_ci = ci + node * A;
        const float* node_cp = cp + node * A;
        const float* node_cr = cr + node * A;
        const bool at_root = node == 0;

        best = 0;
        float best_score = neg_inf;
        for (int64_t a = 0; a < A; ++a) {
          if (at_root && !legal[a]) continue;
          const int32_t child = node_ci[a];
          float q_norm = 0.0f;
          float child_visits = 0.0f;
          if (child >= 0) {
            TORCH_CHECK(child < N, "tree_ops.select: children_index ",
                        child, " out of range [0, ", N, ") in tree ", b);
            const float cv = static_cast<float>(vc[child]);
            const float q = node_cr[a] + disc * (vs[child] / cv);
            if (normalise) q_norm = (q - minq) / delta;
            child_visits = cv;
          }
          const float u =
              node_cp[a] * sqrt_n / (1.0f + child_visits) * pb_c;
          const float score = q_norm + u;
          if (score > best_score) {
            best_score = score;
            best = a;
          }
        }
        const int32_t next = node_ci[best];
        if (next < 0) break;
        TORCH_CHECK(next < N, "tree_ops.select: children_index ", next,
                    " out of range [0, ", N, ") in tree ", b);
        node = next;
      }
      out_node[b] = node;
      out_action[b] = best;
    }
  }
  return {leaf_node, leaf_action};
}

void expand_and_backup(
    const at::Tensor& visit_count, const at::Tensor& value_sum,
    const at::Tensor& parent, const at::Tensor& action_from_parent,
    const at::Tensor& children_index, const at::Tensor& children_prior,
    const at::Tensor& children_reward, const at::Tensor& min_q,
    const at::Tensor& max_q, int64_t node_index, const at::Tensor& leaf_node,
    const at::Tensor& leaf_action, const at::Tensor& reward,
    const at::Tensor& value, const at::Tensor& prior, double discount) {
  const auto [B, N, A] =
      check_tree(visit_count, value_sum, children_index, children_prior,
                 children_reward, min_q, max_q);
  check_tensor(parent, "parent", at::kInt, 2);
  check_tensor(action_from_parent, "action_from_parent", at::kInt, 2);
  check_shape(parent, "parent", {B, N});
  check_shape(action_from_parent, "action_from_parent", {B, N});
  check_tensor(leaf_node, "leaf_node", at::kLong, 1);
  check_tensor(leaf_action, "leaf_action", at::kLong, 1);
  check_tensor(reward, "reward", at::kFloat, 1);
  check_tensor(value, "value", at::kFloat, 1);
  check_tensor(prior, "prior", at::kFloat, 2);
  check_shape(leaf_node, "leaf_node", {B});
  check_shape(leaf_action, "leaf_action", {B});
  check_shape(reward, "reward", {B});
  check_shape(value, "value", {B});
  check_shape(prior, "prior", {B, A});
  // Node 0 is the root, which has no parent edge: the caller initialises it.
  TORCH_CHECK(node_index >= 1 && node_index < N,
              "tree_ops.expand_and_backup: node_index must be in [1, ", N,
              "), got ", node_index);

  int32_t* vc_all = visit_count.data_ptr<int32_t>();
  float* vs_all = value_sum.data_ptr<float>();
  int32_t* par_all = parent.data_ptr<int32_t>();
  int32_t* afp_all = action_from_parent.data_ptr<int32_t>();
  int32_t* ci_all = children_index.data_ptr<int32_t>();
  float* cp_all = children_prior.data_ptr<float>();
  float* cr_all = children_reward.data_ptr<float>();
  float* minq_all = min_q.data_ptr<float>();
  float* maxq_all = max_q.data_ptr<float>();
  const int64_t* leaf_all = leaf_node.data_ptr<int64_t>();
  const int64_t* act_all = leaf_action.data_ptr<int64_t>();
  const float* rew_all = reward.data_ptr<float>();
  const float* val_all = value.data_ptr<float>();
  const float* prior_all = prior.data_ptr<float>();
  const float disc = static_cast<float>(discount);
  const int64_t n = node_index;

  // Validate every tree before writing anything, so a bad call leaves the
  // trees untouched rather than half-updated.
  for (int64_t b = 0; b < B; ++b) {
    const int64_t leaf = leaf_all[b];
    const int64_t act = act_all[b];
    TORCH_CHECK(leaf >= 0 && leaf < N && leaf != n,
                "tree_ops.expand_and_backup: leaf_node[", b, "]=", leaf,
                " must be a node in [0, ", N, ") other than node_index ", n);
    TORCH_CHECK(act >= 0 && act < A, "tree_ops.expand_and_backup: leaf_action[",
                b, "]=", act, " out of range [0, ", A, ")");
    TORCH_CHECK(ci_all[(b * N + leaf) * A + act] < 0,
                "tree_ops.expand_and_backup: edge (node ", leaf, ", action ",
                act, ") of tree ", b, " is already expanded");
  }

  pybind11::gil_scoped_release no_gil;
  for (int64_t b = 0; b < B; ++b) {
    int32_t* vc = vc_all + b * N;
    float* vs = vs_all + b * N;
    int32_t* par = par_all + b * N;
    int32_t* afp = afp_all + b * N;
    int32_t* ci = ci_all + b * N * A;
    float* cp = cp_all + b * N * A;
    float* cr = cr_all + b * N * A;
    const int64_t leaf = leaf_all[b];
    const int64_t act = act_all[b];

    // Expand: link the new node under the selected edge.
    ci[leaf * A + act] = static_cast<int32_t>(n);
    par[n] = static_cast<int32_t>(leaf);
    afp[n] = static_cast<int32_t>(act);
    cr[leaf * A + act] = rew_all[b];
    std::copy_n(prior_all + b * A, A, cp + n * A);

    // Backup: G is the return from each node's own point of view;
    // `discount` carries the sign flip of two-player games.
    float minq = minq_all[b];
    float maxq = maxq_all[b];
    float G = val_all[b];
    int64_t node = n;
    vs[node] += G;
    vc[node] += 1;
    for (int64_t depth = 0; node != 0; ++depth) {
      TORCH_CHECK(depth < N, "tree_ops.expand_and_backup: tree ", b,
                  " has a cycle in parent");
      const int64_t p = par[node];
      const int64_t a = afp[node];
      TORCH_CHECK(p >= 0 && p < N && a >= 0 && a < A,
                  "tree_ops.expand_and_backup: corrupt parent link at node ",
                  node, " of tree ", b);
      const float r = cr[p * A + a];
      // The edge value seen from p, after this backup reached `node`.
      const float q = r + disc * (vs[node] / static_cast<float>(vc[node]));
      minq = std::min(minq, q);
      maxq = std::max(maxq, q);
      G = r + disc * G;
      vs[p] += G;
      vc[p] += 1;
      node = p;
    }
    minq_all[b] = minq;
    maxq_all[b] = maxq;
  }
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() =
      "Batched MCTS tree bookkeeping (select, expand_and_backup) as C++ loops "
      "over the trees; see torchrl_muzero/mcts/_cpp.py for the Python API.";
  m.attr("TREE_OPS_VERSION") = kTreeOpsVersion;
  m.def("select", &select_leaves,
        "Walk every tree from the root to an unexpanded edge by pUCT. "
        "Returns (leaf_node [B] int64, leaf_action [B] int64).",
        pybind11::arg("visit_count"), pybind11::arg("value_sum"),
        pybind11::arg("children_index"), pybind11::arg("children_prior"),
        pybind11::arg("children_reward"), pybind11::arg("min_q"),
        pybind11::arg("max_q"), pybind11::arg("root_legal"),
        pybind11::arg("pb_c_base"), pybind11::arg("pb_c_init"),
        pybind11::arg("discount"));
  m.def("expand_and_backup", &expand_and_backup,
        "Attach node `node_index` under (leaf_node, leaf_action) in every "
        "tree and back its value up to the root, in place.",
        pybind11::arg("visit_count"), pybind11::arg("value_sum"),
        pybind11::arg("parent"), pybind11::arg("action_from_parent"),
        pybind11::arg("children_index"), pybind11::arg("children_prior"),
        pybind11::arg("children_reward"), pybind11::arg("min_q"),
        pybind11::arg("max_q"), pybind11::arg("node_index"),
        pybind11::arg("leaf_node"), pybind11::arg("leaf_action"),
        pybind11::arg("reward"), pybind11::arg("value"),
        pybind11::arg("prior"), pybind11::arg("discount"));
}
