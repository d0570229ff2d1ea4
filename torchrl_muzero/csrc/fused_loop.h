// The fused searches (mlp_search.cpp, stochastic_search.cpp, ez_search.cpp,
// unizero_search.cpp) written once: fused_search<Search> runs every
// simulation of a search, and a network adds only its Search (how to gather
// a leaf's state, run its step for a group of trees, and store a new node's
// own state), never another loop. Also for_row_chunks: a search's trees over
// torch's threads.
#pragma once

#include <ATen/Parallel.h>

#include <exception>
#include <thread>
#include <utility>
#include <vector>

#include "dispatch.h"
#include "entry_points.h"  // FusedCall
#include "mlp_net.h"
#include "rules.h"

#ifdef MZ_HAVE_MLP_SEARCH

namespace tree_ops {

// The searches split B trees into chunks of whole units of rows: whole
// groups of kGroup trees where every thread gets two groups at least (a
// chunk then holds at most one partial group), else units of kMinChunkRows
// trees, so that a search of fewer trees than threads x kGroup (B = 8, 33,
// 64 on two threads) still splits, and evenly (B = 33: 16 + 17 trees, not
// 32 + 1). Below two units a search stays on the caller's thread.
constexpr int64_t kMinChunkRows = 4;

inline int64_t split_unit(int64_t B, int64_t threads) {
  return B >= 2 * threads * kGroup ? kGroup : kMinChunkRows;
}

// How a fused search of B trees is split: into `chunks` (one per thread:
// torch's intra-op setting, torch.set_num_threads; the trainers set it to
// each process's CPU budget), at most one per unit of `unit` rows.
struct RowSplit {
  int64_t chunks, unit;
};

inline RowSplit row_split(int64_t B) {
  const int64_t T = std::max<int64_t>(1, at::get_num_threads());
  const int64_t unit = split_unit(B, T);
  return {std::max<int64_t>(1, std::min<int64_t>(T, (B + unit - 1) / unit)), unit};
}

// Runs chunk(b0, b1) over contiguous ranges of whole units of the B trees
// (split_unit), chunk k on the k-th of row_split(B).chunks threads, the
// caller's thread taking the first. Trees never share a node, and a tree's
// float operations do not depend on the group it lands in (the fused
// searches' batch-size independence, tested), so a search gives the same
// result bit for bit on any number of threads. `chunk` must copy what it mutates (the rules' scratch:
// for_row_chunks_with_rules copies the rules per chunk) and may throw: the
// first error is rethrown here once every chunk has finished.
//
// The threads are torch's own OpenMP team (at::parallel_for) where the
// extension is linked against torch's OpenMP runtime (MZ_TORCH_OPENMP, see
// mcts/_kernel_build.py): after any parallel torch op that team's idle
// workers spin for milliseconds, and a thread of our own started meanwhile
// shares its core with a spinning worker and runs at half speed (two
// threads were no faster than one: docs/performance_search.md, "One OpenMP
// team (why the kernel links torch's `libgomp`)"). Elsewhere plain
// std::threads (started per search: small next to a search of milliseconds;
// docs/performance_search.md, "Design figures quoted from the code").
template <class Chunk>
void for_row_chunks(int64_t B, Chunk&& chunk) {
  const RowSplit split = row_split(B);
  const int64_t T = split.chunks, unit = split.unit;
  if (T <= 1) {
    chunk(int64_t{0}, B);
    return;
  }
  const int64_t units = (B + unit - 1) / unit;
  auto range = [&](int64_t k) {  // chunk k's rows: units split as evenly as they go
    const int64_t u0 = units * k / T, u1 = units * (k + 1) / T;
    return std::make_pair(u0 * unit, std::min(B, u1 * unit));
  };
#ifdef MZ_TORCH_OPENMP
  // Grain 1: one chunk per thread (chunks [k0, k1) together where torch runs
  // fewer threads, e.g. inside another parallel region, where it runs them all
  // on this thread). Errors: at::parallel_for rethrows the first.
  at::parallel_for(0, T, 1, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      const auto r = range(k);
      chunk(r.first, r.second);
    }
  });
#else
  std::vector<std::exception_ptr> errors(static_cast<size_t>(T));
  auto run = [&](int64_t k) {
    try {
      const auto r = range(k);
      chunk(r.first, r.second);
    } catch (...) {
      errors[static_cast<size_t>(k)] = std::current_exception();
    }
  };
  std::vector<std::thread> workers;
  workers.reserve(static_cast<size_t>(T - 1));
  for (int64_t k = 1; k < T; ++k) workers.emplace_back(run, k);
  run(0);
  for (std::thread& w : workers) w.join();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
#endif
}

// Whether the searches split on torch's OpenMP team (true) or on threads of
// their own (false); the extension reports it as `search_threads_on_torch_team`.
inline bool search_threads_on_torch_team() {
#ifdef MZ_TORCH_OPENMP
  return true;
#else
  return false;
#endif
}

// What a network's step gives for one new node: the edge reward, the raw
// value, the prior logits [A] (-inf: never selectable) and the edge's own
// discount (null: the edge keeps children_discount).
struct NodeOutput {
  float reward, value;
  const float* logits;
  const float* discount;
};

// prior = softmax(logits[0:n]) in float32, in one fixed order for every network:
// the maximum from logits[0], exp(z - max) with libm's expf, summed left to
// right, then each divided by the sum. A -inf logit gets exactly 0 (exp(-inf)
// is 0 and adding 0 changes no sum), so a row with -inf slots (Stochastic
// MuZero's other kind of node) gives the softmax of its finite logits.
TREE_OPS_INLINE void softmax_prior(const float* logits, int64_t n, float* prior) {
  float mx = logits[0];
  for (int64_t i = 1; i < n; ++i) mx = std::max(mx, logits[i]);
  float total = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    prior[i] = std::exp(logits[i] - mx);
    total += prior[i];
  }
  for (int64_t i = 0; i < n; ++i) prior[i] /= total;
}

// The whole search on a fresh tree whose root the caller has filled:
// simulation s creates node n = s + 1 of every tree, for s < N - 1.
//
// `Search` is the network's part: const, shared by the threads, with a
// per-chunk `Search::Group` (its scratch and the row pointers of one group of
// up to kGroup trees) constructed from it, which offers
//   void gather(int64_t s, int64_t b, const Leaf& leaf, int64_t n)
//       point row s of the step at tree b's leaf state and node n's storage;
//   void step(int64_t rows)               the network on rows [0, rows);
//   NodeOutput finish(int64_t s, int64_t b, int64_t n)
//       store node n's own state (what only this network keeps) and return
//       what the tree keeps.
// The loop around them is the same for every network: per group, one leaf per
// tree with the rule pair, the step, then per tree the new node's prior
// logits, raw value and prior (softmax_prior), and the expansion and backup
// of tree_common.h. Trees go in groups of kGroup over for_row_chunks; the GIL
// is released throughout.
// Simulation s relies on a fresh tree (node s + 1 unattached when it
// starts): reject a tree that was searched already. (fused_search checks it;
// a search that draws before it starts checks it first, so that a rejected
// call leaves its generator as it was.)
inline void check_fresh_trees(const FusedCall& call) {
  const TreeArrays& t = call.tree;
  const int64_t N = t.N;
  for (int64_t b = 0; b < t.B; ++b)
    TORCH_CHECK(t.vc[b * N] == 0 && (N < 2 || t.par[b * N + 1] == -1), call.who, ": tree ", b,
                " was searched already; pass a fresh tree from allocate_tree");
}

template <class Search>
void fused_search(const FusedCall& call, const Search& search) {
  const TreeArrays& t = call.tree;
  const int64_t N = t.N, A = t.A;
  check_fresh_trees(call);
  with_rules(call.root, call.interior, t, call.extra, [&](const auto& rr0, const auto& ir0) {
    GilRelease no_gil;
    for_row_chunks(t.B, [&](int64_t b0, int64_t b1) {
      // Per chunk: the rules' scratch is mutable, the group's buffers too.
      auto rr = rr0;
      auto ir = ir0;
      typename Search::Group group(search);
      std::vector<float> prior(static_cast<size_t>(A));
      Leaf leaf[kGroup];
      for (int64_t n = 1; n < N; ++n) {
        for (int64_t g = b0; g < b1; g += kGroup) {
          const int64_t rows = std::min(kGroup, b1 - g);
          for (int64_t s = 0; s < rows; ++s) {
            leaf[s] = select_in_tree(row(t, g + s), rr, ir);
            group.gather(s, g + s, leaf[s], n);
          }
          group.step(rows);
          for (int64_t s = 0; s < rows; ++s) {
            const Row r = row(t, g + s);
            const NodeOutput out = group.finish(s, g + s, n);
            std::copy_n(out.logits, A, r.lg + n * A);
            r.rv[n] = out.value;
            softmax_prior(out.logits, A, prior.data());
            expand_and_backup_in_tree(r, n, leaf[s].node, leaf[s].action, out.reward, out.value,
                                      prior.data(), out.discount);
          }
        }
      }
    });
  });
}

}  // namespace tree_ops

#endif  // MZ_HAVE_MLP_SEARCH
