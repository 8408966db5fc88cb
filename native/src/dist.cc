// c10d (TCPStore, PrefixStore, ProcessGroupGloo) behind dist.h. The same calls build against
// libtorch 1.13 (Debian) and PyTorch 2.x; Gloo's own headers come from libgloo-dev.
#include "dist.h"

#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef PRIME_HAVE_GLOO
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif

#include <cstdlib>
#include <stdexcept>

namespace prime {

namespace {

std::chrono::milliseconds toMs(double seconds) { return std::chrono::milliseconds(int64_t(seconds * 1000)); }

}  // namespace

DistStore::DistStore(const std::string& host, int port, bool isServer, double timeoutS) : host_(host) {
  c10d::TCPStoreOptions o;
  o.port = uint16_t(port);
  o.isServer = isServer;
  o.waitWorkers = false;
  o.timeout = toMs(timeoutS);
  try {
    auto s = c10::make_intrusive<c10d::TCPStore>(host, o);
    port_ = s->getPort();
    store = s;
  } catch (const std::exception& e) {
    const std::string why = isServer ? "cannot listen on " : "cannot reach the store at ";
    throw std::runtime_error(why + host + ":" + std::to_string(port) + ": " +
                             (dynamic_cast<const c10::Error*>(&e)
                                  ? dynamic_cast<const c10::Error*>(&e)->what_without_backtrace()
                                  : e.what()));
  }
}

DistStore::~DistStore() = default;

void DistStore::set(const std::string& key, const std::string& value) {
  store->set(key, std::vector<uint8_t>(value.begin(), value.end()));
}

std::optional<std::string> DistStore::get(const std::string& key, int64_t timeoutMs) {
  try {
    store->wait({key}, std::chrono::milliseconds(timeoutMs));
  } catch (const c10::Error&) {
    // A timeout; a lost connection throws again here.
    if (!store->check({key})) return std::nullopt;
  }
  std::vector<uint8_t> v = store->get(key);
  return std::string(v.begin(), v.end());
}

int64_t DistStore::add(const std::string& key, int64_t delta) { return store->add(key, delta); }

#ifdef PRIME_HAVE_GLOO
const bool kHaveGloo = true;

namespace {

bool isLoopback(const std::string& host) { return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1"; }

// Runs one collective to completion; Gloo enforces the group's timeout inside it.
void finish(const c10::intrusive_ptr<c10d::Work>& work, const char* what) {
  try {
    work->wait();
  } catch (const c10::Error& e) {
    throw std::runtime_error(std::string("trainer process group: ") + what + " failed: " + e.what_without_backtrace());
  } catch (const std::exception& e) {
    throw std::runtime_error(std::string("trainer process group: ") + what + " failed: " + e.what());
  }
}

// Consecutive tensors of one dtype and device, at most `bucketBytes` together (a larger tensor is
// a bucket of its own), flattened into one buffer for `op`, then copied back.
template <typename Op>
void forBuckets(std::vector<at::Tensor>& ts, int64_t bucketBytes, Op op) {
  at::NoGradGuard noGrad;
  size_t i = 0;
  while (i < ts.size()) {
    size_t j = i + 1;
    int64_t bytes = int64_t(ts[i].nbytes());
    while (j < ts.size() && ts[j].scalar_type() == ts[i].scalar_type() && ts[j].device() == ts[i].device() &&
           bytes + int64_t(ts[j].nbytes()) <= bucketBytes)
      bytes += int64_t(ts[j++].nbytes());
    std::vector<at::Tensor> flat;
    for (size_t k = i; k < j; k++) flat.push_back(ts[k].reshape(-1));
    at::Tensor buf = j - i == 1 ? flat[0].contiguous().clone() : at::cat(flat);
    op(buf);
    int64_t off = 0;
    for (size_t k = i; k < j; k++) {
      const int64_t n = ts[k].numel();
      ts[k].copy_(buf.narrow(0, off, n).view(ts[k].sizes()));
      off += n;
    }
    i = j;
  }
}

}  // namespace

struct DistGroup::Impl {
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg;
};

DistGroup::DistGroup(std::shared_ptr<DistStore> s, const std::string& prefix, int rank, int size, double timeoutS)
    : impl_(std::make_unique<Impl>()), store_(std::move(s)), rank_(rank), size_(size), timeout_(toMs(timeoutS)) {
  if (size < 1 || rank < 0 || rank >= size)
    throw std::runtime_error("trainer process group: rank " + std::to_string(rank) + " of world size " +
                             std::to_string(size));
  auto opts = c10d::ProcessGroupGloo::Options::create(timeout_);
  // One transport thread: one core per rank. GLOO_SOCKET_IFNAME picks the interface (as torch's);
  // else loopback when the store is local, else this host's address.
  opts->threads = 1;
  const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
  if (ifname && *ifname) opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
  else if (isLoopback(store_->host()))
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  else opts->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>(prefix, store_->store);
  try {
    impl_->pg = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, rank, size, opts);
  } catch (const c10::Error& e) {
    throw std::runtime_error("trainer process group '" + prefix + "': rank " + std::to_string(rank) + " of " +
                             std::to_string(size) + " could not connect: " + e.what_without_backtrace());
  }
}

DistGroup::~DistGroup() = default;

void DistGroup::allReduceSum(at::Tensor& t) {
  std::vector<at::Tensor> v{t};
  finish(impl_->pg->allreduce(v), "all-reduce");
}

void DistGroup::allReduceBucketed(std::vector<at::Tensor>& ts, int64_t bucketBytes) {
  forBuckets(ts, bucketBytes, [&](at::Tensor& buf) { allReduceSum(buf); });
}

void DistGroup::broadcastBucketed(std::vector<at::Tensor>& ts, int root, int64_t bucketBytes) {
  forBuckets(ts, bucketBytes, [&](at::Tensor& buf) {
    std::vector<at::Tensor> v{buf};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    finish(impl_->pg->broadcast(v, o), "broadcast");
  });
}

void DistGroup::send(at::Tensor& t, int dst, int tag) {
  std::vector<at::Tensor> v{t};
  finish(impl_->pg->send(v, dst, tag), "send");
}

void DistGroup::recv(at::Tensor& t, int src, int tag) {
  std::vector<at::Tensor> v{t};
  finish(impl_->pg->recv(v, src, tag), "recv");
}

#else
// Built without c10d's Gloo (native/CMakeLists.txt says when): no process groups.
const bool kHaveGloo = false;
struct DistGroup::Impl {};
DistGroup::DistGroup(std::shared_ptr<DistStore>, const std::string&, int, int, double) {
  throw std::runtime_error(
      "this build of the native addon has no c10d Gloo process group (its Gloo headers did not match "
      "libtorch at build time): trainer.world_size must be 1");
}
DistGroup::~DistGroup() = default;
void DistGroup::allReduceSum(at::Tensor&) {}
void DistGroup::allReduceBucketed(std::vector<at::Tensor>&, int64_t) {}
void DistGroup::broadcastBucketed(std::vector<at::Tensor>&, int, int64_t) {}
void DistGroup::send(at::Tensor&, int, int) {}
void DistGroup::recv(at::Tensor&, int, int) {}
#endif

}  // namespace prime
