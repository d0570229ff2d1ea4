// Gumbel MuZero's rules (Danihelka et al., ICLR 2022) for the C++ descent:
// GumbelRootRule (Sequential Halving with Gumbel at the root) and
// GumbelInteriorRule (the deterministic interior rule), ports of
// mcts/gumbel.py, mcts/qtransform.py and mcts/seq_halving.py.
//
// Parameters (the Python rules' cpp_params): value_scale, maxvisit_init,
// rescale_values (0 or 1). The root rule reads tree.extra["gumbel"] [B, A]
// float32 and tree.extra["considered_visits"] [B, S] int64 (each root's
// Sequential Halving sequence).
//
// Float32 expression order, as the torch modules document it:
//   q(a)     = reward + discount * (value_sum / visits)  (visited edges)
//   prior    = softmax(logits) = exp(l - max l) * (1 / sum exp(l - max l))
//   p        = max(prior, FLT_MIN); sum_n = sum visits;
//   sum_p    = sum over visited of p;  wq = sum over visited of (p * q) / sum_p
//   mixed    = (raw_value + sum_n * wq) / (sum_n + 1)
//   cq(a)    = visited ? q(a) : mixed;  with rescale_values
//   cq       = (cq - min cq) / max(max cq - min cq, 1e-8)   (over all A slots)
//   sigma    = ((maxvisit_init + max visits) * value_scale) * cq
//   interior: pi = softmax(logits + sigma); s = pi - visits / (1 + sum_n)
//   root:     s = max(-1e9, (gumbel + (logits - max logits)) + sigma) where
//             visits == considered_visits[min(sum_n, S - 1)], else -inf
// Sums run in ascending action order. NOT bit-identical to torch: std::exp
// is not torch's vectorised exp and torch may reduce in another order, so
// the scores can differ by a few ulps; the chosen actions agree except on
// near-ties of that size (test/test_cpp_rules.py compares whole descents).
#pragma once

#include <type_traits>

#include "rules.h"

namespace tree_ops {

struct GumbelParams {
  float value_scale, maxvisit_init;
  bool rescale;
  explicit GumbelParams(const RuleSpec& s)
      : value_scale(static_cast<float>(s.params[0])),
        maxvisit_init(static_cast<float>(s.params[1])),
        rescale(s.params[2] != 0.0) {}
};

// The rules' loops run over a node's A actions. A is a runtime value, but
// for the usual small action spaces the rules dispatch to a copy compiled
// for that A (kA > 0: loops fully unrolled, scratch on the stack); kA = 0 is
// the general copy. The copies run the same float32 operations in the same
// order, so they agree bit for bit.
constexpr int kMaxFixedActions = 9;

// softmax of x[0:A] into out (exp(-inf) = 0).
template <int kA>
TREE_OPS_INLINE void softmax_fixed(const float* x, int64_t A_dyn, float* out) {
  const int64_t A = kA > 0 ? kA : A_dyn;
  float mx = x[0];
  for (int64_t a = 1; a < A; ++a) mx = std::max(mx, x[a]);
  float total = 0.0f;
  for (int64_t a = 0; a < A; ++a) {
    out[a] = std::exp(x[a] - mx);
    total += out[a];
  }
  const float inv = 1.0f / total;
  for (int64_t a = 0; a < A; ++a) out[a] = out[a] * inv;
}

inline void softmax_into(const float* x, int64_t A, float* out) {
  softmax_fixed<0>(x, A, out);
}

// Calls f(std::integral_constant<int, kA>) with kA = A for 2 <= A <=
// kMaxFixedActions, else kA = 0.
template <class F>
TREE_OPS_INLINE auto with_num_actions(int64_t A, F&& f) {
  switch (A) {
    case 2: return f(std::integral_constant<int, 2>{});
    case 3: return f(std::integral_constant<int, 3>{});
    case 4: return f(std::integral_constant<int, 4>{});
    case 5: return f(std::integral_constant<int, 5>{});
    case 6: return f(std::integral_constant<int, 6>{});
    case 7: return f(std::integral_constant<int, 7>{});
    case 8: return f(std::integral_constant<int, 8>{});
    case 9: return f(std::integral_constant<int, 9>{});
    default: return f(std::integral_constant<int, 0>{});
  }
}

// softmax(children_logits[node]) per node, computed the first time a rule
// reads a node and kept for the rest of the call. A node's logits are
// written once, when it is expanded, before any descent can reach it (the
// fused search writes them right after the network step), so the cached
// prior is the one softmax_into would compute now, bit for bit. Gumbel trees
// are about twice as deep as pUCT's (the interior rule is deterministic),
// and this softmax was half the rule's exp() calls at every node.
class PriorCache {
 public:
  // `slot` names this cache's per-thread buffers (0: the root rule's, 1: the
  // interior rule's; both live during one call). Reusing them across calls
  // keeps a select() call, which reads each node at most once and so gains
  // nothing from the cache, from paying an allocation; only the B * nodes
  // flags are cleared per call.
  PriorCache(int slot, int64_t B, int64_t nodes, int64_t A)
      : nodes_(nodes), A_(A), scratch_(static_cast<size_t>(A)) {
    const size_t flags = static_cast<size_t>(B * nodes);
    const size_t floats = flags * static_cast<size_t>(A);
    // Beyond 16 MiB of priors (e.g. B=1024 trees of 800 nodes, 18 actions)
    // the per-thread buffer would stay allocated after the call: compute
    // the prior every time instead.
    if (floats > (size_t{1} << 22)) return;
    Buffers& buf = buffers(slot);
    if (buf.prior.size() < floats) buf.prior.resize(floats);
    buf.ready.assign(flags, 0);
    prior_ = buf.prior.data();
    ready_ = buf.ready.data();
  }

  // softmax(logits[node]) of tree t.b (node < nodes).
  const float* get(const Row& t, int64_t node) const {
    if (ready_ == nullptr) {
      softmax_into(t.lg + node * t.A, t.A, scratch_.data());
      return scratch_.data();
    }
    const int64_t k = t.b * nodes_ + node;
    float* p = prior_ + k * A_;
    if (!ready_[k]) {
      softmax_into(t.lg + node * t.A, t.A, p);
      ready_[k] = 1;
    }
    return p;
  }

 private:
  struct Buffers {
    std::vector<float> prior;
    std::vector<uint8_t> ready;
  };
  static Buffers& buffers(int slot) {
    thread_local Buffers slots[2];
    return slots[slot];
  }
  int64_t nodes_, A_;
  float* prior_ = nullptr;
  uint8_t* ready_ = nullptr;  // null: no cache
  mutable std::vector<float> scratch_;
};

// sigma(completedQ) [A] of the edges below `node` into sigma, the child
// visits into visits; returns sum(visits). `prior` is softmax(logits[node]).
template <int kA = 0>
TREE_OPS_INLINE float sigma_completed_q(const Row& t, int64_t node,
                                        const GumbelParams& g, float* sigma,
                                        float* visits, const float* prior) {
  const int64_t A = kA > 0 ? kA : t.A;
  const float* cr = t.cr + node * A;
  const float* cd = t.cd + node * A;
  float* q = sigma;  // q, then completedQ, then sigma, in place
  float sum_n = 0.0f, max_n = 0.0f;
  for (int64_t a = 0; a < A; ++a) {
    const int32_t child = expanded_child(t, node, a);
    const float n = child >= 0 ? static_cast<float>(t.vc[child]) : 0.0f;
    visits[a] = n;
    q[a] = n > 0.0f ? cr[a] + cd[a] * (t.vs[child] / n) : 0.0f;
    sum_n += n;
    max_n = std::max(max_n, n);
  }
  const float tiny = std::numeric_limits<float>::min();
  float sum_p = 0.0f;
  for (int64_t a = 0; a < A; ++a)
    if (visits[a] > 0.0f) sum_p += std::max(prior[a], tiny);
  float wq = 0.0f;
  for (int64_t a = 0; a < A; ++a)
    if (visits[a] > 0.0f) wq += std::max(prior[a], tiny) * q[a] / sum_p;
  const float mixed = (t.rv[node] + sum_n * wq) / (sum_n + 1.0f);
  for (int64_t a = 0; a < A; ++a)
    if (!(visits[a] > 0.0f)) q[a] = mixed;
  if (g.rescale) {
    float lo = q[0], hi = q[0];
    for (int64_t a = 1; a < A; ++a) {
      lo = std::min(lo, q[a]);
      hi = std::max(hi, q[a]);
    }
    const float range = std::max(hi - lo, 1e-8f);
    for (int64_t a = 0; a < A; ++a) q[a] = (q[a] - lo) / range;
  }
  const float scale = (g.maxvisit_init + max_n) * g.value_scale;
  for (int64_t a = 0; a < A; ++a) sigma[a] = scale * q[a];
  return sum_n;
}

// Scratch of a Gumbel rule: 3 x A floats, reused at every node (a rule
// object serves one call, on one thread).
struct GumbelScratch {
  mutable std::vector<float> buf;
  explicit GumbelScratch(int64_t A) : buf(static_cast<size_t>(3 * A)) {}
};

struct GumbelInteriorRule {
  GumbelParams g;
  GumbelScratch sc;
  PriorCache priors;
  GumbelInteriorRule(const RuleSpec& s, const TreeArrays& t)
      : g(s), sc(t.A), priors(1, t.B, t.N, t.A) {}

  int64_t operator()(const Row& t, int64_t node, int64_t /*depth*/) const {
    return with_num_actions(t.A, [&](auto k) { return choose<k.value>(t, node); });
  }

  template <int kA>
  TREE_OPS_INLINE int64_t choose(const Row& t, int64_t node) const {
    const int64_t A = kA > 0 ? kA : t.A;
    float stack[3 * (kA > 0 ? kA : 1)];
    float* sigma = kA > 0 ? stack : sc.buf.data();
    float* visits = sigma + A;
    float* pi = visits + A;
    const float sum_n =
        sigma_completed_q<kA>(t, node, g, sigma, visits, priors.get(t, node));
    const float* lg = t.lg + node * A;
    for (int64_t a = 0; a < A; ++a) sigma[a] = lg[a] + sigma[a];
    softmax_fixed<kA>(sigma, A, pi);
    const float denom = 1.0f + sum_n;
    int64_t best = 0;
    float best_score = kNegInf;
    for (int64_t a = 0; a < A; ++a) {
      if (!selectable(t, node, a)) continue;
      const float score = pi[a] - visits[a] / denom;
      if (score > best_score) {
        best_score = score;
        best = a;
      }
    }
    return best;
  }
};

struct GumbelRootRule {
  GumbelParams g;
  GumbelScratch sc;
  PriorCache priors;  // the roots' only (node 0)
  const float* gumbel;
  const int64_t* table;
  int64_t S;

  GumbelRootRule(const RuleSpec& s, const TreeArrays& t, const Extra& extra)
      : g(s), sc(t.A), priors(0, t.B, 1, t.A) {
    const at::Tensor& noise = extra_tensor(extra, "gumbel", "gumbel_root");
    check_tensor(noise, "extra['gumbel']", at::kFloat, 2);
    check_shape(noise, "extra['gumbel']", {t.B, t.A});
    const at::Tensor& seq =
        extra_tensor(extra, "considered_visits", "gumbel_root");
    check_tensor(seq, "extra['considered_visits']", at::kLong, 2);
    TORCH_CHECK(seq.size(0) == t.B && seq.size(1) >= 1,
                "tree_ops: `extra['considered_visits']` must have shape [",
                t.B, ", S >= 1], got ", seq.sizes());
    gumbel = noise.data_ptr<float>();
    table = seq.data_ptr<int64_t>();
    S = seq.size(1);
  }

  int64_t operator()(const Row& t, int64_t node, int64_t /*depth*/) const {
    return with_num_actions(t.A, [&](auto k) { return choose<k.value>(t, node); });
  }

  template <int kA>
  TREE_OPS_INLINE int64_t choose(const Row& t, int64_t node) const {
    const int64_t A = kA > 0 ? kA : t.A;
    float stack[2 * (kA > 0 ? kA : 1)];
    float* sigma = kA > 0 ? stack : sc.buf.data();
    float* visits = sigma + A;
    const float sum_n =
        sigma_completed_q<kA>(t, node, g, sigma, visits, priors.get(t, node));
    const int64_t sim = std::min(static_cast<int64_t>(sum_n), S - 1);
    const float considered = static_cast<float>(table[t.b * S + sim]);
    const float* lg = t.lg + node * A;
    const float* noise = gumbel + t.b * A;
    float mx = lg[0];
    for (int64_t a = 1; a < A; ++a) mx = std::max(mx, lg[a]);
    int64_t best = 0;
    float best_score = kNegInf;
    for (int64_t a = 0; a < A; ++a) {
      if (!selectable(t, node, a) || visits[a] != considered) continue;
      const float score = std::max((noise[a] + (lg[a] - mx)) + sigma[a], -1e9f);
      if (score > best_score) {
        best_score = score;
        best = a;
      }
    }
    return best;
  }
};

}  // namespace tree_ops
