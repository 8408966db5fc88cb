// bf16 mixed precision for the trainer: the parameters (master weights), their gradients and the
// AdamW state stay fp32; the forward computes as a bf16 model would, the scheme of prime-rl's FSDP2
// MixedPrecisionPolicy (param_dtype bf16, reduce_dtype fp32). Matmuls take bf16 copies of the
// weights (libtorch's autocast casts each once per forward and caches it); every activation, the
// residual stream included, is bf16 (Model::forwardPacked casts the embedding's output, norms and
// RoPE keep their input's dtype: Model::computeDtype); norms, softmaxes and the LM head's
// log-softmax compute in fp32 inside (lm_head.cc). The casts' backward returns each weight's
// gradient in fp32. Autocast's switches are thread-local: the guard is set in the thread that runs
// the forward; the backward replays the graph autocast recorded (bf16 matmuls stay bf16), and custom
// autograd functions (the chunked LM head) carry their matmul dtype themselves.
#pragma once

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/version.h>

#include <optional>
#include <stdexcept>
#include <string>

// libtorch 2.4+ takes the device type; 1.13 has a switch per device (CUDA's named "gpu").
#define PRIME_AUTOCAST_BY_DEVICE (TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4))

namespace prime {

class AutocastGuard {
 public:
  // No-op without a dtype. CPU and CUDA (the only devices our models run on).
  AutocastGuard(at::Device device, std::optional<at::ScalarType> dtype) : cuda_(device.is_cuda()), on_(dtype) {
    if (!on_) return;
    prevEnabled_ = enabled();
    prevDtype_ = autocastDtype();
    set(true, *dtype);
    at::autocast::increment_nesting();
  }
  ~AutocastGuard() {
    if (!on_) return;
    // The cast cache (bf16 copies of fp32 weights) lives until the outermost region ends.
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    set(prevEnabled_, prevDtype_);
  }
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

  // The dtype matmuls on `device` run in under autocast in this thread, or nullopt.
  static std::optional<at::ScalarType> active(at::Device device) {
#if PRIME_AUTOCAST_BY_DEVICE
    const at::DeviceType t = device.type();
    if (!at::autocast::is_autocast_enabled(t)) return std::nullopt;
    return at::autocast::get_autocast_dtype(t);
#else
    if (device.is_cuda())
      return at::autocast::is_enabled() ? std::optional<at::ScalarType>(at::autocast::get_autocast_gpu_dtype())
                                        : std::nullopt;
    return at::autocast::is_cpu_enabled() ? std::optional<at::ScalarType>(at::autocast::get_autocast_cpu_dtype())
                                          : std::nullopt;
#endif
  }

 private:
  at::DeviceType type() const { return cuda_ ? at::kCUDA : at::kCPU; }
#if PRIME_AUTOCAST_BY_DEVICE
  bool enabled() const { return at::autocast::is_autocast_enabled(type()); }
  at::ScalarType autocastDtype() const { return at::autocast::get_autocast_dtype(type()); }
  void set(bool on, at::ScalarType dt) const {
    at::autocast::set_autocast_dtype(type(), dt);
    at::autocast::set_autocast_enabled(type(), on);
  }
#else
  bool enabled() const { return cuda_ ? at::autocast::is_enabled() : at::autocast::is_cpu_enabled(); }
  at::ScalarType autocastDtype() const {
    return cuda_ ? at::autocast::get_autocast_gpu_dtype() : at::autocast::get_autocast_cpu_dtype();
  }
  void set(bool on, at::ScalarType dt) const {
    if (cuda_) {
      at::autocast::set_autocast_gpu_dtype(dt);
      at::autocast::set_enabled(on);
    } else {
      at::autocast::set_autocast_cpu_dtype(dt);
      at::autocast::set_cpu_enabled(on);
    }
  }
#endif
  bool cuda_;
  std::optional<at::ScalarType> on_;
  bool prevEnabled_ = false;
  at::ScalarType prevDtype_ = at::kBFloat16;
};

// "bfloat16" -> kBFloat16; "" -> none. The only mixed-precision dtype we train in.
inline std::optional<at::ScalarType> parseMixedPrecision(const std::string& name) {
  if (name.empty()) return std::nullopt;
  if (name == "bfloat16") return at::kBFloat16;
  throw std::runtime_error("mixedPrecision '" + name + "' is not supported (expected bfloat16, or none)");
}

}  // namespace prime
