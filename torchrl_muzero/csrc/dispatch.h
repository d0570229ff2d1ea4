// From the rule names the Python side passes to the template instantiation
// of the descent: parse_rule() checks a name and its parameters,
// with_rules() builds both rule objects and calls f(root_rule,
// interior_rule), so every entry point (select, mlp_search) is written once
// over generic rules. Adding a rule: its class (rules.h or a header of its
// own), a RuleId, a row in rule_table() and a case in with_root_rule or
// with_interior_rule.
#pragma once

#include "gumbel_rules.h"
#include "rules.h"

namespace tree_ops {

struct RuleInfo {
  const char* name;
  RuleId id;
  size_t num_params;
  bool at_root, at_interior;  // where the rule may be used
};

// name, id, parameters, root, interior
inline const std::vector<RuleInfo>& rule_table() {
  static const std::vector<RuleInfo> rules = {
      {"puct", RuleId::kPuct, 2, true, true},  // pb_c_base, pb_c_init
      {"chance", RuleId::kChance, 1, false, true},  // num_actions
      // pb_c_base, pb_c_init, num_actions
      {"stochastic", RuleId::kStochastic, 3, false, true},
      // value_scale, maxvisit_init, rescale_values
      {"gumbel_root", RuleId::kGumbelRoot, 3, true, false},
      {"gumbel_interior", RuleId::kGumbelInterior, 3, false, true},
  };
  return rules;
}

// The names usable at the root (at_root) or below it (exported as
// ROOT_RULES / INTERIOR_RULES).
inline std::vector<std::string> rule_names(bool at_root) {
  std::vector<std::string> names;
  for (const RuleInfo& r : rule_table())
    if (at_root ? r.at_root : r.at_interior) names.emplace_back(r.name);
  return names;
}

inline RuleSpec parse_rule(const std::string& name,
                           const std::vector<double>& params, bool at_root) {
  for (const RuleInfo& r : rule_table()) {
    if (name != r.name) continue;
    TORCH_CHECK(at_root ? r.at_root : r.at_interior, "tree_ops: rule '", name,
                "' cannot be used as the ", at_root ? "root" : "interior",
                " rule");
    TORCH_CHECK(params.size() == r.num_params, "tree_ops: rule '", name,
                "' takes ", r.num_params, " parameters, got ", params.size());
    return {r.id, params};
  }
  TORCH_CHECK(false, "tree_ops: unknown rule '", name, "'");
  return {};
}

// Calls f(rule) with the rule object `spec` names: the root rules, then the
// interior rules (each position instantiates only its own rules).
template <class F>
inline void with_root_rule(const RuleSpec& spec, const TreeArrays& t,
                           const Extra& extra, F&& f) {
  switch (spec.id) {
    case RuleId::kPuct:
      f(PUCTRule(spec));
      return;
    case RuleId::kGumbelRoot:
      f(GumbelRootRule(spec, t, extra));
      return;
    default:
      break;
  }
  TORCH_CHECK(false, "tree_ops: not a root rule");
}

template <class F>
inline void with_interior_rule(const RuleSpec& spec, const TreeArrays& t,
                               const Extra& extra, F&& f) {
  switch (spec.id) {
    case RuleId::kPuct:
      f(PUCTRule(spec));
      return;
    case RuleId::kChance:
      f(ChanceRule(spec));
      return;
    case RuleId::kStochastic:
      f(StochasticRule(spec, t, extra));
      return;
    case RuleId::kGumbelInterior:
      f(GumbelInteriorRule(spec, t));
      return;
    default:
      break;
  }
  TORCH_CHECK(false, "tree_ops: not an interior rule");
}

// Calls f(root_rule, interior_rule): one instantiation of f per pair.
template <class F>
inline void with_rules(const RuleSpec& root, const RuleSpec& interior,
                       const TreeArrays& t, const Extra& extra, F&& f) {
  with_root_rule(root, t, extra, [&](const auto& r) {
    with_interior_rule(interior, t, extra, [&](const auto& i) { f(r, i); });
  });
}

}  // namespace tree_ops
