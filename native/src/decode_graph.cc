#include "decode_graph.h"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <utility>

#ifdef PRIME_HAVE_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace prime {

int64_t decodeBucket(int64_t n, int64_t least, int64_t cap) {
  int64_t b = std::max<int64_t>(least, 1);
  while (b < n) b *= 2;
  return std::min(b, cap);
}

std::string DecodeGraphs::unsupported(const Model& model) {
#ifndef PRIME_HAVE_CUDA
  return "this build of the addon has no CUDA (native/cmake/torch.cmake)";
#else
  if (!model.device.is_cuda()) return "the model is not on a CUDA device";
  if (!model.sparseLayers().empty()) return "sparse (MoE) layers count their tokens per expert on the host";
  return "";
#endif
}

#ifdef PRIME_HAVE_CUDA

struct DecodeGraphs::Impl {
  struct Graph {
    at::cuda::CUDAGraph graph;
    at::Tensor logits;  // [batch bucket, V]: the graph's output, rewritten by each replay
  };
  std::shared_ptr<Model> model;
  PagedKV& cache;
  LinearStates* states;
  const int64_t maxRows, width;
  const bool decodeKernel;
  // The static inputs on the device: ids, positions, table rows, state slots (with states; and the
  // row of each token, fixed).
  at::Tensor ids, pos, tables, slots, seqOf;
  at::Tensor padSlots;           // [maxRows] the pad slot: a warm-up's state writes go there
  c10::cuda::CUDAStream stream;  // where graphs are captured (never the default stream)
  c10::cuda::MempoolId_t pool;   // shared by every graph
  std::map<std::pair<int64_t, int64_t>, std::unique_ptr<Graph>> graphs;

  Impl(std::shared_ptr<Model> m, PagedKV& c, LinearStates* st, int64_t rows, int64_t w, bool kernel)
      : model(std::move(m)), cache(c), states(st), maxRows(rows), width(w), decodeKernel(kernel),
        stream(c10::cuda::getStreamFromPool(false, model->device.index())), pool(at::cuda::graph_pool_handle()) {
    const auto longOpts = at::TensorOptions().dtype(at::kLong).device(model->device);
    ids = at::zeros({maxRows}, longOpts);
    pos = at::zeros({maxRows}, longOpts);
    tables = at::full({maxRows, width}, cache.padBlock(), longOpts);
    if (states) {
      slots = at::full({maxRows}, states->padSlot(), longOpts);
      padSlots = slots.clone();
    }
    seqOf = at::arange(maxRows, longOpts);
  }

  // warmUp: the rows' states are not stepped (a decode row updates its slot in place, so running
  // the step twice would advance it twice; writing K/V twice is harmless).
  at::Tensor step(int64_t batch, int64_t keys, bool warmUp = false) const {
    PagedBatch b;
    b.pos = pos.narrow(0, 0, batch);
    b.seqOf = seqOf.narrow(0, 0, batch);
    b.tables = tables.narrow(0, 0, batch);
    b.decodeRows = batch;
    b.decodeKeys = keys;
    b.decodeKernel = decodeKernel;
    if (states) b.slotOf = (warmUp ? padSlots : slots).narrow(0, 0, batch);
    return model->logits(model->forwardPaged(ids.narrow(0, 0, batch), b, cache, nullptr, states));
  }

  Graph& capture(int64_t batch, int64_t keys) {
    auto g = std::make_unique<Graph>();
    // Deliberate host syncs, once per graph: the capture stream starts after all work queued on
    // the current stream (the inputs just copied), and the current one goes on after the capture.
    c10::cuda::getCurrentCUDAStream(model->device.index()).synchronize();
    {
      c10::cuda::CUDAStreamGuard onCapture(stream);
      // Warm-up on the capture stream: lazy set-up (cuBLAS workspaces) stays out of the graph.
      step(batch, keys, /*warmUp=*/true);
      // Thread-local mode: what other threads queue meanwhile (another model's work) is neither
      // captured nor made to fail.
      g->graph.capture_begin(pool, cudaStreamCaptureModeThreadLocal);
      try {
        g->logits = step(batch, keys);
      } catch (...) {
        try {
          g->graph.capture_end();  // ends the (invalidated) capture; its own error is the lesser one
        } catch (...) {
        }
        throw;
      }
      g->graph.capture_end();
      stream.synchronize();
    }
    return *graphs.emplace(std::make_pair(batch, keys), std::move(g)).first->second;
  }
};

DecodeGraphs::DecodeGraphs(std::shared_ptr<Model> model, PagedKV& cache, LinearStates* states, int64_t maxRows,
                           int64_t width, bool decodeKernel) {
  const std::string why = unsupported(*model);
  if (!why.empty()) throw std::runtime_error("CUDA graphs: " + why);
  impl_ = std::make_unique<Impl>(std::move(model), cache, states, maxRows, width, decodeKernel);
}

at::Tensor DecodeGraphs::decode(const at::Tensor& ids, const at::Tensor& pos, const at::Tensor& tables,
                                const at::Tensor& slots, int64_t keys) {
  Impl& m = *impl_;
  const int64_t n = ids.size(0);
  if (n < 1 || n > m.maxRows || pos.size(0) != n || tables.size(0) != n || tables.size(1) != m.width)
    throw std::runtime_error("decode graph: bad batch");
  const int64_t batch = decodeBucket(n, 1, m.maxRows);
  const int64_t keyBucket = decodeBucket(keys, kMinKeys, m.width * m.cache.blockSize);
  // Device-to-device copies queued before the replay (no host sync); the padding rows are reset
  // as a previous, larger batch may have left real rows there.
  m.ids.narrow(0, 0, n).copy_(ids);
  m.pos.narrow(0, 0, n).copy_(pos);
  m.tables.narrow(0, 0, n).copy_(tables);
  if (m.states) m.slots.narrow(0, 0, n).copy_(slots);
  if (batch > n) {
    m.ids.narrow(0, n, batch - n).zero_();
    m.pos.narrow(0, n, batch - n).zero_();
    m.tables.narrow(0, n, batch - n).fill_(m.cache.padBlock());
    if (m.states) m.slots.narrow(0, n, batch - n).fill_(m.states->padSlot());
  }
  auto it = m.graphs.find({batch, keyBucket});
  Impl::Graph& g = it != m.graphs.end() ? *it->second : m.capture(batch, keyBucket);
  g.graph.replay();
  return g.logits.narrow(0, 0, n);
}

int64_t DecodeGraphs::captured() const { return int64_t(impl_->graphs.size()); }

#else  // a build without CUDA: unsupported() says why, and nothing constructs one

struct DecodeGraphs::Impl {};

DecodeGraphs::DecodeGraphs(std::shared_ptr<Model> model, PagedKV&, LinearStates*, int64_t, int64_t, bool) {
  throw std::runtime_error("CUDA graphs: " + unsupported(*model));
}

at::Tensor DecodeGraphs::decode(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t) {
  throw std::runtime_error("CUDA graphs: this build of the addon has no CUDA");
}

int64_t DecodeGraphs::captured() const { return 0; }

#endif

DecodeGraphs::~DecodeGraphs() = default;

}  // namespace prime
