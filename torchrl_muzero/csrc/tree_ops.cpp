// Tree bookkeeping of the batched MCTS (torchrl_muzero/mcts/tree.py) as plain
// loops over the B trees: the Python-visible entry points and the module.
//
// Why C++: done as batched torch ops, one depth level of select/backup costs
// ~35 small aten calls (3-6 us of dispatch each on CPU), which dominates the
// search. Here one call per simulation walks every tree directly on the
// tensors' memory (select + backup ~0.2 us per tree per simulation at B=64..256,
// ~3.5 us per simulation at B=1, mostly pybind call overhead). Measured in
// docs/performance.md ("Search"), with benchmarks/test_search_bench.py.
//
// Files:
//   tree_common.h  argument checks, the per-tree view, expand + backup
//                  (the backup's float32 contract);
//   rules.h        pUCT, Stochastic MuZero's chance / stochastic rules and
//                  the one descent select_in_tree<RootRule, InteriorRule>,
//                  with each rule's float32 contract;
//   gumbel_rules.h Gumbel MuZero's root (Sequential Halving) and interior
//                  rules;
//   dispatch.h     rule names and parameter counts, with_rules(): from the
//                  names to the template instantiation;
//   mlp_net.*      the fused MLP search's network step;
//   mlp_kernels.h  the vector kernels every fused network uses (linear layer,
//                  support decode, exp);
//   mlp_search.cpp the fused search (reuses select_in_tree and the backup);
//   fused_loop.h   the simulation loop every fused search shares, and
//                  for_row_chunks: a search's trees over torch's threads;
//   stochastic_net.*, stochastic_search.cpp
//                  the same for Stochastic MuZero's two-kind step;
//   ez_net.*       EfficientZero's value-prefix step (LSTM, LayerNorm);
//   ez_search.cpp  the fused EfficientZero search;
//   unizero_net.*, unizero_search.cpp
//                  UniZero's transformer step (per-node KV cache or full
//                  recompute) and its fused search.
//
// `select` and `mlp_search` take the two rules by name plus their float
// parameters (mcts/rules.py's `cpp_rule` / `cpp_params`) and the tensors of
// tree.extra, and run the template instantiation for that pair. The
// plain-torch path (mcts/puct.py, select.py, backup.py and the rules'
// modules) mirrors the contracts, so both pick the same leaves.

#include "dispatch.h"

namespace tree_ops {

// Defined in mlp_search.cpp, stochastic_search.cpp, ez_search.cpp and
// unizero_search.cpp (empty
// without GCC/Clang vector extensions).
void register_mlp(pybind11::module_& m);
void register_stochastic(pybind11::module_& m);
void register_ez(pybind11::module_& m);
void register_unizero(pybind11::module_& m);
void register_root_ops(pybind11::module_& m);

namespace {

// The loops over B are deliberately serial. Trees are independent, so a
// parallel split would stay deterministic, but on the 2-core target a select
// over 256 full trees of 51 nodes takes ~40 us, the same as at::parallel_for
// with 2 threads measured (the extension is not built with OpenMP, and the
// search's network call is what should have the cores).

std::tuple<at::Tensor, at::Tensor> select_leaves(
    const at::Tensor& visit_count, const at::Tensor& value_sum,
    const at::Tensor& children_index, const at::Tensor& children_prior,
    const at::Tensor& children_reward, const at::Tensor& children_discount,
    const at::Tensor& children_logits, const at::Tensor& raw_value,
    const at::Tensor& min_q, const at::Tensor& max_q,
    const at::Tensor& root_legal, const std::string& root_rule,
    const std::vector<double>& root_params, const std::string& interior_rule,
    const std::vector<double>& interior_params, const Extra& extra) {
  TreeArrays t = check_tree(visit_count, value_sum, children_index,
                            children_prior, children_reward,
                            children_discount, min_q, max_q);
  check_descent_inputs(t, root_legal, children_logits, raw_value);
  const RuleSpec root = parse_rule(root_rule, root_params, true);
  const RuleSpec interior = parse_rule(interior_rule, interior_params, false);

  const int64_t B = t.B;
  auto leaf_node = at::empty({B}, visit_count.options().dtype(at::kLong));
  auto leaf_action = at::empty({B}, visit_count.options().dtype(at::kLong));
  int64_t* out_node = leaf_node.data_ptr<int64_t>();
  int64_t* out_action = leaf_action.data_ptr<int64_t>();

  with_rules(root, interior, t, extra, [&](const auto& rr, const auto& ir) {
    // The loop only touches raw memory; let other Python threads (actors,
    // data loaders) run meanwhile.
    pybind11::gil_scoped_release no_gil;
    for (int64_t b = 0; b < B; ++b) {
      const Leaf leaf = select_in_tree(row(t, b), rr, ir);
      out_node[b] = leaf.node;
      out_action[b] = leaf.action;
    }
  });
  return {leaf_node, leaf_action};
}

void expand_and_backup(
    const at::Tensor& visit_count, const at::Tensor& value_sum,
    const at::Tensor& parent, const at::Tensor& action_from_parent,
    const at::Tensor& children_index, const at::Tensor& children_prior,
    const at::Tensor& children_reward, const at::Tensor& children_discount,
    const at::Tensor& min_q, const at::Tensor& max_q, int64_t node_index,
    const at::Tensor& leaf_node, const at::Tensor& leaf_action,
    const at::Tensor& reward, const at::Tensor& value, const at::Tensor& prior,
    const std::optional<at::Tensor>& edge_discount) {
  TreeArrays t = check_tree(visit_count, value_sum, children_index,
                            children_prior, children_reward,
                            children_discount, min_q, max_q);
  check_links(t, parent, action_from_parent);
  const int64_t B = t.B, N = t.N, A = t.A;
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
  const float* disc_all = nullptr;
  if (edge_discount.has_value() && edge_discount->defined()) {
    check_tensor(*edge_discount, "edge_discount", at::kFloat, 1);
    check_shape(*edge_discount, "edge_discount", {B});
    disc_all = edge_discount->data_ptr<float>();
  }
  // Node 0 is the root, which has no parent edge: the caller initialises it.
  TORCH_CHECK(node_index >= 1 && node_index < N,
              "tree_ops.expand_and_backup: node_index must be in [1, ", N,
              "), got ", node_index);

  const int64_t* leaf_all = leaf_node.data_ptr<int64_t>();
  const int64_t* act_all = leaf_action.data_ptr<int64_t>();
  const float* rew_all = reward.data_ptr<float>();
  const float* val_all = value.data_ptr<float>();
  const float* prior_all = prior.data_ptr<float>();
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
    TORCH_CHECK(t.ci[(b * N + leaf) * A + act] < 0,
                "tree_ops.expand_and_backup: edge (node ", leaf, ", action ",
                act, ") of tree ", b, " is already expanded");
  }

  pybind11::gil_scoped_release no_gil;
  for (int64_t b = 0; b < B; ++b) {
    expand_and_backup_in_tree(row(t, b), n, leaf_all[b], act_all[b],
                              rew_all[b], val_all[b], prior_all + b * A,
                              disc_all == nullptr ? nullptr : disc_all + b);
  }
}

}  // namespace
}  // namespace tree_ops

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  namespace py = pybind11;
  using tree_ops::Extra;
  m.doc() =
      "Batched MCTS tree bookkeeping (select, expand_and_backup, the fused "
      "MLP search) as C++ loops over the trees; see "
      "torchrl_muzero/mcts/_cpp.py for the Python API.";
  m.attr("TREE_OPS_VERSION") = tree_ops::kTreeOpsVersion;
  m.attr("ROOT_RULES") = py::tuple(py::cast(tree_ops::rule_names(true)));
  m.attr("INTERIOR_RULES") =
      py::tuple(py::cast(tree_ops::rule_names(false)));
  m.def("select", &tree_ops::select_leaves,
        "Walk every tree from the root to an unexpanded edge, choosing with "
        "`root_rule` at the root and `interior_rule` below it (names from "
        "ROOT_RULES / INTERIOR_RULES, float parameters, tree.extra's "
        "tensors). Returns (leaf_node [B] int64, leaf_action [B] int64).",
        py::arg("visit_count"), py::arg("value_sum"),
        py::arg("children_index"), py::arg("children_prior"),
        py::arg("children_reward"), py::arg("children_discount"),
        py::arg("children_logits"), py::arg("raw_value"), py::arg("min_q"),
        py::arg("max_q"), py::arg("root_legal"), py::arg("root_rule"),
        py::arg("root_params"), py::arg("interior_rule"),
        py::arg("interior_params"), py::arg("extra") = Extra{});
  m.def("expand_and_backup", &tree_ops::expand_and_backup,
        "Attach node `node_index` under (leaf_node, leaf_action) in every "
        "tree and back its value up to the root with each edge's "
        "children_discount, in place; `edge_discount` [B] (optional) is "
        "written as the new edge's discount first.",
        py::arg("visit_count"), py::arg("value_sum"), py::arg("parent"),
        py::arg("action_from_parent"), py::arg("children_index"),
        py::arg("children_prior"), py::arg("children_reward"),
        py::arg("children_discount"), py::arg("min_q"), py::arg("max_q"),
        py::arg("node_index"), py::arg("leaf_node"), py::arg("leaf_action"),
        py::arg("reward"), py::arg("value"), py::arg("prior"),
        py::arg("edge_discount") = py::none());
  tree_ops::register_mlp(m);
  tree_ops::register_stochastic(m);
  tree_ops::register_ez(m);
  tree_ops::register_unizero(m);
  tree_ops::register_root_ops(m);
}
