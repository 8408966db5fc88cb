// c10d (TCPStore, PrefixStore, ProcessGroupGloo, ProcessGroupNCCL) behind dist.h. The same calls
// build against libtorch 1.13 (Debian) and PyTorch 2.x; Gloo's own headers come from libgloo-dev.
// NCCL only in a PyTorch 2.x CUDA build (PRIME_HAVE_NCCL, native/CMakeLists.txt).
#include "dist.h"

#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef PRIME_HAVE_GLOO
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif
#ifdef PRIME_HAVE_NCCL
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <type_traits>

namespace prime {

namespace {

using Clock = std::chrono::steady_clock;

std::chrono::milliseconds toMs(double seconds) { return std::chrono::milliseconds(int64_t(seconds * 1000)); }

double secondsBetween(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

}  // namespace

#ifdef PRIME_HAVE_NCCL
const bool kHaveNccl = true;
#else
const bool kHaveNccl = false;
#endif

namespace {

// Whether TCPStoreOptions takes a socket to listen on (PyTorch >= 2.2: masterListenFd); libtorch
// 1.13's server binds the wildcard address, every interface, and takes no address.
template <typename T, typename = void>
struct TakesListenFd : std::false_type {};
template <typename T>
struct TakesListenFd<T, std::void_t<decltype(std::declval<T&>().masterListenFd)>> : std::true_type {};
template <typename T, typename = void>
struct HasLibUv : std::false_type {};
template <typename T>
struct HasLibUv<T, std::void_t<decltype(std::declval<T&>().useLibUV)>> : std::true_type {};

// A socket listening on host:port (port 0: one the kernel picks), for the store's server.
int listenOn(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (rc != 0) throw std::runtime_error(std::string("cannot resolve the address: ") + gai_strerror(rc));
  std::string why = "no address";
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 2048) == 0) {
      freeaddrinfo(found);
      return fd;
    }
    why = std::strerror(errno);
    close(fd);
  }
  freeaddrinfo(found);
  throw std::runtime_error(why);
}

// The port a listening socket is bound to.
int boundPort(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  return addr.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port)
                                    : ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
}

// A server's options listening on `host` only, where the store takes a socket: it then answers
// whoever reaches that address, and no other interface (trainer.dist.host). The store takes the
// socket over. (A template, so that libtorch 1.13's options, without those members, compile.)
template <typename Options>
void listenOnHost(Options& o, const std::string& host, int port) {
  if constexpr (TakesListenFd<Options>::value) {
    int fd;
    try {
      fd = listenOn(host, port);
    } catch (const std::exception& e) {
      throw std::runtime_error("cannot listen on " + host + ":" + std::to_string(port) + ": " + e.what());
    }
    o.port = uint16_t(boundPort(fd));
    o.masterListenFd = fd;
    // The socket-taking path of every 2.x that has it (libuv's came later, in 2.8).
    if constexpr (HasLibUv<Options>::value) o.useLibUV = false;
  }
}

}  // namespace

const bool kStoreBindsHost = TakesListenFd<c10d::TCPStoreOptions>::value;

DistStore::DistStore(const std::string& host, int port, bool isServer, double timeoutS)
    : host_(host), timeout_(toMs(timeoutS)) {
  c10d::TCPStoreOptions o;
  o.port = uint16_t(port);
  o.isServer = isServer;
  o.waitWorkers = false;
  o.timeout = toMs(timeoutS);
  if (isServer) listenOnHost(o, host, port);
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

// Polled with check(), never a wait with a timeout: libtorch 1.13's TCPStore leaves a wait that
// timed out pending on the server, whose reply (once the key is set) is then read as the answer to
// a later query on this connection, and every call after it fails (wrong values, "Broken pipe").
std::optional<std::string> DistStore::get(const std::string& key, int64_t timeoutMs) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeoutMs);
  while (!store->check({key})) {
    if (Clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::vector<uint8_t> v = store->get(key);
  return std::string(v.begin(), v.end());
}

c10::intrusive_ptr<c10d::Store> DistStore::connect() const {
  c10d::TCPStoreOptions o;
  o.port = uint16_t(port_);
  o.isServer = false;
  o.timeout = timeout_;
  return c10::make_intrusive<c10d::TCPStore>(host_, o);
}

int64_t DistStore::add(const std::string& key, int64_t delta) { return store->add(key, delta); }

// The timing shared by a group and its works (a work's completion callback may run after the
// group is gone).
struct DistTiming {
  std::mutex mu;
  DistStats stats;
  Clock::time_point lastEnd{};
  // A collective issued at `issued` ended at `end`: collectives run one after another, so it was
  // busy from when it was issued or the previous one ended, whichever is later.
  void ended(Clock::time_point issued, Clock::time_point end) {
    std::lock_guard<std::mutex> lock(mu);
    stats.busySeconds += secondsBetween(std::max(issued, lastEnd), end);
    lastEnd = std::max(lastEnd, end);
    stats.collectives++;
  }
  void waited(double seconds) {
    std::lock_guard<std::mutex> lock(mu);
    stats.waitSeconds += seconds;
  }
#ifdef PRIME_HAVE_NCCL
  // A NCCL collective, timed on the device: its work, whose start and end events on NCCL's stream
  // time it (the group's collective timing on), and events of the waiting stream around its wait.
  // Its future completes when it is queued and its wait returns at once: host clocks read ~0.
  struct Nccl {
    c10::intrusive_ptr<c10d::Work> work;  // until its duration is read (it holds its tensors)
    at::cuda::CUDAEvent before{cudaEventDefault}, after{cudaEventDefault};
    bool waited = false;  // the events around its wait are recorded, not yet read
  };
  std::vector<std::shared_ptr<Nccl>> nccl;
  // Adds what the device has passed (under mu): a finished collective's duration (then its work and
  // the tensors it holds are let go), a finished wait's stall; forgets what is read and no longer
  // waited for. `block`: first waits for each one (a deliberate host sync; a collective nobody
  // waits for, up to `timeout`).
  void readNccl(bool block, std::chrono::milliseconds timeout) {
    for (auto it = nccl.begin(); it != nccl.end();) {
      Nccl& n = **it;
      if (block && n.waited) n.after.synchronize();
      if (block && n.work && !n.waited) {
        const auto deadline = Clock::now() + timeout;
        while (!n.work->isCompleted() && Clock::now() < deadline)
          std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
      if (n.work && n.work->isCompleted()) {
        try {
          stats.busySeconds += double(n.work->getDuration()) / 1e3;
        } catch (const c10::Error& e) {  // a timing NCCL did not record: said once, the step goes on
          static std::once_flag said;
          std::call_once(said, [&] {
            fprintf(stderr, "[prime-native] a NCCL collective's time is unknown: %s\n", e.what_without_backtrace());
          });
        }
        stats.collectives++;
        n.work.reset();
      }
      if (!n.work && n.waited && n.after.query()) {
        stats.waitSeconds += double(n.before.elapsed_time(n.after)) / 1e3;
        n.waited = false;
      }
      // Done: timed, its wait read, and its DistWork gone or waited (only this list holds it).
      const bool done = !n.work && !n.waited && it->use_count() == 1;
      it = done ? nccl.erase(it) : it + 1;
    }
  }
#endif
};

#ifdef PRIME_HAVE_GLOO
const bool kHaveGloo = true;

namespace {

bool isLoopback(const std::string& host) { return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1"; }

[[noreturn]] void failed(const char* what, const std::string& why) {
  throw std::runtime_error(std::string("trainer process group: ") + what + " failed: " + why);
}

// Consecutive tensors of one dtype and device, at most `bucketBytes` together (a larger tensor is
// a bucket of its own), flattened into one buffer for `op`, then copied back unless `op` left them
// as they were (a broadcast's root: its tensors may be read meanwhile, the weight broadcast's are
// being written to the folder).
template <typename Op>
void forBuckets(std::vector<at::Tensor>& ts, int64_t bucketBytes, Op op, bool copyBack = true) {
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
    for (size_t k = i; k < j && copyBack; k++) {
      const int64_t n = ts[k].numel();
      ts[k].copy_(buf.narrow(0, off, n).view(ts[k].sizes()));
      off += n;
    }
    i = j;
  }
}

}  // namespace

struct DistWork::Impl {
  c10::intrusive_ptr<c10d::Work> work;
  const char* what = "";
  std::function<void()> finish;  // on the waiting thread, once the collective is done
  std::vector<at::Tensor> keep;  // alive until the collective is done
  std::shared_ptr<DistTiming> timing;
  Clock::time_point issued;
  bool timedByCallback = false;  // the future's callback records when it ended
  bool done = false;
#ifdef PRIME_HAVE_NCCL
  std::optional<at::Device> ncclDevice;    // a NCCL collective's device
  std::shared_ptr<DistTiming::Nccl> nccl;  // its timing
#endif
};

DistWork::~DistWork() = default;

void DistWork::wait() {
  Impl& w = *impl_;
  if (w.done) return;
  w.done = true;
  const auto t0 = Clock::now();
  try {
#ifdef PRIME_HAVE_NCCL
    if (w.nccl) {
      // The device's current stream waits for the collective (the host does not): the events
      // around the wait time how long that stream stood still.
      c10::cuda::CUDAGuard guard(*w.ncclDevice);
      const auto stream = c10::cuda::getCurrentCUDAStream(w.ncclDevice->index());
      w.nccl->before.record(stream);  // read only once `waited` is set (under the timing's lock)
      w.work->wait();
      std::lock_guard<std::mutex> lock(w.timing->mu);
      w.nccl->after.record(stream);
      w.nccl->waited = true;
    } else {
      w.work->wait();
    }
#else
    w.work->wait();
#endif
  } catch (const c10::Error& e) {
    failed(w.what, e.what_without_backtrace());
  } catch (const std::exception& e) {
    failed(w.what, e.what());
  }
  const auto t1 = Clock::now();
#ifdef PRIME_HAVE_NCCL
  const bool onHost = !w.nccl;
#else
  const bool onHost = true;
#endif
  if (onHost) {
    w.timing->waited(secondsBetween(t0, t1));
    if (!w.timedByCallback) w.timing->ended(w.issued, t1);
  }
  if (w.finish) w.finish();
  w.keep.clear();
}

struct DistGroup::Impl {
  c10::intrusive_ptr<c10d::ProcessGroupGloo> gloo;
  c10::intrusive_ptr<c10d::Store> store;  // the group's prefixed store (NCCL's rendezvous)
  bool useNccl = false;
#ifdef PRIME_HAVE_NCCL
  c10::intrusive_ptr<c10d::ProcessGroupNCCL> nccl;  // made at the first CUDA collective
#endif
  std::shared_ptr<DistTiming> timing = std::make_shared<DistTiming>();

  bool ncclFor(const at::Tensor& t) const { return useNccl && t.is_cuda(); }

  // f(process group) on the group that moves `t`.
  template <typename F>
  c10::intrusive_ptr<c10d::Work> on(const at::Tensor& t, int rank, int size, std::chrono::milliseconds timeout, F f) {
#ifdef PRIME_HAVE_NCCL
    if (ncclFor(t)) {
      if (!nccl) {
        auto opts = c10d::ProcessGroupNCCL::Options::create();
        opts->timeout = timeout;
        nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(c10::make_intrusive<c10d::PrefixStore>("nccl/", store), rank,
                                                           size, opts);
        // Start and end events on NCCL's stream around each collective (WorkNCCL::getDuration).
        nccl->enableCollectivesTiming();
      }
      return f(*nccl);
    }
#endif
    return f(*gloo);
  }
};

DistGroup::DistGroup(std::shared_ptr<DistStore> s, const std::string& prefix, int rank, int size, double timeoutS,
                     DistBackend backend)
    : impl_(std::make_unique<Impl>()), store_(std::move(s)), rank_(rank), size_(size), backend_(backend),
      timeout_(toMs(timeoutS)) {
  if (size < 1 || rank < 0 || rank >= size)
    throw std::runtime_error("trainer process group: rank " + std::to_string(rank) + " of world size " +
                             std::to_string(size));
  if (backend == DistBackend::kNccl && !kHaveNccl)
    throw std::runtime_error(
        "trainer.dist.backend nccl: this build of the native addon has no NCCL (only a build against a PyTorch 2.x "
        "with CUDA has it); use trainer.dist.backend gloo or auto");
  impl_->useNccl = kHaveNccl && backend != DistBackend::kGloo;
  auto opts = c10d::ProcessGroupGloo::Options::create(timeout_);
  // One transport thread: one core per rank. GLOO_SOCKET_IFNAME picks the interface (as torch's);
  // else loopback when the store is local, else this host's address.
  opts->threads = 1;
  const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
  if (ifname && *ifname) opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
  else if (isLoopback(store_->host()))
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  else opts->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  // A connection of its own: a rendezvous that times out (a rank that never came) can leave a
  // reply pending on it (see DistStore::get), which must not reach the next group's queries.
  try {
    impl_->store = c10::make_intrusive<c10d::PrefixStore>(prefix, store_->connect());
    impl_->gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(impl_->store, rank, size, opts);
  } catch (const c10::Error& e) {
    throw std::runtime_error("trainer process group '" + prefix + "': rank " + std::to_string(rank) + " of " +
                             std::to_string(size) + " could not connect: " + e.what_without_backtrace());
  }
}

DistGroup::~DistGroup() = default;

const char* DistGroup::backendFor(const at::Tensor& t) const { return impl_->ncclFor(t) ? "nccl" : "gloo"; }

// A work timed on the device (NCCL), by its future's completion callback where the backend has
// futures that complete with the work (Gloo), else when it is waited for.
std::shared_ptr<DistWork> DistGroup::track(c10::intrusive_ptr<c10d::Work> work, const char* what,
                                           const std::shared_ptr<DistTiming>& timing, bool hasFuture,
                                           std::optional<at::Device> ncclDevice) {
  const auto issued = Clock::now();
  auto w = std::make_shared<DistWork>();
  w->impl_ = std::make_unique<DistWork::Impl>();
  w->impl_->work = std::move(work);
  w->impl_->what = what;
  w->impl_->timing = timing;
  w->impl_->issued = issued;
#ifdef PRIME_HAVE_NCCL
  if (ncclDevice) {
    auto n = std::make_shared<DistTiming::Nccl>();
    n->work = w->impl_->work;
    w->impl_->ncclDevice = ncclDevice;
    w->impl_->nccl = n;
    std::lock_guard<std::mutex> lock(timing->mu);
    timing->readNccl(false, {});  // what has finished since: no work is held longer than it runs
    timing->nccl.push_back(std::move(n));
    return w;
  }
#else
  (void)ncclDevice;
#endif
  if (hasFuture) {
    w->impl_->timedByCallback = true;
    w->impl_->work->getFuture()->addCallback(
        [timing, issued](c10::ivalue::Future&) { timing->ended(issued, Clock::now()); });
  }
  return w;
}

// Every collective goes through here: issued now, returned in flight.
#define PRIME_ISSUE(tensor, what, hasFuture, call)                                                      \
  [&]() {                                                                                               \
    c10::intrusive_ptr<c10d::Work> work;                                                                \
    try {                                                                                               \
      work = impl_->on(tensor, rank_, size_, timeout_, [&](auto& pg) { return call; });                 \
    } catch (const c10::Error& e) {                                                                     \
      failed(what, e.what_without_backtrace());                                                         \
    }                                                                                                   \
    return track(std::move(work), what, impl_->timing, hasFuture,                                       \
                 impl_->ncclFor(tensor) ? std::optional<at::Device>((tensor).device()) : std::nullopt); \
  }()

void DistGroup::allReduceSum(at::Tensor& t) {
  std::vector<at::Tensor> v{t};
  PRIME_ISSUE(t, "all-reduce", true, pg.allreduce(v))->wait();
}

void DistGroup::allReduceMax(at::Tensor& t) {
  std::vector<at::Tensor> v{t};
  c10d::AllreduceOptions o;
  o.reduceOp = c10d::ReduceOp::MAX;
  PRIME_ISSUE(t, "all-reduce", true, pg.allreduce(v, o))->wait();
}

void DistGroup::allReduceBucketed(std::vector<at::Tensor>& ts, int64_t bucketBytes) {
  forBuckets(ts, bucketBytes, [&](at::Tensor& buf) { allReduceSum(buf); });
}

void DistGroup::broadcastBucketed(std::vector<at::Tensor>& ts, int root, int64_t bucketBytes) {
  forBuckets(
      ts, bucketBytes,
      [&](at::Tensor& buf) {
        std::vector<at::Tensor> v{buf};
        c10d::BroadcastOptions o;
        o.rootRank = root;
        PRIME_ISSUE(buf, "broadcast", true, pg.broadcast(v, o))->wait();
      },
      rank_ != root);
}

void DistGroup::send(at::Tensor& t, int dst, int tag) {
  std::vector<at::Tensor> v{t};
  PRIME_ISSUE(t, "send", false, pg.send(v, dst, tag))->wait();
}

void DistGroup::recv(at::Tensor& t, int src, int tag) {
  std::vector<at::Tensor> v{t};
  PRIME_ISSUE(t, "recv", false, pg.recv(v, src, tag))->wait();
}

void DistGroup::barrier() {
  at::Tensor one = at::ones({1}, at::TensorOptions().dtype(at::kFloat));
  allReduceSum(one);
}

std::shared_ptr<DistWork> DistGroup::allGatherAsync(const at::Tensor& shard, const at::Tensor& full) {
  const int64_t S = shard.numel();
  if (full.numel() != S * size_ || !full.is_contiguous() || full.scalar_type() != shard.scalar_type())
    throw std::runtime_error("allGatherAsync: full must be a contiguous [size * shard numel] of the shard's dtype");
  at::Tensor in = shard.contiguous().view(-1);
  std::shared_ptr<DistWork> w;
  if (impl_->ncclFor(full)) {
    at::Tensor out = full;
    w = PRIME_ISSUE(full, "all-gather", true, pg._allgather_base(out, in));
  } else {
    // Gloo: one output per rank, views of `full` (it copies each rank's part into them).
    std::vector<std::vector<at::Tensor>> outs(1);
    for (int r = 0; r < size_; r++) outs[0].push_back(full.narrow(0, r * S, S));
    std::vector<at::Tensor> ins{in};
    w = PRIME_ISSUE(full, "all-gather", true, pg.allgather(outs, ins));
  }
  w->impl_->keep = {in, full};
  return w;
}

std::shared_ptr<DistWork> DistGroup::reduceScatterAddAsync(const at::Tensor& full, const at::Tensor& accumulate) {
  const int64_t S = accumulate.numel();
  if (full.numel() != S * size_ || !full.is_contiguous())
    throw std::runtime_error("reduceScatterAddAsync: full must be a contiguous [size * accumulate numel]");
  at::Tensor in = full;
  std::shared_ptr<DistWork> w;
  if (impl_->ncclFor(full)) {
    at::Tensor part = at::empty({S}, full.options());
    w = PRIME_ISSUE(full, "reduce-scatter", true, pg._reduce_scatter_base(part, in));
    w->impl_->keep = {in, part};
    w->impl_->finish = [part, accumulate]() mutable { accumulate.view(-1).add_(part); };
  } else {
    std::vector<at::Tensor> v{in};
    w = PRIME_ISSUE(full, "reduce-scatter", true, pg.allreduce(v));
    w->impl_->keep = {in};
    const int64_t off = int64_t(rank_) * S;
    w->impl_->finish = [in, accumulate, off, S]() mutable { accumulate.view(-1).add_(in.narrow(0, off, S)); };
  }
  return w;
}

#undef PRIME_ISSUE

#else
// Built without c10d's Gloo (native/CMakeLists.txt says when): no process groups.
const bool kHaveGloo = false;
struct DistWork::Impl {};
DistWork::~DistWork() = default;
void DistWork::wait() {}
struct DistGroup::Impl {
  std::shared_ptr<DistTiming> timing = std::make_shared<DistTiming>();
};
DistGroup::DistGroup(std::shared_ptr<DistStore>, const std::string&, int, int, double, DistBackend) {
  throw std::runtime_error(
      "this build of the native addon has no c10d Gloo process group (its Gloo headers did not match "
      "libtorch at build time): trainer.world_size must be 1");
}
DistGroup::~DistGroup() = default;
const char* DistGroup::backendFor(const at::Tensor&) const { return "gloo"; }
void DistGroup::allReduceSum(at::Tensor&) {}
void DistGroup::allReduceMax(at::Tensor&) {}
void DistGroup::allReduceBucketed(std::vector<at::Tensor>&, int64_t) {}
void DistGroup::broadcastBucketed(std::vector<at::Tensor>&, int, int64_t) {}
void DistGroup::send(at::Tensor&, int, int) {}
void DistGroup::recv(at::Tensor&, int, int) {}
void DistGroup::barrier() {}
std::shared_ptr<DistWork> DistGroup::allGatherAsync(const at::Tensor&, const at::Tensor&) { return nullptr; }
std::shared_ptr<DistWork> DistGroup::reduceScatterAddAsync(const at::Tensor&, const at::Tensor&) { return nullptr; }
#endif

DistStats DistGroup::takeStats() {
  DistTiming& t = *impl_->timing;
  std::lock_guard<std::mutex> lock(t.mu);
#ifdef PRIME_HAVE_NCCL
  // Deliberate host sync, once per call (a trainer's step end): NCCL's events are read once the
  // device has passed them.
  t.readNccl(true, timeout_);
#endif
  DistStats s = t.stats;
  t.stats = DistStats{};
  return s;
}

DistStats timeAllGathers(DistGroup& group, const at::Device& device, int64_t bytes, int64_t iters) {
  if (bytes < 4 || iters < 1) throw std::runtime_error("timeAllGathers: bytes must be >= 4 and iters >= 1");
  const auto opts = at::TensorOptions().dtype(at::kFloat).device(device);
  const int64_t n = bytes / 4;
  const at::Tensor shard = at::ones({n}, opts), full = at::empty({n * group.size()}, opts);
  group.allGatherAsync(shard, full)->wait();  // warm-up: NCCL's communicator is made at the first one
  group.takeStats();
  std::vector<std::shared_ptr<DistWork>> works;
  for (int64_t i = 0; i < iters; i++) works.push_back(group.allGatherAsync(shard, full));
  for (auto& w : works) w->wait();
  return group.takeStats();
}

void DistGroup::resetStats() {
  DistTiming& t = *impl_->timing;
  std::lock_guard<std::mutex> lock(t.mu);
  t.stats = DistStats{};
#ifdef PRIME_HAVE_NCCL
  t.nccl.clear();
#endif
}

}  // namespace prime
