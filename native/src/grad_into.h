// Backward passes that add a weight's gradient straight into the parameter's .grad instead of
// returning it for autograd to add (as Megatron's gradient-accumulation fusion does on GPUs). At
// the Qwen3 vocabulary a [vocab, hidden] gradient is 311 MB: returned, each one costs a buffer, its
// zero fill, and one or two additions of it on ATen's one thread (the LM head's and, with tied
// embeddings, the lookup's summed, then added to .grad), per packed row. Taken on the CPU, for leaf
// parameters; nothing registers gradient hooks on those (AccumulateGrad would run them, these
// backward passes do not).
#pragma once

#include <ATen/ATen.h>

namespace prime {

struct GradAccumulator {
  at::Tensor grad;     // the parameter's .grad to add into; undefined: return the gradient instead
  bool fresh = false;  // allocated just now, uninitialised: the first write overwrites
};

// `param`: a leaf parameter as a custom function's backward sees it (its saved input is the
// parameter itself). Its .grad when the gradient can be added into it (dense, contiguous, of the
// parameter's dtype and shape, no graph being recorded), allocated uninitialised where it has none
// and `allocate`; else undefined.
GradAccumulator gradAccumulator(const at::Tensor& param, bool allocate);

// at::embedding(weight, ids) (ids [N] int64, weight [V, D]) whose backward, on the CPU with weight
// a leaf parameter that already has a .grad (the tied LM head's, added in place: lm_head.cc), adds
// the N rows of the gradient into it: no [V, D] gradient made, zero-filled and added.
at::Tensor embeddingLookup(const at::Tensor& weight, const at::Tensor& ids);

}  // namespace prime
