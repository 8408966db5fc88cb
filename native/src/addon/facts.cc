// engineTypes(): the X-macro lists of the engine's facts (facts.h) as plain data, from which
// `npm run gen:engine-types` writes native/engine-types.generated.ts (test/engine-types.test.ts).
#include <deque>

#include "addon/convert.h"
#include "addon/exports.h"
#include "dist.h"
#include "generation.h"
#include "loss.h"
#include "trainer.h"

namespace prime::addon {
namespace {

// The declarations of one TS interface, built field by field.
class InterfaceDecl {
 public:
  // defaults: the name of the TS const holding the fields' defaults ("" = none).
  InterfaceDecl(Napi::Env env, const char* name, const char* defaults)
      : env_(env), decl_(Napi::Object::New(env)), fields_(Napi::Array::New(env)) {
    decl_.Set("name", name);
    if (*defaults) decl_.Set("defaults", defaults);
    decl_.Set("fields", fields_);
  }
  // A field every value has.
  template <typename T>
  InterfaceDecl& field(const char* name, const char* doc) {
    Napi::Object f = Napi::Object::New(env_);
    f.Set("name", name);
    f.Set("type", tsType<T>());
    f.Set("doc", doc);
    fields_.Set(fields_.Length(), f);
    return *this;
  }
  // An optional field: absent, the engine takes `dflt`.
  template <typename T>
  InterfaceDecl& option(const char* name, T dflt, const char* doc) {
    field<T>(name, doc);
    fields_.Get(fields_.Length() - 1).As<Napi::Object>().Set("default", toJs(env_, dflt));
    return *this;
  }
  Napi::Object decl() const { return decl_; }

 private:
  Napi::Env env_;
  Napi::Object decl_;
  Napi::Array fields_;
};

template <typename E>
Napi::Object enumDecl(Napi::Env env) {
  Napi::Object e = Napi::Object::New(env);
  e.Set("type", EnumInfo<E>::type);
  e.Set("list", EnumInfo<E>::list);
  Napi::Array values = Napi::Array::New(env);
  for (const char* name : EnumInfo<E>::names) values.Set(values.Length(), name);
  e.Set("values", values);
  return e;
}

}  // namespace

Napi::Value EngineTypes(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Napi::Array enums = Napi::Array::New(env);
  for (Napi::Object e : {enumDecl<PrefixSharing>(env), enumDecl<Sharding>(env), enumDecl<DistBackend>(env),
                         enumDecl<LossNormalization>(env), enumDecl<MismatchMode>(env)})
    enums.Set(enums.Length(), e);

  std::deque<InterfaceDecl> decls;  // references stay valid as it grows
  InterfaceDecl& generator = decls.emplace_back(env, "GeneratorOptions", "GENERATOR_DEFAULTS");
#define PRIME_DECLARE_SIZE(name, type, doc) generator.field<type>(#name, doc);
  PRIME_GENERATOR_SIZES(PRIME_DECLARE_SIZE)
#undef PRIME_DECLARE_SIZE
#define PRIME_DECLARE_OPTION(name, type, dflt, doc) generator.option<type>(#name, dflt, doc);
  PRIME_GENERATOR_OPTIONS(PRIME_DECLARE_OPTION)
#undef PRIME_DECLARE_OPTION
  InterfaceDecl& counters = decls.emplace_back(env, "GeneratorCounters", "");
#define PRIME_DECLARE_COUNTER(name, doc) counters.field<int64_t>(#name, doc);
  PRIME_GENERATOR_COUNTERS(PRIME_DECLARE_COUNTER)
#undef PRIME_DECLARE_COUNTER
  InterfaceDecl& state = decls.emplace_back(env, "StateSlotStats", "");
#define PRIME_DECLARE_STATE_STAT(name, doc) state.field<int64_t>(#name, doc);
  PRIME_STATE_SLOT_STATS(PRIME_DECLARE_STATE_STAT)
#undef PRIME_DECLARE_STATE_STAT
  InterfaceDecl& times = decls.emplace_back(env, "StepTimes", "");
#define PRIME_DECLARE_STEP_TIME(name, type, doc) times.field<type>(#name, doc);
  PRIME_STEP_TIMES(PRIME_DECLARE_STEP_TIME)
#undef PRIME_DECLARE_STEP_TIME
  InterfaceDecl& adamw = decls.emplace_back(env, "AdamWOptions", "ADAMW_DEFAULTS");
#define PRIME_DECLARE_ADAMW(name, dflt, doc) adamw.option<double>(#name, dflt, doc);
  PRIME_ADAMW_FIELDS(PRIME_DECLARE_ADAMW)
#undef PRIME_DECLARE_ADAMW
  InterfaceDecl& step = decls.emplace_back(env, "TrainStepFields", "");
#define PRIME_DECLARE_STEP_FIELD(name, doc) step.field<double>(#name, doc);
  PRIME_STEP_FIELDS(PRIME_DECLARE_STEP_FIELD)
#undef PRIME_DECLARE_STEP_FIELD
  InterfaceDecl& mismatch = decls.emplace_back(env, "MismatchBounds", "MISMATCH_DEFAULTS");
#define PRIME_DECLARE_MISMATCH_BOUND(name, dflt, doc) mismatch.option<double>(#name, dflt, doc);
  PRIME_MISMATCH_BOUNDS(PRIME_DECLARE_MISMATCH_BOUND)
#undef PRIME_DECLARE_MISMATCH_BOUND

  Napi::Array interfaces = Napi::Array::New(env);
  for (const InterfaceDecl& d : decls) interfaces.Set(interfaces.Length(), d.decl());
  Napi::Object out = Napi::Object::New(env);
  out.Set("enums", enums);
  out.Set("interfaces", interfaces);
  return out;
}

}  // namespace prime::addon
