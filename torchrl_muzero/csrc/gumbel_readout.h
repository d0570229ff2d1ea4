// Gumbel MuZero's reading of finished trees in one call (mcts/gumbel.py's
// gumbel_result): per root the child visit counts, the Sequential Halving
// winner, the improved policy and the mean return. Done in torch it was ~20
// small ops per search (the completed-Q of the root, the considered score,
// the masked softmax), which at small batches cost as much as the search's
// own bookkeeping.
//
// Float32 contract, per root b (sigma, visits from sigma_completed_q at node
// 0, gumbel_rules.h; lg the root's logits, -inf where illegal):
//   counts[a] = visits of the child on edge a (0 while unexpanded)
//   most      = max_a counts[a]
//   score[a]  = max(-1e9, (gumbel[a] + (lg[a] - max lg)) + sigma[a])
//               if counts[a] == most and root_legal[a], else -inf
//   action    = first argmax of score (0 if every score is -inf)
//   improved  = softmax(legal ? lg + sigma : -inf)  (softmax_into)
//   value     = value_sum[0] / max(visit_count[0], 1)
// The action is bit-for-bit torch's choice unless two scores tie within the
// few ulps std::exp and torch's exp differ by; improved agrees with torch's
// softmax to float32 rounding (test/test_gumbel_fused.py).
#pragma once

#include <ATen/ops/empty.h>

#include "gumbel_rules.h"

namespace tree_ops {

inline std::vector<at::Tensor> gumbel_readout(
    const at::Tensor& visit_count, const at::Tensor& value_sum,
    const at::Tensor& children_index, const at::Tensor& children_prior,
    const at::Tensor& children_reward, const at::Tensor& children_discount,
    const at::Tensor& children_logits, const at::Tensor& raw_value,
    const at::Tensor& min_q, const at::Tensor& max_q,
    const at::Tensor& root_legal, const at::Tensor& gumbel,
    const std::vector<double>& params) {
  TreeArrays t = check_tree(visit_count, value_sum, children_index,
                            children_prior, children_reward,
                            children_discount, min_q, max_q);
  check_descent_inputs(t, root_legal, children_logits, raw_value);
  check_tensor(gumbel, "gumbel", at::kFloat, 2);
  check_shape(gumbel, "gumbel", {t.B, t.A});
  TORCH_CHECK(params.size() == 3,
              "tree_ops.gumbel_readout: params are (value_scale, "
              "maxvisit_init, rescale_values), got ",
              params.size(), " values");
  const GumbelParams g(RuleSpec{RuleId::kGumbelRoot, params});
  const int64_t B = t.B, A = t.A;
  auto counts = at::empty({B, A}, visit_count.options());  // int32, as root_child_visits
  auto improved = at::empty({B, A}, value_sum.options());
  auto value = at::empty({B}, value_sum.options());
  auto action = at::empty({B}, visit_count.options().dtype(at::kLong));
  int32_t* counts_p = counts.data_ptr<int32_t>();
  float* improved_p = improved.data_ptr<float>();
  float* value_p = value.data_ptr<float>();
  int64_t* action_p = action.data_ptr<int64_t>();
  const float* noise_all = gumbel.data_ptr<float>();

  GilRelease no_gil;
  std::vector<float> buf(static_cast<size_t>(3 * A));
  float* sigma = buf.data();
  float* visits = sigma + A;
  float* scratch = visits + A;
  for (int64_t b = 0; b < B; ++b) {
    const Row r = row(t, b);
    softmax_into(r.lg, A, scratch);  // the root's prior
    sigma_completed_q(r, 0, g, sigma, visits, scratch);
    const float* lg = r.lg;
    const float* noise = noise_all + b * A;
    float mx = lg[0], most = visits[0];
    for (int64_t a = 1; a < A; ++a) {
      mx = std::max(mx, lg[a]);
      most = std::max(most, visits[a]);
    }
    int64_t best = 0;
    float best_score = kNegInf;
    for (int64_t a = 0; a < A; ++a) {
      counts_p[b * A + a] = static_cast<int32_t>(visits[a]);
      if (!r.legal[a] || visits[a] != most) continue;
      const float score = std::max((noise[a] + (lg[a] - mx)) + sigma[a], -1e9f);
      if (score > best_score) {
        best_score = score;
        best = a;
      }
    }
    action_p[b] = best;
    for (int64_t a = 0; a < A; ++a)
      scratch[a] = r.legal[a] ? lg[a] + sigma[a] : kNegInf;
    softmax_into(scratch, A, improved_p + b * A);
    value_p[b] = r.vs[0] / static_cast<float>(std::max(r.vc[0], 1));
  }
  return {counts, improved, value, action};
}

}  // namespace tree_ops
