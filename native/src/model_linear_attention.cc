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
// Several sequences run side by side (Model::ChunkLayout, flash-linear-attention's cu_seqlens): a
// packed row's samples, each restarting the convolution window and the state, and a paged forward's
// prefill chunks, each from and into its sequence's state slot (linear_state.h).
#include "model.h"

#include "autocast.h"
#include "cpu_kernels.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

namespace prime {
namespace {

constexpr int64_t kChunk = 64;  // positions per chunk of the chunked rule (FLA's and transformers')

// Causal depthwise convolution of x [L, C] with w [C, 1, K] after `window` [C, K - 1] (the inputs
// before x; undefined: zeros), SiLU applied: out[t] = silu(sum_i w[:, i] xw[t + i]) with xw = window
// then x (transformers' conv1d with padding K - 1). `taps` [L, K - 1] (undefined: all 1) zeroes the
// taps i < K - 1 that reach before a packed row's sample start. `windowed` receives xw [K - 1 + L,
// C]: the window after the first m inputs is windowAfter(xw, m).
at::Tensor causalConv(const at::Tensor& x, const at::Tensor& w, const at::Tensor& window, const at::Tensor& taps,
                      at::Tensor* windowed) {
  const int64_t L = x.size(0), C = x.size(1), K = w.size(2);
  const at::Tensor before = window.defined() ? window.t().to(x.scalar_type()) : at::zeros({K - 1, C}, x.options());
  const at::Tensor xw = at::cat({before, x}, 0);               // [L + K - 1, C]
  const at::Tensor wt = w.squeeze(1).t().to(x.scalar_type());  // [K, C]
  const at::Tensor kept = taps.defined() ? taps.to(x.scalar_type()) : at::Tensor();
  auto tap = [&](int64_t i) {
    const at::Tensor t = xw.narrow(0, i, L);
    return i < K - 1 && kept.defined() ? t * kept.narrow(1, i, 1) : t;
  };
  at::Tensor out = tap(0) * wt[0];
  for (int64_t i = 1; i < K; i++) out = out + tap(i) * wt[i];
  if (windowed) *windowed = xw;
  return at::silu(out);
}

// The convolution window [C, K - 1] after the first m inputs of causalConv's xw.
at::Tensor windowAfter(const at::Tensor& xw, int64_t m, int64_t K) { return xw.narrow(0, m, K - 1).t(); }

// x / sqrt(sum(x^2) + eps) over the last dimension (transformers' and FLA's l2norm).
at::Tensor l2norm(const at::Tensor& x) { return x * at::rsqrt(x.pow(2).sum(-1, /*keepdim=*/true) + 1e-6); }

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

Model::ChunkLayout Model::chunkLayout(const std::vector<int64_t>& starts, const std::vector<int64_t>& lens,
                                      int64_t rows, const at::Device& device) {
  const int64_t B = int64_t(lens.size());
  const size_t n = lens.size();
  std::vector<int64_t> chunksOf(n), order(n), rank(n), first(n, 0);
  for (int64_t b = 0; b < B; b++) {
    chunksOf[size_t(b)] = (lens[size_t(b)] + kChunk - 1) / kChunk;
    order[size_t(b)] = b;
    if (b > 0) first[size_t(b)] = first[size_t(b - 1)] + lens[size_t(b - 1)];
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t x, int64_t y) { return chunksOf[size_t(x)] > chunksOf[size_t(y)]; });
  ChunkLayout lay;
  for (int64_t r = 0; r < B; r++) rank[size_t(order[size_t(r)])] = r;
  for (int64_t i = 0; B > 0 && i < chunksOf[size_t(order[0])]; i++) {
    int64_t a = 0;
    while (a < B && chunksOf[size_t(order[size_t(a)])] > i) a++;
    lay.active.push_back(a);
    lay.chunks += a;
  }
  std::vector<int64_t> slotRow(size_t(lay.chunks * kChunk), rows),
      rowSlot(size_t(B > 0 ? first.back() + lens.back() : 0));
  int64_t chunk = 0;
  for (size_t i = 0; i < lay.active.size(); i++)
    for (int64_t r = 0; r < lay.active[i]; r++, chunk++) {
      const size_t b = size_t(order[size_t(r)]);
      for (int64_t c = 0, p = int64_t(i) * kChunk; c < kChunk && p < lens[b]; c++, p++) {
        slotRow[size_t(chunk * kChunk + c)] = starts[b] + p;
        rowSlot[size_t(first[b] + p)] = chunk * kChunk + c;
      }
    }
  auto onDevice = [&](const std::vector<int64_t>& v) {
    return at::tensor(v, at::TensorOptions().dtype(at::kLong)).to(device);
  };
  lay.slotRow = onDevice(slotRow);
  lay.rowSlot = onDevice(rowSlot);
  lay.order = onDevice(order);
  lay.rank = onDevice(rank);
  return lay;
}

at::Tensor Model::convTaps(const std::vector<int64_t>& starts, const std::vector<int64_t>& lens, int64_t rows,
                           int64_t K, const at::Device& device) {
  std::vector<float> taps(size_t(rows * (K - 1)), 1.f);
  for (size_t s = 0; s < starts.size(); s++)
    for (int64_t u = 0; u < K - 1 && u < lens[s]; u++)  // position u reads x[u - (K - 1) + i] at tap i
      for (int64_t i = 0; i < K - 1 - u; i++) taps[size_t((starts[s] + u) * (K - 1) + i)] = 0.f;
  return at::tensor(taps).view({rows, K - 1}).to(device);
}

at::Tensor Model::chunkedDeltaRule(const DeltaInputs& in, const ChunkLayout& lay, const at::Tensor& S0, at::Tensor* S) {
  const int64_t H = in.q.size(1), dk = in.q.size(2), dv = in.v.size(2), N = lay.chunks;
  // Every input in chunk space, [N, H, C, .], by one gather of the rows; padded positions read a
  // zero row: k = v = beta = 0 and g = 0 change neither the outputs of real positions (the rule is
  // causal) nor the state (beta = 0 writes nothing, g = 0 decays nothing).
  const at::Tensor rows = at::cat({in.q, in.k, in.v, in.g.unsqueeze(-1), in.beta.unsqueeze(-1)}, -1);
  const at::Tensor padded = at::cat({rows, at::zeros({1, H, rows.size(2)}, rows.options())}, 0);
  const at::Tensor x =
      padded.index_select(0, lay.slotRow).view({N, kChunk, H, rows.size(2)}).transpose(1, 2).contiguous();
  const at::Tensor qc = x.narrow(-1, 0, dk), kc = x.narrow(-1, dk, dk), vc = x.narrow(-1, 2 * dk, dv);
  const at::Tensor gc = x.select(-1, 2 * dk + dv), bc = x.select(-1, 2 * dk + dv + 1);  // [N, H, C]
  // Within each chunk, all chunks at once; products with a factor in common go as one matmul.
  const at::Tensor kBeta = kc * bc.unsqueeze(-1), vBeta = vc * bc.unsqueeze(-1);
  const at::Tensor cum = gc.cumsum(-1);  // log of the decay from the chunk's start to each position
  const at::Tensor above = at::ones({kChunk, kChunk}, at::TensorOptions().dtype(at::kBool).device(x.device())).triu(1);
  // decay[i, j] = exp(cum_i - cum_j) for j <= i, 0 above the diagonal.
  const at::Tensor decay = (cum.unsqueeze(-1) - cum.unsqueeze(-2)).masked_fill(above, -INFINITY).exp();
  // kBeta k^T and q k^T, times the decay: the system below and the within-chunk attention.
  const at::Tensor byKeys = at::matmul(at::cat({kBeta, qc}, -2), kc.transpose(-1, -2)).view({N, H, 2, kChunk, kChunk});
  const at::Tensor system = byKeys.select(2, 0) * decay, intra = byKeys.select(2, 1) * decay;
  // (I + strictly-lower(kBeta k^T * decay)) X = B: the chunk's delta-rule updates in closed form,
  // for the values written and for the keys that read the state before the chunk.
  const at::Tensor solved = at::linalg_solve_triangular(system, at::cat({vBeta, kBeta * cum.exp().unsqueeze(-1)}, -1),
                                                        /*upper=*/false, /*left=*/true, /*unitriangular=*/true);
  const at::Tensor values = solved.narrow(-1, 0, dv);
  // Who reads the state before the chunk: those keys (correcting the values), then the queries.
  const at::Tensor readers = at::cat({solved.narrow(-1, dv, dk), qc * cum.exp().unsqueeze(-1)}, -2);  // [N, H, 2C, dk]
  const at::Tensor last = cum.narrow(-1, kChunk - 1, 1);                                              // [N, H, 1]
  const at::Tensor kToEnd = (kc * (last - cum).exp().unsqueeze(-1)).transpose(-1, -2);
  const at::Tensor chunkDecay = last.exp().unsqueeze(-1);  // [N, H, 1, 1]
  // From chunk to chunk: step i's chunks are a slab, its sequences' states the first active[i]
  // (ranks); a sequence's state is final once its rank leaves the steps.
  at::Tensor state =
      S0.defined() ? S0.index_select(0, lay.order) : at::zeros({int64_t(lay.order.size(0)), H, dk, dv}, x.options());
  // Split into the steps' slabs once (one backward node each, not one per slab).
  auto slabs = [&](const at::Tensor& t) { return t.split_with_sizes(lay.active); };
  const std::vector<at::Tensor> readersOf = slabs(readers), valuesOf = slabs(values), intraOf = slabs(intra),
                                kToEndOf = slabs(kToEnd), decayOf = slabs(chunkDecay);
  std::vector<at::Tensor> outs, finals;
  for (size_t i = 0; i < lay.active.size(); i++) {
    const int64_t a = lay.active[i];
    if (a < state.size(0)) {
      finals.push_back(state.narrow(0, a, state.size(0) - a));
      state = state.narrow(0, 0, a);
    }
    const at::Tensor read = at::matmul(readersOf[i], state);           // [a, H, 2C, dv]
    const at::Tensor vNew = valuesOf[i] - read.narrow(-2, 0, kChunk);  // [a, H, C, dv]
    outs.push_back(read.narrow(-2, kChunk, kChunk) + at::matmul(intraOf[i], vNew));
    state = state * decayOf[i] + at::matmul(kToEndOf[i], vNew);
  }
  if (S) {
    finals.push_back(state);
    std::reverse(finals.begin(), finals.end());  // rank order
    *S = at::cat(finals, 0).index_select(0, lay.rank);
  }
  // Back from chunk space to the sequences' positions.
  const at::Tensor o = (outs.size() == 1 ? outs[0] : at::cat(outs, 0)).transpose(1, 2).reshape({N * kChunk, H, dv});
  return o.index_select(0, lay.rowSlot);
}

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
  // Every sample at once, each from a zero state: the convolution's taps stop at its start, the
  // rule runs over its own chunks (seg.convTaps and seg.chunks, laid out once per forward).
  const DeltaInputs in = deltaInputs(L, causalConv(qkv, L.linConv, none, seg.convTaps, nullptr), b, a);
  return linearOutput(L, chunkedDeltaRule(in, seg.chunks, none, nullptr), z, ad);
}

at::Tensor Model::linearAttentionPaged(const Layer& L, int64_t layer, const at::Tensor& h, const PagedBatch& batch,
                                       LinearStates& states) const {
  const Adapt noAdapters{nullptr, nullptr, nullptr};
  const at::Tensor none;
  const at::Tensor qkv = at::linear(h, L.linQkv), z = at::linear(h, L.linZ);
  const at::Tensor b = at::linear(h, L.linB), a = at::linear(h, L.linA);
  at::Tensor& convState = states.conv[size_t(layer)];
  at::Tensor& recState = states.recurrent[size_t(layer)];
  const int64_t n = batch.decodeRows, K = cfg.linear.convKernel;
  const size_t P = batch.chunkStart.size();
  const at::Tensor decodeSlots = n > 0 ? batch.slotOf.narrow(0, 0, n) : none;
  // The convolution. Decode rows: one step each, from and back into their slots (gather, compute,
  // index_copy_: fixed shapes, no host reads; a CUDA graph captures them). Prefill chunks: each
  // from its slot's window (zeros at position 0); their windows go back after the rule.
  std::vector<at::Tensor> convs, windowed(P);
  if (n > 0) {
    const at::Tensor window = convState.index_select(0, decodeSlots);  // [n, C, K - 1]
    const at::Tensor xw =
        at::cat({window, qkv.narrow(0, 0, n).unsqueeze(-1).to(window.scalar_type())}, -1);  // [n, C, K]
    convs.push_back(at::silu((xw * L.linConv.squeeze(1).to(xw.scalar_type())).sum(-1)).to(qkv.scalar_type()));
    convState.index_copy_(0, decodeSlots, xw.narrow(-1, 1, K - 1));
  }
  for (size_t c = 0, row = size_t(n); c < P; row += size_t(batch.chunkLen[c]), c++) {
    const at::Tensor window = batch.chunkStart[c] == 0
                                  ? none
                                  : convState.index_select(0, batch.slotOf.narrow(0, n + int64_t(c), 1)).squeeze(0);
    convs.push_back(causalConv(qkv.narrow(0, int64_t(row), batch.chunkLen[c]), L.linConv, window, none, &windowed[c]));
  }
  const DeltaInputs in = deltaInputs(L, convs.size() == 1 ? convs[0] : at::cat(convs, 0), b, a);
  std::vector<at::Tensor> outs;
  if (n > 0) {  // decode rows: one recurrent step each
    auto first = [&](const at::Tensor& t) { return t.narrow(0, 0, n); };
    if (recState.is_cpu() && recState.scalar_type() == at::kFloat) {
      // On the CPU, in place on the slots (cpu_kernels.h DeltaStepArgs).
      auto rows = [&](const at::Tensor& t) { return first(t).contiguous(); };
      const at::Tensor q = rows(in.q), k = rows(in.k), v = rows(in.v), g = rows(in.g), beta = rows(in.beta);
      const at::Tensor slots = decodeSlots.contiguous();
      at::Tensor o = at::empty_like(v);
      cpu::kernels().deltaStepF32({q.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(), g.data_ptr<float>(),
                                   beta.data_ptr<float>(), slots.data_ptr<int64_t>(), recState.data_ptr<float>(),
                                   o.data_ptr<float>(), n, v.size(1), k.size(2), v.size(2)});
      outs.push_back(o);
    } else {  // CUDA (fixed shapes, no host reads: a CUDA graph captures it) and fp64 models
      at::Tensor S = recState.index_select(0, decodeSlots);
      outs.push_back(recurrentDeltaStep(first(in.q), first(in.k), first(in.v), first(in.g), first(in.beta), S));
      recState.index_copy_(0, decodeSlots, S);
    }
  }
  if (P > 0) outs.push_back(prefillDeltaRule(in, batch, convState, recState, windowed, K));
  const at::Tensor o = outs.size() == 1 ? outs[0] : at::cat(outs, 0);
  return linearOutput(L, o, z, noAdapters);
}

at::Tensor Model::prefillDeltaRule(const DeltaInputs& in, const PagedBatch& batch, at::Tensor& convState,
                                   at::Tensor& recState, const std::vector<at::Tensor>& windowed, int64_t K) const {
  // Each chunk in pieces ending at its snapshots' positions, then at its end; the pieces run in
  // rounds, round p the p-th piece of every chunk that has one, all at once (chunkedDeltaRule over
  // them), from the states the round before left (round 0: the slots', zeros at position 0).
  struct Piece {
    int64_t row, len, end, slot;  // rows [row, row + len); `end` inputs of its chunk done after it
  };
  const int64_t n = batch.decodeRows, rows = in.q.size(0);
  const size_t P = batch.chunkStart.size();
  std::vector<std::vector<Piece>> pieces(P);
  for (size_t c = 0, row = size_t(n); c < P; row += size_t(batch.chunkLen[c]), c++) {
    const int64_t start = batch.chunkStart[c], len = batch.chunkLen[c];
    int64_t from = start;
    if (c < batch.snapshots.size())
      for (const StateSnapshot& snap : batch.snapshots[c]) {
        if (snap.position <= from || snap.position > start + len)
          throw std::runtime_error("state snapshot at position " + std::to_string(snap.position) +
                                   " is not inside its prefill chunk [" + std::to_string(start) + ", " +
                                   std::to_string(start + len) + "] in order");
        pieces[c].push_back({int64_t(row) + from - start, snap.position - from, snap.position - start, snap.slot});
        from = snap.position;
      }
    if (from < start + len) pieces[c].push_back({int64_t(row) + from - start, start + len - from, len, -1});
  }
  const at::Tensor slots = batch.slotOf.narrow(0, n, int64_t(P));
  std::vector<at::Tensor> state(P);  // [H, dk, dv] per chunk
  {
    const at::Tensor fromSlots = recState.index_select(0, slots);
    for (size_t c = 0; c < P; c++) state[c] = batch.chunkStart[c] == 0 ? at::zeros_like(fromSlots[0]) : fromSlots[c];
  }
  at::Tensor o = at::empty({rows - n, in.v.size(1), in.v.size(2)}, in.v.options());
  for (size_t p = 0;; p++) {
    std::vector<size_t> chunks;
    std::vector<int64_t> starts, lens, outRows;
    std::vector<at::Tensor> S0;
    for (size_t c = 0; c < P; c++)
      if (pieces[c].size() > p) {
        const Piece& piece = pieces[c][p];
        chunks.push_back(c);
        starts.push_back(piece.row);
        lens.push_back(piece.len);
        S0.push_back(state[c]);
        for (int64_t r = piece.row; r < piece.row + piece.len; r++) outRows.push_back(r - n);
      }
    if (chunks.empty()) break;
    at::Tensor S;
    const at::Tensor out = chunkedDeltaRule(in, chunkLayout(starts, lens, rows, o.device()), at::stack(S0), &S);
    o.index_copy_(0, at::tensor(outRows, at::TensorOptions().dtype(at::kLong)).to(o.device()), out);
    for (size_t j = 0; j < chunks.size(); j++) {
      const size_t c = chunks[j];
      const Piece& piece = pieces[c][p];
      state[c] = S[int64_t(j)];
      if (piece.slot >= 0) {
        convState.select(0, piece.slot).copy_(windowAfter(windowed[c], piece.end, K));
        recState.select(0, piece.slot).copy_(state[c]);
      }
    }
  }
  std::vector<at::Tensor> windows;
  for (size_t c = 0; c < P; c++)
    windows.push_back(windowAfter(windowed[c], batch.chunkLen[c], K).to(convState.scalar_type()));
  convState.index_copy_(0, slots, at::stack(windows));
  recState.index_copy_(0, slots, at::stack(state));
  return o;
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
