// Test-only entry points (native/testing.ts; never reached from native/index.ts): a generator
// with checks on (GeneratorChecks), and CacheBook, the generator's cache manager driven step by
// step without the model's forward, for unit tests of its bookkeeping (allocation, copy-on-write,
// eviction order, preemption, state slots and snapshots). Synchronous: every call is bookkeeping
// over small tensors on the JS thread.
#include <c10/core/InferenceMode.h>

#include <map>

#include "addon/async.h"
#include "addon/convert.h"
#include "addon/exports.h"
#include "cache_manager.h"
#include "generator.h"

namespace prime::addon {
namespace {

GeneratorChecks generatorChecks(const Napi::Value& v) {
  GeneratorChecks c;
  if (v.IsObject()) c.stateProbe = boolOr(v.As<Napi::Object>(), "stateProbe", false);
  return c;
}

Napi::Value CreateCheckedGenerator(const Napi::CallbackInfo& info) {
  std::shared_ptr<Model> model = unwrapModel(info[0]);
  checkIdle(info.Env(), *model);
  const GeneratorOptions g = generatorOptions(info.Env(), obj(info[1], "options"));
  const GeneratorChecks c = generatorChecks(info[2]);
  auto gen = jsErrors(info.Env(), [&] { return std::make_shared<Generator>(model, g, c); });
  return wrap(info.Env(), &Constructors::generator, gen);
}

Napi::Array int32Array(Napi::Env env, const std::vector<int32_t>& v) {
  Napi::Array a = Napi::Array::New(env, v.size());
  for (size_t i = 0; i < v.size(); i++) a.Set(uint32_t(i), double(v[i]));
  return a;
}

class CacheBookWrap : public Napi::ObjectWrap<CacheBookWrap> {
 public:
  static Napi::Function Define(Napi::Env env) {
    return DefineClass(
        env, "CacheBook",
        {InstanceMethod("admit", &CacheBookWrap::Admit), InstanceMethod("forward", &CacheBookWrap::Forward),
         InstanceMethod("append", &CacheBookWrap::Append), InstanceMethod("release", &CacheBookWrap::Release),
         InstanceMethod("syncEpoch", &CacheBookWrap::SyncEpoch),
         InstanceMethod("sequence", &CacheBookWrap::SequenceInfo), InstanceMethod("refs", &CacheBookWrap::Refs),
         InstanceMethod("state", &CacheBookWrap::State)});
  }

  // new CacheBook(model, generatorOptions, checks?)
  explicit CacheBookWrap(const Napi::CallbackInfo& info) : Napi::ObjectWrap<CacheBookWrap>(info) {
    model_ = unwrapModel(info[0]);
    checkIdle(info.Env(), *model_);
    const GeneratorOptions g = generatorOptions(info.Env(), obj(info[1], "options"));
    const GeneratorChecks c = generatorChecks(info[2]);
    cache_ = jsErrors(info.Env(), [&] {
      c10::InferenceMode inference;
      return std::make_unique<CacheManager>(model_, g, c);
    });
  }

 private:
  Sequence& seq(const Napi::Env& env, const Napi::Value& id) {
    auto it = seqs_.find(int64_t(id.As<Napi::Number>().DoubleValue()));
    if (it == seqs_.end()) throw Napi::Error::New(env, "no sequence " + id.ToString().Utf8Value() + " holds cache");
    return *it->second;
  }

  // admit(tokens, {priority, promptLogprobs}) -> id, or null when the cache has no room
  Napi::Value Admit(const Napi::CallbackInfo& info) {
    auto s = std::make_unique<Sequence>();
    s->tokens = ints(info[0], "tokens");
    s->req.prompt = s->tokens;
    s->promptLen = int64_t(s->tokens.size());
    if (info[1].IsObject()) {
      s->req.priority = int64_t(numOr(info[1].As<Napi::Object>(), "priority", 0));
      s->req.promptLogprobs = boolOr(info[1].As<Napi::Object>(), "promptLogprobs", false);
    }
    s->id = nextId_;
    s->arrival = nextArrival_;
    const bool ok = jsErrors(info.Env(), [&] {
      c10::InferenceMode inference;
      return cache_->admit(*s, !seqs_.empty());
    });
    if (!ok) return info.Env().Null();
    nextId_++;
    nextArrival_++;
    const int64_t id = s->id;
    seqs_.emplace(id, std::move(s));
    return Napi::Number::New(info.Env(), double(id));
  }

  // forward([[id, upTo], ...], decodeRows): one step's rows computed as the generator's forward
  // would (the first decodeRows of them decode rows): writes prepared (throws when they do not
  // fit), state rows checked and written (probe), computed advanced, followers resolved, blocks
  // indexed.
  Napi::Value Forward(const Napi::CallbackInfo& info) {
    Napi::Array a = arr(info[0], "rows");
    const int64_t decodeRows = info[1].IsNumber() ? int64_t(info[1].As<Napi::Number>().DoubleValue()) : 0;
    std::vector<SequenceWrite> rows;
    std::vector<int64_t> ids;
    for (uint32_t i = 0; i < a.Length(); i++) {
      Napi::Array r = arr(a.Get(i), "row");
      Sequence& s = seq(info.Env(), r.Get(0u));
      const int64_t upTo = int64_t(r.Get(1u).As<Napi::Number>().DoubleValue());
      if (upTo <= s.computed || upTo > int64_t(s.tokens.size()))
        throw Napi::Error::New(info.Env(), "row " + std::to_string(i) + ": upTo outside (computed, tokens]");
      rows.push_back({&s, s.computed, upTo});
      ids.insert(ids.end(), s.tokens.begin() + s.computed, s.tokens.begin() + upTo);
    }
    jsErrors(info.Env(), [&] {
      c10::InferenceMode inference;
      if (!cache_->reserve(rows)) throw std::runtime_error("the step's writes do not fit the cache");
      const CacheManager::StepState st = cache_->beginForward(rows, decodeRows);
      cache_->probeUpdate(at::tensor(ids, at::TensorOptions().dtype(at::kLong)).to(model_->device), rows, decodeRows,
                          st);
      cache_->endForward();
      for (const SequenceWrite& w : rows) w.seq->computed = w.to;
      cache_->resolveFollowers(rows);
      for (auto& [id, s] : seqs_) cache_->indexComputed(*s);
      return 0;
    });
    return info.Env().Undefined();
  }

  // append(id, token): a sampled token.
  Napi::Value Append(const Napi::CallbackInfo& info) {
    seq(info.Env(), info[0]).tokens.push_back(int64_t(info[1].As<Napi::Number>().DoubleValue()));
    return info.Env().Undefined();
  }

  // release(id, finished): a finished sequence (true) or a preempted or aborted one.
  Napi::Value Release(const Napi::CallbackInfo& info) {
    Sequence& s = seq(info.Env(), info[0]);
    const bool finished = info[1].ToBoolean().Value();
    jsErrors(info.Env(), [&] {
      c10::InferenceMode inference;
      cache_->release(s, finished);
      return 0;
    });
    seqs_.erase(s.id);
    return info.Env().Undefined();
  }

  Napi::Value SyncEpoch(const Napi::CallbackInfo& info) {
    return Napi::Boolean::New(info.Env(), jsErrors(info.Env(), [&] {
                                c10::InferenceMode inference;
                                return cache_->syncEpoch();
                              }));
  }

  // sequence(id) -> {computed, blocks, slot, leader, sharedLen}
  Napi::Value SequenceInfo(const Napi::CallbackInfo& info) {
    const Sequence& s = seq(info.Env(), info[0]);
    Napi::Object o = Napi::Object::New(info.Env());
    o.Set("computed", double(s.computed));
    o.Set("blocks", int32Array(info.Env(), s.cache.blocks));
    o.Set("slot", double(s.cache.slot));
    o.Set("leader", double(s.cache.leader));
    o.Set("sharedLen", double(s.cache.sharedLen));
    return o;
  }

  Napi::Value Refs(const Napi::CallbackInfo& info) {
    return Napi::Number::New(info.Env(), cache_->blockPool().refs(int32_t(info[0].As<Napi::Number>().Int32Value())));
  }

  // state() -> the stats, the free blocks and slots, and the eviction orders (parked blocks and
  // snapshot slots, least recently used first).
  Napi::Value State(const Napi::CallbackInfo& info) {
    GeneratorStats st;
    cache_->addStats(st);
    Napi::Object o = Napi::Object::New(info.Env());
    o.Set("numBlocks", double(cache_->numBlocks()));
    o.Set("available", double(cache_->blockPool().available()));
    o.Set("blocksInUse", double(st.blocksInUse));
    o.Set("blocksCached", double(st.blocksCached));
    o.Set("prefixHitTokens", double(st.prefixHitTokens));
    o.Set("parked", int32Array(info.Env(), cache_->prefixCache().parkedOrder()));
    o.Set("snapshots", int32Array(info.Env(), cache_->prefixCache().snapshotOrder()));
    o.Set("stateSlots", double(st.state.slots));
    o.Set("stateSlotsInUse", double(st.state.inUse));
    o.Set("stateSlotsCached", double(st.state.cached));
    o.Set("freeSlots", double(cache_->stateSlots() ? cache_->stateSlots()->freeSlots() : 0));
    return o;
  }

  std::shared_ptr<Model> model_;
  std::unique_ptr<CacheManager> cache_;
  std::map<int64_t, SeqPtr> seqs_;  // the sequences holding cache
  int64_t nextId_ = 1;
  uint64_t nextArrival_ = 0;
};

}  // namespace

Napi::Object Testing(Napi::Env env) {
  Napi::Object t = Napi::Object::New(env);
  t.Set("createCheckedGenerator", Napi::Function::New(env, CreateCheckedGenerator));
  t.Set("CacheBook", CacheBookWrap::Define(env));
  return t;
}

}  // namespace prime::addon
