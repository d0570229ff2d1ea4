// Selection rules of the C++ descent and the descent itself, written once:
// select_in_tree<RootRule, InteriorRule> walks one tree from the root to an
// unexpanded edge, asking RootRule at the root and InteriorRule below it
// (mcts/select.py's `descend`). A rule is a small class with
//     int64_t operator()(const Row& tree, int64_t node, int64_t depth) const
// returning the action to follow at `node`; the Python-visible entries name
// the two rules (mcts/rules.py's `cpp_rule` / `cpp_params`) and
// dispatch.h's with_rules() runs the instantiation, so a new rule is one
// class and one case there, never another kernel.
//
// Every rule skips edges that may not be selected (mcts/puct.py's
// `selectable`): illegal root actions (root_legal) and edges whose prior
// logit is -inf (or NaN). If no edge is selectable the rule returns action 0
// (torch.argmax of an all -inf row). Ties go to the lowest action index
// (strict >, as torch.argmax's first maximum).
#pragma once

#include "tree_common.h"

namespace tree_ops {

// tree.extra's tensors, by name (the rules that need one look it up).
using Extra = std::unordered_map<std::string, at::Tensor>;

// A rule as the Python side names it: which rule, its float parameters.
enum class RuleId : int { kPuct, kChance, kStochastic, kGumbelRoot, kGumbelInterior };

struct RuleSpec {
  RuleId id;
  std::vector<double> params;
};

inline const at::Tensor& extra_tensor(const Extra& extra, const char* key,
                                      const char* rule) {
  auto it = extra.find(key);
  TORCH_CHECK(it != extra.end(), "tree_ops: rule '", rule,
              "' needs tree.extra['", key, "']");
  return it->second;
}

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

TREE_OPS_INLINE bool selectable(const Row& t, int64_t node, int64_t a) {
  if (node == 0 && !t.legal[a]) return false;
  return t.lg[node * t.A + a] > kNegInf;
}

// The child on edge `a` of `node` (-1 while unexpanded), with the range
// check that turns a corrupted index into an error.
TREE_OPS_INLINE int32_t expanded_child(const Row& t, int64_t node, int64_t a) {
  const int32_t child = t.ci[node * t.A + a];
  TORCH_CHECK(child < t.N, "tree_ops.select: children_index ", child,
              " out of range [0, ", t.N, ") in tree ", t.b);
  return child;
}

// MuZero's pUCT (appendix B). Float32 contract, mirrored by mcts/puct.py:
//   * pb_c_base / pb_c_init are rounded to float once, as torch does when a
//     Python float meets a float32 tensor;
//   * pb_c  = pb_c_init + log((parent_visits + pb_c_base + 1) / pb_c_base)
//             evaluated as ((pv + base) + 1) / base;
//   * q     = reward + discount * (value_sum / visit_count), the edge's own
//             discount (children_discount);
//   * q_norm= (max_q - min_q > 1e-8) ? (q - min_q) / (max_q - min_q) : 0
//             (0 as well for an unexpanded edge);
//   * u     = ((prior * sqrt(parent_visits)) / (1 + child_visits)) * pb_c
//             i.e. `prior * sqrt_n / (1 + child_visits) * pb_c` left to right;
//   * score = q_norm + u.
// log() may differ from torch's vectorised log by an ulp; that only moves
// pb_c, never the comparison order except on exact near-ties.
struct PUCTRule {
  float base, init;
  explicit PUCTRule(const RuleSpec& s)
      : base(static_cast<float>(s.params[0])),
        init(static_cast<float>(s.params[1])) {}

  TREE_OPS_INLINE int64_t operator()(const Row& t, int64_t node,
                                     int64_t /*depth*/) const {
    const int64_t A = t.A;
    const float minq = *t.minq;
    const float delta = *t.maxq - minq;
    // Compared in float: 1e-8f is the float just below 1e-8, so the float and
    // double comparisons agree for every float delta.
    const bool normalise = delta > 1e-8f;
    const float pv = static_cast<float>(t.vc[node]);
    const float pb_c = init + std::log((pv + base + 1.0f) / base);
    const float sqrt_n = std::sqrt(pv);
    const float* cp = t.cp + node * A;
    const float* cr = t.cr + node * A;
    const float* cd = t.cd + node * A;

    int64_t best = 0;
    float best_score = kNegInf;
    for (int64_t a = 0; a < A; ++a) {
      if (!selectable(t, node, a)) continue;
      const int32_t child = expanded_child(t, node, a);
      float q_norm = 0.0f;
      float child_visits = 0.0f;
      if (child >= 0) {
        const float cv = static_cast<float>(t.vc[child]);
        const float q = cr[a] + cd[a] * (t.vs[child] / cv);
        if (normalise) q_norm = (q - minq) / delta;
        child_visits = cv;
      }
      const float u = cp[a] * sqrt_n / (1.0f + child_visits) * pb_c;
      const float score = q_norm + u;
      if (score > best_score) {
        best_score = score;
        best = a;
      }
    }
    return best;
  }
};

// Stochastic MuZero's chance-node rule (mcts/stochastic.py's ChanceRule):
//     argmax_c prior(c) / (1 + N(c))        (float32: one addition, one division)
// over the selectable slots c >= num_actions (the chance codes; the first
// num_actions slots are the decision slots). Parameter: num_actions.
struct ChanceRule {
  int64_t num_actions;
  explicit ChanceRule(const RuleSpec& s)
      : num_actions(static_cast<int64_t>(s.params[0])) {}

  TREE_OPS_INLINE int64_t operator()(const Row& t, int64_t node,
                                     int64_t /*depth*/) const {
    const float* cp = t.cp + node * t.A;
    int64_t best = 0;
    float best_score = kNegInf;
    for (int64_t a = std::max<int64_t>(num_actions, 0); a < t.A; ++a) {
      if (!selectable(t, node, a)) continue;
      const int32_t child = expanded_child(t, node, a);
      const float visits = child >= 0 ? static_cast<float>(t.vc[child]) : 0.0f;
      const float score = cp[a] / (1.0f + visits);
      if (score > best_score) {
        best_score = score;
        best = a;
      }
    }
    return best;
  }
};

// Stochastic MuZero's interior rule (mcts/stochastic.py's StochasticRule):
// the chance rule at chance nodes (extra["is_chance"] [B, N] bool, the node
// state's flag), pUCT at decision nodes. Parameters: pb_c_base, pb_c_init,
// num_actions.
struct StochasticRule {
  PUCTRule decision;
  ChanceRule chance;
  const bool* is_chance;
  int64_t N;

  StochasticRule(const RuleSpec& s, const TreeArrays& t, const Extra& extra)
      : decision(RuleSpec{RuleId::kPuct, {s.params[0], s.params[1]}}),
        chance(RuleSpec{RuleId::kChance, {s.params[2]}}),
        N(t.N) {
    const at::Tensor& flag = extra_tensor(extra, "is_chance", "stochastic");
    check_tensor(flag, "extra['is_chance']", at::kBool, 2);
    check_shape(flag, "extra['is_chance']", {t.B, t.N});
    is_chance = flag.data_ptr<bool>();
  }

  TREE_OPS_INLINE int64_t operator()(const Row& t, int64_t node,
                                     int64_t depth) const {
    return is_chance[t.b * N + node] ? chance(t, node, depth)
                                     : decision(t, node, depth);
  }
};

// The descent of one tree: the root's rule at node 0, the interior rule at
// every deeper node, until the chosen edge is unexpanded.
template <class Root, class Interior>
TREE_OPS_INLINE Leaf select_in_tree(const Row& t, const Root& root,
                                    const Interior& interior) {
  int64_t node = 0;
  int64_t action = root(t, 0, 0);
  // A path visits each node at most once; the bound only turns a corrupted
  // (cyclic) tree into an error instead of a hang.
  for (int64_t depth = 1;; ++depth) {
    const int32_t next = t.ci[node * t.A + action];
    if (next < 0) break;
    TORCH_CHECK(next < t.N, "tree_ops.select: children_index ", next,
                " out of range [0, ", t.N, ") in tree ", t.b);
    TORCH_CHECK(depth < t.N, "tree_ops.select: tree ", t.b,
                " has a cycle in children_index");
    node = next;
    action = interior(t, node, depth);
  }
  return {node, action};
}

}  // namespace tree_ops
