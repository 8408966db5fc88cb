#include "fsdp.h"

#include <ATen/core/grad_mode.h>
#include <ATen/core/ivalue.h>  // torch::CustomClassHolder, capsules
#include <c10/core/InferenceMode.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/engine.h>

#include <algorithm>
#include <map>
#include <stdexcept>

#include "storage.h"

namespace prime {

namespace {
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

std::string unitName(int64_t stage, int64_t layers) {
  if (stage < 0) return "embed";
  if (stage < layers) return "layers." + std::to_string(stage);
  return stage == layers ? "norm" : "head";
}

// An autograd node around a stage: after its outputs (`before`: it runs just before the stage's
// backward) or before its inputs (it runs once the stage's backward is done). `anchor` requires
// grad, so the node is in the graph even where no input does (the first layer's input under LoRA).
struct Boundary : torch::CustomClassHolder {
  std::weak_ptr<ShardedModel> owner;
  int64_t stage = 0;
  bool before = false;
};

struct StageBoundary : torch::autograd::Function<StageBoundary> {
  static variable_list forward(AutogradContext* ctx, at::TensorList xs, const at::Tensor& anchor,
                               c10::intrusive_ptr<Boundary> boundary) {
    ctx->saved_data["boundary"] = c10::IValue::make_capsule(std::move(boundary));
    return variable_list(xs.begin(), xs.end());  // returned inputs become views (custom_function.h)
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto b = c10::static_intrusive_pointer_cast<Boundary>(ctx->saved_data["boundary"].toCapsule());
    if (auto owner = b->owner.lock()) {
      if (b->before) owner->beforeBackward(b->stage);
      else owner->afterBackward(b->stage);
    }
    grads.push_back(at::Tensor());  // anchor
    grads.push_back(at::Tensor());  // boundary
    return grads;
  }
};

variable_list boundary(std::vector<at::Tensor> xs, const std::shared_ptr<ShardedModel>& owner, int64_t stage,
                       bool before) {
  if (xs.empty()) return xs;
  auto b = c10::make_intrusive<Boundary>();
  b->owner = owner;
  b->stage = stage;
  b->before = before;
  const at::Tensor anchor = at::zeros({}, xs[0].options().dtype(at::kFloat)).requires_grad_(true);
  return StageBoundary::apply(at::TensorList(xs), anchor, b);
}

}  // namespace

ShardPlan ShardPlan::of(const Model& model) {
  ShardPlan plan;
  const auto named = model.namedParameters();
  const auto stages = model.parameterStages();
  const int64_t L = model.cfg.numLayers;
  plan.params.resize(named.size());
  plan.stageUnits.resize(size_t(L + 3));
  std::vector<int64_t> first(named.size());
  for (size_t i = 0; i < named.size(); i++) first[i] = *std::min_element(stages[i].begin(), stages[i].end());
  for (int64_t s = -1; s <= L + 1; s++) {
    Unit unit{unitName(s, L), s, {}, 0};
    for (size_t i = 0; i < named.size(); i++) {
      if (first[i] != s) continue;
      const at::Tensor& t = named[i].second;
      plan.params[i] = {named[i].first, t.sizes().vec(), plan.units.size(), unit.numel, t.numel()};
      unit.params.push_back(i);
      unit.numel += t.numel();
    }
    if (!unit.params.empty()) plan.units.push_back(std::move(unit));
  }
  for (size_t i = 0; i < named.size(); i++)
    for (int64_t s : stages[i]) {
      auto& list = plan.stageUnits[size_t(s + 1)];
      if (std::find(list.begin(), list.end(), plan.params[i].unit) == list.end()) list.push_back(plan.params[i].unit);
    }
  return plan;
}

std::vector<ShardPlan::Span> ShardPlan::spans(size_t unit, int64_t begin, int64_t end) const {
  std::vector<Span> out;
  for (size_t p : units.at(unit).params) {
    const int64_t a = std::max(begin, params[p].offset), b = std::min(end, params[p].offset + params[p].numel);
    if (a < b) out.push_back({p, a - params[p].offset, a - begin, b - a});
  }
  return out;
}

std::shared_ptr<ShardedModel> ShardedModel::install(Model& model, std::shared_ptr<DistGroup> group, bool trainable) {
  std::shared_ptr<ShardedModel> sm(new ShardedModel(model, std::move(group), trainable));
  model.stageHooks = sm;
  return sm;
}

ShardedModel::ShardedModel(Model& model, std::shared_ptr<DistGroup> group, bool trainable)
    : model_(model), group_(std::move(group)), trainable_(trainable), plan_(ShardPlan::of(model)) {
  at::NoGradGuard noGrad;
  for (auto& [name, t] : model_.namedParameters()) vars_.push_back(t);
  const int64_t N = group_->size(), r = group_->rank();
  units_.resize(plan_.units.size());
  // The fused tensors whose parts lie back to back in one unit become views of its buffer too;
  // the others are dropped (they would keep the parameters' old storage alive).
  std::map<const c10::TensorImpl*, size_t> paramOf;
  for (size_t p = 0; p < vars_.size(); p++) paramOf[vars_[p].unsafeGetTensorImpl()] = p;
  for (Model::FusedTensor& f : model_.fusedTensors()) {
    const ShardPlan::Param& first = plan_.params[paramOf.at(f.parts[0].unsafeGetTensorImpl())];
    int64_t next = first.offset;
    bool stacked = true;
    for (const at::Tensor& part : f.parts) {
      const ShardPlan::Param& pp = plan_.params[paramOf.at(part.unsafeGetTensorImpl())];
      stacked = stacked && pp.unit == first.unit && pp.offset == next;
      next = pp.offset + pp.numel;
    }
    if (stacked)
      units_[first.unit].aliases.push_back({f.fused, first.offset, next - first.offset, f.fused->sizes().vec()});
    else *f.fused = at::Tensor();
  }
  for (size_t u = 0; u < units_.size(); u++) {
    Unit& U = units_[u];
    const ShardPlan::Unit& pu = plan_.units[u];
    const int64_t S = ShardPlan::shardNumel(pu.numel, N);
    // The whole unit once (one unit's memory at a time), to take this rank's part; the same buffer
    // then serves as the gathered one (the parameters become views of it), its storage freed until
    // a stage gathers it. A model without weights has its shards filled later (fill).
    const bool weights = model_.hasWeights();
    U.full = weights ? at::zeros({N * S}, model_.options()) : at::empty({N * S}, model_.options());
    if (weights)
      for (size_t p : pu.params)
        U.full.narrow(0, plan_.params[p].offset, plan_.params[p].numel).copy_(vars_[p].detach().reshape(-1));
    U.shard = weights ? U.full.narrow(0, r * S, S).clone() : at::zeros({S}, model_.options());
    if (trainable_) U.grad = at::zeros({S}, model_.options());
    viewsOf(u, U.full);
    releaseStorage(U.full);
  }
  for (size_t u = 0; u < units_.size(); u++) {
    const auto [begin, end] = range(u);
    for (const ShardPlan::Span& s : plan_.spans(u, begin, end))
      pieces_.push_back({s.param, u, s.at, s.paramOffset, s.numel, units_[u].shard.narrow(0, s.at, s.numel)});
  }
  // In parameter order (AdamW's), one piece at most per parameter.
  std::sort(pieces_.begin(), pieces_.end(), [](const Piece& a, const Piece& b) { return a.param < b.param; });
  localHas_.assign(plan_.params.size(), 0.0f);
  hasGrad_.assign(plan_.params.size(), 0);
  steps_.assign(plan_.params.size(), 0);
}

std::pair<int64_t, int64_t> ShardedModel::range(size_t unit) const {
  return ShardPlan::shardRange(plan_.units[unit].numel, group_->rank(), group_->size());
}

const std::vector<size_t>& ShardedModel::unitsOf(int64_t stage) const { return plan_.stageUnits.at(size_t(stage + 1)); }

void ShardedModel::viewsOf(size_t u, const at::Tensor& full) {
  for (size_t p : plan_.units[u].params) {
    const ShardPlan::Param& pp = plan_.params[p];
    vars_[p].set_data(full.narrow(0, pp.offset, pp.numel).view(pp.shape));
  }
  for (const Alias& a : units_[u].aliases) a.tensor->set_data(full.narrow(0, a.offset, a.numel).view(a.shape));
}

void ShardedModel::fill(size_t unit, int64_t offset, const at::Tensor& values) {
  at::NoGradGuard noGrad;
  const auto [begin, end] = range(unit);
  const int64_t a = std::max(begin, offset), b = std::min(end, offset + values.numel());
  if (a < b) units_[unit].shard.narrow(0, a - begin, b - a).copy_(values.reshape(-1).narrow(0, a - offset, b - a));
}

void ShardedModel::prefetch(size_t u, at::ScalarType dtype) {
  Unit& U = units_[u];
  if (U.gathered || U.gathering) return;
  at::NoGradGuard noGrad;
  if (U.full.scalar_type() != dtype) {
    // The forward computes in another dtype than the last (bf16 training, fp32 scoring): the
    // parameters become views of a buffer of that dtype (a normal tensor, as the parameters are,
    // even when scoring in InferenceMode).
    c10::InferenceMode normal(false);
    at::Tensor full = at::empty({U.full.numel()}, U.full.options().dtype(dtype));
    viewsOf(u, full);
    releaseStorage(full);
    U.full = full;
  }
  reallocateStorage(U.full);
  gatheredBytes_ += int64_t(U.full.nbytes());
  gatheredPeak_ = std::max(gatheredPeak_, gatheredBytes_);
  const at::Tensor src = U.shard.scalar_type() == dtype ? U.shard : U.shard.to(dtype);
  U.gathering = group_->allGatherAsync(src, U.full);
}

void ShardedModel::require(size_t u, at::ScalarType dtype) {
  Unit& U = units_[u];
  if (U.gathered) return;
  prefetch(u, dtype);
  U.gathering->wait();
  U.gathering.reset();
  U.gathered = true;
}

void ShardedModel::hold(size_t u, at::ScalarType dtype) {
  require(u, dtype);
  units_[u].holds++;
}

void ShardedModel::unhold(size_t u) {
  if (--units_[u].holds <= 0) release(u);
}

void ShardedModel::release(size_t u) {
  Unit& U = units_[u];
  U.holds = 0;
  if (U.gathering) {
    U.gathering->wait();
    U.gathering.reset();
  }
  if (hasStorage(U.full)) {
    gatheredBytes_ -= int64_t(U.full.nbytes());
    releaseStorage(U.full);
  }
  U.gathered = false;
}

void ShardedModel::releaseAll() {
  for (size_t u = 0; u < units_.size(); u++) release(u);
}

std::vector<at::Tensor> ShardedModel::enter(int64_t stage, std::vector<at::Tensor> inputs) {
  const at::ScalarType dtype = model_.computeDtype();
  for (size_t u : unitsOf(stage)) hold(u, dtype);
  // The next stage's gather runs while this one computes.
  if (stage + 2 < int64_t(plan_.stageUnits.size()))
    for (size_t u : unitsOf(stage + 1)) prefetch(u, dtype);
  if (!at::GradMode::is_enabled()) return inputs;
  return boundary(std::move(inputs), shared_from_this(), stage, /*before=*/false);
}

std::vector<at::Tensor> ShardedModel::leave(int64_t stage, std::vector<at::Tensor> outputs) {
  if (at::GradMode::is_enabled()) outputs = boundary(std::move(outputs), shared_from_this(), stage, /*before=*/true);
  for (size_t u : unitsOf(stage)) unhold(u);
  return outputs;
}

void ShardedModel::beforeBackward(int64_t stage) {
  if (!inBackward_) {
    inBackward_ = true;
    for (Unit& U : units_) U.reduced = false;
    std::weak_ptr<ShardedModel> self = weak_from_this();
    torch::autograd::Engine::get_default_engine().queue_callback([self] {
      if (auto sm = self.lock()) sm->backwardDone();
    });
  }
  // The embedding's backward reads none of its parameters.
  if (stage < 0) return;
  for (size_t u : unitsOf(stage)) hold(u, units_[u].full.scalar_type());
  if (stage > 0)
    for (size_t u : unitsOf(stage - 1)) prefetch(u, units_[u].full.scalar_type());
}

void ShardedModel::afterBackward(int64_t stage) {
  for (size_t u : unitsOf(stage)) {
    // A unit's gradients are complete once the first stage that reads it is done.
    if (trainable_ && plan_.units[u].stage == stage && !units_[u].reduced) reduceScatter(u);
    unhold(u);
  }
}

void ShardedModel::backwardDone() {
  // What no stage's input could hook (the embedding), in backward order.
  for (size_t u = units_.size(); u-- > 0;)
    if (trainable_ && !units_[u].reduced) reduceScatter(u);
  releaseAll();
  inBackward_ = false;
}

void ShardedModel::reduceScatter(size_t u) {
  at::NoGradGuard noGrad;
  Unit& U = units_[u];
  at::Tensor buf = at::zeros({U.full.numel()}, U.shard.options());
  for (size_t p : plan_.units[u].params) {
    at::Tensor& g = vars_[p].mutable_grad();
    if (!g.defined()) continue;
    const ShardPlan::Param& pp = plan_.params[p];
    buf.narrow(0, pp.offset, pp.numel).copy_(g.reshape(-1));
    if (counting_) localHas_[p] = 1;
    g.reset();
  }
  reducing_.push_back(group_->reduceScatterAddAsync(buf, U.grad));
  U.reduced = true;
  // At most two in flight: each holds a whole unit's gradient.
  while (reducing_.size() > 2) {
    reducing_.front()->wait();
    reducing_.pop_front();
  }
}

void ShardedModel::zeroGrad() {
  for (Unit& U : units_)
    if (U.grad.defined()) U.grad.zero_();
  std::fill(localHas_.begin(), localHas_.end(), 0.0f);
}

void ShardedModel::finishGradients() {
  while (!reducing_.empty()) {
    reducing_.front()->wait();
    reducing_.pop_front();
  }
  at::Tensor has = at::tensor(localHas_, at::TensorOptions().dtype(at::kFloat));
  group_->allReduceSum(has);
  const float* h = has.data_ptr<float>();
  for (size_t p = 0; p < hasGrad_.size(); p++)
    if (h[p] > 0) hasGrad_[p] = 1;
  for (Piece& piece : pieces_) {
    if (hasGrad_[piece.param])
      piece.view.mutable_grad() = units_[piece.unit].grad.narrow(0, piece.shardOffset, piece.numel);
    else piece.view.mutable_grad() = at::Tensor();
  }
}

double ShardedModel::gradSquareSum() const {
  // Read on the host (a deliberate sync, once a step: clipping needs the global norm).
  std::vector<at::Tensor> norms;
  for (const Unit& U : units_)
    if (U.grad.defined()) norms.push_back(U.grad.norm());
  if (norms.empty()) return 0;
  return at::stack(norms).to(at::kDouble).pow(2).sum().item<double>();
}

void ShardedModel::stepped() {
  for (size_t p = 0; p < steps_.size(); p++)
    if (hasGrad_[p]) steps_[p]++;
}

std::vector<std::pair<std::string, at::Tensor>> ShardedModel::gather(size_t u, bool gradients) {
  at::NoGradGuard noGrad;
  // The collective's thread writes the buffer: not an inference tensor (callers may be in
  // InferenceMode, which is thread-local).
  c10::InferenceMode normal(false);
  const Unit& U = units_[u];
  const at::Tensor& src = gradients ? U.grad : U.shard;
  at::Tensor full = at::empty({U.full.numel()}, src.options());
  group_->allGatherAsync(src, full)->wait();
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (size_t p : plan_.units[u].params) {
    const ShardPlan::Param& pp = plan_.params[p];
    out.emplace_back(pp.name, full.narrow(0, pp.offset, pp.numel).view(pp.shape));
  }
  return out;
}

int64_t ShardedModel::shardBytes() const {
  int64_t n = 0;
  for (const Unit& U : units_) n += int64_t(U.shard.nbytes());
  return n;
}

int64_t ShardedModel::gradBytes() const {
  int64_t n = 0;
  for (const Unit& U : units_)
    if (U.grad.defined()) n += int64_t(U.grad.nbytes());
  return n;
}

int64_t ShardedModel::takeGatheredPeakBytes() {
  const int64_t peak = gatheredPeak_;
  gatheredPeak_ = gatheredBytes_;
  return peak;
}

}  // namespace prime
