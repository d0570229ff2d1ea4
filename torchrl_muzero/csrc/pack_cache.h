// A thread's few packed networks, most recently used first (pack_unizero).
// ---------------------------------------------------------------------------
// Why more than one: packing a network's weights into the kernel's layouts
// costs more than a small search (docs/performance_search.md, "Design
// figures quoted from the code"), and a thread that alternates between models
// (a benchmark timing the cache and the recompute mode back to back, an
// evaluation model beside the acting one, the torch-step root of another
// model) repacked at every call with a single slot. A few slots keep each
// model's packed copy while it is in use; the least recently used one is
// repacked when a fifth model comes.
//
// An entry is reused only when the same tensors (address and size, plus the
// ints and floats) come back holding the same values (a memcmp with the
// entry's copy of the source): weights can change in place without a version
// bump (shared memory written by another process, `.data`, numpy views). A
// key match whose values changed repacks that entry in place, so a key is
// never held twice.
#pragma once

#include <array>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

namespace tree_ops {

// One entry's identity: (data pointer, numel) per tensor, then (nullptr,
// value) per int and (nullptr, hash) per float.
using PackKey = std::vector<std::pair<const void*, int64_t>>;

// Net must have `PackKey key` and `std::vector<float> source` (the weights'
// values, concatenated, as packed).
template <class Net, size_t Slots>
class PackCache {
 public:
  // The packed net for `weights`: a cached one holding the same values, else
  // `pack(net)` into the entry with this key or the least recently used one
  // (pack fills everything but key and source, which are set here).
  template <class Pack>
  const Net& get(PackKey key, const std::vector<at::Tensor>& weights, Pack&& pack) {
    size_t at = Slots;
    for (size_t i = 0; i < Slots && entries_[i]; ++i)
      if (entries_[i]->key == key) {
        at = i;
        break;
      }
    if (at < Slots && same_values(*entries_[at], weights)) return *front(at);
    if (at == Slots) {  // a new key: the least recently used slot (or a free one)
      at = Slots - 1;
      for (size_t i = 0; i < Slots; ++i)
        if (!entries_[i]) {
          at = i;
          break;
        }
      if (!entries_[at]) entries_[at] = std::make_unique<Net>();
    }
    Net& net = *entries_[at];
    net.key.clear();  // a failed pack (TORCH_CHECK) leaves an entry that never matches
    net.source.clear();
    for (const at::Tensor& w : weights)
      net.source.insert(net.source.end(), w.data_ptr<float>(), w.data_ptr<float>() + w.numel());
    pack(net);
    net.key = std::move(key);
    return *front(at);
  }

 private:
  static bool same_values(const Net& net, const std::vector<at::Tensor>& weights) {
    size_t at = 0;
    for (const at::Tensor& w : weights) {
      const size_t n = static_cast<size_t>(w.numel());
      if (n && std::memcmp(net.source.data() + at, w.data_ptr<float>(), n * sizeof(float)) != 0)
        return false;
      at += n;
    }
    return true;
  }

  // Move entry i to the front (most recently used), keeping the others' order.
  Net* front(size_t i) {
    for (; i > 0; --i) std::swap(entries_[i], entries_[i - 1]);
    return entries_[0].get();
  }

  std::array<std::unique_ptr<Net>, Slots> entries_{};
};

}  // namespace tree_ops
