// What module init (addon.cc) registers: the wrapped classes and the module functions.
#pragma once

#include <napi.h>

#include <memory>

namespace prime {
class DistGroup;
class Model;
struct GeneratorOptions;
}  // namespace prime

namespace prime::addon {

Napi::Function DefineModel(Napi::Env env);
// The engine model of a JS Model.
std::shared_ptr<Model> unwrapModel(Napi::Value v);
Napi::Function DefineGenerator(Napi::Env env);
// The options of Model.createGenerator (GeneratorOptions in native/generator.ts).
GeneratorOptions generatorOptions(Napi::Env env, const Napi::Object& o);
Napi::Function DefineTrainer(Napi::Env env);
// (numel, rank, worldSize) -> {begin, end, shardNumel}: full sharding's layout (fsdp.h ShardPlan::shardRange).
Napi::Value ShardRange(const Napi::CallbackInfo& info);
Napi::Function DefineDistStore(Napi::Env env);
Napi::Function DefineDistGroup(Napi::Env env);
// The engine group of a JS DistGroup (Trainer.setGroup).
std::shared_ptr<DistGroup> unwrapGroup(Napi::Value v);
Napi::Value CreateStore(const Napi::CallbackInfo& info);  // ({host, port, isServer, timeoutS}) -> Promise<DistStore>
// (store, {prefix, rank, size, timeoutS}) -> Promise<DistGroup>, once every rank has joined
Napi::Value CreateGroup(const Napi::CallbackInfo& info);
// (group, {device, bytes, iters}) -> Promise<{busySeconds, waitSeconds, collectives}> (dist.h timeAllGathers)
Napi::Value CollectiveTime(const Napi::CallbackInfo& info);

Napi::Value CreateModel(const Napi::CallbackInfo& info);  // (config, specs, tensors, options) -> Promise<Model>
Napi::Value PolicyLoss(const Napi::CallbackInfo& info);
Napi::Value LmHeadCheck(const Napi::CallbackInfo& info);     // chunked LM head vs the full-logits graph
Napi::Value KernelCheck(const Napi::CallbackInfo& info);     // a fused kernel vs the libtorch path (kernel_check.h)
Napi::Value KernelTime(const Napi::CallbackInfo& info);      // -> Promise<{fused, unfused}> seconds per fwd + bwd
Napi::Value CpuKernelCheck(const Napi::CallbackInfo& info);  // (seed) -> each CPU loop vs fp64 (cpu_kernel_check.h)
Napi::Value AdamwCheck(const Napi::CallbackInfo& info);      // fused AdamW step vs libtorch's AdamW
// ({heads, kvHeads, headDim, maxKeys, optInLimit?}) -> the paged decode kernel's plan (paged_decode_plan.h)
Napi::Value PagedDecodePlanOf(const Napi::CallbackInfo& info);
Napi::Value MatmulGflops(const Napi::CallbackInfo& info);
Napi::Value LossKinds(const Napi::CallbackInfo& info);   // the loss registry as plain data
Napi::Value LayerSlots(const Napi::CallbackInfo& info);  // () -> the block slot names (model.h layerSlotNames)
// () -> the engine facts declared as X-macro lists (facts.h), for native/engine-types.generated.ts
Napi::Value EngineTypes(const Napi::CallbackInfo& info);
Napi::Value Info(const Napi::CallbackInfo& info);
Napi::Value SetThreads(const Napi::CallbackInfo& info);
Napi::Value SetCpuCache(const Napi::CallbackInfo& info);    // (capacityBytes) -> void
Napi::Value CpuCacheStats(const Napi::CallbackInfo& info);  // () -> {hits, misses, cachedBytes, capacityBytes}
// The test-only entry points (testing_wrap.cc; native/testing.ts).
Napi::Object Testing(Napi::Env env);

}  // namespace prime::addon
