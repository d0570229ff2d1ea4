// The network step of the fused EfficientZero search (ez_search.cpp):
// EfficientZeroMLPModel.search_step with one hidden layer per network, as
// raw vectorised loops (the layers and decode of mlp_kernels.h).
// ---------------------------------------------------------------------------
// Why: the per-simulation torch step of EfficientZero costs ~50 aten calls
// (the MLP's plus the LSTM cell, LayerNorm and the TensorDict node state),
// which dominates the search at every batch size of the canonical case.
//
// The step mirrors EfficientZeroModel.search_step on a parent node (latent x,
// LSTM state (h, c), stored prefix p, steps since the last reset t):
//   next   = scale_latent(W2 relu((W1[:, :L] x + b1) + W1[:, L + a]) + b2)
//   gates  = (W_hh h + b_hh) + (W_ih next + b_ih)      torch LSTMCell, i f g o
//   c'     = (sigmoid(f) * c) + (sigmoid(i) * tanh(g));  h' = sigmoid(o) * tanh(c')
//   prefix = h^-1(E_r[bin] of softmax(Wv2 relu(Wv1 relu(LayerNorm(h')) + bv1) + bv2))
//   [policy logits | value logits] = Wp2 relu(Wp1 next + bp1) + bp2
//   value  = h^-1(E_v[bin]);  prior = softmax(policy logits)
//   reward = prefix - p;  t' = t + 1;  when t' >= H: h' = c' = 0, stored
//   prefix 0, t' = 0 (after the reward is taken).
// Numerical contract: that of mlp_net.h (float32, products rounded before
// their additions, fixed summation order, so a row's result depends neither
// on the batch size nor on the vector width), plus:
//   * sigmoid(x) = 1 / (1 + exp(-x)) as ATen writes it, tanh as Cephes'
//     tanhf (odd polynomial below |x| = 0.625, 1 - 2 / (exp(2|x|) + 1)
//     above), with the Cephes exp of mlp_kernels.h: each within ~2 float ulps
//     of ATen's Sleef functions;
//   * LayerNorm: mean = sum(x) / K and var = sum((x - mean)^2) / K (biased),
//     each sum over 8 fixed partial sums; y = ((x - mean) * rstd) * gamma +
//     beta with rstd = 1 / sqrt(var + eps).
// test/test_efficientzero_fused.py measures the step against search_step and
// compares whole searches with the torch path.
// ---------------------------------------------------------------------------
#pragma once

#include "mlp_net.h"

#ifdef MZ_HAVE_MLP_SEARCH

namespace tree_ops {

struct EzNet {
  int64_t L = 0, A = 0, K = 0, R = 0, V = 0, Hd = 0, Hv = 0, Hq = 0;
  int64_t horizon = 1;  // lstm_horizon_len
  // The dynamics' action inputs: A (a one-hot over the policy's A actions) or
  // D (a sampled model's continuous actions [D]; the policy head then gives
  // 2D numbers, a tanh-normal's location and scale).
  int64_t action_inputs = 0;
  Dense dyn1, dyn2, lstm_ih, lstm_hh, vp1, vp2, pred1, pred_out;
  std::vector<float> action_rows;  // [action_inputs][dyn1.J]: W1[:, L + a], padded
  std::vector<float> ln_gamma, ln_beta, reward_bins, value_bins;
  float ln_eps = 1e-5f;
  InverseH reward_h{1e-3}, value_h{1e-3};
};

// Activation buffers of one group of rows (per thread).
struct EzScratch {
  AlignedFloats hidden, raw, gates_ih, gates_hh, normed, vp_hidden,
      prefix_logits, trunk, pred_logits;  // 64-byte aligned rows
};

// One group of n <= kGroup rows of a step: the parents' inputs, where the
// children go, and the children's scalars (written by ez_step).
struct EzRows {
  const float* latent[kGroup];
  const float* h[kGroup];
  const float* c[kGroup];
  float parent_prefix[kGroup];
  int64_t parent_steps[kGroup];
  int64_t action[kGroup];
  // Set for row s: this J-vector (W1[:, L:] a of a continuous action, the
  // sampled search's) replaces the one-hot column action_rows[action[s]].
  const float* action_input[kGroup] = {};
  float* next_latent[kGroup];
  float* next_h[kGroup];
  float* next_c[kGroup];
  float prefix[kGroup];  // stored prefix (0 after a reset)
  int64_t steps[kGroup];
  float reward[kGroup];
  float value[kGroup];
};

// weights: the 20 tensors of EfficientZeroMLPModel.fused_value_prefix_weights()
// (order in ez_net.cpp); packed into a per-thread EzNet reused across calls.
// `action_inputs` > 0: the dynamics take that many continuous inputs instead
// of a one-hot over the A policy outputs (fused_continuous_weights()).
const EzNet& pack_ez(const std::vector<at::Tensor>& weights, int64_t A,
                     double reward_eps, double value_eps, double ln_eps,
                     int64_t horizon, int64_t action_inputs = 0);

// The node state's five arrays (the TensorDict leaves of tree.embeddings, or
// of a search_step state) for `rows` rows, checked against the net.
struct EzState {
  float* latent;
  float* h;
  float* c;
  float* prefix;
  int64_t* steps;
};

// Row s of `rows` steps the node `from` of the flat state arrays into node `to`
// (both indices into st's [rows] layout): the parent's latent, LSTM state,
// prefix and step count, and where the child's go. The action is the caller's
// (a one-hot index or a continuous action_input).
inline void wire_ez_rows(EzRows& rows, const EzState& st, int64_t s, int64_t from, int64_t to,
                         int64_t L, int64_t K) {
  rows.latent[s] = st.latent + from * L;
  rows.h[s] = st.h + from * K;
  rows.c[s] = st.c + from * K;
  rows.parent_prefix[s] = st.prefix[from];
  rows.parent_steps[s] = st.steps[from];
  rows.next_latent[s] = st.latent + to * L;
  rows.next_h[s] = st.h + to * K;
  rows.next_c[s] = st.c + to * K;
}

EzState check_ez_state(const EzNet& net, const at::Tensor& latent, const at::Tensor& h,
                       const at::Tensor& c, const at::Tensor& prefix, const at::Tensor& steps,
                       at::IntArrayRef rows);

EzScratch& thread_ez_scratch(const EzNet& net);

// search_step for n rows (see above): fills rows' outputs and the policy
// logits [n, A] (the prior is their softmax_prior, fused_loop.h). `baseline`
// forces the 4-wide build, `fma` the FMA copy where the CPU has it (as
// mlp_step).
void ez_step(const EzNet& net, EzScratch& sc, int64_t n, EzRows& rows,
             float* logits, bool baseline = false, bool fma = false);

}  // namespace tree_ops

#endif  // MZ_HAVE_MLP_SEARCH
