// The native toucher: a thread of its own that reads or writes a range of a region page
// by page, taking whatever genuine faults the memory's state implies, and resolves a
// Promise with what it saw. It is how tests, examples and benchmarks make a non-JS thread
// fault (a device, in the model's terms) while the JS thread stays free to handle faults.
#include <cstring>
#include <thread>
#include <vector>

#include "common.h"
#include "sigbus.h"

namespace pfr {

namespace {

enum Mode : uint32_t { kReadCopy = 0, kWriteFill = 1, kProbeRead = 2, kProbeWrite = 3 };

struct TouchJob {
  std::shared_ptr<Mapping> mapping;
  size_t offset = 0, length = 0;
  uint32_t mode = kReadCopy;
  uint8_t fill = 0;
  bool timings = false;
  std::vector<uint8_t> data;       // kReadCopy: the bytes read
  std::vector<double> page_ns;     // per-page access time when timings
  std::vector<double> failed;      // offsets of pages whose access raised SIGBUS
  uint64_t checksum = 0;           // probes: sum of the first byte of every page
  uint64_t ns = 0;
  pid_t tid = 0;
  std::thread thread;
  Napi::Promise::Deferred deferred;
  explicit TouchJob(Napi::Env env) : deferred(Napi::Promise::Deferred::New(env)) {}
};

void Settle(Napi::Env env, Napi::Function, TouchJob* job, void*);
using Tsfn = Napi::TypedThreadSafeFunction<TouchJob, void, Settle>;

void Settle(Napi::Env env, Napi::Function, TouchJob* job, void*) {
  if (env == nullptr) return;
  Napi::Object out = Napi::Object::New(env);
  out.Set("ns", Napi::Number::New(env, static_cast<double>(job->ns)));
  out.Set("tid", Napi::Number::New(env, job->tid));
  out.Set("pages", Napi::Number::New(env, static_cast<double>((job->length + PageSize() - 1) / PageSize())));
  out.Set("checksum", Napi::Number::New(env, static_cast<double>(job->checksum)));
  if (job->mode == kReadCopy) out.Set("data", Napi::Buffer<uint8_t>::Copy(env, job->data.data(), job->data.size()));
  if (!job->failed.empty()) {
    auto arr = Napi::Float64Array::New(env, job->failed.size());
    std::copy(job->failed.begin(), job->failed.end(), arr.Data());
    out.Set("failed", arr);
  }
  if (job->timings) {
    auto arr = Napi::Float64Array::New(env, job->page_ns.size());
    std::copy(job->page_ns.begin(), job->page_ns.end(), arr.Data());
    out.Set("pageNs", arr);
  }
  job->deferred.Resolve(out);
}

void Run(TouchJob* job, Tsfn tsfn) {
  job->tid = Gettid();
  const size_t ps = static_cast<size_t>(PageSize());
  uint8_t* base = job->mapping->addr + job->offset;
  if (job->mode == kReadCopy) job->data.resize(job->length);
  if (job->timings) job->page_ns.reserve(job->length / ps + 1);
  uint64_t start = NowNs();
  // Locals changed between sigsetjmp and a siglongjmp back to it must be volatile.
  volatile uint64_t last = start;
  volatile size_t off = 0;
  SigbusGuard guard;
  while (off < job->length) {
    if (sigsetjmp(guard.env, 0) != 0) {
      // The access to this page raised SIGBUS (poisoned, or a SIGBUS-mode userfaultfd):
      // report it as failed and go on with the next page.
      CurrentSigbusGuard() = nullptr;
      job->failed.push_back(static_cast<double>(job->offset + off));
      if (job->timings) {
        uint64_t now = NowNs();
        job->page_ns.push_back(static_cast<double>(now - last));
        last = now;
      }
      off = off + ps;
      continue;
    }
    CurrentSigbusGuard() = &guard;
    for (; off < job->length; off = off + ps) {
      size_t n = std::min(ps, job->length - off);
      volatile uint8_t* p = base + off;
      switch (job->mode) {
        case kReadCopy:
          memcpy(job->data.data() + off, base + off, n);
          break;
        case kWriteFill:
          memset(base + off, job->fill, n);
          break;
        case kProbeRead:
          job->checksum += p[0];
          break;
        case kProbeWrite:
          p[0] = job->fill;
          break;
      }
      if (job->timings) {
        uint64_t now = NowNs();
        job->page_ns.push_back(static_cast<double>(now - last));
        last = now;
      }
    }
    CurrentSigbusGuard() = nullptr;
  }
  job->ns = NowNs() - start;
  job->mapping.reset();  // the region may be unmapped as soon as we are done
  tsfn.BlockingCall();
  tsfn.Release();
}

// touch(region, offset, length, mode, fill, timings) -> Promise<{ ns, tid, pages, checksum, data?, pageNs? }>
Napi::Value Touch(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  size_t off, len;
  auto m = RequireRange(env, info[0], info[1], info[2], &off, &len);
  uint32_t mode = ArgU32(info, 3, "mode");
  if (mode > kProbeWrite) throw Napi::RangeError::New(env, "unknown touch mode");
  InstallSigbusHandler();
  auto* job = new TouchJob(env);
  job->mapping = std::move(m);
  job->offset = off;
  job->length = len;
  job->mode = mode;
  job->fill = static_cast<uint8_t>(ArgU32(info, 4, "fill") & 0xff);
  job->timings = ArgBool(info, 5);
  Napi::Promise promise = job->deferred.Promise();
  // The finalizer runs on the JS thread after the last call: join, then free.
  Tsfn tsfn = Tsfn::New(env, "pagefault-rdma:toucher", 0, 1, job, [](Napi::Env, void*, TouchJob* j) {
    if (j->thread.joinable()) j->thread.join();
    delete j;
  });
  job->thread = std::thread(Run, job, tsfn);
  return promise;
}

}  // namespace

void InitToucher(Napi::Env env, Napi::Object exports) {
  exports.Set("touch", Napi::Function::New(env, Touch, "touch"));
}

}  // namespace pfr
