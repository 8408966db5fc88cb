// The block ops' loops (cpu/block.cc), declared for the table of the same instruction set's copy of
// cpu/kernels.cc. Included only by files compiled per instruction set (CPU_CAPABILITY defined).
#pragma once

#include "cpu_kernels.h"

namespace prime::cpu::CPU_CAPABILITY {

void rmsNorm(const NormArgs& a);
void rmsNormBackward(const NormBackwardArgs& a);
void rope(const RopeArgs& a);
void swiglu(const SwigluArgs& a);
void swigluBackward(const SwigluArgs& a);

}  // namespace prime::cpu::CPU_CAPABILITY
