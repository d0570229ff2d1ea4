// The search's per-root work around the simulations, each in one C++ call:
// a fresh tree's arrays with the root written (mcts/loop.py::start_tree), the
// root's Dirichlet noise mixed into its priors (mcts/noise.py) and MuZero's
// readout of a finished tree (mcts/search.py::visit_result).
// ---------------------------------------------------------------------------
// Why: at B = 1 the Python around a fused search's simulations cost about as
// much as they do, ~18 small torch ops for the tree, ~25 for the noise (a
// rejection loop of torch ops then; now ATen's _standard_gamma) and ~20 for
// the readout among it (each op slower through Python than from here, and
// less of the cache evicted between searches; figures:
// docs/performance_search.md, "Design figures quoted from the code").
// Contract: the results are bit for bit the Python functions'. The random
// draws and every op whose float result could depend on the implementation
// (log, pow, softmax, multinomial, argmax, the noise's arithmetic) are the
// same ATen ops, in the same order, with the same generator, as the Python
// code; only exact work (fills, copies, masking to -inf, gathering visit
// counts) and correctly rounded float32 divisions run as plain loops. test: the Python functions
// stay, and test/test_root_ops.py compares them.
// Bound in tree_ops.cpp; the ATen ops come from their own light headers.
#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/_standard_gamma.h>
#include <ATen/ops/argmax.h>
#include <ATen/ops/clamp_min.h>
#include <ATen/ops/div.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/log.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/multinomial.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/sum.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include "entry_points.h"

namespace tree_ops {

using Gen = std::optional<at::Generator>;

// mcts/search.py's root noise: prior[:, 0] = (1 - f) * prior + f * Dirichlet(alpha)
// over the legal actions (noise.py::sample_dirichlet), in place. Returns the noise.
at::Tensor mix_dirichlet_noise(const at::Tensor& children_prior, const at::Tensor& legal,
                               double alpha, double fraction, Gen generator) {
  TORCH_CHECK(children_prior.dim() == 3 && legal.dim() == 2 && legal.scalar_type() == at::kBool,
              "mix_dirichlet_noise: children_prior [B, N, A] and legal [B, A] bool expected");
  const at::TensorOptions opts = at::TensorOptions().device(legal.device());  // the default dtype
  // noise.py::sample_dirichlet, op for op: the Gamma variates from ATen's _standard_gamma with the
  // search's generator, so both paths draw the same noise.
  at::Tensor gamma = at::mul(at::_standard_gamma(at::full(legal.sizes(), alpha, opts), generator), legal);
  at::Tensor noise = at::div(gamma, at::clamp_min(at::sum(gamma, {-1}, true), 1e-30));
  at::Tensor root = children_prior.select(1, 0);
  root.mul_(1.0 - fraction).add_(noise.mul_(fraction));
  return noise;
}

// mcts/search.py::visit_result: (visit_counts int32 [B, A], search_policy
// [B, A], root_value [B], action int64 [B]) of finished trees.
std::vector<at::Tensor> visit_readout(const at::Tensor& visit_count, const at::Tensor& value_sum,
                                      const at::Tensor& children_index, double temperature,
                                      Gen generator) {
  TORCH_CHECK(visit_count.dim() == 2 && visit_count.scalar_type() == at::kInt &&
                  visit_count.is_contiguous() && visit_count.device().is_cpu(),
              "visit_readout: visit_count must be a contiguous int32 CPU [B, N] tensor");
  TORCH_CHECK(value_sum.sizes() == visit_count.sizes() && value_sum.scalar_type() == at::kFloat &&
                  value_sum.is_contiguous(),
              "visit_readout: value_sum must be a contiguous float32 [B, N] tensor");
  TORCH_CHECK(children_index.dim() == 3 && children_index.size(0) == visit_count.size(0) &&
                  children_index.size(1) == visit_count.size(1) &&
                  children_index.scalar_type() == at::kInt && children_index.is_contiguous(),
              "visit_readout: children_index must be a contiguous int32 [B, N, A] tensor");
  const int64_t B = visit_count.size(0), N = visit_count.size(1), A = children_index.size(2);
  const int32_t* vc = visit_count.data_ptr<int32_t>();
  const float* vs = value_sum.data_ptr<float>();
  const int32_t* ci = children_index.data_ptr<int32_t>();
  at::Tensor counts = at::empty({B, A}, visit_count.options());
  at::Tensor policy = at::empty({B, A}, value_sum.options());
  at::Tensor root_value = at::empty({B}, value_sum.options());
  int32_t* cnt = counts.data_ptr<int32_t>();
  float* pol = policy.data_ptr<float>();
  float* rv = root_value.data_ptr<float>();
  for (int64_t b = 0; b < B; ++b) {
    // child_visits(tree, 0), then counts / counts.sum().clamp_min(1): whole
    // numbers, so the float sum is the integer sum and each division is one
    // correctly rounded float32 division, as torch's.
    float total = 0.0f;
    for (int64_t a = 0; a < A; ++a) {
      const int32_t child = ci[(b * N) * A + a];
      cnt[b * A + a] = child < 0 ? 0 : vc[b * N + child];
      total += static_cast<float>(cnt[b * A + a]);
    }
    total = std::max(total, 1.0f);
    for (int64_t a = 0; a < A; ++a) pol[b * A + a] = static_cast<float>(cnt[b * A + a]) / total;
    rv[b] = vs[b * N] / static_cast<float>(std::max(vc[b * N], int32_t{1}));
  }
  at::Tensor action;
  if (temperature == 0) {
    action = at::argmax(counts, -1);
  } else {  // select_action: softmax(log(counts) / T), one multinomial draw
    at::Tensor logits = at::log(counts.to(at::kFloat));
    if (temperature != 1) logits = at::div(logits, temperature);
    action = at::multinomial(at::softmax(logits, -1), 1, false, generator).squeeze(-1);
  }
  return {counts, policy, root_value, action};
}

// mcts/loop.py::start_tree without the node states: the 13 arrays of
// tree.py::allocate_tree ([B, N] / [B, N, A] / [B] / [B, A], in
// the order of mcts/loop.py's _TREE_ARRAYS) with the root written: root_legal = legal, the root's
// logits masked to -inf where illegal, its prior their softmax (the ATen op),
// its raw value.
std::vector<at::Tensor> start_tree_arrays(const at::Tensor& policy_logits, const at::Tensor& legal,
                                          const at::Tensor& value, int64_t N, double discount) {
  TORCH_CHECK(policy_logits.dim() == 2 && policy_logits.device().is_cpu(),
              "start_tree_arrays: policy_logits must be a [B, A] CPU tensor");
  const int64_t B = policy_logits.size(0), A = policy_logits.size(1);
  TORCH_CHECK(legal.scalar_type() == at::kBool && legal.sizes() == policy_logits.sizes(),
              "start_tree_arrays: legal must be [B, A] bool");
  TORCH_CHECK(value.numel() == B, "start_tree_arrays: value must hold B values");
  TORCH_CHECK(N >= 1, "start_tree_arrays: N must be >= 1");
  const auto i32 = at::TensorOptions().dtype(at::kInt), f32 = at::TensorOptions().dtype(at::kFloat);
  auto filled_i = [&](at::IntArrayRef shape, int32_t v) {
    at::Tensor t = at::empty(shape, i32);
    std::fill_n(t.data_ptr<int32_t>(), t.numel(), v);
    return t;
  };
  auto filled_f = [&](at::IntArrayRef shape, float v) {
    at::Tensor t = at::empty(shape, f32);
    std::fill_n(t.data_ptr<float>(), t.numel(), v);
    return t;
  };
  const float inf = std::numeric_limits<float>::infinity();
  // start_tree: policy_logits.float().masked_fill(~legal, -inf)
  at::Tensor logits = policy_logits.to(at::kFloat).contiguous();
  const at::Tensor ok = legal.contiguous();
  if (logits.is_same(policy_logits)) logits = logits.clone();  // never write the caller's tensor
  float* lg = logits.data_ptr<float>();
  const bool* lk = ok.data_ptr<bool>();
  for (int64_t i = 0; i < B * A; ++i)
    if (!lk[i]) lg[i] = -inf;
  const at::Tensor prior = at::softmax(logits, -1);
  const at::Tensor v = value.to(at::kFloat).contiguous();
  at::Tensor children_prior = filled_f({B, N, A}, 0.0f), children_logits = filled_f({B, N, A}, 0.0f);
  at::Tensor raw_value = filled_f({B, N}, 0.0f);
  for (int64_t b = 0; b < B; ++b) {
    std::copy_n(prior.data_ptr<float>() + b * A, A, children_prior.data_ptr<float>() + b * N * A);
    std::copy_n(lg + b * A, A, children_logits.data_ptr<float>() + b * N * A);
    raw_value.data_ptr<float>()[b * N] = v.data_ptr<float>()[b];
  }
  return {filled_i({B, N}, 0),                          // visit_count
          filled_f({B, N}, 0.0f),                       // value_sum
          filled_i({B, N}, -1),                         // parent
          filled_i({B, N}, -1),                         // action_from_parent
          filled_i({B, N, A}, -1),                      // children_index
          children_prior,
          filled_f({B, N, A}, 0.0f),                    // children_reward
          filled_f({B}, inf),                           // min_q
          filled_f({B}, -inf),                          // max_q
          ok.clone(),                                   // root_legal
          raw_value,
          children_logits,
          filled_f({B, N, A}, static_cast<float>(discount))};  // children_discount
}

}  // namespace tree_ops
