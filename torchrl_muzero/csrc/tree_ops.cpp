// Tree bookkeeping of the batched MCTS (torchrl_muzero/mcts/tree.py) as plain
// loops over the B trees, and the module: the only file that includes
// pybind11 (it binds every function of entry_points.h here).
//
// Why C++: done as batched torch ops, one depth level of select/backup costs
// ~35 small aten calls, whose dispatch on CPU dominates the search. Here one
// call per simulation walks every tree directly on the tensors' memory (at
// B=1 mostly pybind call overhead). Figures: docs/performance_search.md,
// "Design figures quoted from the code"; whole searches: "The backends,
// MuZero canonical case (pytest benchmark)", benchmarks/test_search_bench.py.
//
// Files:
//   tree_common.h  argument checks, the per-tree view, expand + backup
//                  (the backup's float32 contract), GilRelease;
//   entry_points.h the Python-visible functions of the other files, bound
//                  below;
//   rules.h        pUCT, Stochastic MuZero's chance / stochastic rules and
//                  the one descent select_in_tree<RootRule, InteriorRule>,
//                  with each rule's float32 contract;
//   gumbel_rules.h Gumbel MuZero's root (Sequential Halving) and interior
//                  rules;
//   dispatch.h     rule names and parameter counts, with_rules(): from the
//                  names to the template instantiation;
//   fused_loop.h   fused_search<Search>: every fused search's simulation
//                  loop (select, the network's step, the new nodes' prior,
//                  expand and backup), written once over the network's
//                  Search (gather, step, finish); and for_row_chunks: a
//                  search's trees over torch's threads;
//   mlp_net.*      the fused MLP search's network step;
//   mlp_kernels.h  the vector kernels every fused network uses (linear layer,
//                  support decode, exp);
//   mlp_search.cpp the MLP's Search and entry point;
//   stochastic_net.*, stochastic_search.cpp
//                  the same for Stochastic MuZero's two-kind step;
//   ez_net.*       EfficientZero's value-prefix step (LSTM, LayerNorm);
//   ez_search.cpp  the EfficientZero Search;
//   sampled_search.cpp
//                  the sampled search over a box on EfficientZero's or
//                  MuZero's MLP step: the K candidates of every new node
//                  drawn in the kernel;
//   unizero_net.*, unizero_search.cpp
//                  UniZero's transformer step (per-node KV cache or full
//                  recompute) and its Search.
//
// `select` and `mlp_search` take the two rules by name plus their float
// parameters (mcts/rules.py's `cpp_rule` / `cpp_params`) and the tensors of
// tree.extra, and run the template instantiation for that pair. The
// plain-torch path (mcts/puct.py, select.py, backup.py and the rules'
// modules) mirrors the contracts, so both pick the same leaves.

#include <ATen/ops/empty.h>
#include <torch/csrc/utils/pybind.h>  // pybind11 with ATen's type casters

#include <new>

#include "dispatch.h"
#include "entry_points.h"
#include "fused_loop.h"
#include "gumbel_readout.h"

namespace tree_ops {
namespace {

// The loops over B are deliberately serial. Trees are independent, so a
// parallel split would stay deterministic, but on the 2-core target a select
// over 256 full trees of 51 nodes took as long serial as with at::parallel_for
// on 2 threads (docs/performance_search.md, "Design figures quoted from the
// code"; the extension is not built with OpenMP, and the search's network
// call is what should have the cores).

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
    GilRelease no_gil;
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

  GilRelease no_gil;
  for (int64_t b = 0; b < B; ++b) {
    expand_and_backup_in_tree(row(t, b), n, leaf_all[b], act_all[b],
                              rew_all[b], val_all[b], prior_all + b * A,
                              disc_all == nullptr ? nullptr : disc_all + b);
  }
}

}  // namespace
}  // namespace tree_ops

namespace tree_ops {

// Defined in tree_common.h, for the compute files: pybind11's GIL release
// held in place.
GilRelease::GilRelease() {
  static_assert(sizeof(pybind11::gil_scoped_release) <= sizeof(state_) &&
                    alignof(pybind11::gil_scoped_release) <= alignof(void*),
                "GilRelease::state_ too small for pybind11::gil_scoped_release");
  new (state_) pybind11::gil_scoped_release();
}

GilRelease::~GilRelease() {
  std::launder(reinterpret_cast<pybind11::gil_scoped_release*>(state_))->~gil_scoped_release();
}

namespace {

#ifdef MZ_HAVE_MLP_SEARCH

// Binds a fused search `search(const FusedCall&, Net...)` as the Python
// function `name`(the 13 tree arrays of `_cpp._fused_tree_arrays`, the
// network's arguments `net_args` (its py::args, in the order of Net...),
// root_rule, root_params, interior_rule, interior_params, extra={},
// fma=False). The tree and the rules are checked and parsed here, once for
// every search, into the FusedCall the search receives.
template <class... Net, class... NetPyArgs>
void def_fused_search(pybind11::module_& m, const char* name,
                      void (*search)(const FusedCall&, Net...), const char* doc,
                      const NetPyArgs&... net_args) {
  namespace py = pybind11;
  m.def(
      name,
      [search, name](const at::Tensor& visit_count, const at::Tensor& value_sum,
                     const at::Tensor& parent, const at::Tensor& action_from_parent,
                     const at::Tensor& children_index, const at::Tensor& children_prior,
                     const at::Tensor& children_reward, const at::Tensor& children_discount,
                     const at::Tensor& children_logits, const at::Tensor& raw_value,
                     const at::Tensor& min_q, const at::Tensor& max_q,
                     const at::Tensor& root_legal, Net... net, const std::string& root_rule,
                     const std::vector<double>& root_params, const std::string& interior_rule,
                     const std::vector<double>& interior_params, const Extra& extra, bool fma) {
        TreeArrays t = check_tree(visit_count, value_sum, children_index, children_prior,
                                  children_reward, children_discount, min_q, max_q);
        check_links(t, parent, action_from_parent);
        check_descent_inputs(t, root_legal, children_logits, raw_value);
        search(FusedCall{t, parse_rule(root_rule, root_params, true),
                         parse_rule(interior_rule, interior_params, false), extra, fma, name},
               net...);
      },
      doc, py::arg("visit_count"), py::arg("value_sum"), py::arg("parent"),
      py::arg("action_from_parent"), py::arg("children_index"), py::arg("children_prior"),
      py::arg("children_reward"), py::arg("children_discount"), py::arg("children_logits"),
      py::arg("raw_value"), py::arg("min_q"), py::arg("max_q"), py::arg("root_legal"),
      net_args..., py::arg("root_rule"), py::arg("root_params"), py::arg("interior_rule"),
      py::arg("interior_params"), py::arg("extra") = Extra{}, py::arg("fma") = false);
}

#endif  // MZ_HAVE_MLP_SEARCH

// The registrations of the functions of entry_points.h (and of
// gumbel_readout.h), one per compute file; without GCC/Clang vector
// extensions the module has no fused search.
void register_gumbel_readout(pybind11::module_& m) {
  namespace py = pybind11;
  m.def("gumbel_readout", &gumbel_readout,
        "Gumbel MuZero's result of finished trees: [visit_counts [B, A] "
        "int32, improved policy [B, A], root value [B], action [B] int64] "
        "(params: value_scale, maxvisit_init, rescale_values).",
        py::arg("visit_count"), py::arg("value_sum"),
        py::arg("children_index"), py::arg("children_prior"),
        py::arg("children_reward"), py::arg("children_discount"),
        py::arg("children_logits"), py::arg("raw_value"), py::arg("min_q"),
        py::arg("max_q"), py::arg("root_legal"), py::arg("gumbel"),
        py::arg("params"));
}

void register_root_ops(pybind11::module_& m) {
  namespace py = pybind11;
  m.def("start_tree_arrays", &start_tree_arrays,
        "A fresh tree's arrays with the root written, as mcts/loop.py::start_tree (without the "
        "node states): [visit_count, value_sum, parent, action_from_parent, children_index, "
        "children_prior, children_reward, min_q, max_q, root_legal, raw_value, children_logits, "
        "children_discount].",
        py::arg("policy_logits"), py::arg("legal"), py::arg("value"), py::arg("num_nodes"),
        py::arg("discount"));
  m.def("mix_dirichlet_noise", &mix_dirichlet_noise,
        "Mix Dirichlet(alpha) noise over the legal actions into the root priors "
        "children_prior[:, 0] in place, as mcts/search.py does in torch (the same draws from "
        "`generator`, bit for bit). Returns the noise [B, A].",
        py::arg("children_prior"), py::arg("legal"), py::arg("alpha"), py::arg("fraction"),
        py::arg("generator") = py::none());
  m.def("visit_readout", &visit_readout,
        "MuZero's readout of finished trees, as mcts/search.py::visit_result: [visit_counts, "
        "search_policy, root_value, action] (the action drawn with `temperature` from "
        "`generator`, bit for bit the torch code's).",
        py::arg("visit_count"), py::arg("value_sum"), py::arg("children_index"),
        py::arg("temperature"), py::arg("generator") = py::none());
}

#ifdef MZ_HAVE_MLP_SEARCH

void register_mlp(pybind11::module_& m) {
  namespace py = pybind11;
  register_gumbel_readout(m);  // Gumbel's result after the fused search
  def_fused_search(m, "mlp_search", &mlp_search,
                   "Run every simulation of a search for MuZeroMLPModel (one hidden "
                   "layer) on a fresh tree whose root is initialised, in place, "
                   "descending with the named root and interior rules (`fma`: the "
                   "opt-in FMA network path where the CPU has it).",
                   py::arg("embeddings"), py::arg("weights"), py::arg("reward_eps"),
                   py::arg("value_eps"));
  m.def("mlp_search", &mlp_search_puct,
        "Version-1 form: pUCT everywhere with (pb_c_base, pb_c_init) and one "
        "discount for every edge.",
        py::arg("visit_count"), py::arg("value_sum"), py::arg("parent"),
        py::arg("action_from_parent"), py::arg("children_index"),
        py::arg("children_prior"), py::arg("children_reward"),
        py::arg("min_q"), py::arg("max_q"), py::arg("root_legal"),
        py::arg("embeddings"), py::arg("weights"), py::arg("reward_eps"),
        py::arg("value_eps"), py::arg("pb_c_base"), py::arg("pb_c_init"),
        py::arg("discount"));
  m.def("mlp_recurrent", &mlp_recurrent,
        "Test hook: the fused search's network step for a batch of latents "
        "(`baseline`: force the 4-wide build instead of the AVX2 one; `fma`: "
        "the FMA copy where the CPU has it). "
        "Returns [next_latent, reward, policy_logits, value, prior].",
        py::arg("weights"), py::arg("num_actions"), py::arg("reward_eps"),
        py::arg("value_eps"), py::arg("latent"), py::arg("action"),
        py::arg("baseline") = false, py::arg("fma") = false);
  m.def("mlp_unroll", &mlp_unroll,
        "Benchmark hook: actions.size(0) chained network steps without a "
        "tree. Returns the last latent.",
        py::arg("weights"), py::arg("num_actions"), py::arg("reward_eps"),
        py::arg("value_eps"), py::arg("latent"), py::arg("actions"),
        py::arg("fma") = false);
  m.def("row_chunks_probe", &row_chunks_probe,
        "Test hook: ([(b0, b1), ...], distinct threads) of the fused "
        "searches' split of B trees; fail_at >= 0 throws in that row's chunk.",
        py::arg("B"), py::arg("fail_at") = -1);
  m.def("search_threads_on_torch_team", &search_threads_on_torch_team,
        "Whether the fused searches split their trees on torch's OpenMP "
        "team (the extension is linked against torch's runtime) or on "
        "threads of their own.");
  m.def("kernel_has_fma", &kernel_has_fma,
        "Whether the fused searches' `fma=True` runs their FMA network path "
        "on this CPU (x86 with AVX2 and FMA); elsewhere it runs the exact one.");
}

void register_stochastic(pybind11::module_& m) {
  namespace py = pybind11;
  def_fused_search(m, "stochastic_search", &stochastic_search,
                   "Run every simulation of a Stochastic MuZero search for "
                   "StochasticMuZeroMLPModel (one hidden layer) on a fresh tree whose "
                   "root is initialised, in place, descending with the named root and "
                   "interior rules (`fma`: the opt-in FMA network path where the CPU "
                   "has it).",
                   py::arg("latent"), py::arg("is_chance"), py::arg("weights"),
                   py::arg("reward_eps"), py::arg("value_eps"), py::arg("discount"));
  m.def("stochastic_recurrent", &stochastic_recurrent,
        "Test hook: the fused Stochastic MuZero search's network step "
        "(model.search_step) for a batch (`baseline`: force the 4-wide "
        "build; `fma`: the FMA copy where the CPU has it). Returns "
        "[new_latent, reward, logits, value, prior, edge_discount].",
        py::arg("weights"), py::arg("reward_eps"), py::arg("value_eps"),
        py::arg("latent"), py::arg("is_chance"), py::arg("action"),
        py::arg("discount"), py::arg("baseline") = false,
        py::arg("fma") = false);
}

void register_ez(pybind11::module_& m) {
  namespace py = pybind11;
  def_fused_search(m, "ez_search", &ez_search,
                   "Run every simulation of a search for EfficientZeroMLPModel (one "
                   "hidden layer, value-prefix LSTM) on a fresh tree whose root is "
                   "initialised, in place, descending with the named rules.",
                   py::arg("latent"), py::arg("lstm_h"), py::arg("lstm_c"),
                   py::arg("value_prefix"), py::arg("steps"), py::arg("weights"),
                   py::arg("reward_eps"), py::arg("value_eps"), py::arg("layer_norm_eps"),
                   py::arg("lstm_horizon_len"));
  m.def("ez_recurrent", &ez_recurrent,
        "Test hook: the fused EfficientZero search's network step "
        "(search_step) for a batch of states (`baseline`: force the 4-wide "
        "build). Returns [next_latent, lstm_h, lstm_c, value_prefix, steps, "
        "reward, policy_logits, value, prior].",
        py::arg("weights"), py::arg("num_actions"), py::arg("reward_eps"),
        py::arg("value_eps"), py::arg("layer_norm_eps"),
        py::arg("lstm_horizon_len"), py::arg("latent"), py::arg("lstm_h"),
        py::arg("lstm_c"), py::arg("value_prefix"), py::arg("steps"),
        py::arg("action"), py::arg("baseline") = false, py::arg("fma") = false);
}

void register_sampled(pybind11::module_& m) {
  namespace py = pybind11;
  def_fused_search(m, "sampled_ez_search", &sampled_ez_search,
                   "Run every simulation of a sampled search over a box for "
                   "SampledModel(EfficientZeroMLPModel(action_dim=D)) on a fresh tree whose "
                   "root (state, K candidates, noised prior) is initialised, in place: each "
                   "new node's K candidates drawn from its tanh-normal policy with "
                   "`generator`, the draws of the torch path's N - 1 randn [B, K, D] calls.",
                   py::arg("latent"), py::arg("lstm_h"), py::arg("lstm_c"),
                   py::arg("value_prefix"), py::arg("steps"), py::arg("candidate_actions"),
                   py::arg("weights"), py::arg("reward_eps"), py::arg("value_eps"),
                   py::arg("layer_norm_eps"), py::arg("lstm_horizon_len"), py::arg("low"),
                   py::arg("high"), py::arg("sigma"), py::arg("min_scale"),
                   py::arg("temperature"), py::arg("bound"), py::arg("generator"));
  def_fused_search(m, "sampled_mlp_search", &sampled_mlp_search,
                   "sampled_ez_search for SampledModel(MuZeroMLPModel(action_dim=D)) (one hidden "
                   "layer): the node state is the latent [B, N, L] and the candidates.",
                   py::arg("latent"), py::arg("candidate_actions"), py::arg("weights"),
                   py::arg("reward_eps"), py::arg("value_eps"), py::arg("low"), py::arg("high"),
                   py::arg("sigma"), py::arg("min_scale"), py::arg("temperature"),
                   py::arg("bound"), py::arg("generator"));
  m.def("sampled_ez_recurrent", &sampled_ez_recurrent,
        "Test hook: the fused sampled search's step (SampledModel.search_step) along "
        "float actions [B, D], the children's K candidates from `noise` [B, K, D]. "
        "Returns [next_latent, lstm_h, lstm_c, value_prefix, steps, reward, "
        "policy_params, value, candidates].",
        py::arg("weights"), py::arg("D"), py::arg("reward_eps"), py::arg("value_eps"),
        py::arg("layer_norm_eps"), py::arg("lstm_horizon_len"), py::arg("latent"),
        py::arg("lstm_h"), py::arg("lstm_c"), py::arg("value_prefix"), py::arg("steps"),
        py::arg("action"), py::arg("noise"), py::arg("low"), py::arg("high"),
        py::arg("sigma"), py::arg("min_scale"), py::arg("temperature"), py::arg("bound"),
        py::arg("baseline") = false, py::arg("fma") = false);
}

void register_unizero(pybind11::module_& m) {
  namespace py = pybind11;
  def_fused_search(m, "unizero_search", &unizero_search,
                   "Run every simulation of a search for UniZeroModel (transformer world model; "
                   "with `kv`, the exact per-node KV cache, each node's buffer holding its own "
                   "slots only, else a full recompute per step) on a fresh tree whose root is "
                   "initialised, in place, descending with the named rules (`fma`: the opt-in "
                   "FMA path of the expansions' linear layers and decodes where the CPU has it).",
                   py::arg("latents"), py::arg("actions"), py::arg("length"), py::arg("kv"),
                   py::arg("weights"), py::arg("ints"), py::arg("floats"));
  m.def("unizero_root", &unizero_root,
        "The roots of UniZeroModel.root_from_latents (a full forward over each packed window; "
        "`kv` None: no cache). Returns [policy_logits, value].",
        py::arg("weights"), py::arg("ints"), py::arg("floats"), py::arg("latents"),
        py::arg("actions"), py::arg("length"), py::arg("kv"), py::arg("baseline") = false);
  m.def("unizero_root_window", &unizero_root_window,
        "UniZeroModel.root_from_latents for full history windows (no packing needed): the "
        "root node states and unizero_root's outputs in one call. Returns [latents, actions, "
        "length, kv (undefined without `cache`), policy_logits, value].",
        py::arg("weights"), py::arg("ints"), py::arg("floats"), py::arg("window"),
        py::arg("history"), py::arg("cache"));
  m.def("unizero_recurrent", &unizero_recurrent,
        "Test hook: the fused UniZero search's network step (search_step) for a batch of "
        "states (`kv` None: recompute mode; `baseline`: force the 4-wide build; `fma`: the "
        "FMA copy where the CPU has it). Returns "
        "[latents, actions, length, kv, reward, policy_logits, value, prior].",
        py::arg("weights"), py::arg("ints"), py::arg("floats"), py::arg("latents"),
        py::arg("actions"), py::arg("length"), py::arg("kv"), py::arg("action"),
        py::arg("baseline") = false, py::arg("fma") = false);
}

#else  // no GCC/Clang vector extensions: the module has no fused search

void register_mlp(pybind11::module_& m) { register_gumbel_readout(m); }
void register_stochastic(pybind11::module_&) {}
void register_ez(pybind11::module_&) {}
void register_unizero(pybind11::module_&) {}
void register_sampled(pybind11::module_&) {}

#endif  // MZ_HAVE_MLP_SEARCH

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
  tree_ops::register_sampled(m);
  tree_ops::register_root_ops(m);
}
