// Gated DeltaNet (Qwen3.5's linear attention): the token mixer of a hybrid model's linear blocks.
//
//   qkv = conv(in_proj_qkv h)  a causal depthwise convolution of kernel K over time, then SiLU
//   q, k = l2norm(q), l2norm(k); q /= sqrt(dk)         (Hk heads, each serving Hv / Hk v heads)
//   beta = sigmoid(in_proj_b h), g = -exp(A_log) softplus(in_proj_a h + dt_bias)   (per v head)
//   S_t = exp(g_t) S_{t-1} + k_t beta_t (v_t - S~_t^T k_t)^T,  S~_t = exp(g_t) S_{t-1}   [dk, dv]
//   o_t = S_t^T q_t;  out = out_proj(rmsnorm(o) * w * silu(in_proj_z h))
//
// The delta rule runs in fp32 (fp64 for fp64 models) whatever the compute dtype, as transformers'
// and flash-linear-attention's. Two forms of the same recurrence: the chunked one (prefill and
// training: per chunk of 64 positions, the rule's updates condensed into matmuls by a triangular
// solve, then one state update per chunk), and the recurrent one (decode: one step per token).
// Packed rows restart the convolution window and the state at every sample; a paged forward reads
// and writes each sequence's state slot (linear_state.h).
#include "model.h"

#include "autocast.h"

#include <cmath>
#include <stdexcept>

namespace prime {
namespace {

constexpr int64_t kChunk = 64;  // positions per chunk of the chunked rule (FLA's and transformers')

// Causal depthwise convolution of x [L, C] with w [C, 1, K] after `window` [C, K - 1] (the inputs
// before x; undefined: zeros), SiLU applied: out[t] = silu(sum_i w[:, i] xw[t + i]) with xw = window
// then x (transformers' conv1d with padding K - 1). `next` receives the window after x.
at::Tensor causalConv(const at::Tensor& x, const at::Tensor& w, const at::Tensor& window, at::Tensor* next) {
  const int64_t L = x.size(0), C = x.size(1), K = w.size(2);
  const at::Tensor before = window.defined() ? window.t().to(x.scalar_type()) : at::zeros({K - 1, C}, x.options());
  const at::Tensor xw = at::cat({before, x}, 0);               // [L + K - 1, C]
  const at::Tensor wt = w.squeeze(1).t().to(x.scalar_type());  // [K, C]
  at::Tensor out = xw.narrow(0, 0, L) * wt[0];
  for (int64_t i = 1; i < K; i++) out = out + xw.narrow(0, i, L) * wt[i];
  if (next) *next = xw.narrow(0, L, K - 1).t();  // [C, K - 1]
  return at::silu(out);
}

// x / sqrt(sum(x^2) + eps) over the last dimension (transformers' and FLA's l2norm).
at::Tensor l2norm(const at::Tensor& x) { return x * at::rsqrt(x.pow(2).sum(-1, /*keepdim=*/true) + 1e-6); }

// The chunked gated delta rule over one sequence: q, k [L, H, dk] (already l2-normed, q scaled,
// heads expanded to the v heads), v [L, H, dv], g and beta [L, H], all in the rule's dtype; from
// state `S0` [H, dk, dv] (undefined: zeros). Returns o [L, H, dv] and the final state in `S`.
at::Tensor chunkedDeltaRule(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
                            const at::Tensor& beta, const at::Tensor& S0, at::Tensor& S) {
  const int64_t L = q.size(0), H = q.size(1), dk = q.size(2), dv = v.size(2);
  const int64_t pad = (kChunk - L % kChunk) % kChunk, n = (L + pad) / kChunk;
  // [H, n, C, d]; padded positions have k = v = beta = 0 and g = 0: they change neither the
  // outputs of real positions (the rule is causal) nor the state (beta = 0 writes nothing, g = 0
  // decays nothing).
  auto chunks = [&](const at::Tensor& x) {
    at::Tensor t = x.transpose(0, 1);  // [H, L, ...]
    if (pad > 0)
      t = at::constant_pad_nd(t, x.dim() == 3 ? std::vector<int64_t>{0, 0, 0, pad} : std::vector<int64_t>{0, pad});
    return x.dim() == 3 ? t.reshape({H, n, kChunk, x.size(2)}) : t.reshape({H, n, kChunk});
  };
  const at::Tensor qc = chunks(q), kc = chunks(k), vc = chunks(v), gc = chunks(g), bc = chunks(beta);
  const at::Tensor kBeta = kc * bc.unsqueeze(-1), vBeta = vc * bc.unsqueeze(-1);
  const at::Tensor cum = gc.cumsum(-1);  // log of the decay from the chunk's start to each position
  const at::Tensor above = at::ones({kChunk, kChunk}, at::TensorOptions().dtype(at::kBool).device(q.device())).triu(1);
  // decay[i, j] = exp(cum_i - cum_j) for j <= i, 0 above the diagonal.
  const at::Tensor decay = (cum.unsqueeze(-1) - cum.unsqueeze(-2)).masked_fill(above, -INFINITY).exp();
  const at::Tensor kt = kc.transpose(-1, -2);
  // (I + strictly-lower(kBeta k^T * decay)) X = B: the chunk's delta-rule updates in closed form.
  const at::Tensor system = at::matmul(kBeta, kt) * decay;
  const at::Tensor values = at::linalg_solve_triangular(system, vBeta, /*upper=*/false, /*left=*/true,
                                                        /*unitriangular=*/true);
  const at::Tensor keysRead = at::linalg_solve_triangular(system, kBeta * cum.exp().unsqueeze(-1), false, true, true);
  const at::Tensor intra = at::matmul(qc, kt) * decay;  // within-chunk attention, diagonal included
  const at::Tensor qDecayed = qc * cum.exp().unsqueeze(-1);
  const at::Tensor last = cum.narrow(-1, kChunk - 1, 1);  // [H, n, 1]
  const at::Tensor kToEnd = kc * (last - cum).exp().unsqueeze(-1);
  const at::Tensor chunkDecay = last.exp().unsqueeze(-1);  // [H, n, 1, 1]
  S = S0.defined() ? S0 : at::zeros({H, dk, dv}, q.options());
  std::vector<at::Tensor> outs;
  outs.reserve(size_t(n));
  for (int64_t i = 0; i < n; i++) {
    const at::Tensor vNew = values.select(1, i) - at::matmul(keysRead.select(1, i), S);  // [H, C, dv]
    outs.push_back(at::matmul(qDecayed.select(1, i), S) + at::matmul(intra.select(1, i), vNew));
    S = S * chunkDecay.select(1, i) + at::matmul(kToEnd.select(1, i).transpose(-1, -2), vNew);
  }
  const at::Tensor o = (n == 1 ? outs[0] : at::cat(outs, 1)).narrow(1, 0, L);  // [H, L, dv]
  return o.transpose(0, 1);
}

// One recurrent step for a batch of sequences: q, k [B, H, dk], v [B, H, dv], g and beta [B, H]
// in the rule's dtype; S [B, H, dk, dv] is returned updated, o [B, H, dv].
at::Tensor recurrentDeltaStep(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
                              const at::Tensor& beta, at::Tensor& S) {
  S = S * g.exp().unsqueeze(-1).unsqueeze(-1);
  const at::Tensor read = at::matmul(k.unsqueeze(-2), S).squeeze(-2);  // k^T S: [B, H, dv]
  const at::Tensor delta = (v - read) * beta.unsqueeze(-1);
  S = S + k.unsqueeze(-1) * delta.unsqueeze(-2);
  return at::matmul(q.unsqueeze(-2), S).squeeze(-2);
}

}  // namespace

Model::DeltaInputs Model::deltaInputs(const Layer& L, const at::Tensor& convolved, const at::Tensor& b,
                                      const at::Tensor& a) const {
  const LinearAttentionSizes& s = cfg.linear;
  const int64_t N = convolved.size(0), G = s.numValueHeads / s.numKeyHeads;
  const at::ScalarType rule = logitsDtype();  // fp32 (fp64 for fp64 models)
  const at::Tensor x = convolved.to(rule);
  // Each q/k head serves G consecutive v heads.
  auto heads = [&](const at::Tensor& t) {
    return l2norm(t.reshape({N, s.numKeyHeads, s.keyHeadDim})).repeat_interleave(G, 1);
  };
  DeltaInputs in;
  in.q = heads(x.narrow(1, 0, s.keyDim())) * (1.0 / std::sqrt(double(s.keyHeadDim)));
  in.k = heads(x.narrow(1, s.keyDim(), s.keyDim()));
  in.v = x.narrow(1, 2 * s.keyDim(), s.valueDim()).reshape({N, s.numValueHeads, s.valueHeadDim});
  in.beta = at::sigmoid(b).to(rule);
  in.g = -L.linALog.to(rule).exp() * at::softplus(a.to(rule) + L.linDtBias.to(rule));
  return in;
}

at::Tensor Model::linearOutput(const Layer& L, const at::Tensor& o, const at::Tensor& z, const Adapt& ad) const {
  // Qwen3_5RMSNormGated: normalised in fp32, rounded to the compute dtype, times the weight, times
  // silu(z) in fp32, rounded again.
  const at::ScalarType dt = computeDtype(), f = logitsDtype();
  const int64_t N = o.size(0);
  at::Tensor x = o.to(dt).to(f);
  x = x * at::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + cfg.rmsNormEps);
  x = L.linNorm.to(dt) * x.to(dt);
  x = (x * at::silu(z.reshape(o.sizes()).to(f))).to(dt);
  return project(x.reshape({N, -1}), L.linOut, at::Tensor(), ad);
}

at::Tensor Model::linearAttentionPacked(const Layer& L, const at::Tensor& h, const Segments& seg,
                                        const Adapt& ad) const {
  const at::Tensor none;
  const at::Tensor qkv = project(h, L.linQkv, none, ad), z = project(h, L.linZ, none, ad);
  const at::Tensor b = project(h, L.linB, none, ad), a = project(h, L.linA, none, ad);
  // Each sample from a zero state: its own convolution (zeros before its first input) and rule.
  const std::vector<at::Tensor> qkvs = qkv.split_with_sizes(seg.lens), bs = b.split_with_sizes(seg.lens),
                                as = a.split_with_sizes(seg.lens);
  std::vector<at::Tensor> outs;
  for (size_t s = 0; s < seg.lens.size(); s++) {
    const DeltaInputs in = deltaInputs(L, causalConv(qkvs[s], L.linConv, none, nullptr), bs[s], as[s]);
    at::Tensor S;
    outs.push_back(chunkedDeltaRule(in.q, in.k, in.v, in.g, in.beta, none, S));
  }
  return linearOutput(L, outs.size() == 1 ? outs[0] : at::cat(outs, 0), z, ad);
}

at::Tensor Model::linearAttentionPaged(const Layer& L, int64_t layer, const at::Tensor& h, const PagedBatch& batch,
                                       LinearStates& states) const {
  const Adapt noAdapters{nullptr, nullptr, nullptr};
  const at::Tensor none;
  const at::Tensor qkv = at::linear(h, L.linQkv), z = at::linear(h, L.linZ);
  const at::Tensor b = at::linear(h, L.linB), a = at::linear(h, L.linA);
  at::Tensor& convState = states.conv[size_t(layer)];
  at::Tensor& recState = states.recurrent[size_t(layer)];
  std::vector<at::Tensor> outs;
  const int64_t n = batch.decodeRows, K = cfg.linear.convKernel;
  if (n > 0) {
    // Decode rows: one convolution step and one rule step each, from and back into their slots
    // (gather, compute, index_copy_: fixed shapes, no host reads; a CUDA graph captures them).
    const at::Tensor slots = batch.slotOf.narrow(0, 0, n);
    const at::Tensor window = convState.index_select(0, slots);  // [n, C, K - 1]
    const at::Tensor xw =
        at::cat({window, qkv.narrow(0, 0, n).unsqueeze(-1).to(window.scalar_type())}, -1);  // [n, C, K]
    const at::Tensor conv = at::silu((xw * L.linConv.squeeze(1).to(xw.scalar_type())).sum(-1));
    convState.index_copy_(0, slots, xw.narrow(-1, 1, K - 1));
    const DeltaInputs in = deltaInputs(L, conv.to(qkv.scalar_type()), b.narrow(0, 0, n), a.narrow(0, 0, n));
    at::Tensor S = recState.index_select(0, slots);
    outs.push_back(recurrentDeltaStep(in.q, in.k, in.v, in.g, in.beta, S));
    recState.index_copy_(0, slots, S);
  }
  int64_t row = n;
  for (size_t c = 0; c < batch.chunkStart.size(); c++) {
    // A prefill chunk: from its slot's state (zeros at position 0), in pieces ending at its
    // snapshots' positions, each snapshot copied out, the final state back into its slot.
    const int64_t start = batch.chunkStart[c], len = batch.chunkLen[c];
    const at::Tensor slot = batch.slotOf.narrow(0, n + int64_t(c), 1);
    at::Tensor window = start == 0 ? none : convState.index_select(0, slot).squeeze(0);
    at::Tensor S = start == 0 ? none : recState.index_select(0, slot).squeeze(0);
    std::vector<int64_t> ends;
    std::vector<int64_t> snapSlots;
    if (c < batch.snapshots.size())
      for (const StateSnapshot& snap : batch.snapshots[c]) {
        if (snap.position <= start || snap.position > start + len || (!ends.empty() && snap.position <= ends.back()))
          throw std::runtime_error("state snapshot at position " + std::to_string(snap.position) +
                                   " is not inside its prefill chunk [" + std::to_string(start) + ", " +
                                   std::to_string(start + len) + "] in order");
        ends.push_back(snap.position);
        snapSlots.push_back(snap.slot);
      }
    if (ends.empty() || ends.back() != start + len) {
      ends.push_back(start + len);
      snapSlots.push_back(-1);
    }
    int64_t from = start;
    for (size_t p = 0; p < ends.size(); p++) {
      const int64_t r = row + from - start, m = ends[p] - from;
      at::Tensor next;
      const at::Tensor conv = causalConv(qkv.narrow(0, r, m), L.linConv, window, &next);
      const DeltaInputs in = deltaInputs(L, conv, b.narrow(0, r, m), a.narrow(0, r, m));
      at::Tensor S1;
      outs.push_back(chunkedDeltaRule(in.q, in.k, in.v, in.g, in.beta, S, S1));
      window = next.to(convState.scalar_type());
      S = S1;
      if (snapSlots[p] >= 0) {
        convState.select(0, snapSlots[p]).copy_(window);
        recState.select(0, snapSlots[p]).copy_(S);
      }
      from = ends[p];
    }
    convState.index_copy_(0, slot, window.unsqueeze(0));
    recState.index_copy_(0, slot, S.unsqueeze(0));
    row += len;
  }
  const at::Tensor o = outs.size() == 1 ? outs[0] : at::cat(outs, 0);
  return linearOutput(L, o, z, noAdapters);
}

LinearStates Model::linearStates(int64_t numSlots) const {
  LinearStates st;
  st.numSlots = numSlots;
  st.conv.resize(layers_.size());
  st.recurrent.resize(layers_.size());
  const LinearAttentionSizes& s = cfg.linear;
  for (int64_t l : linearLayers_) {
    st.conv[size_t(l)] = at::zeros({numSlots + 1, s.convDim(), s.convKernel - 1}, options().dtype(computeDtype()));
    st.recurrent[size_t(l)] =
        at::zeros({numSlots + 1, s.numValueHeads, s.keyHeadDim, s.valueHeadDim}, options().dtype(logitsDtype()));
  }
  return st;
}

int64_t LinearStates::slotBytes() const {
  int64_t bytes = 0;
  for (const std::vector<at::Tensor>* v : {&conv, &recurrent})
    for (const at::Tensor& t : *v)
      if (t.defined()) bytes += t.numel() / t.size(0) * int64_t(t.element_size());
  return bytes;
}

void LinearStates::copySlot(int64_t from, int64_t to) {
  for (std::vector<at::Tensor>* v : {&conv, &recurrent})
    for (at::Tensor& t : *v)
      if (t.defined()) t.select(0, to).copy_(t.select(0, from));
}

void LinearStates::copySlots(const at::Tensor& from, const at::Tensor& to) {
  for (std::vector<at::Tensor>* v : {&conv, &recurrent})
    for (at::Tensor& t : *v)
      if (t.defined()) t.index_copy_(0, to, t.index_select(0, from));
}

}  // namespace prime
