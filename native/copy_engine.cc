// The copy engine: native threads that move the bytes of DMA blocks on real memory.
// The modelled PLDMA (kernel-sim/pldma) decides what to copy and when; these threads do
// the copying. A job may first walk the real page tables (mincore) of its source and
// destination pages, the way a terminate-mode SMMU translation would: it then copies only
// the bytes before the first non-resident page and reports that page. Without that check the copy simply runs,
// and a non-resident page registered with a userfaultfd blocks the thread in the kernel
// until the fault is resolved: stall mode with a genuine fault.
#include <sys/mman.h>
#include <sys/sysinfo.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <thread>
#include <vector>

#include "common.h"
#include "sigbus.h"

namespace pfr {

namespace {

// ---- presence proofs of the inline path (docs/threads.md, "Small DMA copies on the JS thread") ----
// A pagemap read costs two syscalls' worth of page-table walk per small copy (~1-2 µs each in
// a busy Node process: most of an inline copy). A proof that a mapping's pages were present is
// reused while nothing can have taken one away: every path of the addon that drops pages bumps
// the epoch once they are gone (NoteDrop), a drop announced by a userfaultfd event (the kernel
// zaps after the event is read) bumps it and stops new proofs for kDropAheadNs (NoteDropAhead).
// A proof also expires after kProofTtlNs, which bounds what no event announces (a drop by code
// outside this library): and with swap on (the kernel may reclaim anonymous and memfd pages
// at any time) no proof is kept at all. 10 ms: a transport's ring of receive slots comes back
// to a slot only every ~14 messages, and a proof that lapses before costs a pagemap read
// (~4-8 µs here: a syscall in a PVM guest) on every small message.
std::atomic<uint64_t> g_drop_epoch{1};
std::atomic<uint64_t> g_no_proofs_until{0};
constexpr uint64_t kProofTtlNs = 10'000'000;
constexpr uint64_t kDropAheadNs = 1'000'000;

bool SwapOn() {
  struct sysinfo si {};
  return sysinfo(&si) != 0 || si.totalswap != 0;
}

}  // namespace

// True if every page of [off, off+len) of m has a present page-table entry: from a proof still
// valid, or from pagemap (one read; *reads counts them). Unsound proofs are never kept.
bool PresenceProofs::Present(const Mapping& m, size_t off, size_t len, int* reads) {
  if (len == 0) return true;
  // Another process drops its pages without telling this one: no proof of them is kept.
  if (m.foreign()) return ++*reads, AllPresent(m, off, len);
  const uintptr_t ps = static_cast<uintptr_t>(PageSize());
  const uintptr_t first = reinterpret_cast<uintptr_t>(m.addr + off) / ps;
  const uintptr_t last = (reinterpret_cast<uintptr_t>(m.addr + off) + len - 1) / ps;
  // Read before pagemap: a drop that completes after the read bumps past it.
  const uint64_t epoch = g_drop_epoch.load(std::memory_order_acquire);
  const uint64_t now = NowNs();
  Proof* mine = nullptr;
  Proof* oldest = &proofs[0];  // replaced when m has none: the least recently proved
  for (Proof& p : proofs) {
    if (p.at < oldest->at) oldest = &p;
    if (p.m != &m) continue;
    mine = &p;
    if (p.epoch == epoch && now - p.at < kProofTtlNs && p.first <= first && last <= p.last) return true;
  }
  ++*reads;
  if (!AllPresent(m, off, len)) return false;
  if (now - swap_checked_at >= kProofTtlNs) {
    swap_on = SwapOn();
    swap_checked_at = now;
  }
  if (swap_on || now < g_no_proofs_until.load(std::memory_order_acquire)) return true;
  if (mine && mine->epoch == epoch && now - mine->at < kProofTtlNs && first <= mine->last + 1 && mine->first <= last + 1) {
    // Pages next to a valid proof: one proof for the span, as old as its oldest part.
    mine->first = std::min(mine->first, first);
    mine->last = std::max(mine->last, last);
    return true;
  }
  if (!mine) mine = oldest;
  *mine = Proof{&m, first, last, epoch, now};
  return true;
}

namespace {

enum JobFlag : uint32_t { kCheckSource = 1, kCheckDest = 2 };
enum Status : int { kOk = 0, kSourceFault = 1, kDestFault = 2, kCancelled = 3 };
constexpr int kCompletionWidth = 5;  // jobId, status, faultOffset, ns, tid

struct Job {
  double id;
  std::shared_ptr<Mapping> src, dst;
  size_t src_off, dst_off, len;
  uint32_t flags;
  // What the bytes are written for (a memory key, a QP number; -1: nothing): a fence on
  // either cancels the job if it is still queued and waits for it if it is running.
  double key = -1, qp = -1;
  bool cancelled = false;
};

struct Engine;
void Deliver(Napi::Env env, Napi::Function cb, std::shared_ptr<Engine>* ctx, void*);
using Tsfn = Napi::TypedThreadSafeFunction<std::shared_ptr<Engine>, void, Deliver>;

struct Engine {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Job> queue;
  std::vector<double> done;  // completions not yet handed to JS
  bool signalled = false;    // a call to JS is already queued for `done`
  bool stopping = false;
  std::vector<pid_t> tids;
  Tsfn tsfn;
  napi_env env = nullptr;
  size_t busy = 0;
  std::vector<std::pair<double, double>> running;  // key, qp of the jobs being copied
  std::condition_variable idle;                    // a running job finished (fences wait on it)

  // First page in [off, off+len) of m that mincore says is not resident, or -1. A foreign
  // mapping (another process's memory) is walked in its own pagemap instead.
  static int64_t FirstMissing(const Mapping& m, size_t off, size_t len) {
    if (m.foreign()) return FirstAbsent(m, off, len);
    const size_t ps = static_cast<size_t>(PageSize());
    size_t first = off & ~(ps - 1);
    size_t pages = (off + len - first + ps - 1) / ps;
    unsigned char vec[256];
    for (size_t done = 0; done < pages; done += 256) {
      size_t n = std::min<size_t>(256, pages - done);
      if (mincore(m.addr + first + done * ps, n * ps, vec) != 0) return static_cast<int64_t>(first + done * ps);
      for (size_t i = 0; i < n; i++)
        if (!(vec[i] & 1)) return static_cast<int64_t>(first + (done + i) * ps);
    }
    return -1;
  }

  // The copy itself. A page whose access raises SIGBUS (poisoned with UFFDIO_POISON: a remote
  // page that could not be fetched) ends the copy like a missing page of that side: the
  // bytes before it are moved and it is reported as the fault, which its fault library then
  // fails to resolve (an error completion), instead of SIGBUS killing the process.
  static void Copy(const Job& job, size_t len, int* status, int64_t* fault) {
    Copy(*job.src, job.src_off, *job.dst, job.dst_off, len, status, fault);
  }

  static void Copy(const Mapping& s, size_t src_off, const Mapping& d, size_t dst_off, size_t len, int* status, int64_t* fault) {
    if (s.foreign() || d.foreign()) return CopyForeign(s, src_off, d, dst_off, len, status, fault);
    CopyLocal(s, src_off, d, dst_off, len, status, fault);
  }

  static void CopyLocal(const Mapping& s, size_t src_off, const Mapping& d, size_t dst_off, size_t len, int* status, int64_t* fault) {
    SigbusGuard guard;
    const uintptr_t dst = reinterpret_cast<uintptr_t>(d.addr + dst_off);
    const uintptr_t src = reinterpret_cast<uintptr_t>(s.addr + src_off);
    if (sigsetjmp(guard.env, 0) == 0) {
      CurrentSigbusGuard() = &guard;
      memmove(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), len);
      CurrentSigbusGuard() = nullptr;
      return;
    }
    CurrentSigbusGuard() = nullptr;
    const uintptr_t at = guard.address & ~static_cast<uintptr_t>(PageSize() - 1);
    if (at >= dst && at < dst + len) {
      *status = kDestFault;
      *fault = static_cast<int64_t>(dst_off + (at - dst));
    } else {
      *status = kSourceFault;
      *fault = static_cast<int64_t>(src_off + (at - src));
    }
  }

  // A copy to or from another process's memory: the page it could not reach is that side's
  // fault, as a missing page is.
  static void CopyForeign(const Mapping& s, size_t src_off, const Mapping& d, size_t dst_off, size_t len, int* status, int64_t* fault) {
    bool dest_side = false;
    const size_t done = ForeignCopy(s, src_off, d, dst_off, len, &dest_side);
    if (done == len) return;
    const size_t ps = static_cast<size_t>(PageSize());
    *status = dest_side ? kDestFault : kSourceFault;
    *fault = static_cast<int64_t>(((dest_side ? dst_off : src_off) + done) & ~(ps - 1));
  }

  void Worker(std::shared_ptr<Engine> self) {
    {
      std::lock_guard<std::mutex> lock(mu);
      tids.push_back(Gettid());
    }
    cv.notify_all();
    for (;;) {
      Job job;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return stopping || !queue.empty(); });
        if (stopping) return;
        job = std::move(queue.front());
        queue.pop_front();
        busy++;
        running.emplace_back(job.key, job.qp);
      }
      uint64_t t0 = NowNs();
      // Walk both sides; the first missing page (in the job's own order) ends the copy:
      // the bytes before it are moved, the rest are left for the retransmission.
      int status = kOk;
      int64_t fault = -1;
      size_t copy_len = job.len;
      if (job.cancelled) {
        status = kCancelled;
        copy_len = 0;
      } else if (job.flags & kCheckSource) {
        int64_t f = FirstMissing(*job.src, job.src_off, job.len);
        if (f >= 0) {
          status = kSourceFault;
          fault = f;
          copy_len = static_cast<size_t>(std::max<int64_t>(0, f - static_cast<int64_t>(job.src_off)));
        }
      }
      if (!job.cancelled && (job.flags & kCheckDest)) {
        int64_t f = FirstMissing(*job.dst, job.dst_off, copy_len);
        if (f >= 0) {
          status = kDestFault;
          fault = f;
          copy_len = static_cast<size_t>(std::max<int64_t>(0, f - static_cast<int64_t>(job.dst_off)));
        }
      }
      if (copy_len) Copy(job, copy_len, &status, &fault);
      uint64_t ns = NowNs() - t0;
      job.src.reset();
      job.dst.reset();
      {
        std::lock_guard<std::mutex> lock(mu);
        busy--;
        auto it = std::find(running.begin(), running.end(), std::make_pair(job.key, job.qp));
        if (it != running.end()) running.erase(it);
        done.insert(done.end(), {job.id, static_cast<double>(status), static_cast<double>(fault), static_cast<double>(ns),
                                 static_cast<double>(Gettid())});
        // Called under the lock: once StopAtTeardown has set `stopping`, no thread touches
        // the thread-safe function again (Node frees it when the environment goes).
        if (!signalled && !stopping) {
          signalled = true;
          tsfn.NonBlockingCall();
        }
      }
      idle.notify_all();
    }
  }

  bool Matches(double k, double q, double key, double qp) const { return (key >= 0 && k == key) || (qp >= 0 && q == qp); }

  // Presence proofs of the inline path, touched only by the engine's own JS thread (EngineCopyNow).
  PresenceProofs proofs;
};

void Deliver(Napi::Env env, Napi::Function cb, std::shared_ptr<Engine>* ctx, void*) {
  // No env: Node is draining the queue while it tears the environment down, after the
  // finalizer freed `ctx`. Touch nothing (the completions have nobody left to hear them).
  if (env == nullptr) return;
  Engine& e = **ctx;
  std::vector<double> batch;
  {
    std::lock_guard<std::mutex> lock(e.mu);
    batch.swap(e.done);
    e.signalled = false;
  }
  if (batch.empty()) return;
  auto arr = Napi::Float64Array::New(env, batch.size());
  std::copy(batch.begin(), batch.end(), arr.Data());
  cb.Call({arr});
}

std::mutex g_mu;
std::unordered_map<uint32_t, std::shared_ptr<Engine>> g_engines;
uint32_t g_next = 1;

std::shared_ptr<Engine> Require(const Napi::CallbackInfo& info) {
  uint32_t id = ArgU32(info, 0, "handle");
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_engines.find(id);
  if (it == g_engines.end()) throw Napi::TypeError::New(info.Env(), "copy engine is closed");
  return it->second;
}

// Environment teardown (a worker terminated, the process exiting) with the engine still open:
// stop it before Node frees its thread-safe function. The hook is added after the function
// is made, and Node runs teardown hooks last-added first, so this runs before that free; a
// hook added once per module would run after it, and a copy thread finishing a job in
// between would call into freed memory (SIGSEGV under vitest's worker threads).
void StopAtTeardown(void* arg) {
  std::shared_ptr<Engine> e;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    for (auto it = g_engines.begin(); it != g_engines.end(); ++it)
      if (it->second.get() == arg) {
        e = it->second;
        g_engines.erase(it);
        break;
      }
  }
  if (!e) return;
  std::lock_guard<std::mutex> lock(e->mu);
  e->stopping = true;
  e->queue.clear();
  e->cv.notify_all();
}

// engineCreate(threads, callback(Float64Array)) -> { handle, tids }
Napi::Value EngineCreate(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  InstallSigbusHandler();
  uint32_t threads = ArgU32(info, 0, "threads");
  if (threads == 0 || threads > 64) throw Napi::RangeError::New(env, "threads must be 1..64");
  if (!info[1].IsFunction()) throw Napi::TypeError::New(env, "callback must be a function");
  auto e = std::make_shared<Engine>();
  e->env = env;
  e->tsfn = Tsfn::New(env, info[1].As<Napi::Function>(), "pagefault-rdma:copy-engine", 0, 1, new std::shared_ptr<Engine>(e),
                      [](Napi::Env, void*, std::shared_ptr<Engine>* c) { delete c; });
  e->tsfn.Unref(env);
  // Workers are detached: one may sit in a genuine fault that only the JS thread can
  // resolve, so nothing on the JS thread may ever join it. They hold the engine alive.
  for (uint32_t i = 0; i < threads; i++) std::thread([e] { e->Worker(e); }).detach();
  {
    std::unique_lock<std::mutex> lock(e->mu);
    e->cv.wait_for(lock, std::chrono::seconds(5), [&] { return e->tids.size() == threads; });
  }
  uint32_t id;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    id = g_next++;
    g_engines[id] = e;
  }
  napi_add_env_cleanup_hook(env, StopAtTeardown, e.get());
  Napi::Object out = Napi::Object::New(env);
  out.Set("handle", Napi::Number::New(env, id));
  Napi::Array tids = Napi::Array::New(env);
  {
    std::lock_guard<std::mutex> lock(e->mu);
    for (size_t i = 0; i < e->tids.size(); i++) tids.Set(i, Napi::Number::New(env, e->tids[i]));
  }
  out.Set("tids", tids);
  return out;
}

// engineSubmit(handle, jobId, srcRegion, srcOffset, dstRegion, dstOffset, length, flags[, key, qp])
Napi::Value EngineSubmit(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  auto e = Require(info);
  Job job;
  job.id = info[1].As<Napi::Number>().DoubleValue();
  size_t len = ArgSize(info, 6, "length");
  job.src = RequireRange(env, info[2], info[3], info[6], &job.src_off, &job.len, true);
  job.dst = RequireRange(env, info[4], info[5], info[6], &job.dst_off, &len, true);
  job.flags = ArgU32(info, 7, "flags");
  if (info.Length() > 9 && info[8].IsNumber() && info[9].IsNumber()) {
    job.key = info[8].As<Napi::Number>().DoubleValue();
    job.qp = info[9].As<Napi::Number>().DoubleValue();
  }
  {
    std::lock_guard<std::mutex> lock(e->mu);
    if (e->stopping) throw Napi::TypeError::New(env, "copy engine is closed");
    e->queue.push_back(std::move(job));
  }
  e->tsfn.Ref(env);  // work in flight keeps the process alive; JS unrefs when idle
  e->cv.notify_one();
  return env.Undefined();
}

// engineCopyNow(handle, srcRegion, srcOffset, dstRegion, dstOffset, length, out) -> status,
// or -1: a copy done on the calling (JavaScript) thread, without a hand-off to a copy
// thread, but only when every page of both sides has a present page-table entry (pagemap,
// or a proof of it still valid: Engine::Present), so the copy cannot raise a userfaultfd
// fault on the thread that must resolve faults (see docs/threads.md). With any page not
// present nothing is touched and it returns -1: the caller submits a job instead, whose
// thread walks, copies or reports the fault as always. The same SIGBUS guard as a job's
// copy. out[0] = fault offset (or -1), out[1] = ns, and out[2] (if out holds 3) = the
// pagemap reads this call made.
// No fence can run meanwhile: fences are called on this same thread.
Napi::Value EngineCopyNow(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  auto e = Require(info);
  size_t src_off, dst_off, len;
  size_t dlen = ArgSize(info, 5, "length");
  auto src = RequireRange(env, info[1], info[2], info[5], &src_off, &len, true);
  auto dst = RequireRange(env, info[3], info[4], info[5], &dst_off, &dlen, true);
  if (!info[6].IsTypedArray()) throw Napi::TypeError::New(env, "out must be a Float64Array");
  Napi::Float64Array out = info[6].As<Napi::Float64Array>();
  if (out.ElementLength() < 2) throw Napi::RangeError::New(env, "out must hold 2 numbers");
  if (static_cast<napi_env>(env) != e->env) throw Napi::TypeError::New(env, "an inline copy runs on the engine's own JavaScript thread");
  {
    std::lock_guard<std::mutex> lock(e->mu);
    if (e->stopping) throw Napi::TypeError::New(env, "copy engine is closed");
  }
  uint64_t t0 = NowNs();
  int reads = 0;
  bool present = e->proofs.Present(*src, src_off, len, &reads) && e->proofs.Present(*dst, dst_off, len, &reads);
  if (out.ElementLength() > 2) out[2] = reads;
  if (!present) return Napi::Number::New(env, -1);
  int status = kOk;
  int64_t fault = -1;
  if (len) Engine::Copy(*src, src_off, *dst, dst_off, len, &status, &fault);
  out[0] = static_cast<double>(fault);
  out[1] = static_cast<double>(NowNs() - t0);
  return Napi::Number::New(env, status);
}

// engineFence(handle, key, qp, timeoutMs) -> boolean: the jobs written for `key` or `qp`
// (-1: none) that are still queued are cancelled (they complete with kCancelled, copying
// nothing); the call returns once none is being copied, true, or false after timeoutMs (a
// stall-mode copy may be held in a fault only the JS thread can resolve: never wait forever).
Napi::Value EngineFence(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  auto e = Require(info);
  double key = info[1].As<Napi::Number>().DoubleValue();
  double qp = info[2].As<Napi::Number>().DoubleValue();
  uint32_t timeout = ArgU32(info, 3, "timeoutMs");
  std::unique_lock<std::mutex> lock(e->mu);
  for (auto& job : e->queue)
    if (e->Matches(job.key, job.qp, key, qp)) job.cancelled = true;
  bool idle = e->idle.wait_for(lock, std::chrono::milliseconds(timeout), [&] {
    for (auto& r : e->running)
      if (e->Matches(r.first, r.second, key, qp)) return false;
    return true;
  });
  return Napi::Boolean::New(env, idle);
}

// engineUnref(handle): let the process exit when nothing is queued (called by JS when all
// its transfers have completed).
Napi::Value EngineUnref(const Napi::CallbackInfo& info) {
  auto e = Require(info);
  e->tsfn.Unref(info.Env());
  return info.Env().Undefined();
}

// engineClose(handle): stop taking jobs; queued jobs are dropped (JS completes them with
// an error status); running jobs finish on their detached threads.
Napi::Value EngineClose(const Napi::CallbackInfo& info) {
  uint32_t id = ArgU32(info, 0, "handle");
  std::shared_ptr<Engine> e;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = g_engines.find(id);
    if (it == g_engines.end()) return info.Env().Undefined();
    e = it->second;
    g_engines.erase(it);
  }
  {
    std::lock_guard<std::mutex> lock(e->mu);
    e->stopping = true;
    e->queue.clear();
  }
  e->cv.notify_all();
  napi_remove_env_cleanup_hook(info.Env(), StopAtTeardown, e.get());
  e->tsfn.Release();
  return info.Env().Undefined();
}

}  // namespace

int (*g_before_drop)(uintptr_t, size_t, bool) = nullptr;

void NoteDrop() { g_drop_epoch.fetch_add(1, std::memory_order_acq_rel); }

void NoteDropAhead() {
  NoteDrop();
  const uint64_t until = NowNs() + kDropAheadNs;
  uint64_t cur = g_no_proofs_until.load(std::memory_order_relaxed);
  while (cur < until && !g_no_proofs_until.compare_exchange_weak(cur, until, std::memory_order_acq_rel)) {
  }
}

void InitCopyEngine(Napi::Env env, Napi::Object exports) {
  exports.Set("engineCreate", Napi::Function::New(env, EngineCreate, "engineCreate"));
  exports.Set("engineSubmit", Napi::Function::New(env, EngineSubmit, "engineSubmit"));
  exports.Set("engineUnref", Napi::Function::New(env, EngineUnref, "engineUnref"));
  exports.Set("engineCopyNow", Napi::Function::New(env, EngineCopyNow, "engineCopyNow"));
  exports.Set("engineFence", Napi::Function::New(env, EngineFence, "engineFence"));
  exports.Set("engineClose", Napi::Function::New(env, EngineClose, "engineClose"));
}

}  // namespace pfr
