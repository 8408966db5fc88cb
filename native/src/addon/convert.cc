// JS <-> C++ conversions, on the JS thread: plain values, tensors, configs. Bad input throws a
// TypeError naming the field.
#include "addon/convert.h"

namespace prime::addon {

Napi::Value field(const Napi::Object& o, const char* key) {
  Napi::Value v = o.Get(key);
  if (v.IsUndefined()) throw Napi::TypeError::New(o.Env(), std::string("missing field '") + key + "'");
  return v;
}
Napi::Error optionErrorToJs(Napi::Env env, const OptionError& e) {
  Napi::Error err = Napi::Error::New(env, e.what());
  err.Value().Set("option", Napi::String::New(env, e.option));
  err.Value().Set("reason", Napi::String::New(env, e.reason));
  return err;
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
  c.numLayers = int64_t(num(o, "numLayers"));
  c.numHeads = int64_t(num(o, "numHeads"));
  c.numKvHeads = int64_t(num(o, "numKvHeads"));
  c.headDim = int64_t(num(o, "headDim"));
  c.rmsNormEps = num(o, "rmsNormEps");
  c.ropeTheta = num(o, "ropeTheta");
  Napi::Value moe = o.Get("moe");
  if (!moe.IsUndefined() && !moe.IsNull()) {
    Napi::Object m = obj(moe, "config.moe");
    c.numExpertsPerTok = int64_t(num(m, "numExpertsPerTok"));
    c.normTopkProb = boolOr(m, "normTopkProb", false);
  }
  c.normOffset = boolOr(o, "normOffset", false);
  c.attnOutputGate = boolOr(o, "attnOutputGate", false);
  Napi::Value prf = o.Get("partialRotaryFactor");
  if (!prf.IsUndefined() && !prf.IsNull()) c.partialRotaryFactor = num(o, "partialRotaryFactor");
  Napi::Value lin = o.Get("linearAttention");
  if (!lin.IsUndefined() && !lin.IsNull()) {
    Napi::Object la = obj(lin, "config.linearAttention");
    c.linear.numKeyHeads = int64_t(num(la, "numKeyHeads"));
    c.linear.numValueHeads = int64_t(num(la, "numValueHeads"));
    c.linear.keyHeadDim = int64_t(num(la, "keyHeadDim"));
    c.linear.valueHeadDim = int64_t(num(la, "valueHeadDim"));
    c.linear.convKernel = int64_t(num(la, "convKernel"));
  }
  return c;
}

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

Napi::Int32Array int32s(Napi::Env env, const std::vector<int32_t>& v) {
  Napi::Int32Array a = Napi::Int32Array::New(env, v.size());
  std::copy(v.begin(), v.end(), a.Data());
  return a;
}

Napi::Float32Array floats(Napi::Env env, const std::vector<float>& v) {
  Napi::Float32Array a = Napi::Float32Array::New(env, v.size());
  std::copy(v.begin(), v.end(), a.Data());
  return a;
}

ScoreRows scoreRows(Napi::Value v) {
  Napi::Array a = arr(v, "rows");
  ScoreRows rows(a.Length());
  for (uint32_t i = 0; i < a.Length(); i++) {
    Napi::Object o = obj(a.Get(i), "row");
    rows[i] = {ints(field(o, "inputIds"), "inputIds"), ints(field(o, "positionIds"), "positionIds")};
  }
  return rows;
}

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

// The JS LossConfig (native/trainer.ts) as a LossConfig; values are checked by validateLossConfig.
LossConfig lossConfig(Napi::Value v) {
  LossConfig c;
  if (v.IsUndefined() || v.IsNull()) return c;
  Napi::Object o = obj(v, "loss");
  return jsErrors(v.Env(), [&] {
    if (!o.Get("kind").IsUndefined()) c.kind = str(o, "kind");
    c.normalization = fieldOr(o, "normalization", c.normalization);
    c.temperature = numOr(o, "temperature", c.temperature);
    c.normalizer = numOr(o, "normalizer", c.normalizer);
    c.ceNormalizer = numOr(o, "ceNormalizer", c.ceNormalizer);
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
    c.routerAuxLossCoef = numOr(o, "routerAuxLossCoef", c.routerAuxLossCoef);
    Napi::Value mm = o.Get("mismatch");
    if (!mm.IsUndefined() && !mm.IsNull()) {
      Napi::Object m = obj(mm, "mismatch");
      c.mismatch = parseEnum<MismatchMode>(str(m, "mode"), "mismatch.mode");
#define PRIME_READ_MISMATCH_BOUND(name, dflt, doc) c.name = numOr(m, #name, c.name);
      PRIME_MISMATCH_BOUNDS(PRIME_READ_MISMATCH_BOUND)
#undef PRIME_READ_MISMATCH_BOUND
    }
    return c;
  });
}

Napi::Object metricsToJs(Napi::Env env, const Metrics& metrics) {
  Napi::Object o = Napi::Object::New(env);
  for (const auto& [name, value] : metrics.entries()) o.Set(name, value);
  return o;
}

std::vector<ParamSpec> paramSpecs(Napi::Value v) {
  Napi::Array a = arr(v, "specs");
  std::vector<ParamSpec> out(a.Length());
  for (uint32_t i = 0; i < a.Length(); i++) {
    Napi::Object o = obj(a.Get(i), "spec");
    out[i].name = str(o, "name");
    out[i].shape = ints(field(o, "shape"), "shape");
    out[i].slot = str(o, "slot");
    out[i].layer = int64_t(num(o, "layer"));
    out[i].expert = int64_t(numOr(o, "expert", -1));
  }
  return out;
}

}  // namespace prime::addon
