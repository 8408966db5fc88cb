// Activation checkpointing of a decoder layer: its forward runs without keeping its activations
// (only its input is saved), and the backward runs it again, with the same LoRA dropout masks (the
// RNG rewound to where the forward drew them) and the same autocast, then backpropagates through
// that rerun. Memory for activations drops from every op of every layer to one input per
// checkpointed layer, at the cost of one more forward of those layers.
#pragma once

#include <ATen/ATen.h>

#include <functional>

namespace prime {

// y = layer(x), checkpointed. `rng` (may be null): the generator layer draws dropout masks from.
at::Tensor checkpointed(const at::Tensor& x, std::function<at::Tensor(const at::Tensor&)> layer, at::Generator* rng);

}  // namespace prime
