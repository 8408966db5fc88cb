// JS class Trainer: training steps, scoring, weights and checkpoints (Trainer in native/trainer.ts).
#include <c10/core/InferenceMode.h>

#include <cmath>

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
    Napi::Value ce = o.Get("ceWeights");
    if (!ce.IsUndefined() && !ce.IsNull()) rows[i].ceWeights = reals(ce, "ceWeights");
    Napi::Value routes = o.Get("routes");
    if (!routes.IsUndefined() && !routes.IsNull()) rows[i].routes = ints(routes, "routes");
  }
  return rows;
}

Napi::Object statsToJs(Napi::Env env, const StepStats& s) {
  Napi::Object o = Napi::Object::New(env);
  o.Set("metrics", metricsToJs(env, s.metrics));
#define PRIME_WRITE_STEP_FIELD(name, doc) o.Set(#name, s.name);
  PRIME_STEP_FIELDS(PRIME_WRITE_STEP_FIELD)
#undef PRIME_WRITE_STEP_FIELD
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
         InstanceMethod("load", &TrainerWrap::Load), InstanceMethod("resetOptimizer", &TrainerWrap::ResetOptimizer),
         InstanceMethod("stepCount", &TrainerWrap::StepCount), InstanceMethod("setGroup", &TrainerWrap::SetGroup),
         InstanceMethod("weightUnits", &TrainerWrap::WeightUnits),
         InstanceMethod("readWeightUnit", &TrainerWrap::ReadWeightUnit),
         InstanceMethod("shardLayout", &TrainerWrap::ShardLayout), InstanceMethod("readShard", &TrainerWrap::ReadShard),
         InstanceMethod("stageShard", &TrainerWrap::StageShard), InstanceMethod("memory", &TrainerWrap::Memory),
         InstanceMethod("loadBaseShard", &TrainerWrap::LoadBaseShard)});
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
    return tensorsJob(info, [tr, adapters, dtype] {
      c10::InferenceMode inference;
      return toCpu(adapters ? tr->adapters() : tr->policyWeights(), dtype, tr->model->dtype);
    });
  }

  using Named = std::vector<std::pair<std::string, at::Tensor>>;
  // A job on the model resolving with the (CPU) tensors `read` returns on the worker thread.
  Napi::Value tensorsJob(const Napi::CallbackInfo& info, std::function<Named()> read) {
    auto out = std::make_shared<Named>();
    Job* job = new Job(
        info.Env(), tr_->model, [out, read] { *out = read(); },
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

  Napi::Value ResetOptimizer(const Napi::CallbackInfo& info) {
    auto tr = tr_;
    return (new Job(
                info.Env(), tr->model, [tr] { tr->resetOptimizer(); }, nullptr))
        ->start();
  }

  // (group, {bucketBytes, sharding}): synchronous, the model must be idle.
  Napi::Value SetGroup(const Napi::CallbackInfo& info) {
    std::shared_ptr<DistGroup> group = unwrapGroup(info[0]);
    Napi::Object o = obj(info[1], "options");
    const int64_t bucketBytes = int64_t(num(o, "bucketBytes"));
    checkIdle(info.Env(), *tr_->model);
    jsErrors(info.Env(),
             [&] { tr_->setGroup(group, bucketBytes, fieldOr<Sharding>(o, "sharding", Sharding::kOptimizer)); });
    return info.Env().Undefined();
  }

  Napi::Value WeightUnits(const Napi::CallbackInfo& info) {
    return Napi::Number::New(info.Env(), double(tr_->weightUnits()));
  }

  // (unit, dtype): the unit's policy weights (a collective under full sharding).
  Napi::Value ReadWeightUnit(const Napi::CallbackInfo& info) {
    const size_t unit = size_t(info[0].As<Napi::Number>().Int64Value());
    std::string dtype = info[1].IsString() ? info[1].As<Napi::String>().Utf8Value() : "";
    auto tr = tr_;
    return tensorsJob(info, [tr, unit, dtype] {
      if (unit >= tr->weightUnits()) throw std::runtime_error("readWeightUnit: no unit " + std::to_string(unit));
      return toCpu(tr->weightUnit(unit), dtype, tr->model->dtype);
    });
  }

  // The units of the model's parameters and this trainer's share of them (ShardPlan).
  Napi::Value ShardLayout(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    const ShardPlan& plan = tr_->shardPlan();
    Napi::Object o = Napi::Object::New(env);
    o.Set("sharded", tr_->shardsParameters());
    o.Set("worldSize", double(tr_->shardWorldSize()));
    o.Set("rank", double(tr_->shardRank()));
    o.Set("dtype", diskDtypeName(tr_->model->dtype));
    Napi::Array units = Napi::Array::New(env, plan.units.size());
    for (size_t u = 0; u < plan.units.size(); u++) {
      Napi::Object unit = Napi::Object::New(env);
      unit.Set("name", plan.units[u].name);
      unit.Set("numel", double(plan.units[u].numel));
      Napi::Array params = Napi::Array::New(env, plan.units[u].params.size());
      for (size_t k = 0; k < plan.units[u].params.size(); k++) {
        const ShardPlan::Param& pp = plan.params[plan.units[u].params[k]];
        Napi::Object param = Napi::Object::New(env);
        param.Set("name", pp.name);
        Napi::Array shape = Napi::Array::New(env, pp.shape.size());
        for (size_t d = 0; d < pp.shape.size(); d++) shape.Set(uint32_t(d), double(pp.shape[d]));
        param.Set("shape", shape);
        param.Set("offset", double(pp.offset));
        params.Set(uint32_t(k), param);
      }
      unit.Set("params", params);
      units.Set(uint32_t(u), unit);
    }
    o.Set("units", units);
    return o;
  }

  // (unit) -> [param, exp_avg, exp_avg_sq] of this rank's shard.
  Napi::Value ReadShard(const Napi::CallbackInfo& info) {
    const size_t unit = size_t(info[0].As<Napi::Number>().Int64Value());
    auto tr = tr_;
    return tensorsJob(info, [tr, unit] {
      const auto [param, m, v] = tr->readShard(unit);
      const std::string dtype = diskDtypeName(tr->model->dtype);
      return toCpu({{"param", param}, {"exp_avg", m}, {"exp_avg_sq", v}}, dtype, tr->model->dtype);
    });
  }

  // (unit, [param, exp_avg, exp_avg_sq] as {name, dtype, shape, data}): staged for the next load.
  Napi::Value StageShard(const Napi::CallbackInfo& info) {
    const size_t unit = size_t(info[0].As<Napi::Number>().Int64Value());
    std::vector<Napi::Value> buffers;
    std::vector<RawTensor> raw = rawTensors(info[1], buffers);
    if (raw.size() != 3) throw Napi::TypeError::New(info.Env(), "stageShard: expected [param, exp_avg, exp_avg_sq]");
    auto tr = tr_;
    Job* job = new Job(
        info.Env(), tr->model,
        [tr, unit, raw] {
          std::vector<at::Tensor> t;
          for (const RawTensor& r : raw) t.push_back(viewRaw(r, r.shape).clone());
          tr->stageShard(unit, t[0], t[1], t[2]);
        },
        nullptr);
    for (Napi::Value& b : buffers) job->keep(b);
    return job->start();
  }

  // (unit, [{offset, tensor: {name, dtype, shape, data}}]): parts of a unit's base weights.
  Napi::Value LoadBaseShard(const Napi::CallbackInfo& info) {
    const size_t unit = size_t(info[0].As<Napi::Number>().Int64Value());
    Napi::Array parts = arr(info[1], "parts");
    std::vector<int64_t> offsets;
    Napi::Array tensors = Napi::Array::New(info.Env(), parts.Length());
    for (uint32_t i = 0; i < parts.Length(); i++) {
      Napi::Object part = obj(parts.Get(i), "part");
      offsets.push_back(int64_t(num(part, "offset")));
      tensors.Set(i, field(part, "tensor"));
    }
    std::vector<Napi::Value> buffers;
    std::vector<RawTensor> raw = rawTensors(tensors, buffers);
    auto tr = tr_;
    Job* job = new Job(
        info.Env(), tr->model,
        [tr, unit, raw, offsets] {
          for (size_t i = 0; i < raw.size(); i++) tr->loadBaseShard(unit, offsets[i], viewRaw(raw[i], raw[i].shape));
        },
        nullptr);
    for (Napi::Value& b : buffers) job->keep(b);
    return job->start();
  }

  Napi::Value Memory(const Napi::CallbackInfo& info) {
    auto tr = tr_;
    auto out = std::make_shared<MemoryStats>();
    Job* job = new Job(
        info.Env(), tr->model, [=] { *out = tr->memory(); },
        [out](Napi::Env env) -> Napi::Value {
          Napi::Object o = Napi::Object::New(env);
          o.Set("parameterBytes", double(out->parameterBytes));
          o.Set("gradientBytes", double(out->gradientBytes));
          o.Set("optimizerBytes", double(out->optimizerBytes));
          o.Set("gatheredPeakBytes", double(out->gatheredPeakBytes));
          return o;
        });
    return job->start();
  }

  Napi::Value StepCount(const Napi::CallbackInfo& info) {
    return Napi::Number::New(info.Env(), double(tr_->stepCount()));
  }

  std::shared_ptr<Trainer> tr_;
};

}  // namespace

Napi::Function DefineTrainer(Napi::Env env) { return TrainerWrap::Define(env); }

Napi::Value ShardRange(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const auto count = [&](size_t i, const char* what, int64_t least) {
    const double v = info[i].IsNumber() ? info[i].As<Napi::Number>().DoubleValue() : -1;
    if (!(v >= double(least)) || v != std::floor(v))
      throw Napi::TypeError::New(
          env, std::string("shardRange: ") + what + " must be an integer >= " + std::to_string(least));
    return int64_t(v);
  };
  const int64_t numel = count(0, "numel", 0), worldSize = count(2, "worldSize", 1), rank = count(1, "rank", 0);
  if (rank >= worldSize) throw Napi::TypeError::New(env, "shardRange: rank must be below worldSize");
  const auto [begin, end] = ShardPlan::shardRange(numel, rank, worldSize);
  Napi::Object o = Napi::Object::New(env);
  o.Set("begin", double(begin));
  o.Set("end", double(end));
  o.Set("shardNumel", double(ShardPlan::shardNumel(numel, worldSize)));
  return o;
}

}  // namespace prime::addon
