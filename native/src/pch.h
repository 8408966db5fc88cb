// The headers that nearly every source of the addon includes, precompiled once per build
// (native/CMakeLists.txt: target_precompile_headers) instead of parsed by each source: libtorch's
// ATen and autograd headers are most of every source's compile time. Headers that both libtorch
// 1.13 and 2.x have, and nothing that depends on the build's options (CUDA, NCCL). Each source
// still includes what it uses (-DPRIME_PCH=OFF builds without this file, which checks that).
#pragma once

#include <ATen/ATen.h>
#include <napi.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>
