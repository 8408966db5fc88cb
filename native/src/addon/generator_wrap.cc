// JS class Generator: batched generation over a paged KV cache (Generator in native/generator.ts).
#include <cmath>

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
      r.sampling.presencePenalty = numOr(o, "presencePenalty", 0.0);
      r.sampling.frequencyPenalty = numOr(o, "frequencyPenalty", 0.0);
      r.sampling.minTokens = int64_t(numOr(o, "minTokens", 0));
      Napi::Value bias = o.Get("logitBias");
      if (!bias.IsUndefined() && !bias.IsNull()) {
        Napi::Object b = obj(bias, "logitBias");
        const std::vector<int64_t> ids = ints(field(b, "tokenIds"), "logitBias.tokenIds");
        const std::vector<double> biases = reals(field(b, "biases"), "logitBias.biases");
        if (ids.size() != biases.size())
          throw Napi::TypeError::New(info.Env(), "logitBias: tokenIds and biases differ in length");
        for (size_t j = 0; j < ids.size(); j++) r.sampling.logitBias.emplace_back(ids[j], biases[j]);
      }
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
      r.priority = int64_t(numOr(o, "priority", 0));
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
            res.Set(uint32_t(i), o);
          }
          return res;
        });
    return job->start();
  }

  Napi::Value Step(const Napi::CallbackInfo& info) {
    const double steps = info[0].IsNumber() ? info[0].As<Napi::Number>().DoubleValue() : 1;
    if (!(steps >= 1) || steps != std::floor(steps))
      throw Napi::TypeError::New(info.Env(), "maxSteps must be an integer >= 1");
    auto gen = gen_;
    auto out = std::make_shared<std::vector<StepToken>>();
    const int64_t maxSteps = int64_t(steps);
    Job* job = new Job(
        info.Env(), gen->model, [gen, out, maxSteps] { *out = gen->step(maxSteps); },
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
            if (t.first) o.Set("first", true);
            if (!t.promptLogprobs.empty()) o.Set("promptLogprobs", floats(env, t.promptLogprobs));
            if (!t.promptRoutes.empty()) o.Set("promptRoutes", int32s(env, t.promptRoutes));
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
    Napi::Env env = info.Env();
    const GeneratorStats st = gen_->stats();
    Napi::Object o = Napi::Object::New(env);
    o.Set("activeSequences", double(st.runningSequences + st.preemptedSequences));
#define PRIME_WRITE_COUNTER(name, doc) o.Set(#name, double(st.name));
    PRIME_GENERATOR_COUNTERS(PRIME_WRITE_COUNTER)
#undef PRIME_WRITE_COUNTER
    o.Set("maxSequences", double(gen_->maxSequences));
    o.Set("maxSequenceLength", double(gen_->maxSequenceLength));
    o.Set("blockSize", double(gen_->blockSize));
    o.Set("numBlocks", double(gen_->numBlocks()));
    o.Set("capacityTokens", double(gen_->capacityTokens()));
    o.Set("cacheUsage", double(st.blocksInUse) / double(gen_->numBlocks()));
    if (st.state.slots > 0) {  // a hybrid model's
      Napi::Object state = Napi::Object::New(env);
#define PRIME_WRITE_STATE_STAT(name, doc) state.Set(#name, double(st.state.name));
      PRIME_STATE_SLOT_STATS(PRIME_WRITE_STATE_STAT)
#undef PRIME_WRITE_STATE_STAT
      o.Set("state", state);
    }
    o.Set("cudaGraphs", double(gen_->cudaGraphs()));
    o.Set("eagerReason", gen_->eagerReason());
    Napi::Object times = Napi::Object::New(env);
#define PRIME_WRITE_STEP_TIME(name, type, doc) times.Set(#name, double(st.times.name));
    PRIME_STEP_TIMES(PRIME_WRITE_STEP_TIME)
#undef PRIME_WRITE_STEP_TIME
    o.Set("times", times);
    return o;
  }

  std::shared_ptr<Generator> gen_;
};

}  // namespace

Napi::Function DefineGenerator(Napi::Env env) { return GeneratorWrap::Define(env); }

GeneratorOptions generatorOptions(Napi::Env env, const Napi::Object& o) {
  return jsErrors(env, [&] {
    GeneratorOptions g;
#define PRIME_READ_SIZE(name, type, doc) g.name = fieldOf<type>(o, #name);
    PRIME_GENERATOR_SIZES(PRIME_READ_SIZE)
#undef PRIME_READ_SIZE
#define PRIME_READ_OPTION(name, type, dflt, doc) g.name = fieldOr<type>(o, #name, g.name);
    PRIME_GENERATOR_OPTIONS(PRIME_READ_OPTION)
#undef PRIME_READ_OPTION
    return g;
  });
}

}  // namespace prime::addon
