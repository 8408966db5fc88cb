// The model's weights: the block skeleton's slots, building a model from a tensor table and
// loading weights into it, fused projections, parameters, and LoRA's adapted projection.
#include "model.h"

#include "cpu_matmul.h"
#include "cuda_info.h"
#include "storage.h"

#include <ATen/core/grad_mode.h>  // at::NoGradGuard (not pulled in by ATen.h in libtorch 2.x)

#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <vector>

namespace prime {
namespace {

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
    {"sharedGate", &Layer::sharedGate},
    {"sharedUp", &Layer::sharedUp},
    {"sharedDown", &Layer::sharedDown},
    {"sharedExpertGate", &Layer::sharedExpertGate},
    {"linQkv", &Layer::linQkv},
    {"linZ", &Layer::linZ},
    {"linB", &Layer::linB},
    {"linA", &Layer::linA},
    {"linConv", &Layer::linConv},
    {"linDtBias", &Layer::linDtBias},
    {"linALog", &Layer::linALog},
    {"linNorm", &Layer::linNorm},
    {"linOut", &Layer::linOut},
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
// The slots holding each projection's weight, in Proj order (a shared expert's gate/up/down are of
// the MLP's kinds).
const std::pair<const char*, int> kProjSlots[] = {
    {"q", kQProj},          {"k", kKProj},
    {"v", kVProj},          {"o", kOProj},
    {"gate", kGateProj},    {"up", kUpProj},
    {"down", kDownProj},    {"sharedGate", kGateProj},
    {"sharedUp", kUpProj},  {"sharedDown", kDownProj},
    {"linQkv", kInProjQkv}, {"linZ", kInProjZ},
    {"linB", kInProjB},     {"linA", kInProjA},
    {"linOut", kOutProj},
};
// Slots every block must have, then its token mixer's: attention (q, k, v, o) or Gated DeltaNet
// (every lin* slot); the others are optional. The MLP is either dense (gate, up, down) or sparse
// (router and every expert's expertGate, expertUp, expertDown; a shared expert optional).
const char* const kRequiredLayerSlots[] = {"inputNorm", "postNorm"};
const std::vector<const char*> kAttentionSlots = {"q", "k", "v", "o"};
const std::vector<const char*> kLinearSlots = {"linQkv",    "linZ",    "linB",    "linA",  "linConv",
                                               "linDtBias", "linALog", "linNorm", "linOut"};
const char* const kDenseMlpSlots[] = {"gate", "up", "down"};
const char* const kSharedExpertSlots[] = {"sharedGate", "sharedUp", "sharedDown", "sharedExpertGate"};

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
  static const char* const names[kNumProj] = {"q_proj",    "k_proj",    "v_proj",    "o_proj",
                                              "gate_proj", "up_proj",   "down_proj", "in_proj_qkv",
                                              "in_proj_z", "in_proj_b", "in_proj_a", "out_proj"};
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
    // Its token mixer: every slot of attention or of Gated DeltaNet, and none of the other's.
    const bool linear = filled.count({l, "linQkv"}) > 0;
    for (const char* slot : linear ? kLinearSlots : kAttentionSlots)
      if (!filled.count({l, slot}))
        throw std::runtime_error("tensor table: layer " + std::to_string(l) + " has no '" + slot + "' tensor" +
                                 (linear ? " (a Gated DeltaNet block)" : ""));
    for (const char* slot : linear ? kAttentionSlots : kLinearSlots)
      if (filled.count({l, slot}))
        throw std::runtime_error("tensor table: layer " + std::to_string(l) +
                                 " has both attention and Gated "
                                 "DeltaNet slots ('" +
                                 slot + "')");
    if (linear && !cfg.linear.defined())
      throw std::runtime_error("invalid ArchConfig: layer " + std::to_string(l) +
                               " is a Gated DeltaNet block but the config has no linearAttention sizes");
    int shared = 0;
    for (const char* slot : kSharedExpertSlots) shared += int(filled.count({l, slot}));
    if (shared != 0 && (shared != 4 || layers_[l].expertGate.empty()))
      throw std::runtime_error("tensor table: layer " + std::to_string(l) +
                               " needs all four shared-expert slots in a sparse block, or none");
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
  for (int64_t l = 0; l < cfg.numLayers; l++) {
    if (!layers_[l].expertGate.empty()) sparseLayers_.push_back(l);
    if (filled.count({l, "linQkv"})) linearLayers_.push_back(l);
  }
  const int64_t rot = cfg.rotaryDim();
  if (!(cfg.partialRotaryFactor > 0 && cfg.partialRotaryFactor <= 1) || rot < 2 || rot % 2 != 0)
    throw std::runtime_error("invalid ArchConfig: partialRotaryFactor " + std::to_string(cfg.partialRotaryFactor) +
                             " must rotate an even number of the " + std::to_string(cfg.headDim) + " head dims");
  if (cfg.linear.defined()) {
    const LinearAttentionSizes& s = cfg.linear;
    if (s.numValueHeads <= 0 || s.keyHeadDim <= 0 || s.valueHeadDim <= 0 || s.convKernel < 2 ||
        s.numValueHeads % s.numKeyHeads != 0)
      throw std::runtime_error(
          "invalid ArchConfig: linearAttention sizes must be positive, convKernel >= 2 and numValueHeads a multiple "
          "of numKeyHeads");
  }
  // inv_freq = 1 / theta^(2i/d) over the rotated dims d, computed in fp32 like HF (fp64 for fp64 models).
  at::ScalarType rd = logitsDtype();
  invFreq_ =
      1.0 / at::pow(cfg.ropeTheta, at::arange(0, rot, 2, at::TensorOptions().dtype(at::kLong)).to(rd).div(double(rot)))
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
    for (const auto& [slot, proj] : kProjSlots)
      if (s.spec->slot == slot) kind = proj;
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

at::Tensor Model::project(const at::Tensor& x, const at::Tensor& W, const at::Tensor& b, const Adapt& ad) const {
  at::Tensor y = linearOn(x, W, b);
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

}  // namespace prime
