// A tensor whose memory comes and goes while the tensor (and every view of its storage) stays:
// full sharding's gathered buffers (fsdp.h) and a model's parameters before their shards are
// filled (Model::withoutWeights).
#pragma once

#include <ATen/ATen.h>
#include <c10/core/StorageImpl.h>

namespace prime {

// Frees the storage's memory; the tensor keeps its sizes and must not be read until refilled.
inline void releaseStorage(const at::Tensor& t) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(at::DataPtr(nullptr, t.device()));
  s->set_nbytes(0);
}

// Gives a released storage memory again (uninitialised), as much as the tensor spans.
inline void reallocateStorage(const at::Tensor& t) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  const size_t bytes = size_t(t.numel()) * t.element_size();
  if (s->nbytes() == bytes) return;
  s->set_data_ptr_noswap(s->allocator()->allocate(bytes));
  s->set_nbytes(bytes);
}

inline bool hasStorage(const at::Tensor& t) { return t.storage().nbytes() > 0; }

}  // namespace prime
