// The decoder skeleton (Llama / Qwen2 / Qwen3 dense, Qwen3-MoE sparse MLPs, Qwen3.5 hybrid blocks) on libtorch:
// weights, packed forward, KV-cache decode. Which HF tensor fills which parameter comes from the family's table in
// TS (lib/model/families), passed in as ParamSpecs: this engine knows slots, not HF names. The forward passes read
// top to bottom in model.cc, their blocks in model_*.cc (weights and LoRA, norms and RoPE, attention, linear
// attention, MLP and MoE); this header is what the generator, trainer and N-API glue need to see.
#pragma once

#include <ATen/ATen.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels.h"
#include "linear_state.h"
#include "lm_head.h"

namespace prime {

// The sizes of `ArchConfig` (lib/model/arch.ts) the computation uses; the optional parts (biases,
// q/k norms, an untied head) are whichever tensors the ParamSpecs provide.
struct ArchConfig {
  std::string arch;  // the family's name, for messages
  int64_t vocabSize = 0, hiddenSize = 0, numLayers = 0;
  int64_t numHeads = 0, numKvHeads = 0, headDim = 0;
  double rmsNormEps = 1e-6, ropeTheta = 10000.0;
  // Sparse MoE blocks (the layers whose table has a router): experts per token (top-k), and
  // whether the top-k routing weights are renormalised to sum to 1.
  int64_t numExpertsPerTok = 0;
  bool normTopkProb = false;
  // Qwen3.5: RMSNorm weights stored as offsets from 1 (x / rms(x) * (1 + w)); RoPE on the first
  // partialRotaryFactor of each head; q_proj rows per head [query; gate], sigmoid(gate) scaling
  // attention's output; and the sizes of its Gated DeltaNet blocks (the layers with a linQkv).
  bool normOffset = false;
  double partialRotaryFactor = 1.0;
  bool attnOutputGate = false;
  LinearAttentionSizes linear;
  int64_t rotaryDim() const { return int64_t(double(headDim) * partialRotaryFactor); }
};

// One row of the family's tensor table: the HF tensor `name` of `shape` fills skeleton slot `slot`
// ("embed", "norm", "lmHead", or a Layer field such as "qBias" of block `layer`; -1 outside blocks).
struct ParamSpec {
  std::string name;
  std::vector<int64_t> shape;
  std::string slot;
  int64_t layer = -1;
  int64_t expert = -1;  // the expert of an "expert*" slot
};

// A tensor as it arrives from JS: raw little-endian bytes, borrowed (copied once into a tensor).
struct RawTensor {
  std::string name;
  std::string dtype;  // F32 | F16 | BF16 | F64
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  size_t nbytes = 0;
};

struct Layer {
  at::Tensor inputNorm, postNorm;         // [D]
  at::Tensor q, k, v, o;                  // [H*hd, D], [KV*hd, D], [KV*hd, D], [D, H*hd]
  at::Tensor qBias, kBias, vBias, oBias;  // optional (undefined = none)
  at::Tensor qNorm, kNorm;                // [hd], optional (Qwen3)
  at::Tensor gate, up, down;              // [I, D], [I, D], [D, I]; dense MLP
  // A sparse MoE MLP instead (Qwen3-MoE): router [E, D] and per expert [Ie, D], [Ie, D], [D, Ie].
  at::Tensor router;
  std::vector<at::Tensor> expertGate, expertUp, expertDown;
  // q, k and v (with their biases, when all three have one) and gate and up as row slices of one
  // tensor each (Model::fuseProjections): the slots above are views into these, so they stay the
  // HF-named parameters, updated in place. A forward that records no gradient for them and has no
  // adapter on them takes one matmul for q/k/v and one for gate/up. Undefined where not fused.
  at::Tensor qkv, qkvBias, gateUp;
  // Qwen3.5-MoE's shared expert (SwiGLU [Is, D], [Is, D], [D, Is]) and its gate [1, D].
  at::Tensor sharedGate, sharedUp, sharedDown, sharedExpertGate;
  // A Gated DeltaNet block instead of attention (Qwen3.5; sizes in ArchConfig::linear): in_proj_qkv
  // [convDim, D], in_proj_z [Hv dv, D], in_proj_b and in_proj_a [Hv, D], the depthwise conv1d
  // [convDim, 1, K], dt_bias and A_log [Hv], the gated RMSNorm [dv], out_proj [D, Hv dv].
  at::Tensor linQkv, linZ, linB, linA, linConv, linDtBias, linALog, linNorm, linOut;
  bool sparse() const { return router.defined(); }
  bool linear() const { return linQkv.defined(); }
};

// The kinds of linear projection of a block, in HF order; LoRA targets them by module name (an
// MoE expert's and shared expert's gate/up/down_proj are of the same kinds, as PEFT matches them by
// suffix); then Gated DeltaNet's (Qwen3.5).
enum Proj : int {
  kQProj,
  kKProj,
  kVProj,
  kOProj,
  kGateProj,
  kUpProj,
  kDownProj,
  kInProjQkv,
  kInProjZ,
  kInProjB,
  kInProjA,
  kOutProj,
  kNumProj
};
const char* projName(int p);  // "q_proj", ..., "down_proj", "in_proj_qkv", ..., "out_proj"

// The names of a block's slots the tensor table may fill (`kLayerSlots`, then the per-expert
// slots): the same list as `LAYER_SLOTS` in lib/model/families/decoder.ts, which a test checks.
std::vector<std::string> layerSlotNames();

// One projection weight of the model: its kind and HF module path, e.g.
// "model.layers.3.mlp.experts.5.up_proj" (its weight's name without ".weight"; PEFT names
// adapters after it).
struct ProjectionRef {
  int kind;
  std::string module;
  at::Tensor weight;
};

// Low-rank adapters on some projections: y = W x + (alpha / rank) * B (A dropout(x)).
struct LoraAdapters {
  int64_t rank = 0;
  double alpha = 0, dropout = 0;
  struct Adapter {
    std::string module;  // ProjectionRef::module
    at::Tensor A, B;     // [rank, in], [out, rank]
  };
  // Keyed by the adapted weight's TensorImpl (weights are updated in place, never replaced).
  std::map<const c10::TensorImpl*, Adapter> byWeight;
  const Adapter* find(const at::Tensor& W) const {
    auto it = byWeight.find(W.unsafeGetTensorImpl());
    return it == byWeight.end() ? nullptr : &it->second;
  }
  double scale() const { return alpha / double(rank); }
};

// The routing of the sparse blocks in one forward (router replay, aux loss, load metrics).
struct MoeRouting {
  // In: per layer, the experts [N, K] (long) each token goes to instead of the router's top-k
  // (router replay; weights still come from the router's probabilities); a row of -1 keeps the
  // router's own choice. Empty = recompute.
  std::vector<at::Tensor> replay;
  // Out, per layer (undefined for dense ones): the router's logits [N, E] when keepLogits (they
  // carry the graph), and the experts chosen [N, K].
  bool keepLogits = false;
  std::vector<at::Tensor> logits, experts;
};

// The paged KV cache, owned by the generator: per layer, the keys and values of numBlocks blocks of
// blockSize positions, [numBlocks + 2, blockSize, KV, hd] (the layout of vLLM's flash-attention
// backend: one position's heads are contiguous, so a token's K/V is one row). Which block holds
// which positions of a sequence is its block table (block_pool.h hands blocks out). Two blocks
// past the pool's: the null block, zeros that are never written, which pads block tables (read
// and masked); and the pad block, which padding rows of a CUDA graph write and nothing reads.
struct PagedKV {
  std::vector<at::Tensor> k, v;
  int64_t numBlocks = 0, blockSize = 0;
  int64_t nullBlock() const { return numBlocks; }
  int64_t padBlock() const { return numBlocks + 1; }
};

// The tokens of one forward over the paged cache. Token t sits at position pos[t] of the sequence
// whose block table is row seqOf[t] of `tables` ([rows, width] long, padded with the null block);
// its K/V go to that position's block, and it attends to positions 0..pos[t] of its sequence. The
// tokens form segments, one per table row in row order: the first `decodeRows` segments hold one
// token each (decode), the others a run of consecutive positions (a prefill chunk).
struct PagedBatch {
  at::Tensor pos, seqOf, tables;  // on the model's device
  int64_t decodeRows = 0;
  int64_t decodeKeys = 0;  // positions the decode rows read: max(pos) + 1 of those rows, or more
  // Per prefill segment (host): its first position and its length.
  std::vector<int64_t> chunkStart, chunkLen;
  double* attentionSeconds = nullptr;  // when set, the CPU's attention time is added to it
  bool decodeKernel = false;           // decode rows through the CUDA paged decode kernel (paged_decode.h)
  // Hybrid models (linear_state.h): the state slot of each table row [rows] (long, on the model's
  // device), and per prefill segment the snapshots to take (may be empty).
  at::Tensor slotOf;
  std::vector<std::vector<StateSnapshot>> snapshots;
};

// Keys and values of one layer for a packed forward, after RoPE: [N, KV, hd].
using LayerKV = std::pair<at::Tensor, at::Tensor>;

// What a forward calls around each stage that reads parameters (fully sharded training, fsdp.h,
// gathers a stage's parameters in enter and frees them in leave). Stages in forward order: the
// embedding (-1), the decoder layers (0 .. numLayers - 1), the final norm (numLayers) and the LM
// head (numLayers + 1, in tokenStats). enter gets the stage's inputs and leave its outputs
// (differentiable tensors; the embedding's enter gets none); what they return stands for them
// (an identity, which may carry the autograd nodes that hook the stage's backward).
class StageHooks {
 public:
  virtual ~StageHooks() = default;
  virtual std::vector<at::Tensor> enter(int64_t stage, std::vector<at::Tensor> inputs) = 0;
  virtual std::vector<at::Tensor> leave(int64_t stage, std::vector<at::Tensor> outputs) = 0;
};

class Model {
 public:
  // Fills the slots named by `specs` (in their order, which is the checkpoint order) from `tensors`.
  Model(ArchConfig cfg, std::vector<ParamSpec> specs, const std::vector<RawTensor>& tensors, at::ScalarType dtype,
        at::Device device);

  // Copies new values into the live parameters (same shapes), e.g. for update_weights. With
  // strict, every parameter must be given; otherwise a subset is fine.
  void loadWeights(const std::vector<RawTensor>& tensors, bool strict);
  // Parameters by HF name, in checkpoint order.
  std::vector<std::pair<std::string, at::Tensor>> namedParameters() const;
  int64_t numParameters() const;

  // A model whose parameters have their shapes and no memory yet: a fully sharded trainer fills
  // its shards (Trainer::loadBaseShard) and computes through its stage hooks; nothing else can.
  static std::shared_ptr<Model> withoutWeights(ArchConfig cfg, std::vector<ParamSpec> specs, at::ScalarType dtype,
                                               at::Device device);
  bool hasWeights() const { return hasWeights_; }

  // A deep copy of the weights that shares nothing with this model (a frozen KL reference).
  std::unique_ptr<Model> copy() const;
  // Every projection weight (LoRA targets), in checkpoint order.
  std::vector<ProjectionRef> projections() const;
  // The expert count of a layer's sparse MLP (0 for dense layers), and the sparse layers in order.
  int64_t numExperts(int64_t layer) const;
  const std::vector<int64_t>& sparseLayers() const { return sparseLayers_; }

  // Forward over one packed row (N tokens; attention is causal within each segment starting at
  // segStarts[i]). Returns the final-normed hidden states [N, D]. kvOut receives per-layer K/V.
  // With lora, the adapters are added to their projections; with dropoutRng too, LoRA dropout
  // masks are drawn from it (training).
  // With routing, sparse blocks replay its routes and report theirs.
  // checkpointEvery > 0: activation checkpointing of every checkpointEvery-th layer (0, N, 2N, ...)
  // when gradients are recorded (checkpoint.h); dense layers only, no kvOut.
  at::Tensor forwardPacked(const at::Tensor& ids, const at::Tensor& pos, const std::vector<int64_t>& segStarts,
                           std::vector<LayerKV>* kvOut = nullptr, const LoraAdapters* lora = nullptr,
                           at::Generator* dropoutRng = nullptr, MoeRouting* routing = nullptr,
                           int64_t checkpointEvery = 0) const;
  // A forward over the paged cache (decode rows and prefill chunks together): writes each token's
  // K/V into its block and returns the final-normed hidden states [N, D]. No host round trip on
  // a decode-only batch (decode_graph.h captures it in a CUDA graph); with routing, sparse blocks
  // report the experts each token went to.
  // A hybrid model's Gated DeltaNet blocks read and write `states` (linear_state.h): required
  // then, with batch.slotOf.
  at::Tensor forwardPaged(const at::Tensor& ids, const PagedBatch& batch, PagedKV& cache, MoeRouting* routing = nullptr,
                          LinearStates* states = nullptr) const;
  // Whether some block is Gated DeltaNet (a hybrid model: forwardPaged needs LinearStates).
  bool hybrid() const { return !linearLayers_.empty(); }
  const std::vector<int64_t>& linearLayers() const { return linearLayers_; }
  // numSlots zeroed state slots (and the pad slot) for this model's Gated DeltaNet blocks.
  LinearStates linearStates(int64_t numSlots) const;
  // Final hidden states -> logits (fp32, or fp64 for fp64 models).
  at::Tensor logits(const at::Tensor& hidden) const;
  // Per-token log p(target) and entropy of softmax(logits / temperature) from final hidden states
  // [N, D] and targets [N], through the chunked LM head (lm_head.h): never all the row's logits at
  // once. Differentiable w.r.t. hidden and the head weight when grad mode is on.
  TokenStats tokenStats(const at::Tensor& hidden, const at::Tensor& targets, double temperature) const;
  // tokenStats without grad, copied out as floats.
  void tokenLogprobs(const at::Tensor& hidden, const at::Tensor& targets, double temperature, float* logprobs,
                     float* entropies) const;
  // Scores one packed row: logprobs[t] = log p(ids[t] | earlier tokens of its sample) under
  // softmax(logits / temperature), entropies[t] = entropy of that distribution; both 0 at the
  // first token of each sample (nothing predicts it).
  void scoreRow(const std::vector<int64_t>& ids, const std::vector<int64_t>& pos, double temperature,
                std::vector<float>& logprobs, std::vector<float>& entropies, const LoraAdapters* lora = nullptr) const;
  // Rejects token ids outside [0, vocab).
  void checkTokenIds(const int64_t* ids, size_t n) const;

  const ArchConfig cfg;
  const at::ScalarType dtype;
  const at::Device device;
  at::ScalarType logitsDtype() const { return dtype == at::kDouble ? at::kDouble : at::kFloat; }
  // The activations' dtype in this thread: the autocast dtype under mixed precision (bf16
  // activations over fp32 master weights), else the weights' own.
  at::ScalarType computeDtype() const;
  at::TensorOptions options() const { return at::TensorOptions().dtype(dtype).device(device); }

  // Tokens per LM-head chunk in training and scoring (lm_head.h); 0 = from the vocabulary size.
  int64_t logitsChunkTokens = 0;
  // Bytes of log-softmax a training forward keeps for its backward (lm_head.h).
  int64_t logitsKeepBytes = kLogitsKeepBytes;
  // false: every forward runs q/k/v and gate/up one matmul each, as training does (what fusing
  // gains, measured with one build). The weights stay fused either way.
  bool fusedProjections = true;
  // true: RMSNorm (with the residual add), RoPE, SwiGLU and the LM head's rows run our fused kernels
  // (kernels.h; CUDA, in every forward and backward); false: libtorch's ops on a GPU, and on the CPU
  // the engine's own loops for fp32 training (cpuBlockKernels). Off by default until checked on a card
  // (README, "On a GPU machine").
  bool fusedKernels = false;
  const BlockKernels& kernels() const {
    return fusedKernels ? fusedBlockKernels() : device.is_cpu() ? cpuBlockKernels() : unfusedBlockKernels();
  }

  // Calls on one model run one at a time (the TS facade queues them; this flag catches misuse).
  std::atomic<bool> busy{false};
  // Counts changes of the weights (loadWeights, a trainer's step or load): K/V computed before a
  // change belong to another policy (the generator's prefix cache compares it).
  uint64_t weightsVersion() const { return weightsVersion_.load(); }
  void noteWeightsChanged() { weightsVersion_++; }

  // Called around the stages of forwardPacked and tokenStats (a fully sharded trainer's; decode
  // calls none). Null: the parameters are all here.
  std::shared_ptr<StageHooks> stageHooks;
  // The stages that read each parameter (StageHooks), in namedParameters() order: its block, or
  // for a tied embedding both the embedding and the LM head.
  std::vector<std::vector<int64_t>> parameterStages() const;
  // The fused q/k/v (+ biases) and gate/up tensors (fuseProjections), each with the parameters it
  // stacks in row order: a sharded trainer makes each a view of the buffer its parts are gathered
  // into (or drops it: the forwards then take the parts one by one).
  struct FusedTensor {
    at::Tensor* fused;
    std::vector<at::Tensor> parts;
  };
  std::vector<FusedTensor> fusedTensors();

 private:
  // Checks cfg and specs, derives the RoPE table and allocates the fused projections
  // (fuseProjections; without weights, without memory); the other weights stay empty (both
  // constructors fill them).
  Model(ArchConfig cfg, std::vector<ParamSpec> specs, at::ScalarType dtype, at::Device device, bool weights = true);
  // Every slot not yet filled a tensor of its shape without memory (withoutWeights).
  void emptySlots();
  // The adapters and MoE routing of one forward, threaded through the blocks.
  struct Adapt {
    const LoraAdapters* lora;
    at::Generator* dropoutRng;
    MoeRouting* routing = nullptr;
  };
  struct Slot {
    const ParamSpec* spec;
    at::Tensor* tensor;
  };
  std::vector<Slot> slots();  // the parameters of specs_, in their order
  // Allocates each block's fused q/k/v (with biases) and gate/up tensors (Layer::qkv, gateUp) and
  // makes those slots views into them, before any weight is in: the weights are then copied into
  // their rows, so a fused tensor never exists beside a separate copy of its parts.
  void fuseProjections();
  // Whether a forward may use `fused` for the slices `parts`: it exists, no adapter of `ad` sits on
  // a part, and no gradient of a part is recorded (the parts are the parameters autograd knows).
  bool fusedUsable(const at::Tensor& fused, std::initializer_list<const at::Tensor*> parts, const Adapt& ad) const;
  at::Tensor rmsNorm(const at::Tensor& x, const at::Tensor& w) const;
  // A norm weight as the kernels take it: 1 + w where weights are offsets from 1 (normOffset).
  at::Tensor normWeight(const at::Tensor& w) const;
  std::pair<at::Tensor, at::Tensor> rope(const at::Tensor& pos) const;
  std::pair<at::Tensor, at::Tensor> attentionInputs(const Layer& L, const at::Tensor& x, const at::Tensor& cos,
                                                    const at::Tensor& sin, at::Tensor& v, int64_t layer,
                                                    const Adapt& ad, at::Tensor* gate = nullptr) const;
  // Attention's output [N, H hd] scaled by sigmoid(gate) where the family gates it (attnOutputGate).
  static at::Tensor gated(const at::Tensor& attn, const at::Tensor& gate) {
    return gate.defined() ? attn * at::sigmoid(gate) : attn;
  }
  at::Tensor finishBlock(const Layer& L, const at::Tensor& x, const at::Tensor& attn, int64_t layer,
                         const Adapt& ad) const;
  // The rest of a block after its token mixer's output `mixed` [N, D] (after o_proj / out_proj):
  // the residual add, the post-attention norm, the MLP and its residual add.
  at::Tensor afterMixer(const Layer& L, const at::Tensor& x, const at::Tensor& mixed, int64_t layer,
                        const Adapt& ad) const;
  // Where the chunked delta rule (model_linear_attention.cc) reads several sequences' positions at
  // once, as flash-linear-attention's cu_seqlens: sequence s is positions [starts[s], starts[s] +
  // lens[s]) of the rows it runs over, padded to whole chunks (of 64 positions). Its state passes from
  // chunk to chunk in steps: step i holds chunk i of every sequence longer than i chunks. The
  // sequences are ranked by chunk count, longest first, and chunks laid out step by step in rank
  // order, so step i's chunks are one slab [offset, offset + active[i]) and its states the first
  // active[i]. Index tensors on the rows' device, built on the host once per forward.
  struct ChunkLayout {
    at::Tensor slotRow;           // [chunks * 64] the row of each chunk position (rows: zeros)
    at::Tensor rowSlot;           // [sum lens] the chunk position of each sequence's positions, in order
    at::Tensor order, rank;       // [B] the sequence of each rank, the rank of each sequence
    std::vector<int64_t> active;  // per step, its sequences (non-increasing)
    int64_t chunks = 0;
  };
  static ChunkLayout chunkLayout(const std::vector<int64_t>& starts, const std::vector<int64_t>& lens, int64_t rows,
                                 const at::Device& device);
  // For a causal convolution of kernel K over the same sequences: [rows, K - 1], 1 where tap i of
  // a position reads inside its sequence, 0 where it would reach before the sequence's start.
  static at::Tensor convTaps(const std::vector<int64_t>& starts, const std::vector<int64_t>& lens, int64_t rows,
                             int64_t K, const at::Device& device);
  // The samples of a packed row: their lengths, and where attention runs as one variable-length
  // flash-attention kernel (CUDA, bf16), their cumulative starts on the device (int32, [n + 1]).
  // Hybrid models also get the Gated DeltaNet blocks' layout of the samples.
  struct Segments {
    std::vector<int64_t> lens;
    at::Tensor cuSeqLens;  // undefined: attention per sample
    int64_t longest = 0;
    at::ScalarType compute = at::kFloat;  // the dtype flash attention runs in (with cuSeqLens)
    ChunkLayout chunks;                   // hybrid: the delta rule's layout of the samples
    at::Tensor convTaps;                  // hybrid: [N, K - 1] 1 where a conv tap stays in its sample
  };
  Segments packedSegments(const std::vector<int64_t>& segStarts, int64_t N) const;
  // f(x) for stage `stage` of a forward, between the stage hooks' enter and leave when there are any.
  at::Tensor staged(int64_t stage, const at::Tensor& x, const std::function<at::Tensor(const at::Tensor&)>& f) const;
  // Decoder layer `layer` over a packed row.
  at::Tensor packedLayer(int64_t layer, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                         const Segments& seg, std::vector<LayerKV>* kvOut, const Adapt& ad) const;
  // The SwiGLU MLP of a dense block, or the routed experts of a sparse one.
  // gateUp: gate and up as one weight (Layer::gateUp), when usable (fusedUsable).
  at::Tensor denseMlp(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& up, const at::Tensor& down,
                      const Adapt& ad, const at::Tensor& gateUp = at::Tensor()) const;
  at::Tensor sparseMlp(const Layer& L, const at::Tensor& x, int64_t layer, const Adapt& ad) const;
  // Gated DeltaNet over a packed row (model_linear_attention.cc): the block's token mixer, from the
  // normed input h [N, D] to its output [N, D] before the residual add; conv and recurrent state
  // restart at every segment.
  at::Tensor linearAttentionPacked(const Layer& L, const at::Tensor& h, const Segments& seg, const Adapt& ad) const;
  // The same over a paged forward's rows, reading and writing their state slots.
  at::Tensor linearAttentionPaged(const Layer& L, int64_t layer, const at::Tensor& h, const PagedBatch& batch,
                                  LinearStates& states) const;
  // The delta rule's inputs in its dtype (fp32; fp64 for fp64 models) from the convolved qkv [N,
  // convDim] (after SiLU) and the b and a projections [N, Hv]: q (l2-normed, scaled) and k
  // (l2-normed) [N, Hv, dk], each q/k head repeated for the v heads it serves, v [N, Hv, dv], g (log
  // decay) and beta [N, Hv].
  struct DeltaInputs {
    at::Tensor q, k, v, g, beta;
  };
  // The chunked gated delta rule over the sequences of `layout` from their states S0 [B, Hv, dk,
  // dv] (undefined: zeros): o [sum lens, Hv, dv], the sequences' positions in order; their final
  // states in *S when S is given.
  static at::Tensor chunkedDeltaRule(const DeltaInputs& in, const ChunkLayout& layout, const at::Tensor& S0,
                                     at::Tensor* S);
  DeltaInputs deltaInputs(const Layer& L, const at::Tensor& convolved, const at::Tensor& b, const at::Tensor& a) const;
  // The rule over a paged forward's prefill chunks (their rows after the decode rows), from and
  // into their state slots, taking the batch's snapshots; `windowed`: each chunk's causalConv input.
  at::Tensor prefillDeltaRule(const DeltaInputs& in, const PagedBatch& batch, at::Tensor& convState,
                              at::Tensor& recState, const std::vector<at::Tensor>& windowed, int64_t K) const;
  // The gated RMSNorm and out_proj after the rule: o [N, Hv, dv], z [N, Hv dv].
  at::Tensor linearOutput(const Layer& L, const at::Tensor& o, const at::Tensor& z, const Adapt& ad) const;
  // x W^T + b, plus W's adapter when ad has one.
  at::Tensor project(const at::Tensor& x, const at::Tensor& W, const at::Tensor& b, const Adapt& ad) const;
  // Causal attention within one sample, q [H, Lq, hd] and k/v [KV, Lk, hd]: query i sits at key
  // position offset + i (offset = Lk - Lq: the keys before are cached ones).
  at::Tensor causalAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t offset = 0) const;
  // Attention of a paged forward's queries q [N, H, hd] over the paged cache of one layer.
  at::Tensor pagedAttention(const at::Tensor& q, const at::Tensor& kCache, const at::Tensor& vCache,
                            const PagedBatch& batch) const;
  at::Tensor decodeAttentionBmm(const at::Tensor& q, const at::Tensor& kCache, const at::Tensor& vCache,
                                const PagedBatch& batch) const;
  at::Tensor pagedAttentionCpu(const at::Tensor& q, const at::Tensor& kCache, const at::Tensor& vCache,
                               const PagedBatch& batch) const;

  std::vector<ParamSpec> specs_;
  at::Tensor embed_, norm_, lmHead_;  // lmHead_ undefined when tied
  std::vector<Layer> layers_;
  std::vector<int64_t> sparseLayers_, linearLayers_;
  at::Tensor invFreq_;  // [rotaryDim/2] RoPE inverse frequencies
  std::atomic<uint64_t> weightsVersion_{0};
  bool hasWeights_ = true;
};

// transformers' load_balancing_loss_func over the sparse layers of one forward (routing.logits):
// E * sum_e f_e P_e, f_e the fraction of (token, slot) pairs routed to expert e (routing.experts)
// and P_e the mean router probability of e, both over every layer's tokens together.
at::Tensor routerAuxLoss(const MoeRouting& routing);

// Segment starts of a packed row: a new sample begins wherever the position id does not continue
// the previous one (positions restart at 0 per sample).
std::vector<int64_t> segmentStarts(const std::vector<int64_t>& pos);

at::ScalarType parseComputeDtype(const std::string& name);  // float32 | bfloat16 | float64
std::string diskDtypeName(at::ScalarType t);                // inverse of the RawTensor dtype names
// Checks a raw tensor against the expected shape and returns a view of its bytes (no copy yet).
at::Tensor viewRaw(const RawTensor& t, const std::vector<int64_t>& expected);

}  // namespace prime
