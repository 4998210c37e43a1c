// libfabric connections between processes and hosts (FI_EP_MSG through libfabric's
// connection manager: a passive endpoint listens, a client connects, both sides get an
// endpoint bound to a CQ and an EQ). The EQ's and CQ's wait fds are watched by uv_poll on
// the event loop: no JavaScript polling loop, no busy thread. Built only when libfabric's
// headers are present (binding.gyp); otherwise InitFabric is not compiled in and
// TypeScript reports the missing libfabric-dev package. libfabric is dlopen'ed at the first
// use, not linked: its providers' libraries (libinfinipath) install signal handlers (SIGBUS)
// that must not change a process that never asked for the transport.
// A listener opened with `threaded` (stall mode's RMA target) gives each accepted connection a
// dedicated progress thread once it is connected: the provider places remote writes into this
// process's memory on that thread, so a write that lands on a userfaultfd-registered page
// blocks that thread, never the JavaScript thread that serves the fault (docs/threads.md).
#include <arpa/inet.h>
#include <dlfcn.h>
#include <signal.h>
#include <netinet/in.h>
#include <poll.h>
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <uv.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "bare_sockets.h"
#include "common.h"
#include "provider_crash.h"

namespace pfr {
namespace {

// The few exported functions used; the rest of libfabric's API is inline calls through fid ops.
struct FiApi {
  decltype(&::fi_getinfo) getinfo;
  decltype(&::fi_freeinfo) freeinfo;
  decltype(&::fi_dupinfo) dupinfo;
  decltype(&::fi_fabric) fabric;
  decltype(&::fi_strerror) strerror;
};
FiApi fi{};

// Loading libfabric and initialising its providers installs process-wide signal handlers:
// Debian's libfabric links libinfinipath (the psm provider), whose handlers for SIGSEGV,
// SIGBUS, SIGILL, SIGABRT and SIGINT print a backtrace and exit(1). They would turn a crash
// into an ordinary exit status (nothing watching the process could tell a crash from an
// error), and take SIGSEGV from V8 (its WebAssembly trap handler) and SIGBUS from the addon's
// guard (sigbus.cc). Whatever was installed before is put back.
struct KeepSignals {
  struct sigaction saved[32];
  KeepSignals() {
    for (int s = 1; s < 32; s++)
      if (s != SIGKILL && s != SIGSTOP) sigaction(s, nullptr, &saved[s]);
  }
  ~KeepSignals() {
    for (int s = 1; s < 32; s++)
      if (s != SIGKILL && s != SIGSTOP) sigaction(s, &saved[s], nullptr);
  }
};

void LoadFi(Napi::Env env) {
  if (fi.getinfo) return;
  KeepSignals keep;
  void* h = dlopen("libfabric.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    Napi::Error e = Napi::Error::New(env, std::string("libfabric could not be loaded (") + dlerror() + "): install it (Debian/Ubuntu: apt-get install libfabric-dev)");
    e.Set("code", Napi::String::New(env, "ERR_LIBFABRIC_MISSING"));
    throw e;
  }
  fi.getinfo = reinterpret_cast<decltype(fi.getinfo)>(dlsym(h, "fi_getinfo"));
  fi.freeinfo = reinterpret_cast<decltype(fi.freeinfo)>(dlsym(h, "fi_freeinfo"));
  fi.dupinfo = reinterpret_cast<decltype(fi.dupinfo)>(dlsym(h, "fi_dupinfo"));
  fi.fabric = reinterpret_cast<decltype(fi.fabric)>(dlsym(h, "fi_fabric"));
  fi.strerror = reinterpret_cast<decltype(fi.strerror)>(dlsym(h, "fi_strerror"));
}

// The providers initialise (and install their handlers) at the first fi_getinfo; once they
// are put back, a crash inside libfabric is said so on its way (provider_crash.h).
int GetInfoKeepingSignals(uint32_t version, const char* node, const char* service, uint64_t flags, fi_info* hints, fi_info** info) {
  int r;
  {
    KeepSignals keep;
    r = fi.getinfo(version, node, service, flags, hints, info);
  }
  NoteProviderCrashes(reinterpret_cast<const void*>(fi.getinfo));
  return r;
}

constexpr size_t kRecvSize = 4u << 20;  // the largest message (the transport checks before sending)
// Receives posted on a connection once its peer has proven itself (fabricLimits' `posted`):
// until then one, enough for its hello, so that a connection that has not said who it is can
// make this process hold one slot's bytes at most.
constexpr int kRecvCount = 8;
// Receive slots a connection may have at once, posted, held (fabricHold) or spare, unless
// fabricLimits says fewer: a held slot is replaced so that the posted ones stay posted; past
// this JavaScript copies instead.
constexpr size_t kMaxSlots = 64;
// How often a listener looks for connections that never sent a connection request (see
// bare_sockets.h), while it reaps them at all.
constexpr uint64_t kReapMs = 100;
// Not a progress timer: every message is progressed from the CQ's wait fd. tcp reports a
// peer's end (FIN/RST) on neither wait fd, so this slow unref'd tick only turns a dead peer
// into FI_SHUTDOWN.
constexpr uint64_t kTickMs = 100;
// Send buffers kept for reuse per connection, by count and bytes: a fresh large allocation is
// fresh pages, each one a page fault when filled (measured: most of a 1 MiB message's cost
// here). A window of 1 MiB writes keeps dozens of sends queued in the provider at once.
constexpr size_t kSendPool = 64;
constexpr size_t kSendPoolBytes = 64u << 20;
// A send's completion is a CQ entry and a signal of the CQ's wait fd (a write(), then a read()
// before the loop sleeps again): where the provider completes sends in order (tx comp_order
// FI_ORDER_STRICT, as tcp's FI_EP_MSG), only every kSendCompleteEvery-th send (or the one that
// makes kSendCompleteBytes since the last that asked) asks for one, and its completion frees
// the buffers of the sends before it too. Large sends ask each: one completion is little beside
// their bytes, and a buffer back late is a fresh one for the next send (measured at 1 MiB: 8 MiB
// per completion cost the sender 5-10 % more CPU than 256 KiB).
constexpr size_t kSendCompleteEvery = 16;
constexpr size_t kSendCompleteBytes = 256u << 10;

enum class Op { Recv, Send, Rma };

// Lent sends (a payload sent straight from its source's memory, no staging copy): the ranges
// the provider may still read, for a drop from a thread other than the transport's
// (FinishLent refuses to drop those: it cannot progress another thread's connections).
struct LentRange {
  uintptr_t addr;
  size_t len;
  bool file;  // of a file-backed (memfd) mapping: any mapping of the file can punch its pages
  bool operator==(const LentRange& o) const { return addr == o.addr && len == o.len && file == o.file; }
};
std::mutex g_lentMu;
std::vector<LentRange> g_lentRanges;
std::atomic<size_t> g_lentCount{0};
std::thread::id g_fabricThread;
// How long a drop of lent pages may progress the connections before it gives up (EBUSY):
// the peer takes what its socket buffer holds within a round trip; one that reads nothing
// for this long is not waited for.
constexpr uint64_t kLendDrainNs = 1'000'000'000;

bool Meets(const LentRange& r, uintptr_t addr, size_t len, bool file) { return (r.addr < addr + len && addr < r.addr + r.len) || (file && r.file); }

void LendRange(const LentRange& r) {
  std::lock_guard<std::mutex> lock(g_lentMu);
  g_lentRanges.push_back(r);
  g_lentCount++;
}

void UnlendRange(const LentRange& r) {
  std::lock_guard<std::mutex> lock(g_lentMu);
  auto it = std::find(g_lentRanges.begin(), g_lentRanges.end(), r);
  if (it == g_lentRanges.end()) return;
  *it = g_lentRanges.back();
  g_lentRanges.pop_back();
  g_lentCount--;
}

// A receive slot's state: posted to the provider, in JavaScript's handler, held by
// JavaScript after it (its bytes are a staged write's payload), or spare (kept, not posted).
enum class Slot { Posted, Handling, Held, Spare };

struct Ctx {
  fi_context2 fi;  // first: libfabric hands back its address
  Op op;
  uint32_t id = 0;  // Rma: the id JavaScript gave; Recv: its slot
  // Recv: the posted buffer (a slot JavaScript sees, or owned here on a threaded connection);
  // Send: the gathered message being sent, `len` of `cap` bytes.
  uint8_t* data = nullptr;
  size_t len = 0;
  size_t cap = 0;
  std::unique_ptr<uint8_t[]> own;
  Slot state = Slot::Spare;  // Recv on a slot connection
  // Send: the payload, lent (no staging copy): `lentLen` bytes at `lentData` of `lent`, sent
  // after `data` straight from the source's memory. The mapping stays mapped while the
  // provider may read it; a drop of those pages finishes the send first (FinishLent).
  std::shared_ptr<Mapping> lent;
  const uint8_t* lentData = nullptr;
  size_t lentLen = 0;
  LentRange Range() const { return {reinterpret_cast<uintptr_t>(lentData), lentLen, lent && lent->fd >= 0}; }
  void Lend(std::shared_ptr<Mapping> m, const uint8_t* p, size_t n) {
    lent = std::move(m);
    lentData = p;
    lentLen = n;
    LendRange(Range());
  }
  void Unlend() {
    if (!lentLen) return;
    UnlendRange(Range());
    lent.reset();
    lentData = nullptr;
    lentLen = 0;
  }
  ~Ctx() { Unlend(); }
};

// A completion read while a lent send was being finished (FinishLent, from inside another
// call): handed to JavaScript by the next DrainCq. Send completions are not kept: they are
// native bookkeeping, done at once (a failed one's error is kept: sendErr).
struct Stashed {
  Ctx* x;
  size_t len;
  uint64_t flags;
  int err;  // 0, or the error entry's errno
  bool sendErr;
};

struct Conn;
void HandleEq(Conn* c);
void Reap(Conn* l);
std::unordered_map<uint32_t, Conn*> conns;
uint32_t nextHandle = 1;

struct Poll {
  uv_poll_t h;
  Conn* conn;
  bool cq;
};

struct Conn {
  uint32_t handle;
  fi_info* info = nullptr;  // the listener's or the connection's
  fid_fabric* fabric = nullptr;
  fid_domain* domain = nullptr;
  fid_eq* eq = nullptr;
  fid_pep* pep = nullptr;
  fid_ep* ep = nullptr;
  fid_cq* cq = nullptr;
  Poll* eqPoll = nullptr;
  Poll* cqPoll = nullptr;
  uv_timer_t* tick = nullptr;
  uv_idle_t* idle = nullptr;  // progress after an operation made outside DrainCq (see Kick)
  uv_prepare_t* settle = nullptr;  // one fi_trywait before the loop sleeps, after sends (see Settle)
  // Progress (see Spin): how this connection waits for a reply it expects. mode 0 wait (sleep on
  // the wait fd at once), 1 poll (poll the CQ up to maxSpinNs first), 2 adaptive (up to what the
  // replies seen so far took, never past maxSpinNs). dueAtNs: when the oldest send that asks for
  // an answer (a write packet: its ACK) went and nothing has come since; 0 when none is due.
  int progressMode = 2;
  uint64_t maxSpinNs = 0;
  uint64_t dueAtNs = 0;
  double replyEwmaNs = 0;  // replies' time after the send that asked for them (adaptive)
  uint32_t sinceProbe = 0;
  struct {
    double spins = 0, hits = 0, spunNs = 0, replies = 0;
  } waited;
  bool connected = false;
  bool closed = false;
  int draining = 0;  // DrainCq calls in progress on this connection
  // Stall mode's RMA target: progress on a thread of its own once connected (see the header).
  bool threaded = false;
  std::thread progress;
  std::atomic<bool> stop{false};
  std::atomic<long> tid{0};
  std::vector<Ctx*> recvs;
  // The receive slots (not on a threaded connection): regions of the addon's region table
  // (the copy engine reads them by id), each { id, address, buffer, pageSize } as mapRegion
  // gives it. A message is handed to JavaScript as a view of its slot, posted again after the
  // handler returns unless JavaScript held it (fabricHold) until fabricRelease.
  std::vector<Napi::ObjectReference> slots;
  std::vector<Napi::Reference<Napi::ArrayBuffer>> slotBuffers;
  std::vector<uint32_t> slotIds;
  std::vector<uint32_t> spare;  // slots in state Spare
  int posted = 0;               // slots in state Posted
  size_t pooledBytes = 0;       // bytes of sendPool
  std::deque<Ctx*> backlog;  // sends refused with FI_EAGAIN, retried after progress
  // Selective send completions (see kSendCompleteEvery): the sends posted, in order, whose
  // buffers the provider may still read; sends and bytes since the last that asked for one.
  bool selective = false;
  std::deque<Ctx*> inflight;
  size_t unasked = 0;
  size_t unaskedBytes = 0;
  std::vector<Ctx*> sendPool;  // completed sends' buffers, reused
  std::vector<Ctx*> lentPosted;  // posted sends whose payload the provider may still read
  std::deque<Stashed> stash;     // completions read by FinishLent, not yet handled
  // How sends went: payload lent (no staging copy) or copied into the send buffer, and lent
  // sends that a drop of their pages had to finish (posted) or copy (still in the backlog).
  struct {
    double lent = 0, copied = 0, lentBytes = 0, copiedBytes = 0, finishedOnDrop = 0, copiedOnDrop = 0;
  } sends;
  std::unordered_map<uint32_t, fid_mr*> mrs;
  uint32_t nextMr = 1;
  Napi::FunctionReference onEvent;
  // The bounds JavaScript set (fabricLimits). A connection: receives kept posted, slots at
  // most, and bytes of sends not yet completed (queued here or in the provider: what a peer
  // that reads nothing makes this process hold) at most, 0 = no bound. A listener: how long a
  // connection may stay bare, and how many may (bareMs 0: not reaped).
  int wantPosted = 1;
  size_t maxSlots = kMaxSlots;
  size_t maxPending = 0;
  size_t pendingBytes = 0;
  uint16_t port = 0;
  uint64_t bareMs = 0;
  size_t maxBare = 0;
  BareSockets bare;
  uv_timer_t* reap = nullptr;
  uint64_t reapedAtNs = 0;
};

// errno values keep their Node code (ECONNREFUSED, ...); libfabric's own ones are EFABRIC.
Napi::Error FiError(Napi::Env env, int ret, const char* call) {
  int err = ret < 0 ? -ret : ret;
  Napi::Error e = err < FI_ERRNO_OFFSET ? SystemError(env, err, call) : Napi::Error::New(env, "");
  e.Set("message", Napi::String::New(env, std::string(call) + ": " + fi.strerror(err)));
  if (err >= FI_ERRNO_OFFSET) {
    e.Set("code", Napi::String::New(env, "EFABRIC"));
    e.Set("errno", Napi::Number::New(env, -err));
    e.Set("syscall", Napi::String::New(env, call));
  }
  return e;
}

#define FI_CHECK(env, call, name)                          \
  do {                                                     \
    int r_ = (call);                                       \
    if (r_ < 0) throw FiError((env), r_, (name));          \
  } while (0)

// Tell JavaScript; returns whether the handler returned true (what a 'request' asks).
bool Emit(Conn* c, const char* kind, std::initializer_list<napi_value> more) {
  Napi::Env env = c->onEvent.Env();
  Napi::HandleScope scope(env);
  napi_value args[5];
  size_t n = 0;
  args[n++] = Napi::Number::New(env, c->handle);
  args[n++] = Napi::String::New(env, kind);
  for (napi_value v : more) args[n++] = v;
  try {
    // MakeCallback: the microtasks (promise reactions) the handler queued run right after it.
    Napi::Value r = c->onEvent.MakeCallback(env.Global(), n, args);
    return r.IsBoolean() && r.As<Napi::Boolean>().Value();
  } catch (const Napi::Error& e) {
    // An exception thrown by the listener: report it as Node does for an event handler.
    napi_fatal_exception(env, e.Value());
    return false;
  }
}

// What a peer sent that the provider passed on but this transport cannot take (a length past
// its receive slot, flags it never uses): JavaScript counts it and cuts the connection.
void Refuse(Conn* c, const std::string& reason) {
  Napi::Env env = c->onEvent.Env();
  Napi::HandleScope scope(env);
  Emit(c, "refused", {Napi::String::New(env, reason)});
}

// An event-loop callback's work on a connection. Nothing a peer sends may end the process
// there: an exception (a value N-API could not make, a libfabric call that failed) becomes the
// connection's 'error', which JavaScript handles as its end.
template <typename F>
void Guarded(Conn* c, F work) {
  Napi::Env env = c->onEvent.Env();
  Napi::HandleScope scope(env);
  try {
    work();
  } catch (const Napi::Error& e) {
    if (!c->closed) Emit(c, "error", {e.Value()});
  } catch (const std::exception& e) {
    if (!c->closed) Emit(c, "error", {Napi::Error::New(env, e.what()).Value()});
  }
}

void StopPoll(Poll*& p) {
  if (!p) return;
  uv_poll_stop(&p->h);
  uv_close(reinterpret_cast<uv_handle_t*>(&p->h), [](uv_handle_t* h) { delete reinterpret_cast<Poll*>(h); });
  p = nullptr;
}

// Frees everything of a connection; the JavaScript side is told 'closed' by the caller.
// The libfabric objects of a connection, closed by whichever thread progresses it last.
void CloseFids(Conn* c) {
  for (auto& [id, mr] : c->mrs) fi_close(&mr->fid);
  c->mrs.clear();
  if (c->ep) fi_close(&c->ep->fid);  // cancels posted receives; their contexts are freed below
  if (c->pep) fi_close(&c->pep->fid);
  if (c->cq) fi_close(&c->cq->fid);
  if (c->eq) fi_close(&c->eq->fid);
  if (c->domain) fi_close(&c->domain->fid);
  if (c->fabric) fi_close(&c->fabric->fid);
  if (c->info) fi.freeinfo(c->info);
  for (Ctx* r : c->recvs) delete r;
  c->recvs.clear();
  for (Ctx* s : c->backlog) delete s;
  c->backlog.clear();
  // A lent send not on `inflight` (no selective completions) is freed here, its mapping let go.
  for (Ctx* s : c->lentPosted)
    if (std::find(c->inflight.begin(), c->inflight.end(), s) == c->inflight.end()) delete s;
  c->lentPosted.clear();
  c->stash.clear();
  for (Ctx* s : c->inflight) delete s;
  c->inflight.clear();
  for (Ctx* s : c->sendPool) delete s;
  c->sendPool.clear();
  c->pooledBytes = 0;
}

void Teardown(Conn* c) {
  if (c->closed) return;
  c->closed = true;
  StopPoll(c->cqPoll);
  StopPoll(c->eqPoll);
  if (c->tick) {
    uv_timer_stop(c->tick);
    uv_close(reinterpret_cast<uv_handle_t*>(c->tick), [](uv_handle_t* h) { delete reinterpret_cast<uv_timer_t*>(h); });
    c->tick = nullptr;
  }
  if (c->idle) {
    uv_idle_stop(c->idle);
    uv_close(reinterpret_cast<uv_handle_t*>(c->idle), [](uv_handle_t* h) { delete reinterpret_cast<uv_idle_t*>(h); });
    c->idle = nullptr;
  }
  if (c->reap) {
    uv_timer_stop(c->reap);
    uv_close(reinterpret_cast<uv_handle_t*>(c->reap), [](uv_handle_t* h) { delete reinterpret_cast<uv_timer_t*>(h); });
    c->reap = nullptr;
  }
  if (c->settle) {
    uv_prepare_stop(c->settle);
    uv_close(reinterpret_cast<uv_handle_t*>(c->settle), [](uv_handle_t* h) { delete reinterpret_cast<uv_prepare_t*>(h); });
    c->settle = nullptr;
  }
  if (c->progress.joinable()) {
    // A threaded connection's receive buffers are its own (no slots): freed by CloseFids.
    // Not joined: the thread may be blocked in a fault that only this thread's event loop
    // resolves. It sees `stop` within one wait (100 ms) of its release and closes the fids.
    c->stop = true;
    c->progress.detach();
    return;
  }
  // The endpoint is closed: the provider no longer writes into the slots. Each is unmapped
  // (once no copy thread reads it), except those JavaScript holds: it closes them on release.
  Napi::Env env = c->onEvent.Env();
  for (size_t i = 0; i < c->slots.size(); i++)
    if (c->recvs[i]->state != Slot::Held) Unpublish(env, c->slotIds[i], c->slotBuffers[i].Value());
  CloseFids(c);
  c->slots.clear();
  c->slotBuffers.clear();
  c->slotIds.clear();
  c->spare.clear();
}

// The progress thread of a threaded connection: fi_cq_sread drives the provider (and sleeps
// on the CQ's wait set, the socket included) until the connection is closed.
void ProgressLoop(Conn* c) {
  c->tid = static_cast<long>(Gettid());
  while (!c->stop) {
    fi_cq_data_entry e[16];
    ssize_t n = fi_cq_sread(c->cq, e, 16, nullptr, 100);
    if (n == -FI_EAVAIL) {
      fi_cq_err_entry err{};
      fi_cq_readerr(c->cq, &err, 0);
    } else if (n < 0 && n != -FI_EAGAIN && n != -FI_ETIMEDOUT && n != -FI_EINTR) {
      // The connection is down (the JavaScript side hears that on its packet connection).
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    uint32_t event = 0;
    alignas(fi_eq_cm_entry) uint8_t raw[sizeof(fi_eq_cm_entry) + 256];
    if (fi_eq_read(c->eq, &event, raw, sizeof raw, 0) == -FI_EAVAIL) {
      fi_eq_err_entry err{};
      fi_eq_readerr(c->eq, &err, 0);
    }
  }
  CloseFids(c);
}

// Hand a connected threaded connection to its progress thread; returns that thread's tid.
long StartProgress(Conn* c) {
  StopPoll(c->eqPoll);
  c->progress = std::thread(ProgressLoop, c);
  while (!c->tid) std::this_thread::yield();  // it sets its tid first thing
  return c->tid;
}

int PostRecv(Conn* c, Ctx* r) {
  int ret = static_cast<int>(fi_recv(c->ep, r->data, r->cap, nullptr, 0, &r->fi));
  if (ret == 0 && !c->threaded) {
    r->state = Slot::Posted;
    c->posted++;
  }
  return ret;
}

// A new receive slot (spare until posted): a region of kRecvSize bytes, pages touched only
// as messages fill them.
Ctx* NewSlot(Napi::Env env, Conn* c) {
  Napi::Object region = PublishPrivate(env, kRecvSize);
  Napi::ArrayBuffer ab = region.Get("buffer").As<Napi::ArrayBuffer>();
  Ctx* r = new Ctx{};
  r->op = Op::Recv;
  r->id = static_cast<uint32_t>(c->recvs.size());
  r->cap = kRecvSize;
  r->data = static_cast<uint8_t*>(ab.Data());
  c->recvs.push_back(r);
  c->slots.push_back(Napi::Persistent(region));
  c->slotBuffers.push_back(Napi::Persistent(ab));
  c->slotIds.push_back(region.Get("id").As<Napi::Number>().Uint32Value());
  return r;
}
// A send buffer of at least `len` bytes: the smallest pooled one that fits (the large ones stay
// for large messages), else a new one (not zeroed).
Ctx* TakeSend(Conn* c, size_t len) {
  size_t best = c->sendPool.size();
  for (size_t i = 0; i < c->sendPool.size(); i++)
    if (c->sendPool[i]->cap >= len && (best == c->sendPool.size() || c->sendPool[i]->cap < c->sendPool[best]->cap)) best = i;
  Ctx* s = nullptr;
  if (best < c->sendPool.size()) {
    s = c->sendPool[best];
    c->pooledBytes -= s->cap;
    c->sendPool[best] = c->sendPool.back();
    c->sendPool.pop_back();
  } else {
    s = new Ctx{};
    s->op = Op::Send;
    s->own.reset(new uint8_t[len ? len : 1]);
    s->data = s->own.get();
    s->cap = len ? len : 1;
  }
  s->len = len;
  return s;
}

// A full pool keeps the larger buffers: a small message must not cost a large one its place.
void ReturnSend(Conn* c, Ctx* s) {
  c->pendingBytes -= s->len + s->lentLen;
  if (s->lentLen) {
    auto it = std::find(c->lentPosted.begin(), c->lentPosted.end(), s);
    if (it != c->lentPosted.end()) c->lentPosted.erase(it);
    s->Unlend();
  }
  if (c->closed) {
    delete s;
    return;
  }
  // Make room by dropping the smallest ones first, never one larger than `s`.
  while (!c->sendPool.empty() && (c->sendPool.size() >= kSendPool || c->pooledBytes + s->cap > kSendPoolBytes)) {
    size_t small = 0;
    for (size_t i = 1; i < c->sendPool.size(); i++)
      if (c->sendPool[i]->cap < c->sendPool[small]->cap) small = i;
    if (c->sendPool[small]->cap >= s->cap) break;
    c->pooledBytes -= c->sendPool[small]->cap;
    delete c->sendPool[small];
    c->sendPool[small] = c->sendPool.back();
    c->sendPool.pop_back();
  }
  if (c->sendPool.size() >= kSendPool || c->pooledBytes + s->cap > kSendPoolBytes) {
    delete s;
    return;
  }
  c->pooledBytes += s->cap;
  c->sendPool.push_back(s);
}

// Post one send; a send that asks for no completion (see kSendCompleteEvery) waits in
// `inflight` until a later one's completion.
// A lent send always asks: its completion is what lets its pages go.
ssize_t PostSend(Conn* c, Ctx* s) {
  bool ask = !c->selective || s->lentLen || c->unasked + 1 >= kSendCompleteEvery || c->unaskedBytes + s->len >= kSendCompleteBytes;
  uint64_t flags = ask ? FI_COMPLETION : 0;
  iovec iov[2] = {{s->data, s->len}, {const_cast<uint8_t*>(s->lentData), s->lentLen}};
  fi_msg msg{};
  msg.msg_iov = iov;
  msg.iov_count = s->lentLen ? 2 : 1;
  msg.context = &s->fi;
  ssize_t r = fi_sendmsg(c->ep, &msg, flags);
  if (r == 0 && s->lentLen) c->lentPosted.push_back(s);
  if (r == 0 && c->selective) {
    c->inflight.push_back(s);
    c->unasked = ask ? 0 : c->unasked + 1;
    c->unaskedBytes = ask ? 0 : c->unaskedBytes + s->len;
  }
  return r;
}

// A send completed (or failed): with selective completions, so did every send posted before it.
void SendDone(Conn* c, Ctx* x) {
  if (!c->selective || std::find(c->inflight.begin(), c->inflight.end(), x) == c->inflight.end()) return ReturnSend(c, x);
  while (!c->inflight.empty()) {
    Ctx* s = c->inflight.front();
    c->inflight.pop_front();
    ReturnSend(c, s);
    if (s == x) return;
  }
}

void Flush(Conn* c) {
  while (!c->backlog.empty()) {
    Ctx* s = c->backlog.front();
    ssize_t r = PostSend(c, s);
    if (r == -FI_EAGAIN) return;
    c->backlog.pop_front();
    if (r < 0) {
      c->pendingBytes -= s->len + s->lentLen;
      delete s;
      Napi::Env env = c->onEvent.Env();
      Napi::HandleScope scope(env);
      Emit(c, "error", {FiError(env, static_cast<int>(r), "fi_send").Value()});
    }
  }
}

// A message came: if a reply was due, how long it took after its send teaches the adaptive bound.
void Replied(Conn* c) {
  if (!c->dueAtNs) return;
  double took = static_cast<double>(NowNs() - c->dueAtNs);
  c->dueAtNs = 0;
  c->waited.replies++;
  c->replyEwmaNs = c->replyEwmaNs ? c->replyEwmaNs + (took - c->replyEwmaNs) / 8 : took;
}

// How long to poll before sleeping, now: nothing when no reply is due (idle costs nothing);
// adaptive: twice the replies' running mean, if that is within maxSpinNs; past it, sleeping
// costs less than polling (the reply comes later than a wake-up costs), but every 16th time it
// polls the whole bound, so that a peer grown faster is seen.
uint64_t SpinBudget(Conn* c) {
  if (!c->dueAtNs || c->progressMode == 0 || !c->maxSpinNs) return 0;
  if (c->progressMode == 1) return c->maxSpinNs;
  double want = c->replyEwmaNs ? 2 * c->replyEwmaNs : static_cast<double>(c->maxSpinNs);
  if (want <= static_cast<double>(c->maxSpinNs)) return static_cast<uint64_t>(want);
  if (++c->sinceProbe >= 16) {
    c->sinceProbe = 0;
    return c->maxSpinNs;
  }
  return 0;
}

void DrainCq(Conn* c);
void Kick(Conn* c);

// Before the loop sleeps with a reply due: poll the CQ's wait fd (not sleeping) for at most the
// budget, and no longer than the loop's next timer; what comes is drained at once. Not when the
// loop would not sleep anyway (immediates, idle handles).
void Spin(Conn* c, uv_loop_t* loop) {
  uint64_t budget = SpinBudget(c);
  if (!budget || !c->cqPoll) return;
  int timeout = uv_backend_timeout(loop);
  if (timeout == 0) return;
  if (timeout > 0) budget = std::min<uint64_t>(budget, static_cast<uint64_t>(timeout) * 1'000'000);
  int fd = -1;
  if (fi_control(&c->cq->fid, FI_GETWAIT, &fd) < 0 || fd < 0) return;
  uint64_t start = NowNs(), now = start;
  // The mode's cost is the CPU the poll took: this thread's CPU clock, which a preemption
  // mid-poll does not advance (the bound itself is wall time, the reply's).
  timespec cpu0{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu0);
  c->waited.spins++;
  bool hit = false;
  while (now - start < budget && !c->closed) {
    pollfd pfd{fd, POLLIN, 0};
    if (poll(&pfd, 1, 0) > 0 && (pfd.revents & POLLIN)) {
      hit = true;
      break;
    }
    now = NowNs();
  }
  timespec cpu1{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu1);
  c->waited.spunNs += static_cast<double>(cpu1.tv_sec - cpu0.tv_sec) * 1e9 + static_cast<double>(cpu1.tv_nsec - cpu0.tv_nsec);
  if (!hit || c->closed) return;
  c->waited.hits++;
  Guarded(c, [&] { DrainCq(c); });
}

// One error completion. A receive cancelled by the close: freed with the connection.
void HandleErr(Conn* c, Ctx* x, int code, bool sendDone) {
  Napi::Env env = c->onEvent.Env();
  if (x && x->op == Op::Rma) {
    Napi::HandleScope scope(env);
    Emit(c, "rma", {Napi::Number::New(env, x->id), Napi::Number::New(env, -code)});
    delete x;
  } else if ((x && x->op == Op::Send) || sendDone) {
    if (x) SendDone(c, x);
    if (code != FI_ECANCELED) {
      Napi::HandleScope scope(env);
      Emit(c, "error", {FiError(env, -code, "fi_send").Value()});
    }
  }
}

// One completion; false once the connection closed (a handler closed it).
bool Handle(Conn* c, Ctx* x, size_t len, uint64_t flags) {
  Napi::Env env = c->onEvent.Env();
  if (x->op == Op::Recv) {
    Napi::HandleScope scope(env);
    Replied(c);
    // A view of the slot, no copy: posted again once the handler has returned, unless it
    // held the slot (a closed connection freed `x` meanwhile).
    x->state = Slot::Handling;
    c->posted--;
    // What the provider says it placed is checked before a view is made over it: its
    // parser takes a peer's header fields as they come (libfabric 1.17's tcp reports a
    // length past the posted buffer for a header whose hdr_size is smaller than the header).
    const char* bad = len > x->cap ? "a libfabric message whose length is past its receive slot"
                      : (flags & (FI_TAGGED | FI_REMOTE_CQ_DATA | FI_MULTI_RECV)) ? "a libfabric message with flags this transport never sends"
                                                                                : nullptr;
    if (bad) {
      Refuse(c, bad);
      if (c->closed) return false;
      PostRecv(c, x);
      return true;
    }
    Napi::Uint8Array msg = Napi::Uint8Array::New(env, len, c->slotBuffers[x->id].Value(), 0);
    Emit(c, "message", {msg, Napi::Number::New(env, x->id)});
    if (c->closed) return false;
    if (x->state == Slot::Handling) PostRecv(c, x);
  } else if (x->op == Op::Send) {
    SendDone(c, x);
  } else {
    Napi::HandleScope scope(env);
    Emit(c, "rma", {Napi::Number::New(env, x->id), Napi::Number::New(env, 0)});
    delete x;
  }
  return !c->closed;
}

void DrainCq(Conn* c) {
  struct Depth {
    Conn* c;
    explicit Depth(Conn* c) : c(c) { c->draining++; }
    ~Depth() { c->draining--; }
  } depth(c);
  // Sleep on the fd only when libfabric says nothing is pending (else read again), and
  // nothing FinishLent read is waiting here.
  auto mayWait = [c]() {
    Flush(c);
    fid* f = &c->cq->fid;
    return c->closed || (c->stash.empty() && fi_trywait(c->fabric, &f, 1) == FI_SUCCESS);
  };
  // Bounded: with sends queued on a dead socket fi_trywait keeps saying "not yet"; the
  // uv_poll or the tick comes back (never a spin on the event loop).
  for (int round = 0; round < 64; round++) {
    if (c->closed) return;
    // What FinishLent read first, in the order it came.
    while (!c->stash.empty()) {
      Stashed st = c->stash.front();
      c->stash.pop_front();
      if (st.err || st.sendErr) HandleErr(c, st.x, st.err ? st.err : EIO, st.sendErr);
      else if (!Handle(c, st.x, st.len, st.flags)) return;
      if (c->closed) return;
    }
    fi_cq_data_entry e[16];
    ssize_t n = fi_cq_read(c->cq, e, 16);
    if (n == -FI_EAGAIN) {
      if (mayWait()) return;
      continue;
    }
    if (n == -FI_EAVAIL) {
      fi_cq_err_entry err{};
      if (fi_cq_readerr(c->cq, &err, 0) < 0) return;
      HandleErr(c, static_cast<Ctx*>(err.op_context), err.err ? err.err : EIO, false);
      continue;
    }
    if (n < 0) return;
    for (ssize_t i = 0; i < n; i++)
      if (!Handle(c, static_cast<Ctx*>(e[i].op_context), e[i].len, e[i].flags)) return;
    // Fewer than asked for: the CQ was drained (each fi_cq_read is a progress pass, an
    // epoll_wait): fi_trywait says whether anything came meanwhile.
    if (n < 16 && mayWait()) return;
  }
}

// One progress pass of a connection from outside DrainCq (FinishLent): send completions are
// done here (native bookkeeping), the rest kept for DrainCq, which the idle handle runs next.
void StashProgress(Conn* c) {
  if (c->closed || c->threaded || !c->cq) return;
  bool kept = false;
  for (int round = 0; round < 4; round++) {
    fi_cq_data_entry e[16];
    ssize_t n = fi_cq_read(c->cq, e, 16);
    if (n == -FI_EAVAIL) {
      fi_cq_err_entry err{};
      if (fi_cq_readerr(c->cq, &err, 0) < 0) break;
      Ctx* x = static_cast<Ctx*>(err.op_context);
      int code = err.err ? err.err : EIO;
      if (x && x->op == Op::Send) {
        SendDone(c, x);
        c->stash.push_back({nullptr, 0, 0, code, true});
      } else {
        c->stash.push_back({x, 0, 0, code, false});
      }
      kept = true;
      continue;
    }
    if (n <= 0) break;
    for (ssize_t i = 0; i < n; i++) {
      Ctx* x = static_cast<Ctx*>(e[i].op_context);
      if (x->op == Op::Send) {
        SendDone(c, x);
      } else {
        c->stash.push_back({x, e[i].len, e[i].flags, 0, false});
        kept = true;
      }
    }
    if (n < 16) break;
  }
  // The backlog is posted by that DrainCq too (Flush may tell JavaScript of a failed send).
  if (kept || !c->backlog.empty()) Kick(c);
}

bool Overlaps(const Ctx* s, uintptr_t addr, size_t len, bool file) { return s->lentLen && Meets(s->Range(), addr, len, file); }

// g_before_drop: the pages [addr, addr+len) are about to be dropped. A lent send of them still
// in a backlog (not given to the provider) gets its payload copied now; a posted one is
// finished: every connection of this process is progressed (its peer may be one of them)
// until the provider has completed it, within kLendDrainNs, else EBUSY and nothing is dropped.
// Never calls JavaScript: what the passes read waits for DrainCq (StashProgress).
int FinishLent(uintptr_t addr, size_t len, bool file) {
  if (g_lentCount.load(std::memory_order_acquire) == 0) return 0;
  if (std::this_thread::get_id() != g_fabricThread) {
    std::lock_guard<std::mutex> lock(g_lentMu);
    for (const LentRange& r : g_lentRanges)
      if (Meets(r, addr, len, file)) return EBUSY;
    return 0;
  }
  std::vector<std::pair<Conn*, double>> finishing;
  for (auto& [h, c] : conns) {
    if (c->closed || c->threaded) continue;
    for (Ctx* s : c->backlog) {
      if (!Overlaps(s, addr, len, file)) continue;
      auto* buf = new uint8_t[s->len + s->lentLen];
      memcpy(buf, s->data, s->len);
      memcpy(buf + s->len, s->lentData, s->lentLen);
      s->own.reset(buf);
      s->data = buf;
      s->cap = s->len + s->lentLen;
      s->len += s->lentLen;  // pendingBytes counted both parts already
      s->Unlend();
      c->sends.copiedOnDrop++;
    }
    double n = 0;
    for (Ctx* s : c->lentPosted) n += Overlaps(s, addr, len, file);
    if (n) finishing.emplace_back(c, n);
  }
  auto pending = [&] {
    for (auto& [h, c] : conns)
      if (!c->closed)
        for (Ctx* s : c->lentPosted)
          if (Overlaps(s, addr, len, file)) return true;
    return false;
  };
  const uint64_t deadline = NowNs() + kLendDrainNs;
  while (pending()) {
    for (auto& [h, c] : conns) StashProgress(c);
    if (!pending()) break;
    if (NowNs() > deadline) return EBUSY;
    // Not a busy loop while the peer's socket is full: a short sleep between passes.
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  for (auto& [c, n] : finishing) c->sends.finishedOnDrop += n;
  return 0;
}

void Watch(Conn* c, Poll*& slot, fid_t fid, bool cq) {
  int fd = -1;
  int r = fi_control(fid, FI_GETWAIT, &fd);
  if (r < 0) throw FiError(c->onEvent.Env(), r, "fi_control(FI_GETWAIT)");
  slot = new Poll{};
  slot->conn = c;
  slot->cq = cq;
  uv_loop_t* loop = nullptr;
  napi_get_uv_event_loop(c->onEvent.Env(), &loop);
  uv_poll_init(loop, &slot->h, fd);
  uv_poll_start(&slot->h, UV_READABLE, [](uv_poll_t* h, int status, int) {
    Poll* p = reinterpret_cast<Poll*>(h);
    Conn* conn = p->conn;
    if (conn->closed) return;
    Guarded(conn, [&] {
      if (p->cq) return DrainCq(conn);
      HandleEq(conn);
      if (conn->pep) Reap(conn);
    });
  });
}

// A timer of connection `c` every `ms`, unref'd (it keeps no process alive); closed by Teardown.
uv_timer_t* Every(Napi::Env env, Conn* c, uint64_t ms, uv_timer_cb cb) {
  uv_loop_t* loop = nullptr;
  napi_get_uv_event_loop(env, &loop);
  auto* t = new uv_timer_t{};
  t->data = c;
  uv_timer_init(loop, t);
  uv_timer_start(t, cb, ms, ms);
  uv_unref(reinterpret_cast<uv_handle_t*>(t));
  return t;
}

// The endpoint of a connection (either side): CQ with a wait fd, bound with the EQ.
void OpenEndpoint(Napi::Env env, Conn* c, fi_info* info) {
  fi_cq_attr cqa{};
  cqa.format = FI_CQ_FORMAT_DATA;
  cqa.wait_obj = FI_WAIT_FD;
  cqa.size = 1024;
  FI_CHECK(env, fi_cq_open(c->domain, &cqa, &c->cq, nullptr), "fi_cq_open");
  FI_CHECK(env, fi_endpoint(c->domain, info, &c->ep, nullptr), "fi_endpoint");
  FI_CHECK(env, fi_ep_bind(c->ep, &c->eq->fid, 0), "fi_ep_bind(eq)");
  c->selective = !c->threaded && (info->tx_attr->comp_order & FI_ORDER_STRICT) != 0;
  FI_CHECK(env, fi_ep_bind(c->ep, &c->cq->fid, FI_TRANSMIT | (c->selective ? FI_SELECTIVE_COMPLETION : 0)), "fi_ep_bind(cq)");
  FI_CHECK(env, fi_ep_bind(c->ep, &c->cq->fid, FI_RECV), "fi_ep_bind(cq)");
  FI_CHECK(env, fi_enable(c->ep), "fi_enable");
  // One receive until the peer has proven itself (fabricLimits posts the rest); a threaded
  // connection carries RMA only, no messages.
  for (int i = 0; i < c->wantPosted; i++) {
    Ctx* r;
    if (c->threaded) {
      // Not zeroed: pages are touched only as messages fill them.
      r = new Ctx{};
      r->op = Op::Recv;
      r->id = static_cast<uint32_t>(i);
      r->cap = kRecvSize;
      r->own.reset(new uint8_t[kRecvSize]);
      r->data = r->own.get();
      c->recvs.push_back(r);
    } else {
      r = NewSlot(env, c);
    }
    FI_CHECK(env, PostRecv(c, r), "fi_recv");
  }
  if (c->threaded) return;  // progressed by its own thread once connected
  Watch(c, c->cqPoll, &c->cq->fid, true);
  // A peer's end (FIN/RST) signals neither wait fd: the tick (kTickMs) drives progress so a
  // dead peer becomes FI_SHUTDOWN.
  c->tick = Every(env, c, kTickMs, [](uv_timer_t* t) {
    Conn* conn = static_cast<Conn*>(t->data);
    if (conn->closed) return;
    Guarded(conn, [&] {
      DrainCq(conn);
      if (!conn->closed) HandleEq(conn);
    });
  });
  uv_loop_t* loop = nullptr;
  napi_get_uv_event_loop(env, &loop);
  c->idle = new uv_idle_t{};
  c->idle->data = c;
  uv_idle_init(loop, c->idle);
  c->settle = new uv_prepare_t{};
  c->settle->data = c;
  uv_prepare_init(loop, c->settle);
}

Conn* NewConn(Napi::Env env, Napi::Function onEvent) {
  Conn* c = new Conn{};
  c->handle = nextHandle++;
  c->onEvent = Napi::Persistent(onEvent);
  conns[c->handle] = c;
  return c;
}

void OpenEq(Napi::Env env, Conn* c) {
  fi_eq_attr eqa{};
  eqa.wait_obj = FI_WAIT_FD;
  eqa.size = 64;
  FI_CHECK(env, fi_eq_open(c->fabric, &eqa, &c->eq, nullptr), "fi_eq_open");
  Watch(c, c->eqPoll, &c->eq->fid, false);
}

// A connection request on a listener becomes a new connection handle, announced as 'connection'.
void Accept(Conn* l, fi_info* info) {
  Napi::Env env = l->onEvent.Env();
  Conn* c = NewConn(env, l->onEvent.Value());
  c->info = info;
  c->threaded = l->threaded;
  try {
    FI_CHECK(env, fi.fabric(info->fabric_attr, &c->fabric, nullptr), "fi_fabric");
    OpenEq(env, c);
    FI_CHECK(env, fi_domain(c->fabric, info, &c->domain, nullptr), "fi_domain");
    OpenEndpoint(env, c, info);
    FI_CHECK(env, fi_accept(c->ep, nullptr, 0), "fi_accept");
  } catch (const Napi::Error& e) {
    fi_reject(l->pep, info->handle, nullptr, 0);
    Teardown(c);
    conns.erase(c->handle);
    delete c;
    Napi::HandleScope scope(env);
    Emit(l, "error", {e.Value()});
    return;
  }
  Napi::HandleScope scope(env);
  Emit(l, "connection", {Napi::Number::New(env, c->handle)});
}

// "ADDRESS:PORT" of a connection request's peer ("" if the provider gave none).
std::string PeerAddress(const fi_info* info) {
  char host[INET6_ADDRSTRLEN] = "";
  const auto* sa = static_cast<const sockaddr*>(info->dest_addr);
  if (!sa) return "";
  if (sa->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
    return std::string(host) + ":" + std::to_string(ntohs(in->sin_port));
  }
  if (sa->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
    inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
    return std::string(host) + ":" + std::to_string(ntohs(in6->sin6_port));
  }
  return "";
}

// A connection request: JavaScript says whether it is wanted ('request' returns true), with
// the peer's address. One refused is rejected in the connection manager, before any endpoint
// exists for it: none of the peer's messages is ever parsed.
void OnRequest(Conn* l, fi_info* info) {
  Napi::Env env = l->onEvent.Env();
  Napi::HandleScope scope(env);
  if (Emit(l, "request", {Napi::String::New(env, PeerAddress(info))})) return Accept(l, info);
  fi_reject(l->pep, info->handle, nullptr, 0);
  fi.freeinfo(info);
}

// A listener's bare connections (bare_sockets.h) past their time, or past how many may wait,
// are shut down; each is told to JavaScript as refused. At most every few ms: a crowd of new
// connections wakes the listener once each.
void Reap(Conn* l) {
  uint64_t now = NowNs();
  if (!l->bareMs || l->closed || now - l->reapedAtNs < 5'000'000) return;
  l->reapedAtNs = now;
  size_t n = ReapBareSockets(l->port, l->bare, now, l->bareMs * 1'000'000, l->maxBare);
  for (size_t i = 0; i < n && !l->closed; i++) Refuse(l, "a connection that sent no connection request");
}

void HandleEq(Conn* c) {
  Napi::Env env = c->onEvent.Env();
  for (int round = 0; round < 64; round++) {
    if (c->closed) return;
    uint32_t event = 0;
    alignas(fi_eq_cm_entry) uint8_t raw[sizeof(fi_eq_cm_entry) + 256];
    ssize_t n = fi_eq_read(c->eq, &event, raw, sizeof raw, 0);
    if (n == -FI_EAGAIN) {
      fid* f = &c->eq->fid;
      if (fi_trywait(c->fabric, &f, 1) == FI_SUCCESS) return;
      continue;
    }
    if (n == -FI_EAVAIL) {
      fi_eq_err_entry err{};
      fi_eq_readerr(c->eq, &err, 0);
      Napi::HandleScope scope(env);
      int code = err.err ? err.err : ECONNREFUSED;
      Emit(c, c->connected ? "shutdown" : "error", {FiError(env, -code, c->pep ? "fi_listen" : "fi_connect").Value()});
      continue;
    }
    if (n < 0) return;
    auto* cm = reinterpret_cast<fi_eq_cm_entry*>(raw);
    if (event == FI_CONNREQ) {
      OnRequest(c, cm->info);
    } else if (event == FI_CONNECTED) {
      c->connected = true;
      Napi::HandleScope scope(env);
      if (c->threaded) {
        // From here on only the progress thread touches this connection's EQ and CQ.
        long tid = StartProgress(c);
        Emit(c, "connected", {Napi::Number::New(env, static_cast<double>(tid))});
        return;
      }
      Emit(c, "connected", {});
    } else if (event == FI_SHUTDOWN) {
      c->connected = false;
      Napi::HandleScope scope(env);
      Emit(c, "shutdown", {});
    }
  }
}

fi_info* GetInfo(Napi::Env env, const std::string& provider, const char* node, const char* service, bool source) {
  LoadFi(env);
  fi_info* hints = fi.dupinfo(nullptr);
  hints->ep_attr->type = FI_EP_MSG;
  hints->caps = FI_MSG | FI_RMA;
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  hints->domain_attr->mr_mode = FI_MR_VIRT_ADDR | FI_MR_PROV_KEY | FI_MR_ALLOCATED | FI_MR_LOCAL | FI_MR_ENDPOINT;
  hints->domain_attr->threading = FI_THREAD_SAFE;
  hints->fabric_attr->prov_name = strdup(provider.c_str());
  hints->addr_format = FI_SOCKADDR_IN;
  fi_info* info = nullptr;
  int r = GetInfoKeepingSignals(FI_VERSION(1, 17), node, service, source ? FI_SOURCE : 0, hints, &info);
  fi.freeinfo(hints);
  if (r < 0) throw FiError(env, r, "fi_getinfo");
  return info;
}

Conn* Require(const Napi::CallbackInfo& info, size_t i) {
  uint32_t h = ArgU32(info, i, "handle");
  auto it = conns.find(h);
  if (it == conns.end() || it->second->closed) throw Napi::TypeError::New(info.Env(), "fabric: unknown or closed handle");
  return it->second;
}

// fabricListen(provider, host|null, port, onEvent, threaded) -> { handle, port }; a threaded
// listener's connections announce 'connected' with their progress thread's tid.
Napi::Value Listen(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::string provider = info[0].As<Napi::String>();
  std::string host = info[1].IsString() ? info[1].As<Napi::String>().Utf8Value() : "0.0.0.0";
  std::string port = std::to_string(ArgU32(info, 2, "port"));
  Conn* c = NewConn(env, info[3].As<Napi::Function>());
  c->threaded = info.Length() > 4 && ArgBool(info, 4);
  try {
    c->info = GetInfo(env, provider, host.c_str(), port.c_str(), true);
    FI_CHECK(env, fi.fabric(c->info->fabric_attr, &c->fabric, nullptr), "fi_fabric");
    OpenEq(env, c);
    FI_CHECK(env, fi_passive_ep(c->fabric, c->info, &c->pep, nullptr), "fi_passive_ep");
    FI_CHECK(env, fi_pep_bind(c->pep, &c->eq->fid, 0), "fi_pep_bind");
    FI_CHECK(env, fi_listen(c->pep), "fi_listen");
  } catch (...) {
    Teardown(c);
    conns.erase(c->handle);
    delete c;
    throw;
  }
  sockaddr_in sa{};
  size_t len = sizeof sa;
  fi_getname(&c->pep->fid, &sa, &len);
  c->port = ntohs(sa.sin_port);
  Napi::Object o = Napi::Object::New(env);
  o.Set("handle", c->handle);
  o.Set("port", c->port);
  return o;
}

// fabricConnect(provider, host, port, onEvent) -> handle; 'connected' or 'error' follows.
Napi::Value Connect(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::string provider = info[0].As<Napi::String>();
  std::string host = info[1].As<Napi::String>();
  std::string port = std::to_string(ArgU32(info, 2, "port"));
  Conn* c = NewConn(env, info[3].As<Napi::Function>());
  try {
    c->info = GetInfo(env, provider, host.c_str(), port.c_str(), false);
    FI_CHECK(env, fi.fabric(c->info->fabric_attr, &c->fabric, nullptr), "fi_fabric");
    OpenEq(env, c);
    FI_CHECK(env, fi_domain(c->fabric, c->info, &c->domain, nullptr), "fi_domain");
    OpenEndpoint(env, c, c->info);
    FI_CHECK(env, fi_connect(c->ep, c->info->dest_addr, nullptr, 0), "fi_connect");
  } catch (...) {
    Teardown(c);
    conns.erase(c->handle);
    delete c;
    throw;
  }
  return Napi::Number::New(env, c->handle);
}

// tcp's progress is manual: what the socket did not take yet of an operation stays queued in
// the provider (or in its socket's staging buffer) until progress runs, and only progress arms
// the wait fd for POLLOUT. Inside DrainCq its loop progresses next; after an operation from
// anywhere else the idle handle drains on the loop's next turn, before it sleeps, never inside
// the call (its events would reach JavaScript inside fabricSend). Without it the rest would
// wait for the next event or the tick.
void Kick(Conn* c) {
  if (c->draining || !c->idle) return;
  uv_idle_start(c->idle, [](uv_idle_t* h) {
    uv_idle_stop(h);
    Conn* conn = static_cast<Conn*>(h->data);
    if (conn->closed) return;
    Guarded(conn, [&] { DrainCq(conn); });
  });
}

// After sends from outside DrainCq: before the loop next sleeps, one fi_trywait for all of
// them (one progress pass, no loop turn) arms POLLOUT for what the socket did not take; only if
// something is pending already does the idle drain.
void Settle(Conn* c) {
  if (!c->settle || (c->draining && !c->dueAtNs)) return;
  uv_prepare_start(c->settle, [](uv_prepare_t* h) {
    uv_prepare_stop(h);
    Conn* conn = static_cast<Conn*>(h->data);
    if (conn->closed) return;
    fid* f = &conn->cq->fid;
    if (fi_trywait(conn->fabric, &f, 1) != FI_SUCCESS) return Kick(conn);
    Spin(conn, h->loop);
  });
}

// fabricSend(handle, bytes | [bytes, ...], due?, lend?): one message, the parts gathered in order
// into a (reused) send buffer: the only copy; a send the provider cannot take now waits in a
// backlog. `due`: the message asks for an answer (see Spin). `lend` [regionId, offset]: the last
// part is that region's bytes at offset: sent from there, not copied, if every page of it is
// present (a presence proof: PresenceProofs) and the provider reads local buffers without a
// registration (no FI_MR_LOCAL: tcp); else copied as the others. A lent payload's pages are
// held mapped until the send completes, and a drop of them finishes the send first (FinishLent).
// Presence proofs of lent sends' sources (this thread's only: see g_fabricThread).
// PFR_FABRIC_COPY_SENDS=1: every payload copied, as before lending (to measure one against the other).
bool CopySends() {
  static const bool copy = [] {
    const char* v = getenv("PFR_FABRIC_COPY_SENDS");
    return v && *v && strcmp(v, "0") != 0;
  }();
  return copy;
}

PresenceProofs& SendProofs() {
  static PresenceProofs proofs;
  return proofs;
}

Napi::Value Send(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Conn* c = Require(info, 0);
  std::vector<Napi::Uint8Array> parts;
  if (info[1].IsArray()) {
    Napi::Array list = info[1].As<Napi::Array>();
    for (uint32_t i = 0; i < list.Length(); i++) {
      Napi::Value v = list.Get(i);
      if (!v.IsTypedArray() || v.As<Napi::TypedArray>().TypedArrayType() != napi_uint8_array)
        throw Napi::TypeError::New(env, "fabricSend: every part must be a Uint8Array");
      parts.push_back(v.As<Napi::Uint8Array>());
    }
  } else if (info[1].IsTypedArray() && info[1].As<Napi::TypedArray>().TypedArrayType() == napi_uint8_array) {
    parts.push_back(info[1].As<Napi::Uint8Array>());
  } else {
    throw Napi::TypeError::New(env, "fabricSend: bytes must be a Uint8Array or an array of them");
  }
  size_t total = 0;
  for (auto& p : parts) total += p.ByteLength();
  if (total > kRecvSize) throw Napi::RangeError::New(env, "fabricSend: message larger than the receive buffers");
  if (c->maxPending && c->pendingBytes + total > c->maxPending) {
    Napi::Error e = Napi::RangeError::New(env, "fabricSend: " + std::to_string(c->pendingBytes) + " bytes wait for the peer to read them already (the bound is " +
                                                   std::to_string(c->maxPending) + ")");
    e.Set("code", Napi::String::New(env, "ENOBUFS"));
    throw e;
  }
  if (info.Length() > 2 && info[2].IsBoolean() && info[2].As<Napi::Boolean>().Value() && !c->dueAtNs) c->dueAtNs = NowNs();
  std::shared_ptr<Mapping> lend;
  size_t lendLen = 0;
  if (info.Length() > 3 && info[3].IsArray() && parts.size() > 0) {
    Napi::Array a = info[3].As<Napi::Array>();
    Napi::Uint8Array& last = parts.back();
    size_t off = 0, n = 0;
    auto m = RequireRange(env, a.Get(0u), a.Get(1u), Napi::Number::New(env, static_cast<double>(last.ByteLength())), &off, &n, true);
    if (!m->foreign() && m->addr + off != last.Data()) throw Napi::RangeError::New(env, "fabricSend: the last part is not the region's bytes at that offset");
    const bool lendable = !CopySends() && !m->foreign() && !c->threaded && std::this_thread::get_id() == g_fabricThread && c->info && c->info->tx_attr->iov_limit >= 2 &&
                          !(c->info->domain_attr->mr_mode & FI_MR_LOCAL);
    int reads = 0;
    if (n && lendable && SendProofs().Present(*m, off, n, &reads)) {
      lend = std::move(m);
      lendLen = n;
      c->sends.lent++;
      c->sends.lentBytes += static_cast<double>(n);
    } else {
      c->sends.copied++;
      c->sends.copiedBytes += static_cast<double>(n);
    }
  }
  Ctx* s = TakeSend(c, total - lendLen);
  c->pendingBytes += total;
  size_t at = 0;
  for (size_t i = 0; i < parts.size() - (lendLen ? 1 : 0); i++) {
    auto& p = parts[i];
    if (p.ByteLength()) memcpy(s->data + at, p.Data(), p.ByteLength());
    at += p.ByteLength();
  }
  if (lendLen) s->Lend(std::move(lend), parts.back().Data(), lendLen);
  if (!c->backlog.empty()) {
    c->backlog.push_back(s);
    return env.Undefined();
  }
  ssize_t r = PostSend(c, s);
  if (r == -FI_EAGAIN) {
    c->backlog.push_back(s);
    DrainCq(c);
  } else if (r >= 0) {
    Settle(c);
  } else {
    c->pendingBytes -= total;
    delete s;  // a lent payload's range goes with it (~Ctx)
    throw FiError(env, static_cast<int>(r), "fi_send");
  }
  return env.Undefined();
}

Ctx* RequireSlot(const Napi::CallbackInfo& info, Conn* c) {
  uint32_t slot = ArgU32(info, 1, "slot");
  if (c->threaded || slot >= c->slots.size()) throw Napi::RangeError::New(info.Env(), "fabric: no such receive slot");
  return c->recvs[slot];
}

// fabricHold(handle, slot) -> { id, address, buffer, pageSize } | null: from the 'message'
// handler of that slot, keep it (its bytes stay put) until fabricRelease; another slot is
// posted in its place. null: every slot is taken (kMaxSlots), copy the bytes instead.
Napi::Value Hold(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Conn* c = Require(info, 0);
  Ctx* x = RequireSlot(info, c);
  if (x->state != Slot::Handling && x->state != Slot::Held)
    throw Napi::Error::New(env, "fabricHold: a slot is held from its own message's handler");
  if (x->state == Slot::Handling) {
    Ctx* next = nullptr;
    if (!c->spare.empty()) {
      next = c->recvs[c->spare.back()];
      c->spare.pop_back();
    } else if (c->slots.size() < c->maxSlots) {
      next = NewSlot(env, c);
    } else {
      return env.Null();
    }
    int r = PostRecv(c, next);
    if (r < 0) {
      next->state = Slot::Spare;
      c->spare.push_back(next->id);
      throw FiError(env, r, "fi_recv");
    }
    x->state = Slot::Held;
  }
  return c->slots[x->id].Value();
}

// fabricRelease(handle, slot): a held slot's bytes are no longer needed: posted again, or
// kept spare while enough others are posted.
Napi::Value Release(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Conn* c = Require(info, 0);
  Ctx* x = RequireSlot(info, c);
  if (x->state != Slot::Held) throw Napi::Error::New(env, "fabricRelease: the slot is not held");
  if (c->posted < c->wantPosted) {
    int r = PostRecv(c, x);
    if (r < 0) throw FiError(env, r, "fi_recv");
  } else {
    x->state = Slot::Spare;
    c->spare.push_back(x->id);
  }
  return env.Undefined();
}

// fabricMrReg(handle, address, length, access) -> { id, key, base }: memory the peer may
// fi_write/fi_read at base + offset (base is 0 where mr_mode lacks FI_MR_VIRT_ADDR: tcp).
Napi::Value MrReg(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Conn* c = Require(info, 0);
  uint64_t addr = ArgAddr(info, 1, "address");
  size_t len = ArgSize(info, 2, "length");
  uint64_t access = ArgU32(info, 3, "access");
  fid_mr* mr = nullptr;
  FI_CHECK(env, fi_mr_reg(c->domain, reinterpret_cast<void*>(addr), len, access, 0, 0, 0, &mr, nullptr), "fi_mr_reg");
  uint32_t id = c->nextMr++;
  c->mrs[id] = mr;
  Napi::Object o = Napi::Object::New(env);
  o.Set("id", id);
  o.Set("key", Napi::BigInt::New(env, static_cast<uint64_t>(fi_mr_key(mr))));
  bool virt = (c->info->domain_attr->mr_mode & FI_MR_VIRT_ADDR) != 0;
  o.Set("base", Napi::BigInt::New(env, virt ? addr : 0));
  return o;
}

Napi::Value MrDereg(const Napi::CallbackInfo& info) {
  Conn* c = Require(info, 0);
  auto it = c->mrs.find(ArgU32(info, 1, "mr"));
  if (it != c->mrs.end()) {
    fi_close(&it->second->fid);
    c->mrs.erase(it);
  }
  return info.Env().Undefined();
}

// fabricRma(handle, write, id, localAddress, length, remoteAddress, key): 'rma' (id, 0 or -errno) follows.
Napi::Value Rma(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Conn* c = Require(info, 0);
  bool write = ArgBool(info, 1);
  uint32_t id = ArgU32(info, 2, "id");
  uint64_t local = ArgAddr(info, 3, "localAddress");
  size_t len = ArgSize(info, 4, "length");
  uint64_t remote = ArgAddr(info, 5, "remoteAddress");
  uint64_t key = ArgAddr(info, 6, "key");
  Ctx* x = new Ctx{};
  x->op = Op::Rma;
  x->id = id;
  ssize_t r;
  do {
    // A write completes once the target has placed it (FI_DELIVERY_COMPLETE), as an RDMA
    // WRITE completes on the responder's ACK: in stall mode that is after its faults resolved.
    iovec iov{reinterpret_cast<void*>(local), len};
    fi_rma_iov rma{remote, len, key};
    fi_msg_rma msg{};
    msg.msg_iov = &iov;
    msg.iov_count = 1;
    msg.rma_iov = &rma;
    msg.rma_iov_count = 1;
    msg.context = &x->fi;
    r = write ? fi_writemsg(c->ep, &msg, FI_COMPLETION | FI_DELIVERY_COMPLETE)
              : fi_readmsg(c->ep, &msg, FI_COMPLETION);
    if (r == -FI_EAGAIN) fi_cq_read(c->cq, nullptr, 0);  // progress, then try again
  } while (r == -FI_EAGAIN);
  if (r < 0) {
    delete x;
    throw FiError(env, static_cast<int>(r), write ? "fi_write" : "fi_read");
  }
  Kick(c);
  return env.Undefined();
}

// A closed connection's struct is freed in the loop's close phase, once the callback that
// closed it has returned: a close from inside an event handler returns into DrainCq or
// HandleEq, which check `closed` after every event. (Each connection a peer opens would
// otherwise leave its struct behind: a few KiB.) A threaded connection's progress thread,
// detached, frees its libfabric objects itself and still reads the struct: that one stays.
void Bury(Napi::Env env, Conn* c) {
  if (c->threaded && c->tid != 0) return;
  uv_loop_t* loop = nullptr;
  napi_get_uv_event_loop(env, &loop);
  auto* grave = new uv_timer_t{};
  grave->data = c;
  uv_timer_init(loop, grave);
  uv_close(reinterpret_cast<uv_handle_t*>(grave), [](uv_handle_t* h) {
    delete static_cast<Conn*>(h->data);
    delete reinterpret_cast<uv_timer_t*>(h);
  });
}

// Post receives until `posted` are (new slots, or spare ones), as Release keeps them.
void PostUpTo(Napi::Env env, Conn* c) {
  while (c->posted < c->wantPosted && !c->threaded) {
    Ctx* next;
    if (!c->spare.empty()) {
      next = c->recvs[c->spare.back()];
      c->spare.pop_back();
    } else if (c->slots.size() < c->maxSlots) {
      next = NewSlot(env, c);
    } else {
      return;
    }
    int r = PostRecv(c, next);
    if (r < 0) {
      next->state = Slot::Spare;
      c->spare.push_back(next->id);
      throw FiError(env, r, "fi_recv");
    }
  }
}

// fabricLimits(handle, { posted?, maxSlots?, maxPending?, bareMs?, maxBare? }): the bounds
// JavaScript chose (see Conn). A connection: receives to keep posted (more are posted at once),
// slots at most, bytes of unfinished sends at most (fabricSend throws ENOBUFS past it). A
// listener: bare connections are shut down after bareMs, and the oldest past maxBare.
// fabricProgress(handle, { mode?: 0 | 1 | 2, maxSpinUs? }?) -> { spins, hits, spunUs, replies,
// replyUs }: set how the connection waits for a reply it expects (see Spin), and what it did.
Napi::Value Progress(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Conn* c = Require(info, 0);
  if (info.Length() > 1 && !info[1].IsUndefined()) {
    if (!info[1].IsObject()) throw Napi::TypeError::New(env, "fabricProgress: options must be an object");
    Napi::Object o = info[1].As<Napi::Object>();
    Napi::Value mode = o.Get("mode"), spin = o.Get("maxSpinUs");
    if (!mode.IsUndefined()) {
      double m = mode.IsNumber() ? mode.As<Napi::Number>().DoubleValue() : -1;
      if (m != 0 && m != 1 && m != 2) throw Napi::RangeError::New(env, "fabricProgress: mode must be 0 (wait), 1 (poll) or 2 (adaptive)");
      c->progressMode = static_cast<int>(m);
    }
    if (!spin.IsUndefined()) {
      double us = spin.IsNumber() ? spin.As<Napi::Number>().DoubleValue() : -1;
      if (!(us >= 0 && us <= 1'000'000)) throw Napi::RangeError::New(env, "fabricProgress: maxSpinUs must be between 0 and 1000000");
      c->maxSpinNs = static_cast<uint64_t>(us * 1000);
    }
  }
  Napi::Object r = Napi::Object::New(env);
  r.Set("spins", c->waited.spins);
  r.Set("hits", c->waited.hits);
  r.Set("spunUs", c->waited.spunNs / 1000);
  r.Set("replies", c->waited.replies);
  r.Set("replyUs", c->replyEwmaNs / 1000);
  Napi::Object sends = Napi::Object::New(env);
  sends.Set("lent", c->sends.lent);
  sends.Set("copied", c->sends.copied);
  sends.Set("lentBytes", c->sends.lentBytes);
  sends.Set("copiedBytes", c->sends.copiedBytes);
  sends.Set("finishedOnDrop", c->sends.finishedOnDrop);
  sends.Set("copiedOnDrop", c->sends.copiedOnDrop);
  sends.Set("lentNow", static_cast<double>(c->lentPosted.size()));
  r.Set("sends", sends);
  return r;
}

Napi::Value Limits(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Conn* c = Require(info, 0);
  if (!info[1].IsObject()) throw Napi::TypeError::New(env, "fabricLimits: limits must be an object");
  Napi::Object o = info[1].As<Napi::Object>();
  auto num = [&](const char* k, double max) -> double {
    Napi::Value v = o.Get(k);
    double d = v.IsNumber() ? v.As<Napi::Number>().DoubleValue() : -1;
    if (!v.IsUndefined() && !(d >= 0 && d <= max && d == static_cast<double>(static_cast<uint64_t>(d))))
      throw Napi::RangeError::New(env, std::string("fabricLimits: ") + k + " out of range");
    return v.IsUndefined() ? -1 : d;
  };
  double maxSlots = num("maxSlots", kMaxSlots), posted = num("posted", kMaxSlots);
  double maxPending = num("maxPending", 9007199254740991.0), bareMs = num("bareMs", 86'400'000), maxBare = num("maxBare", 1 << 20);
  if (maxSlots >= 1) c->maxSlots = static_cast<size_t>(maxSlots);
  if (maxPending >= 0) c->maxPending = static_cast<size_t>(maxPending);
  if (maxBare >= 0) c->maxBare = static_cast<size_t>(maxBare);
  // Not on a threaded listener: its connections' sockets are another thread's (bare_sockets.cc).
  if (bareMs >= 0 && c->pep && !c->threaded) {
    c->bareMs = static_cast<uint64_t>(bareMs);
    if (!c->reap && c->bareMs)
      c->reap = Every(env, c, kReapMs, [](uv_timer_t* t) {
        Conn* l = static_cast<Conn*>(t->data);
        if (!l->closed) Guarded(l, [&] { Reap(l); });
      });
  }
  if (posted >= 1 && c->ep && !c->threaded) {
    c->wantPosted = static_cast<int>(std::min<double>(posted, static_cast<double>(c->maxSlots)));
    PostUpTo(env, c);
  }
  return env.Undefined();
}

Napi::Value Close(const Napi::CallbackInfo& info) {
  uint32_t h = ArgU32(info, 0, "handle");
  auto it = conns.find(h);
  if (it == conns.end()) return info.Env().Undefined();
  Conn* c = it->second;
  conns.erase(it);
  Teardown(c);
  c->onEvent.Reset();
  Bury(info.Env(), c);
  return info.Env().Undefined();
}

}  // namespace

void InitFabric(Napi::Env env, Napi::Object exports) {
  // The thread whose connections may lend pages: the first to load the transport (the main
  // thread of a program; a worker's sends are copied).
  static std::once_flag once;
  std::call_once(once, [] {
    g_fabricThread = std::this_thread::get_id();
    g_before_drop = FinishLent;
  });
  exports.Set("fabricListen", Napi::Function::New(env, Listen));
  exports.Set("fabricConnect", Napi::Function::New(env, Connect));
  exports.Set("fabricSend", Napi::Function::New(env, Send));
  exports.Set("fabricHold", Napi::Function::New(env, Hold));
  exports.Set("fabricRelease", Napi::Function::New(env, Release));
  exports.Set("fabricMrReg", Napi::Function::New(env, MrReg));
  exports.Set("fabricMrDereg", Napi::Function::New(env, MrDereg));
  exports.Set("fabricRma", Napi::Function::New(env, Rma));
  exports.Set("fabricClose", Napi::Function::New(env, Close));
  exports.Set("fabricLimits", Napi::Function::New(env, Limits));
  exports.Set("fabricProgress", Napi::Function::New(env, Progress));
}

}  // namespace pfr
