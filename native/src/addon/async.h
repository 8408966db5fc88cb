// Running compute off the JS thread: every call becomes a Job on a libuv worker thread that
// settles a Promise; plus the per-instance constructors that wrap engine objects as JS objects.
#pragma once

#include <napi.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "model.h"

namespace prime::addon {

extern std::atomic<int> gThreads;  // intra-op threads for jobs; 0 = libtorch's default

// Runs `work` on a libuv worker thread and settles a Promise with `done`'s value (built on the JS
// thread). Holds references to JS buffers the work reads, and the model's busy flag.
class Job : public Napi::AsyncWorker {
 public:
  using Work = std::function<void()>;
  using Done = std::function<Napi::Value(Napi::Env)>;

  // Takes the model's busy flag (lock may be null for jobs on no model); throws if it is taken.
  Job(Napi::Env env, std::shared_ptr<Model> lock, Work work, Done done);
  // Keeps a JS value (e.g. a Buffer whose bytes the work reads) alive until the job settles.
  void keep(Napi::Value v) { refs_.push_back(Napi::Persistent(v)); }
  Napi::Promise start() {
    Napi::Promise p = deferred_.Promise();
    Queue();
    return p;
  }

 protected:
  void Execute() override;  // on the worker thread: runs work, turns exceptions into an error
  void OnOK() override;     // back on the JS thread: resolves with done's value
  void OnError(const Napi::Error& e) override;

 private:
  void unlock() {
    if (lock_) lock_->busy = false;
    lock_.reset();
  }
  Napi::Promise::Deferred deferred_;
  std::shared_ptr<Model> lock_;
  Work work_;
  Done done_;
  std::vector<Napi::Reference<Napi::Value>> refs_;
  std::string option_, reason_;  // the work threw an OptionError (facts.h) about this option
};

// Per-addon-instance constructors of the wrapped classes (set by Init).
struct Constructors {
  Napi::FunctionReference model, generator, trainer, distStore, distGroup;
};

// A new JS object of a wrapped class holding `value`.
template <typename T>
Napi::Object wrap(Napi::Env env, Napi::FunctionReference Constructors::*which, std::shared_ptr<T> value) {
  auto ext = Napi::External<std::shared_ptr<T>>::New(env, new std::shared_ptr<T>(std::move(value)),
                                                     [](Napi::Env, std::shared_ptr<T>* p) { delete p; });
  return (env.GetInstanceData<Constructors>()->*which).New({ext});
}

// The engine object a wrapped class's constructor was given by `wrap`.
template <typename T>
std::shared_ptr<T> unwrapExternal(const Napi::CallbackInfo& info, const char* cls) {
  if (info.Length() != 1 || !info[0].IsExternal())
    throw Napi::TypeError::New(info.Env(), std::string(cls) + " is created by the addon, not with new");
  return *info[0].As<Napi::External<std::shared_ptr<T>>>().Data();
}

// Synchronous calls that need the model idle (creating a generator or trainer).
void checkIdle(Napi::Env env, const Model& m);

}  // namespace prime::addon
