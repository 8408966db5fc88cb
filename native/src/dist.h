// Data-parallel plumbing of the trainer on libtorch's c10d: the TCP store the ranks rendezvous
// through, and a Gloo process group with the few collectives the trainer needs. Every collective
// has the group's timeout: a dead or stuck rank fails the call (the step is then retried on a
// fresh group, see lib/trainer/group.ts), it never hangs it.
#pragma once

#include <ATen/ATen.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace c10d {
class Store;
}

namespace prime {

// Whether this build has c10d's Gloo process group (native/CMakeLists.txt checks the headers).
extern const bool kHaveGloo;

// A c10d TCPStore: the server (rank 0, listening on host:port) or a client connected to it.
class DistStore {
 public:
  // A client retries connecting until `timeoutS`; then it throws naming host:port.
  DistStore(const std::string& host, int port, bool isServer, double timeoutS);
  ~DistStore();
  void set(const std::string& key, const std::string& value);
  // The value of `key`, or nullopt if it is not set within `timeoutMs`.
  std::optional<std::string> get(const std::string& key, int64_t timeoutMs);
  int64_t add(const std::string& key, int64_t delta);
  int port() const { return port_; }
  const std::string& host() const { return host_; }
  c10::intrusive_ptr<c10d::Store> store;

 private:
  std::string host_;
  int port_;
};

// One generation of the trainer's process group: Gloo over a PrefixStore of the shared store, so
// a re-formed group never meets the keys of an earlier one.
class DistGroup {
 public:
  DistGroup(std::shared_ptr<DistStore> store, const std::string& prefix, int rank, int size, double timeoutS);
  ~DistGroup();
  int rank() const { return rank_; }
  int size() const { return size_; }
  // In place, summed over ranks.
  void allReduceSum(at::Tensor& t);
  // Sums the tensors over ranks in flat buckets of at most `bucketBytes` (one collective per
  // bucket, fewer round trips than one per tensor).
  void allReduceBucketed(std::vector<at::Tensor>& ts, int64_t bucketBytes);
  // In place from `root`; the tensors are flattened into buckets of at most `bucketBytes`.
  void broadcastBucketed(std::vector<at::Tensor>& ts, int root, int64_t bucketBytes);
  void send(at::Tensor& t, int dst, int tag);
  void recv(at::Tensor& t, int src, int tag);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::shared_ptr<DistStore> store_;  // outlives the group
  int rank_, size_;
  std::chrono::milliseconds timeout_;
};

}  // namespace prime
