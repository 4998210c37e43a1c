// Another process's memory as a region of the table: the device's view of a program's MR
// (kernel-sim/device). Nothing of it is mapped here. Its page tables are read from that
// process's /proc/PID/pagemap (present bit 63), opened once at creation, so the SMMU's walks
// (pageRun, pagemap) and the copy engine's checks run on foreign regions as on local ones; its
// bytes are moved with process_vm_readv / process_vm_writev by the copy engine's threads. The
// kernel lets this process in only as the program's ptracer: same uid and, under Yama, the
// program's prctl(PR_SET_PTRACER) naming it (the provider does that at ibv_open_device).
#include <fcntl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <string>

#include "common.h"

namespace pfr {

namespace {

constexpr size_t kBounce = 64 << 10;  // a foreign-to-foreign copy goes through this much at a time

// One process_vm call moving up to len bytes: local [l, l+len) to or from remote address r of
// pid. Returns the bytes moved (the kernel stops at the first page it cannot reach).
size_t Move(pid_t pid, bool write, uint8_t* l, uint64_t r, size_t len) {
  size_t done = 0;
  while (done < len) {
    iovec local{l + done, len - done};
    iovec remote{reinterpret_cast<void*>(r + done), len - done};
    const ssize_t n = write ? process_vm_writev(pid, &local, 1, &remote, 1, 0) : process_vm_readv(pid, &local, 1, &remote, 1, 0);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      break;
    }
    done += static_cast<size_t>(n);
  }
  return done;
}

// foreignRegion(pid, address, length) -> id: `length` bytes of process pid's memory at
// `address` (both page-aligned) as a region (no buffer: closeRegion(id) forgets it).
Napi::Value ForeignRegion(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const uint32_t pid = ArgU32(info, 0, "pid");
  const uint64_t address = ArgAddr(info, 1, "address");
  const size_t length = ArgSize(info, 2, "length");
  const uint64_t ps = static_cast<uint64_t>(PageSize());
  if (pid == 0 || pid > 0x7fffffff) throw Napi::RangeError::New(env, "pid must be a process id");
  if (address % ps != 0 || length == 0 || length % ps != 0 || address + length < address)
    throw Napi::RangeError::New(env, "address and length must be page-aligned and length positive");
  const std::string path = "/proc/" + std::to_string(pid) + "/pagemap";
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) ThrowSystemError(env, errno, "open(/proc/PID/pagemap)");
  auto m = std::make_shared<Mapping>();
  m->pid = static_cast<pid_t>(pid);
  m->remote = address;
  m->size = length;
  m->pagemap_fd = fd;
  return Napi::Number::New(env, AddRegion(std::move(m)));
}

}  // namespace

size_t ForeignCopy(const Mapping& s, size_t src_off, const Mapping& d, size_t dst_off, size_t len, bool* dest_side) {
  if (!s.foreign()) {
    const size_t n = Move(d.pid, true, s.addr + src_off, d.remote + dst_off, len);
    *dest_side = true;
    return n;
  }
  if (!d.foreign()) {
    const size_t n = Move(s.pid, false, d.addr + dst_off, s.remote + src_off, len);
    *dest_side = false;
    return n;
  }
  // Process to process (two programs of one device): through a bounce buffer.
  static thread_local std::unique_ptr<uint8_t[]> bounce(new uint8_t[kBounce]);
  size_t done = 0;
  while (done < len) {
    const size_t n = std::min(kBounce, len - done);
    const size_t got = Move(s.pid, false, bounce.get(), s.remote + src_off + done, n);
    const size_t put = Move(d.pid, true, bounce.get(), d.remote + dst_off + done, got);
    done += put;
    if (put < got) return *dest_side = true, done;
    if (got < n) return *dest_side = false, done;
  }
  return done;
}

void InitForeign(Napi::Env env, Napi::Object exports) {
  exports.Set("foreignRegion", Napi::Function::New(env, ForeignRegion, "foreignRegion"));
}

}  // namespace pfr
