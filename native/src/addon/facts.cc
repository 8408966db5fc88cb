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

  // One interface per list, `d` the one being declared; the expanders by the lists' shapes.
  std::deque<InterfaceDecl> decls;  // references stay valid as it grows
  InterfaceDecl* d = nullptr;
#define PRIME_FIELD(name, type, doc) d->field<type>(#name, doc);
#define PRIME_INT_FIELD(name, doc) d->field<int64_t>(#name, doc);
#define PRIME_REAL_FIELD(name, doc) d->field<double>(#name, doc);
#define PRIME_OPTION(name, type, dflt, doc) d->option<type>(#name, dflt, doc);
#define PRIME_REAL_OPTION(name, dflt, doc) d->option<double>(#name, dflt, doc);
  d = &decls.emplace_back(env, "GeneratorOptions", "GENERATOR_DEFAULTS");
  PRIME_GENERATOR_SIZES(PRIME_FIELD)
  PRIME_GENERATOR_OPTIONS(PRIME_OPTION)
  d = &decls.emplace_back(env, "GeneratorCounters", "");
  PRIME_GENERATOR_COUNTERS(PRIME_INT_FIELD)
  d = &decls.emplace_back(env, "StateSlotStats", "");
  PRIME_STATE_SLOT_STATS(PRIME_INT_FIELD)
  d = &decls.emplace_back(env, "StepTimes", "");
  PRIME_STEP_TIMES(PRIME_FIELD)
  d = &decls.emplace_back(env, "AdamWOptions", "ADAMW_DEFAULTS");
  PRIME_ADAMW_FIELDS(PRIME_REAL_OPTION)
  d = &decls.emplace_back(env, "TrainStepFields", "");
  PRIME_STEP_FIELDS(PRIME_REAL_FIELD)
  d = &decls.emplace_back(env, "MismatchBounds", "MISMATCH_DEFAULTS");
  PRIME_MISMATCH_BOUNDS(PRIME_REAL_OPTION)
#undef PRIME_FIELD
#undef PRIME_INT_FIELD
#undef PRIME_REAL_FIELD
#undef PRIME_OPTION
#undef PRIME_REAL_OPTION

  Napi::Array interfaces = Napi::Array::New(env);
  for (const InterfaceDecl& d : decls) interfaces.Set(interfaces.Length(), d.decl());
  Napi::Object out = Napi::Object::New(env);
  out.Set("enums", enums);
  out.Set("interfaces", interfaces);
  return out;
}

}  // namespace prime::addon
