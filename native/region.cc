// Memory regions: mmap'd anonymous or memfd memory exposed to JS as an ArrayBuffer with
// no copy, plus the residency syscalls (mincore, madvise populate/evict, mlock).
#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "common.h"
#include "kernel_abi.h"

namespace pfr {

namespace {

constexpr size_t kHugePage = 2u << 20;

// The ArrayBuffer's finalizer owns one of these. close() empties it so munmap does not
// wait for the garbage collector; a GC of a never-closed region's buffer drops the
// table entry too (the JS Region holds the buffer, so it is unreachable as well).
struct BufferHold {
  uint32_t id;
  std::shared_ptr<Mapping> mapping;
};

struct Entry {
  std::shared_ptr<Mapping> mapping;
  BufferHold* hold;
  bool accounted;  // reported to V8 as external memory (see Publish)
};

std::mutex g_mu;
std::unordered_map<uint32_t, Entry> g_regions;
uint32_t g_next_id = 1;

void FinalizeBuffer(Napi::Env env, void* /*data*/, BufferHold* hold) {
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = g_regions.find(hold->id);
    if (it != g_regions.end() && it->second.hold == hold) {
      if (it->second.mapping && it->second.accounted) Napi::MemoryManagement::AdjustExternalMemory(env, -static_cast<int64_t>(it->second.mapping->size));
      g_regions.erase(it);
    }
  }
  delete hold;
}

}  // namespace

Mapping::~Mapping() {
  if (addr != nullptr) munmap(addr, size);
  if (fd >= 0) close(fd);
  if (pagemap_fd >= 0) close(pagemap_fd);
  if (addr != nullptr) NoteDrop();
}

long PageSize() {
  static const long ps = sysconf(_SC_PAGESIZE);
  return ps;
}

uint64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

pid_t Gettid() { return static_cast<pid_t>(syscall(SYS_gettid)); }

int PagemapFd() {
  // Opened once: the SMMU model walks it on every IOTLB miss, the copy engine before an inline copy.
  static const int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  static const int open_err = fd < 0 ? errno : 0;
  return fd < 0 ? -open_err : fd;
}

namespace {

// The first page of [start, end) (addresses) whose page-table entry is not present, as
// /proc/self/pagemap's bit 63 says it, or end, in *at; 0, or an errno and the failed call in
// *call. PAGEMAP_SCAN (6.7) answers without copying an entry per page (4096 pages: 15 µs
// here, against 400 µs read 64 entries at a time); older kernels read the entries.
int ScanFirstAbsent(int fd, uint64_t start, uint64_t end, uint64_t* at, const char** call) {
  static std::atomic<bool> scan{true};
  if (scan.load(std::memory_order_relaxed)) {
    page_region r{};
    pm_scan_arg arg{};
    arg.size = sizeof(arg);
    arg.start = start;
    arg.end = end;
    arg.vec = reinterpret_cast<uint64_t>(&r);
    arg.vec_len = 1;
    arg.category_mask = PAGE_IS_PRESENT;
    arg.category_inverted = PAGE_IS_PRESENT;
    arg.return_mask = PAGE_IS_PRESENT;
    long n = ioctl(fd, PAGEMAP_SCAN, &arg);
    if (n >= 0) {
      *at = n > 0 ? std::max<uint64_t>(r.start, start) : end;
      return 0;
    }
    // Another process's page tables, and the process is gone: none of its pages is present.
    if (errno == ESRCH) {
      *at = start;
      return 0;
    }
    if (errno != ENOTTY && errno != EINVAL) {
      *call = "ioctl(PAGEMAP_SCAN)";
      return errno;
    }
    scan.store(false, std::memory_order_relaxed);
  }
  const uint64_t ps = static_cast<uint64_t>(PageSize());
  uint64_t entries[512];
  for (uint64_t page = start / ps; page * ps < end; page += 512) {
    const size_t n = std::min<uint64_t>(512, (end - page * ps + ps - 1) / ps);
    ssize_t got = pread(fd, entries, n * 8, static_cast<off_t>(page * 8));
    if (got == 0 || (got < 0 && errno == ESRCH)) {  // the process is gone: nothing present
      *at = std::max<uint64_t>(page * ps, start);
      return 0;
    }
    if (got != static_cast<ssize_t>(n * 8)) {
      *call = "pread(/proc/self/pagemap)";
      return got < 0 ? errno : EIO;
    }
    for (size_t i = 0; i < n; i++)
      if (!(entries[i] >> 63)) {
        *at = std::max<uint64_t>((page + i) * ps, start);
        return 0;
      }
  }
  *at = end;
  return 0;
}

}  // namespace

int PagemapOf(const Mapping& m) { return m.foreign() ? m.pagemap_fd : PagemapFd(); }

bool AllPresent(const Mapping& m, size_t off, size_t len) {
  const int fd = PagemapOf(m);
  if (fd < 0 || len == 0) return fd >= 0;
  const uint64_t start = m.va() + off;
  const uint64_t end = start + len;
  uint64_t at = 0;
  const char* call = nullptr;
  return ScanFirstAbsent(fd, start, end, &at, &call) == 0 && at >= end;
}

int64_t FirstAbsent(const Mapping& m, size_t off, size_t len) {
  const int fd = PagemapOf(m);
  const uint64_t start = m.va() + (off & ~static_cast<size_t>(PageSize() - 1));
  const uint64_t end = m.va() + off + len;
  uint64_t at = end;
  const char* call = nullptr;
  // A pagemap that cannot be read (the process is gone) leaves nothing present.
  if (len == 0) return -1;
  if (fd < 0 || ScanFirstAbsent(fd, start, end, &at, &call) != 0) return static_cast<int64_t>(start - m.va());
  return at >= end ? -1 : static_cast<int64_t>(at - m.va());
}

Napi::Error SystemError(Napi::Env env, int err, const char* syscall) {
  const char* name = strerrorname_np(err);
  std::string code = name ? name : "EUNKNOWN";
  std::string message = std::string(syscall) + " failed: " + code + " (" + strerror(err) + ")";
  Napi::Error e = Napi::Error::New(env, message);
  e.Set("code", Napi::String::New(env, code));
  e.Set("errno", Napi::Number::New(env, -err));
  e.Set("syscall", Napi::String::New(env, syscall));
  return e;
}

void ThrowSystemError(Napi::Env env, int err, const char* syscall) {
  throw SystemError(env, err, syscall);
}

// Each argument is read with one N-API call that also checks its type (napi_*_expected
// when it has another): node-addon-api's Is*() first would be a second call, and every call
// of the addon pays these (a fault's UFFDIO_COPY takes seven arguments).
static double NumberArg(const Napi::CallbackInfo& info, size_t i, const char* name) {
  double v;
  if (napi_get_value_double(info.Env(), info[i], &v) != napi_ok) throw Napi::TypeError::New(info.Env(), std::string(name) + " must be a number");
  return v;
}

uint32_t ArgU32(const Napi::CallbackInfo& info, size_t i, const char* name) {
  double v = NumberArg(info, i, name);
  if (!(v >= 0 && v <= 4294967295.0) || v != static_cast<double>(static_cast<uint32_t>(v)))
    throw Napi::RangeError::New(info.Env(), std::string(name) + " must be a 32-bit unsigned integer");
  return static_cast<uint32_t>(v);
}

size_t ArgSize(const Napi::CallbackInfo& info, size_t i, const char* name) {
  double v = NumberArg(info, i, name);
  if (!(v >= 0 && v <= 9007199254740991.0) || v != static_cast<double>(static_cast<uint64_t>(v)))
    throw Napi::RangeError::New(info.Env(), std::string(name) + " must be a non-negative safe integer");
  return static_cast<size_t>(v);
}

uint64_t ArgAddr(const Napi::CallbackInfo& info, size_t i, const char* name) {
  uint64_t v;
  bool lossless = false;
  napi_status st = napi_get_value_bigint_uint64(info.Env(), info[i], &v, &lossless);
  if (st == napi_bigint_expected) return ArgSize(info, i, name);
  if (st != napi_ok || !lossless) throw Napi::RangeError::New(info.Env(), std::string(name) + " must fit in 64 bits");
  return v;
}

bool ArgBool(const Napi::CallbackInfo& info, size_t i) {
  bool v;
  if (napi_get_value_bool(info.Env(), info[i], &v) == napi_ok) return v;
  return info[i].ToBoolean().Value();  // not a boolean: JavaScript truthiness, as before
}

std::shared_ptr<Mapping> FindRegion(uint32_t id) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_regions.find(id);
  return it == g_regions.end() ? nullptr : it->second.mapping;
}

std::shared_ptr<Mapping> RequireRange(Napi::Env env, const Napi::Value& idv, const Napi::Value& offv,
                                      const Napi::Value& lenv, size_t* offset, size_t* length, bool foreign) {
  if (!idv.IsNumber() || !offv.IsNumber() || !lenv.IsNumber())
    throw Napi::TypeError::New(env, "region id, offset and length must be numbers");
  auto m = FindRegion(idv.As<Napi::Number>().Uint32Value());
  if (!m) throw Napi::TypeError::New(env, "region is closed or unknown");
  if (m->foreign() && !foreign) throw Napi::TypeError::New(env, "a foreign region (another process's memory) is not mapped here");
  double off = offv.As<Napi::Number>().DoubleValue();
  double len = lenv.As<Napi::Number>().DoubleValue();
  if (!(off >= 0) || !(len >= 0) || off + len > static_cast<double>(m->size) || off != static_cast<double>(static_cast<size_t>(off)) ||
      len != static_cast<double>(static_cast<size_t>(len)))
    throw Napi::RangeError::New(env, "range is outside the region");
  *offset = static_cast<size_t>(off);
  *length = static_cast<size_t>(len);
  return m;
}

namespace {

// Hand a new mapping to JS: an ArrayBuffer over it (no copy), a table entry, the id.
// `account`: report the mapping to V8 as external memory. Only its first handle does: a
// second one (another thread's) would count the same memory twice, and V8 answers external
// memory with full garbage collections.
Napi::Object Publish(Napi::Env env, std::shared_ptr<Mapping> m, bool account = true) {
  auto* hold = new BufferHold{0, m};
  Napi::ArrayBuffer buffer;
  try {
    buffer = Napi::ArrayBuffer::New(env, m->addr, m->size, FinalizeBuffer, hold);
  } catch (...) {
    delete hold;
    throw;
  }
  uint32_t id;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    id = g_next_id++;
    hold->id = id;
    g_regions[id] = Entry{m, hold, account};
  }
  if (account) Napi::MemoryManagement::AdjustExternalMemory(env, static_cast<int64_t>(m->size));
  Napi::Object out = Napi::Object::New(env);
  out.Set("id", Napi::Number::New(env, id));
  out.Set("address", Napi::BigInt::New(env, static_cast<uint64_t>(reinterpret_cast<uintptr_t>(m->addr))));
  out.Set("buffer", buffer);
  out.Set("pageSize", Napi::Number::New(env, static_cast<double>(PageSize())));
  return out;
}

// hugetlbfs memory: 2 MiB pages from the pool the administrator reserved (vm.nr_hugepages).
// No MAP_NORESERVE: the reservation is checked at mmap (ENOMEM when the pool is short)
// rather than by a SIGBUS at the first fault.
std::shared_ptr<Mapping> MapHugetlb(Napi::Env env, size_t size, bool shared) {
  if (size % kHugePage != 0) throw Napi::RangeError::New(env, "size must be a multiple of 2 MiB for hugetlb");
  auto m = std::make_shared<Mapping>();
  m->size = size;
  m->hugetlb = true;
  int flags;
  if (shared) {
    m->fd = memfd_create("pagefault-rdma-hugetlb", MFD_CLOEXEC | MFD_HUGETLB);
    if (m->fd < 0) ThrowSystemError(env, errno, "memfd_create(MFD_HUGETLB)");
    if (ftruncate(m->fd, static_cast<off_t>(size)) != 0) ThrowSystemError(env, errno, "ftruncate");
    flags = MAP_SHARED;
  } else {
    flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB;
  }
  void* addr = mmap(nullptr, size, PROT_READ | PROT_WRITE, flags, m->fd, 0);
  if (addr == MAP_FAILED) ThrowSystemError(env, errno, shared ? "mmap(hugetlbfs memfd)" : "mmap(MAP_HUGETLB)");
  m->addr = static_cast<uint8_t*>(addr);
  return m;
}

// mapRegion(size, shared, hugePages, hugetlb) -> { id, address, buffer, pageSize }
Napi::Value MapRegion(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  size_t size = ArgSize(info, 0, "size");
  bool shared = ArgBool(info, 1);
  bool huge = ArgBool(info, 2);
  bool hugetlb = ArgBool(info, 3);
  if (size == 0 || size % PageSize() != 0) throw Napi::RangeError::New(env, "size must be a positive multiple of the page size");
  if (hugetlb) return Publish(env, MapHugetlb(env, size, shared));

  auto m = std::make_shared<Mapping>();
  m->size = size;
  m->huge = huge;
  int flags = MAP_NORESERVE;
  if (shared) {
    m->fd = memfd_create("pagefault-rdma", MFD_CLOEXEC);
    if (m->fd < 0) ThrowSystemError(env, errno, "memfd_create");
    if (ftruncate(m->fd, static_cast<off_t>(size)) != 0) ThrowSystemError(env, errno, "ftruncate");
    flags |= MAP_SHARED;
  } else {
    flags |= MAP_PRIVATE | MAP_ANONYMOUS;
  }

  void* addr;
  if (huge || size % kHugePage == 0) {
    // THP needs 2 MiB-aligned virtual addresses: reserve more, then trim both ends. Regions
    // of whole 2 MiB units are aligned too, so collapse() can make them huge pages later.
    size_t span = size + kHugePage;
    void* raw = mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (raw == MAP_FAILED) ThrowSystemError(env, errno, "mmap");
    uintptr_t start = (reinterpret_cast<uintptr_t>(raw) + kHugePage - 1) & ~(kHugePage - 1);
    size_t head = start - reinterpret_cast<uintptr_t>(raw);
    if (head) munmap(raw, head);
    size_t tail = span - head - size;
    if (tail) munmap(reinterpret_cast<void*>(start + size), tail);
    addr = mmap(reinterpret_cast<void*>(start), size, PROT_READ | PROT_WRITE, flags | MAP_FIXED, m->fd, 0);
    if (addr == MAP_FAILED) {
      int err = errno;
      munmap(reinterpret_cast<void*>(start), size);
      ThrowSystemError(env, err, "mmap");
    }
  } else {
    addr = mmap(nullptr, size, PROT_READ | PROT_WRITE, flags, m->fd, 0);
    if (addr == MAP_FAILED) ThrowSystemError(env, errno, "mmap");
  }
  m->addr = static_cast<uint8_t*>(addr);
  // Default 4 KiB semantics: without this, one touch could make 512 pages resident and a
  // test counting one fault per page would be at the mercy of the THP setting.
  if (madvise(addr, size, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE) != 0 && huge) ThrowSystemError(env, errno, "madvise(MADV_HUGEPAGE)");

  return Publish(env, std::move(m));
}

// closeRegion(id, buffer): detach first so JS can never read unmapped memory, then let go.
// munmap happens once no native thread holds the mapping any more.
Napi::Value CloseRegion(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  uint32_t id = ArgU32(info, 0, "id");
  Unpublish(env, id, info[1].IsArrayBuffer() ? info[1].As<Napi::ArrayBuffer>() : Napi::ArrayBuffer());
  return env.Undefined();
}

// residency(id, offset, length) -> Uint8Array, one byte per page, 1 = resident (mincore).
Napi::Value Residency(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  size_t off, len;
  auto m = RequireRange(env, info[0], info[1], info[2], &off, &len);
  size_t pages = (len + PageSize() - 1) / PageSize();
  Napi::Uint8Array out = Napi::Uint8Array::New(env, pages);
  if (pages && mincore(m->addr + off, len, out.Data()) != 0) ThrowSystemError(env, errno, "mincore");
  for (size_t i = 0; i < pages; i++) out[i] &= 1;
  return out;
}

// pagemap(id, offset, length) -> Uint8Array, 1 = the page table entry is present
// (/proc/self/pagemap bit 63). For shared memory this differs from mincore: a page can
// sit in the page cache without being mapped here.
Napi::Value Pagemap(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  size_t off, len;
  auto m = RequireRange(env, info[0], info[1], info[2], &off, &len, true);
  size_t pages = (len + PageSize() - 1) / PageSize();
  Napi::Uint8Array out = Napi::Uint8Array::New(env, pages);
  int fd = PagemapOf(*m);
  if (fd < 0) ThrowSystemError(env, -fd, "open(/proc/self/pagemap)");
  std::vector<uint64_t> entries(pages);
  off_t pos = static_cast<off_t>(((m->va() + off) / PageSize()) * 8);
  ssize_t want = static_cast<ssize_t>(pages * 8);
  ssize_t got = pread(fd, entries.data(), want, pos);
  if (m->foreign() && (got == 0 || (got < 0 && errno == ESRCH)))
    got = want;  // the process is gone: every entry stays 0, not present
  if (got != want) ThrowSystemError(env, got < 0 ? errno : EIO, "pread(/proc/self/pagemap)");
  for (size_t i = 0; i < pages; i++) out[i] = (entries[i] >> 63) & 1;
  return out;
}

// frames(id, offset, length) -> { pfns: Float64Array, visible }: the physical frame number of
// each page (/proc/self/pagemap bits 0-54), -1 where the entry is not present. Without
// CAP_SYS_ADMIN the kernel reports every PFN as 0: `visible` says whether they are real
// (judged on this function's own stack page when no page of the range shows one).
Napi::Value Frames(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  size_t off, len;
  // A foreign region's are its process's own page tables (/proc/PID/pagemap), as pagemap() reads them.
  auto m = RequireRange(env, info[0], info[1], info[2], &off, &len, true);
  size_t pages = (len + PageSize() - 1) / PageSize();
  int fd = PagemapOf(*m);
  if (fd < 0) ThrowSystemError(env, -fd, "open(/proc/self/pagemap)");
  constexpr uint64_t kPresent = 1ull << 63, kPfnMask = (1ull << 55) - 1;
  std::vector<uint64_t> entries(pages);
  off_t pos = static_cast<off_t>(((m->va() + off) / PageSize()) * 8);
  ssize_t want = static_cast<ssize_t>(pages * 8);
  ssize_t got = pread(fd, entries.data(), want, pos);
  if (m->foreign() && (got == 0 || (got < 0 && errno == ESRCH)))
    got = want;  // the process is gone: every entry stays 0, not present
  if (got != want) ThrowSystemError(env, got < 0 ? errno : EIO, "pread(/proc/self/pagemap)");
  Napi::Float64Array pfns = Napi::Float64Array::New(env, pages);
  bool visible = false;
  for (size_t i = 0; i < pages; i++) {
    pfns[i] = (entries[i] & kPresent) ? static_cast<double>(entries[i] & kPfnMask) : -1.0;
    visible = visible || pfns[i] > 0;
  }
  // No present page of the range showed a frame: ask about one surely present (this stack).
  if (!visible) {
    volatile uint64_t probe = 0;
    uint64_t entry = 0;
    off_t at = static_cast<off_t>((reinterpret_cast<uintptr_t>(&probe) / PageSize()) * 8);
    if (pread(fd, &entry, 8, at) != 8) ThrowSystemError(env, errno, "pread(/proc/self/pagemap)");
    visible = (entry & kPresent) && (entry & kPfnMask) != 0;
  }
  Napi::Object out = Napi::Object::New(env);
  out.Set("pfns", pfns);
  out.Set("visible", Napi::Boolean::New(env, visible));
  return out;
}

namespace {

// The first page of [start, end) (addresses) whose page-table entry is not present, or end.
uint64_t FirstAbsent(Napi::Env env, int fd, uint64_t start, uint64_t end) {
  uint64_t at = end;
  const char* call = nullptr;
  const int err = ScanFirstAbsent(fd, start, end, &at, &call);
  if (err) ThrowSystemError(env, err, call);
  return at;
}

}  // namespace

// pageRun(id, offset, count, granule, tail, frames) -> the index of the first of the `count`
// granules at offset, offset + granule, ... (the last one clipped to the region) whose first or
// last page has no present page-table entry (a THP maps all or nothing), or -1. frames[t] gets
// the frame number of the first page of granule stop - tail + t, stop being that index (or
// count): the translations an IOTLB keeps at the end of a run (-1 before the range; 0 when the
// kernel hides frames). One native call per run, where JavaScript read every entry.
Napi::Value PageRun(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  auto m = FindRegion(ArgU32(info, 0, "id"));
  if (!m) throw Napi::TypeError::New(env, "region is closed or unknown");
  const size_t ps = static_cast<size_t>(PageSize());
  const size_t offset = ArgSize(info, 1, "offset");
  const size_t count = ArgSize(info, 2, "count");
  const size_t granule = ArgSize(info, 3, "granule");
  const size_t tail = ArgSize(info, 4, "tail");
  if (!info[5].IsTypedArray() || info[5].As<Napi::TypedArray>().TypedArrayType() != napi_float64_array)
    throw Napi::TypeError::New(env, "frames must be a Float64Array");
  Napi::Float64Array frames = info[5].As<Napi::Float64Array>();
  if (granule == 0 || granule % ps != 0 || offset % ps != 0) throw Napi::RangeError::New(env, "offset and granule must be multiples of the page size");
  if (tail > frames.ElementLength()) throw Napi::RangeError::New(env, "frames is shorter than tail");
  if (count == 0) return Napi::Number::New(env, -1);
  if (offset >= m->size || (count - 1) > (m->size - 1 - offset) / granule) throw Napi::RangeError::New(env, "range is outside the region");
  const int fd = PagemapOf(*m);
  if (fd < 0) ThrowSystemError(env, -fd, "open(/proc/self/pagemap)");
  const uint64_t base = m->va();
  const uint64_t end = base + std::min(offset + count * granule, m->size);
  // The first granule whose first or last page is absent (an absent page inside a granule
  // does not count, as for a huge page mapped whole).
  size_t stop = count;
  for (uint64_t at = base + offset; at < end;) {
    const uint64_t a = FirstAbsent(env, fd, at, end);
    if (a >= end) break;
    const size_t g = (a - base - offset) / granule;
    const uint64_t first = base + offset + g * granule;
    const uint64_t last = std::min(first + granule, end) - ps;
    if (a == first || a == last || FirstAbsent(env, fd, last, last + ps) == last) {
      stop = g;
      break;
    }
    at = last + ps;
  }
  // The frames of the window's granules (their first pages), read from the pagemap.
  constexpr uint64_t kPresent = 1ull << 63, kPfnMask = (1ull << 55) - 1;
  const size_t from = stop >= tail ? stop - tail : 0;  // first granule of the window
  for (size_t t = 0; t < tail - (stop - from); t++) frames[t] = -1.0;
  const size_t gp = granule / ps;
  uint64_t entries[512];
  for (size_t g = from; g < stop;) {
    // Consecutive pages when granules are pages; else one entry per granule.
    const size_t n = gp == 1 ? std::min<size_t>(512, stop - g) : 1;
    const off_t pos = static_cast<off_t>(((base + offset) / ps + g * gp) * 8);
    ssize_t got = pread(fd, entries, n * 8, pos);
    if (m->foreign() && (got == 0 || (got < 0 && errno == ESRCH))) {  // the process is gone: nothing present
      memset(entries, 0, sizeof(entries));
      got = static_cast<ssize_t>(n * 8);
    }
    if (got != static_cast<ssize_t>(n * 8)) ThrowSystemError(env, got < 0 ? errno : EIO, "pread(/proc/self/pagemap)");
    for (size_t i = 0; i < n; i++, g++) {
      const uint64_t e = entries[i];
      frames[tail - (stop - g)] = (e & kPresent) ? static_cast<double>(e & kPfnMask) : -1.0;
    }
  }
  return Napi::Number::New(env, stop < count ? static_cast<double>(stop) : -1.0);
}

// populate(id, offset, length, write): MADV_POPULATE_READ/WRITE, get_user_pages from user space.
Napi::Value Populate(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  size_t off, len;
  auto m = RequireRange(env, info[0], info[1], info[2], &off, &len);
  bool write = ArgBool(info, 3);
  if (len && madvise(m->addr + off, len, write ? MADV_POPULATE_WRITE : MADV_POPULATE_READ) != 0)
    ThrowSystemError(env, errno, write ? "madvise(MADV_POPULATE_WRITE)" : "madvise(MADV_POPULATE_READ)");
  return env.Undefined();
}

// evict(id, offset, length): anonymous memory -> MADV_DONTNEED; memfd -> MADV_REMOVE, which
// punches a hole in the file (the pages leave the page cache too, so the next access is a
// missing fault again) and, unlike fallocate, tells this mapping's userfaultfd
// (UFFD_EVENT_REMOVE), as MADV_DONTNEED does for anonymous memory.
Napi::Value Evict(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  size_t off, len;
  auto m = RequireRange(env, info[0], info[1], info[2], &off, &len);
  if (!len) return env.Undefined();
  if (int busy = BeforeDrop(m->addr + off, len, m->fd >= 0)) ThrowSystemError(env, busy, m->fd >= 0 ? "madvise(MADV_REMOVE)" : "madvise(MADV_DONTNEED)");
  int rc = madvise(m->addr + off, len, m->fd >= 0 ? MADV_REMOVE : MADV_DONTNEED);
  NoteDrop();  // even on failure: part of the range may be gone
  if (rc != 0) ThrowSystemError(env, errno, m->fd >= 0 ? "madvise(MADV_REMOVE)" : "madvise(MADV_DONTNEED)");
  return env.Undefined();
}

// zap(id, offset, length): MADV_DONTNEED even on memfd: the mapping loses its page table
// entries but the page cache keeps the data, so the next access is a minor fault.
Napi::Value Zap(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  size_t off, len;
  auto m = RequireRange(env, info[0], info[1], info[2], &off, &len);
  if (int busy = BeforeDrop(m->addr + off, len)) ThrowSystemError(env, busy, "madvise(MADV_DONTNEED)");
  int rc = len ? madvise(m->addr + off, len, MADV_DONTNEED) : 0;
  if (len) NoteDrop();
  if (rc != 0) ThrowSystemError(env, errno, "madvise(MADV_DONTNEED)");
  return env.Undefined();
}

// advise(id, offset, length, advice): MADV_COLLAPSE (make the range one transparent huge
// page, migrating every frame; 6.1) or MADV_PAGEOUT (reclaim the range now; 5.4).
Napi::Value Advise(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  size_t off, len;
  auto m = RequireRange(env, info[0], info[1], info[2], &off, &len);
  uint32_t advice = ArgU32(info, 3, "advice");
  const char* name = advice == MADV_COLLAPSE ? "madvise(MADV_COLLAPSE)" : advice == MADV_PAGEOUT ? "madvise(MADV_PAGEOUT)" : nullptr;
  if (name == nullptr) throw Napi::RangeError::New(env, "advice must be MADV_COLLAPSE or MADV_PAGEOUT");
  // Regions are mapped MADV_NOHUGEPAGE (4 KiB faults), which MADV_COLLAPSE refuses: make the
  // range THP-eligible first. It stays so: a huge page is what the caller asked for.
  if (advice == MADV_COLLAPSE && !m->huge && !m->hugetlb && len && madvise(m->addr + off, len, MADV_HUGEPAGE) != 0)
    ThrowSystemError(env, errno, "madvise(MADV_HUGEPAGE)");
  if (int busy = BeforeDrop(m->addr + off, len)) ThrowSystemError(env, busy, name);
  int rc = len ? madvise(m->addr + off, len, static_cast<int>(advice)) : 0;
  if (len) NoteDrop();  // PAGEOUT reclaims; COLLAPSE remaps every frame
  if (rc != 0) ThrowSystemError(env, errno, name);
  return env.Undefined();
}

// pagemapScan(id, offset, length, flags, categoryMask, categoryInverted, anyofMask, returnMask)
// -> Float64Array of (startOffset, endOffset, categories) runs. The PAGEMAP_SCAN ioctl on
// /proc/self/pagemap (6.7); with PM_SCAN_WP_MATCHING it write-protects (re-arms) what it
// reports: the dirty-page scan of UFFD_FEATURE_WP_ASYNC.
Napi::Value PagemapScan(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  size_t off, len;
  auto m = RequireRange(env, info[0], info[1], info[2], &off, &len);
  static const int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  if (fd < 0) ThrowSystemError(env, errno, "open(/proc/self/pagemap)");
  std::vector<page_region> vec(256);
  std::vector<double> runs;
  uint64_t start = reinterpret_cast<uint64_t>(m->addr + off), end = start + len;
  const uint64_t base = reinterpret_cast<uint64_t>(m->addr);
  while (start < end) {
    pm_scan_arg arg{};
    arg.size = sizeof(arg);
    arg.flags = ArgAddr(info, 3, "flags");
    arg.start = start;
    arg.end = end;
    arg.vec = reinterpret_cast<uint64_t>(vec.data());
    arg.vec_len = vec.size();
    arg.category_mask = ArgAddr(info, 4, "categoryMask");
    arg.category_inverted = ArgAddr(info, 5, "categoryInverted");
    arg.category_anyof_mask = ArgAddr(info, 6, "anyofMask");
    arg.return_mask = ArgAddr(info, 7, "returnMask");
    long n = ioctl(fd, PAGEMAP_SCAN, &arg);
    if (n < 0) ThrowSystemError(env, errno, "ioctl(PAGEMAP_SCAN)");
    for (long i = 0; i < n; i++)
      runs.insert(runs.end(), {static_cast<double>(vec[i].start - base), static_cast<double>(vec[i].end - base), static_cast<double>(vec[i].categories)});
    if (arg.walk_end <= start) break;  // no progress: nothing more to say
    start = arg.walk_end;
  }
  auto out = Napi::Float64Array::New(env, runs.size());
  std::copy(runs.begin(), runs.end(), out.Data());
  return out;
}

Napi::Value Pin(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  size_t off, len;
  auto m = RequireRange(env, info[0], info[1], info[2], &off, &len);
  bool on = ArgBool(info, 3);
  if (len && (on ? mlock(m->addr + off, len) : munlock(m->addr + off, len)) != 0) ThrowSystemError(env, errno, on ? "mlock" : "munlock");
  return env.Undefined();
}

// A second view of a memfd region's pages at another address (MAP_SHARED of the same
// file): the device's page table beside the CPU's. Returned as a region of its own.
Napi::Value MapAlias(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  uint32_t id = ArgU32(info, 0, "id");
  auto src = FindRegion(id);
  if (!src) throw Napi::TypeError::New(env, "region is closed or unknown");
  if (src->fd < 0) throw Napi::TypeError::New(env, "only memfd-backed (shared) regions have a second view");
  auto m = std::make_shared<Mapping>();
  m->fd = dup(src->fd);
  if (m->fd < 0) ThrowSystemError(env, errno, "dup");
  m->size = src->size;
  m->hugetlb = src->hugetlb;
  // hugetlbfs: reserve at mmap, as MapHugetlb does, so a short pool is ENOMEM here rather
  // than SIGBUS at a write through this view.
  int flags = MAP_SHARED | (src->hugetlb ? 0 : MAP_NORESERVE);
  void* addr = mmap(nullptr, m->size, PROT_READ | PROT_WRITE, flags, m->fd, 0);
  if (addr == MAP_FAILED) ThrowSystemError(env, errno, "mmap");
  m->addr = static_cast<uint8_t*>(addr);
  if (!src->hugetlb) madvise(addr, m->size, MADV_NOHUGEPAGE);
  return Publish(env, std::move(m));
}

// regionShare(id) -> { id, address, buffer, pageSize }: a new handle on an existing mapping,
// for another JS thread (a worker). It holds the mapping like any handle: the memory stays
// mapped until every handle is closed and no native thread works on it.
Napi::Value RegionShare(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  auto m = FindRegion(ArgU32(info, 0, "id"));
  if (!m || m->foreign()) throw Napi::TypeError::New(env, "region is closed or unknown, or foreign");
  return Publish(env, std::move(m), false);
}

Napi::Value MemlockLimit(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  rlimit rl{};
  if (getrlimit(RLIMIT_MEMLOCK, &rl) != 0) ThrowSystemError(env, errno, "getrlimit");
  Napi::Object out = Napi::Object::New(env);
  out.Set("soft", rl.rlim_cur == RLIM_INFINITY ? Napi::Number::New(env, -1) : Napi::Number::New(env, static_cast<double>(rl.rlim_cur)));
  out.Set("hard", rl.rlim_max == RLIM_INFINITY ? Napi::Number::New(env, -1) : Napi::Number::New(env, static_cast<double>(rl.rlim_max)));
  return out;
}

Napi::Value Tid(const Napi::CallbackInfo& info) { return Napi::Number::New(info.Env(), Gettid()); }

}  // namespace

Napi::Object PublishPrivate(Napi::Env env, size_t size) {
  auto m = std::make_shared<Mapping>();
  m->size = size;
  void* addr = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (addr == MAP_FAILED) ThrowSystemError(env, errno, "mmap");
  m->addr = static_cast<uint8_t*>(addr);
  return Publish(env, std::move(m), false);
}

Napi::Object PublishMapping(Napi::Env env, std::shared_ptr<Mapping> m) { return Publish(env, std::move(m), false); }

uint32_t AddRegion(std::shared_ptr<Mapping> m) {
  std::lock_guard<std::mutex> lock(g_mu);
  const uint32_t id = g_next_id++;
  g_regions[id] = Entry{std::move(m), nullptr, false};
  return id;
}

void Unpublish(Napi::Env env, uint32_t id, Napi::ArrayBuffer buffer) {
  if (!buffer.IsEmpty() && !buffer.IsDetached()) buffer.Detach();
  std::shared_ptr<Mapping> last;
  bool accounted;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = g_regions.find(id);
    if (it == g_regions.end()) return;
    last = std::move(it->second.mapping);
    accounted = it->second.accounted;
    if (it->second.hold) it->second.hold->mapping.reset();
    g_regions.erase(it);
  }
  if (accounted) Napi::MemoryManagement::AdjustExternalMemory(env, -static_cast<int64_t>(last->size));
}

void InitRegion(Napi::Env env, Napi::Object exports) {
  exports.Set("mapRegion", Napi::Function::New(env, MapRegion, "mapRegion"));
  exports.Set("mapAlias", Napi::Function::New(env, MapAlias, "mapAlias"));
  exports.Set("regionShare", Napi::Function::New(env, RegionShare, "regionShare"));
  exports.Set("closeRegion", Napi::Function::New(env, CloseRegion, "closeRegion"));
  exports.Set("residency", Napi::Function::New(env, Residency, "residency"));
  exports.Set("pagemap", Napi::Function::New(env, Pagemap, "pagemap"));
  exports.Set("frames", Napi::Function::New(env, Frames, "frames"));
  exports.Set("pageRun", Napi::Function::New(env, PageRun, "pageRun"));
  exports.Set("populate", Napi::Function::New(env, Populate, "populate"));
  exports.Set("evict", Napi::Function::New(env, Evict, "evict"));
  exports.Set("zap", Napi::Function::New(env, Zap, "zap"));
  exports.Set("advise", Napi::Function::New(env, Advise, "advise"));
  exports.Set("pagemapScan", Napi::Function::New(env, PagemapScan, "pagemapScan"));
  exports.Set("pin", Napi::Function::New(env, Pin, "pin"));
  exports.Set("memlockLimit", Napi::Function::New(env, MemlockLimit, "memlockLimit"));
  exports.Set("gettid", Napi::Function::New(env, Tid, "gettid"));
  exports.Set("pageSize", Napi::Number::New(env, static_cast<double>(PageSize())));
}

}  // namespace pfr
