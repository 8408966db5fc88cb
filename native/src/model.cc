// The model, top to bottom: weight loading, RMSNorm, RoPE, attention (packed and cached), the
// SwiGLU block (dense, or Qwen3-MoE's routed experts), logits and token log-probabilities.
// Follows Hugging Face's Llama/Qwen2/Qwen3/Qwen3-MoE modelling code so that logprobs match a transformers forward to
// fp32 precision.
#include "model.h"

#include "autocast.h"
#include "checkpoint.h"
#include "cuda_info.h"
#include "fast_exp.h"
#include "host_parallel.h"
#include "paged_decode.h"
#include "storage.h"

#include <torch/version.h>  // TORCH_VERSION_MAJOR: fused attention exists from 2.0

#include <ATen/Dispatch.h>
#include <ATen/core/grad_mode.h>  // at::NoGradGuard (not pulled in by ATen.h in libtorch 2.x)

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>

// bmm with an out_dtype (bf16 inputs, fp32 scores): libtorch 2.11 has it (decodeAttentionBmm).
#define PRIME_BMM_OUT_DTYPE (TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 11))

namespace prime {
namespace {

// Set once CUDA's variable-length flash attention has failed in this process (packedLayer).
std::atomic<bool> flashVarlenFailed{false};

std::string shapeStr(const std::vector<int64_t>& s) {
  std::ostringstream o;
  o << "[";
  for (size_t i = 0; i < s.size(); i++) o << (i ? ", " : "") << s[i];
  o << "]";
  return o.str();
}

at::ScalarType diskDtype(const std::string& name, const std::string& dtype) {
  if (dtype == "F32") return at::kFloat;
  if (dtype == "F16") return at::kHalf;
  if (dtype == "BF16") return at::kBFloat16;
  if (dtype == "F64") return at::kDouble;
  throw std::runtime_error("tensor '" + name + "': unsupported dtype '" + dtype + "' (expected F32, F16, BF16 or F64)");
}

// The skeleton's slots inside a block, by the names the family tables use (LAYER_SLOTS in
// lib/model/families/decoder.ts; test/model.families.test.ts checks the two lists against each
// other through layerSlotNames()). Outside blocks: "embed", "norm", "lmHead".
const std::pair<const char*, at::Tensor Layer::*> kLayerSlots[] = {
    {"inputNorm", &Layer::inputNorm},
    {"q", &Layer::q},
    {"k", &Layer::k},
    {"v", &Layer::v},
    {"o", &Layer::o},
    {"qBias", &Layer::qBias},
    {"kBias", &Layer::kBias},
    {"vBias", &Layer::vBias},
    {"oBias", &Layer::oBias},
    {"qNorm", &Layer::qNorm},
    {"kNorm", &Layer::kNorm},
    {"postNorm", &Layer::postNorm},
    {"gate", &Layer::gate},
    {"up", &Layer::up},
    {"down", &Layer::down},
    {"router", &Layer::router},
};
// A sparse block's per-expert slots (ParamSpec::expert says which expert), with their Proj kind.
struct ExpertSlot {
  const char* name;
  std::vector<at::Tensor> Layer::*member;
  int proj;
};
const ExpertSlot kExpertSlots[] = {
    {"expertGate", &Layer::expertGate, kGateProj},
    {"expertUp", &Layer::expertUp, kUpProj},
    {"expertDown", &Layer::expertDown, kDownProj},
};
// The slot holding each projection's weight, in Proj order.
const char* const kProjSlots[kNumProj] = {"q", "k", "v", "o", "gate", "up", "down"};
// Slots every block must have; the others are optional. The MLP is either dense (gate, up, down)
// or sparse (router and every expert's expertGate, expertUp, expertDown).
const char* const kRequiredLayerSlots[] = {"inputNorm", "q", "k", "v", "o", "postNorm"};
const char* const kDenseMlpSlots[] = {"gate", "up", "down"};

}  // namespace

at::ScalarType parseComputeDtype(const std::string& name) {
  if (name == "float32") return at::kFloat;
  if (name == "bfloat16") return at::kBFloat16;
  if (name == "float64") return at::kDouble;
  throw std::runtime_error("unsupported compute dtype '" + name + "' (expected float32, bfloat16 or float64)");
}

std::string diskDtypeName(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return "F32";
    case at::kHalf:
      return "F16";
    case at::kBFloat16:
      return "BF16";
    case at::kDouble:
      return "F64";
    default:
      throw std::runtime_error("no safetensors name for dtype " + std::string(c10::toString(t)));
  }
}

at::Tensor viewRaw(const RawTensor& t, const std::vector<int64_t>& expected) {
  at::ScalarType st = diskDtype(t.name, t.dtype);
  if (t.shape != expected)
    throw std::runtime_error("tensor '" + t.name + "': shape " + shapeStr(t.shape) + ", expected " +
                             shapeStr(expected));
  int64_t numel = 1;
  for (int64_t d : expected) numel *= d;
  size_t want = size_t(numel) * at::elementSize(st);
  if (t.nbytes != want)
    throw std::runtime_error("tensor '" + t.name + "': " + std::to_string(t.nbytes) + " data bytes, expected " +
                             std::to_string(want));
  return at::from_blob(const_cast<uint8_t*>(t.data), expected, at::TensorOptions().dtype(st));
}

std::vector<std::string> layerSlotNames() {
  std::vector<std::string> names;
  for (const auto& [name, member] : kLayerSlots) names.push_back(name);
  for (const ExpertSlot& es : kExpertSlots) names.push_back(es.name);
  return names;
}

const char* projName(int p) {
  static const char* const names[kNumProj] = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                              "gate_proj", "up_proj", "down_proj"};
  return names[p];
}

std::vector<int64_t> segmentStarts(const std::vector<int64_t>& pos) {
  std::vector<int64_t> starts;
  for (size_t t = 0; t < pos.size(); t++)
    if (t == 0 || pos[t] != pos[t - 1] + 1) starts.push_back(int64_t(t));
  return starts;
}

// ---------------------------------------------------------------------------------------------
// Weights

std::vector<Model::Slot> Model::slots() {
  std::vector<Slot> s;
  for (const ParamSpec& p : specs_) {
    at::Tensor* t = nullptr;
    if (p.layer < 0) {
      if (p.slot == "embed") t = &embed_;
      else if (p.slot == "norm") t = &norm_;
      else if (p.slot == "lmHead") t = &lmHead_;
    } else if (p.layer < int64_t(layers_.size())) {
      Layer& L = layers_[p.layer];
      for (auto& [slot, member] : kLayerSlots)
        if (p.slot == slot && p.expert < 0) t = &(L.*member);
      for (const ExpertSlot& es : kExpertSlots)
        if (p.slot == es.name && p.expert >= 0 && p.expert < int64_t((L.*es.member).size()))
          t = &(L.*es.member)[p.expert];
    }
    if (!t)
      throw std::runtime_error("tensor '" + p.name + "': no slot '" + p.slot + "' in " +
                               (p.layer < 0 ? std::string("the model") : "layer " + std::to_string(p.layer)));
    s.push_back({&p, t});
  }
  return s;
}

Model::Model(ArchConfig c, std::vector<ParamSpec> specs, at::ScalarType dt, at::Device dev, bool weights)
    : cfg(std::move(c)), dtype(dt), device(dev), specs_(std::move(specs)), hasWeights_(weights) {
  if (cfg.vocabSize <= 0 || cfg.hiddenSize <= 0 || cfg.numLayers <= 0 || cfg.numHeads <= 0 || cfg.numKvHeads <= 0 ||
      cfg.headDim <= 0 || cfg.headDim % 2 != 0)
    throw std::runtime_error("invalid ArchConfig: sizes must be positive and headDim even");
  if (cfg.numHeads % cfg.numKvHeads != 0)
    throw std::runtime_error("invalid ArchConfig: numHeads must be a multiple of numKvHeads");
  layers_.resize(cfg.numLayers);
  // The table must fill each slot at most once and every required one. A sparse block's expert
  // count is its router's rows.
  std::set<std::pair<int64_t, std::string>> filled;
  std::map<std::pair<int64_t, std::string>, std::set<int64_t>> experts;  // (layer, slot) -> experts given
  for (const ParamSpec& p : specs_) {
    if (p.expert >= 0) {
      if (!experts[{p.layer, p.slot}].insert(p.expert).second)
        throw std::runtime_error("tensor table: expert " + std::to_string(p.expert) + " of slot '" + p.slot +
                                 "' of layer " + std::to_string(p.layer) + " given twice");
      continue;
    }
    if (!filled.emplace(p.layer, p.slot).second)
      throw std::runtime_error("tensor table: slot '" + p.slot + "' of layer " + std::to_string(p.layer) +
                               " given twice");
    if (p.slot == "router" && p.layer >= 0 && p.layer < cfg.numLayers) {
      if (p.shape.size() != 2 || p.shape[0] < 1)
        throw std::runtime_error("tensor '" + p.name + "': a router must be [experts, hidden]");
      if (cfg.numExpertsPerTok < 1 || cfg.numExpertsPerTok > p.shape[0])
        throw std::runtime_error("invalid ArchConfig: numExpertsPerTok (" + std::to_string(cfg.numExpertsPerTok) +
                                 ") must be in [1, " + std::to_string(p.shape[0]) + "] for the router '" + p.name +
                                 "'");
      Layer& L = layers_[p.layer];
      for (const ExpertSlot& es : kExpertSlots) (L.*es.member).resize(p.shape[0]);
    }
  }
  for (const char* slot : {"embed", "norm"})
    if (!filled.count({-1, slot})) throw std::runtime_error(std::string("tensor table: no '") + slot + "' tensor");
  for (int64_t l = 0; l < cfg.numLayers; l++) {
    for (const char* slot : kRequiredLayerSlots)
      if (!filled.count({l, slot}))
        throw std::runtime_error("tensor table: layer " + std::to_string(l) + " has no '" + slot + "' tensor");
    const int64_t E = int64_t(layers_[l].expertGate.size());
    if (E == 0) {
      for (const char* slot : kDenseMlpSlots)
        if (!filled.count({l, slot}))
          throw std::runtime_error("tensor table: layer " + std::to_string(l) + " has no '" + slot +
                                   "' tensor (nor a 'router': no MLP)");
    } else {
      for (const char* slot : kDenseMlpSlots)
        if (filled.count({l, slot}))
          throw std::runtime_error("tensor table: layer " + std::to_string(l) + " has both a router and '" + slot +
                                   "'");
      for (const ExpertSlot& es : kExpertSlots)
        if (int64_t(experts[{l, es.name}].size()) != E)
          throw std::runtime_error("tensor table: layer " + std::to_string(l) + " has " +
                                   std::to_string(experts[{l, es.name}].size()) + " '" + es.name +
                                   "' tensors for a router of " + std::to_string(E) + " experts");
    }
    if (filled.count({l, "qNorm"}) != filled.count({l, "kNorm"}))
      throw std::runtime_error("tensor table: layer " + std::to_string(l) + " needs both qNorm and kNorm or neither");
  }
  slots();  // rejects unknown slots and layers
  for (int64_t l = 0; l < cfg.numLayers; l++)
    if (!layers_[l].expertGate.empty()) sparseLayers_.push_back(l);
  // inv_freq = 1 / theta^(2i/d), computed in fp32 like HF (fp64 for fp64 models).
  at::ScalarType rd = logitsDtype();
  invFreq_ =
      1.0 / at::pow(cfg.ropeTheta,
                    at::arange(0, cfg.headDim, 2, at::TensorOptions().dtype(at::kLong)).to(rd).div(double(cfg.headDim)))
                .to(device);
  fuseProjections();
}

std::shared_ptr<Model> Model::withoutWeights(ArchConfig c, std::vector<ParamSpec> specs, at::ScalarType dt,
                                             at::Device dev) {
  std::shared_ptr<Model> m(new Model(std::move(c), std::move(specs), dt, dev, /*weights=*/false));
  m->emptySlots();
  return m;
}

void Model::emptySlots() {
  // One tensor's memory at a time, freed at once: never the model's.
  for (Slot& s : slots())
    if (!s.tensor->defined()) {
      *s.tensor = at::empty(s.spec->shape, options());
      releaseStorage(*s.tensor);
    }
}

Model::Model(ArchConfig c, std::vector<ParamSpec> specs, const std::vector<RawTensor>& tensors, at::ScalarType dt,
             at::Device dev)
    : Model(std::move(c), std::move(specs), dt, dev) {
  std::map<std::string, const RawTensor*> byName;
  for (const RawTensor& t : tensors)
    if (!byName.emplace(t.name, &t).second) throw std::runtime_error("tensor '" + t.name + "' given twice");
  std::set<std::string> used;
  for (Slot& s : slots()) {
    const ParamSpec& p = *s.spec;
    auto it = byName.find(p.name);
    if (it == byName.end())
      throw std::runtime_error("missing tensor '" + p.name + "' (expected shape " + shapeStr(p.shape) + ")");
    at::Tensor src = viewRaw(*it->second, p.shape);
    // The one copy: bytes -> compute dtype/device (into its fused tensor's rows, if it has one).
    if (s.tensor->defined()) s.tensor->copy_(src);
    else *s.tensor = at::empty(p.shape, options()).copy_(src);
    used.insert(p.name);
  }
  for (const RawTensor& t : tensors)
    if (!used.count(t.name)) throw std::runtime_error("unexpected tensor '" + t.name + "' for " + cfg.arch + " config");
}

std::unique_ptr<Model> Model::copy() const {
  std::unique_ptr<Model> m(new Model(cfg, specs_, dtype, device, hasWeights_));
  std::vector<Slot> src = const_cast<Model*>(this)->slots(), dst = m->slots();
  at::NoGradGuard noGrad;
  if (!hasWeights_) m->emptySlots();
  for (size_t i = 0; i < src.size() && hasWeights_; i++) {
    if (dst[i].tensor->defined()) dst[i].tensor->copy_(*src[i].tensor);  // a fused tensor's rows
    else *dst[i].tensor = src[i].tensor->detach().clone();
  }
  m->logitsChunkTokens = logitsChunkTokens;
  m->fusedProjections = fusedProjections;
  m->fusedKernels = fusedKernels;
  return m;
}

void Model::fuseProjections() {
  // Slot shapes by (layer, slot), from the specs: the weights are not in yet.
  std::map<std::pair<int64_t, std::string>, std::vector<int64_t>> shapes;
  for (const ParamSpec& p : specs_)
    if (p.layer >= 0 && p.expert < 0) shapes[{p.layer, p.slot}] = p.shape;
  // One tensor for the given slots of layer l, stacked along dim 0, and each slot the view of
  // its rows; undefined (slots left alone) unless they all exist with the same trailing dims.
  auto fuse = [&](int64_t l, std::initializer_list<std::pair<const char*, at::Tensor*>> slots) {
    int64_t rows = 0;
    std::vector<int64_t> rest;
    for (auto& [name, t] : slots) {
      auto it = shapes.find({l, name});
      if (it == shapes.end() || it->second.empty()) return at::Tensor();
      const std::vector<int64_t> tail(it->second.begin() + 1, it->second.end());
      if (rows > 0 && tail != rest) return at::Tensor();
      rest = tail;
      rows += it->second[0];
    }
    std::vector<int64_t> size{rows};
    size.insert(size.end(), rest.begin(), rest.end());
    at::Tensor fused = at::empty(size, options());
    int64_t row = 0;
    for (auto& [name, t] : slots) {
      const int64_t n = shapes.at({l, name})[0];
      *t = fused.narrow(0, row, n);
      row += n;
    }
    if (!hasWeights_) releaseStorage(fused);  // and its slots' views: no memory (withoutWeights)
    return fused;
  };
  for (int64_t l = 0; l < int64_t(layers_.size()); l++) {
    Layer& L = layers_[l];
    const int biases = int(shapes.count({l, "qBias"}) + shapes.count({l, "kBias"}) + shapes.count({l, "vBias"}));
    if (biases == 0 || biases == 3) {
      L.qkv = fuse(l, {{"q", &L.q}, {"k", &L.k}, {"v", &L.v}});
      if (L.qkv.defined() && biases == 3)
        L.qkvBias = fuse(l, {{"qBias", &L.qBias}, {"kBias", &L.kBias}, {"vBias", &L.vBias}});
    }
    L.gateUp = fuse(l, {{"gate", &L.gate}, {"up", &L.up}});  // undefined in a sparse block
  }
}

bool Model::fusedUsable(const at::Tensor& fused, std::initializer_list<const at::Tensor*> parts,
                        const Adapt& ad) const {
  if (!fusedProjections || !fused.defined()) return false;
  for (const at::Tensor* p : parts)
    if ((ad.lora && ad.lora->find(*p)) || (at::GradMode::is_enabled() && p->requires_grad())) return false;
  return true;
}

std::vector<ProjectionRef> Model::projections() const {
  std::vector<ProjectionRef> out;
  const std::string suffix = ".weight";
  for (const Slot& s : const_cast<Model*>(this)->slots()) {
    int kind = -1;
    for (int p = 0; p < kNumProj; p++)
      if (s.spec->slot == kProjSlots[p]) kind = p;
    for (const ExpertSlot& es : kExpertSlots)
      if (s.spec->slot == es.name) kind = es.proj;
    if (kind < 0) continue;
    const std::string& name = s.spec->name;
    if (name.size() <= suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
      throw std::runtime_error("tensor '" + name + "': a projection weight's name must end in '.weight'");
    out.push_back({kind, name.substr(0, name.size() - suffix.size()), *s.tensor});
  }
  return out;
}

int64_t Model::numExperts(int64_t layer) const { return int64_t(layers_.at(size_t(layer)).expertGate.size()); }

at::Tensor routerAuxLoss(const MoeRouting& routing) {
  std::vector<at::Tensor> logits, experts;
  for (size_t l = 0; l < routing.logits.size(); l++)
    if (routing.logits[l].defined()) {
      logits.push_back(routing.logits[l]);
      experts.push_back(routing.experts[l].reshape(-1));
    }
  if (logits.empty()) throw std::runtime_error("routerAuxLoss: no router logits were kept");
  const at::Tensor all = at::cat(logits, 0);  // [layers * N, E]
  const int64_t T = all.size(0), E = all.size(1);
  const at::ScalarType ft = all.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::Tensor meanProb = at::softmax(all, -1, ft).mean(0);
  const at::Tensor fraction = at::bincount(at::cat(experts, 0), {}, E).to(ft) / double(T);
  return (fraction * meanProb).sum() * double(E);
}

void Model::loadWeights(const std::vector<RawTensor>& tensors, bool strict) {
  std::map<std::string, at::Tensor*> params;
  std::map<std::string, std::vector<int64_t>> shapes;
  for (Slot& s : slots()) {
    params[s.spec->name] = s.tensor;
    shapes[s.spec->name] = s.spec->shape;
  }
  // Validate everything before touching the live weights, so a bad update leaves them intact.
  std::vector<std::pair<at::Tensor*, at::Tensor>> updates;
  std::set<std::string> seen;
  for (const RawTensor& t : tensors) {
    if (!seen.insert(t.name).second) throw std::runtime_error("tensor '" + t.name + "' given twice");
    auto it = params.find(t.name);
    if (it == params.end()) throw std::runtime_error("unexpected tensor '" + t.name + "' for " + cfg.arch + " config");
    updates.emplace_back(it->second, viewRaw(t, shapes[t.name]));
  }
  if (strict)
    for (auto& [name, shape] : shapes)
      if (!seen.count(name))
        throw std::runtime_error("missing tensor '" + name + "' (expected shape " + shapeStr(shape) + ")");
  at::NoGradGuard noGrad;
  noteWeightsChanged();  // before the copy: a copy that fails half-way has changed them too
  for (auto& [dst, src] : updates) dst->copy_(src);
}

std::vector<std::pair<std::string, at::Tensor>> Model::namedParameters() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (Slot& s : const_cast<Model*>(this)->slots()) out.emplace_back(s.spec->name, *s.tensor);
  return out;
}

std::vector<std::vector<int64_t>> Model::parameterStages() const {
  std::vector<std::vector<int64_t>> stages;
  for (const ParamSpec& p : specs_) {
    if (p.layer >= 0) stages.push_back({p.layer});
    else if (p.slot == "embed")
      stages.push_back(lmHead_.defined() ? std::vector<int64_t>{-1} : std::vector<int64_t>{-1, cfg.numLayers + 1});
    else if (p.slot == "norm") stages.push_back({cfg.numLayers});
    else stages.push_back({cfg.numLayers + 1});  // lmHead
  }
  return stages;
}

std::vector<Model::FusedTensor> Model::fusedTensors() {
  std::vector<FusedTensor> out;
  for (Layer& L : layers_) {
    if (L.qkv.defined()) out.push_back({&L.qkv, {L.q, L.k, L.v}});
    if (L.qkvBias.defined()) out.push_back({&L.qkvBias, {L.qBias, L.kBias, L.vBias}});
    if (L.gateUp.defined()) out.push_back({&L.gateUp, {L.gate, L.up}});
  }
  return out;
}

int64_t Model::numParameters() const {
  int64_t n = 0;
  for (auto& [name, t] : namedParameters()) n += t.numel();
  return n;
}

void Model::checkTokenIds(const int64_t* ids, size_t n) const {
  for (size_t i = 0; i < n; i++)
    if (ids[i] < 0 || ids[i] >= cfg.vocabSize)
      throw std::runtime_error("token id " + std::to_string(ids[i]) + " at index " + std::to_string(i) +
                               " is out of range [0, " + std::to_string(cfg.vocabSize) + ")");
}

// ---------------------------------------------------------------------------------------------
// Building blocks

// RMSNorm, arithmetic in fp32, output in the input's dtype (HF: variance in fp32, cast back to the
// input dtype, then times the weight); an fp32 master weight under mixed precision computes as its
// bf16 copy (kernels.h).
at::Tensor Model::rmsNorm(const at::Tensor& x, const at::Tensor& w) const {
  return kernels().rmsNorm(x, w, cfg.rmsNormEps);
}

at::ScalarType Model::computeDtype() const { return AutocastGuard::active(device).value_or(dtype); }

// RoPE tables for the given positions in the activations' dtype, [N, 1, hd] (broadcast over heads):
// cos(f) twice, and sin(f) with rotate_half's sign folded in: (-sin(f), sin(f)).
std::pair<at::Tensor, at::Tensor> Model::rope(const at::Tensor& pos) const {
  const at::Tensor f = pos.to(invFreq_.scalar_type()).unsqueeze(-1) * invFreq_.unsqueeze(0);  // [N, hd/2]
  const at::Tensor c = f.cos(), s = f.sin();
  const at::ScalarType dt = computeDtype();
  return {at::cat({c, c}, -1).to(dt).unsqueeze(1), at::cat({-s, s}, -1).to(dt).unsqueeze(1)};
}

at::Tensor Model::project(const at::Tensor& x, const at::Tensor& W, const at::Tensor& b, const Adapt& ad) const {
  at::Tensor y = at::linear(x, W, b);
  const LoraAdapters::Adapter* a = ad.lora ? ad.lora->find(W) : nullptr;
  if (!a) return y;
  at::Tensor in = x;
  if (ad.dropoutRng && ad.lora->dropout > 0) {
    // Inverted dropout. The trainer's generator (on the CPU: its state is checkpointed, and
    // activation checkpointing rewinds it) draws the mask itself on the CPU; on CUDA it draws
    // the seed of a device generator that draws the mask there (no mask crosses the bus). Either
    // way a resumed run, or a layer run again in the backward, draws the same masks.
    const double keep = 1 - ad.lora->dropout;
    at::Tensor mask;
    if (x.is_cuda()) {
      // A CPU tensor's value: no device sync.
      const int64_t seed =
          at::randint(std::numeric_limits<int64_t>::max(), {1}, *ad.dropoutRng, at::TensorOptions().dtype(at::kLong))
              .item<int64_t>();
      at::Generator gen = seededCudaGenerator(x.device(), uint64_t(seed));
      if (gen.defined()) mask = at::empty(x.sizes(), x.options()).bernoulli_(keep, gen);
    }
    if (!mask.defined())
      mask = at::empty(x.sizes(), at::TensorOptions().dtype(x.scalar_type()))
                 .bernoulli_(keep, *ad.dropoutRng)
                 .to(x.device());
    in = x * mask * (1.0 / keep);
  }
  return y + at::linear(at::linear(in, a->A), a->B) * ad.lora->scale();
}

// Pre-attention half of a block: input norm, q/k/v projections, Qwen3 q/k norm, RoPE.
// Returns q [N, H, hd] and k [N, KV, hd]; v [N, KV, hd] through the out-parameter.
std::pair<at::Tensor, at::Tensor> Model::attentionInputs(const Layer& L, const at::Tensor& x, const at::Tensor& cos,
                                                         const at::Tensor& sin, at::Tensor& v, int64_t layer,
                                                         const Adapt& ad) const {
  const int64_t N = x.size(0), hd = cfg.headDim, H = cfg.numHeads, KV = cfg.numKvHeads;
  at::Tensor h = rmsNorm(x, L.inputNorm);
  at::Tensor q, k;
  if (fusedUsable(L.qkv, {&L.q, &L.k, &L.v}, ad)) {
    // One matmul; q and k are rewritten below (norm, RoPE), v is made contiguous here.
    const at::Tensor qkv = at::linear(h, L.qkv, L.qkvBias);  // [N, (H + 2 KV) hd]
    q = qkv.narrow(1, 0, H * hd).view({N, H, hd});
    k = qkv.narrow(1, H * hd, KV * hd).view({N, KV, hd});
    v = qkv.narrow(1, (H + KV) * hd, KV * hd).contiguous().view({N, KV, hd});
  } else {
    q = project(h, L.q, L.qBias, ad).view({N, H, hd});
    k = project(h, L.k, L.kBias, ad).view({N, KV, hd});
    v = project(h, L.v, L.vBias, ad).view({N, KV, hd});
  }
  if (L.qNorm.defined()) {
    q = rmsNorm(q, L.qNorm);
    k = rmsNorm(k, L.kNorm);
  }
  return kernels().rope(q, k, cos, sin);  // non-interleaved RoPE (kernels.h)
}

// Post-attention half: output projection + residual, then the MLP + residual.
at::Tensor Model::finishBlock(const Layer& L, const at::Tensor& x, const at::Tensor& attn, int64_t layer,
                              const Adapt& ad) const {
  auto [h, m] = kernels().addRmsNorm(x, project(attn, L.o, L.oBias, ad), L.postNorm, cfg.rmsNormEps);
  if (L.sparse()) return h + sparseMlp(L, m, layer, ad);
  const bool fused = fusedUsable(L.gateUp, {&L.gate, &L.up}, ad);
  return h + denseMlp(m, L.gate, L.up, L.down, ad, fused ? L.gateUp : at::Tensor());
}

at::Tensor Model::denseMlp(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& up, const at::Tensor& down,
                           const Adapt& ad, const at::Tensor& gateUp) const {
  const at::Tensor none;
  if (gateUp.defined()) {
    const int64_t I = gate.size(0);
    const at::Tensor gu = at::linear(x, gateUp);  // [N, 2 I]
    return project(kernels().swiglu(gu.narrow(1, 0, I), gu.narrow(1, I, I)), down, none, ad);
  }
  return project(kernels().swiglu(project(x, gate, none, ad), project(x, up, none, ad)), down, none, ad);
}

// Qwen3MoeSparseMoeBlock: softmax over the router logits (fp32), top-k experts per token, their
// probabilities renormalised when normTopkProb, then each token's experts' outputs weighted by
// them and summed. Grouped: the N*K (token, expert) pairs are sorted by expert, so each expert
// runs one matmul over its tokens (index_select in, index_add_ out, in expert order as HF does).
at::Tensor Model::sparseMlp(const Layer& L, const at::Tensor& x, int64_t layer, const Adapt& ad) const {
  const int64_t N = x.size(0), E = int64_t(L.expertGate.size()), K = cfg.numExpertsPerTok;
  at::Tensor logits = at::linear(x, L.router);                // [N, E]
  at::Tensor probs = at::softmax(logits, -1, logitsDtype());  // fp32 (fp64 for fp64 models)
  MoeRouting* r = ad.routing;
  auto [weights, experts] = probs.topk(K, -1);  // [N, K], descending
  if (r && layer < int64_t(r->replay.size()) && r->replay[layer].defined()) {
    // Replayed rows take the given experts (-1 rows: the router's own), weighted by their
    // current probabilities (a top-k value is that same gather).
    const at::Tensor& replay = r->replay[layer];
    if (replay.dim() != 2 || replay.size(0) != N || replay.size(1) != K)
      throw std::runtime_error("router replay: layer " + std::to_string(layer) + " needs experts [" +
                               std::to_string(N) + ", " + std::to_string(K) + "]");
    if (replay.min().item<int64_t>() < -1 || replay.max().item<int64_t>() >= E)
      throw std::runtime_error("router replay: layer " + std::to_string(layer) + " names an expert outside [0, " +
                               std::to_string(E) + ") (-1: the router's own)");
    experts = at::where(replay.ge(0), replay, experts);
    weights = probs.gather(1, experts);
  }
  if (cfg.normTopkProb) weights = weights / weights.sum(-1, /*keepdim=*/true);
  weights = weights.to(x.scalar_type());
  if (r) {
    if (r->experts.size() < layers_.size()) r->experts.resize(layers_.size());
    if (r->logits.size() < layers_.size()) r->logits.resize(layers_.size());
    r->experts[layer] = experts;
    if (r->keepLogits) r->logits[layer] = logits;
  }
  const at::Tensor flat = experts.reshape(-1);
  const at::Tensor order = std::get<1>(flat.sort(/*stable=*/true, 0, /*descending=*/false));
  const at::Tensor tokens = order.div(K, "floor");  // pair i is (token i / K, its (i % K)-th expert)
  const at::Tensor w = weights.reshape(-1).index_select(0, order);
  const at::Tensor counts = at::bincount(flat, {}, E).cpu();
  const int64_t* count = counts.data_ptr<int64_t>();
  at::Tensor out = at::zeros_like(x);
  for (int64_t e = 0, off = 0; e < E; off += count[e], e++) {
    if (count[e] == 0) continue;
    const at::Tensor rows = tokens.narrow(0, off, count[e]);
    at::Tensor y = denseMlp(x.index_select(0, rows), L.expertGate[e], L.expertUp[e], L.expertDown[e], ad);
    out.index_add_(0, rows, y * w.narrow(0, off, count[e]).unsqueeze(1));
  }
  return out;
}

// Causal attention within one sample: q [H, Lq, hd], k/v [KV, Lk, hd] -> [H, Lq, hd], query i at
// key position offset + i (a prefill chunk after `offset` cached positions).
at::Tensor Model::causalAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t offset) const {
  const int64_t H = cfg.numHeads, KV = cfg.numKvHeads, G = H / KV;
  const int64_t Lq = q.size(1), Lk = k.size(1);
#if TORCH_VERSION_MAJOR >= 2
  // Fused kernel (flash / memory-efficient on CUDA). GQA: query head h reads kv head h / G.
  at::Tensor ke = k.repeat_interleave(G, 0), ve = v.repeat_interleave(G, 0);
  c10::optional<at::Tensor> mask;
  if (offset > 0)  // true where attention is allowed: key j <= offset + i
    mask = at::ones({Lq, Lk}, at::TensorOptions().dtype(at::kBool).device(device)).tril(offset);
  return at::scaled_dot_product_attention(q.unsqueeze(0), ke.unsqueeze(0), ve.unsqueeze(0), mask, 0.0,
                                          /*is_causal=*/offset == 0)
      .squeeze(0);
#else
  // Explicit path for libtorch 1.x. The G query heads sharing a kv head are stacked along the
  // row axis ([KV, G*Lq, hd]) so K and V are never copied per query head.
  const int64_t hd = cfg.headDim;
  at::Tensor qg = (q * (1.0 / std::sqrt(double(hd)))).reshape({KV, G * Lq, hd});
  at::Tensor s = at::matmul(qg, k.transpose(1, 2)).view({KV, G, Lq, Lk});
  at::Tensor future = at::ones({Lq, Lk}, at::TensorOptions().dtype(at::kBool).device(device)).triu(1 + offset);
  s = s.masked_fill(future, -std::numeric_limits<double>::infinity());
  at::Tensor p = at::softmax(s, -1, logitsDtype()).to(q.scalar_type()).view({KV, G * Lq, Lk});  // softmax in fp32
  return at::matmul(p, v).view({H, Lq, hd});
#endif
}

namespace {
// exp of a softmax's shifted scores (<= 0): vectorisable in fp32 (fast_exp.h, within 2 ulp of
// expf), the C library's in fp64.
inline float softmaxExp(float x) { return fastExp(x); }
inline double softmaxExp(double x) { return std::exp(x); }

// Attention over the paged cache on the CPU, one (token, kv head) at a time for the G query heads
// that share it, reading the blocks in place through the token's block table: each key and value
// row is read once for the G heads. Batched matmuls would run one tiny BLAS call per (sequence, kv
// head), whose call overhead costs far more than this arithmetic. q [N, H, hd]; caches [blocks, B,
// KV, hd]; token t attends to positions 0..pos[t] of table row seqOf[t]. Softmax in the compute
// dtype (fp32/fp64); keys are visited in position order, as a contiguous cache would be, so the
// sums round the same whatever the blocks.
template <typename T>
void pagedAttentionKernel(const T* q, const T* k, const T* v, T* out, const int64_t* pos, const int64_t* seqOf,
                          const int64_t* tables, int64_t width, int64_t N, int64_t H, int64_t KV, int64_t hd,
                          int64_t B) {
  const int64_t G = H / KV, stride = KV * hd;  // stride: from one position to the next in a block
  const T scale = T(1.0 / std::sqrt(double(hd)));
  // Parts of at least 32 (token, kv head) pairs: a batch of one decodes on the calling thread.
  hostParallelFor(N * KV, 32, [&](int64_t begin, int64_t end) {
    std::vector<T> p, sums(static_cast<size_t>(G));  // p: [G, len] scores, then exp(score - max)
    for (int64_t i = begin; i < end; i++) {
      const int64_t t = i / KV, kvh = i % KV, len = pos[t] + 1;
      const int64_t* table = tables + seqOf[t] * width;
      const T* qg = q + (t * H + kvh * G) * hd;  // the group's G query heads, contiguous
      p.resize(size_t(G * len));
      for (int64_t s0 = 0; s0 < len; s0 += B) {
        const T* kb = k + (table[s0 / B] * B * KV + kvh) * hd;
        for (int64_t j = 0, m = std::min(B, len - s0); j < m; j++)
          for (int64_t g = 0; g < G; g++) {
            const T* qi = qg + g * hd;
            T dot = 0;
#pragma omp simd reduction(+ : dot)
            for (int64_t d = 0; d < hd; d++) dot += qi[d] * kb[j * stride + d];
            p[g * len + s0 + j] = dot * scale;
          }
      }
      for (int64_t g = 0; g < G; g++) {
        T* pg = p.data() + g * len;
        const T mx = *std::max_element(pg, pg + len);
        T sum = 0;
#pragma omp simd reduction(+ : sum)
        for (int64_t s = 0; s < len; s++) sum += (pg[s] = softmaxExp(pg[s] - mx));
        sums[g] = sum;
      }
      T* o = out + (t * H + kvh * G) * hd;
      std::fill(o, o + G * hd, T(0));
      for (int64_t s0 = 0; s0 < len; s0 += B) {
        const T* vb = v + (table[s0 / B] * B * KV + kvh) * hd;
        for (int64_t j = 0, m = std::min(B, len - s0); j < m; j++)
          for (int64_t g = 0; g < G; g++) {
            const T w = p[g * len + s0 + j] / sums[g];
            T* og = o + g * hd;
#pragma omp simd
            for (int64_t d = 0; d < hd; d++) og[d] += w * vb[j * stride + d];
          }
      }
    }
  });
}

// Keys or values of table rows `tables` [n, width] gathered from a paged cache [blocks, B, KV, hd]
// into [n, KV, S, hd] (positions 0..S-1).
at::Tensor gatherBlocks(const at::Tensor& cache, const at::Tensor& tables, int64_t S) {
  const int64_t n = tables.size(0), B = cache.size(1), KV = cache.size(2), hd = cache.size(3);
  const int64_t nb = (S + B - 1) / B;
  return cache.index_select(0, tables.narrow(1, 0, nb).reshape({-1}))
      .view({n, nb * B, KV, hd})
      .narrow(1, 0, S)
      .permute({0, 2, 1, 3});
}
}  // namespace

at::Tensor Model::pagedAttention(const at::Tensor& q, const at::Tensor& kCache, const at::Tensor& vCache,
                                 const PagedBatch& batch) const {
  if (device.is_cpu() && q.scalar_type() != at::kBFloat16) {
    const auto t0 = std::chrono::steady_clock::now();
    at::Tensor o = pagedAttentionCpu(q, kCache, vCache, batch);
    if (batch.attentionSeconds)
      *batch.attentionSeconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return o;
  }
  // Elsewhere (CUDA, bf16 on the CPU): the decode rows together as batched matmuls over their
  // gathered blocks, each prefill chunk as causal attention over its sequence's gathered keys.
  std::vector<at::Tensor> outs;
  const int64_t n = batch.decodeRows;
  if (n > 0 && batch.decodeKernel)
    outs.push_back(pagedDecodeAttention(q.narrow(0, 0, n), kCache, vCache, batch.tables.narrow(0, 0, n),
                                        batch.pos.narrow(0, 0, n), batch.decodeKeys));
  else if (n > 0) outs.push_back(decodeAttentionBmm(q.narrow(0, 0, n), kCache, vCache, batch));
  int64_t row = n;
  for (size_t c = 0; c < batch.chunkStart.size(); c++) {
    const int64_t start = batch.chunkStart[c], len = batch.chunkLen[c];
    const at::Tensor table = batch.tables.narrow(0, n + int64_t(c), 1);
    const at::Tensor K = gatherBlocks(kCache, table, start + len).squeeze(0);  // [KV, start + len, hd]
    const at::Tensor V = gatherBlocks(vCache, table, start + len).squeeze(0);
    const at::Tensor qs = q.narrow(0, row, len).transpose(0, 1);  // [H, len, hd]
    outs.push_back(causalAttention(qs, K, V, start).transpose(0, 1));
    row += len;
  }
  return outs.size() == 1 ? outs[0] : at::cat(outs, 0);
}

// Decode attention (CUDA, and bf16 on the CPU) as two batched matmuls over the rows' gathered
// blocks: GQA groups the query heads as [n * KV, G, hd] against their kv head's keys [n * KV, S,
// hd]; scores and softmax in fp32, probabilities rounded to the compute dtype for the product
// with V (as flash attention does). Plain kernels whose shapes (n, decodeKeys) fix: capturable in
// a CUDA graph. Positions past a row's own (pos < s < S) are masked; the blocks they come from
// are the row's own or the null block, never NaN (the generator zeroes poisoned blocks), since
// masked probabilities still multiply V as 0 * v.
at::Tensor Model::decodeAttentionBmm(const at::Tensor& q, const at::Tensor& kCache, const at::Tensor& vCache,
                                     const PagedBatch& batch) const {
  const int64_t n = batch.decodeRows, S = batch.decodeKeys;
  const int64_t KV = cfg.numKvHeads, hd = cfg.headDim, G = cfg.numHeads / KV;
  const at::Tensor tables = batch.tables.narrow(0, 0, n);
  const at::Tensor K = gatherBlocks(kCache, tables, S).reshape({n * KV, S, hd}).transpose(1, 2);
  const at::Tensor V = gatherBlocks(vCache, tables, S).reshape({n * KV, S, hd});
  const at::Tensor qg = q.reshape({n * KV, G, hd});
  at::Tensor s;  // [n * KV, G, S], fp32 (fp64 for fp64 models)
  if (q.scalar_type() == at::kFloat || q.scalar_type() == at::kDouble) {
    s = at::bmm(qg, K);
  } else {
#if PRIME_BMM_OUT_DTYPE
    if (q.is_cuda()) s = at::bmm(qg, K, at::kFloat);  // bf16 products summed into fp32 scores
#endif
    // bf16 on the CPU (bmm's out_dtype is CUDA's only), or an older libtorch: fp32 copies.
    if (!s.defined()) s = at::bmm(qg.to(at::kFloat), K.to(at::kFloat));
  }
  const auto longOpts = at::TensorOptions().dtype(at::kLong).device(device);
  const at::Tensor visible =
      (at::arange(S, longOpts).unsqueeze(0) <= batch.pos.narrow(0, 0, n).unsqueeze(1)).view({n, 1, 1, S});
  s = s.mul_(1.0 / std::sqrt(double(hd)))
          .view({n, KV, G, S})
          .masked_fill_(visible.logical_not(), -std::numeric_limits<double>::infinity());
  const at::Tensor p = at::softmax(s, -1).to(q.scalar_type()).view({n * KV, G, S});
  return at::bmm(p, V).view({n, cfg.numHeads, hd});  // [n * KV, G, hd] = [n, H, hd]
}

at::Tensor Model::pagedAttentionCpu(const at::Tensor& q, const at::Tensor& kCache, const at::Tensor& vCache,
                                    const PagedBatch& batch) const {
  const at::Tensor qc = q.contiguous(), tables = batch.tables.contiguous();
  at::Tensor out = at::empty_like(qc);
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "pagedAttention", [&] {
    pagedAttentionKernel<scalar_t>(qc.data_ptr<scalar_t>(), kCache.data_ptr<scalar_t>(), vCache.data_ptr<scalar_t>(),
                                   out.data_ptr<scalar_t>(), batch.pos.data_ptr<int64_t>(),
                                   batch.seqOf.data_ptr<int64_t>(), tables.data_ptr<int64_t>(), tables.size(1),
                                   q.size(0), cfg.numHeads, cfg.numKvHeads, cfg.headDim, kCache.size(1));
  });
  return out;
}

// ---------------------------------------------------------------------------------------------
// Forward passes

at::Tensor Model::forwardPacked(const at::Tensor& ids, const at::Tensor& pos, const std::vector<int64_t>& segStarts,
                                std::vector<LayerKV>* kvOut, const LoraAdapters* lora, at::Generator* dropoutRng,
                                MoeRouting* routing, int64_t checkpointEvery) const {
  const int64_t N = ids.size(0);
  const Adapt ad{lora, dropoutRng, routing};
  const Segments seg = packedSegments(segStarts, N);
  auto [cos, sin] = rope(pos);
  const bool checkpoint = checkpointEvery > 0 && at::GradMode::is_enabled();
  if (checkpoint && (kvOut || !sparseLayers_.empty()))
    throw std::runtime_error("activation checkpointing applies to training forwards of dense models");
  // Mixed precision: the residual stream and every activation in bf16 from here on, as a bf16
  // model's (prime-rl's FSDP2 policy: bf16 parameters for compute, fp32 master weights and
  // gradients); norms, softmaxes and the LM head's log-softmax compute in fp32 inside.
  const at::ScalarType compute = computeDtype();
  at::Tensor x = staged(-1, at::Tensor(), [&](const at::Tensor&) {
    const at::Tensor e = at::embedding(embed_, ids);
    return e.scalar_type() != compute ? e.to(compute) : e;
  });
  for (int64_t l = 0; l < int64_t(layers_.size()); l++) {
    x = staged(l, x, [&](const at::Tensor& in) {
      if (!checkpoint || l % checkpointEvery != 0) return packedLayer(l, in, cos, sin, seg, kvOut, ad);
      // The rerun in the backward holds its own copies of what the layer reads.
      return checkpointed(
          in,
          [this, l, cos = cos, sin = sin, seg, ad](const at::Tensor& in) {
            return packedLayer(l, in, cos, sin, seg, nullptr, ad);
          },
          dropoutRng);
    });
  }
  return staged(cfg.numLayers, x, [&](const at::Tensor& in) { return rmsNorm(in, norm_); });
}

at::Tensor Model::staged(int64_t stage, const at::Tensor& x,
                         const std::function<at::Tensor(const at::Tensor&)>& f) const {
  if (!stageHooks) return f(x);
  const std::vector<at::Tensor> in =
      stageHooks->enter(stage, x.defined() ? std::vector<at::Tensor>{x} : std::vector<at::Tensor>{});
  return stageHooks->leave(stage, {f(in.empty() ? x : in[0])})[0];
}

Model::Segments Model::packedSegments(const std::vector<int64_t>& segStarts, int64_t N) const {
  Segments seg;
  for (size_t s = 0; s < segStarts.size(); s++) {
    seg.lens.push_back((s + 1 < segStarts.size() ? segStarts[s + 1] : N) - segStarts[s]);
    seg.longest = std::max(seg.longest, seg.lens.back());
  }
#if TORCH_VERSION_MAJOR >= 2
  // CUDA's flash attention (Ampere or newer) takes the whole packed row in one kernel, causal
  // within each sample, GQA included, when attention runs in bf16: a bf16 model, or fp32 weights
  // under bf16 autocast (mixed-precision training). Head sizes up to 256, multiples of 8.
  seg.compute = computeDtype();
  if (device.is_cuda() && (seg.compute == at::kBFloat16 || seg.compute == at::kHalf) && cfg.headDim % 8 == 0 &&
      cfg.headDim <= 256 && !flashVarlenFailed.load() && cudaCapabilityMajor(device) >= 8) {
    std::vector<int32_t> cu(seg.lens.size() + 1, 0);
    for (size_t s = 0; s < seg.lens.size(); s++) cu[s + 1] = cu[s] + int32_t(seg.lens[s]);
    seg.cuSeqLens = at::tensor(cu, at::TensorOptions().dtype(at::kInt)).to(device);  // one copy per forward
  }
#endif
  return seg;
}

at::Tensor Model::packedLayer(int64_t l, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                              const Segments& seg, std::vector<LayerKV>* kvOut, const Adapt& ad) const {
  const int64_t H = cfg.numHeads, hd = cfg.headDim;
  const Layer& L = layers_[l];
  at::Tensor v;
  auto [q, k] = attentionInputs(L, x, cos, sin, v, l, ad);
  if (kvOut) kvOut->emplace_back(k, v);
#if TORCH_VERSION_MAJOR >= 2
  if (seg.cuSeqLens.defined() && !flashVarlenFailed.load()) {
    // One kernel for every sample of the row ([N, H, hd] is flash's packed layout). Autocast
    // does not cover this op; q/k/v are activations, already in the compute dtype (no-op casts).
    const at::ScalarType compute = seg.compute;
    try {
      at::Tensor o = std::get<0>(at::_flash_attention_forward(q.to(compute), k.to(compute), v.to(compute),
                                                              seg.cuSeqLens, seg.cuSeqLens, seg.longest, seg.longest,
                                                              /*dropout_p=*/0.0, /*is_causal=*/true,
                                                              /*return_debug_mask=*/false));
      return finishBlock(L, x, o.reshape({x.size(0), H * hd}), l, ad);
    } catch (const c10::Error& e) {
      // A PyTorch built without flash attention (or a shape it refuses): per-sample attention
      // below, for this and every later forward of the process.
      if (!flashVarlenFailed.exchange(true))
        fprintf(stderr, "[prime-native] variable-length flash attention failed (%s); attention runs per sample\n",
                e.what_without_backtrace());
    }
  }
#endif
  const std::vector<int64_t>& segLens = seg.lens;
  // Attention never crosses a sample boundary: attend within each segment separately. One split
  // per tensor (not a narrow per segment): its backward is a single concatenation, where each
  // narrow's backward would write a full-row gradient, O(segments x row) per layer.
  const std::vector<at::Tensor> qs = q.split_with_sizes(segLens), ks = k.split_with_sizes(segLens),
                                vs = v.split_with_sizes(segLens);
  std::vector<at::Tensor> outs;
  for (size_t s = 0; s < segLens.size(); s++) {
    at::Tensor o = causalAttention(qs[s].transpose(0, 1), ks[s].transpose(0, 1), vs[s].transpose(0, 1));
    outs.push_back(o.transpose(0, 1).reshape({segLens[s], H * hd}));
  }
  return finishBlock(L, x, outs.size() == 1 ? outs[0] : at::cat(outs, 0), l, ad);
}

at::Tensor Model::forwardPaged(const at::Tensor& ids, const PagedBatch& batch, PagedKV& cache,
                               MoeRouting* routing) const {
  const int64_t N = ids.size(0), H = cfg.numHeads, KV = cfg.numKvHeads, hd = cfg.headDim, B = cache.blockSize;
  auto [cos, sin] = rope(batch.pos);
  // The cache row (block * B + offset, of a layer seen as [blocks * B, KV * hd]) each token's K/V
  // go to, from its table row and position: index_copy_ with these, no host reads.
  const at::Tensor blockOf =
      batch.tables.index_select(0, batch.seqOf).gather(1, batch.pos.div(B, "floor").unsqueeze(1));
  const at::Tensor rows = blockOf.squeeze(1).mul(B).add_(batch.pos.remainder(B));
  const Adapt noAdapters{nullptr, nullptr, routing};  // inference serves merged weights
  at::Tensor x = at::embedding(embed_, ids);
  if (x.scalar_type() != computeDtype()) x = x.to(computeDtype());
  for (int64_t l = 0; l < int64_t(layers_.size()); l++) {
    const Layer& L = layers_[l];
    at::Tensor v;
    auto [q, k] = attentionInputs(L, x, cos, sin, v, l, noAdapters);
    cache.k[l].view({-1, KV * hd}).index_copy_(0, rows, k.reshape({N, KV * hd}));
    cache.v[l].view({-1, KV * hd}).index_copy_(0, rows, v.reshape({N, KV * hd}));
    const at::Tensor o = pagedAttention(q, cache.k[l], cache.v[l], batch);
    x = finishBlock(L, x, o.reshape({N, H * hd}), l, noAdapters);
  }
  return rmsNorm(x, norm_);
}

at::Tensor Model::logits(const at::Tensor& hidden) const {
  return at::linear(hidden, lmHead_.defined() ? lmHead_ : embed_).to(logitsDtype());
}

TokenStats Model::tokenStats(const at::Tensor& hidden, const at::Tensor& targets, double temperature) const {
  const int64_t head = cfg.numLayers + 1;  // a stage of its own (StageHooks)
  const at::Tensor h = stageHooks ? stageHooks->enter(head, {hidden})[0] : hidden;
  TokenStats ts =
      chunkedTokenStats(h, lmHead_.defined() ? lmHead_ : embed_, targets, temperature, logitsDtype(), logitsChunkTokens,
                        logitsKeepBytes, fusedKernels ? LmHeadKernels::Fused : LmHeadKernels::Auto);
  if (stageHooks) {
    const std::vector<at::Tensor> out = stageHooks->leave(head, {ts.logp, ts.entropy});
    ts.logp = out[0], ts.entropy = out[1];
  }
  return ts;
}

void Model::tokenLogprobs(const at::Tensor& hidden, const at::Tensor& targets, double temperature, float* logprobs,
                          float* entropies) const {
  at::NoGradGuard noGrad;
  const TokenStats ts = tokenStats(hidden, targets, temperature);
  const int64_t N = hidden.size(0);
  at::Tensor tok = ts.logp.to(at::kFloat).cpu().contiguous(), ent = ts.entropy.to(at::kFloat).cpu().contiguous();
  std::copy_n(tok.data_ptr<float>(), N, logprobs);
  std::copy_n(ent.data_ptr<float>(), N, entropies);
}

void Model::scoreRow(const std::vector<int64_t>& ids, const std::vector<int64_t>& pos, double temperature,
                     std::vector<float>& logprobs, std::vector<float>& entropies, const LoraAdapters* lora) const {
  const int64_t N = int64_t(ids.size());
  if (N == 0 || pos.size() != ids.size())
    throw std::runtime_error("row needs inputIds and positionIds of the same non-zero length");
  if (!(temperature > 0)) throw std::runtime_error("temperature must be > 0");
  checkTokenIds(ids.data(), ids.size());
  const std::vector<int64_t> starts = segmentStarts(pos);
  const auto longOpts = at::TensorOptions().dtype(at::kLong);
  at::Tensor idsT = at::tensor(ids, longOpts).to(device);
  at::Tensor hidden = forwardPacked(idsT, at::tensor(pos, longOpts).to(device), starts, nullptr, lora);
  logprobs.assign(N, 0.0f);
  entropies.assign(N, 0.0f);
  if (N > 1)  // hidden[t] predicts ids[t + 1]
    tokenLogprobs(hidden.narrow(0, 0, N - 1), idsT.narrow(0, 1, N - 1), temperature, logprobs.data() + 1,
                  entropies.data() + 1);
  for (int64_t s : starts) logprobs[s] = entropies[s] = 0.0f;
}

}  // namespace prime
