// The network step of the fused MLP search (mlp_search.cpp): MuZeroMLPModel's
// search step with one hidden layer per network, as raw vectorised loops.
// ---------------------------------------------------------------------------
// Fused search for MuZeroMLPModel with one hidden layer per network.
//
// Why: at small B the per-simulation model call costs ~25-30 aten calls,
// whose dispatch far outweighs the tree work. `mlp_search` runs every
// simulation of a search in this one call: select, gather the parent latent,
// the network step as raw loops (no dispatch, no allocation), expand and
// backup; the GIL is released throughout. Figures: docs/performance_search.md,
// "Design figures quoted from the code"; whole searches: "The backends, MuZero
// canonical case (pytest benchmark)", benchmarks/test_search_bench.py.
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
// with AVX2 run (same results bit for bit).
//
// Opt-in FMA path (`fma`, MCTSConfig.kernel_precision="fma"): a third copy,
// compiled for AVX2 + FMA, in which the linear layers' multiply-adds, the
// decode's exp polynomial and its sum(e_i * bin_i) are fused multiply-adds
// (one rounding each). Still float32 with a fixed order, so a sample's
// result does not depend on the batch size or its tile; it differs from the
// exact path by a few ulps per layer, so it is not bit-identical across
// CPUs (a CPU without FMA runs the exact path). scale_latent, h^-1 and the
// prior's softmax are the exact path's. Linear layers are
// register-tiled (4 samples x 2 vectors, or 1 sample x 8 vectors) over
// k-major copies of the weights made once per call. Built without GCC or
// Clang, the module simply has no mlp_search and the search keeps its
// per-simulation loop.
// ---------------------------------------------------------------------------
#pragma once

#include "tree_common.h"

#include <new>

#if defined(__GNUC__) || defined(__clang__)
#define MZ_HAVE_MLP_SEARCH 1

namespace tree_ops {

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

// Allocator of 64-byte aligned storage (C++17 aligned new). Layer rows are
// multiples of 16 floats, so from an aligned base every 16-float panel of a
// packed weight row is one cache line and no vector load or store splits
// across two (std::vector's 16-byte alignment split half of them, and the
// dense loops ran slower: docs/performance_search.md, "The opt-in FMA network
// path"). Alignment changes no result.
template <class T>
struct CacheAligned {
  using value_type = T;
  static constexpr std::align_val_t kAlign{64};
  CacheAligned() = default;
  template <class U>
  CacheAligned(const CacheAligned<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), kAlign)); }
  void deallocate(T* p, size_t) { ::operator delete(p, kAlign); }
  template <class U>
  bool operator==(const CacheAligned<U>&) const { return true; }
  template <class U>
  bool operator!=(const CacheAligned<U>&) const { return false; }
};
using AlignedFloats = std::vector<float, CacheAligned<float>>;

// One linear layer in k-major layout: wt[k * J + j] = W[j, k] for the J
// (padded, multiple of 16) outputs; padded outputs have zero weights/bias.
struct Dense {
  AlignedFloats wt, bias;
  int64_t K = 0, J = 0;
};

// Rows per group: the group's activations (~1.4k floats per row) stay in L2
// between layers; large enough for full 4-row blocks.
constexpr int64_t kGroup = 32;

struct MlpNet {
  int64_t L = 0, A = 0, R = 0, V = 0, Hd = 0, Hr = 0, Hq = 0;
  // The dynamics' action inputs: A (a one-hot over the A policy outputs) or D
  // (a sampled model's continuous actions; its policy head gives 2D numbers).
  int64_t action_inputs = 0;
  Dense dyn1, dyn2, trunks, reward_out, pred_out;
  std::vector<float> action_rows;  // [action_inputs][dyn1.J]: W1[:, L + a], padded
  std::vector<float> reward_bins, value_bins;
  InverseH reward_h{1e-3}, value_h{1e-3};
};

// Activation buffers of one group of rows (per thread, reused like MlpNet).
struct MlpScratch {
  AlignedFloats hidden, raw, trunks, reward_logits, pred_logits;
};

// weights: the 14 tensors of MuZeroMLPModel.fused_search_weights() (see
// mlp_net.cpp); packed into a per-thread MlpNet reused across calls.
// `action_inputs` > 0: the dynamics take that many continuous inputs instead
// of a one-hot over the A policy outputs (fused_continuous_weights()).
const MlpNet& pack_mlp(const std::vector<at::Tensor>& weights, int64_t A,
                       double reward_eps, double value_eps, int64_t action_inputs = 0);

// The per-thread activation buffers, sized for `net`.
MlpScratch& thread_scratch(const MlpNet& net);

// The search step for n <= kGroup rows: parent latents in[s] (L floats),
// actions act[s]; writes the scaled next latent to out[s] (L floats), the
// decoded reward and value and the policy logits [n, A] (the prior is their
// softmax_prior, fused_loop.h). `baseline` forces the 4-wide build (the test
// hook compares the two); `fma` takes the opt-in FMA copy where the CPU has
// AVX2 and FMA (kernel_has_fma), else the exact dispatch above.
// `action_input` (optional, n rows of dyn1.J floats: W1[:, L:] a of a
// continuous action, the sampled search's) replaces the one-hot columns of
// `act`.
void mlp_step(const MlpNet& net, MlpScratch& sc, int64_t n,
              const float* const* in, const int64_t* act, float* const* out,
              float* reward, float* value, float* logits,
              bool baseline = false, bool fma = false,
              const float* const* action_input = nullptr);

// Whether `fma = true` runs the FMA copies on this CPU (x86 with AVX2 and
// FMA); elsewhere the steps fall back to the exact path.
bool kernel_has_fma();

void check_latent_and_actions(const MlpNet& net, const at::Tensor& latent,
                              const at::Tensor& action, int64_t B);

}  // namespace tree_ops

#endif  // defined(__GNUC__) || defined(__clang__)
