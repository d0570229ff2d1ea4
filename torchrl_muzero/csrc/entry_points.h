// The Python-visible functions the module file (tree_ops.cpp) binds, defined
// in the compute files named below. Only tree_ops.cpp includes pybind11: the
// other translation units see the light ATen / c10 headers of tree_common.h
// (parsing torch/extension.h was most of the kernel's build time:
// docs/performance_search.md, "C++ kernel build time").
//
// The fused searches take their common arguments (the tree, the rules, the
// precision switch) as one FusedCall, built in tree_ops.cpp by
// def_fused_search, and only their network's own arguments after it.
#pragma once

#include <ATen/core/Generator.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "mlp_net.h"  // MZ_HAVE_MLP_SEARCH, kernel_has_fma
#include "rules.h"    // Extra, RuleSpec

namespace tree_ops {

// What every fused search takes besides its network: the checked tree
// arrays (every pointer set), the two rules, tree.extra's tensors and the
// `fma` switch (the Python call's first 13 and last 6 arguments, checked and
// parsed once for every search by tree_ops.cpp's def_fused_search), and the
// search's name for its errors.
struct FusedCall {
  TreeArrays tree;
  RuleSpec root, interior;
  const Extra& extra;
  bool fma;
  const char* who;
};

// root_ops.cpp
std::vector<at::Tensor> start_tree_arrays(const at::Tensor& policy_logits, const at::Tensor& legal,
                                          const at::Tensor& value, int64_t N, double discount);
at::Tensor mix_dirichlet_noise(const at::Tensor& children_prior, const at::Tensor& legal,
                               double alpha, double fraction,
                               std::optional<at::Generator> generator);
std::vector<at::Tensor> visit_readout(const at::Tensor& visit_count, const at::Tensor& value_sum,
                                      const at::Tensor& children_index, double temperature,
                                      std::optional<at::Generator> generator);

#ifdef MZ_HAVE_MLP_SEARCH

// mlp_search.cpp
std::vector<at::Tensor> mlp_recurrent(const std::vector<at::Tensor>& weights,
                                      int64_t num_actions, double reward_eps, double value_eps,
                                      const at::Tensor& latent, const at::Tensor& action,
                                      bool baseline, bool fma);
at::Tensor mlp_unroll(const std::vector<at::Tensor>& weights, int64_t num_actions,
                      double reward_eps, double value_eps, const at::Tensor& latent,
                      const at::Tensor& actions, bool fma);
std::pair<std::vector<std::pair<int64_t, int64_t>>, int64_t> row_chunks_probe(int64_t B,
                                                                              int64_t fail_at);
void mlp_search(const FusedCall& call, const at::Tensor& embeddings,
                const std::vector<at::Tensor>& weights, double reward_eps, double value_eps);
void mlp_search_puct(const at::Tensor& visit_count, const at::Tensor& value_sum,
                     const at::Tensor& parent, const at::Tensor& action_from_parent,
                     const at::Tensor& children_index, const at::Tensor& children_prior,
                     const at::Tensor& children_reward, const at::Tensor& min_q,
                     const at::Tensor& max_q, const at::Tensor& root_legal,
                     const at::Tensor& embeddings, const std::vector<at::Tensor>& weights,
                     double reward_eps, double value_eps, double pb_c_base, double pb_c_init,
                     double discount);

// stochastic_search.cpp
std::vector<at::Tensor> stochastic_recurrent(const std::vector<at::Tensor>& weights,
                                             double reward_eps, double value_eps,
                                             const at::Tensor& latent, const at::Tensor& is_chance,
                                             const at::Tensor& action, double discount,
                                             bool baseline, bool fma);
void stochastic_search(const FusedCall& call, const at::Tensor& latent,
                       const at::Tensor& is_chance, const std::vector<at::Tensor>& weights,
                       double reward_eps, double value_eps, double discount);

// ez_search.cpp
std::vector<at::Tensor> ez_recurrent(const std::vector<at::Tensor>& weights, int64_t num_actions,
                                     double reward_eps, double value_eps, double ln_eps,
                                     int64_t horizon, const at::Tensor& latent,
                                     const at::Tensor& h, const at::Tensor& c,
                                     const at::Tensor& value_prefix, const at::Tensor& steps,
                                     const at::Tensor& action, bool baseline, bool fma);
void ez_search(const FusedCall& call, const at::Tensor& latent, const at::Tensor& lstm_h,
               const at::Tensor& lstm_c, const at::Tensor& value_prefix, const at::Tensor& steps,
               const std::vector<at::Tensor>& weights, double reward_eps, double value_eps,
               double ln_eps, int64_t horizon);

// sampled_search.cpp
std::vector<at::Tensor> sampled_ez_recurrent(
    const std::vector<at::Tensor>& weights, int64_t D, double reward_eps, double value_eps,
    double ln_eps, int64_t horizon, const at::Tensor& latent, const at::Tensor& h,
    const at::Tensor& c, const at::Tensor& value_prefix, const at::Tensor& steps,
    const at::Tensor& action, const at::Tensor& noise, const at::Tensor& low,
    const at::Tensor& high, double sigma, double min_scale, double temperature, double bound,
    bool baseline, bool fma);
void sampled_ez_search(const FusedCall& call, const at::Tensor& latent, const at::Tensor& lstm_h,
                       const at::Tensor& lstm_c, const at::Tensor& value_prefix,
                       const at::Tensor& steps, const at::Tensor& candidates,
                       const std::vector<at::Tensor>& weights, double reward_eps,
                       double value_eps, double ln_eps, int64_t horizon, const at::Tensor& low,
                       const at::Tensor& high, double sigma, double min_scale,
                       double temperature, double bound, std::optional<at::Generator> generator);
void sampled_mlp_search(const FusedCall& call, const at::Tensor& latent,
                        const at::Tensor& candidates, const std::vector<at::Tensor>& weights,
                        double reward_eps, double value_eps, const at::Tensor& low,
                        const at::Tensor& high, double sigma, double min_scale,
                        double temperature, double bound, std::optional<at::Generator> generator);

// unizero_search.cpp
std::vector<at::Tensor> unizero_recurrent(const std::vector<at::Tensor>& weights,
                                          const std::vector<int64_t>& ints,
                                          const std::vector<double>& floats,
                                          const at::Tensor& latents, const at::Tensor& actions,
                                          const at::Tensor& length,
                                          const std::optional<at::Tensor>& kv,
                                          const at::Tensor& action, bool baseline, bool fma);
std::vector<at::Tensor> unizero_root(const std::vector<at::Tensor>& weights,
                                     const std::vector<int64_t>& ints,
                                     const std::vector<double>& floats, const at::Tensor& latents,
                                     const at::Tensor& actions, const at::Tensor& length,
                                     const std::optional<at::Tensor>& kv, bool baseline);
std::vector<at::Tensor> unizero_root_window(const std::vector<at::Tensor>& weights,
                                            const std::vector<int64_t>& ints,
                                            const std::vector<double>& floats,
                                            const at::Tensor& window, const at::Tensor& history,
                                            bool cache);
void unizero_search(const FusedCall& call, const at::Tensor& latents, const at::Tensor& actions,
                    const at::Tensor& length, const std::optional<at::Tensor>& kv,
                    const std::vector<at::Tensor>& weights, const std::vector<int64_t>& ints,
                    const std::vector<double>& floats);

#endif  // MZ_HAVE_MLP_SEARCH

}  // namespace tree_ops
