// Data-parallel plumbing of the trainer on libtorch's c10d: the TCP store the ranks rendezvous
// through, and a process group with the few collectives the trainer needs. Every collective
// has the group's timeout: a dead or stuck rank fails the call (the step is then retried on a
// fresh group, see lib/trainer/group.ts), it never hangs it.
//
// Backends: Gloo moves CPU tensors (and CUDA tensors, through host copies, where NCCL is not
// used); NCCL (libtorch 2.x CUDA builds only: PRIME_HAVE_NCCL) moves CUDA tensors. A group has
// Gloo always, since the trainer's counts and metrics are CPU tensors whatever the device, and
// makes its NCCL group at its first CUDA collective (all ranks reach it together: collectives
// run in the same order on every rank).
#pragma once

#include <ATen/ATen.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "facts.h"

namespace c10d {
class Store;
class Work;
}  // namespace c10d

namespace prime {

struct DistTiming;  // dist.cc

// Whether this build has c10d's Gloo process group (native/CMakeLists.txt checks the headers).
extern const bool kHaveGloo;
// Whether this build has c10d's NCCL process group (a PyTorch 2.x CUDA build).
extern const bool kHaveNccl;
// Whether the store's server listens on its host's address only (PyTorch >= 2.2 takes a socket we
// bind); libtorch 1.13's listens on every interface (lib/trainer/group.ts signs what it carries).
extern const bool kStoreBindsHost;

// Which group moves CUDA tensors (trainer.dist.backend): kAuto = NCCL where the build has it,
// else Gloo; kNccl = NCCL (an error where the build has none); kGloo = Gloo (e.g. two ranks on one
// card, which NCCL refuses). CPU tensors always go through Gloo.
#define PRIME_DIST_BACKENDS(X) X(kAuto, "auto") X(kGloo, "gloo") X(kNccl, "nccl")
PRIME_ENUM(DistBackend, PRIME_DIST_BACKENDS, "DIST_BACKENDS")

// A c10d TCPStore: the server (rank 0, listening on host:port; on every interface where
// !kStoreBindsHost) or a client connected to it.
class DistStore {
 public:
  // A client retries connecting until `timeoutS`; then it throws naming host:port.
  DistStore(const std::string& host, int port, bool isServer, double timeoutS);
  ~DistStore();
  void set(const std::string& key, const std::string& value);
  // The value of `key`, or nullopt if it is not set within `timeoutMs`.
  std::optional<std::string> get(const std::string& key, int64_t timeoutMs);
  int64_t add(const std::string& key, int64_t delta);
  // A new client connection to the store (a process group's own).
  c10::intrusive_ptr<c10d::Store> connect() const;
  int port() const { return port_; }
  const std::string& host() const { return host_; }
  c10::intrusive_ptr<c10d::Store> store;

 private:
  std::string host_;
  int port_;
  std::chrono::milliseconds timeout_;
};

// Where a group's collective time went, since the last takeStats() or resetStats(): `busySeconds`
// while some collective ran (the backend runs them one after another), `waitSeconds` the work
// waiting for them stood still: Gloo's on the host (the calling thread blocked), NCCL's on the
// device (the waiting stream held between its events around the wait; NCCL's own start and end
// events time each collective on its stream). busy - wait is the time collectives ran behind compute.
struct DistStats {
  double busySeconds = 0, waitSeconds = 0;
  int64_t collectives = 0;
};

// A collective in flight. wait() blocks until it is done (NCCL: makes the current CUDA stream of
// the collective's device wait for it, without blocking the host), then runs what finishes it on
// this thread (copying a reduce-scatter's part out). Throws what the collective failed with.
// Waiting twice is a no-op.
class DistWork {
 public:
  ~DistWork();
  void wait();

 private:
  friend class DistGroup;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// One generation of the trainer's process group, over a PrefixStore of the shared store, so a
// re-formed group never meets the keys of an earlier one.
class DistGroup {
 public:
  DistGroup(std::shared_ptr<DistStore> store, const std::string& prefix, int rank, int size, double timeoutS,
            DistBackend backend = DistBackend::kAuto);
  ~DistGroup();
  int rank() const { return rank_; }
  int size() const { return size_; }
  DistBackend backend() const { return backend_; }
  // The backend that moves tensors like `t`: "gloo" or "nccl".
  const char* backendFor(const at::Tensor& t) const;
  // In place, summed (or the maximum) over ranks.
  void allReduceSum(at::Tensor& t);
  void allReduceMax(at::Tensor& t);
  // Sums the tensors over ranks in flat buffers of at most `bucketBytes` (one collective per
  // bucket, fewer round trips than one per tensor).
  void allReduceBucketed(std::vector<at::Tensor>& ts, int64_t bucketBytes);
  // In place from `root`; the tensors are flattened into buckets of at most `bucketBytes`.
  void broadcastBucketed(std::vector<at::Tensor>& ts, int root, int64_t bucketBytes);
  void send(at::Tensor& t, int dst, int tag);
  void recv(at::Tensor& t, int src, int tag);
  void barrier();
  // Asynchronous all-gather: `full` ([size * shard.numel()], contiguous, shard's dtype and device)
  // receives every rank's `shard`, rank r's at r * shard.numel().
  std::shared_ptr<DistWork> allGatherAsync(const at::Tensor& shard, const at::Tensor& full);
  // Asynchronous reduce-scatter: `full` ([size * S], contiguous) is summed over ranks and this
  // rank's part of the sum, [rank * S, (rank + 1) * S), is added to `accumulate` ([S]) when the work
  // is waited for. NCCL reduce-scatters; Gloo (which has no reduce-scatter in libtorch 1.13)
  // all-reduces `full` in place, twice the bytes on the wire, and keeps its part.
  std::shared_ptr<DistWork> reduceScatterAddAsync(const at::Tensor& full, const at::Tensor& accumulate);
  // The stats since the last call, after the device has run the collectives they count (NCCL:
  // deliberately a host sync, once per call: a trainer's step end).
  DistStats takeStats();
  // Forgets the stats so far without reading them (no sync): a step's start.
  void resetStats();

 private:
  // `ncclDevice`: a NCCL collective's device (timed on the device); none: timed by its future's
  // completion where `hasFuture`, else when it is waited for.
  static std::shared_ptr<DistWork> track(c10::intrusive_ptr<c10d::Work> work, const char* what,
                                         const std::shared_ptr<DistTiming>& timing, bool hasFuture,
                                         std::optional<at::Device> ncclDevice);
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::shared_ptr<DistStore> store_;  // outlives the group
  int rank_, size_;
  DistBackend backend_;
  std::chrono::milliseconds timeout_;
};

// `iters` all-gathers of `bytes` per rank, on `device`, issued back to back, then waited for in
// order, and the group's stats for them (timed as the trainer's collectives are): a benchmark of
// the group's collectives and of their timing (bench/gpu/checks.ts). Resets the group's stats.
DistStats timeAllGathers(DistGroup& group, const at::Device& device, int64_t bytes, int64_t iters);

}  // namespace prime
