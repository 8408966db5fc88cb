// The state slots of linear_state.h for models whose blocks are all attention (every family before
// Qwen3.5): no block has a state, so a slot holds nothing and its copies copy nothing; the
// generator's state-slot kind (state_slots.h) still runs on them under its probe (state_probe.h).
//
// For the Qwen3.5 branch, which defines these in model_linear_attention.cc with its Gated DeltaNet
// blocks' tensors: this file goes when it merges (the helpers below are the same as its own).
#include "linear_state.h"

#include "model.h"

namespace prime {

LinearStates Model::linearStates(int64_t numSlots) const {
  LinearStates st;
  st.numSlots = numSlots;
  st.conv.resize(layers_.size());
  st.recurrent.resize(layers_.size());
  return st;
}

int64_t LinearStates::slotBytes() const {
  int64_t bytes = 0;
  for (const std::vector<at::Tensor>* v : {&conv, &recurrent})
    for (const at::Tensor& t : *v)
      if (t.defined()) bytes += t.numel() / t.size(0) * int64_t(t.element_size());
  return bytes;
}

void LinearStates::copySlot(int64_t from, int64_t to) {
  for (std::vector<at::Tensor>* v : {&conv, &recurrent})
    for (at::Tensor& t : *v)
      if (t.defined()) t.select(0, to).copy_(t.select(0, from));
}

void LinearStates::copySlots(const at::Tensor& from, const at::Tensor& to) {
  for (std::vector<at::Tensor>* v : {&conv, &recurrent})
    for (at::Tensor& t : *v)
      if (t.defined()) t.index_copy_(0, to, t.index_select(0, from));
}

}  // namespace prime
