// The data-parallel half of Trainer (trainer.h): process groups, ZeRO-1's owners and full
// sharding's passes, the global gradient norm, sharded checkpoints' units and the memory a rank
// holds. trainer.cc has the training itself.
#include <torch/optim/adamw.h>

#include <stdexcept>

#include "adamw.h"
#include "autocast.h"
#include "trainer.h"

namespace prime {

void Trainer::setGroup(std::shared_ptr<DistGroup> group, int64_t bucketBytes, Sharding sharding) {
  if (step_ != 0) throw std::runtime_error("setGroup: the trainer has already stepped");
  if (group_) throw std::runtime_error("setGroup: the trainer already has a process group");
  if (group->backend() == DistBackend::kNccl && !model->device.is_cuda())
    throw std::runtime_error("trainer.dist.backend nccl: the model is on " + model->device.str() +
                             ", and NCCL moves CUDA tensors only; use trainer.dist.backend gloo or auto");
  if (!model->hasWeights() && sharding != Sharding::kFull)
    throw std::runtime_error("setGroup: the model was built without weights, which only full sharding fills");
  group_ = std::move(group);
  bucketBytes_ = bucketBytes;
  if (sharding == Sharding::kFull) {
    // LoRA: the frozen base is sharded, the adapters stay whole (ZeRO-1 below).
    sharded_ = ShardedModel::install(*model, group_, /*trainable=*/!lora_);
    if (!lora_) trainable_.clear();
    if (reference_) shardedReference_ = ShardedModel::install(*reference_, group_, /*trainable=*/false);
  }
  // Greedy by size, in parameter order: each parameter to the rank owning the fewest values yet.
  std::vector<int64_t> load(group_->size(), 0);
  owner_.assign(trainable_.size(), 0);
  for (size_t i = 0; i < trainable_.size(); i++) {
    int r = 0;
    for (int k = 1; k < group_->size(); k++)
      if (load[k] < load[r]) r = k;
    owner_[i] = r;
    load[r] += trainable_[i].second.numel();
  }
  optim_ = makeOptimizer();
}

void Trainer::zeroGrads() {
  if (!group_) return optim_->zero_grad();
  // What libtorch 1.13's zero_grad does, over every parameter (AdamW holds only this rank's).
  for (auto& [name, p] : trainable_)
    if (p.grad().defined()) {
      p.mutable_grad().detach_();
      p.mutable_grad().zero_();
    }
  if (sharded_) sharded_->zeroGrad();
}

void Trainer::syncGradients() {
  at::NoGradGuard noGrad;
  const int64_t n = int64_t(trainable_.size());
  if (n == 0) return;  // full sharding's gradients are reduce-scattered in the backward
  // A parameter with a gradient on any rank has one on all (zeros where its rows did not reach
  // it), as one trainer over all rows would; one with none anywhere is left alone (AdamW skips it).
  at::Tensor has = at::zeros({n}, at::TensorOptions().dtype(at::kFloat));
  for (int64_t i = 0; i < n; i++)
    if (trainable_[i].second.grad().defined()) has[i] = 1;
  group_->allReduceSum(has);
  std::vector<at::Tensor> grads;
  for (int64_t i = 0; i < n; i++) {
    at::Tensor& p = trainable_[i].second;
    if (has[i].item<float>() == 0) continue;
    if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
    grads.push_back(p.grad());
  }
  group_->allReduceBucketed(grads, bucketBytes_);
}

void Trainer::broadcastParameters() {
  for (int r = 0; r < group_->size(); r++) {
    std::vector<at::Tensor> owned;
    for (size_t i = 0; i < trainable_.size(); i++)
      if (owner_[i] == r) owned.push_back(trainable_[i].second);
    group_->broadcastBucketed(owned, r, bucketBytes_);
  }
}

std::unique_ptr<torch::optim::AdamW> Trainer::gatherOptimizer() {
  const int rank = group_->rank();
  std::unique_ptr<torch::optim::AdamW> full = rank == 0 ? makeOptimizer(true) : nullptr;
  const auto dopts = at::TensorOptions().dtype(at::kDouble);
  for (size_t i = 0; i < trainable_.size(); i++) {
    const at::Tensor& p = trainable_[i].second;
    const int owner = owner_[i], tag = int(i) * 3;
    if (rank != 0 && rank != owner) continue;
    if (owner == 0) {  // rank 0's own shard: a copy
      auto it = optim_->state().find(stateKey(optim_->state(), p));
      if (it != optim_->state().end()) full->state()[stateKey(full->state(), p)] = it->second->clone();
      continue;
    }
    // From its owner: [has state, step], then exp_avg and exp_avg_sq.
    at::Tensor meta = at::zeros({2}, dopts);
    if (rank == owner) {
      auto* st = adamState(*optim_, p);
      if (st) meta = at::tensor(std::vector<double>{1.0, double(st->step())}, dopts);
      group_->send(meta, 0, tag);
      if (!st) continue;
      at::Tensor m = st->exp_avg().contiguous(), v = st->exp_avg_sq().contiguous();
      group_->send(m, 0, tag + 1);
      group_->send(v, 0, tag + 2);
    } else {
      group_->recv(meta, owner, tag);
      if (meta[0].item<double>() == 0) continue;
      at::Tensor m = at::empty_like(p, at::MemoryFormat::Contiguous),
                 v = at::empty_like(p, at::MemoryFormat::Contiguous);
      group_->recv(m, owner, tag + 1);
      group_->recv(v, owner, tag + 2);
      setAdamState(*full, p, int64_t(meta[1].item<double>()), m, v);
    }
  }
  return full;
}

void Trainer::idlePass(const LossConfig& loss) {
  // A 2-token row through every stage, forward (with the KL reference's when the real passes
  // have one) and backward, its loss times 0. No dropout: the trainer's RNG stays where it is.
  const auto lopts = at::TensorOptions().dtype(at::kLong);
  const at::Tensor ids = at::zeros({2}, lopts).to(model->device), pos = at::arange(2, lopts).to(model->device);
  const std::vector<int64_t> starts{0};
  const at::Tensor targets = ids.narrow(0, 1, 1);
  std::optional<AutocastGuard> autocast;
  autocast.emplace(model->device, cfg_.mixedPrecision);
  const at::Tensor hidden =
      model->forwardPacked(ids, pos, starts, nullptr, lora_.get(), nullptr, nullptr, cfg_.activationCheckpointing);
  const at::Tensor idle = model->tokenStats(hidden.narrow(0, 0, 1), targets, loss.temperature).logp.sum() * 0;
  if (loss.klBeta > 0) {
    at::NoGradGuard noGrad;
    const Model& ref = reference_ ? *reference_ : *model;
    ref.tokenStats(ref.forwardPacked(ids, pos, starts).narrow(0, 0, 1), targets, loss.temperature);
  }
  autocast.reset();
  idle.backward();
}

std::array<at::Tensor, 3> Trainer::readShard(size_t unit) {
  if (!shardsParameters()) throw std::runtime_error("readShard: this trainer's parameters are not sharded");
  if (unit >= plan_.units.size()) throw std::runtime_error("readShard: no unit " + std::to_string(unit));
  at::NoGradGuard noGrad;
  const at::Tensor& shard = sharded_->shard(unit);
  at::Tensor m = at::zeros_like(shard), v = at::zeros_like(shard);
  for (const ShardedModel::Piece& piece : sharded_->pieces()) {
    if (piece.unit != unit) continue;
    if (auto* st = adamState(*optim_, piece.view)) {
      m.narrow(0, piece.shardOffset, piece.numel).copy_(st->exp_avg());
      v.narrow(0, piece.shardOffset, piece.numel).copy_(st->exp_avg_sq());
    }
  }
  return {shard.clone(), m, v};
}

void Trainer::stageShard(size_t unit, at::Tensor param, at::Tensor expAvg, at::Tensor expAvgSq) {
  if (unit >= plan_.units.size())
    throw std::runtime_error("stageShard: no unit " + std::to_string(unit) + " (the model has " +
                             std::to_string(plan_.units.size()) + ")");
  const auto [begin, end] = heldRange(unit);
  for (const at::Tensor* t : {&param, &expAvg, &expAvgSq})
    if (t->dim() != 1 || t->numel() != end - begin)
      throw std::runtime_error("stageShard: unit '" + plan_.units[unit].name + "' takes elements [" +
                               std::to_string(begin) + ", " + std::to_string(end) + ") here, got " +
                               std::to_string(t->numel()));
  const auto opts = model->options();
  staged_[unit] = {begin, param.to(opts), expAvg.to(opts), expAvgSq.to(opts)};
}

void Trainer::stageWhole(const std::vector<at::Tensor>& weights, torch::optim::AdamW& state) {
  at::NoGradGuard noGrad;
  for (size_t u = 0; u < plan_.units.size(); u++) {
    const auto [begin, end] = heldRange(u);
    Staged st{begin, at::zeros({end - begin}, model->options()), at::zeros({end - begin}, model->options()),
              at::zeros({end - begin}, model->options())};
    for (const ShardPlan::Span& s : plan_.spans(u, begin, end)) {
      const auto part = [&](const at::Tensor& t) { return t.reshape(-1).narrow(0, s.paramOffset, s.numel); };
      st.param.narrow(0, s.at, s.numel).copy_(part(weights[s.param]));
      if (auto* m = adamState(state, weights[s.param])) {
        st.expAvg.narrow(0, s.at, s.numel).copy_(part(m->exp_avg()));
        st.expAvgSq.narrow(0, s.at, s.numel).copy_(part(m->exp_avg_sq()));
      }
    }
    staged_[u] = std::move(st);
  }
}

void Trainer::applyStaged(const std::vector<int64_t>& steps, torch::optim::AdamW& into) {
  at::NoGradGuard noGrad;
  if (shardsParameters()) {
    for (size_t u = 0; u < plan_.units.size(); u++) {
      const Staged& st = staged_.at(u);
      at::Tensor& shard = sharded_->shard(u);
      shard.zero_();
      shard.narrow(0, 0, st.param.numel()).copy_(st.param);
    }
    for (const ShardedModel::Piece& piece : sharded_->pieces()) {
      if (steps[piece.param] == 0) continue;
      const Staged& st = staged_.at(piece.unit);
      setAdamState(into, piece.view, steps[piece.param], st.expAvg.narrow(0, piece.shardOffset, piece.numel).clone(),
                   st.expAvgSq.narrow(0, piece.shardOffset, piece.numel).clone());
    }
    sharded_->steps() = steps;
    return;
  }
  // Whole units into the parameters (full fine-tuning: trainable_ is namedParameters()).
  for (size_t p = 0; p < plan_.params.size(); p++) {
    const ShardPlan::Param& pp = plan_.params[p];
    const Staged& st = staged_.at(pp.unit);
    const auto part = [&](const at::Tensor& t) { return t.narrow(0, pp.offset, pp.numel).view(pp.shape); };
    at::Tensor& var = trainable_[p].second;
    var.copy_(part(st.param));
    if (steps[p] > 0 && (!group_ || owner_[p] == group_->rank()))
      setAdamState(into, var, steps[p], part(st.expAvg).clone(), part(st.expAvgSq).clone());
  }
}

void Trainer::loadBaseShard(size_t unit, int64_t offset, const at::Tensor& values) {
  if (!sharded_)
    throw std::runtime_error("loadBaseShard: the trainer is not fully sharded (setGroup with full sharding first)");
  if (unit >= plan_.units.size() || offset < 0 || offset + values.numel() > plan_.units[unit].numel)
    throw std::runtime_error("loadBaseShard: elements [" + std::to_string(offset) + ", " +
                             std::to_string(offset + values.numel()) + ") are not in unit " + std::to_string(unit));
  for (ShardedModel* s : {sharded_.get(), shardedReference_.get()})
    if (s) s->fill(unit, offset, values);
}

MemoryStats Trainer::memory() {
  MemoryStats m;
  const auto tensorBytes = [](const at::Tensor& t) { return t.defined() ? int64_t(t.nbytes()) : int64_t(0); };
  for (const ShardedModel* s : {sharded_.get(), shardedReference_.get()})
    if (s) {
      m.parameterBytes += s->shardBytes();
      m.gradientBytes += s->gradBytes();
    }
  if (sharded_) m.gatheredPeakBytes = sharded_->takeGatheredPeakBytes();
  if (shardedReference_)
    m.gatheredPeakBytes = std::max(m.gatheredPeakBytes, shardedReference_->takeGatheredPeakBytes());
  // Whole parameters: the model's (unless sharded), the LoRA adapters, an unsharded reference.
  if (!sharded_)
    for (auto& [name, p] : model->namedParameters()) m.parameterBytes += tensorBytes(p);
  if (reference_ && !shardedReference_)
    for (auto& [name, p] : reference_->namedParameters()) m.parameterBytes += tensorBytes(p);
  for (auto& [name, p] : trainable_) {
    if (lora_) m.parameterBytes += tensorBytes(p);
    m.gradientBytes += tensorBytes(p.grad());
  }
  for (auto& [key, state] : optim_->state()) {
    const auto& st = static_cast<const torch::optim::AdamWParamState&>(*state);
    m.optimizerBytes += tensorBytes(st.exp_avg()) + tensorBytes(st.exp_avg_sq());
  }
  return m;
}

}  // namespace prime
