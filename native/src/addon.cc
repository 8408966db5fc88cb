// N-API module init. The glue lives in addon/: conversions (convert), the async job that runs
// every compute call on a libuv worker thread and settles a Promise (async), one file per wrapped
// class and the module functions. The TS facade (native/*.ts) is the only caller, but for
// the test-only entry points under `testing` (native/testing.ts).
#include <napi.h>

#include "addon/async.h"
#include "addon/exports.h"
#include "cpu_cache.h"

Napi::Object Init(Napi::Env env, Napi::Object exports) {
  using namespace prime::addon;
  auto* ctors = new Constructors();
  ctors->model = Napi::Persistent(DefineModel(env));
  ctors->generator = Napi::Persistent(DefineGenerator(env));
  ctors->trainer = Napi::Persistent(DefineTrainer(env));
  ctors->distStore = Napi::Persistent(DefineDistStore(env));
  ctors->distGroup = Napi::Persistent(DefineDistGroup(env));
  env.SetInstanceData<Constructors>(ctors);
  // Large CPU tensors come from the caching allocator (cpu_cache.h), 2 GiB of freed blocks at most.
  prime::setCpuCacheCapacity(std::size_t(2) << 30);
  exports.Set("info", Napi::Function::New(env, Info));
  exports.Set("setThreads", Napi::Function::New(env, SetThreads));
  exports.Set("setCpuCache", Napi::Function::New(env, SetCpuCache));
  exports.Set("cpuCacheStats", Napi::Function::New(env, CpuCacheStats));
  exports.Set("createModel", Napi::Function::New(env, CreateModel));
  exports.Set("matmulGflops", Napi::Function::New(env, MatmulGflops));
  exports.Set("policyLoss", Napi::Function::New(env, PolicyLoss));
  exports.Set("lmHeadCheck", Napi::Function::New(env, LmHeadCheck));
  exports.Set("kernelCheck", Napi::Function::New(env, KernelCheck));
  exports.Set("pagedDecodePlan", Napi::Function::New(env, PagedDecodePlanOf));
  exports.Set("kernelTime", Napi::Function::New(env, KernelTime));
  exports.Set("cpuKernelCheck", Napi::Function::New(env, CpuKernelCheck));
  exports.Set("adamwCheck", Napi::Function::New(env, AdamwCheck));
  exports.Set("lossKinds", Napi::Function::New(env, LossKinds));
  exports.Set("layerSlots", Napi::Function::New(env, LayerSlots));
  exports.Set("engineTypes", Napi::Function::New(env, EngineTypes));
  exports.Set("shardRange", Napi::Function::New(env, ShardRange));
  exports.Set("createStore", Napi::Function::New(env, CreateStore));
  exports.Set("createGroup", Napi::Function::New(env, CreateGroup));
  exports.Set("collectiveTime", Napi::Function::New(env, CollectiveTime));
  exports.Set("testing", Testing(env));  // test-only (native/testing.ts)
  return exports;
}

NODE_API_MODULE(prime_native, Init)
