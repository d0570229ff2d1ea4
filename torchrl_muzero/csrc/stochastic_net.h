// The network step of the fused Stochastic MuZero search
// (stochastic_search.cpp): StochasticMuZeroMLPModel.search_step with one
// hidden layer per network, as the raw vectorised loops of mlp_kernels.h.
// ---------------------------------------------------------------------------
// A node of the search tree is a decision node (a state) or a chance node
// (an afterstate); every node has A + C edge slots, actions first. The step
// below a node depends on its kind:
//
// decision node s, action a  ->  chance node (afterstate)
//   as     = scale_latent(Wa2 relu((Wa1[:, :L] s + ba1) + Wa1[:, L + a]) + ba2)
//   t      = relu(Wt as + bt)                                afterstate trunk
//   sigma  = Wc t + bc;  Q = h^-1(E_v[bin] of softmax(Wq t + bq))
//   edge: reward 0, discount 1; logits [-inf x A | sigma]; value Q
// chance node as, slot A + c  ->  decision node (state)
//   s'     = scale_latent(Wd2 relu((Wd1[:, :L] as + bd1) + Wd1[:, L + c]) + bd2)
//   reward = h^-1(E_r[bin] of softmax(Wr2 relu(Wr1 s' + br1) + br2))
//   [policy | value logits] = Wp2 relu(Wp1 s' + bp1) + bp2;  value = h^-1(E_v)
//   edge: the dynamics' reward, the search's discount; logits [policy | -inf x C]
// An action out of its node's range is clamped first, as search_step does
// (a in [0, A), c in [0, C)). The prior is the softmax of the finite logits
// (exactly 0 on the -inf slots).
//
// Numerical contract: the one of mlp_net.h (float32, fp-contract off, every
// linear layer summed over k in ascending order, bias last; the one-hot
// input becomes a column lookup of the first layer; results independent of
// the batch size, of where a row lands in a group and of the vector width).
// Close to the torch model within a few float ulps, not bit-identical;
// test/test_stochastic_fused.py measures it.
// ---------------------------------------------------------------------------
#pragma once

#include "mlp_net.h"

#ifdef MZ_HAVE_MLP_SEARCH

namespace tree_ops {

struct StochasticNet {
  int64_t L = 0, A = 0, C = 0, R = 0, V = 0;
  // decision -> chance: afterstate dynamics, then the afterstate trunk and
  // one output layer for [sigma (C) | Q logits (V)].
  Dense as1, as2, as_trunk, as_out;
  std::vector<float> action_rows;  // [A][as1.J]: Wa1[:, L + a], padded
  // chance -> decision: dynamics, both head trunks in one layer (reward
  // hidden units first), the reward output and [policy (A) | value (V)].
  Dense dyn1, dyn2, trunks, reward_out, pred_out;
  std::vector<float> code_rows;  // [C][dyn1.J]: Wd1[:, L + c], padded
  int64_t hq_off = 0;            // where the prediction trunk starts in `trunks`
  std::vector<float> reward_bins, value_bins;
  InverseH reward_h{1e-3}, value_h{1e-3};
};

// Activation buffers of one group of rows (per thread, reused).
struct StochasticScratch {
  AlignedFloats hidden, raw, trunks, reward_logits, out_logits;  // 64-byte aligned rows
};

// weights: the 24 tensors of StochasticMuZeroMLPModel.fused_search_weights()
// (order in stochastic_net.cpp); packed into a per-thread StochasticNet
// reused across calls (A, C, L are read from the shapes).
const StochasticNet& pack_stochastic(const std::vector<at::Tensor>& weights,
                                     double reward_eps, double value_eps);

StochasticScratch& stochastic_scratch(const StochasticNet& net);

// The search step for n <= kGroup rows: parent latents in[s] (L floats),
// parent kinds is_chance[s], slots act[s] in [0, A + C); writes the new
// latent to out[s] (L floats), reward[s], value[s], discount[s] (1 or
// `gamma`) and the prior logits [n, A + C] (-inf on the other kind's slots;
// the prior is their softmax_prior, fused_loop.h). `baseline` forces the
// 4-wide build, `fma` the FMA copy where the CPU has it (as mlp_step).
void stochastic_step(const StochasticNet& net, StochasticScratch& sc,
                     int64_t n, const float* const* in, const bool* is_chance,
                     const int64_t* act, float gamma, float* const* out,
                     float* reward, float* value, float* discount,
                     float* logits, bool baseline = false, bool fma = false);

}  // namespace tree_ops

#endif  // MZ_HAVE_MLP_SEARCH
