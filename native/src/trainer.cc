// With adamw.cc, the translation units that need the heavy torch C++ API (optimizer and
// serialization).
#include "trainer.h"

#include "autocast.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/record_function.h>
#include <fcntl.h>
#include <torch/optim/adamw.h>
#include <torch/serialize.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <sstream>
#include <stdexcept>
#include <type_traits>

#include "adamw.h"
#include "archive_file.h"

namespace prime {
namespace fs = std::filesystem;

namespace {

std::string checkpointPath(const std::string& dir) { return (fs::path(dir) / "trainer.ckpt").string(); }

void fsyncPath(const std::string& path, int flags) {
  int fd = ::open(path.c_str(), flags);
  if (fd < 0) throw std::runtime_error("cannot open '" + path + "' to sync it");
  ::fsync(fd);
  ::close(fd);
}

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A call's wall time and the throughput it gives.
void timed(StepStats& st, double seconds) {
  st.seconds = seconds;
  st.metrics.set("tokens_per_s", seconds > 0 ? double(st.tokens) / seconds : 0.0);
}

// The L2 norm of all the gradients together, read on the host (a deliberate sync: clipping and the
// step's metrics need it). On CUDA under libtorch 2.x one multi-tensor kernel for the per-tensor
// norms, not one kernel per parameter.
double gradNorm(const std::vector<at::Tensor>& grads) {
  if (grads.empty()) return 0;
  std::vector<at::Tensor> norms;
#if TORCH_VERSION_MAJOR >= 2
  if (grads.front().is_cuda()) norms = at::_foreach_norm(grads);
#endif
  if (norms.empty())
    for (const at::Tensor& g : grads) norms.push_back(g.norm());
  return at::stack(norms).norm().item<double>();
}

// A row turned into loss inputs. Prediction j is of token j + 1 from hidden state j; the loss
// inputs hold only the loss tokens' predictions (`index` says which), as nothing a loss or a
// metric computes reads the others (every per-token term is weighted by the mask). So the LM head
// runs on the loss tokens alone: a prompt's tokens cost the body's forward and backward, never the
// head's. At a 151,936-token vocabulary the head is a quarter of Qwen3-0.6B's matmul FLOPs and 78%
// of the 100M model's in bench/compare.ts.
struct PreparedRow {
  std::vector<int64_t> starts;
  LossInputs in;
  at::Tensor ids, pos;                  // on the model's device
  at::Tensor index;                     // the loss predictions' positions; undefined = all of them
  int64_t lossTokens = 0, samples = 0;  // counted on the host: the normaliser needs them first
  int64_t ceTokens = 0;                 // tokens with a ce weight above 0: the ce normaliser's
};

PreparedRow prepareRow(const TrainRow& row, size_t r, const LossConfig& loss, const Model& model) {
  const size_t N = row.ids.size();
  const std::string where = "row " + std::to_string(r) + ": ";
  if (N == 0 || row.pos.size() != N || row.lossMask.size() != N)
    throw std::runtime_error(where + "inputIds, positionIds and lossMask need the same non-zero length");
  if (loss.isPolicy() && (row.advantages.size() != N || row.inferenceLogprobs.size() != N))
    throw std::runtime_error(where + "loss '" + loss.kind +
                             "' needs advantages and inferenceLogprobs aligned with inputIds");
  if (!row.ceWeights.empty() && row.ceWeights.size() != N)
    throw std::runtime_error(where + "ceWeights must be aligned with inputIds");
  for (double w : row.ceWeights)
    if (!(w >= 0 && std::isfinite(w))) throw std::runtime_error(where + "ceWeights must be finite and >= 0");
  model.checkTokenIds(row.ids.data(), N);
  PreparedRow p;
  p.starts = segmentStarts(row.pos);
  if (N < 2) return p;
  std::vector<double> mask(N - 1);
  std::vector<double> ce(row.ceWeights.empty() ? 0 : N - 1);
  std::vector<int64_t> sample(N - 1);
  std::vector<bool> sampleHasLoss(p.starts.size(), false);
  std::vector<int64_t> keep;  // the predictions a loss reads: the loss tokens' and the ce tokens'
  size_t s = 0;               // sample of token t
  for (size_t t = 1; t < N; t++) {
    while (s + 1 < p.starts.size() && p.starts[s + 1] <= int64_t(t)) s++;
    // The first token of a sample is predicted from the previous sample: never a loss token.
    const bool first = p.starts[s] == int64_t(t);
    mask[t - 1] = row.lossMask[t] && !first ? 1.0 : 0.0;
    if (!ce.empty()) ce[t - 1] = first ? 0.0 : row.ceWeights[t];
    sample[t - 1] = int64_t(s);
    if (mask[t - 1] > 0) {
      p.lossTokens++;
      if (!sampleHasLoss[s]) p.samples++;
      sampleHasLoss[s] = true;
    }
    if (!ce.empty() && ce[t - 1] > 0) p.ceTokens++;
    if (mask[t - 1] > 0 || (!ce.empty() && ce[t - 1] > 0)) keep.push_back(int64_t(t - 1));
  }
  std::vector<double> mu, adv;
  if (loss.isPolicy()) {
    mu.assign(row.inferenceLogprobs.begin() + 1, row.inferenceLogprobs.end());
    adv.assign(row.advantages.begin() + 1, row.advantages.end());
  }
  // Keep the loss tokens' predictions only. A row without loss tokens keeps all of them: its loss
  // is then 0 through the whole graph, and its backward gives the zero gradients it always gave.
  const bool compact = !keep.empty() && keep.size() < N - 1;
  if (compact) {
    const auto select = [&keep](auto& v) {
      if (v.empty()) return;  // mu and adv of a non-policy loss
      for (size_t i = 0; i < keep.size(); i++) v[i] = v[size_t(keep[i])];
      v.resize(keep.size());
    };
    select(mask);
    select(ce);
    select(sample);
    select(mu);
    select(adv);
  }
  const auto fopts = at::TensorOptions().dtype(at::kDouble);
  const auto lopts = at::TensorOptions().dtype(at::kLong);
  const at::ScalarType dt = model.logitsDtype();
  // Every host-to-device copy of the row happens here, before the step's first forward: a copy
  // from pageable memory waits for the work queued on the device.
  p.ids = at::tensor(row.ids, lopts).to(model.device);
  p.pos = at::tensor(row.pos, lopts).to(model.device);
  if (compact) p.index = at::tensor(keep, lopts).to(model.device);
  p.in.mask = at::tensor(mask, fopts).to(model.device, dt);
  if (!ce.empty()) p.in.ceWeight = at::tensor(ce, fopts).to(model.device, dt);
  p.in.sample = at::tensor(sample, lopts).to(model.device);
  p.in.numSamples = int64_t(p.starts.size());
  if (loss.isPolicy()) {
    p.in.mu = at::tensor(mu, fopts).to(model.device, dt);
    p.in.adv = at::tensor(adv, fopts).to(model.device, dt);
  }
  return p;
}

// Of a row's predictions (hidden states [N - 1, D] or targets [N - 1]), the ones its loss inputs
// hold: the loss tokens', or all when the row keeps all.
at::Tensor lossRows(const at::Tensor& x, const PreparedRow& p) {
  return p.index.defined() ? x.index_select(0, p.index) : x;
}

}  // namespace

std::vector<at::Tensor> Trainer::replayRoutes(const TrainRow& row, size_t r) const {
  const std::vector<int64_t>& sparse = model->sparseLayers();
  const int64_t N = int64_t(row.ids.size()), S = int64_t(sparse.size()), K = model->cfg.numExpertsPerTok;
  if (S == 0) throw std::runtime_error("row " + std::to_string(r) + ": routes given but the model has no MoE layers");
  if (int64_t(row.routes.size()) != N * S * K)
    throw std::runtime_error("row " + std::to_string(r) + ": routes has " + std::to_string(row.routes.size()) +
                             " entries, expected tokens x sparse layers x experts per token = " + std::to_string(N) +
                             " x " + std::to_string(S) + " x " + std::to_string(K));
  at::Tensor all = at::tensor(row.routes, at::TensorOptions().dtype(at::kLong)).view({N, S, K}).to(model->device);
  std::vector<at::Tensor> replay(model->cfg.numLayers);
  for (int64_t i = 0; i < S; i++) replay[sparse[i]] = all.select(1, i).contiguous();
  return replay;
}

Trainer::Trainer(std::shared_ptr<Model> m, TrainerConfig c)
    : model(std::move(m)), cfg_(std::move(c)), rng_(at::make_generator<at::CPUGeneratorImpl>(cfg_.seed)) {
  if (model->dtype == at::kBFloat16)
    throw std::runtime_error(
        "training keeps fp32 (or fp64) master weights: load the model with dtype float32, and for bf16 compute "
        "create the trainer with mixedPrecision bfloat16");
  if (cfg_.mixedPrecision && model->dtype != at::kFloat)
    throw std::runtime_error("mixedPrecision " + std::string(c10::toString(*cfg_.mixedPrecision)) +
                             " needs the model's weights in float32 (the master weights), not " +
                             std::string(c10::toString(model->dtype)));
  if (cfg_.activationCheckpointing < 0)
    throw std::runtime_error("activationCheckpointing must be >= 0 (checkpoint every N-th layer; 0 = off)");
  if (cfg_.activationCheckpointing > 0 && !model->sparseLayers().empty())
    throw std::runtime_error("activation checkpointing is not supported for MoE models yet; leave it off");
  const LoraConfig& lc = cfg_.lora;
  if (lc.rank < 0) throw std::runtime_error("LoRA rank must be >= 1 (0 = full fine-tuning)");
  if (lc.rank == 0) {
    for (auto& [name, p] : model->namedParameters()) {
      p.requires_grad_(true);
      trainable_.emplace_back(name, p);
    }
    if (cfg_.reference) reference_ = model->copy();
  } else {
    if (!(lc.alpha > 0) || !(lc.dropout >= 0 && lc.dropout < 1))
      throw std::runtime_error("LoRA needs alpha > 0 and dropout in [0, 1)");
    if (lc.targets.empty()) throw std::runtime_error("LoRA needs at least one target module");
    std::array<bool, kNumProj> targeted{};
    for (const std::string& t : lc.targets) {
      int p = 0;
      while (p < kNumProj && t != projName(p)) p++;
      if (p == kNumProj) {
        std::string known;
        for (int q = 0; q < kNumProj; q++) known += std::string(q ? ", " : "") + projName(q);
        throw std::runtime_error("unknown LoRA target module '" + t + "' (supported: " + known + ")");
      }
      targeted[p] = true;
    }
    for (auto& [name, p] : model->namedParameters()) p.requires_grad_(false);  // base frozen
    lora_ = std::make_unique<LoraAdapters>();
    lora_->rank = lc.rank;
    lora_->alpha = lc.alpha;
    lora_->dropout = lc.dropout;
    // Every projection of a targeted kind, experts' included (PEFT matches module names by suffix).
    for (const ProjectionRef& proj : model->projections()) {
      if (!targeted[proj.kind]) continue;
      const at::Tensor& W = proj.weight;
      // PEFT's init: A ~ kaiming_uniform(a = sqrt(5)) = U(-1/sqrt(in), 1/sqrt(in)), B = 0, so the
      // adapted model starts as the base model. Drawn on the CPU for device-independent values.
      const double bound = 1.0 / std::sqrt(double(W.size(1)));
      at::Tensor A = at::empty({lc.rank, W.size(1)}, at::TensorOptions().dtype(model->dtype))
                         .uniform_(-bound, bound, rng_)
                         .to(model->device)
                         .requires_grad_(true);
      at::Tensor B = at::zeros({W.size(0), lc.rank}, model->options()).requires_grad_(true);
      lora_->byWeight[W.unsafeGetTensorImpl()] = {proj.module, A, B};
      const std::string peft = "base_model.model." + proj.module;
      trainable_.emplace_back(peft + ".lora_A.weight", A);
      trainable_.emplace_back(peft + ".lora_B.weight", B);
    }
  }
  plan_ = ShardPlan::of(*model);
  optim_ = makeOptimizer();
}

// lr is set before every step (schedules live in TS), so it starts at 0 here.
std::unique_ptr<torch::optim::AdamW> Trainer::makeOptimizer(bool all) const {
  std::vector<at::Tensor> params;
  for (size_t i = 0; i < trainable_.size(); i++)
    if (all || !group_ || owner_[i] == group_->rank()) params.push_back(trainable_[i].second);
  // Full sharding: this rank's pieces of the parameters (the replicated ones alone with `all`).
  if (!all && shardsParameters())
    for (const ShardedModel::Piece& piece : sharded_->pieces()) params.push_back(piece.view);
  return optimizerOver(params);
}

std::unique_ptr<torch::optim::AdamW> Trainer::optimizerOver(const std::vector<at::Tensor>& params) const {
  return std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(0.0)
                                                           .betas({cfg_.adamw.beta1, cfg_.adamw.beta2})
                                                           .eps(cfg_.adamw.eps)
                                                           .weight_decay(cfg_.adamw.weightDecay));
}

Trainer::~Trainer() = default;

StepStats Trainer::forwardBackward(const std::vector<TrainRow>& rows, const LossConfig& loss) {
  validateLossConfig(loss);
  if (!model->hasWeights() && !sharded_)
    throw std::runtime_error("the model was built without weights: only a fully sharded trainer fills and trains it");
  if (loss.klBeta > 0 && !lora_ && !reference_)
    throw std::runtime_error(
        "klBeta > 0 needs a reference policy: create the trainer with reference: true (or use LoRA)");
  StepStats st;
  // Validate every row and count loss tokens and samples first: the normaliser spans all rows.
  std::vector<PreparedRow> prepared;
  int64_t lossTokens = 0, samples = 0, ceTokens = 0;
  for (size_t r = 0; r < rows.size(); r++) {
    prepared.push_back(prepareRow(rows[r], r, loss, *model));
    st.tokens += int64_t(rows[r].ids.size());
    lossTokens += prepared.back().lossTokens;
    samples += prepared.back().samples;
    ceTokens += prepared.back().ceTokens;
  }
  int64_t stepTokens = st.tokens;  // the aux loss's row weights: row tokens / step tokens
  if (group_) {
    // The normaliser is the whole step's (every rank's rows), as one trainer would count it.
    at::Tensor counts = at::tensor(std::vector<int64_t>{lossTokens, samples, stepTokens, ceTokens},
                                   at::TensorOptions().dtype(at::kLong));
    group_->allReduceSum(counts);
    lossTokens = counts[0].item<int64_t>();
    samples = counts[1].item<int64_t>();
    stepTokens = counts[2].item<int64_t>();
    ceTokens = counts[3].item<int64_t>();
  }
  const double norm = resolveNormalizer(loss, lossTokens, samples);
  const double ceNorm = resolveCeNormalizer(loss, ceTokens);
  if (!(loss.routerAuxLossCoef >= 0)) throw std::runtime_error("routerAuxLossCoef must be >= 0");
  // Full sharding: every rank runs as many forward/backward passes as the rank with the most
  // rows, so all issue the same collectives.
  int64_t passes = 0, idlePasses = 0;
  for (const TrainRow& row : rows) passes += row.ids.size() >= 2;
  if (sharded_) {
    at::Tensor most = at::tensor(std::vector<int64_t>{passes}, at::TensorOptions().dtype(at::kLong));
    group_->allReduceMax(most);
    idlePasses = most.item<int64_t>() - passes;
  }
  const std::vector<int64_t>& sparse = model->sparseLayers();
  // Expert load over the step: (token, slot) pairs per expert, per sparse layer.
  std::vector<at::Tensor> load;
  for (int64_t l : sparse) load.push_back(at::zeros({model->numExperts(l)}, at::TensorOptions().dtype(at::kLong)));
  double auxSum = 0;  // sum over rows of aux loss x row tokens / step tokens
  DeviceLossSums deviceSums;
  for (size_t r = 0; r < rows.size(); r++) {
    const TrainRow& row = rows[r];
    LossInputs& in = prepared[r].in;
    const int64_t N = int64_t(row.ids.size());
    if (N < 2) continue;
    const at::Tensor &ids = prepared[r].ids, &pos = prepared[r].pos;
    const at::Tensor targets = lossRows(ids.narrow(0, 1, N - 1), prepared[r]);
    const std::vector<int64_t>& starts = prepared[r].starts;
    MoeRouting routing;
    routing.keepLogits = !sparse.empty();
    if (!row.routes.empty()) routing.replay = replayRoutes(row, r);
    // Mixed precision: the forward under bf16 autocast; the backward (outside it, as PyTorch
    // advises) replays the dtypes the forward recorded.
    std::optional<AutocastGuard> autocast;
    autocast.emplace(model->device, cfg_.mixedPrecision);
    at::Tensor hidden;
    {
      RECORD_USER_SCOPE("prime::row_forward");  // named scopes of a profiled step (profile.h)
      hidden = model->forwardPacked(ids, pos, starts, nullptr, lora_.get(), &rng_, sparse.empty() ? nullptr : &routing,
                                    cfg_.activationCheckpointing);
    }
    // The chunked LM head: logp carries the graph; entropy is the metric only.
    TokenStats ts;
    {
      RECORD_USER_SCOPE("prime::row_lm_head");
      ts = model->tokenStats(lossRows(hidden.narrow(0, 0, N - 1), prepared[r]), targets, loss.temperature);
    }
    in.logp = ts.logp;
    in.entropy = ts.entropy.detach();
    if (loss.klBeta > 0) {
      at::NoGradGuard noGrad;
      // The reference: the frozen copy, or with LoRA the base model (adapters off).
      const Model& ref = reference_ ? *reference_ : *model;
      const at::Tensor refHidden = ref.forwardPacked(ids, pos, starts).narrow(0, 0, N - 1);
      in.refLogp = ref.tokenStats(lossRows(refHidden, prepared[r]), targets, loss.temperature).logp;
    }
    at::Tensor rowLoss = policyLoss(loss, in, norm, deviceSums, ceNorm);
    if (!sparse.empty()) {
      const double weight = double(N) / double(std::max<int64_t>(stepTokens, 1));
      at::Tensor aux = routerAuxLoss(routing);
      auxSum += aux.item<double>() * weight;
      if (loss.routerAuxLossCoef > 0) rowLoss = rowLoss + aux * (loss.routerAuxLossCoef * weight);
      for (size_t i = 0; i < sparse.size(); i++)
        load[i] += at::bincount(routing.experts[sparse[i]].reshape(-1).cpu(), {}, load[i].size(0));
    }
    autocast.reset();
    RECORD_USER_SCOPE("prime::row_backward");
    rowLoss.backward();
  }
  if (idlePasses > 0) {
    // Their zero gradients count for nothing: a parameter without a gradient keeps none.
    std::vector<bool> had;
    for (auto& [name, p] : trainable_) had.push_back(p.grad().defined());
    if (sharded_) sharded_->countGradients(false);
    for (int64_t k = 0; k < idlePasses; k++) idlePass(loss);
    if (sharded_) sharded_->countGradients(true);
    for (size_t i = 0; i < trainable_.size(); i++)
      if (!had[i]) trainable_[i].second.mutable_grad().reset();
  }
  double expertLoadMax = 0, expertLoadMean = 0;
  if (!sparse.empty()) {
    at::Tensor counts = at::cat(load);
    if (group_) {
      at::Tensor aux = at::tensor(std::vector<double>{auxSum}, at::TensorOptions().dtype(at::kDouble));
      group_->allReduceSum(aux);
      group_->allReduceSum(counts);
      auxSum = aux.item<double>();
    }
    expertLoadMax = double(counts.max().item<int64_t>());
    expertLoadMean = double(counts.sum().item<int64_t>()) / double(counts.numel());
  }
  LossSums sums = deviceSums.read();  // the step's one read of the loss metrics
  if (group_) {
    // Every rank's sums (its loss share is already divided by the global normaliser).
    at::Tensor f = at::tensor(
        std::vector<double>{sums.loss, sums.entropy, sums.mismatchKl, sums.maskedMismatchKl, sums.referenceKl},
        at::TensorOptions().dtype(at::kDouble));
    at::Tensor n = at::tensor(std::vector<int64_t>{sums.lossTokens, sums.samples, sums.maskedTokens, sums.maskedSamples,
                                                   sums.clippedTokens, sums.maskedLow, sums.maskedHigh,
                                                   sums.maskedAdvPositive, sums.maskedAdvNegative, st.tokens},
                              at::TensorOptions().dtype(at::kLong));
    group_->allReduceSum(f);
    group_->allReduceSum(n);
    double* fd = f.data_ptr<double>();
    int64_t* nd = n.data_ptr<int64_t>();
    sums.loss = fd[0], sums.entropy = fd[1], sums.mismatchKl = fd[2], sums.maskedMismatchKl = fd[3];
    sums.referenceKl = fd[4];
    sums.lossTokens = nd[0], sums.samples = nd[1], sums.maskedTokens = nd[2], sums.maskedSamples = nd[3];
    sums.clippedTokens = nd[4], sums.maskedLow = nd[5], sums.maskedHigh = nd[6], sums.maskedAdvPositive = nd[7];
    sums.maskedAdvNegative = nd[8], st.tokens = nd[9];
  }
  st.metrics = lossMetrics(sums);
  st.metrics.set("tokens", double(st.tokens));
  if (!sparse.empty()) {
    // The objective that was differentiated; the router's load-balancing loss (token-weighted mean
    // over rows), and the (token, slot) pairs each expert of each sparse layer received over the
    // step: the largest count and the mean (tokens x K / experts).
    st.metrics.set("loss", st.metrics.get("loss") + loss.routerAuxLossCoef * auxSum);
    st.metrics.set("router_aux_loss", auxSum);
    st.metrics.set("expert_load_max", expertLoadMax);
    st.metrics.set("expert_load_mean", expertLoadMean);
  }
  return st;
}

StepStats Trainer::step(const std::vector<TrainRow>& rows, const LossConfig& loss, double lr, double maxGradNorm) {
  const auto t0 = std::chrono::steady_clock::now();
  if (group_) group_->resetStats();  // this step's collectives from here on
  {
    RECORD_USER_SCOPE("prime::zero_grads");
    zeroGrads();
  }
  StepStats st = forwardBackward(rows, loss);
  st.forwardBackwardSeconds = since(t0);
  const auto t1 = std::chrono::steady_clock::now();
  if (group_) syncGradients();
  if (shardsParameters()) sharded_->finishGradients();
  // Total L2 norm over all gradients (as torch.nn.utils.clip_grad_norm_).
  double norm;
  {
    RECORD_USER_SCOPE("prime::grad_norm");
    norm = globalGradNorm();
  }
  st.metrics.set("grad_norm", norm);  // before clipping
  // Clipping is applied inside the AdamW pass (on the CPU the gradients stay as computed; CUDA's
  // fused AdamW may leave them clipped: adamw.h).
  const double clip = maxGradNorm > 0 && norm > maxGradNorm ? maxGradNorm / (norm + 1e-6) : 1.0;
  for (auto& group : optim_->param_groups()) static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
  {
    RECORD_USER_SCOPE("prime::adamw");
    adamwStep(*optim_, clip);
  }
  model->noteWeightsChanged();  // a generator on this model must not reuse K/V of the old weights
  if (group_) broadcastParameters();
  if (shardsParameters()) sharded_->stepped();
  if (group_) {
    const DistStats comm = group_->takeStats();
    st.commSeconds = comm.busySeconds;
    st.commExposedSeconds = comm.waitSeconds;
  }
  step_++;
  st.lr = lr;
  st.optimizerSeconds = since(t1);
  timed(st, since(t0));
  return st;
}

double Trainer::globalGradNorm() {
  std::vector<at::Tensor> grads;
  for (auto& [name, p] : trainable_)
    if (p.grad().defined()) grads.push_back(p.grad());
  const double replicated = gradNorm(grads);
  if (!shardsParameters()) return replicated;
  // The shards' squares summed over ranks; the replicated gradients are the same on every rank.
  at::Tensor sq = at::tensor(std::vector<double>{sharded_->gradSquareSum()}, at::TensorOptions().dtype(at::kDouble));
  group_->allReduceSum(sq);
  return std::sqrt(sq.item<double>() + replicated * replicated);
}

StepStats Trainer::gradients(const std::vector<TrainRow>& rows, const LossConfig& loss,
                             std::vector<std::pair<std::string, at::Tensor>>& grads) {
  // With a group: the loss over every rank's rows, the gradients of this rank's rows only.
  zeroGrads();
  const auto t0 = std::chrono::steady_clock::now();
  StepStats st = forwardBackward(rows, loss);
  st.forwardBackwardSeconds = since(t0);
  timed(st, st.forwardBackwardSeconds);
  for (auto& [name, p] : trainable_)
    grads.emplace_back(name, p.grad().defined() ? p.grad().clone() : at::zeros_like(p));
  if (shardsParameters()) {
    // Summed over every rank's rows (the reduce-scatters), gathered unit by unit.
    sharded_->finishGradients();
    for (size_t u = 0; u < plan_.units.size(); u++)
      for (auto& named : sharded_->gather(u, /*gradients=*/true)) grads.push_back(std::move(named));
  }
  zeroGrads();
  return st;
}

void Trainer::score(const std::vector<int64_t>& ids, const std::vector<int64_t>& pos, double temperature,
                    std::vector<float>& logprobs, std::vector<float>& entropies) const {
  model->scoreRow(ids, pos, temperature, logprobs, entropies, lora_.get());
  if (sharded_) sharded_->releaseAll();
}

std::vector<std::pair<std::string, at::Tensor>> Trainer::policyWeights() {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (size_t u = 0; u < weightUnits(); u++)
    for (auto& named : weightUnit(u)) out.push_back(std::move(named));
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> Trainer::weightUnit(size_t unit) {
  at::NoGradGuard noGrad;
  std::vector<std::pair<std::string, at::Tensor>> out;
  if (sharded_) out = sharded_->gather(unit, /*gradients=*/false);
  else {
    const auto named = model->namedParameters();
    for (size_t p : plan_.units.at(unit).params) out.emplace_back(named[p].first, named[p].second.detach().clone());
  }
  if (lora_) {
    std::map<std::string, const LoraAdapters::Adapter*> byName;
    for (auto& [w, a] : lora_->byWeight) byName[a.module + ".weight"] = &a;
    for (auto& [name, t] : out) {
      auto it = byName.find(name);
      if (it != byName.end()) t.add_(at::mm(it->second->B, it->second->A), lora_->scale());
    }
  }
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> Trainer::adapters() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  if (lora_)
    for (auto& [name, p] : trainable_) out.emplace_back(name, p.detach().clone());
  return out;
}

void Trainer::save(const std::string& dir) {
  // Sharded: every rank has written its shards (lib/trainer/shards.ts) once all are here.
  if (shardsParameters()) group_->barrier();
  std::unique_ptr<torch::optim::AdamW> gathered = group_ ? gatherOptimizer() : nullptr;
  if (group_ && group_->rank() != 0) return;  // rank 0 alone writes
  fs::create_directories(dir);
  torch::serialize::OutputArchive ar;
  ar.write("step", at::tensor(step_), /*is_buffer=*/true);
  // Only what training changes: with LoRA the adapters (the base comes from the model folder).
  ar.write("lora_rank", at::tensor(cfg_.lora.rank), true);
  ar.write("num_params", at::tensor(int64_t(trainable_.size())), true);
  // Archive keys may not contain '.', so parameters are stored by index (trainable_ order).
  for (size_t i = 0; i < trainable_.size(); i++) ar.write("p" + std::to_string(i), trainable_[i].second.detach(), true);
  torch::serialize::OutputArchive opt;
  (gathered ? *gathered : *optim_).save(opt);
  ar.write("optimizer", opt);
  ar.write("rng", rng_.get_state(), true);
  if (shardsParameters()) {
    // The parameters and their AdamW moments are in the shard files; their step counts here.
    ar.write("sharded_params", at::tensor(int64_t(plan_.params.size())), true);
    ar.write("sharded_steps", at::tensor(sharded_->steps()), true);
  }
  // Write a temp file, sync, then rename: a crash never leaves a half-written trainer.ckpt.
  const std::string path = checkpointPath(dir), tmp = path + ".tmp";
  saveArchiveFile(ar, tmp);
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    throw std::runtime_error("cannot rename '" + tmp + "' to '" + path + "'");
  fsyncPath(dir, O_RDONLY | O_DIRECTORY);
}

void Trainer::load(const std::string& dir) {
  const std::string path = checkpointPath(dir);
  std::map<size_t, Staged> staged;  // stageShard's units serve this load only
  staged.swap(staged_);
  if (!fs::exists(path)) throw std::runtime_error("no checkpoint at '" + path + "'");
  // The whole parameters a plain checkpoint holds: trainable_'s, or, where this trainer shards
  // them, the model's (a checkpoint of world size 1 or ZeRO-1, resharded here, read on the host).
  std::vector<std::pair<std::string, std::vector<int64_t>>> expected;
  for (auto& [name, p] : trainable_) expected.emplace_back(name, p.sizes().vec());
  if (shardsParameters())
    for (const ShardPlan::Param& pp : plan_.params) expected.emplace_back(pp.name, pp.shape);
  const at::Device readTo = shardsParameters() ? at::Device(at::kCPU) : model->device;
  std::vector<at::Tensor> weights;
  std::vector<int64_t> steps;  // per model parameter, where they come sharded or are resharded
  bool shardedFile = false;
  at::Tensor step, rng;
  std::unique_ptr<torch::optim::AdamW> stored;
  try {
    // Read and check everything before touching live state, so a bad file changes nothing.
    torch::serialize::InputArchive ar;
    ar.load_from(path, readTo);
    at::Tensor count, rank, sharded;
    ar.read("lora_rank", rank, true);
    if (rank.item<int64_t>() != cfg_.lora.rank)
      throw std::runtime_error("it was written with LoRA rank " + std::to_string(rank.item<int64_t>()) +
                               ", this trainer has rank " + std::to_string(cfg_.lora.rank) + " (0 = full fine-tuning)");
    ar.read("num_params", count, true);
    shardedFile = ar.try_read("sharded_params", sharded, true);
    if (shardedFile) {
      // Written under full sharding: the parameters and their moments are the staged units.
      if (sharded.item<int64_t>() != int64_t(plan_.params.size()) || count.item<int64_t>() != 0)
        throw std::runtime_error("it holds " + std::to_string(sharded.item<int64_t>()) +
                                 " sharded parameters, the model has " + std::to_string(plan_.params.size()));
      for (size_t u = 0; u < plan_.units.size(); u++)
        if (!staged.count(u))
          throw std::runtime_error("its shards of unit '" + plan_.units[u].name + "' were not read");
      at::Tensor s;
      ar.read("sharded_steps", s, true);
      s = s.cpu().contiguous();
      if (s.numel() != int64_t(plan_.params.size()))
        throw std::runtime_error("sharded_steps has " + std::to_string(s.numel()) + " entries");
      steps.assign(s.data_ptr<int64_t>(), s.data_ptr<int64_t>() + s.numel());
      expected.clear();
    } else if (count.item<int64_t>() != int64_t(expected.size())) {
      throw std::runtime_error("it holds " + std::to_string(count.item<int64_t>()) + " parameters, the model has " +
                               std::to_string(expected.size()));
    }
    weights.resize(expected.size());
    for (size_t i = 0; i < expected.size(); i++) {
      ar.read("p" + std::to_string(i), weights[i], true);
      if (weights[i].sizes() != at::IntArrayRef(expected[i].second) || weights[i].scalar_type() != model->dtype)
        throw std::runtime_error("tensor '" + expected[i].first + "' has shape " + c10::str(weights[i].sizes()) +
                                 ", expected " + c10::str(expected[i].second));
    }
    ar.read("step", step, true);
    ar.read("rng", rng, true);
    // The archive's tensors were mapped to the model's device; the RNG state is the CPU
    // generator's byte tensor whatever device wrote or reads it. Set on a scratch generator
    // here, so a bad state is refused before any live state changes.
    rng = rng.cpu();
    at::make_generator<at::CPUGeneratorImpl>().set_state(rng);
    // The whole parameters' optimizer state, keyed by the live parameters (trainable_), or by
    // the tensors read where they are resharded.
    std::vector<at::Tensor> keys;
    for (size_t i = 0; i < weights.size(); i++)
      keys.push_back(i < trainable_.size() ? trainable_[i].second : weights[i]);
    stored = optimizerOver(keys);
    torch::serialize::InputArchive opt;
    ar.read("optimizer", opt);
    stored->load(opt);
  } catch (const c10::Error& e) {
    throw std::runtime_error("checkpoint '" + path + "' is corrupt or incompatible: " + e.what_without_backtrace());
  } catch (const std::exception& e) {
    throw std::runtime_error("checkpoint '" + path + "' is corrupt or incompatible: " + e.what());
  }
  at::NoGradGuard noGrad;
  model->noteWeightsChanged();
  std::unique_ptr<torch::optim::AdamW> live = makeOptimizer();
  // Whole parameters in, and this rank's share of their state (ZeRO-1: its own parameters').
  for (size_t i = 0; i < trainable_.size() && i < weights.size(); i++) {
    trainable_[i].second.copy_(weights[i]);
    auto* st = adamState(*stored, trainable_[i].second);
    if (st && (!group_ || owner_[i] == group_->rank()))
      setAdamState(*live, trainable_[i].second, st->step(), st->exp_avg(), st->exp_avg_sq());
  }
  if (shardsParameters() && !shardedFile) {
    stageWhole(weights, *stored);
    for (const at::Tensor& w : weights) {
      auto* st = adamState(*stored, w);
      steps.push_back(st ? st->step() : 0);
    }
  } else {
    staged_.swap(staged);
  }
  if (!steps.empty()) applyStaged(steps, *live);
  staged_.clear();
  optim_ = std::move(live);
  step_ = step.item<int64_t>();
  rng_.set_state(rng);
}

void Trainer::resetOptimizer() { optim_ = makeOptimizer(); }

}  // namespace prime
