// The fused UniZero search's network step (declared in unizero_net.h; the
// contract is described there): the causal transformer over token rows, the
// four heads and the decode, on the vector kernels of mlp_kernels.h.
#include "unizero_net.h"
#include "pack_cache.h"

#include <cstring>
#include <type_traits>

#include "mlp_kernels.h"
#include "unizero_kernels.h"

#ifdef MZ_HAVE_MLP_SEARCH

namespace tree_ops {
namespace {

// Per-row arguments of a transformer pass over m token rows (sc.x holds
// their inputs, position embedding included; it holds the residual stream
// after the pass): each token's slot, where its K/V go, and its slot table.
struct Pass {
  const int64_t* slot;
  float* const* kv_out;
  const float* const* const* table;
};

// The pre-LN blocks over m token rows, layer by layer (so a token may read
// the K/V of a token of the same pass written at this layer: the full
// forward of recompute and rebuild).
template <class V, bool F>
MZ_INLINE void blocks(const UzNet& net, UzScratch& sc, int64_t m, const Pass& p) {
  constexpr int W = Lanes<V>::W;
  const int64_t E = net.E, EP = round_up16(E), Dh = net.Dh, half = Dh / 2;
  std::vector<float>& scores = sc.out2;  // free during the blocks
  for (int64_t l = 0; l < net.L; ++l) {
    const UzLayer& ly = net.layers[l];
    const int64_t J3 = ly.qkv.J, off = l * 2 * E;
    for (int64_t r = 0; r < m; ++r)
      layer_norm(sc.x.data() + r * EP, E, ly.ln1_w.data(), ly.ln1_b.data(), net.ln_eps,
                 sc.a.data() + r * EP);
    dense_rows<V, F>(ly.qkv, sc, m, sc.a.data(), EP, sc.qkv.data(), J3);
    for (int64_t r = 0; r < m; ++r) {
      float* q = sc.qkv.data() + r * J3;
      if (net.rope) {
        const float* c = net.cos.data() + p.slot[r] * half;
        const float* s = net.sin.data() + p.slot[r] * half;
        for (int64_t t = 0; t < 2; ++t)  // q, then k
          for (int64_t h = 0; h < net.H; ++h) {
            float* v = q + t * E + h * Dh;
            for (int64_t i = 0; i < half; ++i) {
              const float x1 = v[i], x2 = v[i + half];
              v[i] = x1 * c[i] - x2 * s[i];
              v[i + half] = x1 * s[i] + x2 * c[i];
            }
          }
      }
      std::copy_n(q + E, 2 * E, p.kv_out[r] + off);  // k, v of this layer
    }
    for (int64_t r = 0; r < m; ++r) {
      const float* q = sc.qkv.data() + r * J3;
      const float* const* tab = p.table[r];
      const int64_t S = p.slot[r] + 1;
      float* out = sc.att.data() + r * EP;
      for (int64_t h = 0; h < net.H; ++h) {
        float mx = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < S; ++j) {
          const float s = dot<V>(q + h * Dh, tab[j] + off + h * Dh, Dh) * net.scale;
          scores[j] = s;
          mx = std::max(mx, s);
        }
        float sum = 0.0f;
        for (int64_t j = 0; j < S; ++j) sum += (scores[j] = std::exp(scores[j] - mx));
        for (int64_t i = 0; i < Dh; i += W) {
          V acc = vsplat<V>(0.0f);
          for (int64_t j = 0; j < S; ++j)
            acc += vload<V>(tab[j] + off + E + h * Dh + i) * (scores[j] / sum);
          vstore(out + h * Dh + i, acc);
        }
      }
    }
    dense_rows<V, F>(ly.proj, sc, m, sc.att.data(), EP, sc.out1.data(), ly.proj.J);
    for (int64_t r = 0; r < m; ++r)
      for (int64_t i = 0; i < E; ++i) sc.x[r * EP + i] += sc.out1[r * ly.proj.J + i];
    for (int64_t r = 0; r < m; ++r)
      layer_norm(sc.x.data() + r * EP, E, ly.ln2_w.data(), ly.ln2_b.data(), net.ln_eps,
                 sc.a.data() + r * EP);
    dense_rows<V, F>(ly.fc1, sc, m, sc.a.data(), EP, sc.hid.data(), ly.fc1.J);
    gelu_rows<V>(sc.hid.data(), m, ly.fc1.J, ly.fc1.J);
    dense_rows<V, F>(ly.fc2, sc, m, sc.hid.data(), ly.fc1.J, sc.out1.data(), ly.fc2.J);
    for (int64_t r = 0; r < m; ++r)
      for (int64_t i = 0; i < E; ++i) sc.x[r * EP + i] += sc.out1[r * ly.fc2.J + i];
  }
}

// The blocks and the heads (below) are called, not inlined, from the steps
// and the roots: one out-of-line copy per build (baseline, AVX2, FMA), each
// with the kernels inlined as before. Inlined at their eight call sites
// (twice per token pass, in the full forward, in the roots), the transformer
// layers made this file the kernel build's longest to compile
// (docs/performance_search.md, "C++ kernel build time"); a
// call per pass of the layers costs nothing next to the pass, and a copy's
// code and results are the inlined ones'.
__attribute__((noinline)) void blocks_baseline(const UzNet& net, UzScratch& sc, int64_t m,
                                               const Pass& p) {
  blocks<v4f, false>(net, sc, m, p);
}

#ifdef MZ_X86_AVX2_PATH
__attribute__((noinline, target("avx2"))) void blocks_avx2(const UzNet& net, UzScratch& sc,
                                                           int64_t m, const Pass& p) {
  blocks<v8f, false>(net, sc, m, p);
}

__attribute__((noinline, target("avx2,fma"))) void blocks_fma(const UzNet& net, UzScratch& sc,
                                                              int64_t m, const Pass& p) {
  blocks<v8f, true>(net, sc, m, p);
}
#endif

// blocks<V, F> through the copy of its build.
template <class V, bool F>
MZ_INLINE void run_blocks(const UzNet& net, UzScratch& sc, int64_t m, const Pass& p) {
  if constexpr (std::is_same_v<V, v4f>) {
    static_assert(!F, "the FMA path is 8 wide");
    blocks_baseline(net, sc, m, p);
  } else {
#ifdef MZ_X86_AVX2_PATH
    if constexpr (F)
      blocks_fma(net, sc, m, p);
    else
      blocks_avx2(net, sc, m, p);
#endif
  }
}

// Input token t of a context (latents [MB, E], actions [MB]) into `x`.
MZ_INLINE void context_token(const UzNet& net, const float* lat, const int64_t* act,
                             int64_t t, float* x) {
  const int64_t E = net.E;
  const float* src = t % 2 == 0 ? lat + (t / 2) * E
                                : net.action_emb.data() + std::max<int64_t>(act[t / 2], 0) * E;
  std::copy_n(src, E, x);
  if (net.absolute)
    for (int64_t i = 0; i < E; ++i) x[i] += net.pos_emb[t * E + i];
}

// A full causal forward over the first T tokens of a context, K/V into
// kv_base [T, slot]; the residual stream of every token is left in sc.x.
template <class V, bool F>
MZ_INLINE void full_forward(const UzNet& net, UzScratch& sc, const float* lat,
                            const int64_t* act, int64_t T, float* kv_base) {
  const int64_t EP = round_up16(net.E), SF = net.slot_floats();
  static thread_local std::vector<int64_t> slot;
  static thread_local std::vector<float*> kv_out;
  static thread_local std::vector<const float* const*> table;
  slot.resize(T);
  kv_out.resize(T);
  table.resize(T);
  for (int64_t t = 0; t < T; ++t) {
    context_token(net, lat, act, t, sc.x.data() + t * EP);
    slot[t] = t;
    kv_out[t] = kv_base + t * SF;
    sc.table[t] = kv_base + t * SF;
    table[t] = sc.table.data();
  }
  run_blocks<V, F>(net, sc, T, Pass{slot.data(), kv_out.data(), table.data()});
}

// One new token per tree row (cache mode) or one full forward per row
// (recompute), then the final LayerNorm of each row's new token into sc.h.
// `inputs[s]` is the new token (E floats) of row s; lp[s] its slot.
template <class V, bool F>
MZ_INLINE void token_pass(const UzNet& net, UzScratch& sc, int64_t n, UzRows& rows,
                          bool cache, const int64_t* lp, const float* const* inputs) {
  const int64_t E = net.E, EP = round_up16(E), SF = net.slot_floats();
  if (cache) {
    int64_t slot[kGroup];
    float* kv_out[kGroup];
    const float* const* table[kGroup];
    for (int64_t s = 0; s < n; ++s) {
      float* x = sc.x.data() + s * EP;
      std::copy_n(inputs[s], E, x);
      if (net.absolute)
        for (int64_t i = 0; i < E; ++i) x[i] += net.pos_emb[lp[s] * E + i];
      slot[s] = lp[s];
      kv_out[s] = rows.c_kv[s] + lp[s] * SF;
      rows.slots[s][lp[s]] = kv_out[s];
      table[s] = rows.slots[s];
    }
    run_blocks<V, F>(net, sc, n, Pass{slot, kv_out, table});
    for (int64_t s = 0; s < n; ++s)
      layer_norm(sc.x.data() + s * EP, E, net.lnf_w.data(), net.lnf_b.data(), net.ln_eps,
                 sc.h.data() + s * EP);
    return;
  }
  for (int64_t s = 0; s < n; ++s) {  // the context already holds the new token
    const int64_t T = lp[s] + 1;
    full_forward<V, F>(net, sc, rows.c_latents[s], rows.c_actions[s], T, sc.kv.data());
    layer_norm(sc.x.data() + (T - 1) * EP, E, net.lnf_w.data(), net.lnf_b.data(), net.ln_eps,
               sc.h.data() + s * EP);
  }
}

// The two heads read at one token: a shared first layer of GELU units
// (trunk), then out1 = first head (rows of sc.out1), out2 = second (sc.out2).
template <class V, bool F>
MZ_INLINE void heads(const Dense& trunk, const Dense& first, const Dense& second,
                     UzScratch& sc, int64_t n, int64_t EP) {
  dense_rows<V, F>(trunk, sc, n, sc.h.data(), EP, sc.trunk.data(), trunk.J);
  gelu_rows<V>(sc.trunk.data(), n, trunk.J, trunk.J);
  dense_rows<V, F>(first, sc, n, sc.trunk.data(), trunk.J, sc.out1.data(), first.J);
  dense_rows<V, F>(second, sc, n, sc.trunk.data() + round_up16(first.K), trunk.J,
                sc.out2.data(), second.J);
}

// Out-of-line copies of heads, as of blocks above.
__attribute__((noinline)) void heads_baseline(const Dense& trunk, const Dense& first,
                                              const Dense& second, UzScratch& sc, int64_t n,
                                              int64_t EP) {
  heads<v4f, false>(trunk, first, second, sc, n, EP);
}

#ifdef MZ_X86_AVX2_PATH
__attribute__((noinline, target("avx2"))) void heads_avx2(const Dense& trunk, const Dense& first,
                                                          const Dense& second, UzScratch& sc,
                                                          int64_t n, int64_t EP) {
  heads<v8f, false>(trunk, first, second, sc, n, EP);
}

__attribute__((noinline, target("avx2,fma"))) void heads_fma(const Dense& trunk,
                                                             const Dense& first,
                                                             const Dense& second, UzScratch& sc,
                                                             int64_t n, int64_t EP) {
  heads<v8f, true>(trunk, first, second, sc, n, EP);
}
#endif

template <class V, bool F>
MZ_INLINE void run_heads(const Dense& trunk, const Dense& first, const Dense& second,
                         UzScratch& sc, int64_t n, int64_t EP) {
  if constexpr (std::is_same_v<V, v4f>) {
    static_assert(!F, "the FMA path is 8 wide");
    heads_baseline(trunk, first, second, sc, n, EP);
  } else {
#ifdef MZ_X86_AVX2_PATH
    if constexpr (F)
      heads_fma(trunk, first, second, sc, n, EP);
    else
      heads_avx2(trunk, first, second, sc, n, EP);
#endif
  }
}

template <class V, bool F>
MZ_INLINE void uz_step_impl(const UzNet& net, UzScratch& sc, int64_t n, UzRows& rows,
                            bool cache, float* logits) {
  const int64_t E = net.E, EP = round_up16(E), MB = net.MB, A = net.A, SF = net.slot_floats();
  int64_t lp[kGroup];
  const float* inputs[kGroup];
  // The children's contexts: the parent's (slid at the context limit, as
  // model._slide), with the action appended.
  for (int64_t s = 0; s < n; ++s) {
    int64_t len = rows.p_length[s];
    float* cl = rows.c_latents[s];
    int64_t* ca = rows.c_actions[s];
    rows.slid[s] = (len + 1) / 2 >= MB;
    if (rows.slid[s]) {
      const int64_t keep = net.ctx + 1, drop = MB - keep;
      std::fill(cl, cl + MB * E, 0.0f);
      std::copy_n(rows.p_latents[s] + drop * E, keep * E, cl);
      std::fill(ca, ca + MB, int64_t{-1});
      std::copy_n(rows.p_actions[s] + drop, keep - 1, ca);
      len = 2 * keep - 1;
    } else {
      std::copy_n(rows.p_latents[s], MB * E, cl);
      std::copy_n(rows.p_actions[s], MB, ca);
    }
    ca[(len + 1) / 2 - 1] = rows.action[s];
    lp[s] = len;
    rows.c_length[s] = len + 2;
    if (cache && rows.slid[s]) {  // the window's K/V, exact: a full forward from slot 0
      std::fill(rows.c_kv[s], rows.c_kv[s] + net.MT * SF, 0.0f);
      full_forward<V, F>(net, sc, cl, ca, len, rows.c_kv[s]);
      for (int64_t i = 0; i < len; ++i) rows.slots[s][i] = rows.c_kv[s] + i * SF;
    }
    inputs[s] = net.action_emb.data() + rows.action[s] * E;
  }
  // The action token: reward and next latent.
  token_pass<V, F>(net, sc, n, rows, cache, lp, inputs);
  run_heads<V, F>(net.act_trunk, net.latent_out, net.reward_out, sc, n, EP);
  for (int64_t s = 0; s < n; ++s) {
    const float* raw = sc.out1.data() + s * net.latent_out.J;
    float* next = rows.c_latents[s] + ((lp[s] + 1) / 2) * E;
    if (net.simnorm > 0) {
      for (int64_t g = 0; g < E; g += net.simnorm) softmax_into(raw + g, net.simnorm, next + g);
    } else {
      layer_norm(raw, E, net.norm_w.data(), net.norm_b.data(), net.norm_eps, next);
    }
    rows.reward[s] = net.reward_h(bin_expectation<V, F>(sc.out2.data() + s * net.reward_out.J,
                                                     net.reward_bins.data(), net.R));
    inputs[s] = next;
    lp[s] += 1;
  }
  // The predicted latent token: policy and value.
  token_pass<V, F>(net, sc, n, rows, cache, lp, inputs);
  run_heads<V, F>(net.lat_trunk, net.policy_out, net.value_out, sc, n, EP);
  for (int64_t s = 0; s < n; ++s) {
    const float* lg = sc.out1.data() + s * net.policy_out.J;
    std::copy_n(lg, A, logits + s * A);
    rows.value[s] = net.value_h(bin_expectation<V, F>(sc.out2.data() + s * net.value_out.J,
                                                   net.value_bins.data(), net.V));
  }
}

// Token rows per pass of the roots' forward: enough that every linear layer
// runs full 4-row tiles and streams its weights once for many roots (one
// CartPole-sized root is 9 rows), few enough that a pass's activations stay
// in L2.
constexpr int64_t kRootRows = 128;

// sc's activation buffers for `rows` token rows (the residual stream and
// norm buffers zeroed), as every pass of the blocks and heads reads them.
void size_rows(const UzNet& net, UzScratch& sc, int64_t rows) {
  const int64_t EP = round_up16(net.E);
  int64_t out1 = std::max(net.latent_out.J, net.policy_out.J);
  for (const UzLayer& ly : net.layers) out1 = std::max({out1, ly.proj.J, ly.fc2.J});
  sc.rows = rows;
  for (std::vector<float>* v : {&sc.x, &sc.a, &sc.att, &sc.h}) v->assign(rows * EP, 0.0f);
  sc.qkv.resize(rows * net.layers[0].qkv.J);
  sc.hid.resize(rows * net.layers[0].fc1.J);
  sc.trunk.resize(rows * std::max(net.act_trunk.J, net.lat_trunk.J));
  sc.out1.resize(rows * out1);
  sc.out2.resize(std::max(rows * std::max(net.reward_out.J, net.value_out.J), net.MT));
}

// The roots of B contexts (context b: latents lat + b * ls, actions act + b *
// as, its first length[b] tokens), a group of them per pass of the blocks:
// their token rows side by side (each row's slot table points at its own
// root's K/V), so every linear layer runs over all of the group's rows. A
// row's arithmetic does not depend on the other rows of its pass, so each
// root gets exactly what a pass of its own gives.
template <class V, bool F>
MZ_INLINE void uz_roots_impl(const UzNet& net, UzScratch& sc, int64_t B, const float* lat,
                             int64_t ls, const int64_t* act, int64_t as, const int64_t* length,
                             float* kv, float* logits, float* value) {
  const int64_t EP = round_up16(net.E), SF = net.slot_floats(), MT = net.MT;
  static thread_local std::vector<int64_t> slot, last;
  static thread_local std::vector<float*> kv_out;
  static thread_local std::vector<const float* const*> table;
  static thread_local std::vector<const float*> slots;  // MT slot pointers per root of a group
  static thread_local std::vector<float> own_kv;       // the group's K/V when the caller keeps none
  for (int64_t b0 = 0; b0 < B;) {
    int64_t b1 = b0, m = 0;  // the group: at least one root, at most kRootRows rows otherwise
    while (b1 < B && (b1 == b0 || m + length[b1] <= kRootRows)) m += length[b1++];
    const int64_t G = b1 - b0;
    if (std::max(m, G) > sc.rows) size_rows(net, sc, std::max(m, G));
    slot.resize(m);
    kv_out.resize(m);
    table.resize(m);
    last.resize(G);
    slots.assign(G * MT, nullptr);
    if (kv == nullptr) own_kv.resize(G * MT * SF);
    for (int64_t g = 0, r = 0; g < G; ++g) {
      const int64_t b = b0 + g;
      float* base = kv != nullptr ? kv + b * MT * SF : own_kv.data() + g * MT * SF;
      for (int64_t t = 0; t < length[b]; ++t, ++r) {
        context_token(net, lat + b * ls, act + b * as, t, sc.x.data() + r * EP);
        slot[r] = t;
        kv_out[r] = base + t * SF;
        slots[g * MT + t] = kv_out[r];
        table[r] = slots.data() + g * MT;
      }
      last[g] = r - 1;
    }
    run_blocks<V, F>(net, sc, m, Pass{slot.data(), kv_out.data(), table.data()});
    for (int64_t g = 0; g < G; ++g)
      layer_norm(sc.x.data() + last[g] * EP, net.E, net.lnf_w.data(), net.lnf_b.data(),
                 net.ln_eps, sc.h.data() + g * EP);
    run_heads<V, F>(net.lat_trunk, net.policy_out, net.value_out, sc, G, EP);
    for (int64_t g = 0; g < G; ++g) {
      std::copy_n(sc.out1.data() + g * net.policy_out.J, net.A, logits + (b0 + g) * net.A);
      value[b0 + g] = net.value_h(bin_expectation<V, F>(sc.out2.data() + g * net.value_out.J,
                                                        net.value_bins.data(), net.V));
    }
    b0 = b1;
  }
}

void uz_roots_baseline(const UzNet& net, UzScratch& sc, int64_t B, const float* lat, int64_t ls,
                       const int64_t* act, int64_t as, const int64_t* length, float* kv,
                       float* logits, float* value) {
  uz_roots_impl<v4f, false>(net, sc, B, lat, ls, act, as, length, kv, logits, value);
}

#ifdef MZ_X86_AVX2_PATH
__attribute__((target("avx2"))) void uz_roots_avx2(const UzNet& net, UzScratch& sc, int64_t B,
                                                   const float* lat, int64_t ls,
                                                   const int64_t* act, int64_t as,
                                                   const int64_t* length, float* kv,
                                                   float* logits, float* value) {
  uz_roots_impl<v8f, false>(net, sc, B, lat, ls, act, as, length, kv, logits, value);
}
#endif

void uz_step_baseline(const UzNet& net, UzScratch& sc, int64_t n, UzRows& rows, bool cache,
                      float* logits) {
  uz_step_impl<v4f, false>(net, sc, n, rows, cache, logits);
}

#ifdef MZ_X86_AVX2_PATH
__attribute__((target("avx2"))) void uz_step_avx2(const UzNet& net, UzScratch& sc, int64_t n,
                                                  UzRows& rows, bool cache, float* logits) {
  uz_step_impl<v8f, false>(net, sc, n, rows, cache, logits);
}

// The opt-in FMA copy (see mlp_net.cpp): the linear layers and the decodes
// fused; attention, LayerNorm, GELU and SimNorm stay the exact path's.
__attribute__((target("avx2,fma"))) void uz_step_fma(const UzNet& net, UzScratch& sc, int64_t n,
                                                     UzRows& rows, bool cache, float* logits) {
  uz_step_impl<v8f, true>(net, sc, n, rows, cache, logits);
}
#endif

std::vector<float> copy_of(const at::Tensor& t) {
  return std::vector<float>(t.data_ptr<float>(), t.data_ptr<float>() + t.numel());
}

// [J, K] linear layer(s) packed k-major; several share one Dense at
// 16-aligned output offsets.
void pack_linear(Dense& d, const at::Tensor& w, const at::Tensor& b, int64_t j_off) {
  pack_block(d, w.data_ptr<float>(), w.size(1), 0, 0, w.size(0), w.size(1), b.data_ptr<float>(),
             j_off);
}

void init_linear(Dense& d, const at::Tensor& w, const char* name, int64_t K) {
  TORCH_CHECK(w.dim() == 2 && w.size(1) == K, "unizero_search: `", name, "` must be [*, ", K,
              "], got ", w.sizes());
  init_dense(d, K, w.size(0));
}

}  // namespace

// ints: num_layers, num_heads, max_blocks, context_length, simnorm_dim (0:
// LayerNorm latent norm), num_actions, absolute positions (0: RoPE).
// floats: transformer LayerNorm eps, latent-norm eps, reward eps, value eps.
// weights: action_embedding [A, E], pos_emb [MT, E] | [0], rope cos, sin
// [MT, Dh / 2] | [0]; per layer ln1 w, b, qkv w, b, proj w, b, ln2 w, b,
// fc1 w, b, fc2 w, b; ln_f w, b; latent, reward, policy, value heads (w0,
// b0, w2, b2 each); latent norm w, b | [0]; reward bins, value bins.
namespace {

// Packs ~130k floats into the kernel's layouts (pack_unizero's cache keeps the result).
void pack_into(UzNet& net, const std::vector<at::Tensor>& weights, const std::vector<int64_t>& ints,
               const std::vector<double>& floats) {
  const int64_t L = ints[0];
  const at::Tensor& emb = weights[0];
  TORCH_CHECK(emb.dim() == 2, "unizero_search: action_embedding must be 2-d");
  net.A = ints[5];
  net.E = emb.size(1);
  net.L = L;
  net.H = ints[1];
  TORCH_CHECK(net.A == emb.size(0) && net.H >= 1 && net.E % net.H == 0,
              "unizero_search: bad embedding / head sizes");
  net.Dh = net.E / net.H;
  TORCH_CHECK(net.Dh % 8 == 0, "unizero_search: head_dim must be a multiple of 8");
  net.MB = ints[2];
  net.MT = 2 * net.MB;
  net.ctx = ints[3];
  net.simnorm = ints[4];
  net.absolute = ints[6] != 0;
  net.rope = !net.absolute;
  net.ln_eps = static_cast<float>(floats[0]);
  net.norm_eps = static_cast<float>(floats[1]);
  net.reward_h = InverseH(floats[2]);
  net.value_h = InverseH(floats[3]);
  net.scale = 1.0f / std::sqrt(static_cast<float>(net.Dh));
  const int64_t E = net.E;
  net.action_emb = copy_of(emb);
  if (net.absolute) {
    check_weight(weights[1], "pos_emb", {net.MT, E}, "unizero_search");
  } else {
    check_weight(weights[2], "rope cos", {net.MT, net.Dh / 2}, "unizero_search");
    check_weight(weights[3], "rope sin", {net.MT, net.Dh / 2}, "unizero_search");
  }
  net.pos_emb = copy_of(weights[1]);
  net.cos = copy_of(weights[2]);
  net.sin = copy_of(weights[3]);
  net.layers.resize(L);
  for (int64_t l = 0; l < L; ++l) {
    const at::Tensor* w = weights.data() + 4 + 12 * l;
    UzLayer& ly = net.layers[l];
    ly.ln1_w = copy_of(w[0]);
    ly.ln1_b = copy_of(w[1]);
    ly.ln2_w = copy_of(w[6]);
    ly.ln2_b = copy_of(w[7]);
    TORCH_CHECK(w[2].dim() == 2 && w[2].size(0) == 3 * E, "unizero_search: qkv must be [3E, E]");
    init_linear(ly.qkv, w[2], "qkv", E);
    pack_linear(ly.qkv, w[2], w[3], 0);
    init_linear(ly.proj, w[4], "proj", E);
    pack_linear(ly.proj, w[4], w[5], 0);
    init_linear(ly.fc1, w[8], "fc1", E);
    pack_linear(ly.fc1, w[8], w[9], 0);
    init_linear(ly.fc2, w[10], "fc2", w[8].size(0));
    pack_linear(ly.fc2, w[10], w[11], 0);
  }
  const at::Tensor* h = weights.data() + 4 + 12 * L;
  net.lnf_w = copy_of(h[0]);
  net.lnf_b = copy_of(h[1]);
  // Heads: latent (h[2..5]), reward (h[6..9]), policy (h[10..13]), value (h[14..17]).
  auto trunk_pair = [&](Dense& trunk, const at::Tensor* a, const at::Tensor* b) {
    TORCH_CHECK(a[0].dim() == 2 && b[0].dim() == 2 && a[0].size(1) == E && b[0].size(1) == E,
                "unizero_search: head first layers must be [*, E]");
    const int64_t off = round_up16(a[0].size(0));
    init_dense(trunk, E, off + b[0].size(0));
    pack_linear(trunk, a[0], a[1], 0);
    pack_linear(trunk, b[0], b[1], off);
  };
  trunk_pair(net.act_trunk, h + 2, h + 6);
  trunk_pair(net.lat_trunk, h + 10, h + 14);
  init_linear(net.latent_out, h[4], "latent_head.2", h[2].size(0));
  pack_linear(net.latent_out, h[4], h[5], 0);
  TORCH_CHECK(h[4].size(0) == E, "unizero_search: latent head must output E");
  init_linear(net.reward_out, h[8], "reward_head.2", h[6].size(0));
  pack_linear(net.reward_out, h[8], h[9], 0);
  init_linear(net.policy_out, h[12], "policy_head.2", h[10].size(0));
  pack_linear(net.policy_out, h[12], h[13], 0);
  TORCH_CHECK(h[12].size(0) == net.A, "unizero_search: policy head must output A");
  init_linear(net.value_out, h[16], "value_head.2", h[14].size(0));
  pack_linear(net.value_out, h[16], h[17], 0);
  net.norm_w = copy_of(h[18]);
  net.norm_b = copy_of(h[19]);
  TORCH_CHECK(net.simnorm > 0 ? E % net.simnorm == 0 : static_cast<int64_t>(net.norm_w.size()) == E,
              "unizero_search: bad latent norm");
  net.reward_bins = copy_of(h[20]);
  net.value_bins = copy_of(h[21]);
  net.R = h[8].size(0);
  net.V = h[16].size(0);
  TORCH_CHECK(static_cast<int64_t>(net.reward_bins.size()) == net.R &&
                  static_cast<int64_t>(net.value_bins.size()) == net.V,
              "unizero_search: support bins do not match the heads");
}

}  // namespace


const UzNet& pack_unizero(const std::vector<at::Tensor>& weights,
                          const std::vector<int64_t>& ints,
                          const std::vector<double>& floats) {
  // Four models per thread: the benchmark's two modes and two torch-step roots, an
  // evaluation model beside the acting one (pack_cache.h: why, and the value check).
  thread_local PackCache<UzNet, 4> packed;
  TORCH_CHECK(ints.size() == 7 && floats.size() == 4, "unizero_search: expected 7 ints and 4 floats");
  const int64_t L = ints[0];
  TORCH_CHECK(L >= 1 && static_cast<int64_t>(weights.size()) == 4 + 12 * L + 22,
              "unizero_search: expected ", 4 + 12 * L + 22, " weight tensors, got ", weights.size());
  for (size_t i = 0; i < weights.size(); ++i)
    TORCH_CHECK(weights[i].defined() && weights[i].device().is_cpu() &&
                    weights[i].scalar_type() == at::kFloat && weights[i].is_contiguous(),
                "unizero_search: weight ", i, " must be a contiguous float32 CPU tensor");
  PackKey key;
  key.reserve(weights.size() + ints.size() + floats.size());
  for (const at::Tensor& w : weights) key.emplace_back(w.data_ptr(), w.numel());
  for (int64_t v : ints) key.emplace_back(nullptr, v);
  for (double v : floats) key.emplace_back(nullptr, static_cast<int64_t>(std::hash<double>{}(v)));
  return packed.get(std::move(key), weights, [&](UzNet& net) { pack_into(net, weights, ints, floats); });
}

UzScratch& thread_uz_scratch(const UzNet& net) {
  thread_local UzScratch sc;
  size_rows(net, sc, std::max(kGroup, net.MT));
  sc.kv.assign(net.MT * net.slot_floats(), 0.0f);
  sc.table.assign(net.MT, nullptr);
  return sc;
}

void uz_step(const UzNet& net, UzScratch& sc, int64_t n, UzRows& rows, bool cache,
             float* logits, bool baseline, bool fma) {
#ifdef MZ_X86_AVX2_PATH
  if (fma && cpu_has_avx2_fma()) return uz_step_fma(net, sc, n, rows, cache, logits);
  if (!baseline && cpu_has_avx2()) return uz_step_avx2(net, sc, n, rows, cache, logits);
#endif
  uz_step_baseline(net, sc, n, rows, cache, logits);
}

void uz_roots(const UzNet& net, UzScratch& sc, int64_t B, const float* latents,
              int64_t latent_stride, const int64_t* actions, int64_t action_stride,
              const int64_t* length, float* kv, float* logits, float* value, bool baseline) {
#ifdef MZ_X86_AVX2_PATH
  if (!baseline && cpu_has_avx2())
    return uz_roots_avx2(net, sc, B, latents, latent_stride, actions, action_stride, length, kv,
                         logits, value);
#endif
  uz_roots_baseline(net, sc, B, latents, latent_stride, actions, action_stride, length, kv, logits,
                    value);
}

}  // namespace tree_ops

#endif  // MZ_HAVE_MLP_SEARCH
