// JS <-> C++ conversions shared by the wrapped classes (on the JS thread; bad input throws a
// TypeError naming the field or key).
#pragma once

#include <napi.h>

#include <c10/util/Exception.h>

#include <string>
#include <utility>
#include <vector>

#include "facts.h"
#include "loss.h"
#include "metrics.h"
#include "model.h"

namespace prime::addon {

// Fields of a JS object: missing or mistyped ones are TypeErrors naming the key.
Napi::Value field(const Napi::Object& o, const char* key);
double num(const Napi::Object& o, const char* key);
double numOr(const Napi::Object& o, const char* key, double def);
bool boolOr(const Napi::Object& o, const char* key, bool def);
std::string str(const Napi::Object& o, const char* key);
Napi::Object obj(Napi::Value v, const char* what);
Napi::Array arr(Napi::Value v, const char* what);
// Integer arrays: Int32Array, Uint32Array or number[].
std::vector<int64_t> ints(Napi::Value v, const char* what);
// Real arrays: Float32Array, Float64Array or number[].
std::vector<double> reals(Napi::Value v, const char* what);
// Uint8Array or array of truthy/falsy values.
std::vector<uint8_t> mask(Napi::Value v, const char* what);

ArchConfig archConfig(Napi::Value v);
// The family's tensor table ({name, shape, slot, layer}[]) from native/model-binding.ts.
std::vector<ParamSpec> paramSpecs(Napi::Value v);
// Borrows the bytes of JS {name, dtype, shape, data} tensors; the job must keep `buffers` alive.
std::vector<RawTensor> rawTensors(Napi::Value v, std::vector<Napi::Value>& buffers);
Napi::Array tensorsToJs(Napi::Env env, const std::vector<std::pair<std::string, at::Tensor>>& tensors);
Napi::Float32Array floats(Napi::Env env, const std::vector<float>& v);
Napi::Int32Array int32s(Napi::Env env, const std::vector<int32_t>& v);
// Weights copied to the CPU in the dtype named like the safetensors ones ("" = compute dtype).
std::vector<std::pair<std::string, at::Tensor>> toCpu(const std::vector<std::pair<std::string, at::Tensor>>& in,
                                                      const std::string& dtype, at::ScalarType computeDtype);

// Packed rows (inputIds + positionIds) for scoring, and their per-token scores.
using ScoreRows = std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>>;
ScoreRows scoreRows(Napi::Value v);
using Scores = std::vector<std::pair<std::vector<float>, std::vector<float>>>;
Napi::Value scoresToJs(Napi::Env env, const Scores& scores);

// The loss configuration (LossConfig in native/trainer.ts; absent = defaults).
LossConfig lossConfig(Napi::Value v);
// Metrics as a JS object of numbers by name (StepMetrics in native/trainer.ts), in their order.
Napi::Object metricsToJs(Napi::Env env, const Metrics& metrics);

// A JS array of one object per row, each filled by `fill(object, row)`.
template <typename Row, typename Fill>
Napi::Array rowsToJs(Napi::Env env, const std::vector<Row>& rows, Fill fill) {
  Napi::Array out = Napi::Array::New(env, rows.size());
  for (size_t i = 0; i < rows.size(); i++) {
    Napi::Object r = Napi::Object::New(env);
    fill(r, rows[i]);
    out.Set(uint32_t(i), r);
  }
  return out;
}

// A field of an X-macro list (facts.h) read from JS: `def` when absent; numbers, booleans, and
// enums by name (another name is an OptionError naming the key and the values).
template <typename T>
T fieldOr(const Napi::Object& o, const char* key, T def) {
  if constexpr (std::is_same_v<T, bool>) {
    return boolOr(o, key, def);
  } else if constexpr (std::is_enum_v<T>) {
    Napi::Value v = o.Get(key);
    if (v.IsUndefined()) return def;
    if (!v.IsString()) throw OptionError(key, "must be one of " + enumNames<T>());
    return parseEnum<T>(v.As<Napi::String>().Utf8Value(), key);
  } else {
    return T(numOr(o, key, double(def)));
  }
}
// A field every caller gives (a number).
template <typename T>
T fieldOf(const Napi::Object& o, const char* key) {
  return T(num(o, key));
}
// A field's value as JS sees it: a number, a boolean, an enum's name.
template <typename T>
Napi::Value toJs(Napi::Env env, T v) {
  if constexpr (std::is_same_v<T, bool>) return Napi::Boolean::New(env, v);
  else if constexpr (std::is_enum_v<T>) return Napi::String::New(env, enumName(v));
  else return Napi::Number::New(env, double(v));
}

// An OptionError as a JS Error: its message, and `option` and `reason` for callers that map it.
Napi::Error optionErrorToJs(Napi::Env env, const OptionError& e);

// Runs synchronous native code on the JS thread; node-addon-api only converts Napi::Error, so
// C++ exceptions are rethrown as JS errors here instead of terminating the process.
template <typename F>
auto jsErrors(Napi::Env env, F f) -> decltype(f()) {
  try {
    return f();
  } catch (const Napi::Error&) {
    throw;
  } catch (const OptionError& e) {
    throw optionErrorToJs(env, e);
  } catch (const c10::Error& e) {
    throw Napi::Error::New(env, e.what_without_backtrace());
  } catch (const std::exception& e) {
    throw Napi::Error::New(env, e.what());
  }
}

}  // namespace prime::addon
