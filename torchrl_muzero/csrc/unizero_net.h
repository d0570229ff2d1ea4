// The network step of the fused UniZero search (unizero_search.cpp):
// UniZeroModel.search_step (modules/unizero/model.py) as raw vectorised
// loops, with the exact KV cache keyed by tree node.
// ---------------------------------------------------------------------------
// Why: a torch search step of the UniZero world model is mostly per-op
// dispatch at B = 1 whatever its token count (two one-token passes through
// the layers, the four heads, the TensorDict node state), so the KV cache
// saved almost nothing over recomputing the context. Here a step is
// arithmetic only and the cache's saving shows (figures:
// docs/performance_search.md, "Design figures quoted from the code").
//
// The step mirrors search_step on a parent node whose context is the token
// sequence [z_0, a_0, ..., z_{n-1}] at slots 0 .. lp - 1 (lp = 2n - 1):
//   * when the parent holds max_blocks latents, the context first slides to
//     its last context_length + 1 latents (model._slide, positions from 0);
//   * token a (slot lp): the action embedding (+ pos_emb[lp] for absolute
//     positions) through the pre-LN blocks, final LayerNorm -> h_a;
//     reward logits = reward_head(h_a), next latent = norm(latent_head(h_a))
//     (SimNorm: softmax per group, or LayerNorm);
//   * token z' (slot lp + 1): the next latent through the blocks -> h_z;
//     policy logits = policy_head(h_z), value logits = value_head(h_z);
//   * reward / value = h^-1(E[bin] of softmax(logits)), prior = softmax.
// A block: x += proj(attn(ln1(x))), x += fc2(gelu(fc1(ln2(x)))); attn is
// causal softmax(q k^T / sqrt(Dh)) v over the slots <= the token's, RoPE in
// the "rotate half" convention on q and k (the model's cos/sin tables are
// passed in), GELU exact (erf).
//
// The cache (kv_cache=True). A node's K/V buffer has the layout of the
// model's node state, [max_tokens, num_layers, 2, H, Dh]; during a search a
// node writes only its own two slots there (the root, and a node whose
// context slid, hold their whole window), and a new token's attention reads
// each slot from the node that owns it, found by walking the parent links
// (UzRows::slots). So the cache is keyed by (tree, node) and a miss is
// impossible. The search leaves a node's other slots unwritten (nothing reads
// them); complete_node_states (modules/unizero/node_states.py) rebuilds
// search_step's full buffers on demand.
// Recompute (kv_cache=False): every step runs two full causal forwards over
// the node's whole token sequence (as the model's kv_cache=False does), so
// cache vs recompute is measured in one engine.
//
// Numerical contract: float32, products rounded before their additions
// (fp-contract off), fixed summation orders, so a row's result depends
// neither on the batch nor on the vector width; it is not bit-identical to
// torch (MKL's GEMM order, Sleef's exp/erf): test/test_unizero_fused.py
// bounds the difference. Unsupported here (the search falls back to the
// torch step, see model.fused_unizero_weights): on_overflow="error", a
// head_dim that is not a multiple of 8, non-float32 or non-CPU models.
// ---------------------------------------------------------------------------
#pragma once

#include "mlp_net.h"

#ifdef MZ_HAVE_MLP_SEARCH

namespace tree_ops {

struct UzLayer {
  std::vector<float> ln1_w, ln1_b, ln2_w, ln2_b;
  Dense qkv, proj, fc1, fc2;
};

struct UzNet {
  int64_t E = 0, A = 0, L = 0, H = 0, Dh = 0, MB = 0, MT = 0, ctx = 0;
  int64_t R = 0, V = 0, simnorm = 0;  // simnorm 0: LayerNorm latent norm
  bool rope = false, absolute = false;
  float ln_eps = 1e-5f, norm_eps = 1e-5f, scale = 1.0f;
  std::vector<float> action_emb, pos_emb, cos, sin;  // [A, E], [MT, E], [MT, Dh / 2]
  std::vector<UzLayer> layers;
  std::vector<float> lnf_w, lnf_b, norm_w, norm_b, reward_bins, value_bins;
  // Both heads read at one token share a first layer: [latent | reward]
  // hidden units at the action token, [policy | value] at the latent token.
  Dense act_trunk, latent_out, reward_out, lat_trunk, policy_out, value_out;
  InverseH reward_h{1e-3}, value_h{1e-3};
  // Packed from tensors at these addresses and sizes, with these ints and floats, ...
  std::vector<std::pair<const void*, int64_t>> key;
  // ... holding these values (all weights, concatenated): a reuse compares contents.
  std::vector<float> source;
  int64_t slot_floats() const { return L * 2 * E; }  // one slot of a K/V buffer
};

// Per-thread activation buffers for up to max(kGroup, MT) token rows.
struct UzScratch {
  int64_t rows = 0;
  std::vector<float> x, a, qkv, att, hid, h, trunk, out1, out2, kv;
  std::vector<const float*> table;  // recompute / rebuild: slot pointers
};

// n <= kGroup tree rows of a step: the parents' contexts, the children's
// storage, and what the step returns per row.
struct UzRows {
  const float* p_latents[kGroup];  // [MB, E]
  const int64_t* p_actions[kGroup];  // [MB]
  int64_t p_length[kGroup];
  int64_t action[kGroup];
  float* c_latents[kGroup];
  int64_t* c_actions[kGroup];
  float* c_kv[kGroup];  // cache mode: the child's [MT, slot] buffer
  // Cache mode: slots[s][i] points at slot i (i < p_length) of row s's
  // context; the step sets the child's own slots. Row s's array has MT
  // entries.
  const float** slots[kGroup];
  int64_t c_length[kGroup];
  bool slid[kGroup];  // the context slid (the child owns all its slots)
  float reward[kGroup], value[kGroup];
};

// weights: the tensors of UniZeroModel.fused_unizero_weights() (order in
// unizero_net.cpp); packed per thread and kept while the same tensors come
// back holding the same values, for a few models at once (pack_cache.h).
const UzNet& pack_unizero(const std::vector<at::Tensor>& weights,
                          const std::vector<int64_t>& ints,
                          const std::vector<double>& floats);

UzScratch& thread_uz_scratch(const UzNet& net);

// search_step for n rows: cache mode when `cache`, else recompute. Writes
// the children's latents / actions (and own K/V slots), c_length, slid,
// reward, value and the policy logits [n, A] (the prior is their
// softmax_prior, fused_loop.h).
void uz_step(const UzNet& net, UzScratch& sc, int64_t n, UzRows& rows,
             bool cache, float* logits, bool baseline = false, bool fma = false);

// The roots (model.root_from_latents after the packing): for each of B
// contexts (latents + b * latent_stride [MB, E], actions + b * action_stride
// [MB]) a full forward over its first length[b] tokens, K/V into
// kv + b * MT * slot when kv is not null (slots from length[b] on are left
// as they are), the policy logits [A] (logits + b * A) and the decoded value
// of its last (latent) token. Several roots share each pass through the
// layers; every root's result is what a pass of its own gives.
void uz_roots(const UzNet& net, UzScratch& sc, int64_t B, const float* latents,
              int64_t latent_stride, const int64_t* actions, int64_t action_stride,
              const int64_t* length, float* kv, float* logits, float* value,
              bool baseline = false);

}  // namespace tree_ops

#endif  // MZ_HAVE_MLP_SEARCH
