// The simulation loop every fused search shares (mlp_search.cpp,
// stochastic_search.cpp, ez_search.cpp): the searches differ only in their
// network step and in what a node stores, not in how simulations proceed.
#pragma once

#include <ATen/Parallel.h>

#include <exception>
#include <thread>
#include <utility>
#include <vector>

#include "mlp_net.h"
#include "rules.h"

#ifdef MZ_HAVE_MLP_SEARCH

namespace tree_ops {

// Simulation n (1..N-1) creates node n of every tree in rows [b0, b1). Trees
// go in groups of kGroup rows: one leaf per tree is selected with the rule
// pair, `gather(s, b, leaf, n)` points row s of the network's batch at the
// leaf's stored state and at node n's storage, `step(rows)` runs the network
// once for the group, and `finish(s, b, r, leaf, n)` writes node n's own data
// and backs it up (expand_and_backup_in_tree). The GIL is the caller's business.
template <class RootRule, class InteriorRule, class Gather, class Step, class Finish>
void run_fused_simulations(const TreeArrays& t, int64_t b0, int64_t b1, const RootRule& rr,
                           const InteriorRule& ir, Gather&& gather, Step&& step,
                           Finish&& finish) {
  Leaf leaf[kGroup];
  for (int64_t n = 1; n < t.N; ++n) {
    for (int64_t g = b0; g < b1; g += kGroup) {
      const int64_t rows = std::min(kGroup, b1 - g);
      for (int64_t s = 0; s < rows; ++s) {
        leaf[s] = select_in_tree(row(t, g + s), rr, ir);
        gather(s, g + s, leaf[s], n);
      }
      step(rows);
      for (int64_t s = 0; s < rows; ++s) finish(s, g + s, row(t, g + s), leaf[s], n);
    }
  }
}

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
// shares its core with a spinning worker and runs at half speed (measured:
// two threads were no faster than one, docs/performance.md). Elsewhere
// plain std::threads (started per search: ~50 us against a search of
// milliseconds).
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

// for_row_chunks for the searches: each chunk gets its own copies of the two
// selection rules (their scratch is mutable), as chunk(b0, b1, rr, ir).
template <class RootRule, class InteriorRule, class Chunk>
void for_row_chunks_with_rules(int64_t B, const RootRule& rr0, const InteriorRule& ir0,
                               Chunk&& chunk) {
  for_row_chunks(B, [&](int64_t b0, int64_t b1) {
    RootRule rr = rr0;
    InteriorRule ir = ir0;
    chunk(b0, b1, rr, ir);
  });
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

}  // namespace tree_ops

#endif  // MZ_HAVE_MLP_SEARCH
