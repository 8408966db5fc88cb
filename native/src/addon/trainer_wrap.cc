// JS class Trainer: training steps, scoring, weights and checkpoints (Trainer in native/index.ts).
#include <c10/core/InferenceMode.h>

#include "addon/async.h"
#include "addon/convert.h"
#include "addon/exports.h"
#include "profile.h"
#include "trainer.h"

namespace prime::addon {
namespace {

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
    Napi::Value routes = o.Get("routes");
    if (!routes.IsUndefined() && !routes.IsNull()) rows[i].routes = ints(routes, "routes");
  }
  return rows;
}

Napi::Object statsToJs(Napi::Env env, const StepStats& s) {
  Napi::Object o = metricsToJs(env, s.metrics);
  o.Set("gradNorm", s.gradNorm);
  o.Set("lr", s.lr);
  o.Set("tokens", double(s.tokens));
  o.Set("seconds", s.seconds);
  o.Set("forwardBackwardSeconds", s.forwardBackwardSeconds);
  o.Set("optimizerSeconds", s.optimizerSeconds);
  o.Set("commSeconds", s.commSeconds);
  o.Set("tokensPerSecond", s.seconds > 0 ? double(s.tokens) / s.seconds : 0.0);
  o.Set("routerAuxLoss", s.routerAuxLoss);
  o.Set("expertLoadMax", s.expertLoadMax);
  o.Set("expertLoadMean", s.expertLoadMean);
  return o;
}

class TrainerWrap : public Napi::ObjectWrap<TrainerWrap> {
 public:
  static Napi::Function Define(Napi::Env env) {
    return DefineClass(
        env, "Trainer",
        {InstanceMethod("step", &TrainerWrap::Step), InstanceMethod("gradients", &TrainerWrap::Gradients),
         InstanceMethod("score", &TrainerWrap::Score), InstanceMethod("readWeights", &TrainerWrap::ReadWeights),
         InstanceMethod("readAdapters", &TrainerWrap::ReadAdapters), InstanceMethod("save", &TrainerWrap::Save),
         InstanceMethod("load", &TrainerWrap::Load), InstanceMethod("stepCount", &TrainerWrap::StepCount),
         InstanceMethod("setGroup", &TrainerWrap::SetGroup)});
  }
  explicit TrainerWrap(const Napi::CallbackInfo& info)
      : Napi::ObjectWrap<TrainerWrap>(info), tr_(unwrapExternal<Trainer>(info, "Trainer")) {}

 private:
  Napi::Value Step(const Napi::CallbackInfo& info) {
    std::vector<TrainRow> rows = trainRows(info[0]);
    Napi::Object o = obj(info[1], "options");
    const double lr = num(o, "lr"), maxNorm = numOr(o, "maxGradNorm", 0.0);
    LossConfig loss = lossConfig(o.Get("loss"));
    const std::string profile = o.Has("profile") && !o.Get("profile").IsUndefined() ? str(o, "profile") : "";
    auto tr = tr_;
    auto out = std::make_shared<StepStats>();
    Job* job = new Job(
        info.Env(), tr->model,
        [=] {
          const auto step = [&] { *out = tr->step(rows, loss, lr, maxNorm); };
          if (profile.empty()) step();
          else profiled(profile, tr->model->device, step);
        },
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
    return (new Job(
                info.Env(), tr->model, [tr, dir] { tr->save(dir); }, nullptr))
        ->start();
  }

  Napi::Value Load(const Napi::CallbackInfo& info) {
    std::string dir = info[0].As<Napi::String>().Utf8Value();
    auto tr = tr_;
    return (new Job(
                info.Env(), tr->model, [tr, dir] { tr->load(dir); }, nullptr))
        ->start();
  }

  // (group, bucketBytes): synchronous, the model must be idle.
  Napi::Value SetGroup(const Napi::CallbackInfo& info) {
    std::shared_ptr<DistGroup> group = unwrapGroup(info[0]);
    const int64_t bucketBytes = int64_t(info[1].As<Napi::Number>().DoubleValue());
    checkIdle(info.Env(), *tr_->model);
    jsErrors(info.Env(), [&] { tr_->setGroup(group, bucketBytes); });
    return info.Env().Undefined();
  }

  Napi::Value StepCount(const Napi::CallbackInfo& info) {
    return Napi::Number::New(info.Env(), double(tr_->stepCount()));
  }

  std::shared_ptr<Trainer> tr_;
};

}  // namespace

Napi::Function DefineTrainer(Napi::Env env) { return TrainerWrap::Define(env); }

}  // namespace prime::addon
