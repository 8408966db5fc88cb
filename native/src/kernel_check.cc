#include "kernel_check.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/autograd.h>

#include <chrono>
#include <cmath>
#include <optional>
#include <stdexcept>
#include <tuple>
#include <utility>

#include "autocast.h"
#include "kernels.h"
#include "lm_head.h"

namespace prime {
namespace {

constexpr double kEps = 1e-6, kTemperature = 0.7, kRopeTheta = 1e6;

using Named = std::vector<std::pair<std::string, at::Tensor>>;

// The random problem, drawn once on the CPU in fp32: inputs by name, and the upstream gradients
// of the outputs (the loss is sum(output * its gradient)).
struct Problem {
  Named inputs, upstream;
  at::Tensor targets, positions;  // lmHead, rope
};

const at::Tensor& get(const Named& n, const std::string& name) {
  for (const auto& [k, t] : n)
    if (k == name) return t;
  throw std::runtime_error("kernelCheck: no tensor '" + name + "'");
}

Problem draw(const KernelCheckOptions& o) {
  at::Generator g = at::make_generator<at::CPUGeneratorImpl>(o.seed);
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  auto randn = [&](at::IntArrayRef shape, double scale = 1.0) { return at::randn(shape, g, f32) * scale; };
  Problem p;
  const int64_t N = o.rows, D = o.width;
  if (o.kernel == "rmsNorm" || o.kernel == "addRmsNorm") {
    const std::vector<int64_t> shape = o.heads > 1 ? std::vector<int64_t>{N, o.heads, D} : std::vector<int64_t>{N, D};
    p.inputs = {{"x", randn(shape, 2.0)}, {"weight", 1.0 + randn({o.weightWidth > 0 ? o.weightWidth : D}, 0.1)}};
    if (o.kernel == "addRmsNorm") {
      p.inputs.emplace_back("delta", randn(shape, 0.5));
      p.upstream = {{"sum", randn(shape)}, {"y", randn(shape)}};
    } else {
      p.upstream = {{"y", randn(shape)}};
    }
  } else if (o.kernel == "rope") {
    p.inputs = {{"q", randn({N, o.heads, D})}, {"k", randn({N, o.kvHeads, D})}};
    p.positions = at::randint(4096, {N}, g, at::TensorOptions().dtype(at::kLong));
    p.upstream = {{"q", randn({N, o.heads, D})}, {"k", randn({N, o.kvHeads, D})}};
  } else if (o.kernel == "swiglu") {
    p.inputs = {{"gate", randn({N, D}, 3.0)}, {"up", randn({N, D})}};
    p.upstream = {{"out", randn({N, D})}};
  } else if (o.kernel == "lmHead") {
    if (o.vocab < 2) throw std::runtime_error("kernelCheck: lmHead needs vocab >= 2");
    p.inputs = {{"hidden", randn({N, D})}, {"weight", randn({o.vocab, D}, 2.0 / std::sqrt(double(D)))}};
    p.targets = at::randint(o.vocab, {N}, g, at::TensorOptions().dtype(at::kLong));
    p.upstream = {{"logp", randn({N})}, {"entropy", randn({N})}};
  } else {
    throw std::runtime_error("kernelCheck: unknown kernel '" + o.kernel +
                             "' (rmsNorm, addRmsNorm, rope, swiglu or lmHead)");
  }
  return p;
}

// Which path a run takes.
enum class Path { Fused, Unfused, Exact };

// Model::rope's tables for `positions`: cos(f) twice and (-sin f, sin f), [N, 1, hd] in dt.
// Rounded to the activations' dtype `rounded` first: the exact run sees the same tables.
std::pair<at::Tensor, at::Tensor> ropeTables(const at::Tensor& positions, int64_t hd, at::ScalarType rounded,
                                             at::ScalarType dt, const at::Device& device) {
  const at::Tensor inv = at::pow(kRopeTheta, -at::arange(0, hd, 2, at::TensorOptions().dtype(at::kFloat)) / double(hd));
  const at::Tensor f = positions.to(at::kFloat).unsqueeze(-1) * inv.unsqueeze(0);
  const at::Tensor c = f.cos(), s = f.sin();
  return {at::cat({c, c}, -1).to(rounded).to(dt).unsqueeze(1).to(device),
          at::cat({-s, s}, -1).to(rounded).to(dt).unsqueeze(1).to(device)};
}

// One run's tensors on its device, in its dtypes: the leaves (requiring grad), the upstream
// gradients, and the RoPE tables or the LM head's targets. Made once: a timed pass copies nothing
// to the device.
struct RunInputs {
  Named leaves, upstream;
  at::Tensor cos, sin, targets;
};

RunInputs inputsFor(const KernelCheckOptions& o, const Problem& p, Path path) {
  const bool exact = path == Path::Exact;
  const at::Device device = exact ? at::Device(at::kCPU) : o.device;
  const at::ScalarType act = exact ? at::kDouble : o.dtype;
  // Under bf16 the weights are fp32 master weights (mixed precision), computing as their bf16
  // copy, or bf16 weights: either way the exact run takes the bf16 copy.
  const at::ScalarType weightDt = exact ? at::kDouble : o.weightDtype;
  auto leaf = [&](const std::string& name, bool weight) {
    at::Tensor t = get(p.inputs, name);
    if (!weight || exact) t = t.to(o.dtype);  // the rounding the run sees
    // A fresh leaf per run (the problem's tensors stay as drawn, never requiring grad).
    return t.to(weight ? weightDt : act).to(device).clone().requires_grad_(true);
  };
  RunInputs in;
  if (o.kernel == "rmsNorm") {
    in.leaves = {{"x", leaf("x", false)}, {"weight", leaf("weight", true)}};
  } else if (o.kernel == "addRmsNorm") {
    in.leaves = {{"x", leaf("x", false)}, {"weight", leaf("weight", true)}, {"delta", leaf("delta", false)}};
  } else if (o.kernel == "rope") {
    in.leaves = {{"q", leaf("q", false)}, {"k", leaf("k", false)}};
    std::tie(in.cos, in.sin) = ropeTables(p.positions, o.width, o.dtype, act, device);
  } else if (o.kernel == "swiglu" && o.packed) {
    const at::Tensor gu = at::cat({get(p.inputs, "gate"), get(p.inputs, "up")}, 1);
    in.leaves = {{"gateUp", gu.to(o.dtype).to(act).to(device).clone().requires_grad_(true)}};
  } else if (o.kernel == "swiglu") {
    in.leaves = {{"gate", leaf("gate", false)}, {"up", leaf("up", false)}};
  } else {
    in.leaves = {{"hidden", leaf("hidden", false)}, {"weight", leaf("weight", true)}};
    in.targets = p.targets.to(device);
  }
  // The outputs' dtype: the activations', the LM head's fp32 (fp64 exact).
  const at::ScalarType outDt = o.kernel == "lmHead" ? (exact ? at::kDouble : at::kFloat) : act;
  for (const auto& [name, g] : p.upstream) in.upstream.emplace_back(name, g.to(o.dtype).to(outDt).to(device));
  return in;
}

// The outputs of one pass over `leaves`, after the backward of sum(output * upstream) (the
// lmHead's entropy only when entropyGrad) has filled the leaves' gradients.
Named pass(const KernelCheckOptions& o, Path path, const RunInputs& in) {
  const bool exact = path == Path::Exact;
  const Named& leaves = in.leaves;
  const at::Device device = leaves[0].second.device();
  const BlockKernels& k = path == Path::Fused ? fusedBlockKernels() : unfusedBlockKernels();
  const at::Tensor& a = leaves[0].second;
  Named outs;
  if (o.kernel == "rmsNorm") {
    outs = {{"y", k.rmsNorm(a, leaves[1].second, kEps)}};
  } else if (o.kernel == "addRmsNorm") {
    auto [sum, y] = k.addRmsNorm(a, leaves[2].second, leaves[1].second, kEps);
    outs = {{"sum", sum}, {"y", y}};
  } else if (o.kernel == "rope") {
    // Activations, not leaves (as in the model: the fused path works on them in place).
    auto [q, kk] = k.rope(a * 1, leaves[1].second * 1, in.cos, in.sin);
    outs = {{"q", q}, {"k", kk}};
  } else if (o.kernel == "swiglu") {
    outs = {{"out", o.packed ? k.swigluPacked(a) : k.swiglu(a, leaves[1].second)}};
  } else {  // lmHead
    const int64_t chunk = o.chunkTokens > 0 ? o.chunkTokens : lmHeadChunkTokens(o.vocab, device);
    const at::ScalarType logits = exact ? at::kDouble : at::kFloat;
    // Keep the first chunk's logits for the backward, recompute the others: both paths run.
    const int64_t keep = chunk * o.vocab * int64_t(c10::elementSize(logits));
    // Mixed precision: the matmuls in bf16 over the fp32 master weight, as the trainer's forward
    // (bf16 weights need none: they compute as they are).
    std::optional<AutocastGuard> autocast;
    if (!exact && o.dtype == at::kBFloat16 && o.weightDtype == at::kFloat) autocast.emplace(device, at::kBFloat16);
    const TokenStats ts = chunkedTokenStats(a, leaves[1].second, in.targets, kTemperature, logits, chunk, keep,
                                            path == Path::Fused ? LmHeadKernels::Fused : LmHeadKernels::TensorOps);
    autocast.reset();
    outs = {{"logp", ts.logp}, {"entropy", ts.entropy}};
  }
  std::vector<at::Tensor> tensors, grads;
  for (const auto& [name, t] : outs) {
    if (o.kernel == "lmHead" && name == "entropy" && !o.entropyGrad) continue;
    tensors.push_back(t);
    grads.push_back(get(in.upstream, name));
  }
  torch::autograd::backward(tensors, grads);
  return outs;
}

// Outputs and input gradients of one run, on the CPU in fp64 (to compare).
Named run(const KernelCheckOptions& o, const Problem& p, Path path) {
  const RunInputs in = inputsFor(o, p, path);
  Named result;
  for (const auto& [name, t] : pass(o, path, in)) result.emplace_back(name, t.detach().to(at::kCPU, at::kDouble));
  for (const auto& [name, t] : in.leaves) result.emplace_back("d" + name, t.grad().to(at::kCPU, at::kDouble));
  return result;
}

// Seconds per forward + backward of `path`, over `iters` passes after a warm-up.
double timePasses(const KernelCheckOptions& o, const Problem& p, Path path, int64_t iters) {
  const RunInputs in = inputsFor(o, p, path);
  const Named& leaves = in.leaves;
  auto once = [&] {
    for (const auto& [name, t] : leaves) t.mutable_grad() = at::Tensor();
    return pass(o, path, in);
  };
  for (int i = 0; i < 3; i++) once();
  // Deliberate syncs: reading one value waits for the device's queue (before and after the loop).
  leaves[0].second.grad().sum().item<double>();
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < iters; i++) once();
  leaves[0].second.grad().sum().item<double>();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / double(iters);
}

// What the options cannot mean, refused by name.
void checkOptions(const KernelCheckOptions& o) {
  if (o.rows < 1 || o.width < 1 || o.heads < 1 || o.kvHeads < 1)
    throw std::runtime_error("kernelCheck: rows, width, heads and kvHeads must be >= 1");
  if (o.weightDtype != at::kFloat && o.weightDtype != at::kBFloat16)
    throw std::runtime_error("kernelCheck: weightDtype must be float32 or bfloat16");
  if (o.weightDtype == at::kBFloat16 && (o.kernel == "rope" || o.kernel == "swiglu"))
    throw std::runtime_error("kernelCheck: weightDtype: " + o.kernel + " has no weight");
}

}  // namespace

std::vector<KernelCheckOutput> kernelCheck(const KernelCheckOptions& o) {
  checkOptions(o);
  const Problem p = draw(o);
  const Named fused = run(o, p, Path::Fused), unfused = run(o, p, Path::Unfused), exact = run(o, p, Path::Exact);
  std::vector<KernelCheckOutput> out;
  for (size_t i = 0; i < exact.size(); i++) {
    const at::Tensor& ref = exact[i].second;
    KernelCheckOutput r;
    r.name = exact[i].first;
    r.scale = ref.abs().max().item<double>();
    const double s = r.scale > 0 ? r.scale : 1.0;
    auto rel = [&](const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>() / s; };
    r.fused = rel(fused[i].second, ref);
    r.unfused = rel(unfused[i].second, ref);
    r.apart = rel(fused[i].second, unfused[i].second);
    out.push_back(r);
  }
  return out;
}

}  // namespace prime

namespace prime {

KernelTiming kernelTime(const KernelCheckOptions& o, int64_t iters) {
  checkOptions(o);
  if (iters < 1) throw std::runtime_error("kernelTime: iters must be >= 1");
  const Problem p = draw(o);
  return {timePasses(o, p, Path::Fused, iters), timePasses(o, p, Path::Unfused, iters)};
}

}  // namespace prime
