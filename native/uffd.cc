// userfaultfd: the handshake, registration, resolution ioctls, and the reader thread.
//
// Threads (docs/threads.md has the whole picture):
// - The handler thread is the JS thread that opened the uffd. It runs the TypeScript fault
//   handler, so it must never wait on a fault of its own: the reader thread resolves that
//   thread's faults itself, at once, with the region's default (zero page / CONTINUE /
//   write-unprotect), and only reports them.
// - The reader thread (one per uffd, never a libuv pool thread) polls the uffd and an
//   eventfd used to stop it, reads events in batches, and hands every fault of any other
//   thread (native toucher, copy-engine threads, workers) to JS through a thread-safe
//   function. It also runs the watchdog: a forwarded fault not resolved in time is resolved
//   with the default and reported, so no thread stays blocked.
//
// Fork: with UFFD_FEATURE_EVENT_FORK the forking thread waits in the kernel until the FORK
// event is read, and glibc's fork() holds every malloc arena lock meanwhile. So the reader
// allocates nothing between poll() and read(): its batch lives on the stack until the
// events are read, and the watchdog works in a fixed array.
#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <uv.h>

#include <array>
#include <atomic>
#include <map>
#include <thread>
#include <vector>

#include "common.h"
#include "kernel_abi.h"

namespace pfr {

namespace {

// Event kinds in the batch handed to JS (7 numbers per event).
enum EventKind : int {
  kFault = 0,          // forwarded: the TS handler must resolve it
  kFaultResolved = 1,  // the handler thread's own fault, resolved natively
  kTimeout = 2,        // a forwarded fault the watchdog resolved with the default
  kRemove = 3,
  kUnmap = 4,
  kRemap = 5,
  kResolveError = 6,   // a native resolution failed (errno in the last field)
  kFork = 7,           // the process forked (UFFD_FEATURE_EVENT_FORK); the child's uffd was closed
};
constexpr int kEventWidth = 7;

enum FaultFlag : int { kWrite = 1, kWp = 2, kMinor = 4 };

struct Batch {
  std::vector<double> events;
  // Each event's address again, as the 64-bit integer a BigUint64Array hands JS as a BigInt
  // with no conversion: BigInt(number) is a runtime call, about 60 ns a fault.
  std::vector<uint64_t> addresses;
};

// When a batch was read (the poll callback) or reaches JS (the thread-safe function), in ms of
// CLOCK_MONOTONIC, the clock of process.hrtime() and performance.now(): the poll callback's
// read already took that clock, and performance.now() in JS costs ~110 ns more.
Napi::Value ReceivedMs(Napi::Env env, uint64_t ns = NowNs()) { return Napi::Number::New(env, static_cast<double>(ns) / 1e6); }

class Uffd;
void CallJs(Napi::Env env, Napi::Function cb, std::shared_ptr<Uffd>* ctx, Batch* batch);
using Tsfn = Napi::TypedThreadSafeFunction<std::shared_ptr<Uffd>, Batch, CallJs>;

struct Range {
  uint64_t start;
  uint64_t len;
  uint32_t region;
  uint64_t mode;
  uint64_t granule;  // the page size of the memory: 4 KiB, or 2 MiB for hugetlb
};

// A read-only anonymous mapping of zeros as large as the largest page (2 MiB hugetlb):
// the source of UFFDIO_COPY where UFFDIO_ZEROPAGE does not exist (hugetlb). Made once, on
// the JS thread, so the reader never allocates for it.
constexpr uint64_t kMaxGranule = 2u << 20;
const uint8_t* Zeros() {
  static const uint8_t* zeros = [] {
    void* p = mmap(nullptr, kMaxGranule, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? nullptr : static_cast<const uint8_t*>(p);
  }();
  return zeros;
}

// A forwarded fault awaiting the handler. The kind is kept because the default resolution
// depends on it: a zero page does not end a write-protect or a minor fault (the page is
// there already, so ZEROPAGE says EEXIST, wakes, and the thread faults again forever).
struct Pending {
  uint64_t deadline;  // ns
  int flags;
  uint64_t granule;
};

// Two faults of one page are the same fault only if they are of the same kind: a
// write-protect fault that follows a copy at once is a new fault, never a duplicate.
inline bool SameKind(int a, int b) { return (a & (kWp | kMinor)) == (b & (kWp | kMinor)); }

class Uffd {
 public:
  int fd = -1;
  int stopfd = -1;
  int kickfd = -1;
  uint64_t features = 0;   // what this uffd asked for and the kernel enabled
  uint64_t available = 0;  // what the kernel offers
  uint64_t ioctls = 0;
  std::string how;  // "syscall", "user-mode-only" or "/dev/userfaultfd"
  pid_t handler_tid = 0;
  napi_env env = nullptr;
  std::atomic<uint64_t> timeout_ns{5'000'000'000ull};
  std::atomic<bool> closed{false};
  bool started = false;
  std::thread reader;
  Tsfn tsfn;
  // Event-loop delivery: the JS thread reads the uffd itself from a uv_poll_t (two thread
  // hand-offs per fault, like a C handler), and the reader thread only guards: it takes
  // over when the JS thread stops reading (blocked in a fault of its own, or busy).
  bool event_loop = false;
  uv_poll_t* poll_handle = nullptr;
  Napi::FunctionReference callback;
  std::unique_ptr<Napi::AsyncContext> async;
  // What the poll callback fills (reserved once) and the Float64Array every batch is copied
  // into and handed over in, with its length: nothing is allocated per batch.
  Batch loop_batch;
  Napi::Reference<Napi::Float64Array> loop_events;
  Napi::Reference<Napi::BigUint64Array> loop_addresses;
  double* loop_data = nullptr;  // their elements (an ArrayBuffer's backing store does not move)
  uint64_t* loop_address_data = nullptr;
  std::atomic<uint64_t> main_polls{0};
  // The guard sleeps without a timeout only while nothing is outstanding. A fault the JS
  // thread reads first never wakes it (poll() sees the uffd readable no more), so whoever
  // makes a fault outstanding while it sleeps must wake it, or the watchdog never fires.
  std::atomic<bool> guard_asleep{false};
  std::atomic<bool> take_over{false};  // a kick asks the guard to read, not only to re-arm

  std::mutex mu;  // guards ranges and outstanding
  std::map<uint64_t, Range> ranges;
  std::unordered_map<uint64_t, Pending> outstanding;  // page address -> deadline and kind

  // statistics, read by JS
  std::atomic<uint64_t> st_reads{0}, st_events{0}, st_forwarded{0}, st_native{0}, st_timeouts{0}, st_duplicates{0}, st_forks{0};

  ~Uffd() {
    if (fd >= 0) close(fd);
    if (stopfd >= 0) close(stopfd);
    if (kickfd >= 0) close(kickfd);
  }

  const Range* FindRangeLocked(uint64_t addr) const {
    auto it = ranges.upper_bound(addr);
    if (it == ranges.begin()) return nullptr;
    --it;
    const Range& r = it->second;
    return addr < r.start + r.len ? &r : nullptr;
  }

  uint64_t GranuleAt(uint64_t addr) {
    std::lock_guard<std::mutex> lock(mu);
    const Range* r = FindRangeLocked(addr);
    return r ? r->granule : static_cast<uint64_t>(PageSize());
  }

  int Ioctl(unsigned long req, void* arg) { return ioctl(fd, req, arg) == 0 ? 0 : errno; }

  int Wake(uint64_t start, uint64_t len) {
    uffdio_range r{start, len};
    return Ioctl(UFFDIO_WAKE, &r);
  }

  // Resolve one page with the region's default content. EEXIST means someone resolved it
  // first: wake, success. Returns 0 or an errno.
  int ResolveDefault(uint64_t page, int flags, uint64_t ps) {
    int err;
    for (int attempt = 0; attempt < 100; attempt++) {
      if (flags & kWp) {
        uffdio_writeprotect wp{{page, ps}, 0};
        err = Ioctl(UFFDIO_WRITEPROTECT, &wp);
      } else if (flags & kMinor) {
        uffdio_continue c{{page, ps}, 0, 0};
        err = Ioctl(UFFDIO_CONTINUE, &c);
      } else {
        uffdio_zeropage z{{page, ps}, 0, 0};
        err = Ioctl(UFFDIO_ZEROPAGE, &z);
        if ((err == EINVAL || err == ENOTSUP) && Zeros() != nullptr && ps <= kMaxGranule) {  // hugetlb has no ZEROPAGE: copy zeros
          uffdio_copy cp{page, reinterpret_cast<uint64_t>(Zeros()), ps, 0, 0};
          err = Ioctl(UFFDIO_COPY, &cp);
        }
      }
      if (err == EEXIST) return Wake(page, ps);
      if (err == ENOENT || err == ESRCH) return 0;  // range gone (unregistered / unmapped): nobody waits
      if (err != EAGAIN) return err;
      std::this_thread::sleep_for(std::chrono::microseconds(50));  // mmap changing: retry
    }
    return err;
  }

  // The forwarded faults a resolution took out of the table, to put back if it fails. A
  // resolution usually takes one or a few: those are kept inline, so it allocates nothing.
  class Taken {
   public:
    void Add(const std::pair<const uint64_t, Pending>& e) {
      if (n_ < few_.size()) few_[n_++] = e;
      else more_.push_back(e);
    }
    bool empty() const { return n_ == 0; }
    template <typename F>
    void ForEach(F f) const {
      for (size_t i = 0; i < n_; i++) f(few_[i]);
      for (const auto& e : more_) f(e);
    }

   private:
    std::array<std::pair<uint64_t, Pending>, 4> few_;
    size_t n_ = 0;
    std::vector<std::pair<uint64_t, Pending>> more_;
  };

  // Stop tracking the forwarded faults of a range. Called *before* the ioctl that resolves
  // and wakes them: a thread woken by it may fault on the same page at once (a write after
  // a write-protected copy), and the reader must see that as a new fault, not a duplicate.
  Taken Take(uint64_t start, uint64_t len) {
    std::lock_guard<std::mutex> lock(mu);
    return TakeLocked(start, len);
  }

  // What a resolution of [start, start+len) needs before its ioctl, under one lock: the page
  // size there, and (when it wakes) the range's forwarded faults taken out (see Take).
  uint64_t Begin(uint64_t start, uint64_t len, bool take, Taken* taken) {
    std::lock_guard<std::mutex> lock(mu);
    const Range* r = FindRangeLocked(start);
    if (take) *taken = TakeLocked(start, len);
    return r ? r->granule : static_cast<uint64_t>(PageSize());
  }

  Taken TakeLocked(uint64_t start, uint64_t len) {
    Taken out;
    if (outstanding.empty()) return out;
    const uint64_t ps = static_cast<uint64_t>(PageSize());
    if (len / ps > outstanding.size()) {
      for (auto it = outstanding.begin(); it != outstanding.end();) {
        if (it->first >= start && it->first < start + len) {
          out.Add(*it);
          it = outstanding.erase(it);
        } else {
          ++it;
        }
      }
    } else {
      for (uint64_t p = start; p < start + len; p += ps) {
        auto it = outstanding.find(p);
        if (it == outstanding.end()) continue;
        out.Add(*it);
        outstanding.erase(it);
      }
    }
    return out;
  }

  // The resolution failed: its faults are still waiting, so the watchdog must cover them
  // again (unless a newer fault of the page came in meanwhile).
  void Restore(const Taken& taken) {
    if (taken.empty()) return;
    std::lock_guard<std::mutex> lock(mu);
    taken.ForEach([this](const std::pair<uint64_t, Pending>& kv) { outstanding.emplace(kv.first, kv.second); });
    WakeGuard();
  }

  // Re-arm a sleeping guard's watchdog (see guard_asleep). No allocation: may run in the
  // reader between poll() and read() while a fork holds the malloc locks.
  void WakeGuard() {
    if (!event_loop || !guard_asleep.load()) return;
    uint64_t one = 1;
    if (write(kickfd, &one, sizeof(one)) < 0) { /* the counter is saturated: a wake is pending anyway */ }
  }

  void Push(Batch* b, int kind, int flags, uint64_t addr, double tid, double region, double offset, double extra) {
    b->events.insert(b->events.end(), {static_cast<double>(kind), static_cast<double>(flags), static_cast<double>(addr), tid, region, offset,
                                       extra});
    b->addresses.push_back(addr);
  }

  // Hand a batch to JS through the thread-safe function. The batch was filled on the
  // reader's stack; only now, after the read, is anything allocated.
  void Deliver(Batch& b) {
    if (b.events.empty()) return;
    Batch* heap = new Batch{std::move(b.events), std::move(b.addresses)};
    b.events.clear();
    b.addresses.clear();
    if (tsfn.NonBlockingCall(heap) != napi_ok) delete heap;
  }

  // `now`: when the message was read (ns), the start of a forwarded fault's deadline.
  void HandleMessage(const uffd_msg& msg, Batch* b, uint64_t now) {
    st_events++;
    switch (msg.event) {
      case UFFD_EVENT_PAGEFAULT: {
        uint64_t addr = msg.arg.pagefault.address;
        uint64_t ps = static_cast<uint64_t>(PageSize());
        int flags = 0;
        if (msg.arg.pagefault.flags & UFFD_PAGEFAULT_FLAG_WRITE) flags |= kWrite;
        if (msg.arg.pagefault.flags & UFFD_PAGEFAULT_FLAG_WP) flags |= kWp;
        if (msg.arg.pagefault.flags & UFFD_PAGEFAULT_FLAG_MINOR) flags |= kMinor;
        pid_t tid = static_cast<pid_t>(msg.arg.pagefault.feat.ptid);
        uint32_t region = 0;
        uint64_t offset = 0;
        uint64_t page;
        {
          std::lock_guard<std::mutex> lock(mu);
          const Range* r = FindRangeLocked(addr);
          if (r) ps = r->granule;
          page = addr & ~(ps - 1);
          if (r) {
            region = r->region;
            offset = page - r->start;
          }
          if (tid != handler_tid) {
            auto it = outstanding.find(page);
            if (it != outstanding.end() && SameKind(it->second.flags, flags)) {
              // Another thread waits on the same unresolved page: the resolution of the
              // first event wakes every waiter of the page, so this one needs no handler call.
              st_duplicates++;
              return;
            }
            outstanding[page] = Pending{now + timeout_ns.load(), flags, ps};
          }
        }
        if (tid != handler_tid) WakeGuard();
        if (tid == handler_tid) {
          st_native++;
          int err = ResolveDefault(page, flags, ps);
          Push(b, err ? kResolveError : kFaultResolved, flags, addr, tid, region, offset, err);
        } else {
          st_forwarded++;
          Push(b, kFault, flags, addr, tid, region, offset, 0);
        }
        break;
      }
      case UFFD_EVENT_REMOVE:
        NoteDropAhead();  // the madvise zaps once this event is read
        Push(b, kRemove, 0, msg.arg.remove.start, 0, 0, 0, static_cast<double>(msg.arg.remove.end - msg.arg.remove.start));
        break;
      case UFFD_EVENT_UNMAP: {
        NoteDropAhead();
        uint64_t s = msg.arg.remove.start, e = msg.arg.remove.end;
        {
          std::lock_guard<std::mutex> lock(mu);  // the kernel dropped the registration
          for (auto it = ranges.begin(); it != ranges.end();)
            it = (it->second.start >= s && it->second.start + it->second.len <= e) ? ranges.erase(it) : std::next(it);
        }
        Push(b, kUnmap, 0, s, 0, 0, 0, static_cast<double>(e - s));
        break;
      }
      case UFFD_EVENT_REMAP:
        NoteDropAhead();
        Push(b, kRemap, 0, msg.arg.remap.from, 0, static_cast<double>(msg.arg.remap.to), 0, static_cast<double>(msg.arg.remap.len));
        break;
      case UFFD_EVENT_FORK:
        // The kernel gave us a uffd for the child's copy of the registered ranges. A Node
        // child (child_process) execs at once and never serves faults from our handler, so
        // close it: the child's memory becomes ordinary memory. Reading the event is what
        // let the forking thread go on.
        close(static_cast<int>(msg.arg.fork.ufd));
        st_forks++;
        Push(b, kFork, 0, 0, 0, 0, 0, 0);
        break;
      default:
        break;
    }
  }

  // Resolve forwarded faults whose deadline passed. Returns ms until the next deadline (-1: none).
  int Watchdog(Batch* b) {
    // A fixed array: the watchdog may run while a fork holds the malloc locks. What does
    // not fit is left for the next pass, which comes at once (next deadline = now).
    std::array<std::pair<uint64_t, Pending>, 64> expired;
    size_t count = 0;
    uint64_t now = NowNs(), next = UINT64_MAX;
    {
      std::lock_guard<std::mutex> lock(mu);
      for (auto it = outstanding.begin(); it != outstanding.end();) {
        if (it->second.deadline <= now && count < expired.size()) {
          expired[count++] = *it;
          it = outstanding.erase(it);
        } else {
          next = std::min(next, it->second.deadline);
          ++it;
        }
      }
    }
    for (size_t i = 0; i < count; i++) {
      uint64_t page = expired[i].first;
      int flags = expired[i].second.flags;
      st_timeouts++;  // counted before the wake, so whoever the wake releases sees it
      int err = ResolveDefault(page, flags, expired[i].second.granule);
      uint32_t region = 0;
      uint64_t offset = 0;
      {
        std::lock_guard<std::mutex> lock(mu);
        if (const Range* r = FindRangeLocked(page)) {
          region = r->region;
          offset = page - r->start;
        }
      }
      Push(b, kTimeout, flags, page, 0, region, offset, err);
    }
    if (next == UINT64_MAX) return -1;
    if (next <= now) return 0;
    return static_cast<int>((next - now) / 1'000'000ull) + 1;
  }

  // One read() of up to kReadBatch messages, each handled into the batch; the clock is read
  // once for all of them (into *read_ns too, when asked). Returns the messages read (0:
  // nothing pending).
  static constexpr size_t kReadBatch = 64;
  size_t ReadOnce(Batch* b, uint64_t* read_ns = nullptr) {
    uffd_msg msgs[kReadBatch];
    ssize_t got = read(fd, msgs, sizeof(msgs));
    if (got <= 0) return 0;
    st_reads++;
    const uint64_t now = NowNs();
    if (read_ns) *read_ns = now;
    size_t count = static_cast<size_t>(got) / sizeof(uffd_msg);
    for (size_t i = 0; i < count; i++) HandleMessage(msgs[i], b, now);
    return count;
  }

  // Read everything pending, one read() per kReadBatch messages.
  void Drain(Batch* b) {
    while (ReadOnce(b) == kReadBatch) {
    }
  }

  bool Readable() {
    pollfd p{fd, POLLIN, 0};
    return poll(&p, 1, 0) > 0 && (p.revents & POLLIN);
  }

  void ReadLoop() {
    if (event_loop) return GuardLoop();
    pollfd pfds[2] = {{fd, POLLIN, 0}, {stopfd, POLLIN, 0}};
    int wait_ms = -1;
    for (;;) {
      int n = poll(pfds, 2, wait_ms);
      if (n < 0 && errno != EINTR) break;
      if (pfds[1].revents) break;
      Batch b;
      if (n > 0 && (pfds[0].revents & POLLIN)) Drain(&b);
      if (pfds[0].revents & (POLLERR | POLLHUP)) {
        Deliver(b);
        break;
      }
      wait_ms = Watchdog(&b);
      Deliver(b);
    }
  }

  // The guard of event-loop delivery. It does not wake on every fault (that would add a
  // context switch to each one). While faults come, it ticks: every 10 ms, every 1 ms while
  // faults are pending. If events stay unread across a tick with no poll callback on the JS
  // thread, that thread is not reading: the guard becomes the reader (resolving the JS
  // thread's own faults natively, handing the others over through the thread-safe function)
  // until the JS thread polls again or 2 ms pass without events. After kQuietTicks ticks with
  // nothing to watch it stops ticking and sleeps in poll() on the uffd, the stop and the kick
  // eventfds (and the watchdog's next deadline, if any): an idle process is not woken at all;
  // the first event wakes it, and it takes over only if that event is still unread a tick later.
  void GuardLoop() {
    // [0] the uffd (watched while asleep and while taking over), [1] stop, [2] kick: the JS
    // thread is about to block in a call that needs the reader (evict, populate on
    // registered pages).
    constexpr int kQuietTicks = 5;
    pollfd fds[3] = {{fd, POLLIN, 0}, {stopfd, POLLIN, 0}, {kickfd, POLLIN, 0}};
    bool taking_over = false, was_readable = false, asleep = false;
    int quiet = 0;
    uint64_t mark = main_polls.load();
    int wait_ms = 10;
    for (;;) {
      int n = taking_over ? poll(fds, 3, 2) : asleep ? poll(fds, 3, wait_ms) : poll(fds + 1, 2, wait_ms);
      guard_asleep.store(false);
      if (n < 0 && errno != EINTR) break;
      if (fds[1].revents != 0) break;
      Batch b;
      bool kicked = false;
      if (fds[2].revents & POLLIN) {
        uint64_t v;
        if (read(kickfd, &v, sizeof(v)) < 0) { /* nothing to clear */ }
        kicked = take_over.exchange(false);  // else only a re-arm: handled as a wake-up
      }
      if ((taking_over || asleep) && (fds[0].revents & (POLLERR | POLLHUP))) {
        Deliver(b);
        break;
      }
      if (asleep && !kicked) {
        // Woken by an event (or a watchdog deadline): the JS thread has a tick to read it.
        asleep = false;
        was_readable = (fds[0].revents & POLLIN) != 0;
        quiet = 0;
      } else if (taking_over) {
        asleep = false;
        if (!kicked && (main_polls.load() != mark || n == 0)) {
          taking_over = false;  // the JS thread reads again, or all is quiet
        } else if (fds[0].revents & POLLIN) {
          Drain(&b);
        }
      } else if (kicked) {
        asleep = false;
        taking_over = true;  // watch the uffd from the next poll on
        Drain(&b);
      } else {
        bool readable = Readable();
        if (readable && was_readable && main_polls.load() == mark) {
          taking_over = true;
          Drain(&b);
        }
        was_readable = readable;
      }
      fds[0].revents = fds[2].revents = 0;
      mark = main_polls.load();
      int next = Watchdog(&b);
      Deliver(b);
      bool busy = was_readable || taking_over;
      bool pending;
      {
        std::lock_guard<std::mutex> lock(mu);
        pending = !outstanding.empty();
      }
      quiet = busy || pending ? 0 : quiet + 1;
      // Nothing read, nothing pending for kQuietTicks ticks: sleep until something happens.
      asleep = !taking_over && quiet >= kQuietTicks;
      if (asleep) {
        // Announce the sleep before the last look, so that a fault made outstanding after
        // that look sees guard_asleep and wakes us (WakeGuard), and one made before it is seen.
        guard_asleep.store(true);
        std::lock_guard<std::mutex> lock(mu);
        if (!outstanding.empty()) {
          asleep = false;
          quiet = 0;
          guard_asleep.store(false);
        }
      }
      wait_ms = asleep ? -1 : busy || pending ? 1 : 10;
      if (next >= 0) wait_ms = wait_ms < 0 ? next : std::min(wait_ms, next);
    }
  }

  // Ask the guard to read the uffd now: the JS thread is about to make a call that blocks
  // until an event is read (MADV_DONTNEED on a registered range queues REMOVE) or until
  // its own faults are resolved (populate on registered pages).
  void Kick() {
    if (!event_loop) return;
    take_over.store(true);
    uint64_t one = 1;
    if (write(kickfd, &one, sizeof(one)) < 0) { /* the counter is saturated: a kick is pending anyway */ }
  }

  // The JS thread's uv_poll callback: read and hand each batch to JS directly, then read
  // again. On one CPU the woken faulter has faulted on its next page before the handler's
  // UFFDIO_COPY returns, so the next read finds it: one read per fault and no turn of the
  // event loop in between (a turn costs an epoll_wait and Node's per-turn work, more than the
  // handler). Bounded, so timers and other I/O still get a turn under a stream of faults;
  // each batch is its own MakeCallback, so microtasks run between batches as between turns.
  static constexpr int kReadsPerCallback = 16;
  static void OnReadable(uv_poll_t* handle, int status, int events) {
    Uffd* u = static_cast<Uffd*>(handle->data);
    if (u->closed) return;
    Napi::Env env(u->env);
    Napi::HandleScope scope(env);
    napi_value arr = u->loop_events.Value();
    napi_value addresses = u->loop_addresses.Value();
    napi_value fn = u->callback.Value();
    for (int turn = 0; turn < kReadsPerCallback && !u->closed; turn++) {
      u->main_polls++;  // the guard's sign that this thread reads
      Batch& b = u->loop_batch;
      b.events.clear();
      b.addresses.clear();
      uint64_t read_ns;
      if (u->ReadOnce(&b, &read_ns) == 0) break;
      if (b.events.empty()) continue;
      std::copy(b.events.begin(), b.events.end(), u->loop_data);
      std::copy(b.addresses.begin(), b.addresses.end(), u->loop_address_data);
      // The array is the receiver: the callback ignores `this`, and napi_make_callback wants
      // an object (the global would be one more call a batch).
      napi_value argv[4] = {arr, Napi::Number::New(env, static_cast<double>(b.events.size())), addresses, ReceivedMs(env, read_ns)};
      napi_value result;
      if (napi_make_callback(env, *u->async, arr, fn, 4, argv, &result) != napi_ok) {
        napi_value err;
        // As an uncaught exception of a JS callback.
        if (napi_get_and_clear_last_exception(env, &err) == napi_ok) napi_fatal_exception(env, err);
        return;
      }
    }
  }

  void StopPolling() {
    if (!poll_handle) return;
    uv_poll_stop(poll_handle);
    uv_close(reinterpret_cast<uv_handle_t*>(poll_handle), [](uv_handle_t* h) { delete reinterpret_cast<uv_poll_t*>(h); });
    poll_handle = nullptr;
  }

  // Stop the reader, resolve whatever is still pending with the default, unregister every
  // range (waking anyone left), close. Called on the JS thread; never waits on JS.
  void Close() {
    if (closed.exchange(true)) return;
    StopPolling();
    if (started) {
      uint64_t one = 1;
      if (write(stopfd, &one, sizeof(one)) < 0) { /* the poll will see POLLHUP at close */ }
      if (reader.joinable()) reader.join();
    }
    uffd_msg msgs[64];
    for (;;) {
      ssize_t got = read(fd, msgs, sizeof(msgs));
      if (got <= 0) break;
      for (size_t i = 0; i < static_cast<size_t>(got) / sizeof(uffd_msg); i++) {
        if (msgs[i].event == UFFD_EVENT_FORK) close(static_cast<int>(msgs[i].arg.fork.ufd));
        if (msgs[i].event != UFFD_EVENT_PAGEFAULT) continue;
        int flags = 0;
        if (msgs[i].arg.pagefault.flags & UFFD_PAGEFAULT_FLAG_WP) flags |= kWp;
        if (msgs[i].arg.pagefault.flags & UFFD_PAGEFAULT_FLAG_MINOR) flags |= kMinor;
        uint64_t g = GranuleAt(msgs[i].arg.pagefault.address);
        ResolveDefault(msgs[i].arg.pagefault.address & ~(g - 1), flags, g);
      }
    }
    std::vector<Range> all;
    {
      std::lock_guard<std::mutex> lock(mu);
      for (auto& kv : outstanding) ResolveDefault(kv.first, kv.second.flags, kv.second.granule);
      outstanding.clear();
      for (auto& kv : ranges) all.push_back(kv.second);
      ranges.clear();
    }
    for (auto& r : all) {
      uffdio_range rr{r.start, r.len};
      Ioctl(UFFDIO_UNREGISTER, &rr);
    }
    if (started) tsfn.Release();
    callback.Reset();
    async.reset();
    loop_events.Reset();
    loop_addresses.Reset();
  }
};

std::mutex g_mu;
std::unordered_map<uint32_t, std::shared_ptr<Uffd>> g_uffds;
uint32_t g_next = 1;

void CallJs(Napi::Env env, Napi::Function cb, std::shared_ptr<Uffd>* /*ctx*/, Batch* batch) {
  if (env != nullptr && cb != nullptr) {
    size_t n = batch->events.size();
    Napi::Float64Array arr = Napi::Float64Array::New(env, n);
    std::copy(batch->events.begin(), batch->events.end(), arr.Data());
    Napi::BigUint64Array addresses = Napi::BigUint64Array::New(env, batch->addresses.size());
    std::copy(batch->addresses.begin(), batch->addresses.end(), addresses.Data());
    cb.Call({arr, Napi::Number::New(env, static_cast<double>(n)), addresses, ReceivedMs(env)});
  }
  delete batch;
}

std::shared_ptr<Uffd> Require(const Napi::CallbackInfo& info) {
  uint32_t id = ArgU32(info, 0, "handle");
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_uffds.find(id);
  if (it == g_uffds.end() || it->second->closed) throw Napi::TypeError::New(info.Env(), "userfaultfd is closed");
  return it->second;
}

int OpenFd(int flags, std::string* how) {
  int fd = static_cast<int>(syscall(SYS_userfaultfd, flags));
  if (fd >= 0) {
    *how = "syscall";
    return fd;
  }
  int first = errno;
  if (first == EPERM) {
    // vm.unprivileged_userfaultfd=0: an unprivileged process may still trap user-mode faults.
    fd = static_cast<int>(syscall(SYS_userfaultfd, flags | UFFD_USER_MODE_ONLY));
    if (fd >= 0) {
      *how = "user-mode-only";
      return fd;
    }
    int dev = open("/dev/userfaultfd", O_RDWR | O_CLOEXEC);
    if (dev >= 0) {
      fd = ioctl(dev, USERFAULTFD_IOC_NEW, flags);
      int err = errno;
      close(dev);
      if (fd >= 0) {
        *how = "/dev/userfaultfd";
        return fd;
      }
      errno = err;
      return -1;
    }
  }
  errno = first;
  return -1;
}

// uffdOpen(wantedFeatures, requiredFeatures, userModeOnly) -> { handle, features, ioctls, how, handlerTid }
Napi::Value UffdOpen(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  uint64_t wanted = ArgAddr(info, 0, "features");
  uint64_t required = ArgAddr(info, 1, "required");
  bool user_mode = ArgBool(info, 2);
  auto u = std::make_shared<Uffd>();
  int flags = O_CLOEXEC | O_NONBLOCK | (user_mode ? UFFD_USER_MODE_ONLY : 0);
  u->fd = OpenFd(flags, &u->how);
  if (u->fd < 0) ThrowSystemError(env, errno, "userfaultfd");
  if (user_mode) u->how = "user-mode-only";

  // Ask for what the kernel offers of what we want: probe with features=0 first (the
  // handshake fails outright on an unknown bit), then do the real handshake on a new fd.
  uffdio_api api{UFFD_API, 0, 0};
  if (ioctl(u->fd, UFFDIO_API, &api) != 0) ThrowSystemError(env, errno, "ioctl(UFFDIO_API)");
  const uint64_t available = api.features;
  uint64_t grant = (available & wanted) | required;
  close(u->fd);
  std::string how;
  u->fd = OpenFd(flags, &how);
  if (u->fd < 0) ThrowSystemError(env, errno, "userfaultfd");
  api = {UFFD_API, grant, 0};
  if (ioctl(u->fd, UFFDIO_API, &api) != 0) ThrowSystemError(env, errno, "ioctl(UFFDIO_API)");
  // On output the kernel lists every feature it has, not the ones it enabled: what this uffd
  // has is what it asked for, since the handshake took all of it.
  u->features = grant;
  u->available = available;
  u->ioctls = api.ioctls;
  u->stopfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (u->stopfd < 0) ThrowSystemError(env, errno, "eventfd");
  u->kickfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (u->kickfd < 0) ThrowSystemError(env, errno, "eventfd");
  u->handler_tid = Gettid();
  u->env = env;
  Zeros();  // made here, on the JS thread, never by the reader

  uint32_t id;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    id = g_next++;
    g_uffds[id] = u;
  }
  Napi::Object out = Napi::Object::New(env);
  out.Set("handle", Napi::Number::New(env, id));
  out.Set("features", Napi::BigInt::New(env, static_cast<uint64_t>(u->features)));
  out.Set("available", Napi::BigInt::New(env, static_cast<uint64_t>(u->available)));
  out.Set("ioctls", Napi::BigInt::New(env, static_cast<uint64_t>(u->ioctls)));
  out.Set("how", Napi::String::New(env, u->how));
  out.Set("handlerTid", Napi::Number::New(env, u->handler_tid));
  return out;
}

// uffdStart(handle, callback(events: Float64Array, length, addresses: BigUint64Array,
// receivedMs), eventLoop): start delivery. The callback reads the first `length` numbers of
// `events` (7 per event) and each event's address from `addresses` (one per event), and must
// not keep the arrays: the next batch reuses them. receivedMs: CLOCK_MONOTONIC, in ms. eventLoop: the JS thread polls the uffd and the reader
// thread guards; otherwise the reader thread reads everything and hands it over through the
// thread-safe function.
Napi::Value UffdStart(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  auto u = Require(info);
  if (u->started) throw Napi::Error::New(env, "reader already started");
  if (!info[1].IsFunction()) throw Napi::TypeError::New(env, "callback must be a function");
  bool event_loop = ArgBool(info, 2);
  auto* ctx = new std::shared_ptr<Uffd>(u);
  u->tsfn = Tsfn::New(env, info[1].As<Napi::Function>(), "pagefault-rdma:uffd", 0, 1, ctx,
                      [](Napi::Env, void*, std::shared_ptr<Uffd>* c) { delete c; });
  u->tsfn.Unref(env);  // a uffd alone does not keep the process alive
  if (event_loop) {
    uv_loop_t* loop = nullptr;
    if (napi_get_uv_event_loop(env, &loop) != napi_ok || loop == nullptr) throw Napi::Error::New(env, "no event loop for this environment");
    u->callback = Napi::Persistent(info[1].As<Napi::Function>());
    u->async = std::make_unique<Napi::AsyncContext>(env, "pagefault-rdma:uffd");
    u->loop_batch.events.reserve(Uffd::kReadBatch * kEventWidth);  // one event at most per message
    u->loop_batch.addresses.reserve(Uffd::kReadBatch);
    Napi::Float64Array events = Napi::Float64Array::New(env, Uffd::kReadBatch * kEventWidth);
    Napi::BigUint64Array addresses = Napi::BigUint64Array::New(env, Uffd::kReadBatch);
    u->loop_data = events.Data();
    u->loop_address_data = addresses.Data();
    u->loop_events = Napi::Persistent(events);
    u->loop_addresses = Napi::Persistent(addresses);
    u->poll_handle = new uv_poll_t();
    int err = uv_poll_init(loop, u->poll_handle, u->fd);
    if (err != 0) {
      delete u->poll_handle;
      u->poll_handle = nullptr;
      ThrowSystemError(env, -err, "uv_poll_init");
    }
    u->poll_handle->data = u.get();
    uv_poll_start(u->poll_handle, UV_READABLE, Uffd::OnReadable);
    uv_unref(reinterpret_cast<uv_handle_t*>(u->poll_handle));
    u->event_loop = true;
  }
  u->started = true;
  u->reader = std::thread([u] { u->ReadLoop(); });
  return env.Undefined();
}

// uffdRegister(handle, region, address, length, mode, granule) -> ioctls (bigint)
Napi::Value UffdRegister(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  auto u = Require(info);
  uint32_t region = ArgU32(info, 1, "region");
  uint64_t start = ArgAddr(info, 2, "address");
  uint64_t len = ArgAddr(info, 3, "length");
  uint64_t mode = ArgAddr(info, 4, "mode");
  uint64_t granule = ArgAddr(info, 5, "granule");
  if (granule == 0 || (granule & (granule - 1)) != 0 || granule > kMaxGranule) throw Napi::RangeError::New(env, "granule must be a power of two up to 2 MiB");
  uffdio_register reg{{start, len}, mode, 0};
  if (ioctl(u->fd, UFFDIO_REGISTER, &reg) != 0) ThrowSystemError(env, errno, "ioctl(UFFDIO_REGISTER)");
  {
    std::lock_guard<std::mutex> lock(u->mu);
    u->ranges[start] = Range{start, len, region, mode, granule};
  }
  return Napi::BigInt::New(env, static_cast<uint64_t>(reg.ioctls));
}

Napi::Value UffdUnregister(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  auto u = Require(info);
  uint64_t start = ArgAddr(info, 1, "address");
  uint64_t len = ArgAddr(info, 2, "length");
  uffdio_range r{start, len};
  if (ioctl(u->fd, UFFDIO_UNREGISTER, &r) != 0) ThrowSystemError(env, errno, "ioctl(UFFDIO_UNREGISTER)");
  u->Take(start, len);  // the unregister woke them
  std::lock_guard<std::mutex> lock(u->mu);
  for (auto it = u->ranges.begin(); it != u->ranges.end();)
    it = (it->second.start >= start && it->second.start + it->second.len <= start + len) ? u->ranges.erase(it) : std::next(it);
  return env.Undefined();
}

// Every resolution below takes the range's forwarded faults out of the table before its
// ioctl (see Uffd::Take) and puts them back if it fails. `Restorer` does the putting back
// on every error path, including a thrown error.
struct Restorer {
  Uffd* u;
  Uffd::Taken taken;
  bool done = false;
  ~Restorer() {
    if (!done) u->Restore(taken);
  }
};

// A resolution retries EAGAIN (the mappings are changing; the reader drains the event that
// says so) for at most a second, counted from the first EAGAIN: the clock is read only then.
class RetryBound {
 public:
  bool Over() {
    uint64_t now = NowNs();
    if (deadline_ == 0) deadline_ = now + 1'000'000'000ull;
    return now > deadline_;
  }

 private:
  uint64_t deadline_ = 0;
};

size_t ElementSize(napi_typedarray_type type) {
  switch (type) {
    case napi_int8_array:
    case napi_uint8_array:
    case napi_uint8_clamped_array:
      return 1;
    case napi_int16_array:
    case napi_uint16_array:
      return 2;
    case napi_int32_array:
    case napi_uint32_array:
    case napi_float32_array:
      return 4;
    case napi_float64_array:
    case napi_bigint64_array:
    case napi_biguint64_array:
      return 8;
    default:
      return 0;  // an element type this build does not know: no bytes, so "shorter than the range"
  }
}

// The source bytes of a copy: a TypedArray, Buffer, DataView or ArrayBuffer. One N-API call
// for a TypedArray or Buffer (what a handler passes on every fault): its info is the data
// pointer, already past the view's offset.
uint8_t* SourceBytes(const Napi::Value& v, size_t* avail) {
  napi_env env = v.Env();
  napi_typedarray_type type;
  size_t length, offset;
  void* data;
  napi_value ab;
  if (napi_get_typedarray_info(env, v, &type, &length, &data, &ab, &offset) == napi_ok) {
    *avail = length * ElementSize(type);
    return static_cast<uint8_t*>(data);
  }
  if (napi_get_dataview_info(env, v, &length, &data, &ab, &offset) == napi_ok) {
    *avail = length;
    return static_cast<uint8_t*>(data);
  }
  if (napi_get_arraybuffer_info(env, v, &data, &length) == napi_ok) {
    *avail = length;
    return static_cast<uint8_t*>(data);
  }
  return nullptr;
}

// uffdCopy(handle, base, offset, length, src, mode) -> bytes placed, at base + offset (a
// region's address and an offset in it: no address arithmetic on BigInts in JS); mode:
// UFFDIO_COPY_MODE_DONTWAKE | UFFDIO_COPY_MODE_WP. Six arguments: node-addon-api reads up to
// six without allocating. Loops over partial copies (EAGAIN with progress). EEXIST: part of
// the range was there already (a racing resolution won): the rest is placed page by page,
// and the bytes returned are only those this call placed.
Napi::Value UffdCopy(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  auto u = Require(info);
  uint64_t dst = ArgAddr(info, 1, "base") + ArgSize(info, 2, "offset");
  uint64_t len = ArgSize(info, 3, "length");
  size_t avail = 0;
  uint8_t* src = SourceBytes(info[4], &avail);
  if (src == nullptr) throw Napi::TypeError::New(env, "source must be a TypedArray, Buffer, DataView or ArrayBuffer");
  if (len > avail) throw Napi::RangeError::New(env, "source is shorter than the range");
  uint64_t mode = ArgSize(info, 5, "mode");
  if (mode & ~static_cast<uint64_t>(UFFDIO_COPY_MODE_DONTWAKE | UFFDIO_COPY_MODE_WP)) throw Napi::RangeError::New(env, "mode has unknown bits");
  bool wake = !(mode & UFFDIO_COPY_MODE_DONTWAKE);
  // Without a wake the faults still wait: they stay tracked until the caller's wake, or the
  // watchdog's default resolution (EEXIST there, then a wake) if it never comes.
  Restorer restore{u.get()};
  const uint64_t ps = u->Begin(dst, len, wake, &restore.taken);
  uint64_t done = 0, placed = 0;
  RetryBound retry;
  while (done < len) {
    uffdio_copy c{dst + done, reinterpret_cast<uint64_t>(src + done), len - done, mode, 0};
    if (ioctl(u->fd, UFFDIO_COPY, &c) == 0) {
      placed += len - done;
      done = len;
      break;
    }
    int err = errno;
    if (c.copy > 0) {
      done += static_cast<uint64_t>(c.copy);
      placed += static_cast<uint64_t>(c.copy);
      continue;
    }
    if (err == EEXIST) {
      // Part of the range was resolved already: copy the rest page by page so one
      // resident page does not leave its neighbours blocked. Wake once at the end: a
      // wake per page would let the faulting thread run ahead into pages not yet copied.
      for (uint64_t p = done; p < len;) {
        uffdio_copy one{dst + p, reinterpret_cast<uint64_t>(src + p), std::min(ps, len - p), mode | UFFDIO_COPY_MODE_DONTWAKE, 0};
        if (ioctl(u->fd, UFFDIO_COPY, &one) == 0) {
          placed += one.len;
        } else if (errno == EAGAIN && one.copy <= 0) {
          if (retry.Over()) ThrowSystemError(env, EAGAIN, "ioctl(UFFDIO_COPY)");
          std::this_thread::sleep_for(std::chrono::microseconds(50));  // mmap changing: retry this page
          continue;
        } else if (errno != EEXIST) {
          ThrowSystemError(env, errno, "ioctl(UFFDIO_COPY)");
        }
        p += ps;
      }
      if (wake) u->Wake(dst, len);
      done = len;
      break;
    }
    if (err == EAGAIN && !retry.Over()) {  // mmap changing: the reader drains the event
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      continue;
    }
    ThrowSystemError(env, err, "ioctl(UFFDIO_COPY)");
  }
  restore.done = true;
  return Napi::Number::New(env, static_cast<double>(placed));
}

// The range ioctls that share one shape: a range, a mode whose bit 0 is DONTWAKE, and a
// progress field (bytes done, or -errno).
int64_t Progress(const uffdio_zeropage& z) { return z.zeropage; }
int64_t Progress(const uffdio_continue& c) { return c.mapped; }
int64_t Progress(const uffdio_poison& p) { return p.updated; }

// A range ioctl with the same EEXIST / EAGAIN rules as copy: zeropage, continue, poison.
// Returns the bytes this call resolved.
template <typename T, unsigned long Req>
Napi::Value RangeOp(const Napi::CallbackInfo& info, const char* name) {
  Napi::Env env = info.Env();
  auto u = Require(info);
  uint64_t start = ArgAddr(info, 1, "address");
  uint64_t len = ArgAddr(info, 2, "length");
  bool wake = !ArgBool(info, 3);
  uint64_t extra = info.Length() > 4 ? ArgAddr(info, 4, "mode") : 0;  // e.g. UFFDIO_CONTINUE_MODE_WP
  uint64_t done = 0, placed = 0;
  RetryBound retry;
  Restorer restore{u.get()};
  const uint64_t ps = u->Begin(start, len, wake, &restore.taken);
  while (done < len) {
    T arg{};
    arg.range = {start + done, len - done};
    arg.mode = (wake ? 0 : 1) | extra;
    if (ioctl(u->fd, Req, &arg) == 0) {
      placed += len - done;
      break;
    }
    int err = errno;
    int64_t progress = Progress(arg);
    if (progress > 0) {
      done += static_cast<uint64_t>(progress);
      placed += static_cast<uint64_t>(progress);
      continue;
    }
    if (err == EEXIST) {
      // Some page of the range is already there: resolve the others one by one.
      for (uint64_t p = done; p < len; p += ps) {
        T one{};
        one.range = {start + p, std::min(ps, len - p)};
        one.mode = 1 | extra;
        if (ioctl(u->fd, Req, &one) == 0) placed += one.range.len;
        else if (errno != EEXIST) ThrowSystemError(env, errno, name);
      }
      if (wake) u->Wake(start, len);
      break;
    }
    if (err == EAGAIN && !retry.Over()) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      continue;
    }
    ThrowSystemError(env, err, name);
  }
  restore.done = true;
  return Napi::Number::New(env, static_cast<double>(placed));
}

// uffdZeropage(handle, address, length, dontWake) -> bytes
Napi::Value UffdZeropage(const Napi::CallbackInfo& info) {
  return RangeOp<uffdio_zeropage, UFFDIO_ZEROPAGE>(info, "ioctl(UFFDIO_ZEROPAGE)");
}
// uffdContinue(handle, address, length, dontWake, mode) -> bytes; mode may hold UFFDIO_CONTINUE_MODE_WP
Napi::Value UffdContinue(const Napi::CallbackInfo& info) {
  return RangeOp<uffdio_continue, UFFDIO_CONTINUE>(info, "ioctl(UFFDIO_CONTINUE)");
}
// uffdPoison(handle, address, length, dontWake) -> bytes
Napi::Value UffdPoison(const Napi::CallbackInfo& info) {
  return RangeOp<uffdio_poison, UFFDIO_POISON>(info, "ioctl(UFFDIO_POISON)");
}

// uffdMove(handle, dst, src, length, dontWake, allowSrcHoles) -> bytes moved
// UFFDIO_MOVE: the source pages themselves (anonymous, this process) become the
// destination's, no copy. A destination page that is there already (EEXIST) is skipped:
// its source page stays where it was, and the bytes returned leave it out.
Napi::Value UffdMove(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  auto u = Require(info);
  uint64_t dst = ArgAddr(info, 1, "destination");
  uint64_t src = ArgAddr(info, 2, "source");
  uint64_t len = ArgAddr(info, 3, "length");
  bool wake = !ArgBool(info, 4);
  uint64_t holes = ArgBool(info, 5) ? UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES : 0;
  // The source loses its pages: a send that lent them to the provider finishes first.
  if (int busy = BeforeDrop(reinterpret_cast<const void*>(src), len)) ThrowSystemError(env, busy, "ioctl(UFFDIO_MOVE)");
  Restorer restore{u.get()};
  const uint64_t ps = u->Begin(dst, len, wake, &restore.taken);
  uint64_t done = 0, moved = 0, skipped = 0;
  RetryBound retry;
  while (done < len) {
    uffdio_move m{dst + done, src + done, len - done, UFFDIO_MOVE_MODE_DONTWAKE | holes, 0};
    if (ioctl(u->fd, UFFDIO_MOVE, &m) == 0) {
      moved += len - done;
      break;
    }
    int err = errno;
    if (m.move > 0) {
      done += static_cast<uint64_t>(m.move);
      moved += static_cast<uint64_t>(m.move);
      continue;
    }
    if (err == EEXIST) {
      done += ps;  // this destination page is there already
      skipped++;
      continue;
    }
    if (err == EAGAIN && !retry.Over()) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      continue;
    }
    NoteDrop();  // pages may have left the source already
    ThrowSystemError(env, err, "ioctl(UFFDIO_MOVE)");
  }
  NoteDrop();  // the source range lost its pages
  if (wake && (moved || skipped)) u->Wake(dst, len);
  restore.done = true;
  return Napi::Number::New(env, static_cast<double>(moved));
}

// uffdWriteProtect(handle, address, length, on, dontWake)
Napi::Value UffdWriteProtect(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  auto u = Require(info);
  uint64_t start = ArgAddr(info, 1, "address");
  uint64_t len = ArgAddr(info, 2, "length");
  bool on = ArgBool(info, 3);
  bool dontwake = ArgBool(info, 4);
  Restorer restore{u.get()};
  if (!on && !dontwake) restore.taken = u->Take(start, len);
  uffdio_writeprotect wp{{start, len}, (on ? UFFDIO_WRITEPROTECT_MODE_WP : 0) | (dontwake ? UFFDIO_WRITEPROTECT_MODE_DONTWAKE : 0)};
  if (ioctl(u->fd, UFFDIO_WRITEPROTECT, &wp) != 0) ThrowSystemError(env, errno, "ioctl(UFFDIO_WRITEPROTECT)");
  restore.done = true;
  return env.Undefined();
}

Napi::Value UffdWake(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  auto u = Require(info);
  uint64_t start = ArgAddr(info, 1, "address");
  uint64_t len = ArgAddr(info, 2, "length");
  // A bare wake leaves the page unresolved: the thread faults again, and that new fault
  // must reach the handler rather than be dropped as a duplicate of the old one.
  u->Take(start, len);
  int err = u->Wake(start, len);
  if (err) ThrowSystemError(env, err, "ioctl(UFFDIO_WAKE)");
  return env.Undefined();
}

Napi::Value UffdSetTimeout(const Napi::CallbackInfo& info) {
  auto u = Require(info);
  u->timeout_ns = static_cast<uint64_t>(ArgSize(info, 1, "timeoutMs")) * 1'000'000ull;
  return info.Env().Undefined();
}

// uffdPending(handle) -> number of forwarded faults not yet resolved
// uffdKick(handle): the JS thread is about to block on the reader (see Uffd::Kick).
Napi::Value UffdKick(const Napi::CallbackInfo& info) {
  Require(info)->Kick();
  return info.Env().Undefined();
}

Napi::Value UffdPending(const Napi::CallbackInfo& info) {
  auto u = Require(info);
  std::lock_guard<std::mutex> lock(u->mu);
  return Napi::Number::New(info.Env(), static_cast<double>(u->outstanding.size()));
}

Napi::Value UffdStats(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  auto u = Require(info);
  Napi::Object o = Napi::Object::New(env);
  o.Set("reads", Napi::Number::New(env, static_cast<double>(u->st_reads.load())));
  o.Set("events", Napi::Number::New(env, static_cast<double>(u->st_events.load())));
  o.Set("forwarded", Napi::Number::New(env, static_cast<double>(u->st_forwarded.load())));
  o.Set("resolvedNatively", Napi::Number::New(env, static_cast<double>(u->st_native.load())));
  o.Set("timeouts", Napi::Number::New(env, static_cast<double>(u->st_timeouts.load())));
  o.Set("duplicates", Napi::Number::New(env, static_cast<double>(u->st_duplicates.load())));
  o.Set("forks", Napi::Number::New(env, static_cast<double>(u->st_forks.load())));
  return o;
}

Napi::Value UffdClose(const Napi::CallbackInfo& info) {
  uint32_t id = ArgU32(info, 0, "handle");
  std::shared_ptr<Uffd> u;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = g_uffds.find(id);
    if (it == g_uffds.end()) return info.Env().Undefined();
    u = it->second;
    g_uffds.erase(it);
  }
  u->Close();
  return info.Env().Undefined();
}

// Env teardown (process exit, worker termination): close every uffd this env opened so no
// reader thread outlives it and no faulting thread is left asleep.
void CleanupEnv(napi_env env) {
  std::vector<std::shared_ptr<Uffd>> mine;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    for (auto it = g_uffds.begin(); it != g_uffds.end();) {
      if (it->second->env == env) {
        mine.push_back(it->second);
        it = g_uffds.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& u : mine) u->Close();
}

}  // namespace

void InitUffd(Napi::Env env, Napi::Object exports) {
  exports.Set("uffdOpen", Napi::Function::New(env, UffdOpen, "uffdOpen"));
  exports.Set("uffdStart", Napi::Function::New(env, UffdStart, "uffdStart"));
  exports.Set("uffdRegister", Napi::Function::New(env, UffdRegister, "uffdRegister"));
  exports.Set("uffdUnregister", Napi::Function::New(env, UffdUnregister, "uffdUnregister"));
  exports.Set("uffdCopy", Napi::Function::New(env, UffdCopy, "uffdCopy"));
  exports.Set("uffdZeropage", Napi::Function::New(env, UffdZeropage, "uffdZeropage"));
  exports.Set("uffdContinue", Napi::Function::New(env, UffdContinue, "uffdContinue"));
  exports.Set("uffdPoison", Napi::Function::New(env, UffdPoison, "uffdPoison"));
  exports.Set("uffdMove", Napi::Function::New(env, UffdMove, "uffdMove"));
  exports.Set("uffdWriteProtect", Napi::Function::New(env, UffdWriteProtect, "uffdWriteProtect"));
  exports.Set("uffdWake", Napi::Function::New(env, UffdWake, "uffdWake"));
  exports.Set("uffdSetTimeout", Napi::Function::New(env, UffdSetTimeout, "uffdSetTimeout"));
  exports.Set("uffdPending", Napi::Function::New(env, UffdPending, "uffdPending"));
  exports.Set("uffdKick", Napi::Function::New(env, UffdKick, "uffdKick"));
  exports.Set("uffdStats", Napi::Function::New(env, UffdStats, "uffdStats"));
  exports.Set("uffdClose", Napi::Function::New(env, UffdClose, "uffdClose"));
  napi_env raw = env;
  env.AddCleanupHook([raw] { CleanupEnv(raw); });
}

}  // namespace pfr
