// N-API glue: converts JS values, runs every compute call on a libuv worker thread (returning a
// Promise) and turns C++ exceptions into rejected promises. The TS facade (native/index.ts) is
// the only caller.
#include <napi.h>

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <torch/version.h>

#include <dlfcn.h>

#include <atomic>
#include <cmath>
#include <chrono>
#include <functional>
#include <memory>

#include "generator.h"
#include "model.h"
#include "trainer.h"

namespace prime {
namespace {

std::atomic<int> gThreads{0};  // 0 = libtorch's default

// ---------------------------------------------------------------------------------------------
// JS -> C++ conversion (on the JS thread; throws TypeError on bad input)

Napi::Value field(const Napi::Object& o, const char* key) {
  Napi::Value v = o.Get(key);
  if (v.IsUndefined()) throw Napi::TypeError::New(o.Env(), std::string("missing field '") + key + "'");
  return v;
}
double num(const Napi::Object& o, const char* key) {
  Napi::Value v = field(o, key);
  if (!v.IsNumber()) throw Napi::TypeError::New(o.Env(), std::string("field '") + key + "' must be a number");
  return v.As<Napi::Number>().DoubleValue();
}
double numOr(const Napi::Object& o, const char* key, double def) {
  Napi::Value v = o.Get(key);
  return v.IsUndefined() || v.IsNull() ? def : num(o, key);
}
bool boolOr(const Napi::Object& o, const char* key, bool def) {
  Napi::Value v = o.Get(key);
  return v.IsUndefined() || v.IsNull() ? def : v.ToBoolean().Value();
}
std::string str(const Napi::Object& o, const char* key) {
  Napi::Value v = field(o, key);
  if (!v.IsString()) throw Napi::TypeError::New(o.Env(), std::string("field '") + key + "' must be a string");
  return v.As<Napi::String>().Utf8Value();
}
Napi::Object obj(Napi::Value v, const char* what) {
  if (!v.IsObject()) throw Napi::TypeError::New(v.Env(), std::string(what) + " must be an object");
  return v.As<Napi::Object>();
}
Napi::Array arr(Napi::Value v, const char* what) {
  if (!v.IsArray()) throw Napi::TypeError::New(v.Env(), std::string(what) + " must be an array");
  return v.As<Napi::Array>();
}

// Integer arrays: Int32Array, Uint32Array or number[].
std::vector<int64_t> ints(Napi::Value v, const char* what) {
  std::vector<int64_t> out;
  if (v.IsTypedArray()) {
    Napi::TypedArray ta = v.As<Napi::TypedArray>();
    if (ta.TypedArrayType() == napi_int32_array) {
      auto a = v.As<Napi::Int32Array>();
      out.assign(a.Data(), a.Data() + a.ElementLength());
    } else if (ta.TypedArrayType() == napi_uint32_array) {
      auto a = v.As<Napi::Uint32Array>();
      out.assign(a.Data(), a.Data() + a.ElementLength());
    } else {
      throw Napi::TypeError::New(v.Env(), std::string(what) + " must be an Int32Array, Uint32Array or number[]");
    }
    return out;
  }
  Napi::Array a = arr(v, what);
  out.resize(a.Length());
  for (uint32_t i = 0; i < a.Length(); i++) {
    Napi::Value e = a.Get(i);
    if (!e.IsNumber()) throw Napi::TypeError::New(v.Env(), std::string(what) + " must contain numbers");
    double d = e.As<Napi::Number>().DoubleValue();
    if (d != double(int64_t(d))) throw Napi::TypeError::New(v.Env(), std::string(what) + " must contain integers");
    out[i] = int64_t(d);
  }
  return out;
}

// Real arrays: Float32Array, Float64Array or number[].
std::vector<double> reals(Napi::Value v, const char* what) {
  if (v.IsTypedArray()) {
    Napi::TypedArray ta = v.As<Napi::TypedArray>();
    if (ta.TypedArrayType() == napi_float32_array) {
      auto a = v.As<Napi::Float32Array>();
      return std::vector<double>(a.Data(), a.Data() + a.ElementLength());
    }
    if (ta.TypedArrayType() == napi_float64_array) {
      auto a = v.As<Napi::Float64Array>();
      return std::vector<double>(a.Data(), a.Data() + a.ElementLength());
    }
    throw Napi::TypeError::New(v.Env(), std::string(what) + " must be a Float32Array, Float64Array or number[]");
  }
  Napi::Array a = arr(v, what);
  std::vector<double> out(a.Length());
  for (uint32_t i = 0; i < a.Length(); i++) {
    Napi::Value e = a.Get(i);
    if (!e.IsNumber()) throw Napi::TypeError::New(v.Env(), std::string(what) + " must contain numbers");
    out[i] = e.As<Napi::Number>().DoubleValue();
  }
  return out;
}

std::vector<uint8_t> mask(Napi::Value v, const char* what) {
  if (v.IsTypedArray() && v.As<Napi::TypedArray>().TypedArrayType() == napi_uint8_array) {
    auto a = v.As<Napi::Uint8Array>();
    return std::vector<uint8_t>(a.Data(), a.Data() + a.ElementLength());
  }
  Napi::Array a = arr(v, what);
  std::vector<uint8_t> out(a.Length());
  for (uint32_t i = 0; i < a.Length(); i++) out[i] = a.Get(i).ToBoolean().Value() ? 1 : 0;
  return out;
}

ArchConfig archConfig(Napi::Value v) {
  Napi::Object o = obj(v, "config");
  ArchConfig c;
  c.arch = str(o, "arch");
  c.vocabSize = int64_t(num(o, "vocabSize"));
  c.hiddenSize = int64_t(num(o, "hiddenSize"));
  c.intermediateSize = int64_t(num(o, "intermediateSize"));
  c.numLayers = int64_t(num(o, "numLayers"));
  c.numHeads = int64_t(num(o, "numHeads"));
  c.numKvHeads = int64_t(num(o, "numKvHeads"));
  c.headDim = int64_t(num(o, "headDim"));
  c.maxPositionEmbeddings = int64_t(num(o, "maxPositionEmbeddings"));
  c.rmsNormEps = num(o, "rmsNormEps");
  c.ropeTheta = num(o, "ropeTheta");
  c.tieWordEmbeddings = field(o, "tieWordEmbeddings").ToBoolean().Value();
  c.attentionBias = field(o, "attentionBias").ToBoolean().Value();
  c.qkNorm = field(o, "qkNorm").ToBoolean().Value();
  return c;
}

// ---------------------------------------------------------------------------------------------
// Async jobs

// Runs `work` on a libuv worker thread and settles a Promise with `done`'s value (built on the JS
// thread). Holds references to JS buffers the work reads, and the model's busy flag.
class Job : public Napi::AsyncWorker {
 public:
  using Work = std::function<void()>;
  using Done = std::function<Napi::Value(Napi::Env)>;

  Job(Napi::Env env, std::shared_ptr<Model> lock, Work work, Done done)
      : Napi::AsyncWorker(env), deferred_(Napi::Promise::Deferred::New(env)), lock_(std::move(lock)),
        work_(std::move(work)), done_(std::move(done)) {
    if (lock_ && lock_->busy.exchange(true)) {
      lock_.reset();  // not ours to release
      throw Napi::Error::New(env,
                             "prime_native: model is busy with another call; await each call before the next "
                             "(the TS facade queues them)");
    }
  }
  // Keeps a JS value (e.g. a Buffer whose bytes the work reads) alive until the job settles.
  void keep(Napi::Value v) { refs_.push_back(Napi::Persistent(v)); }
  Napi::Promise start() {
    Napi::Promise p = deferred_.Promise();
    Queue();
    return p;
  }

 protected:
  void Execute() override {
    if (int n = gThreads.load(); n > 0) at::set_num_threads(n);  // per thread under OpenMP
    try {
      work_();
    } catch (const c10::Error& e) {
      SetError(e.what_without_backtrace());
    } catch (const std::exception& e) {
      SetError(e.what());
    } catch (...) {
      SetError("unknown native error");
    }
  }
  void OnOK() override {
    unlock();
    try {
      deferred_.Resolve(done_ ? done_(Env()) : Env().Undefined());
    } catch (const Napi::Error& e) {
      deferred_.Reject(e.Value());
    }
  }
  void OnError(const Napi::Error& e) override {
    unlock();
    deferred_.Reject(e.Value());
  }

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
};

// Borrows the bytes of JS {name, dtype, shape, data} tensors; the job must keep `buffers` alive.
std::vector<RawTensor> rawTensors(Napi::Value v, std::vector<Napi::Value>& buffers) {
  Napi::Array a = arr(v, "tensors");
  std::vector<RawTensor> out(a.Length());
  for (uint32_t i = 0; i < a.Length(); i++) {
    Napi::Object o = obj(a.Get(i), "tensor");
    RawTensor& t = out[i];
    t.name = str(o, "name");
    t.dtype = str(o, "dtype");
    t.shape = ints(field(o, "shape"), "shape");
    Napi::Value data = field(o, "data");
    if (!data.IsTypedArray() || data.As<Napi::TypedArray>().TypedArrayType() != napi_uint8_array)
      throw Napi::TypeError::New(v.Env(), "tensor '" + t.name + "': data must be a Buffer or Uint8Array");
    auto bytes = data.As<Napi::Uint8Array>();
    t.data = bytes.Data();
    t.nbytes = bytes.ByteLength();
    buffers.push_back(data);
  }
  return out;
}

Napi::Array tensorsToJs(Napi::Env env, const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  Napi::Array out = Napi::Array::New(env, tensors.size());
  for (size_t i = 0; i < tensors.size(); i++) {
    const at::Tensor& t = tensors[i].second;
    Napi::Object o = Napi::Object::New(env);
    o.Set("name", tensors[i].first);
    o.Set("dtype", diskDtypeName(t.scalar_type()));
    Napi::Array shape = Napi::Array::New(env, t.dim());
    for (int64_t d = 0; d < t.dim(); d++) shape.Set(uint32_t(d), Napi::Number::New(env, double(t.size(d))));
    o.Set("shape", shape);
    o.Set("data", Napi::Buffer<uint8_t>::Copy(env, static_cast<const uint8_t*>(t.data_ptr()), t.nbytes()));
    out.Set(uint32_t(i), o);
  }
  return out;
}

Napi::Float32Array floats(Napi::Env env, const std::vector<float>& v) {
  Napi::Float32Array a = Napi::Float32Array::New(env, v.size());
  std::copy(v.begin(), v.end(), a.Data());
  return a;
}

// Per-addon-instance constructors of the wrapped classes.
struct Constructors {
  Napi::FunctionReference model, generator, trainer;
};

template <typename T>
Napi::Object wrap(Napi::Env env, Napi::FunctionReference Constructors::*which, std::shared_ptr<T> value) {
  auto ext = Napi::External<std::shared_ptr<T>>::New(env, new std::shared_ptr<T>(std::move(value)),
                                                     [](Napi::Env, std::shared_ptr<T>* p) { delete p; });
  return (env.GetInstanceData<Constructors>()->*which).New({ext});
}

template <typename T>
std::shared_ptr<T> unwrapExternal(const Napi::CallbackInfo& info, const char* cls) {
  if (info.Length() != 1 || !info[0].IsExternal())
    throw Napi::TypeError::New(info.Env(), std::string(cls) + " is created by the addon, not with new");
  return *info[0].As<Napi::External<std::shared_ptr<T>>>().Data();
}

// Runs synchronous native code on the JS thread; node-addon-api only converts Napi::Error, so
// C++ exceptions are rethrown as JS errors here instead of terminating the process.
template <typename F>
auto jsErrors(Napi::Env env, F f) -> decltype(f()) {
  try {
    return f();
  } catch (const Napi::Error&) {
    throw;
  } catch (const c10::Error& e) {
    throw Napi::Error::New(env, e.what_without_backtrace());
  } catch (const std::exception& e) {
    throw Napi::Error::New(env, e.what());
  }
}

void checkIdle(Napi::Env env, const Model& m) {
  if (m.busy) throw Napi::Error::New(env, "prime_native: model is busy with another call");
}

// ---------------------------------------------------------------------------------------------
// Generator

class GeneratorWrap : public Napi::ObjectWrap<GeneratorWrap> {
 public:
  static Napi::Function Define(Napi::Env env) {
    return DefineClass(env, "Generator",
                       {InstanceMethod("add", &GeneratorWrap::Add), InstanceMethod("step", &GeneratorWrap::Step),
                        InstanceMethod("remove", &GeneratorWrap::Remove),
                        InstanceMethod("stats", &GeneratorWrap::Stats)});
  }
  explicit GeneratorWrap(const Napi::CallbackInfo& info)
      : Napi::ObjectWrap<GeneratorWrap>(info), gen_(unwrapExternal<Generator>(info, "Generator")) {}

 private:
  Napi::Value Add(const Napi::CallbackInfo& info) {
    Napi::Array a = arr(info[0], "requests");
    std::vector<SequenceRequest> reqs(a.Length());
    for (uint32_t i = 0; i < a.Length(); i++) {
      Napi::Object o = obj(a.Get(i), "request");
      SequenceRequest& r = reqs[i];
      r.prompt = ints(field(o, "promptIds"), "promptIds");
      r.sampling.temperature = numOr(o, "temperature", 1.0);
      r.sampling.topP = numOr(o, "topP", 1.0);
      r.sampling.topK = int64_t(numOr(o, "topK", -1));
      r.sampling.minP = numOr(o, "minP", 0.0);
      r.maxTokens = int64_t(numOr(o, "maxTokens", 16));
      Napi::Value stops = o.Get("stopTokenIds");
      if (!stops.IsUndefined() && !stops.IsNull()) r.stopTokenIds = ints(stops, "stopTokenIds");
      Napi::Value seed = o.Get("seed");
      if (!seed.IsUndefined() && !seed.IsNull()) {
        r.hasSeed = true;
        r.seed = uint64_t(int64_t(num(o, "seed")));
      }
      r.promptLogprobs = boolOr(o, "promptLogprobs", false);
      r.topLogprobs = int64_t(numOr(o, "topLogprobs", 0));
    }
    auto gen = gen_;
    auto out = std::make_shared<std::vector<AddedSequence>>();
    Job* job = new Job(
        info.Env(), gen->model, [gen, reqs, out] { *out = gen->add(reqs); },
        [out](Napi::Env env) -> Napi::Value {
          Napi::Array res = Napi::Array::New(env, out->size());
          for (size_t i = 0; i < out->size(); i++) {
            Napi::Object o = Napi::Object::New(env);
            o.Set("seqId", double((*out)[i].seqId));
            if (!(*out)[i].promptLogprobs.empty()) o.Set("promptLogprobs", floats(env, (*out)[i].promptLogprobs));
            res.Set(uint32_t(i), o);
          }
          return res;
        });
    return job->start();
  }

  Napi::Value Step(const Napi::CallbackInfo& info) {
    auto gen = gen_;
    auto out = std::make_shared<std::vector<StepToken>>();
    Job* job = new Job(
        info.Env(), gen->model, [gen, out] { *out = gen->step(); },
        [out](Napi::Env env) -> Napi::Value {
          Napi::Array res = Napi::Array::New(env, out->size());
          for (size_t i = 0; i < out->size(); i++) {
            const StepToken& t = (*out)[i];
            Napi::Object o = Napi::Object::New(env);
            o.Set("seqId", double(t.seqId));
            o.Set("token", double(t.token));
            o.Set("logprob", t.logprob);
            o.Set("finished", t.finished);
            if (t.finished) o.Set("finishReason", t.finishReason);
            if (!t.error.empty()) o.Set("error", t.error);
            if (!t.topIds.empty()) {
              Napi::Object top = Napi::Object::New(env);
              Napi::Int32Array ids = Napi::Int32Array::New(env, t.topIds.size());
              std::copy(t.topIds.begin(), t.topIds.end(), ids.Data());
              Napi::Array lps = Napi::Array::New(env, t.topLogprobs.size());
              for (size_t k = 0; k < t.topLogprobs.size(); k++) lps.Set(uint32_t(k), double(t.topLogprobs[k]));
              top.Set("ids", ids);
              top.Set("logprobs", lps);
              o.Set("topLogprobs", top);
            }
            res.Set(uint32_t(i), o);
          }
          return res;
        });
    return job->start();
  }

  Napi::Value Remove(const Napi::CallbackInfo& info) {
    std::vector<int64_t> ids = ints(info[0], "seqIds");
    auto gen = gen_;
    auto out = std::make_shared<std::vector<bool>>();
    Job* job = new Job(
        info.Env(), gen->model, [gen, ids, out] { *out = gen->remove(ids); },
        [out](Napi::Env env) -> Napi::Value {
          Napi::Array res = Napi::Array::New(env, out->size());
          for (size_t i = 0; i < out->size(); i++) res.Set(uint32_t(i), bool((*out)[i]));
          return res;
        });
    return job->start();
  }

  Napi::Value Stats(const Napi::CallbackInfo& info) {
    Napi::Object o = Napi::Object::New(info.Env());
    o.Set("activeSequences", double(gen_->activeSequences()));
    o.Set("cachedTokens", double(gen_->cachedTokens()));
    o.Set("maxSequences", double(gen_->maxSequences));
    o.Set("maxSequenceLength", double(gen_->maxSequenceLength));
    o.Set("cacheUsage", double(gen_->cachedTokens()) / double(gen_->maxSequences * gen_->maxSequenceLength));
    return o;
  }

  std::shared_ptr<Generator> gen_;
};

// ---------------------------------------------------------------------------------------------
// Trainer

std::vector<TrainRow> trainRows(Napi::Value v) {
  Napi::Array a = arr(v, "rows");
  std::vector<TrainRow> rows(a.Length());
  for (uint32_t i = 0; i < a.Length(); i++) {
    Napi::Object o = obj(a.Get(i), "row");
    rows[i].ids = ints(field(o, "inputIds"), "inputIds");
    rows[i].pos = ints(field(o, "positionIds"), "positionIds");
    rows[i].lossMask = mask(field(o, "lossMask"), "lossMask");
    Napi::Value adv = o.Get("advantages"), mu = o.Get("inferenceLogprobs");
    if (!adv.IsUndefined() && !adv.IsNull()) rows[i].advantages = reals(adv, "advantages");
    if (!mu.IsUndefined() && !mu.IsNull()) rows[i].inferenceLogprobs = reals(mu, "inferenceLogprobs");
  }
  return rows;
}

// Packed rows (inputIds + positionIds) for scoring.
std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> scoreRows(Napi::Value v) {
  Napi::Array a = arr(v, "rows");
  std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> rows(a.Length());
  for (uint32_t i = 0; i < a.Length(); i++) {
    Napi::Object o = obj(a.Get(i), "row");
    rows[i] = {ints(field(o, "inputIds"), "inputIds"), ints(field(o, "positionIds"), "positionIds")};
  }
  return rows;
}

using Scores = std::vector<std::pair<std::vector<float>, std::vector<float>>>;
Napi::Value scoresToJs(Napi::Env env, const Scores& scores) {
  Napi::Array res = Napi::Array::New(env, scores.size());
  for (size_t i = 0; i < scores.size(); i++) {
    Napi::Object o = Napi::Object::New(env);
    o.Set("logprobs", floats(env, scores[i].first));
    o.Set("entropies", floats(env, scores[i].second));
    res.Set(uint32_t(i), o);
  }
  return res;
}

// Weights copied to the CPU in the dtype named like the safetensors ones ("" = compute dtype).
std::vector<std::pair<std::string, at::Tensor>> toCpu(const std::vector<std::pair<std::string, at::Tensor>>& in,
                                                      const std::string& dtype, at::ScalarType computeDtype) {
  at::ScalarType st = dtype.empty() ? computeDtype : at::kFloat;
  if (dtype == "F16") st = at::kHalf;
  else if (dtype == "BF16") st = at::kBFloat16;
  else if (dtype == "F64") st = at::kDouble;
  else if (!dtype.empty() && dtype != "F32") throw std::runtime_error("unsupported dtype '" + dtype + "'");
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (auto& [name, t] : in) out.emplace_back(name, t.detach().to(at::kCPU, st).contiguous().clone());
  return out;
}

// The JS LossConfig (native/index.ts) as a LossConfig; values are checked by validateLossConfig.
LossConfig lossConfig(Napi::Value v) {
  LossConfig c;
  if (v.IsUndefined() || v.IsNull()) return c;
  Napi::Object o = obj(v, "loss");
  if (!o.Get("kind").IsUndefined()) c.kind = str(o, "kind");
  if (!o.Get("normalization").IsUndefined()) c.normalization = str(o, "normalization");
  c.temperature = numOr(o, "temperature", c.temperature);
  c.normalizer = numOr(o, "normalizer", c.normalizer);
  Napi::Value params = o.Get("params");
  if (!params.IsUndefined() && !params.IsNull()) {
    Napi::Object p = obj(params, "loss.params");
    Napi::Array keys = p.GetPropertyNames();
    for (uint32_t i = 0; i < keys.Length(); i++) {
      const std::string key = keys.Get(i).As<Napi::String>().Utf8Value();
      c.params[key] = num(p, key.c_str());
    }
  }
  c.klBeta = numOr(o, "klBeta", c.klBeta);
  Napi::Value mm = o.Get("mismatch");
  if (!mm.IsUndefined() && !mm.IsNull()) {
    Napi::Object m = obj(mm, "mismatch");
    c.mismatch = str(m, "mode");
    c.tisCap = numOr(m, "tisCap", c.tisCap);
    c.tokenLow = numOr(m, "tokenLow", c.tokenLow);
    c.tokenHigh = numOr(m, "tokenHigh", c.tokenHigh);
    c.seqLow = numOr(m, "seqLow", c.seqLow);
    c.seqHigh = numOr(m, "seqHigh", c.seqHigh);
  }
  return c;
}

Napi::Object metricsToJs(Napi::Env env, const LossMetrics& s) {
  Napi::Object o = Napi::Object::New(env);
  o.Set("loss", s.loss);
  o.Set("entropy", s.entropy);
  o.Set("mismatchKl", s.mismatchKl);
  o.Set("maskedMismatchKl", s.maskedMismatchKl);
  o.Set("unmaskedMismatchKl", s.unmaskedMismatchKl);
  o.Set("referenceKl", s.referenceKl);
  o.Set("maskedTokenFraction", s.maskedTokenFraction);
  o.Set("maskedLowFraction", s.maskedLowFraction);
  o.Set("maskedHighFraction", s.maskedHighFraction);
  o.Set("maskedAdvantagePositive", s.maskedAdvantagePositive);
  o.Set("maskedAdvantageNegative", s.maskedAdvantageNegative);
  o.Set("maskedSampleFraction", s.maskedSampleFraction);
  o.Set("clippedFraction", s.clippedFraction);
  o.Set("lossTokens", double(s.lossTokens));
  o.Set("samples", double(s.samples));
  return o;
}

Napi::Object statsToJs(Napi::Env env, const StepStats& s) {
  Napi::Object o = metricsToJs(env, s.metrics);
  o.Set("gradNorm", s.gradNorm);
  o.Set("lr", s.lr);
  o.Set("tokens", double(s.tokens));
  o.Set("seconds", s.seconds);
  o.Set("forwardBackwardSeconds", s.forwardBackwardSeconds);
  o.Set("optimizerSeconds", s.optimizerSeconds);
  o.Set("tokensPerSecond", s.seconds > 0 ? double(s.tokens) / s.seconds : 0.0);
  return o;
}

class TrainerWrap : public Napi::ObjectWrap<TrainerWrap> {
 public:
  static Napi::Function Define(Napi::Env env) {
    return DefineClass(env, "Trainer",
                       {InstanceMethod("step", &TrainerWrap::Step), InstanceMethod("gradients", &TrainerWrap::Gradients),
                        InstanceMethod("score", &TrainerWrap::Score),
                        InstanceMethod("readWeights", &TrainerWrap::ReadWeights),
                        InstanceMethod("readAdapters", &TrainerWrap::ReadAdapters),
                        InstanceMethod("save", &TrainerWrap::Save), InstanceMethod("load", &TrainerWrap::Load),
                        InstanceMethod("stepCount", &TrainerWrap::StepCount)});
  }
  explicit TrainerWrap(const Napi::CallbackInfo& info)
      : Napi::ObjectWrap<TrainerWrap>(info), tr_(unwrapExternal<Trainer>(info, "Trainer")) {}

 private:
  Napi::Value Step(const Napi::CallbackInfo& info) {
    std::vector<TrainRow> rows = trainRows(info[0]);
    Napi::Object o = obj(info[1], "options");
    const double lr = num(o, "lr"), maxNorm = numOr(o, "maxGradNorm", 0.0);
    LossConfig loss = lossConfig(o.Get("loss"));
    auto tr = tr_;
    auto out = std::make_shared<StepStats>();
    Job* job = new Job(
        info.Env(), tr->model, [=] { *out = tr->step(rows, loss, lr, maxNorm); },
        [out](Napi::Env env) -> Napi::Value { return statsToJs(env, *out); });
    return job->start();
  }

  Napi::Value Gradients(const Napi::CallbackInfo& info) {
    std::vector<TrainRow> rows = trainRows(info[0]);
    LossConfig loss = lossConfig(info[1]);
    auto tr = tr_;
    auto out = std::make_shared<StepStats>();
    auto grads = std::make_shared<std::vector<std::pair<std::string, at::Tensor>>>();
    Job* job = new Job(
        info.Env(), tr->model,
        [=] {
          *out = tr->gradients(rows, loss, *grads);
          for (auto& g : *grads) g.second = g.second.cpu().contiguous();
        },
        [out, grads](Napi::Env env) -> Napi::Value {
          Napi::Object o = statsToJs(env, *out);
          o.Set("gradients", tensorsToJs(env, *grads));
          return o;
        });
    return job->start();
  }

  Napi::Value Score(const Napi::CallbackInfo& info) {
    auto rows = scoreRows(info[0]);
    const double temperature = info[1].IsObject() ? numOr(info[1].As<Napi::Object>(), "temperature", 1.0) : 1.0;
    auto tr = tr_;
    auto out = std::make_shared<Scores>(rows.size());
    Job* job = new Job(
        info.Env(), tr->model,
        [=] {
          c10::InferenceMode inference;
          for (size_t i = 0; i < rows.size(); i++)
            tr->score(rows[i].first, rows[i].second, temperature, (*out)[i].first, (*out)[i].second);
        },
        [out](Napi::Env env) -> Napi::Value { return scoresToJs(env, *out); });
    return job->start();
  }

  Napi::Value ReadWeights(const Napi::CallbackInfo& info) { return read(info, false); }
  Napi::Value ReadAdapters(const Napi::CallbackInfo& info) { return read(info, true); }
  Napi::Value read(const Napi::CallbackInfo& info, bool adapters) {
    std::string dtype = info[0].IsString() ? info[0].As<Napi::String>().Utf8Value() : "";
    auto tr = tr_;
    auto out = std::make_shared<std::vector<std::pair<std::string, at::Tensor>>>();
    Job* job = new Job(
        info.Env(), tr->model,
        [=] {
          c10::InferenceMode inference;
          *out = toCpu(adapters ? tr->adapters() : tr->policyWeights(), dtype, tr->model->dtype);
        },
        [out](Napi::Env env) -> Napi::Value { return tensorsToJs(env, *out); });
    return job->start();
  }

  Napi::Value Save(const Napi::CallbackInfo& info) {
    std::string dir = info[0].As<Napi::String>().Utf8Value();
    auto tr = tr_;
    return (new Job(info.Env(), tr->model, [tr, dir] { tr->save(dir); }, nullptr))->start();
  }

  Napi::Value Load(const Napi::CallbackInfo& info) {
    std::string dir = info[0].As<Napi::String>().Utf8Value();
    auto tr = tr_;
    return (new Job(info.Env(), tr->model, [tr, dir] { tr->load(dir); }, nullptr))->start();
  }

  Napi::Value StepCount(const Napi::CallbackInfo& info) { return Napi::Number::New(info.Env(), double(tr_->stepCount())); }

  std::shared_ptr<Trainer> tr_;
};

// ---------------------------------------------------------------------------------------------
// Model

class ModelWrap : public Napi::ObjectWrap<ModelWrap> {
 public:
  static Napi::Function Define(Napi::Env env) {
    return DefineClass(env, "Model",
                       {InstanceMethod("score", &ModelWrap::Score), InstanceMethod("loadWeights", &ModelWrap::LoadWeights),
                        InstanceMethod("readWeights", &ModelWrap::ReadWeights),
                        InstanceMethod("numParameters", &ModelWrap::NumParameters),
                        InstanceMethod("createGenerator", &ModelWrap::CreateGenerator),
                        InstanceMethod("createTrainer", &ModelWrap::CreateTrainer)});
  }
  explicit ModelWrap(const Napi::CallbackInfo& info)
      : Napi::ObjectWrap<ModelWrap>(info), model_(unwrapExternal<Model>(info, "Model")) {}

 private:
  Napi::Value Score(const Napi::CallbackInfo& info) {
    auto rows = scoreRows(info[0]);
    const double temperature = info[1].IsObject() ? numOr(info[1].As<Napi::Object>(), "temperature", 1.0) : 1.0;
    auto model = model_;
    auto out = std::make_shared<Scores>(rows.size());
    Job* job = new Job(
        info.Env(), model,
        [=] {
          c10::InferenceMode inference;
          for (size_t i = 0; i < rows.size(); i++)
            model->scoreRow(rows[i].first, rows[i].second, temperature, (*out)[i].first, (*out)[i].second);
        },
        [out](Napi::Env env) -> Napi::Value { return scoresToJs(env, *out); });
    return job->start();
  }

  Napi::Value LoadWeights(const Napi::CallbackInfo& info) {
    const bool strict = info[1].IsObject() ? boolOr(info[1].As<Napi::Object>(), "strict", true) : true;
    std::vector<Napi::Value> buffers;
    std::vector<RawTensor> tensors = rawTensors(info[0], buffers);
    auto model = model_;
    Job* job = new Job(info.Env(), model, [model, tensors, strict] { model->loadWeights(tensors, strict); }, nullptr);
    for (Napi::Value b : buffers) job->keep(b);
    return job->start();
  }

  Napi::Value ReadWeights(const Napi::CallbackInfo& info) {
    std::string dtype = info[0].IsString() ? info[0].As<Napi::String>().Utf8Value() : "";
    auto model = model_;
    auto out = std::make_shared<std::vector<std::pair<std::string, at::Tensor>>>();
    Job* job = new Job(
        info.Env(), model,
        [=] {
          c10::InferenceMode inference;
          *out = toCpu(model->namedParameters(), dtype, model->dtype);
        },
        [out](Napi::Env env) -> Napi::Value { return tensorsToJs(env, *out); });
    return job->start();
  }

  Napi::Value NumParameters(const Napi::CallbackInfo& info) {
    return Napi::Number::New(info.Env(), double(model_->numParameters()));
  }

  Napi::Value CreateGenerator(const Napi::CallbackInfo& info) {
    Napi::Object o = obj(info[0], "options");
    checkIdle(info.Env(), *model_);
    const int64_t seqs = int64_t(num(o, "maxSequences")), len = int64_t(num(o, "maxSequenceLength"));
    auto gen = jsErrors(info.Env(), [&] { return std::make_shared<Generator>(model_, seqs, len); });
    return wrap(info.Env(), &Constructors::generator, gen);
  }

  Napi::Value CreateTrainer(const Napi::CallbackInfo& info) {
    Napi::Object o = info[0].IsObject() ? info[0].As<Napi::Object>() : Napi::Object::New(info.Env());
    TrainerConfig c;
    c.adamw.beta1 = numOr(o, "beta1", c.adamw.beta1);
    c.adamw.beta2 = numOr(o, "beta2", c.adamw.beta2);
    c.adamw.eps = numOr(o, "eps", c.adamw.eps);
    c.adamw.weightDecay = numOr(o, "weightDecay", c.adamw.weightDecay);
    c.reference = boolOr(o, "reference", false);
    c.seed = uint64_t(numOr(o, "seed", 0));
    Napi::Value lora = o.Get("lora");
    if (!lora.IsUndefined() && !lora.IsNull()) {
      Napi::Object l = obj(lora, "lora");
      c.lora.rank = int64_t(num(l, "rank"));
      c.lora.alpha = num(l, "alpha");
      c.lora.dropout = numOr(l, "dropout", 0.0);
      Napi::Array targets = arr(field(l, "targetModules"), "targetModules");
      for (uint32_t i = 0; i < targets.Length(); i++) {
        if (!targets.Get(i).IsString()) throw Napi::TypeError::New(info.Env(), "targetModules must contain strings");
        c.lora.targets.push_back(targets.Get(i).As<Napi::String>().Utf8Value());
      }
      if (c.lora.rank < 1) throw Napi::RangeError::New(info.Env(), "lora.rank must be >= 1");
    }
    checkIdle(info.Env(), *model_);
    auto trainer = jsErrors(info.Env(), [&] { return std::make_shared<Trainer>(model_, c); });
    return wrap(info.Env(), &Constructors::trainer, trainer);
  }

  std::shared_ptr<Model> model_;
};

// ---------------------------------------------------------------------------------------------
// Module functions

Napi::Value CreateModel(const Napi::CallbackInfo& info) {
  ArchConfig cfg = archConfig(info[0]);
  Napi::Object o = info[2].IsObject() ? info[2].As<Napi::Object>() : Napi::Object::New(info.Env());
  const std::string dtype = o.Get("dtype").IsString() ? str(o, "dtype") : "float32";
  const std::string device = o.Get("device").IsString() ? str(o, "device") : "cpu";
  std::vector<Napi::Value> buffers;
  std::vector<RawTensor> tensors = rawTensors(info[1], buffers);
  auto out = std::make_shared<std::shared_ptr<Model>>();
  Job* job = new Job(
      info.Env(), nullptr,
      [=] {
        at::Device dev(device);
        if (dev.is_cuda() && !at::hasCUDA())
          throw std::runtime_error("device '" + device + "' requested but this libtorch build has no CUDA");
        *out = std::make_shared<Model>(cfg, tensors, parseComputeDtype(dtype), dev);
      },
      [out](Napi::Env env) -> Napi::Value { return wrap(env, &Constructors::model, *out); });
  for (Napi::Value b : buffers) job->keep(b);
  return job->start();
}

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
  return jsErrors(env, [&]() -> Napi::Value {
    validateLossConfig(cfg);
    const size_t T = logp.size();
    if (m.size() != T || mu.size() != T || adv.size() != T || ref.size() != T)
      throw std::runtime_error("logp, lossMask, mu, advantages and refLogp need the same length");
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
    in.sample = at::tensor(sample, at::TensorOptions().dtype(at::kLong));
    in.numSamples = int64_t(lengths.size());
    int64_t tokens, samples;
    countLossUnits(in.mask, in.sample, in.numSamples, tokens, samples);
    LossSums sums;
    policyLoss(cfg, in, resolveNormalizer(cfg, tokens, samples), sums).backward();
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

// Measured fp32 matmul throughput (GFLOP/s) of an n x n x n product, the benchmarks' yardstick.
Napi::Value MatmulGflops(const Napi::CallbackInfo& info) {
  const int64_t n = info[0].As<Napi::Number>().Int64Value(), iters = info[1].As<Napi::Number>().Int64Value();
  auto out = std::make_shared<double>(0);
  Job* job = new Job(
      info.Env(), nullptr,
      [=] {
        c10::InferenceMode inference;
        at::Tensor a = at::randn({n, n}), b = at::randn({n, n}), c = at::empty({n, n});
        at::mm_out(c, a, b);  // warm-up
        auto t0 = std::chrono::steady_clock::now();
        for (int64_t i = 0; i < iters; i++) at::mm_out(c, a, b);
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        *out = 2.0 * double(n) * double(n) * double(n) * double(iters) / s / 1e9;
      },
      [out](Napi::Env env) -> Napi::Value { return Napi::Number::New(env, *out); });
  return job->start();
}

Napi::Value Info(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Napi::Object out = Napi::Object::New(env);
  out.Set("torchVersion", std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
                              std::to_string(TORCH_VERSION_PATCH));
  out.Set("cuda", at::hasCUDA());
  out.Set("threads", gThreads.load() > 0 ? gThreads.load() : at::get_num_threads());
  auto blasThreads = reinterpret_cast<int (*)()>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  if (blasThreads) out.Set("blasThreads", blasThreads());
  out.Set("parallelInfo", at::get_parallel_info());
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
  return info.Env().Undefined();
}

}  // namespace
}  // namespace prime

Napi::Object Init(Napi::Env env, Napi::Object exports) {
  using namespace prime;
  auto* ctors = new Constructors();
  ctors->model = Napi::Persistent(ModelWrap::Define(env));
  ctors->generator = Napi::Persistent(GeneratorWrap::Define(env));
  ctors->trainer = Napi::Persistent(TrainerWrap::Define(env));
  env.SetInstanceData<Constructors>(ctors);
  exports.Set("info", Napi::Function::New(env, Info));
  exports.Set("setThreads", Napi::Function::New(env, SetThreads));
  exports.Set("createModel", Napi::Function::New(env, CreateModel));
  exports.Set("matmulGflops", Napi::Function::New(env, MatmulGflops));
  exports.Set("policyLoss", Napi::Function::New(env, PolicyLoss));
  exports.Set("lossKinds", Napi::Function::New(env, LossKinds));
  return exports;
}

NODE_API_MODULE(prime_native, Init)
