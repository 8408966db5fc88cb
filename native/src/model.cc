// The model, top to bottom: the forward passes (packed rows for training and scoring, the paged
// cache for generation), logits and token log-probabilities. Its blocks are in model_*.cc: weights
// and LoRA, norms and RoPE, attention, MLP and MoE. Follows Hugging Face's Llama/Qwen2/Qwen3/Qwen3-MoE
// modelling code so that logprobs match a transformers forward to fp32 precision.
#include "model.h"

#include "checkpoint.h"
#include "cpu_matmul.h"
#include "cuda_info.h"
#include "grad_into.h"

#include <torch/version.h>  // TORCH_VERSION_MAJOR: fused attention exists from 2.0

#include <ATen/core/grad_mode.h>  // at::NoGradGuard (not pulled in by ATen.h in libtorch 2.x)

#include <algorithm>
#include <atomic>
#include <cstdio>

namespace prime {
namespace {

// Set once CUDA's variable-length flash attention has failed in this process (packedLayer).
std::atomic<bool> flashVarlenFailed{false};

}  // namespace

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
    const at::Tensor e = embeddingLookup(embed_, ids);  // grad_into.h
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
  if (hybrid()) {
    // The Gated DeltaNet blocks' layout of the samples, and which convolution taps stay inside them.
    seg.chunks = chunkLayout(segStarts, seg.lens, N, device);
    seg.convTaps = convTaps(segStarts, seg.lens, N, cfg.linear.convKernel, device);
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
  if (L.linear()) {  // Gated DeltaNet: no keys and values
    if (kvOut) kvOut->emplace_back();
    return afterMixer(L, x, linearAttentionPacked(L, rmsNorm(x, L.inputNorm), seg, ad), l, ad);
  }
  at::Tensor v, gate;
  auto [q, k] = attentionInputs(L, x, cos, sin, v, l, ad, &gate);
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
      return finishBlock(L, x, gated(o.reshape({x.size(0), H * hd}), gate), l, ad);
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
  return finishBlock(L, x, gated(outs.size() == 1 ? outs[0] : at::cat(outs, 0), gate), l, ad);
}

at::Tensor Model::forwardPaged(const at::Tensor& ids, const PagedBatch& batch, PagedKV& cache, MoeRouting* routing,
                               LinearStates* states) const {
  if (hybrid() && (!states || !batch.slotOf.defined()))
    throw std::runtime_error(cfg.arch + ": a paged forward of a hybrid model needs its state slots (linear_state.h)");
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
    if (L.linear()) {
      x = afterMixer(L, x, linearAttentionPaged(L, l, rmsNorm(x, L.inputNorm), batch, *states), l, noAdapters);
      continue;
    }
    at::Tensor v, gate;
    auto [q, k] = attentionInputs(L, x, cos, sin, v, l, noAdapters, &gate);
    cache.k[l].view({-1, KV * hd}).index_copy_(0, rows, k.reshape({N, KV * hd}));
    cache.v[l].view({-1, KV * hd}).index_copy_(0, rows, v.reshape({N, KV * hd}));
    const at::Tensor o = pagedAttention(q, cache.k[l], cache.v[l], batch);
    x = finishBlock(L, x, gated(o.reshape({N, H * hd}), gate), l, noAdapters);
  }
  return rmsNorm(x, norm_);
}

at::Tensor Model::logits(const at::Tensor& hidden) const {
  return linearOn(hidden, lmHead_.defined() ? lmHead_ : embed_, at::Tensor(), logitsDtype());
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
