#include "addon/async.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include "facts.h"

namespace prime::addon {

std::atomic<int> gThreads{0};

Job::Job(Napi::Env env, std::shared_ptr<Model> lock, Work work, Done done)
    : Napi::AsyncWorker(env), deferred_(Napi::Promise::Deferred::New(env)), lock_(std::move(lock)),
      work_(std::move(work)), done_(std::move(done)) {
  if (lock_ && lock_->busy.exchange(true)) {
    lock_.reset();  // not ours to release
    throw Napi::Error::New(env,
                           "prime_native: model is busy with another call; await each call before the next "
                           "(the TS facade queues them)");
  }
}

void Job::Execute() {
  if (int n = gThreads.load(); n > 0) at::set_num_threads(n);  // per thread under OpenMP
  try {
    work_();
  } catch (const OptionError& e) {
    option_ = e.option, reason_ = e.reason;
    SetError(e.what());
  } catch (const c10::Error& e) {
    SetError(e.what_without_backtrace());
  } catch (const std::exception& e) {
    SetError(e.what());
  } catch (...) {
    SetError("unknown native error");
  }
}

void Job::OnOK() {
  unlock();
  try {
    deferred_.Resolve(done_ ? done_(Env()) : Env().Undefined());
  } catch (const Napi::Error& e) {
    deferred_.Reject(e.Value());
  }
}

void Job::OnError(const Napi::Error& e) {
  unlock();
  if (!option_.empty()) {
    Napi::Object err = e.Value();
    err.Set("option", Napi::String::New(Env(), option_));
    err.Set("reason", Napi::String::New(Env(), reason_));
  }
  deferred_.Reject(e.Value());
}

void checkIdle(Napi::Env env, const Model& m) {
  if (m.busy) throw Napi::Error::New(env, "prime_native: model is busy with another call");
}

}  // namespace prime::addon
