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
  KVCache& cache;
  at::Tensor input;              // [2, slots] int64 on the device: the step's ids, then positions
  c10::cuda::CUDAStream stream;  // where graphs are captured (never the default stream)
  c10::cuda::MempoolId_t pool;   // shared by every graph
  std::map<std::pair<int64_t, int64_t>, std::unique_ptr<Graph>> graphs;

  Impl(std::shared_ptr<Model> m, KVCache& c)
      : model(std::move(m)), cache(c),
        input(at::zeros({2, c.slots}, at::TensorOptions().dtype(at::kLong).device(model->device))),
        stream(c10::cuda::getStreamFromPool(false, model->device.index())), pool(at::cuda::graph_pool_handle()) {}

  at::Tensor step(int64_t batch, int64_t keys) const {
    return model->decode(input[0].narrow(0, 0, batch), input[1].narrow(0, 0, batch), keys, cache);
  }

  Graph& capture(int64_t batch, int64_t keys) {
    auto g = std::make_unique<Graph>();
    // Deliberate host syncs, once per graph: the capture stream starts after all work queued on
    // the current stream (the inputs just copied), and the current one goes on after the capture.
    c10::cuda::getCurrentCUDAStream(model->device.index()).synchronize();
    {
      c10::cuda::CUDAStreamGuard onCapture(stream);
      step(batch, keys);  // warm-up on the capture stream: lazy set-up (cuBLAS workspaces) stays out of the graph
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

DecodeGraphs::DecodeGraphs(std::shared_ptr<Model> model, KVCache& cache) {
  const std::string why = unsupported(*model);
  if (!why.empty()) throw std::runtime_error("CUDA graphs: " + why);
  impl_ = std::make_unique<Impl>(std::move(model), cache);
}

at::Tensor DecodeGraphs::decode(const std::vector<int64_t>& ids, const std::vector<int64_t>& pos, int64_t keys) {
  Impl& m = *impl_;
  const int64_t n = int64_t(ids.size()), slots = m.cache.slots;
  if (n < 1 || n > slots || pos.size() != ids.size()) throw std::runtime_error("decode graph: bad batch");
  const int64_t batch = decodeBucket(n, 1, slots), keyBucket = decodeBucket(keys, kMinKeys, m.cache.maxLen);
  // Padding rows: token 0 at position 0 (zeros).
  std::vector<int64_t> host(size_t(2 * slots), 0);
  std::copy(ids.begin(), ids.end(), host.begin());
  std::copy(pos.begin(), pos.end(), host.begin() + slots);
  // A synchronous copy from pageable memory (deliberate: 2 x slots integers, and the card is idle
  // here, the previous step having ended with its sampled tokens read back).
  m.input.copy_(at::from_blob(host.data(), {2, slots}, at::TensorOptions().dtype(at::kLong)));
  auto it = m.graphs.find({batch, keyBucket});
  Impl::Graph& g = it != m.graphs.end() ? *it->second : m.capture(batch, keyBucket);
  g.graph.replay();
  return g.logits.narrow(0, 0, n);
}

int64_t DecodeGraphs::captured() const { return int64_t(impl_->graphs.size()); }

#else  // a build without CUDA: unsupported() says why, and nothing constructs one

struct DecodeGraphs::Impl {};

DecodeGraphs::DecodeGraphs(std::shared_ptr<Model> model, KVCache&) {
  throw std::runtime_error("CUDA graphs: " + unsupported(*model));
}

at::Tensor DecodeGraphs::decode(const std::vector<int64_t>&, const std::vector<int64_t>&, int64_t) {
  throw std::runtime_error("CUDA graphs: this build of the addon has no CUDA");
}

int64_t DecodeGraphs::captured() const { return 0; }

#endif

DecodeGraphs::~DecodeGraphs() = default;

}  // namespace prime
