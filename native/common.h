// Shared pieces of the addon: errno errors, argument readers, the region table.
// The raw binding is deliberately dumb: TypeScript validates every argument first and
// turns these errors into messages that say the fix. Native code only refuses what would
// crash (unknown handles, ranges outside a mapping).
#pragma once

#ifndef NAPI_VERSION
#define NAPI_VERSION 8
#endif
#include <napi.h>

#include <cerrno>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

namespace pfr {

// A Node-style system error: code = errno name, errno = -errno (as libuv), syscall.
Napi::Error SystemError(Napi::Env env, int err, const char* syscall);
[[noreturn]] void ThrowSystemError(Napi::Env env, int err, const char* syscall);

// An mmap'd region. Whoever holds a shared_ptr keeps the memory mapped: the region
// table (until close), the ArrayBuffer finalizer (until GC or close), and every native
// thread working on it (toucher, copy engine). munmap runs when the last one lets go,
// so no native thread ever touches unmapped memory.
struct Mapping {
  uint8_t* addr = nullptr;
  size_t size = 0;
  int fd = -1;  // memfd for shared regions, -1 for anonymous private memory
  bool huge = false;     // transparent huge pages asked for (MADV_HUGEPAGE)
  bool hugetlb = false;  // hugetlbfs memory: 2 MiB pages from the reserved pool
  // A foreign mapping (foreign.cc): `size` bytes of another process's memory at `remote`
  // there (the device's view of a program's MR), with `addr` null: nothing of it is mapped
  // here. Its pages are read from that process's pagemap (`pagemap_fd`, opened once, bound to
  // that process's memory even if its pid is reused) and its bytes moved with
  // process_vm_readv / process_vm_writev.
  pid_t pid = 0;
  uint64_t remote = 0;
  int pagemap_fd = -1;
  bool foreign() const { return pid != 0; }
  // The virtual address of byte 0 in the address space the mapping belongs to.
  uint64_t va() const { return foreign() ? remote : reinterpret_cast<uintptr_t>(addr); }
  ~Mapping();
};

std::shared_ptr<Mapping> FindRegion(uint32_t id);
// Throws a TypeError for an unknown or closed region id (or a foreign one, unless `foreign`
// says the caller handles them) and a RangeError for a range outside the mapping; returns the
// mapping otherwise.
std::shared_ptr<Mapping> RequireRange(Napi::Env env, const Napi::Value& id, const Napi::Value& off,
                                      const Napi::Value& len, size_t* offset, size_t* length, bool foreign = false);
// A region with no ArrayBuffer (a foreign one) into the table: its id, for closeRegion.
uint32_t AddRegion(std::shared_ptr<Mapping> m);
// A mapping into the table with an ArrayBuffer over it, as mapRegion returns it.
Napi::Object PublishMapping(Napi::Env env, std::shared_ptr<Mapping> m);

// A private anonymous mapping (MAP_NORESERVE) in the region table, as mapRegion returns it
// ({ id, address, buffer, pageSize }), not reported as external memory: the transport's
// receive slots, which the copy engine reads by region id. Unpublish is closeRegion.
Napi::Object PublishPrivate(Napi::Env env, size_t size);
void Unpublish(Napi::Env env, uint32_t id, Napi::ArrayBuffer buffer);

uint32_t ArgU32(const Napi::CallbackInfo& info, size_t i, const char* name);
size_t ArgSize(const Napi::CallbackInfo& info, size_t i, const char* name);
uint64_t ArgAddr(const Napi::CallbackInfo& info, size_t i, const char* name);
bool ArgBool(const Napi::CallbackInfo& info, size_t i);

// /proc/self/pagemap, opened once (-errno if it cannot be).
int PagemapFd();
// The pagemap of the address space m belongs to: this process's, or a foreign mapping's own.
int PagemapOf(const Mapping& m);
// True if every page of [off, off+len) of m has a present page-table entry (pagemap bit 63):
// an access to it cannot fault (a CPU access to memfd memory in the page cache but not
// mapped here would be a minor fault, so mincore is not enough).
bool AllPresent(const Mapping& m, size_t off, size_t len);
// The offset in m of the first page of [off, off+len) without a present page-table entry, or
// -1: the walk a foreign mapping's copies check (mincore cannot see another process).
int64_t FirstAbsent(const Mapping& m, size_t off, size_t len);
// Bytes moved between two mappings of which at least one is foreign (process_vm_readv/writev;
// foreign.cc); fewer than len when a page could not be reached, *dest_side saying which side's.
size_t ForeignCopy(const Mapping& s, size_t src_off, const Mapping& d, size_t dst_off, size_t len, bool* dest_side);

// Every path of the addon that can take a page-table entry away from a mapping (MADV_DONTNEED,
// MADV_REMOVE, MADV_PAGEOUT, MADV_COLLAPSE, munmap, UFFDIO_MOVE) calls NoteDrop() once the
// entry is gone; a drop announced before it happens (a userfaultfd REMOVE, UNMAP or REMAP
// event: the kernel zaps after the event is read) calls NoteDropAhead(). The copy engine's
// inline path reuses a pagemap proof of presence only while the epoch is unchanged
// (copy_engine.cc, docs/threads.md).
void NoteDrop();
void NoteDropAhead();

// Presence proofs (copy_engine.cc): whether every page of a range of a mapping has a present
// page-table entry, from pagemap or from a proof of it still valid (the drop epoch unchanged,
// younger than its TTL, no swap). One owner thread: the copy engine's inline copies, the
// transport's sends that lend the provider their source (fabric.cc).
class PresenceProofs {
 public:
  bool Present(const Mapping& m, size_t off, size_t len, int* reads);

 private:
  struct Proof {
    const Mapping* m = nullptr;
    uintptr_t first = 0, last = 0;
    uint64_t epoch = 0, at = 0;
  };
  Proof proofs[32];
  bool swap_on = true;  // checked at most once per TTL (sysinfo)
  uint64_t swap_checked_at = 0;
};

// Before the addon itself takes pages away from [addr, addr+len) of this process (evict, zap,
// MADV_PAGEOUT/COLLAPSE, UFFDIO_MOVE's source): whatever lent those pages to a reader that
// reads them later (a send posted without a staging copy, fabric.cc) is finished first. 0, or
// an errno (EBUSY: a lent send its peer did not take within the bound; nothing was dropped).
// `file`: the drop punches the pages out of a memfd (MADV_REMOVE), so every mapping of it loses
// them, wherever it is mapped: every lent send from a file-backed mapping is finished.
// Set by InitFabric; null without libfabric.
extern int (*g_before_drop)(uintptr_t addr, size_t len, bool file);
inline int BeforeDrop(const void* addr, size_t len, bool file = false) {
  return g_before_drop && len ? g_before_drop(reinterpret_cast<uintptr_t>(addr), len, file) : 0;
}

// CRC-32C of n bytes, continuing from seed (checksum.cc).
uint32_t Crc32c(uint32_t seed, const uint8_t* p, size_t n);

long PageSize();
uint64_t NowNs();
pid_t Gettid();

void InitRegion(Napi::Env env, Napi::Object exports);
void InitUffd(Napi::Env env, Napi::Object exports);
void InitToucher(Napi::Env env, Napi::Object exports);
void InitCopyEngine(Napi::Env env, Napi::Object exports);
void InitChecksum(Napi::Env env, Napi::Object exports);
void InitFabric(Napi::Env env, Napi::Object exports);
void InitRedis(Napi::Env env, Napi::Object exports);
void InitSeqpacket(Napi::Env env, Napi::Object exports);
void InitForeign(Napi::Env env, Napi::Object exports);

}  // namespace pfr
