// The simulation loop every fused search shares (mlp_search.cpp,
// stochastic_search.cpp, ez_search.cpp): the searches differ only in their
// network step and in what a node stores, not in how simulations proceed.
#pragma once

#include "mlp_net.h"
#include "rules.h"

// The tree arrays every fused search takes first, as pybind11 keyword names (in
// the order of `_cpp._fused_tree_arrays`), for the searches' m.def calls.
#define MZ_FUSED_TREE_PY_ARGS                                                     \
  py::arg("visit_count"), py::arg("value_sum"), py::arg("parent"),                \
      py::arg("action_from_parent"), py::arg("children_index"),                   \
      py::arg("children_prior"), py::arg("children_reward"),                      \
      py::arg("children_discount"), py::arg("children_logits"),                   \
      py::arg("raw_value"), py::arg("min_q"), py::arg("max_q"), py::arg("root_legal")

#ifdef MZ_HAVE_MLP_SEARCH

namespace tree_ops {

// Simulation n (1..N-1) creates node n of every tree. Trees go in groups of
// kGroup rows: one leaf per tree is selected with the rule pair,
// `gather(s, b, leaf, n)` points row s of the network's batch at the leaf's
// stored state and at node n's storage, `step(rows)` runs the network once
// for the group, and `finish(s, b, r, leaf, n)` writes node n's own data and
// backs it up (expand_and_backup_in_tree). The GIL is the caller's business.
template <class RootRule, class InteriorRule, class Gather, class Step, class Finish>
void run_fused_simulations(const TreeArrays& t, const RootRule& rr, const InteriorRule& ir,
                           Gather&& gather, Step&& step, Finish&& finish) {
  Leaf leaf[kGroup];
  for (int64_t n = 1; n < t.N; ++n) {
    for (int64_t g = 0; g < t.B; g += kGroup) {
      const int64_t rows = std::min(kGroup, t.B - g);
      for (int64_t s = 0; s < rows; ++s) {
        leaf[s] = select_in_tree(row(t, g + s), rr, ir);
        gather(s, g + s, leaf[s], n);
      }
      step(rows);
      for (int64_t s = 0; s < rows; ++s) finish(s, g + s, row(t, g + s), leaf[s], n);
    }
  }
}

}  // namespace tree_ops

#endif  // MZ_HAVE_MLP_SEARCH
