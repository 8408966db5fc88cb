// JS class Model and createModel: a loaded model, scoring, weights, and the generators and
// trainers made from it (NativeModel in native/model.ts).
#include <c10/core/InferenceMode.h>

#include <cmath>

#include "addon/async.h"
#include "addon/convert.h"
#include "addon/exports.h"
#include "autocast.h"
#include "generator.h"
#include "state_check.h"
#include "trainer.h"

namespace prime::addon {
namespace {

class ModelWrap : public Napi::ObjectWrap<ModelWrap> {
 public:
  static Napi::Function Define(Napi::Env env) {
    return DefineClass(
        env, "Model",
        {InstanceMethod("score", &ModelWrap::Score), InstanceMethod("loadWeights", &ModelWrap::LoadWeights),
         InstanceMethod("readWeights", &ModelWrap::ReadWeights),
         InstanceMethod("numParameters", &ModelWrap::NumParameters),
         InstanceMethod("createGenerator", &ModelWrap::CreateGenerator),
         InstanceMethod("createTrainer", &ModelWrap::CreateTrainer),
         InstanceMethod("statePathCheck", &ModelWrap::StatePathCheck)});
  }
  explicit ModelWrap(const Napi::CallbackInfo& info)
      : Napi::ObjectWrap<ModelWrap>(info), model_(unwrapExternal<Model>(info, "Model")) {}
  const std::shared_ptr<Model>& model() const { return model_; }

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
    Job* job = new Job(
        info.Env(), model, [model, tensors, strict] { model->loadWeights(tensors, strict); }, nullptr);
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

  // A hybrid model's paged forward with state slots against its packed forward (state_check.h).
  Napi::Value StatePathCheck(const Napi::CallbackInfo& info) {
    Napi::Object o = obj(info[0], "options");
    StatePathOptions opts;
    opts.prompt = ints(field(o, "prompt"), "prompt");
    opts.prefillChunk = int64_t(numOr(o, "prefillChunk", double(opts.prefillChunk)));
    opts.snapshotAt = int64_t(numOr(o, "snapshotAt", double(opts.snapshotAt)));
    opts.blockSize = int64_t(numOr(o, "blockSize", double(opts.blockSize)));
    opts.greedySteps = int64_t(numOr(o, "greedySteps", double(opts.greedySteps)));
    auto model = model_;
    auto out = std::make_shared<StatePathResult>();
    Job* job = new Job(
        info.Env(), model, [=] { *out = checkStatePath(*model, opts); },
        [out](Napi::Env env) -> Napi::Value {
          Napi::Object r = Napi::Object::New(env);
          r.Set("prefillDiff", out->prefillDiff);
          r.Set("snapshotDiff", out->snapshotDiff);
          r.Set("decodeDiff", out->decodeDiff);
          Napi::Array g = Napi::Array::New(env, out->greedy.size());
          for (size_t i = 0; i < out->greedy.size(); i++) g.Set(uint32_t(i), double(out->greedy[i]));
          r.Set("greedy", g);
          return r;
        });
    return job->start();
  }

  Napi::Value NumParameters(const Napi::CallbackInfo& info) {
    return Napi::Number::New(info.Env(), double(model_->numParameters()));
  }

  Napi::Value CreateGenerator(const Napi::CallbackInfo& info) {
    Napi::Object o = obj(info[0], "options");
    checkIdle(info.Env(), *model_);
    const GeneratorOptions g = generatorOptions(info.Env(), o);
    auto gen = jsErrors(info.Env(), [&] { return std::make_shared<Generator>(model_, g); });
    return wrap(info.Env(), &Constructors::generator, gen);
  }

  Napi::Value CreateTrainer(const Napi::CallbackInfo& info) {
    Napi::Object o = info[0].IsObject() ? info[0].As<Napi::Object>() : Napi::Object::New(info.Env());
    TrainerConfig c;
#define PRIME_READ_ADAMW(name, dflt, doc) c.adamw.name = numOr(o, #name, c.adamw.name);
    PRIME_ADAMW_FIELDS(PRIME_READ_ADAMW)
#undef PRIME_READ_ADAMW
    c.reference = boolOr(o, "reference", false);
    c.seed = uint64_t(numOr(o, "seed", 0));
    const double every = numOr(o, "activationCheckpointing", 0);
    if (!(every >= 0) || every != std::floor(every))
      throw Napi::TypeError::New(info.Env(), "activationCheckpointing must be an integer >= 0 (every N-th layer)");
    c.activationCheckpointing = int64_t(every);
    Napi::Value mp = o.Get("mixedPrecision");
    if (!mp.IsUndefined() && !mp.IsNull()) {
      if (!mp.IsString()) throw Napi::TypeError::New(info.Env(), "mixedPrecision must be a string ('bfloat16')");
      c.mixedPrecision = jsErrors(info.Env(), [&] { return parseMixedPrecision(mp.As<Napi::String>().Utf8Value()); });
    }
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

}  // namespace

std::shared_ptr<Model> unwrapModel(Napi::Value v) {
  if (!v.IsObject()) throw Napi::TypeError::New(v.Env(), "expected a Model");
  return ModelWrap::Unwrap(v.As<Napi::Object>())->model();
}

Napi::Function DefineModel(Napi::Env env) { return ModelWrap::Define(env); }

// o[key] as an integer >= 0, `fallback` when absent; a TypeError naming the key otherwise.
static int64_t nonNegativeInt(const Napi::Object& o, const char* key, int64_t fallback, const std::string& hint) {
  const Napi::Value v = o.Get(key);
  if (v.IsUndefined()) return fallback;
  const double d = v.IsNumber() ? v.As<Napi::Number>().DoubleValue() : -1;
  if (!(d >= 0 && d == std::floor(d) && d < 9.007199254740992e15))
    throw Napi::TypeError::New(o.Env(), std::string(key) + " must be an integer >= 0 " + hint);
  return int64_t(d);
}

Napi::Value CreateModel(const Napi::CallbackInfo& info) {
  ArchConfig cfg = archConfig(info[0]);
  std::vector<ParamSpec> specs = paramSpecs(info[1]);
  Napi::Object o = info[3].IsObject() ? info[3].As<Napi::Object>() : Napi::Object::New(info.Env());
  const std::string dtype = o.Get("dtype").IsString() ? str(o, "dtype") : "float32";
  const std::string device = o.Get("device").IsString() ? str(o, "device") : "cpu";
  const int64_t chunk = nonNegativeInt(o, "logitsChunkTokens", 0, "(0 = from the vocabulary size)");
  const int64_t keep = nonNegativeInt(o, "logitsKeepBytes", kLogitsKeepBytes, "(0 = recompute every chunk)");
  const Napi::Value fusedOpt = o.Get("fusedProjections");
  if (!fusedOpt.IsUndefined() && !fusedOpt.IsBoolean())
    throw Napi::TypeError::New(info.Env(), "fusedProjections must be true or false (default true)");
  const bool fused = fusedOpt.IsUndefined() || fusedOpt.As<Napi::Boolean>().Value();
  const Napi::Value kernelsOpt = o.Get("fusedKernels");
  if (!kernelsOpt.IsUndefined() && !kernelsOpt.IsBoolean())
    throw Napi::TypeError::New(info.Env(), "fusedKernels must be true or false (default false)");
  const bool fusedKernels = !kernelsOpt.IsUndefined() && kernelsOpt.As<Napi::Boolean>().Value();
  const bool withoutWeights = boolOr(o, "withoutWeights", false);
  std::vector<Napi::Value> buffers;
  std::vector<RawTensor> tensors = rawTensors(info[2], buffers);
  auto out = std::make_shared<std::shared_ptr<Model>>();
  Job* job = new Job(
      info.Env(), nullptr,
      [=] {
        at::Device dev(device);
        if (dev.is_cuda() && !at::hasCUDA())
          throw std::runtime_error("device '" + device + "' requested but this libtorch build has no CUDA");
        if (fusedKernels) checkFusedKernels(dev, parseComputeDtype(dtype));
        *out = withoutWeights ? Model::withoutWeights(cfg, specs, parseComputeDtype(dtype), dev)
                              : std::make_shared<Model>(cfg, specs, tensors, parseComputeDtype(dtype), dev);
        (*out)->logitsChunkTokens = chunk;
        (*out)->logitsKeepBytes = keep;
        (*out)->fusedProjections = fused;
        (*out)->fusedKernels = fusedKernels;
      },
      [out](Napi::Env env) -> Napi::Value { return wrap(env, &Constructors::model, *out); });
  for (Napi::Value b : buffers) job->keep(b);
  return job->start();
}

}  // namespace prime::addon
