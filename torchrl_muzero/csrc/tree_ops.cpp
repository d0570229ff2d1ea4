// Tree bookkeeping of the batched MCTS (torchrl_muzero/mcts/tree.py) as plain
// loops over the B trees.
//
// Why C++: done as batched torch ops, one depth level of select/backup costs
// ~35 small aten calls (3-6 us of dispatch each on CPU), which dominates the
// search. Here one call per simulation walks every tree directly on the
// tensors' memory (select + backup ~0.2 us per tree per simulation at B=64..256,
// ~3.5 us per simulation at B=1, mostly pybind call overhead). Measured in
// docs/performance.md ("Search"), with benchmarks/test_search_bench.py.
//
// The file also holds `mlp_search`: a whole search for MuZeroMLPModel with
// its network step in C++ too (section "Fused search" below); it reuses the
// per-tree select and backup of this contract.
//
// Numerical contract (the plain-torch path in mcts/puct.py, select.py and
// backup.py mirrors it, and the visit counts must match exactly):
//   * everything is float32; the double scalars (pb_c_base, pb_c_init,
//     discount) are rounded to float once, as torch does when a Python float
//     meets a float32 tensor;
//   * int32 visit counts are converted to float before use;
//   * pb_c  = pb_c_init + log((parent_visits + pb_c_base + 1) / pb_c_base)
//             evaluated as ((pv + base) + 1) / base;
//   * q     = reward + discount * (value_sum / visit_count)
//   * q_norm= (max_q - min_q > 1e-8) ? (q - min_q) / (max_q - min_q) : 0
//             (0 as well for an unexpanded edge);
//   * u     = ((prior * sqrt(parent_visits)) / (1 + child_visits)) * pb_c
//             i.e. `prior * sqrt_n / (1 + child_visits) * pb_c` left to right;
//   * score = q_norm + u; the first action (ascending) with the largest score
//     wins (strict >), as torch.argmax does. Illegal root actions are skipped;
//     if every root action is illegal, action 0 is returned (argmax of an
//     all -inf row).
// No fused multiply-add may be contracted from these expressions: the
// extension is built without -march flags (baseline x86-64 has no FMA; the
// AVX2 copy of the fused MLP step is target("avx2"), without FMA too) and,
// for GCC/Clang, fp-contract is switched off below, so every product is
// rounded before the following addition, as separate torch ops do.
// log() may differ from torch's vectorised log by an ulp; that only moves
// pb_c, never the comparison order except on exact near-ties.
// NaN inputs are not supported (std::min/max here do not propagate NaN the
// way torch.minimum/maximum do).

#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <tuple>
#include <vector>

#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace {

// Bumped whenever the Python-visible signatures or semantics change, so the
// loader can reject a stale in-place build instead of calling it wrongly.
constexpr int kTreeOpsVersion = 1;

// The loops over B are deliberately serial. Trees are independent, so a
// parallel split would stay deterministic, but on the 2-core target a select
// over 256 full trees of 51 nodes takes ~40 us, the same as at::parallel_for
// with 2 threads measured (the extension is not built with OpenMP, and the
// search's network call is what should have the cores).

void check_tensor(const at::Tensor& t, const char* name, at::ScalarType dtype,
                  int64_t dim) {
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

void check_shape(const at::Tensor& t, const char* name,
                 at::IntArrayRef expected) {
  TORCH_CHECK(t.sizes() == expected, "tree_ops: `", name, "` must have shape ",
              expected, ", got ", t.sizes());
}

// Shared validation of the per-tree arrays; returns (B, N, A).
std::tuple<int64_t, int64_t, int64_t> check_tree(
    const at::Tensor& visit_count, const at::Tensor& value_sum,
    const at::Tensor& children_index, const at::Tensor& children_prior,
    const at::Tensor& children_reward, const at::Tensor& min_q,
    const at::Tensor& max_q) {
  check_tensor(visit_count, "visit_count", at::kInt, 2);
  check_tensor(children_index, "children_index", at::kInt, 3);
  const int64_t B = visit_count.size(0);
  const int64_t N = visit_count.size(1);
  const int64_t A = children_index.size(2);
  TORCH_CHECK(N >= 1 && A >= 1, "tree_ops: empty tree (N=", N, ", A=", A, ")");
  check_tensor(value_sum, "value_sum", at::kFloat, 2);
  check_tensor(children_prior, "children_prior", at::kFloat, 3);
  check_tensor(children_reward, "children_reward", at::kFloat, 3);
  check_tensor(min_q, "min_q", at::kFloat, 1);
  check_tensor(max_q, "max_q", at::kFloat, 1);
  check_shape(value_sum, "value_sum", {B, N});
  check_shape(children_index, "children_index", {B, N, A});
  check_shape(children_prior, "children_prior", {B, N, A});
  check_shape(children_reward, "children_reward", {B, N, A});
  check_shape(min_q, "min_q", {B});
  check_shape(max_q, "max_q", {B});
  return {B, N, A};
}

struct Leaf {
  int64_t node;
  int64_t action;
};

// pUCT descent in one tree (pointers to that tree's [N] / [N, A] arrays and
// its [A] root mask), following the numerical contract above. Shared by
// `select` and the fused MLP search so both pick the same leaves.
inline Leaf select_in_tree(const int32_t* vc, const float* vs,
                           const int32_t* ci, const float* cp, const float* cr,
                           const bool* legal, float minq, float maxq, int64_t N,
                           int64_t A, float base, float init, float disc,
                           int64_t b) {
  const float delta = maxq - minq;
  // Compared in float: 1e-8f is the float just below 1e-8, so the float and
  // double comparisons agree for every float delta.
  const bool normalise = delta > 1e-8f;
  const float neg_inf = -std::numeric_limits<float>::infinity();

  int64_t node = 0;
  int64_t best = 0;
  // A path visits each node at most once; the bound only turns a
  // corrupted (cyclic) tree into an error instead of a hang.
  for (int64_t depth = 0;; ++depth) {
    TORCH_CHECK(depth < N, "tree_ops.select: tree ", b,
                " has a cycle in children_index");
    const float pv = static_cast<float>(vc[node]);
    const float pb_c = init + std::log((pv + base + 1.0f) / base);
    const float sqrt_n = std::sqrt(pv);
    const int32_t* node_ci = ci + node * A;
    const float* node_cp = cp + node * A;
    const float* node_cr = cr + node * A;
    const bool at_root = node == 0;

    best = 0;
    float best_score = neg_inf;
    for (int64_t a = 0; a < A; ++a) {
      if (at_root && !legal[a]) continue;
      const int32_t child = node_ci[a];
      float q_norm = 0.0f;
      float child_visits = 0.0f;
      if (child >= 0) {
        TORCH_CHECK(child < N, "tree_ops.select: children_index ", child,
                    " out of range [0, ", N, ") in tree ", b);
        const float cv = static_cast<float>(vc[child]);
        const float q = node_cr[a] + disc * (vs[child] / cv);
        if (normalise) q_norm = (q - minq) / delta;
        child_visits = cv;
      }
      const float u = node_cp[a] * sqrt_n / (1.0f + child_visits) * pb_c;
      const float score = q_norm + u;
      if (score > best_score) {
        best_score = score;
        best = a;
      }
    }
    const int32_t next = node_ci[best];
    if (next < 0) break;
    TORCH_CHECK(next < N, "tree_ops.select: children_index ", next,
                " out of range [0, ", N, ") in tree ", b);
    node = next;
  }
  return {node, best};
}

// Expansion of node `n` under (leaf, act) and backup of `value` to the root in
// one tree (pointers to that tree's arrays, min/max q by pointer). The caller
// has checked that the edge is unexpanded and that leaf != n.
inline void expand_and_backup_in_tree(int32_t* vc, float* vs, int32_t* par,
                                      int32_t* afp, int32_t* ci, float* cp,
                                      float* cr, float* minq_out,
                                      float* maxq_out, int64_t N, int64_t A,
                                      int64_t n, int64_t leaf, int64_t act,
                                      float reward, float value,
                                      const float* prior, float disc,
                                      int64_t b) {
  // Expand: link the new node under the selected edge.
  ci[leaf * A + act] = static_cast<int32_t>(n);
  par[n] = static_cast<int32_t>(leaf);
  afp[n] = static_cast<int32_t>(act);
  cr[leaf * A + act] = reward;
  std::copy_n(prior, A, cp + n * A);

  // Backup: G is the return from each node's own point of view;
  // `discount` carries the sign flip of two-player games.
  float minq = *minq_out;
  float maxq = *maxq_out;
  float G = value;
  int64_t node = n;
  vs[node] += G;
  vc[node] += 1;
  for (int64_t depth = 0; node != 0; ++depth) {
    TORCH_CHECK(depth < N, "tree_ops.expand_and_backup: tree ", b,
                " has a cycle in parent");
    const int64_t p = par[node];
    const int64_t a = afp[node];
    TORCH_CHECK(p >= 0 && p < N && a >= 0 && a < A,
                "tree_ops.expand_and_backup: corrupt parent link at node ",
                node, " of tree ", b);
    const float r = cr[p * A + a];
    // The edge value seen from p, after this backup reached `node`.
    const float q = r + disc * (vs[node] / static_cast<float>(vc[node]));
    minq = std::min(minq, q);
    maxq = std::max(maxq, q);
    G = r + disc * G;
    vs[p] += G;
    vc[p] += 1;
    node = p;
  }
  *minq_out = minq;
  *maxq_out = maxq;
}

std::tuple<at::Tensor, at::Tensor> select_leaves(
    const at::Tensor& visit_count, const at::Tensor& value_sum,
    const at::Tensor& children_index, const at::Tensor& children_prior,
    const at::Tensor& children_reward, const at::Tensor& min_q,
    const at::Tensor& max_q, const at::Tensor& root_legal, double pb_c_base,
    double pb_c_init, double discount) {
  const auto [B, N, A] =
      check_tree(visit_count, value_sum, children_index, children_prior,
                 children_reward, min_q, max_q);
  check_tensor(root_legal, "root_legal", at::kBool, 2);
  check_shape(root_legal, "root_legal", {B, A});

  auto leaf_node = at::empty({B}, visit_count.options().dtype(at::kLong));
  auto leaf_action = at::empty({B}, visit_count.options().dtype(at::kLong));

  const int32_t* vc_all = visit_count.data_ptr<int32_t>();
  const float* vs_all = value_sum.data_ptr<float>();
  const int32_t* ci_all = children_index.data_ptr<int32_t>();
  const float* cp_all = children_prior.data_ptr<float>();
  const float* cr_all = children_reward.data_ptr<float>();
  const float* minq_all = min_q.data_ptr<float>();
  const float* maxq_all = max_q.data_ptr<float>();
  const bool* legal_all = root_legal.data_ptr<bool>();
  int64_t* out_node = leaf_node.data_ptr<int64_t>();
  int64_t* out_action = leaf_action.data_ptr<int64_t>();

  const float base = static_cast<float>(pb_c_base);
  const float init = static_cast<float>(pb_c_init);
  const float disc = static_cast<float>(discount);

  {
    // The loop only touches raw memory; let other Python threads (actors,
    // data loaders) run meanwhile.
    pybind11::gil_scoped_release no_gil;
    for (int64_t b = 0; b < B; ++b) {
      const Leaf leaf = select_in_tree(
          vc_all + b * N, vs_all + b * N, ci_all + b * N * A,
          cp_all + b * N * A, cr_all + b * N * A, legal_all + b * A,
          minq_all[b], maxq_all[b], N, A, base, init, disc, b);
      out_node[b] = leaf.node;
      out_action[b] = leaf.action;
    }
  }
  return {leaf_node, leaf_action};
}

void expand_and_backup(
    const at::Tensor& visit_count, const at::Tensor& value_sum,
    const at::Tensor& parent, const at::Tensor& action_from_parent,
    const at::Tensor& children_index, const at::Tensor& children_prior,
    const at::Tensor& children_reward, const at::Tensor& min_q,
    const at::Tensor& max_q, int64_t node_index, const at::Tensor& leaf_node,
    const at::Tensor& leaf_action, const at::Tensor& reward,
    const at::Tensor& value, const at::Tensor& prior, double discount) {
  const auto [B, N, A] =
      check_tree(visit_count, value_sum, children_index, children_prior,
                 children_reward, min_q, max_q);
  check_tensor(parent, "parent", at::kInt, 2);
  check_tensor(action_from_parent, "action_from_parent", at::kInt, 2);
  check_shape(parent, "parent", {B, N});
  check_shape(action_from_parent, "action_from_parent", {B, N});
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
  // Node 0 is the root, which has no parent edge: the caller initialises it.
  TORCH_CHECK(node_index >= 1 && node_index < N,
              "tree_ops.expand_and_backup: node_index must be in [1, ", N,
              "), got ", node_index);

  int32_t* vc_all = visit_count.data_ptr<int32_t>();
  float* vs_all = value_sum.data_ptr<float>();
  int32_t* par_all = parent.data_ptr<int32_t>();
  int32_t* afp_all = action_from_parent.data_ptr<int32_t>();
  int32_t* ci_all = children_index.data_ptr<int32_t>();
  float* cp_all = children_prior.data_ptr<float>();
  float* cr_all = children_reward.data_ptr<float>();
  float* minq_all = min_q.data_ptr<float>();
  float* maxq_all = max_q.data_ptr<float>();
  const int64_t* leaf_all = leaf_node.data_ptr<int64_t>();
  const int64_t* act_all = leaf_action.data_ptr<int64_t>();
  const float* rew_all = reward.data_ptr<float>();
  const float* val_all = value.data_ptr<float>();
  const float* prior_all = prior.data_ptr<float>();
  const float disc = static_cast<float>(discount);
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
    TORCH_CHECK(ci_all[(b * N + leaf) * A + act] < 0,
                "tree_ops.expand_and_backup: edge (node ", leaf, ", action ",
                act, ") of tree ", b, " is already expanded");
  }

  pybind11::gil_scoped_release no_gil;
  for (int64_t b = 0; b < B; ++b) {
    expand_and_backup_in_tree(vc_all + b * N, vs_all + b * N, par_all + b * N,
                              afp_all + b * N, ci_all + b * N * A,
                              cp_all + b * N * A, cr_all + b * N * A,
                              minq_all + b, maxq_all + b, N, A, n, leaf_all[b],
                              act_all[b], rew_all[b], val_all[b],
                              prior_all + b * A, disc, b);
  }
}

// ---------------------------------------------------------------------------
// Fused search for MuZeroMLPModel with one hidden layer per network.
//
// Why: at small B the per-simulation model call costs ~25-30 aten calls of
// 3-6 us dispatch each (~150-250 us per simulation at B=1), against ~2 us of
// tree work. `mlp_search` runs every simulation of a search in this one call:
// select, gather the parent latent, the network step as raw loops (no
// dispatch, no allocation), expand and backup; the GIL is released
// throughout. Measured in docs/performance.md ("Search"), with
// benchmarks/test_search_bench.py.
//
// The network step mirrors MuZeroMLPModel.recurrent_inference_scalar:
//   h      = relu((W1[:, :L] x + b1) + W1[:, L + a])        dynamics, layer 1
//   raw    = W2 h + b2;  next = (raw - min) / max(max - min, 1e-5)   (scale_latent)
//   reward = E_r[bin] of softmax(Wr2 relu(Wr1 next + br1) + br2), then h^-1
//   [policy logits | value logits] = Wp2 relu(Wp1 next + bp1) + bp2
//   value  = E_v[bin] of softmax(value logits), then h^-1;  prior = softmax(policy logits)
// Numerical contract (float32 throughout, like the torch path, but NOT
// bit-identical to it): each output of a linear layer is
// ((x0*w0 + x1*w1) + ...) + bias with k ascending, every product rounded
// before its addition (fp-contract is off for the whole file), so a sample's
// result does not depend on the batch size, the tile it lands in or the
// vector width; MKL's FMA order differs, which moves outputs by a few float
// ulps. The bin expectation is computed as sum(e_i * bin_i) /
// sum(e_i) with e_i = exp(z_i - max z) from a Cephes-style polynomial (within
// ~2 ulp of exp; exactly 1 at 0) and fixed 8-lane partial sums, where torch
// normalises first and then takes a BLAS dot; softmax(0, ..., 0) therefore
// decodes to exactly 0 here. The h^-1 closed form and scale_latent are
// evaluated in the same operation order as support.py / model.py.
// test/test_fused_search.py measures the difference to the torch model and
// compares whole searches with the torch path.
//
// Implementation: GCC/Clang vector extensions, 4 floats wide in the baseline
// build (SSE2, NEON) and 8 wide in a copy compiled for AVX2 that x86 CPUs
// with AVX2 run (same results bit for bit). Linear layers are
// register-tiled (4 samples x 2 vectors, or 1 sample x 8 vectors) over
// k-major copies of the weights made once per call. Built without GCC or
// Clang, the module simply has no mlp_search and the search keeps its
// per-simulation loop.
// ---------------------------------------------------------------------------
#if defined(__GNUC__) || defined(__clang__)
#define MZ_HAVE_MLP_SEARCH 1

#if defined(__x86_64__) || defined(__i386__)
#define MZ_X86_AVX2_PATH 1
#endif
#define MZ_INLINE inline __attribute__((always_inline))

typedef float v4f __attribute__((vector_size(16)));
typedef int32_t v4i __attribute__((vector_size(16)));
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));

// The kernels are templates over the vector type: 4 floats for the baseline
// build (SSE2 / NEON registers), 8 for the AVX2 instantiation. Every result
// is the same for both (checked by test_fused_search.py): a linear layer's
// outputs are independent lanes, and the decode's sums are split into 8
// partial sums whatever the width.
template <class V>
struct Lanes;
template <>
struct Lanes<v4f> {
  using I = v4i;
  static constexpr int W = 4;
};
template <>
struct Lanes<v8f> {
  using I = v8i;
  static constexpr int W = 8;
};

template <class V>
MZ_INLINE V vload(const float* p) {
  V v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
template <class V>
MZ_INLINE void vstore(float* p, V v) {
  std::memcpy(p, &v, sizeof(v));
}
template <class V>
MZ_INLINE V vsplat(float x) {
  return x - V{};  // x - 0 == x for every x, -0 included
}
// The first `count` (0 .. W) floats of p, the other lanes `fill`.
template <class V>
MZ_INLINE V vload_partial(const float* p, int64_t count, float fill) {
  V v = vsplat<V>(fill);
  for (int64_t i = 0; i < count; ++i) v[i] = p[i];
  return v;
}
template <class V>
MZ_INLINE V vmax(V a, V b) {
  return a > b ? a : b;
}

// exp(x) for x <= 0 (a logit minus its row maximum), as Cephes' expf:
// x = n ln2 + r with n = round(x / ln2) and |r| <= ln2 / 2, exp(r) from its
// polynomial, times 2^n built in the exponent bits. Rounding uses the
// 1.5 * 2^23 shifter (the float sum's last bits are n + 127), which needs no
// float-int conversion or floor. Inputs below -87 (exp(-inf) included) are
// clamped there: exp(-87) ~ 1.6e-38 vanishes next to the row maximum's 1.
// Exactly 1 at 0.
template <class V>
MZ_INLINE V exp_nonpos(V x) {
  using I = typename Lanes<V>::I;
  x = vmax(x, vsplat<V>(-87.0f));
  const float shifter = 12582912.0f + 127.0f;  // 1.5 * 2^23, plus the exponent bias
  V kf = x * 1.44269504088896341f + shifter;
  const I biased_n = (I)kf;  // a vector cast reinterprets the bits
  kf = kf - shifter;         // n, as a float
  x = x - kf * 0.693359375f;
  x = x - kf * -2.12194440e-4f;
  const V z = x * x;
  V y = vsplat<V>(1.9875691500e-4f);
  y = y * x + 1.3981999507e-3f;
  y = y * x + 8.3334519073e-3f;
  y = y * x + 4.1665795894e-2f;
  y = y * x + 1.6666665459e-1f;
  y = y * x + 5.0000001201e-1f;
  y = y * z + x + 1.0f;
  return y * (V)((biased_n & 0xff) << 23);  // 2^n
}

// E[bin] under softmax(z[0:n]): sum(e_i * bin_i) / sum(e_i), each sum kept
// as 8 partial sums (element i goes to partial i mod 8) added up in a fixed
// tree at the end.
template <class V>
MZ_INLINE float bin_expectation(const float* z, const float* bins, int64_t n) {
  constexpr int W = Lanes<V>::W, R = 8 / W;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const int64_t full = n & ~int64_t{7};
  V m = vsplat<V>(neg_inf);
  for (int64_t i = 0; i < n; i += W)
    m = vmax(m, i + W <= n ? vload<V>(z + i)
                           : vload_partial<V>(z + i, n - i, neg_inf));
  float mx = m[0];
  for (int l = 1; l < W; ++l) mx = m[l] > mx ? m[l] : mx;
  V s0[R], s1[R];
  for (int r = 0; r < R; ++r) s0[r] = s1[r] = vsplat<V>(0.0f);
  for (int64_t i = 0; i < full; i += 8) {
    for (int r = 0; r < R; ++r) {
      const V e = exp_nonpos(vload<V>(z + i + r * W) - mx);
      s0[r] += e;
      s1[r] += e * vload<V>(bins + i + r * W);
    }
  }
  if (full < n) {  // every partial sum takes one more term, padding included
    for (int r = 0; r < R; ++r) {
      const int64_t at = full + r * W;
      const int64_t count = std::max<int64_t>(0, std::min<int64_t>(W, n - at));
      const V e = exp_nonpos(vload_partial<V>(z + at, count, neg_inf) - mx);
      s0[r] += e;
      s1[r] += e * vload_partial<V>(bins + at, count, 0.0f);
    }
  }
  float p0[8], p1[8];
  for (int l = 0; l < 8; ++l) {
    p0[l] = s0[l / W][l % W];
    p1[l] = s1[l / W][l % W];
  }
  const float sum0 = ((p0[0] + p0[1]) + (p0[2] + p0[3])) + ((p0[4] + p0[5]) + (p0[6] + p0[7]));
  const float sum1 = ((p1[0] + p1[1]) + (p1[2] + p1[3])) + ((p1[4] + p1[5]) + (p1[6] + p1[7]));
  return sum1 / sum0;
}

// h^-1 exactly as support.inverse_signed_hyperbolic evaluates it on a float32
// tensor: the Python-float constants are formed in double and rounded once.
struct InverseH {
  float c4, c1, c2;
  explicit InverseH(double eps)
      : c4(static_cast<float>(4 * eps)),
        c1(static_cast<float>(1 + 4 * eps * (1 + eps))),
        c2(static_cast<float>(2 * eps)) {}
  float operator()(float y) const {
    const float root = (std::sqrt(std::fabs(y) * c4 + c1) - 1.0f) / c2;
    const float sign = y > 0.0f ? 1.0f : (y < 0.0f ? -1.0f : 0.0f);
    return sign * (root * root - 1.0f);
  }
};

constexpr int64_t round_up16(int64_t n) { return (n + 15) & ~int64_t{15}; }

// One linear layer in k-major layout: wt[k * J + j] = W[j, k] for the J
// (padded, multiple of 16) outputs; padded outputs have zero weights/bias.
struct Dense {
  std::vector<float> wt, bias;
  int64_t K = 0, J = 0;
};

// The NS x (W * NV) output tile (rows x[s], outputs j0 ..): accumulate over
// k, then + bias, + extra[s] (the action column), ReLU.
template <class V, int NS, int NV>
MZ_INLINE void dense_tile(const Dense& d, const float* const* x, int64_t j0,
                          const float* const* extra, bool relu,
                          float* const* y) {
  constexpr int W = Lanes<V>::W;
  V acc[NS][NV];
  for (int s = 0; s < NS; ++s)
    for (int v = 0; v < NV; ++v) acc[s][v] = vsplat<V>(0.0f);
  const float* w = d.wt.data() + j0;
  for (int64_t k = 0; k < d.K; ++k, w += d.J) {
    V wv[NV];
    for (int v = 0; v < NV; ++v) wv[v] = vload<V>(w + W * v);
    for (int s = 0; s < NS; ++s) {
      const float xs = x[s][k];
      for (int v = 0; v < NV; ++v) acc[s][v] += wv[v] * xs;
    }
  }
  for (int s = 0; s < NS; ++s) {
    for (int v = 0; v < NV; ++v) {
      const int64_t j = j0 + W * v;
      V out = acc[s][v] + vload<V>(d.bias.data() + j);
      if (extra != nullptr) out += vload<V>(extra[s] + j);
      if (relu) out = out > 0.0f ? out : vsplat<V>(0.0f);
      vstore(y[s] + j, out);
    }
  }
}

// Fewer than 4 rows: wide tiles, so that 8-9 independent accumulators hide
// the addition latency.
template <class V, int NS>
MZ_INLINE void dense_few(const Dense& d, const float* const* x,
                         const float* const* extra, bool relu,
                         float* const* y) {
  constexpr int W = Lanes<V>::W;
  constexpr int NV = NS == 1 ? 8 : (NS == 2 ? 4 : 3);
  int64_t j0 = 0;
  for (; j0 + W * NV <= d.J; j0 += W * NV)
    dense_tile<V, NS, NV>(d, x, j0, extra, relu, y);
  for (; j0 < d.J; j0 += W) dense_tile<V, NS, 1>(d, x, j0, extra, relu, y);
}

// y[s] = layer(x[s]) for n rows. With 4+ rows: column panels of 2 vectors in
// the outer loop (a panel's weights, K x 64 bytes at most, stay in L1 while
// every row block uses them), 4-row blocks inside: 8 accumulators, 2 weight
// loads and 4 broadcasts per k. (4 x 3 tiles measured no faster: the loop is
// bound by the multiply and add ports.)
template <class V>
MZ_INLINE void dense(const Dense& d, int64_t n, const float* const* x,
                     const float* const* extra, bool relu, float* const* y) {
  constexpr int W = Lanes<V>::W;
  if (n < 4) {
    if (n == 3) dense_few<V, 3>(d, x, extra, relu, y);
    if (n == 2) dense_few<V, 2>(d, x, extra, relu, y);
    if (n == 1) dense_few<V, 1>(d, x, extra, relu, y);
    return;
  }
  for (int64_t j0 = 0; j0 < d.J; j0 += 2 * W) {
    int64_t s = 0;
    for (; s + 4 <= n; s += 4)
      dense_tile<V, 4, 2>(d, x + s, j0, extra ? extra + s : nullptr, relu, y + s);
    const float* const* ex = extra ? extra + s : nullptr;
    switch (n - s) {
      case 3: dense_tile<V, 3, 2>(d, x + s, j0, ex, relu, y + s); break;
      case 2: dense_tile<V, 2, 2>(d, x + s, j0, ex, relu, y + s); break;
      case 1: dense_tile<V, 1, 2>(d, x + s, j0, ex, relu, y + s); break;
      default: break;
    }
  }
}

// Rows per group: the group's activations (~1.4k floats per row) stay in L2
// between layers; large enough for full 4-row blocks.
constexpr int64_t kGroup = 32;

struct MlpNet {
  int64_t L = 0, A = 0, R = 0, V = 0, Hd = 0, Hr = 0, Hq = 0;
  Dense dyn1, dyn2, trunks, reward_out, pred_out;
  std::vector<float> action_rows;  // [A][dyn1.J]: W1[:, L + a], padded
  std::vector<float> reward_bins, value_bins;
  InverseH reward_h{1e-3}, value_h{1e-3};
};

void check_weight(const at::Tensor& t, const char* name, at::IntArrayRef shape) {
  TORCH_CHECK(t.defined() && t.device().is_cpu() &&
                  t.scalar_type() == at::kFloat && t.is_contiguous(),
              "mlp_search: `", name,
              "` must be a contiguous float32 CPU tensor, got ", t.scalar_type(),
              " on ", t.device());
  TORCH_CHECK(t.sizes() == shape, "mlp_search: `", name, "` must have shape ",
              shape, ", got ", t.sizes());
}

// Copy rows [row0, row0 + J) x columns [col0, col0 + K) of the [out, in]
// matrix w (row stride ld) into d.wt (k-major) at output offset j_off.
void pack_block(Dense& d, const float* w, int64_t ld, int64_t row0,
                int64_t col0, int64_t J, int64_t K, const float* bias,
                int64_t j_off) {
  for (int64_t j = 0; j < J; ++j) {
    const float* src = w + (row0 + j) * ld + col0;
    for (int64_t k = 0; k < K; ++k) d.wt[k * d.J + j_off + j] = src[k];
  }
  for (int64_t j = 0; j < J; ++j) d.bias[j_off + j] = bias[row0 + j];
}

void init_dense(Dense& d, int64_t K, int64_t J) {
  d.K = K;
  d.J = round_up16(J);
  d.wt.assign(static_cast<size_t>(K * d.J), 0.0f);
  d.bias.assign(static_cast<size_t>(d.J), 0.0f);
}

// weights: the 12 parameters of MuZeroMLPModel's search step in this order:
// dynamics (W1 [Hd, L + A], b1, W2 [L, Hd], b2), reward head (Wr1 [Hr, L],
// br1, Wr2 [R, Hr], br2), prediction (Wp1 [Hq, L], bp1, Wp2 [A + V, Hq],
// bp2), then reward_bins [R] and value_bins [V].
// Packs into a per-thread MlpNet reused across calls: its buffers keep their
// capacity, so a small search does not pay fresh allocations (page faults)
// for ~0.4 MB of weights every call.
const MlpNet& pack_mlp(const std::vector<at::Tensor>& weights, int64_t A,
                       double reward_eps, double value_eps) {
  TORCH_CHECK(weights.size() == 14, "mlp_search: expected 14 weight tensors "
              "(12 parameters and the two bin vectors), got ", weights.size());
  thread_local MlpNet net;
  TORCH_CHECK(weights[0].dim() == 2 && weights[6].dim() == 2 &&
                  weights[10].dim() == 2 && weights[4].dim() == 2 &&
                  weights[8].dim() == 2,
              "mlp_search: weight matrices must be 2-d");
  const int64_t Hd = weights[0].size(0), Hr = weights[4].size(0),
                Hq = weights[8].size(0), R = weights[6].size(0);
  const int64_t L = weights[0].size(1) - A;
  TORCH_CHECK(L >= 1, "mlp_search: dynamics layer has ", weights[0].size(1),
              " inputs, fewer than the ", A, " actions plus a latent");
  const int64_t V = weights[10].size(0) - A;
  TORCH_CHECK(V >= 1, "mlp_search: prediction head has too few outputs");
  check_weight(weights[0], "dynamics.0.weight", {Hd, L + A});
  check_weight(weights[1], "dynamics.0.bias", {Hd});
  check_weight(weights[2], "dynamics.2.weight", {L, Hd});
  check_weight(weights[3], "dynamics.2.bias", {L});
  check_weight(weights[4], "reward.0.weight", {Hr, L});
  check_weight(weights[5], "reward.0.bias", {Hr});
  check_weight(weights[6], "reward.2.weight", {R, Hr});
  check_weight(weights[7], "reward.2.bias", {R});
  check_weight(weights[8], "prediction.0.weight", {Hq, L});
  check_weight(weights[9], "prediction.0.bias", {Hq});
  check_weight(weights[10], "prediction_head.weight", {A + V, Hq});
  check_weight(weights[11], "prediction_head.bias", {A + V});
  check_weight(weights[12], "reward_bins", {R});
  check_weight(weights[13], "value_bins", {V});
  net.L = L; net.A = A; net.R = R; net.V = V;
  net.Hd = Hd; net.Hr = Hr; net.Hq = Hq;
  const float* w1 = weights[0].data_ptr<float>();
  const float* b1 = weights[1].data_ptr<float>();

  init_dense(net.dyn1, L, Hd);
  pack_block(net.dyn1, w1, L + A, 0, 0, Hd, L, b1, 0);
  net.action_rows.assign(static_cast<size_t>(A * net.dyn1.J), 0.0f);
  for (int64_t j = 0; j < Hd; ++j)
    for (int64_t a = 0; a < A; ++a)
      net.action_rows[a * net.dyn1.J + j] = w1[j * (L + A) + L + a];

  init_dense(net.dyn2, Hd, L);
  pack_block(net.dyn2, weights[2].data_ptr<float>(), Hd, 0, 0, L, Hd,
             weights[3].data_ptr<float>(), 0);
  // Both first layers of the heads read the new latent: one layer of
  // round_up16(Hr) + Hq outputs, reward hidden units first.
  const int64_t hq_off = round_up16(Hr);
  init_dense(net.trunks, L, hq_off + Hq);
  pack_block(net.trunks, weights[4].data_ptr<float>(), L, 0, 0, Hr, L,
             weights[5].data_ptr<float>(), 0);
  pack_block(net.trunks, weights[8].data_ptr<float>(), L, 0, 0, Hq, L,
             weights[9].data_ptr<float>(), hq_off);
  init_dense(net.reward_out, Hr, R);
  pack_block(net.reward_out, weights[6].data_ptr<float>(), Hr, 0, 0, R, Hr,
             weights[7].data_ptr<float>(), 0);
  init_dense(net.pred_out, Hq, A + V);
  pack_block(net.pred_out, weights[10].data_ptr<float>(), Hq, 0, 0, A + V, Hq,
             weights[11].data_ptr<float>(), 0);
  net.reward_bins.assign(weights[12].data_ptr<float>(),
                         weights[12].data_ptr<float>() + R);
  net.value_bins.assign(weights[13].data_ptr<float>(),
                        weights[13].data_ptr<float>() + V);
  net.reward_h = InverseH(reward_eps);
  net.value_h = InverseH(value_eps);
  return net;
}

// Activation buffers of one group of rows (per thread, reused like MlpNet).
struct MlpScratch {
  std::vector<float> hidden, raw, trunks, reward_logits, pred_logits;
};

MlpScratch& thread_scratch(const MlpNet& net) {
  thread_local MlpScratch sc;
  sc.hidden.resize(kGroup * net.dyn1.J);
  sc.raw.resize(kGroup * net.dyn2.J);
  sc.trunks.resize(kGroup * net.trunks.J);
  sc.reward_logits.resize(kGroup * net.reward_out.J);
  sc.pred_logits.resize(kGroup * net.pred_out.J);
  return sc;
}

// The search step for n <= kGroup rows: parent latents in[s] (L floats),
// actions act[s]; writes the scaled next latent to out[s] (L floats), the
// decoded reward and value, the prior [n, A] and, when `logits` is not null,
// the policy logits [n, A].
template <class V>
MZ_INLINE void mlp_step_impl(const MlpNet& net, MlpScratch& sc, int64_t n,
                             const float* const* in, const int64_t* act,
                             float* const* out, float* reward, float* value,
                             float* prior, float* logits) {
  const int64_t L = net.L, A = net.A;
  const float* row_in[kGroup];
  float* row_out[kGroup];
  const float* extra[kGroup];

  // Dynamics: relu((W1_latent x + b1) + W1[:, L + a]), then W2 . + b2.
  for (int64_t s = 0; s < n; ++s) {
    extra[s] = net.action_rows.data() + act[s] * net.dyn1.J;
    row_out[s] = sc.hidden.data() + s * net.dyn1.J;
  }
  dense<V>(net.dyn1, n, in, extra, /*relu=*/true, row_out);
  for (int64_t s = 0; s < n; ++s) {
    row_in[s] = sc.hidden.data() + s * net.dyn1.J;
    row_out[s] = sc.raw.data() + s * net.dyn2.J;
  }
  dense<V>(net.dyn2, n, row_in, nullptr, false, row_out);
  // scale_latent: (x - min) / clamp_min(max - min, 1e-5), per row.
  for (int64_t s = 0; s < n; ++s) {
    const float* r = sc.raw.data() + s * net.dyn2.J;
    float lo = r[0], hi = r[0];
    for (int64_t i = 1; i < L; ++i) {
      lo = std::min(lo, r[i]);
      hi = std::max(hi, r[i]);
    }
    const float range = std::max(hi - lo, 1e-5f);
    for (int64_t i = 0; i < L; ++i) out[s][i] = (r[i] - lo) / range;
  }
  // Heads: both hidden layers at once, then the two output layers.
  for (int64_t s = 0; s < n; ++s) {
    row_in[s] = out[s];
    row_out[s] = sc.trunks.data() + s * net.trunks.J;
  }
  dense<V>(net.trunks, n, row_in, nullptr, true, row_out);
  for (int64_t s = 0; s < n; ++s) {
    row_in[s] = sc.trunks.data() + s * net.trunks.J;
    row_out[s] = sc.reward_logits.data() + s * net.reward_out.J;
  }
  dense<V>(net.reward_out, n, row_in, nullptr, false, row_out);
  const int64_t hq_off = round_up16(net.Hr);
  for (int64_t s = 0; s < n; ++s) {
    row_in[s] = sc.trunks.data() + s * net.trunks.J + hq_off;
    row_out[s] = sc.pred_logits.data() + s * net.pred_out.J;
  }
  dense<V>(net.pred_out, n, row_in, nullptr, false, row_out);

  for (int64_t s = 0; s < n; ++s) {
    const float* rl = sc.reward_logits.data() + s * net.reward_out.J;
    const float* pl = sc.pred_logits.data() + s * net.pred_out.J;
    reward[s] = net.reward_h(bin_expectation<V>(rl, net.reward_bins.data(), net.R));
    value[s] = net.value_h(bin_expectation<V>(pl + A, net.value_bins.data(), net.V));
    // prior = softmax(policy logits); A is small, so plain libm exp.
    float mx = pl[0];
    for (int64_t a = 1; a < A; ++a) mx = std::max(mx, pl[a]);
    float* p = prior + s * A;
    float total = 0.0f;
    for (int64_t a = 0; a < A; ++a) {
      p[a] = std::exp(pl[a] - mx);
      total += p[a];
    }
    for (int64_t a = 0; a < A; ++a) p[a] /= total;
    if (logits != nullptr) std::copy_n(pl, A, logits + s * A);
  }
}

#define MZ_STEP_PARAMS                                                      \
  const MlpNet &net, MlpScratch &sc, int64_t n, const float *const *in,      \
      const int64_t *act, float *const *out, float *reward, float *value,    \
      float *prior, float *logits
#define MZ_STEP_ARGS net, sc, n, in, act, out, reward, value, prior, logits

void mlp_step_baseline(MZ_STEP_PARAMS) { mlp_step_impl<v4f>(MZ_STEP_ARGS); }

#ifdef MZ_X86_AVX2_PATH
// The same templates compiled for AVX2 (inlined into this function, so they
// take its target); chosen at run time when the CPU has AVX2.
__attribute__((target("avx2"))) void mlp_step_avx2(MZ_STEP_PARAMS) {
  mlp_step_impl<v8f>(MZ_STEP_ARGS);
}
#endif

bool cpu_has_avx2() {
#ifdef MZ_X86_AVX2_PATH
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
#else
  return false;
#endif
}

// The search step for n <= kGroup rows (see mlp_step_impl); `baseline`
// forces the 4-wide build (the test hook compares the two).
void mlp_step(MZ_STEP_PARAMS, bool baseline = false) {
#ifdef MZ_X86_AVX2_PATH
  if (!baseline && cpu_has_avx2()) return mlp_step_avx2(MZ_STEP_ARGS);
#endif
  mlp_step_baseline(MZ_STEP_ARGS);
}
#undef MZ_STEP_PARAMS
#undef MZ_STEP_ARGS

void check_latent_and_actions(const MlpNet& net, const at::Tensor& latent,
                              const at::Tensor& action, int64_t B) {
  check_tensor(latent, "latent", at::kFloat, 2);
  check_shape(latent, "latent", {B, net.L});
  const int64_t* a = action.data_ptr<int64_t>();
  for (int64_t i = 0; i < action.numel(); ++i)
    TORCH_CHECK(a[i] >= 0 && a[i] < net.A, "mlp_search: action ", a[i],
                " out of range [0, ", net.A, ")");
}

// Test hook: one search step, as model.recurrent_inference_scalar plus the
// prior. Returns (next_latent, reward, policy_logits, value, prior).
std::vector<at::Tensor> mlp_recurrent(const std::vector<at::Tensor>& weights,
                                      int64_t num_actions, double reward_eps,
                                      double value_eps,
                                      const at::Tensor& latent,
                                      const at::Tensor& action,
                                      bool baseline) {
  const MlpNet& net = pack_mlp(weights, num_actions, reward_eps, value_eps);
  check_tensor(action, "action", at::kLong, 1);
  const int64_t B = action.size(0);
  check_latent_and_actions(net, latent, action, B);
  const auto opts = latent.options();
  auto next = at::empty({B, net.L}, opts);
  auto reward = at::empty({B}, opts), value = at::empty({B}, opts);
  auto logits = at::empty({B, net.A}, opts), prior = at::empty({B, net.A}, opts);
  pybind11::gil_scoped_release no_gil;
  MlpScratch& sc = thread_scratch(net);
  const float* in[kGroup];
  float* out[kGroup];
  for (int64_t g = 0; g < B; g += kGroup) {
    const int64_t n = std::min(kGroup, B - g);
    for (int64_t s = 0; s < n; ++s) {
      in[s] = latent.data_ptr<float>() + (g + s) * net.L;
      out[s] = next.data_ptr<float>() + (g + s) * net.L;
    }
    mlp_step(net, sc, n, in, action.data_ptr<int64_t>() + g, out,
             reward.data_ptr<float>() + g, value.data_ptr<float>() + g,
             prior.data_ptr<float>() + g * net.A,
             logits.data_ptr<float>() + g * net.A, baseline);
  }
  return {next, reward, logits, value, prior};
}

// Network-only counterpart of mlp_search for benchmarks: actions.size(0)
// chained steps from `latent` (no tree). Returns the last latent.
at::Tensor mlp_unroll(const std::vector<at::Tensor>& weights,
                      int64_t num_actions, double reward_eps, double value_eps,
                      const at::Tensor& latent, const at::Tensor& actions) {
  const MlpNet& net = pack_mlp(weights, num_actions, reward_eps, value_eps);
  check_tensor(actions, "actions", at::kLong, 2);
  const int64_t S = actions.size(0), B = actions.size(1);
  check_latent_and_actions(net, latent, actions, B);
  auto cur = latent.clone(), nxt = at::empty_like(latent);
  pybind11::gil_scoped_release no_gil;
  MlpScratch& sc = thread_scratch(net);
  std::vector<float> reward(kGroup), value(kGroup), prior(kGroup * net.A);
  const float* in[kGroup];
  float* out[kGroup];
  for (int64_t t = 0; t < S; ++t) {
    for (int64_t g = 0; g < B; g += kGroup) {
      const int64_t n = std::min(kGroup, B - g);
      for (int64_t s = 0; s < n; ++s) {
        in[s] = cur.data_ptr<float>() + (g + s) * net.L;
        out[s] = nxt.data_ptr<float>() + (g + s) * net.L;
      }
      mlp_step(net, sc, n, in, actions.data_ptr<int64_t>() + t * B + g, out,
               reward.data(), value.data(), prior.data(), nullptr);
    }
    std::swap(cur, nxt);
  }
  return cur;
}

// The whole search on a fresh tree whose root (node 0: children_prior,
// root_legal, embeddings) the caller has filled: simulation s creates node
// s + 1, for s < N - 1.
void mlp_search(const at::Tensor& visit_count, const at::Tensor& value_sum,
                const at::Tensor& parent, const at::Tensor& action_from_parent,
                const at::Tensor& children_index,
                const at::Tensor& children_prior,
                const at::Tensor& children_reward, const at::Tensor& min_q,
                const at::Tensor& max_q, const at::Tensor& root_legal,
                const at::Tensor& embeddings,
                const std::vector<at::Tensor>& weights, double reward_eps,
                double value_eps, double pb_c_base, double pb_c_init,
                double discount) {
  const auto [B, N, A] =
      check_tree(visit_count, value_sum, children_index, children_prior,
                 children_reward, min_q, max_q);
  check_tensor(parent, "parent", at::kInt, 2);
  check_tensor(action_from_parent, "action_from_parent", at::kInt, 2);
  check_shape(parent, "parent", {B, N});
  check_shape(action_from_parent, "action_from_parent", {B, N});
  check_tensor(root_legal, "root_legal", at::kBool, 2);
  check_shape(root_legal, "root_legal", {B, A});
  const MlpNet& net = pack_mlp(weights, A, reward_eps, value_eps);
  check_tensor(embeddings, "embeddings", at::kFloat, 3);
  check_shape(embeddings, "embeddings", {B, N, net.L});

  int32_t* vc_all = visit_count.data_ptr<int32_t>();
  float* vs_all = value_sum.data_ptr<float>();
  int32_t* par_all = parent.data_ptr<int32_t>();
  int32_t* afp_all = action_from_parent.data_ptr<int32_t>();
  int32_t* ci_all = children_index.data_ptr<int32_t>();
  float* cp_all = children_prior.data_ptr<float>();
  float* cr_all = children_reward.data_ptr<float>();
  float* minq_all = min_q.data_ptr<float>();
  float* maxq_all = max_q.data_ptr<float>();
  const bool* legal_all = root_legal.data_ptr<bool>();
  float* emb_all = embeddings.data_ptr<float>();
  // The simulations rely on a fresh tree (node s + 1 unattached when
  // simulation s starts): reject a tree that was searched already.
  for (int64_t b = 0; b < B; ++b)
    TORCH_CHECK(vc_all[b * N] == 0 && (N < 2 || par_all[b * N + 1] == -1),
                "mlp_search: tree ", b, " was searched already; pass a fresh "
                "tree from allocate_tree");
  const float base = static_cast<float>(pb_c_base);
  const float init = static_cast<float>(pb_c_init);
  const float disc = static_cast<float>(discount);
  const int64_t L = net.L;

  pybind11::gil_scoped_release no_gil;
  MlpScratch& sc = thread_scratch(net);
  int64_t leaf[kGroup], act[kGroup];
  float reward[kGroup], value[kGroup];
  std::vector<float> prior(kGroup * A);
  const float* in[kGroup];
  float* out[kGroup];
  for (int64_t n = 1; n < N; ++n) {
    for (int64_t g = 0; g < B; g += kGroup) {
      const int64_t rows = std::min(kGroup, B - g);
      for (int64_t s = 0; s < rows; ++s) {
        const int64_t b = g + s;
        const Leaf l = select_in_tree(
            vc_all + b * N, vs_all + b * N, ci_all + b * N * A,
            cp_all + b * N * A, cr_all + b * N * A, legal_all + b * A,
            minq_all[b], maxq_all[b], N, A, base, init, disc, b);
        leaf[s] = l.node;
        act[s] = l.action;
        in[s] = emb_all + (b * N + l.node) * L;
        out[s] = emb_all + (b * N + n) * L;
      }
      mlp_step(net, sc, rows, in, act, out, reward, value, prior.data(),
               nullptr);
      for (int64_t s = 0; s < rows; ++s) {
        const int64_t b = g + s;
        expand_and_backup_in_tree(
            vc_all + b * N, vs_all + b * N, par_all + b * N, afp_all + b * N,
            ci_all + b * N * A, cp_all + b * N * A, cr_all + b * N * A,
            minq_all + b, maxq_all + b, N, A, n, leaf[s], act[s], reward[s],
            value[s], prior.data() + s * A, disc, b);
      }
    }
  }
}
#endif  // defined(__GNUC__) || defined(__clang__)

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() =
      "Batched MCTS tree bookkeeping (select, expand_and_backup) as C++ loops "
      "over the trees; see torchrl_muzero/mcts/_cpp.py for the Python API.";
  m.attr("TREE_OPS_VERSION") = kTreeOpsVersion;
  m.def("select", &select_leaves,
        "Walk every tree from the root to an unexpanded edge by pUCT. "
        "Returns (leaf_node [B] int64, leaf_action [B] int64).",
        pybind11::arg("visit_count"), pybind11::arg("value_sum"),
        pybind11::arg("children_index"), pybind11::arg("children_prior"),
        pybind11::arg("children_reward"), pybind11::arg("min_q"),
        pybind11::arg("max_q"), pybind11::arg("root_legal"),
        pybind11::arg("pb_c_base"), pybind11::arg("pb_c_init"),
        pybind11::arg("discount"));
  m.def("expand_and_backup", &expand_and_backup,
        "Attach node `node_index` under (leaf_node, leaf_action) in every "
        "tree and back its value up to the root, in place.",
        pybind11::arg("visit_count"), pybind11::arg("value_sum"),
        pybind11::arg("parent"), pybind11::arg("action_from_parent"),
        pybind11::arg("children_index"), pybind11::arg("children_prior"),
        pybind11::arg("children_reward"), pybind11::arg("min_q"),
        pybind11::arg("max_q"), pybind11::arg("node_index"),
        pybind11::arg("leaf_node"), pybind11::arg("leaf_action"),
        pybind11::arg("reward"), pybind11::arg("value"),
        pybind11::arg("prior"), pybind11::arg("discount"));
#ifdef MZ_HAVE_MLP_SEARCH
  m.def("mlp_search", &mlp_search,
        "Run every simulation of a search for MuZeroMLPModel (one hidden "
        "layer) on a fresh tree whose root is initialised, in place.",
        pybind11::arg("visit_count"), pybind11::arg("value_sum"),
        pybind11::arg("parent"), pybind11::arg("action_from_parent"),
        pybind11::arg("children_index"), pybind11::arg("children_prior"),
        pybind11::arg("children_reward"), pybind11::arg("min_q"),
        pybind11::arg("max_q"), pybind11::arg("root_legal"),
        pybind11::arg("embeddings"), pybind11::arg("weights"),
        pybind11::arg("reward_eps"), pybind11::arg("value_eps"),
        pybind11::arg("pb_c_base"), pybind11::arg("pb_c_init"),
        pybind11::arg("discount"));
  m.def("mlp_recurrent", &mlp_recurrent,
        "Test hook: the fused search's network step for a batch of latents "
        "(`baseline`: force the 4-wide build instead of the AVX2 one). "
        "Returns [next_latent, reward, policy_logits, value, prior].",
        pybind11::arg("weights"), pybind11::arg("num_actions"),
        pybind11::arg("reward_eps"), pybind11::arg("value_eps"),
        pybind11::arg("latent"), pybind11::arg("action"),
        pybind11::arg("baseline") = false);
  m.def("mlp_unroll", &mlp_unroll,
        "Benchmark hook: actions.size(0) chained network steps without a "
        "tree. Returns the last latent.",
        pybind11::arg("weights"), pybind11::arg("num_actions"),
        pybind11::arg("reward_eps"), pybind11::arg("value_eps"),
        pybind11::arg("latent"), pybind11::arg("actions"));
#endif
}
