// The one translation unit that needs the heavy torch C++ API (optimizer and serialization).
#include "trainer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fcntl.h>
#include <torch/optim/adamw.h>
#include <torch/serialize.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <stdexcept>

namespace prime {
namespace fs = std::filesystem;

namespace {

// Sum of the per-token loss over one row. logp[t] = log pi_theta(token t+1 | prefix), mask[t] =
// token t+1 is a loss token. RL objectives (GRPO/GSPO/CISPO with advantages, inference
// logprobs and importance-ratio correction, DESIGN.md section 4) are added here as new kinds.
at::Tensor tokenLoss(const LossConfig& cfg, const at::Tensor& logp, const at::Tensor& mask) {
  if (cfg.kind == "ce") return -(logp * mask).sum();
  throw std::runtime_error("unknown loss kind '" + cfg.kind + "' (supported: ce)");
}

std::string checkpointPath(const std::string& dir) { return (fs::path(dir) / "trainer.ckpt").string(); }

void fsyncPath(const std::string& path, int flags) {
  int fd = ::open(path.c_str(), flags);
  if (fd < 0) throw std::runtime_error("cannot open '" + path + "' to sync it");
  ::fsync(fd);
  ::close(fd);
}

}  // namespace

Trainer::Trainer(std::shared_ptr<Model> m, AdamWConfig c) : model(std::move(m)), cfg_(c) {
  if (model->dtype == at::kBFloat16)
    throw std::runtime_error("training needs fp32 (or fp64) weights; load the model with dtype float32");
  for (auto& [name, p] : model->namedParameters()) {
    p.requires_grad_(true);
    params_.push_back(p);
  }
  optim_ = makeOptimizer();
}

// lr is set before every step (schedules live in TS), so it starts at 0 here.
std::unique_ptr<torch::optim::AdamW> Trainer::makeOptimizer() const {
  return std::make_unique<torch::optim::AdamW>(
      params_,
      torch::optim::AdamWOptions(0.0).betas({cfg_.beta1, cfg_.beta2}).eps(cfg_.eps).weight_decay(cfg_.weightDecay));
}

Trainer::~Trainer() = default;

StepStats Trainer::forwardBackward(const std::vector<TrainRow>& rows, const LossConfig& loss) {
  if (!(loss.temperature > 0)) throw std::runtime_error("loss temperature must be > 0");
  StepStats st;
  // Validate every row and count loss tokens first: the normaliser spans all micro-batches.
  std::vector<std::vector<int64_t>> starts;
  for (size_t r = 0; r < rows.size(); r++) {
    const TrainRow& row = rows[r];
    if (row.ids.size() != row.pos.size() || row.ids.size() != row.lossMask.size() || row.ids.empty())
      throw std::runtime_error("row " + std::to_string(r) + ": inputIds, positionIds and lossMask need the same non-zero length");
    model->checkTokenIds(row.ids.data(), row.ids.size());
    starts.push_back(segmentStarts(row.pos));
    size_t s = 1;
    for (size_t t = 1; t < row.ids.size(); t++) {
      bool start = s < starts.back().size() && starts.back()[s] == int64_t(t);
      if (start) s++;
      else if (row.lossMask[t]) st.lossTokens++;
    }
    st.tokens += int64_t(row.ids.size());
  }
  const double norm = loss.normalizer > 0 ? loss.normalizer : double(std::max<int64_t>(st.lossTokens, 1));
  const auto longOpts = at::TensorOptions().dtype(at::kLong);
  for (size_t r = 0; r < rows.size(); r++) {
    const TrainRow& row = rows[r];
    const int64_t N = int64_t(row.ids.size());
    if (N < 2) continue;
    at::Tensor ids = at::tensor(row.ids, longOpts).to(model->device);
    at::Tensor pos = at::tensor(row.pos, longOpts).to(model->device);
    // mask[t] for target t+1: a loss token that is not the first token of a sample.
    std::vector<uint8_t> m(row.lossMask.begin() + 1, row.lossMask.end());
    for (int64_t s : starts[r])
      if (s > 0) m[s - 1] = 0;
    at::Tensor mask = at::tensor(std::vector<double>(m.begin(), m.end()), at::TensorOptions().dtype(at::kDouble))
                          .to(model->device, model->logitsDtype());
    at::Tensor hidden = model->forwardPacked(ids, pos, starts[r]);
    at::Tensor lp = at::log_softmax(model->logits(hidden.narrow(0, 0, N - 1)) / loss.temperature, -1);
    at::Tensor logp = lp.gather(1, ids.narrow(0, 1, N - 1).unsqueeze(1)).squeeze(1);
    at::Tensor rowLoss = tokenLoss(loss, logp, mask);
    (rowLoss / norm).backward();
    st.loss += rowLoss.item<double>() / norm;
  }
  return st;
}

StepStats Trainer::step(const std::vector<TrainRow>& rows, const LossConfig& loss, double lr, double maxGradNorm) {
  auto t0 = std::chrono::steady_clock::now();
  optim_->zero_grad();
  StepStats st = forwardBackward(rows, loss);
  // Total L2 norm over all gradients (as torch.nn.utils.clip_grad_norm_), clipped in place.
  std::vector<at::Tensor> norms;
  for (const at::Tensor& p : params_)
    if (p.grad().defined()) norms.push_back(p.grad().norm());
  at::Tensor total = norms.empty() ? at::zeros({}) : at::stack(norms).norm();
  st.gradNorm = total.item<double>();
  if (maxGradNorm > 0 && st.gradNorm > maxGradNorm) {
    const double coef = maxGradNorm / (st.gradNorm + 1e-6);
    at::NoGradGuard noGrad;
    for (const at::Tensor& p : params_)
      if (p.grad().defined()) p.grad().mul_(coef);
  }
  for (auto& group : optim_->param_groups()) static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
  optim_->step();
  step_++;
  st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return st;
}

StepStats Trainer::gradients(const std::vector<TrainRow>& rows, const LossConfig& loss,
                             std::vector<std::pair<std::string, at::Tensor>>& grads) {
  optim_->zero_grad();
  StepStats st = forwardBackward(rows, loss);
  for (auto& [name, p] : model->namedParameters())
    grads.emplace_back(name, p.grad().defined() ? p.grad().clone() : at::zeros_like(p));
  optim_->zero_grad();
  return st;
}

void Trainer::save(const std::string& dir) const {
  fs::create_directories(dir);
  torch::serialize::OutputArchive ar;
  ar.write("step", at::tensor(step_), /*is_buffer=*/true);
  const auto named = model->namedParameters();
  ar.write("num_params", at::tensor(int64_t(named.size())), true);
  // Archive keys may not contain '.', so parameters are stored by index (HF order).
  for (size_t i = 0; i < named.size(); i++) ar.write("p" + std::to_string(i), named[i].second.detach(), true);
  torch::serialize::OutputArchive opt;
  optim_->save(opt);
  ar.write("optimizer", opt);
  {
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    ar.write("cpu_rng", gen.get_state(), true);
  }
  // Write a temp file, sync, then rename: a crash never leaves a half-written trainer.ckpt.
  const std::string path = checkpointPath(dir), tmp = path + ".tmp";
  ar.save_to(tmp);
  fsyncPath(tmp, O_RDONLY);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) throw std::runtime_error("cannot rename '" + tmp + "' to '" + path + "'");
  fsyncPath(dir, O_RDONLY | O_DIRECTORY);
}

void Trainer::load(const std::string& dir) {
  const std::string path = checkpointPath(dir);
  if (!fs::exists(path)) throw std::runtime_error("no checkpoint at '" + path + "'");
  const auto named = model->namedParameters();
  std::vector<at::Tensor> weights(named.size());
  at::Tensor step, rng;
  std::unique_ptr<torch::optim::AdamW> fresh = makeOptimizer();
  try {
    // Read and check everything before touching live state, so a bad file changes nothing.
    torch::serialize::InputArchive ar;
    ar.load_from(path, model->device);
    at::Tensor count;
    ar.read("num_params", count, true);
    if (count.item<int64_t>() != int64_t(named.size()))
      throw std::runtime_error("it holds " + std::to_string(count.item<int64_t>()) + " parameters, the model has " +
                               std::to_string(named.size()));
    for (size_t i = 0; i < named.size(); i++) {
      ar.read("p" + std::to_string(i), weights[i], true);
      if (weights[i].sizes() != named[i].second.sizes() || weights[i].scalar_type() != named[i].second.scalar_type())
        throw std::runtime_error("tensor '" + named[i].first + "' has shape " + c10::str(weights[i].sizes()) +
                                 ", expected " + c10::str(named[i].second.sizes()));
    }
    ar.read("step", step, true);
    ar.read("cpu_rng", rng, true);
    torch::serialize::InputArchive opt;
    ar.read("optimizer", opt);
    fresh->load(opt);
  } catch (const c10::Error& e) {
    throw std::runtime_error("checkpoint '" + path + "' is corrupt or incompatible: " + e.what_without_backtrace());
  } catch (const std::exception& e) {
    throw std::runtime_error("checkpoint '" + path + "' is corrupt or incompatible: " + e.what());
  }
  {
    at::NoGradGuard noGrad;
    for (size_t i = 0; i < named.size(); i++) named[i].second.copy_(weights[i]);
  }
  optim_ = std::move(fresh);
  step_ = step.item<int64_t>();
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(rng);
}

}  // namespace prime
