// JS class Generator: batched generation over a KV cache (Generator in native/index.ts).
#include "addon/async.h"
#include "addon/convert.h"
#include "addon/exports.h"
#include "generator.h"

namespace prime::addon {
namespace {

class GeneratorWrap : public Napi::ObjectWrap<GeneratorWrap> {
 public:
  static Napi::Function Define(Napi::Env env) {
    return DefineClass(
        env, "Generator",
        {InstanceMethod("add", &GeneratorWrap::Add), InstanceMethod("step", &GeneratorWrap::Step),
         InstanceMethod("remove", &GeneratorWrap::Remove), InstanceMethod("stats", &GeneratorWrap::Stats)});
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
      r.returnRoutes = boolOr(o, "returnRoutes", false);
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
            if (!(*out)[i].promptRoutes.empty()) o.Set("promptRoutes", int32s(env, (*out)[i].promptRoutes));
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
            if (!t.routes.empty()) o.Set("routes", int32s(env, t.routes));
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
    o.Set("cudaGraphs", double(gen_->cudaGraphs()));
    o.Set("eagerReason", gen_->eagerReason());
    return o;
  }

  std::shared_ptr<Generator> gen_;
};

}  // namespace

Napi::Function DefineGenerator(Napi::Env env) { return GeneratorWrap::Define(env); }

}  // namespace prime::addon
