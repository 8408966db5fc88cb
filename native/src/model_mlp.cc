// The block's second half: the output projection and the MLP, dense SwiGLU or Qwen3-MoE's routed
// experts, and the router's load-balancing loss.
#include "model.h"

#include "cpu_matmul.h"

#include <stdexcept>

namespace prime {
// Post-attention half: output projection + residual, then the MLP + residual.
at::Tensor Model::finishBlock(const Layer& L, const at::Tensor& x, const at::Tensor& attn, int64_t layer,
                              const Adapt& ad) const {
  return afterMixer(L, x, project(attn, L.o, L.oBias, ad), layer, ad);
}

at::Tensor Model::afterMixer(const Layer& L, const at::Tensor& x, const at::Tensor& mixed, int64_t layer,
                             const Adapt& ad) const {
  auto [h, m] = kernels().addRmsNorm(x, mixed, normWeight(L.postNorm), cfg.rmsNormEps);
  if (L.sparse()) return h + sparseMlp(L, m, layer, ad);
  const bool fused = fusedUsable(L.gateUp, {&L.gate, &L.up}, ad);
  return h + denseMlp(m, L.gate, L.up, L.down, ad, fused ? L.gateUp : at::Tensor());
}

at::Tensor Model::denseMlp(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& up, const at::Tensor& down,
                           const Adapt& ad, const at::Tensor& gateUp) const {
  const at::Tensor none;
  if (gateUp.defined()) {
    const at::Tensor gu = linearOn(x, gateUp, at::Tensor());  // [N, 2 I]
    return project(kernels().swigluPacked(gu), down, none, ad);
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
  // Qwen3.5-MoE: every token also goes through the shared expert, scaled by its own sigmoid gate.
  if (L.sharedGate.defined())
    out =
        out + at::sigmoid(at::linear(x, L.sharedExpertGate)) * denseMlp(x, L.sharedGate, L.sharedUp, L.sharedDown, ad);
  return out;
}

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

}  // namespace prime
