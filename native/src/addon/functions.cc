// Module functions outside the classes: the policy loss on given vectors, the matmul yardstick,
// build info and thread counts.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <torch/version.h>

#include <dlfcn.h>

#include <chrono>
#include <cmath>

#include "adamw.h"
#include "addon/async.h"
#include "addon/convert.h"
#include "addon/exports.h"
#include "cpu_cache.h"
#include "cpu_kernel_check.h"
#include "cpu_kernels.h"
#include "cpu_matmul.h"
#include "dist.h"
#include "host_parallel.h"
#include "kernel_check.h"
#include "model.h"
#include "paged_decode.h"

namespace prime::addon {

// The policy loss on given per-token vectors (fp64, synchronous): the same code as the trainer's
// loss, for checking values and d loss / d logp against hand computation.
Napi::Value PolicyLoss(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Napi::Object o = obj(info[0], "inputs");
  LossConfig cfg = lossConfig(info[1]);
  std::vector<double> logp = reals(field(o, "logp"), "logp");
  std::vector<uint8_t> m = mask(field(o, "lossMask"), "lossMask");
  std::vector<int64_t> lengths = ints(field(o, "sampleLengths"), "sampleLengths");
  auto optional = [&](const char* key) {
    Napi::Value v = o.Get(key);
    return v.IsUndefined() || v.IsNull() ? std::vector<double>(logp.size(), 0.0) : reals(v, key);
  };
  std::vector<double> mu = optional("mu"), adv = optional("advantages"), ref = optional("refLogp");
  const bool weighted = !o.Get("ceWeights").IsUndefined() && !o.Get("ceWeights").IsNull();
  std::vector<double> ce = optional("ceWeights");
  return jsErrors(env, [&]() -> Napi::Value {
    validateLossConfig(cfg);
    const size_t T = logp.size();
    if (m.size() != T || mu.size() != T || adv.size() != T || ref.size() != T || ce.size() != T)
      throw std::runtime_error("logp, lossMask, mu, advantages, refLogp and ceWeights need the same length");
    std::vector<int64_t> sample;
    for (size_t i = 0; i < lengths.size(); i++) {
      if (lengths[i] < 1) throw std::runtime_error("sampleLengths must be >= 1");
      sample.insert(sample.end(), size_t(lengths[i]), int64_t(i));
    }
    if (sample.size() != T) throw std::runtime_error("sampleLengths must sum to the number of tokens");
    const auto f64 = at::TensorOptions().dtype(at::kDouble);
    LossInputs in;
    in.logp = at::tensor(logp, f64).requires_grad_(true);
    in.mask = at::tensor(std::vector<double>(m.begin(), m.end()), f64);
    in.mu = at::tensor(mu, f64);
    in.adv = at::tensor(adv, f64);
    in.refLogp = at::tensor(ref, f64);
    int64_t ceTokens = 0;
    if (weighted) {
      in.ceWeight = at::tensor(ce, f64);
      ceTokens = (in.ceWeight > 0).sum().item<int64_t>();
    }
    in.sample = at::tensor(sample, at::TensorOptions().dtype(at::kLong));
    in.numSamples = int64_t(lengths.size());
    int64_t tokens, samples;
    countLossUnits(in.mask, in.sample, in.numSamples, tokens, samples);
    DeviceLossSums deviceSums;
    policyLoss(cfg, in, resolveNormalizer(cfg, tokens, samples), deviceSums, resolveCeNormalizer(cfg, ceTokens))
        .backward();
    const LossSums sums = deviceSums.read();
    Napi::Object out = Napi::Object::New(env);
    out.Set("loss", sums.loss);
    at::Tensor g = in.logp.grad().contiguous();
    Napi::Float64Array grad = Napi::Float64Array::New(env, T);
    std::copy_n(g.data_ptr<double>(), T, grad.Data());
    out.Set("gradLogp", grad);
    out.Set("metrics", metricsToJs(env, lossMetrics(sums)));
    return out;
  });
}

// The chunked LM head (lm_head.h) against the plain full-logits autograd graph, on random fp64
// data (synchronous), the first `keepChunks` chunks' log-softmax kept for the backward and the
// others recomputed: L = sum(wLogp * logp + wEntropy * entropy) both ways; returns the largest
// absolute differences of logp, entropy and dL/dhidden, dL/dweight, and the largest gradient
// entries (so a test can see they are not trivially zero).
Napi::Value LmHeadCheck(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Napi::Object o = obj(info[0], "options");
  const int64_t N = int64_t(num(o, "tokens")), D = int64_t(num(o, "hidden")), V = int64_t(num(o, "vocab"));
  const int64_t chunk = int64_t(num(o, "chunkTokens")), keepChunks = int64_t(num(o, "keepChunks"));
  const double T = num(o, "temperature"), wLogp = num(o, "wLogp"), wEnt = num(o, "wEntropy");
  return jsErrors(env, [&]() -> Napi::Value {
    if (N < 1 || D < 1 || V < 2) throw std::runtime_error("tokens, hidden must be >= 1 and vocab >= 2");
    at::Generator g = at::make_generator<at::CPUGeneratorImpl>(uint64_t(num(o, "seed")));
    const auto f64 = at::TensorOptions().dtype(at::kDouble);
    const at::Tensor h0 = at::randn({N, D}, g, f64), w0 = at::randn({V, D}, g, f64) * 0.5;
    const at::Tensor targets = at::randint(V, {N}, g, at::TensorOptions().dtype(at::kLong));
    const at::Tensor cL = at::rand({N}, g, f64) * wLogp, cE = at::rand({N}, g, f64) * wEnt;
    // The chunked side in the dtype asked for (fp32: the engine's training path), the reference in fp64.
    const std::string dtype = o.Has("dtype") ? o.Get("dtype").As<Napi::String>().Utf8Value() : "float64";
    if (dtype != "float64" && dtype != "float32") throw std::runtime_error("dtype must be float32 or float64");
    const at::ScalarType dt = dtype == "float32" ? at::kFloat : at::kDouble;
    at::Tensor h1 = h0.clone().to(dt).requires_grad_(true), w1 = w0.clone().to(dt).requires_grad_(true);
    const int64_t chunkBytes = (chunk > 0 ? chunk : lmHeadChunkTokens(V, at::kCPU)) * V * int64_t(c10::elementSize(dt));
    const bool ops = o.Has("tensorOps") && o.Get("tensorOps").ToBoolean().Value();
    const TokenStats s = chunkedTokenStats(h1, w1, targets, T, dt, chunk, keepChunks * chunkBytes,
                                           ops ? LmHeadKernels::TensorOps : LmHeadKernels::Auto);
    ((s.logp * cL.to(dt)).sum() + (s.entropy * cE.to(dt)).sum()).backward();
    at::Tensor h2 = h0.clone().requires_grad_(true), w2 = w0.clone().requires_grad_(true);
    const at::Tensor lp = at::log_softmax(at::linear(h2, w2) / T, -1);
    const at::Tensor logp = lp.gather(1, targets.unsqueeze(1)).squeeze(1), ent = -(lp.exp() * lp).sum(-1);
    ((logp * cL).sum() + (ent * cE).sum()).backward();
    auto maxDiff = [](const at::Tensor& a, const at::Tensor& b) {
      return (a.to(at::kDouble) - b).abs().max().item<double>();
    };
    Napi::Object out = Napi::Object::New(env);
    out.Set("logp", maxDiff(s.logp.detach(), logp.detach()));
    out.Set("entropy", maxDiff(s.entropy.detach(), ent.detach()));
    out.Set("gradHidden", maxDiff(h1.grad(), h2.grad()));
    out.Set("gradWeight", maxDiff(w1.grad(), w2.grad()));
    out.Set("gradScale", std::max(h2.grad().abs().max().item<double>(), w2.grad().abs().max().item<double>()));
    return out;
  });
}

// kernelCheck's and kernelTime's options (kernel_check.h) from JS; dtype and device are parsed by
// the caller, inside its error handling.
static KernelCheckOptions kernelOptions(const Napi::Object& o) {
  KernelCheckOptions k;
  k.kernel = str(o, "kernel");
  auto optInt = [&](const char* key, int64_t dflt) { return o.Has(key) ? int64_t(num(o, key)) : dflt; };
  auto optBool = [&](const char* key, bool dflt) { return o.Has(key) ? o.Get(key).ToBoolean().Value() : dflt; };
  k.rows = optInt("rows", 0);
  k.width = optInt("width", 0);
  k.heads = optInt("heads", 1);
  k.kvHeads = optInt("kvHeads", 1);
  k.vocab = optInt("vocab", 0);
  k.chunkTokens = optInt("chunkTokens", 0);
  k.entropyGrad = optBool("entropyGrad", true);
  k.packed = optBool("packed", false);
  k.seed = uint64_t(optInt("seed", 0));
  k.weightWidth = optInt("weightWidth", 0);
  return k;
}

// The dtypes and device of kernelCheck's options, parsed inside the caller's error handling.
static void kernelTypes(KernelCheckOptions& k, const std::string& dtype, const std::string& weightDtype,
                        const std::string& device) {
  k.dtype = parseComputeDtype(dtype);
  k.weightDtype = weightDtype.empty() ? at::kFloat : parseComputeDtype(weightDtype);
  k.device = at::Device(device);
}

// One fused kernel against the libtorch path it replaces (kernel_check.h), synchronously: per
// output and input gradient, the relative errors of both paths against fp64 and their distance.
Napi::Value KernelCheck(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Napi::Object o = obj(info[0], "options");
  KernelCheckOptions k = kernelOptions(o);
  const std::string dtype = str(o, "dtype"), device = str(o, "device");
  const std::string weightDtype = o.Has("weightDtype") ? str(o, "weightDtype") : "";
  return jsErrors(env, [&]() -> Napi::Value {
    kernelTypes(k, dtype, weightDtype, device);
    return rowsToJs(env, kernelCheck(k), [](Napi::Object& r, const KernelCheckOutput& row) {
      r.Set("name", row.name);
      r.Set("fused", row.fused);
      r.Set("unfused", row.unfused);
      r.Set("apart", row.apart);
      r.Set("scale", row.scale);
    });
  });
}

// Every CPU loop of every instruction set this CPU runs against fp64 (cpu_kernel_check.h),
// synchronously: [{isa, kernel, dtype, shape, error}].
Napi::Value CpuKernelCheck(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const uint64_t seed = uint64_t(info[0].As<Napi::Number>().Int64Value());
  return jsErrors(env, [&]() -> Napi::Value {
    return rowsToJs(env, prime::cpuKernelCheck(seed), [](Napi::Object& r, const prime::CpuKernelCheck& row) {
      r.Set("isa", row.isa);
      r.Set("kernel", row.kernel);
      r.Set("dtype", row.dtype);
      r.Set("shape", row.shape);
      r.Set("error", row.error);
    });
  });
}

// Seconds per forward + backward of the fused and the libtorch path (kernel_check.h), on a libuv
// worker: ({...kernelCheck's options, iters}) -> Promise<{fused, unfused}>.
Napi::Value KernelTime(const Napi::CallbackInfo& info) {
  Napi::Object o = obj(info[0], "options");
  KernelCheckOptions k = kernelOptions(o);
  const std::string dtype = str(o, "dtype"), device = str(o, "device");
  const std::string weightDtype = o.Has("weightDtype") ? str(o, "weightDtype") : "";
  const int64_t iters = int64_t(num(o, "iters"));
  auto out = std::make_shared<KernelTiming>();
  Job* job = new Job(
      info.Env(), nullptr,
      [=] {
        KernelCheckOptions opts = k;
        kernelTypes(opts, dtype, weightDtype, device);
        *out = kernelTime(opts, iters);
      },
      [out](Napi::Env env) -> Napi::Value {
        Napi::Object r = Napi::Object::New(env);
        r.Set("fused", out->fused);
        r.Set("unfused", out->unfused);
        return r;
      });
  return job->start();
}

// adamwStep (native/src/adamw.h) against libtorch's own AdamW::step on the same random problem:
// a contiguous parameter and a transposed (non-contiguous) one, `steps` steps with fresh random
// gradients, weight decay, and the clipping scale applied to libtorch's gradients beforehand.
Napi::Value AdamwCheck(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Napi::Object o = obj(info[0], "options");
  const int64_t n = int64_t(num(o, "numel")), steps = int64_t(num(o, "steps"));
  const double wd = num(o, "weightDecay"), scale = num(o, "gradScale");
  const bool f32 = o.Get("dtype").As<Napi::String>().Utf8Value() == "float32";
  return jsErrors(env, [&]() -> Napi::Value {
    if (n < 1 || steps < 1) throw std::runtime_error("numel and steps must be >= 1");
    at::Generator g = at::make_generator<at::CPUGeneratorImpl>(uint64_t(num(o, "seed")));
    const auto opts = at::TensorOptions().dtype(f32 ? at::kFloat : at::kDouble);
    const std::vector<at::Tensor> init = {at::randn({n}, g, opts), at::randn({7, 5}, g, opts).t()};
    std::vector<at::Tensor> ours, theirs;
    for (const at::Tensor& t : init) {
      ours.push_back(t.clone(at::MemoryFormat::Preserve));
      theirs.push_back(t.clone(at::MemoryFormat::Preserve));
    }
    const auto options = torch::optim::AdamWOptions(1e-2).betas({0.9, 0.99}).eps(1e-8).weight_decay(wd);
    torch::optim::AdamW a(ours, options), b(theirs, options);
    for (int64_t s = 0; s < steps; s++) {
      for (size_t i = 0; i < init.size(); i++) {
        const at::Tensor grad = at::randn(init[i].sizes(), g, opts);
        ours[i].mutable_grad() = grad;
        theirs[i].mutable_grad() = grad * scale;
      }
      adamwStep(a, scale);
      b.step();
    }
    double diff = 0, moved = 0;
    for (size_t i = 0; i < init.size(); i++) {
      diff = std::max(diff, (ours[i] - theirs[i]).abs().max().item<double>());
      moved = std::max(moved, (theirs[i] - init[i]).abs().max().item<double>());
    }
    Napi::Object out = Napi::Object::New(env);
    out.Set("maxDiff", diff);
    out.Set("moved", moved);
    return out;
  });
}

// The loss registry (native/src/loss_registry.cc) as plain data: what the TS side derives its
// loss names, parameters and config schema from. An unbounded max is left out.
Napi::Value LossKinds(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const std::vector<LossKind>& kinds = lossKinds();
  Napi::Array out = Napi::Array::New(env, kinds.size());
  for (size_t i = 0; i < kinds.size(); i++) {
    Napi::Object k = Napi::Object::New(env);
    k.Set("name", kinds[i].name);
    k.Set("policy", kinds[i].policy);
    k.Set("doc", kinds[i].doc);
    Napi::Array params = Napi::Array::New(env, kinds[i].params.size());
    for (size_t j = 0; j < kinds[i].params.size(); j++) {
      const LossParam& p = kinds[i].params[j];
      Napi::Object o = Napi::Object::New(env);
      o.Set("name", p.name);
      o.Set("default", p.dflt);
      o.Set("min", p.min);
      if (std::isfinite(p.max)) o.Set("max", p.max);
      o.Set("doc", p.doc);
      params.Set(uint32_t(j), o);
    }
    k.Set("params", params);
    out.Set(uint32_t(i), k);
  }
  return out;
}

// The engine's block slot names (model.h layerSlotNames): what LAYER_SLOTS in TS must equal.
Napi::Value LayerSlots(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const std::vector<std::string> names = layerSlotNames();
  Napi::Array out = Napi::Array::New(env, names.size());
  for (size_t i = 0; i < names.size(); i++) out.Set(uint32_t(i), names[i]);
  return out;
}

// Measured matmul throughput (GFLOP/s): an n x n x n fp32 product, the benchmarks' yardstick; or,
// with m and k, a projection as an inference forward runs it (cpu_matmul.h linearOn: x [m, k] times
// w [n, k] transposed, in `dtype`), e.g. a decode step's and the LM head's shapes.
Napi::Value MatmulGflops(const Napi::CallbackInfo& info) {
  const int64_t n = info[0].As<Napi::Number>().Int64Value(), iters = info[1].As<Napi::Number>().Int64Value();
  const bool linear = info.Length() > 2 && info[2].IsNumber();
  const int64_t m = linear ? info[2].As<Napi::Number>().Int64Value() : n;
  const int64_t k = linear ? info[3].As<Napi::Number>().Int64Value() : n;
  const std::string dtypeName = info.Length() > 4 && info[4].IsString() ? info[4].As<Napi::String>().Utf8Value() : "";
  at::ScalarType dtype = at::kFloat;
  if (!dtypeName.empty())
    jsErrors(info.Env(), [&]() -> Napi::Value {
      dtype = parseComputeDtype(dtypeName);
      return info.Env().Undefined();
    });
  if (n < 1 || m < 1 || k < 1 || iters < 1)
    throw Napi::RangeError::New(info.Env(), "matmulGflops: sizes and iterations must be >= 1");
  auto out = std::make_shared<double>(0);
  Job* job = new Job(
      info.Env(), nullptr,
      [=] {
        c10::InferenceMode inference;
        const auto opts = at::TensorOptions().dtype(dtype);
        at::Tensor a = at::randn({m, k}, opts), b = at::randn({linear ? n : k, linear ? k : n}, opts);
        auto run = [&] { return linear ? linearOn(a, b, at::Tensor()) : at::mm(a, b); };
        run();  // warm-up
        auto t0 = std::chrono::steady_clock::now();
        for (int64_t i = 0; i < iters; i++) run();
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        *out = 2.0 * double(m) * double(n) * double(k) * double(iters) / s / 1e9;
      },
      [out](Napi::Env env) -> Napi::Value { return Napi::Number::New(env, *out); });
  return job->start();
}

// The CUDA paged decode kernel's plan for a shape (paged_decode_plan.h): ({heads, kvHeads,
// headDim, maxKeys, optInLimit?}) -> {partition, sharedBytes, optIn, why}; optInLimit (bytes a
// block may opt in to) defaults to the plain 48 KiB every device gives.
Napi::Value PagedDecodePlanOf(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Napi::Object o = obj(info[0], "shape");
  const int64_t limit = o.Has("optInLimit") ? int64_t(num(o, "optInLimit")) : kDefaultSharedBytes;
  const PagedDecodePlan p = pagedDecodePlan(int64_t(num(o, "heads")), int64_t(num(o, "kvHeads")),
                                            int64_t(num(o, "headDim")), int64_t(num(o, "maxKeys")), limit);
  Napi::Object out = Napi::Object::New(env);
  out.Set("partition", double(p.partition));
  out.Set("sharedBytes", double(p.sharedBytes));
  out.Set("optIn", p.optIn);
  out.Set("why", p.why);
  return out;
}

Napi::Value Info(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Napi::Object out = Napi::Object::New(env);
  out.Set("torchVersion", std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
                              std::to_string(TORCH_VERSION_PATCH));
  out.Set("cuda", at::hasCUDA());
  out.Set("cudaDevices", double(at::hasCUDA() ? at::getNumGPUs() : 0));
  out.Set("threads", gThreads.load() > 0 ? gThreads.load() : at::get_num_threads());
  auto blasThreads = reinterpret_cast<int (*)()>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  if (blasThreads) out.Set("blasThreads", blasThreads());
  auto blasCore = reinterpret_cast<char* (*)()>(dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  if (blasCore) out.Set("blasCore", std::string(blasCore()));
  // The library that serves ATen's fp32 GEMMs (native/cmake/torch.cmake: OpenBLAS when linked).
  Dl_info blas;
  if (void* sgemm = dlsym(RTLD_DEFAULT, "sgemm_"); sgemm && dladdr(sgemm, &blas) && blas.dli_fname) {
    const std::string file = blas.dli_fname;
    out.Set("blas", file.substr(file.find_last_of('/') + 1));
  }
  out.Set("cpuKernels", prime::cpu::kernels().isa);
  out.Set("cpuBf16Dot", prime::cpuHasBf16Dot());
  out.Set("parallelInfo", at::get_parallel_info());
  out.Set("gloo", kHaveGloo);
  out.Set("cudaKernels", cudaKernelsBuilt());
  out.Set("nccl", kHaveNccl);
  out.Set("storeBindsHost", kStoreBindsHost);
  return out;
}

// Thread counts. When libtorch's BLAS is a pthreads OpenBLAS (Debian), matmuls run on OpenBLAS's
// own pool, whose threads spin after each call; an OpenMP pool of the same size beside it fights
// them for the cores (measured: ~10x slower small ops, half the matmul rate). So there the BLAS
// pool gets n threads and ATen's OpenMP pool 1. Otherwise (MKL, OpenMP OpenBLAS) ATen gets n.
Napi::Value SetThreads(const Napi::CallbackInfo& info) {
  int n = info[0].As<Napi::Number>().Int32Value();
  if (n < 1) throw Napi::RangeError::New(info.Env(), "threads must be >= 1");
  using SetFn = void (*)(int);
  using GetFn = int (*)();
  auto setBlas = reinterpret_cast<SetFn>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  auto blasParallel = reinterpret_cast<GetFn>(dlsym(RTLD_DEFAULT, "openblas_get_parallel"));
  const bool pthreadBlas = setBlas && blasParallel && blasParallel() == 1;
  if (setBlas) setBlas(n);
  gThreads = pthreadBlas ? 1 : n;
  at::set_num_threads(gThreads);
  prime::setHostThreads(n);
  return info.Env().Undefined();
}

Napi::Value SetCpuCache(const Napi::CallbackInfo& info) {
  const double bytes = info[0].As<Napi::Number>().DoubleValue();
  if (!(bytes >= 0)) throw Napi::RangeError::New(info.Env(), "CPU cache capacity must be >= 0 bytes");
  prime::setCpuCacheCapacity(static_cast<std::size_t>(bytes));
  return info.Env().Undefined();
}

Napi::Value CpuCacheStats(const Napi::CallbackInfo& info) {
  const prime::CpuCacheStats s = prime::cpuCacheStats();
  Napi::Object out = Napi::Object::New(info.Env());
  out.Set("hits", double(s.hits));
  out.Set("misses", double(s.misses));
  out.Set("cachedBytes", double(s.cachedBytes));
  out.Set("capacityBytes", double(s.capacityBytes));
  return out;
}

}  // namespace prime::addon
