// Shared pieces of the C++ tree kernel: argument checks, the view of one
// tree's arrays, and the expand/backup of one tree.
//
// Layout and meaning of the arrays: torchrl_muzero/mcts/tree.py. The kernel
// works on the tensors' memory directly; every tensor is CPU, contiguous and
// of the dtype allocate_tree gives it (checked by check_tensor).
//
// Numerical contract of the backup (mirrored by mcts/backup.py):
//   * everything is float32; int32 visit counts are converted to float;
//   * each edge (p, a) has its own discount d = children_discount[p, a]
//     (the search's discount, negated in two-player games, unless a model
//     step set the edge's own);
//   * walking from the new node to the root: q = r + d * (value_sum / visits)
//     of the edge after the child's update feeds min_q / max_q, then
//     G = r + d * G is added to the parent.
// No fused multiply-add may be contracted from these expressions: the
// extension is built without -march flags and, for GCC/Clang, fp-contract is
// switched off below (and with -ffp-contract=off), so every product is
// rounded before the following addition, as separate torch ops do.
// NaN inputs are not supported (std::min/max here do not propagate NaN the
// way torch.minimum/maximum do).
#pragma once

// Light ATen / c10 headers only (not torch/extension.h: the whole C++ frontend
// and Python bindings, parsed again by every translation unit;
// docs/performance_search.md, "C++ kernel build time"): the compute
// files see tensors, their dtypes and TORCH_CHECK; a file that calls an ATen
// op includes that op's own header (<ATen/ops/empty.h>, ...), and only the
// module file (tree_ops.cpp) includes pybind11.
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

// The per-tree helpers below are called in the innermost loops: force them
// inline (an out-of-line `inline` function of a shared object is called
// through the PLT, which made fused searches at B=1 slower:
// docs/performance_search.md, "Design figures quoted from the code").
#if defined(__GNUC__) || defined(__clang__)
#define TREE_OPS_INLINE inline __attribute__((always_inline))
#else
#define TREE_OPS_INLINE inline
#endif

namespace tree_ops {

// Releases the GIL for its lifetime (pybind11::gil_scoped_release, which it
// holds): the compute files release it around their loops without including
// pybind11; defined in tree_ops.cpp, the module's file.
class GilRelease {
 public:
  GilRelease();
  ~GilRelease();
  GilRelease(const GilRelease&) = delete;
  GilRelease& operator=(const GilRelease&) = delete;

 private:
  alignas(void*) unsigned char state_[32];
};

// Bumped whenever the Python-visible signatures or semantics change, so the
// loader can reject a stale in-place build instead of calling it wrongly.
// 2: rules passed by name and parameters (select, mlp_search), per-edge
// discounts and -inf prior logits read from the tree.
// 3: fused searches split on torch's OpenMP team; row_chunks_probe and
// search_threads_on_torch_team (tests' hooks).
constexpr int kTreeOpsVersion = 3;

inline void check_tensor(const at::Tensor& t, const char* name,
                         at::ScalarType dtype, int64_t dim) {
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

inline void check_shape(const at::Tensor& t, const char* name,
                        at::IntArrayRef expected) {
  TORCH_CHECK(t.sizes() == expected, "tree_ops: `", name, "` must have shape ",
              expected, ", got ", t.sizes());
}

// Base pointers of the B trees' arrays (the fields of mcts/tree.py's Tree).
// Pointers the caller does not pass stay null (select reads no parent links,
// the backup no logits).
struct TreeArrays {
  int64_t B = 0, N = 0, A = 0;
  int32_t* vc = nullptr;   // visit_count [B, N]
  float* vs = nullptr;     // value_sum [B, N]
  int32_t* par = nullptr;  // parent [B, N]
  int32_t* afp = nullptr;  // action_from_parent [B, N]
  int32_t* ci = nullptr;   // children_index [B, N, A]
  float* cp = nullptr;     // children_prior [B, N, A]
  float* cr = nullptr;     // children_reward [B, N, A]
  float* cd = nullptr;     // children_discount [B, N, A]
  float* lg = nullptr;     // children_logits [B, N, A]
  float* rv = nullptr;     // raw_value [B, N]
  float* minq = nullptr;   // min_q [B]
  float* maxq = nullptr;   // max_q [B]
  bool* legal = nullptr;   // root_legal [B, A]
};

// One tree's arrays (tree b of a TreeArrays).
struct Row {
  int64_t b, N, A;
  int32_t* vc;
  float* vs;
  int32_t* par;
  int32_t* afp;
  int32_t* ci;
  float* cp;
  float* cr;
  float* cd;
  float* lg;
  float* rv;
  float* minq;
  float* maxq;
  const bool* legal;
};

template <class T>
TREE_OPS_INLINE T* offset(T* p, int64_t k) {
  return p == nullptr ? nullptr : p + k;
}

TREE_OPS_INLINE Row row(const TreeArrays& t, int64_t b) {
  const int64_t N = t.N, A = t.A;
  return {b,
          N,
          A,
          offset(t.vc, b * N),
          offset(t.vs, b * N),
          offset(t.par, b * N),
          offset(t.afp, b * N),
          offset(t.ci, b * N * A),
          offset(t.cp, b * N * A),
          offset(t.cr, b * N * A),
          offset(t.cd, b * N * A),
          offset(t.lg, b * N * A),
          offset(t.rv, b * N),
          offset(t.minq, b),
          offset(t.maxq, b),
          offset(static_cast<const bool*>(t.legal), b * A)};
}

// Checks the statistics every call reads and fills their pointers: visit
// counts, value sums, children index / prior / reward / discount, min/max q.
inline TreeArrays check_tree(const at::Tensor& visit_count,
                             const at::Tensor& value_sum,
                             const at::Tensor& children_index,
                             const at::Tensor& children_prior,
                             const at::Tensor& children_reward,
                             const at::Tensor& children_discount,
                             const at::Tensor& min_q, const at::Tensor& max_q) {
  check_tensor(visit_count, "visit_count", at::kInt, 2);
  check_tensor(children_index, "children_index", at::kInt, 3);
  TreeArrays t;
  t.B = visit_count.size(0);
  t.N = visit_count.size(1);
  t.A = children_index.size(2);
  const int64_t B = t.B, N = t.N, A = t.A;
  TORCH_CHECK(N >= 1 && A >= 1, "tree_ops: empty tree (N=", N, ", A=", A, ")");
  check_tensor(value_sum, "value_sum", at::kFloat, 2);
  check_tensor(children_prior, "children_prior", at::kFloat, 3);
  check_tensor(children_reward, "children_reward", at::kFloat, 3);
  check_tensor(children_discount, "children_discount", at::kFloat, 3);
  check_tensor(min_q, "min_q", at::kFloat, 1);
  check_tensor(max_q, "max_q", at::kFloat, 1);
  check_shape(value_sum, "value_sum", {B, N});
  check_shape(children_index, "children_index", {B, N, A});
  check_shape(children_prior, "children_prior", {B, N, A});
  check_shape(children_reward, "children_reward", {B, N, A});
  check_shape(children_discount, "children_discount", {B, N, A});
  check_shape(min_q, "min_q", {B});
  check_shape(max_q, "max_q", {B});
  t.vc = visit_count.data_ptr<int32_t>();
  t.vs = value_sum.data_ptr<float>();
  t.ci = children_index.data_ptr<int32_t>();
  t.cp = children_prior.data_ptr<float>();
  t.cr = children_reward.data_ptr<float>();
  t.cd = children_discount.data_ptr<float>();
  t.minq = min_q.data_ptr<float>();
  t.maxq = max_q.data_ptr<float>();
  return t;
}

inline void check_links(TreeArrays& t, const at::Tensor& parent,
                        const at::Tensor& action_from_parent) {
  check_tensor(parent, "parent", at::kInt, 2);
  check_tensor(action_from_parent, "action_from_parent", at::kInt, 2);
  check_shape(parent, "parent", {t.B, t.N});
  check_shape(action_from_parent, "action_from_parent", {t.B, t.N});
  t.par = parent.data_ptr<int32_t>();
  t.afp = action_from_parent.data_ptr<int32_t>();
}

// What every descent reads besides the statistics: the root mask, the prior
// logits (-inf: never selectable) and the raw values.
inline void check_descent_inputs(TreeArrays& t, const at::Tensor& root_legal,
                                 const at::Tensor& children_logits,
                                 const at::Tensor& raw_value) {
  check_tensor(root_legal, "root_legal", at::kBool, 2);
  check_shape(root_legal, "root_legal", {t.B, t.A});
  check_tensor(children_logits, "children_logits", at::kFloat, 3);
  check_shape(children_logits, "children_logits", {t.B, t.N, t.A});
  check_tensor(raw_value, "raw_value", at::kFloat, 2);
  check_shape(raw_value, "raw_value", {t.B, t.N});
  t.legal = root_legal.data_ptr<bool>();
  t.lg = children_logits.data_ptr<float>();
  t.rv = raw_value.data_ptr<float>();
}

struct Leaf {
  int64_t node;
  int64_t action;
};

// Expansion of node `n` under (leaf, act) and backup of `value` to the root in
// one tree, following the contract at the top of this file. `edge_discount`
// (when not null) becomes the new edge's discount first. The caller has
// checked that the edge is unexpanded and that leaf != n.
TREE_OPS_INLINE void expand_and_backup_in_tree(const Row& t, int64_t n, int64_t leaf,
                                      int64_t act, float reward, float value,
                                      const float* prior,
                                      const float* edge_discount) {
  const int64_t N = t.N, A = t.A;
  int32_t* vc = t.vc;
  float* vs = t.vs;
  // Expand: link the new node under the selected edge.
  t.ci[leaf * A + act] = static_cast<int32_t>(n);
  t.par[n] = static_cast<int32_t>(leaf);
  t.afp[n] = static_cast<int32_t>(act);
  t.cr[leaf * A + act] = reward;
  if (edge_discount != nullptr) t.cd[leaf * A + act] = *edge_discount;
  std::copy_n(prior, A, t.cp + n * A);

  // Backup: G is the return from each node's own point of view; an edge's
  // discount carries the sign flip of two-player games.
  float minq = *t.minq;
  float maxq = *t.maxq;
  float G = value;
  int64_t node = n;
  vs[node] += G;
  vc[node] += 1;
  for (int64_t depth = 0; node != 0; ++depth) {
    TORCH_CHECK(depth < N, "tree_ops.expand_and_backup: tree ", t.b,
                " has a cycle in parent");
    const int64_t p = t.par[node];
    const int64_t a = t.afp[node];
    TORCH_CHECK(p >= 0 && p < N && a >= 0 && a < A,
                "tree_ops.expand_and_backup: corrupt parent link at node ",
                node, " of tree ", t.b);
    const float r = t.cr[p * A + a];
    const float d = t.cd[p * A + a];
    // The edge value seen from p, after this backup reached `node`.
    const float q = r + d * (vs[node] / static_cast<float>(vc[node]));
    minq = std::min(minq, q);
    maxq = std::max(maxq, q);
    G = r + d * G;
    vs[p] += G;
    vc[p] += 1;
    node = p;
  }
  *t.minq = minq;
  *t.maxq = maxq;
}

}  // namespace tree_ops
