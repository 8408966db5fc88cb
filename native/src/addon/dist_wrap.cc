// JS classes DistStore and DistGroup (native/dist.ts): the data-parallel trainer's c10d store and
// process group. Every call that talks to another process runs as a Job off the JS thread.
#include "addon/async.h"
#include "addon/convert.h"
#include "addon/exports.h"
#include "dist.h"

namespace prime::addon {
namespace {

class StoreWrap : public Napi::ObjectWrap<StoreWrap> {
 public:
  static Napi::Function Define(Napi::Env env) {
    return DefineClass(env, "DistStore",
                       {InstanceMethod("set", &StoreWrap::Set), InstanceMethod("get", &StoreWrap::Get),
                        InstanceMethod("add", &StoreWrap::Add), InstanceMethod("port", &StoreWrap::Port)});
  }
  explicit StoreWrap(const Napi::CallbackInfo& info)
      : Napi::ObjectWrap<StoreWrap>(info), store(unwrapExternal<DistStore>(info, "DistStore")) {}
  std::shared_ptr<DistStore> store;

 private:
  Napi::Value Set(const Napi::CallbackInfo& info) {
    std::string key = info[0].As<Napi::String>().Utf8Value(), value = info[1].As<Napi::String>().Utf8Value();
    auto s = store;
    return (new Job(
                info.Env(), nullptr, [s, key, value] { s->set(key, value); }, nullptr))
        ->start();
  }
  // (key, timeoutMs) -> the value, or null when the key is not set within timeoutMs.
  Napi::Value Get(const Napi::CallbackInfo& info) {
    std::string key = info[0].As<Napi::String>().Utf8Value();
    const int64_t timeoutMs = int64_t(info[1].As<Napi::Number>().DoubleValue());
    auto s = store;
    auto out = std::make_shared<std::optional<std::string>>();
    Job* job = new Job(
        info.Env(), nullptr, [=] { *out = s->get(key, timeoutMs); },
        [out](Napi::Env env) -> Napi::Value { return out->has_value() ? Napi::String::New(env, **out) : env.Null(); });
    return job->start();
  }
  Napi::Value Add(const Napi::CallbackInfo& info) {
    std::string key = info[0].As<Napi::String>().Utf8Value();
    const int64_t delta = int64_t(info[1].As<Napi::Number>().DoubleValue());
    auto s = store;
    auto out = std::make_shared<int64_t>(0);
    Job* job = new Job(
        info.Env(), nullptr, [=] { *out = s->add(key, delta); },
        [out](Napi::Env env) -> Napi::Value { return Napi::Number::New(env, double(*out)); });
    return job->start();
  }
  Napi::Value Port(const Napi::CallbackInfo& info) { return Napi::Number::New(info.Env(), store->port()); }
};

class GroupWrap : public Napi::ObjectWrap<GroupWrap> {
 public:
  static Napi::Function Define(Napi::Env env) {
    return DefineClass(env, "DistGroup", {InstanceMethod("broadcast", &GroupWrap::Broadcast)});
  }
  explicit GroupWrap(const Napi::CallbackInfo& info)
      : Napi::ObjectWrap<GroupWrap>(info), group(unwrapExternal<DistGroup>(info, "DistGroup")) {}
  std::shared_ptr<DistGroup> group;

 private:
  // (buffers, root, bucketBytes, device) -> rank `root`'s bytes in every rank's buffers, in place:
  // the weight broadcast (lib/trainer/broadcast.ts). The buffers must have the same sizes, in the
  // same order, on every rank. On a CUDA `device` each bucket travels through device memory (NCCL);
  // on "cpu" over Gloo.
  Napi::Value Broadcast(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    if (!info[0].IsArray()) throw Napi::TypeError::New(env, "broadcast: expected an array of Buffers");
    Napi::Array arr = info[0].As<Napi::Array>();
    const int root = int(info[1].As<Napi::Number>().Int32Value());
    const int64_t bucketBytes = int64_t(info[2].As<Napi::Number>().DoubleValue());
    const std::string device = info[3].IsString() ? info[3].As<Napi::String>().Utf8Value() : "cpu";
    std::vector<at::Tensor> ts;
    std::vector<Napi::Value> keep;
    for (uint32_t i = 0; i < arr.Length(); i++) {
      Napi::Value v = arr.Get(i);
      if (!v.IsBuffer()) throw Napi::TypeError::New(env, "broadcast: expected an array of Buffers");
      auto b = v.As<Napi::Buffer<uint8_t>>();
      if (b.Length() == 0) continue;  // nothing to move
      ts.push_back(at::from_blob(b.Data(), {int64_t(b.Length())}, at::TensorOptions().dtype(at::kByte)));
      keep.push_back(v);
    }
    auto g = group;
    Job* job = new Job(
        env, nullptr,
        [g, ts, root, bucketBytes, device]() mutable {
          if (device == "cpu") {
            g->broadcastBucketed(ts, root, bucketBytes);
            return;
          }
          std::vector<at::Tensor> onDevice;
          for (const at::Tensor& t : ts) onDevice.push_back(t.to(at::Device(device)));
          g->broadcastBucketed(onDevice, root, bucketBytes);
          if (g->rank() == root) return;  // the root's buffers stay as they were (read meanwhile)
          for (size_t i = 0; i < ts.size(); i++) ts[i].copy_(onDevice[i]);
        },
        nullptr);
    for (const Napi::Value& v : keep) job->keep(v);
    return job->start();
  }
};

}  // namespace

Napi::Function DefineDistStore(Napi::Env env) { return StoreWrap::Define(env); }
Napi::Function DefineDistGroup(Napi::Env env) { return GroupWrap::Define(env); }

std::shared_ptr<DistGroup> unwrapGroup(Napi::Value v) {
  if (!v.IsObject()) throw Napi::TypeError::New(v.Env(), "expected a DistGroup");
  return GroupWrap::Unwrap(v.As<Napi::Object>())->group;
}

Napi::Value CreateStore(const Napi::CallbackInfo& info) {
  Napi::Object o = obj(info[0], "options");
  const std::string host = str(o, "host");
  const int port = int(num(o, "port"));
  const bool isServer = boolOr(o, "isServer", false);
  const double timeoutS = num(o, "timeoutS");
  auto out = std::make_shared<std::shared_ptr<DistStore>>();
  Job* job = new Job(
      info.Env(), nullptr, [=] { *out = std::make_shared<DistStore>(host, port, isServer, timeoutS); },
      [out](Napi::Env env) -> Napi::Value { return wrap(env, &Constructors::distStore, *out); });
  return job->start();
}

Napi::Value CreateGroup(const Napi::CallbackInfo& info) {
  if (!info[0].IsObject()) throw Napi::TypeError::New(info.Env(), "createGroup: expected a DistStore");
  std::shared_ptr<DistStore> store = StoreWrap::Unwrap(info[0].As<Napi::Object>())->store;
  Napi::Object o = obj(info[1], "options");
  const std::string prefix = str(o, "prefix");
  const int rank = int(num(o, "rank")), size = int(num(o, "size"));
  const double timeoutS = num(o, "timeoutS");
  const DistBackend backend =
      jsErrors(info.Env(), [&] { return fieldOr<DistBackend>(o, "backend", DistBackend::kAuto); });
  auto out = std::make_shared<std::shared_ptr<DistGroup>>();
  Job* job = new Job(
      info.Env(), nullptr, [=] { *out = std::make_shared<DistGroup>(store, prefix, rank, size, timeoutS, backend); },
      [out](Napi::Env env) -> Napi::Value { return wrap(env, &Constructors::distGroup, *out); });
  return job->start();
}

// All-gathers through a group, timed as the trainer's collectives are (dist.h timeAllGathers), on
// a libuv worker: (group, {device, bytes, iters}) -> Promise<{busySeconds, waitSeconds, collectives}>.
Napi::Value CollectiveTime(const Napi::CallbackInfo& info) {
  std::shared_ptr<DistGroup> group = unwrapGroup(info[0]);
  Napi::Object o = obj(info[1], "options");
  const std::string device = str(o, "device");
  const int64_t bytes = int64_t(num(o, "bytes")), iters = int64_t(num(o, "iters"));
  auto out = std::make_shared<DistStats>();
  Job* job = new Job(
      info.Env(), nullptr, [=] { *out = timeAllGathers(*group, at::Device(device), bytes, iters); },
      [out](Napi::Env env) -> Napi::Value {
        Napi::Object r = Napi::Object::New(env);
        r.Set("busySeconds", out->busySeconds);
        r.Set("waitSeconds", out->waitSeconds);
        r.Set("collectives", double(out->collectives));
        return r;
      });
  return job->start();
}

}  // namespace prime::addon
