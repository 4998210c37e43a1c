// The device's plumbing to the programs (kernel-sim/device): SOCK_SEQPACKET Unix sockets whose
// messages carry file descriptors (SCM_RIGHTS) and whose peers are known by SO_PEERCRED, the
// sealed memfds of the rings, the kinds of descriptors a peer sends, a lock file, and writes
// that never block into a peer's pipe. Dumb on purpose: every message is handed to TypeScript
// as bytes and a list of descriptors, and the protocol is checked there (docs/device-abi.md).
// Sockets are watched with uv_poll on the JS thread; each event is one MakeCallback.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <uv.h>

#include <atomic>
#include <cstring>
#include <vector>

#include "common.h"
#include "device/abi.h"

namespace pfr {

namespace {

// Bytes of the receive buffer: one more than the protocol allows, so a longer datagram shows
// as truncated (MSG_TRUNC) rather than as a message of exactly the limit.
constexpr size_t kMaxMessage = PFR_CTL_MAX_MESSAGE;
// Descriptors one message may bring: more are reported by MSG_CTRUNC (the kernel closes them).
constexpr size_t kMaxFds = 8;

enum EventFlag : uint32_t { kTruncated = 1, kFdsTruncated = 2 };

struct Sock {
  uint32_t handle = 0;
  int fd = -1;
  bool listener = false;
  bool closed = false;
  uv_poll_t* poll = nullptr;
  Napi::FunctionReference onEvent;
  std::unique_ptr<Napi::AsyncContext> async;
};

std::unordered_map<uint32_t, Sock*> g_socks;
uint32_t g_next = 1;

void Emit(Sock* s, const char* kind, std::initializer_list<napi_value> more) {
  Napi::Env env = s->onEvent.Env();
  Napi::HandleScope scope(env);
  napi_value args[6];
  size_t n = 0;
  args[n++] = Napi::String::New(env, kind);
  args[n++] = Napi::Number::New(env, s->handle);
  for (napi_value v : more) args[n++] = v;
  try {
    s->onEvent.MakeCallback(env.Global(), n, args, *s->async);
  } catch (const Napi::Error& e) {
    napi_fatal_exception(env, e.Value());
  }
}

void Close(Sock* s) {
  if (s->closed) return;
  s->closed = true;
  if (s->poll) {
    uv_poll_stop(s->poll);
    uv_close(reinterpret_cast<uv_handle_t*>(s->poll), [](uv_handle_t* h) { delete reinterpret_cast<uv_poll_t*>(h); });
    s->poll = nullptr;
  }
  if (s->fd >= 0) close(s->fd);
  s->fd = -1;
  g_socks.erase(s->handle);
  delete s;
}

void OnReadable(uv_poll_t* h, int status, int events);

Sock* Watch(Napi::Env env, int fd, bool listener, Napi::Function onEvent) {
  uv_loop_t* loop = nullptr;
  if (napi_get_uv_event_loop(env, &loop) != napi_ok || loop == nullptr) throw Napi::Error::New(env, "no event loop for this environment");
  auto* s = new Sock();
  s->fd = fd;
  s->listener = listener;
  s->onEvent = Napi::Persistent(onEvent);
  s->async = std::make_unique<Napi::AsyncContext>(env, "pagefault-rdma:seqpacket");
  s->poll = new uv_poll_t();
  int err = uv_poll_init(loop, s->poll, fd);
  if (err != 0) {
    delete s->poll;
    s->poll = nullptr;
    close(fd);
    delete s;
    ThrowSystemError(env, -err, "uv_poll_init");
  }
  s->poll->data = s;
  s->handle = g_next++;
  g_socks[s->handle] = s;
  uv_poll_start(s->poll, UV_READABLE | UV_DISCONNECT, OnReadable);
  return s;
}

void Accept(Sock* l) {
  Napi::Env env = l->onEvent.Env();
  for (;;) {
    int fd = accept4(l->fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED) return;
      const int err = errno;
      Napi::HandleScope scope(env);  // the argument is a handle: made inside a scope (a uv callback has none)
      Emit(l, "error", {Napi::Number::New(env, err)});
      return;
    }
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) cred = ucred{0, static_cast<uid_t>(-1), static_cast<gid_t>(-1)};
    Napi::HandleScope scope(env);
    Sock* c = Watch(env, fd, false, l->onEvent.Value());
    Emit(l, "connection",
         {Napi::Number::New(env, c->handle), Napi::Number::New(env, cred.pid), Napi::Number::New(env, cred.uid), Napi::Number::New(env, cred.gid)});
    if (l->closed) return;  // the listener's handler closed it
  }
}

// One datagram and its descriptors; false when there is nothing more to read now. At the end
// of the stream or on an error the socket is closed here, after its 'close' or 'error' event.
bool ReadOne(Sock* s) {
  Napi::Env env = s->onEvent.Env();
  uint8_t buf[kMaxMessage];
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFds)];
  iovec iov{buf, sizeof(buf)};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n = recvmsg(s->fd, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
  if (n < 0) {
    if (errno == EAGAIN || errno == EINTR) return false;
    const int err = errno;
    const uint32_t handle = s->handle;
    {
      // A peer killed with data unread is ECONNRESET here: its argument is a handle, made
      // inside a scope (a uv callback has none; V8 aborts the process otherwise).
      Napi::HandleScope scope(env);
      Emit(s, "error", {Napi::Number::New(env, err)});
    }
    if (g_socks.count(handle)) Close(g_socks[handle]);
    return false;
  }
  std::vector<int> fds;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; i++) {
      int fd;
      memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      fds.push_back(fd);
    }
  }
  // End of file: a datagram socket's peer closed (a zero-length datagram has no descriptors
  // and is not something the protocol sends; it reads as the end too).
  if (n == 0 && fds.empty()) {
    const uint32_t handle = s->handle;
    Emit(s, "close", {});
    if (g_socks.count(handle)) Close(g_socks[handle]);
    return false;
  }
  Napi::HandleScope scope(env);
  Napi::Buffer<uint8_t> bytes = Napi::Buffer<uint8_t>::Copy(env, buf, static_cast<size_t>(n));
  Napi::Array list = Napi::Array::New(env, fds.size());
  for (size_t i = 0; i < fds.size(); i++) list.Set(i, Napi::Number::New(env, fds[i]));
  const uint32_t flags = ((msg.msg_flags & MSG_TRUNC) ? static_cast<uint32_t>(kTruncated) : 0u) |
                        ((msg.msg_flags & MSG_CTRUNC) ? static_cast<uint32_t>(kFdsTruncated) : 0u);
  Emit(s, "message", {bytes, list, Napi::Number::New(env, flags)});
  return true;
}

void OnReadable(uv_poll_t* h, int status, int events) {
  Sock* s = static_cast<Sock*>(h->data);
  const uint32_t handle = s->handle;
  if (s->listener) return Accept(s);
  // A burst of messages in one wake-up; the handler may close the socket between two.
  for (int i = 0; i < 64; i++) {
    auto it = g_socks.find(handle);
    if (it == g_socks.end() || it->second->closed) return;
    if (!ReadOne(it->second)) break;
  }
  // The peer hung up: read what is left; the end of the stream closes the socket.
  if (status < 0 || (events & UV_DISCONNECT))
    while (g_socks.count(handle) && ReadOne(g_socks[handle])) {
    }
}

Sock* Require(const Napi::CallbackInfo& info, size_t i) {
  const uint32_t handle = ArgU32(info, i, "handle");
  auto it = g_socks.find(handle);
  if (it == g_socks.end()) throw Napi::TypeError::New(info.Env(), "socket is closed or unknown");
  return it->second;
}

sockaddr_un SocketAddress(Napi::Env env, const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) throw Napi::RangeError::New(env, "socket path must be 1 to 107 bytes");
  memcpy(addr.sun_path, path.data(), path.size());
  return addr;
}

// seqpacketListen(path, onEvent) -> handle. The socket file is made 0600: only its owner may
// connect (the folder around it is 0700 too). onEvent('connection', listener, conn, pid, uid, gid).
Napi::Value Listen(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const std::string path = info[0].As<Napi::String>().Utf8Value();
  if (!info[1].IsFunction()) throw Napi::TypeError::New(env, "onEvent must be a function");
  sockaddr_un addr = SocketAddress(env, path);
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) ThrowSystemError(env, errno, "socket(AF_UNIX, SOCK_SEQPACKET)");
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    int err = errno;
    close(fd);
    ThrowSystemError(env, err, "bind");
  }
  if (chmod(path.c_str(), 0600) != 0 || listen(fd, 64) != 0) {
    int err = errno;
    close(fd);
    unlink(path.c_str());
    ThrowSystemError(env, err, "listen");
  }
  return Napi::Number::New(env, Watch(env, fd, true, info[1].As<Napi::Function>())->handle);
}

// seqpacketConnect(path, onEvent) -> handle: a client connection (tests, the CLI's queries).
Napi::Value Connect(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const std::string path = info[0].As<Napi::String>().Utf8Value();
  if (!info[1].IsFunction()) throw Napi::TypeError::New(env, "onEvent must be a function");
  sockaddr_un addr = SocketAddress(env, path);
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd < 0) ThrowSystemError(env, errno, "socket(AF_UNIX, SOCK_SEQPACKET)");
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    int err = errno;
    close(fd);
    ThrowSystemError(env, err, "connect");
  }
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  return Napi::Number::New(env, Watch(env, fd, false, info[1].As<Napi::Function>())->handle);
}

// seqpacketAdopt(fd, onEvent) -> handle: a connected SOCK_SEQPACKET socket a peer sent (a
// program's fault socket); the descriptor now belongs to the handle.
Napi::Value Adopt(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const int fd = static_cast<int>(ArgU32(info, 0, "fd"));
  if (!info[1].IsFunction()) throw Napi::TypeError::New(env, "onEvent must be a function");
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  return Napi::Number::New(env, Watch(env, fd, false, info[1].As<Napi::Function>())->handle);
}

// seqpacketSend(handle, bytes, fds) -> true, or false when the peer's queue is full (it does
// not read its replies). The descriptors stay the caller's (the kernel sends copies).
Napi::Value Send(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Sock* s = Require(info, 0);
  if (!info[1].IsTypedArray()) throw Napi::TypeError::New(env, "bytes must be a Uint8Array");
  Napi::Uint8Array bytes = info[1].As<Napi::Uint8Array>();
  std::vector<int> fds;
  if (info[2].IsArray()) {
    Napi::Array list = info[2].As<Napi::Array>();
    if (list.Length() > kMaxFds) throw Napi::RangeError::New(env, "too many descriptors for one message");
    for (uint32_t i = 0; i < list.Length(); i++) fds.push_back(static_cast<int>(list.Get(i).As<Napi::Number>().Int32Value()));
  }
  iovec iov{bytes.Data(), bytes.ByteLength()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFds)];
  if (!fds.empty()) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  if (sendmsg(s->fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL) < 0) {
    if (errno == EAGAIN) return Napi::Boolean::New(env, false);
    ThrowSystemError(env, errno, "sendmsg");
  }
  return Napi::Boolean::New(env, true);
}

// seqpacketClose(handle): idempotent; no event follows.
Napi::Value CloseSocket(const Napi::CallbackInfo& info) {
  const uint32_t handle = ArgU32(info, 0, "handle");
  auto it = g_socks.find(handle);
  if (it != g_socks.end()) Close(it->second);
  return info.Env().Undefined();
}

// fdClose(fd): a descriptor a peer sent that the device does not keep.
Napi::Value FdClose(const Napi::CallbackInfo& info) {
  close(static_cast<int>(ArgU32(info, 0, "fd")));
  return info.Env().Undefined();
}

// fdKind(fd) -> 'fifo' | 'file' | 'eventfd' | 'seqpacket' | 'memfd' | 'other': what a peer's descriptor is
// (a memfd is checked before a regular file: both are S_ISREG).
Napi::Value FdKind(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const int fd = static_cast<int>(ArgU32(info, 0, "fd"));
  struct stat st {};
  if (fstat(fd, &st) != 0) ThrowSystemError(env, errno, "fstat");
  if (S_ISFIFO(st.st_mode)) return Napi::String::New(env, "fifo");
  if (S_ISSOCK(st.st_mode)) {
    int type = 0;
    socklen_t len = sizeof(type);
    int domain = 0;
    socklen_t dlen = sizeof(domain);
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) == 0 && getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &dlen) == 0 &&
        type == SOCK_SEQPACKET && domain == AF_UNIX)
      return Napi::String::New(env, "seqpacket");
    return Napi::String::New(env, "other");
  }
  char link[64] = {};
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  ssize_t n = readlink(path.c_str(), link, sizeof(link) - 1);
  if (n > 0 && strcmp(link, "anon_inode:[eventfd]") == 0) return Napi::String::New(env, "eventfd");
  if (n > 0 && strncmp(link, "/memfd:", 7) == 0) return Napi::String::New(env, "memfd");
  if (S_ISREG(st.st_mode)) return Napi::String::New(env, "file");
  return Napi::String::New(env, "other");
}

// fdWrite(fd, bytes) -> bytes written, or -errno: one write(2) that never blocks (a peer's event
// pipe: a full pipe is -EAGAIN and the record is the caller's to drop).
Napi::Value FdWrite(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const int fd = static_cast<int>(ArgU32(info, 0, "fd"));
  if (!info[1].IsTypedArray()) throw Napi::TypeError::New(env, "bytes must be a Uint8Array");
  Napi::Uint8Array bytes = info[1].As<Napi::Uint8Array>();
  const int flags = fcntl(fd, F_GETFL);
  if (flags >= 0 && !(flags & O_NONBLOCK)) fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  ssize_t n = write(fd, bytes.Data(), bytes.ByteLength());
  return Napi::Number::New(env, n < 0 ? -errno : static_cast<double>(n));
}

// lockFile(path) -> fd: the file opened (created 0600) and locked with flock(LOCK_EX | LOCK_NB);
// EWOULDBLOCK when another process holds it. The lock lasts until the fd is closed (fdClose)
// or the process ends.
Napi::Value LockFile(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const std::string path = info[0].As<Napi::String>().Utf8Value();
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) ThrowSystemError(env, errno, "open");
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    int err = errno;
    close(fd);
    ThrowSystemError(env, err, "flock");
  }
  return Napi::Number::New(env, fd);
}

// fence(): a full memory barrier (atomic_thread_fence(seq_cst)), for the store-load orderings
// of the doorbell protocol that Atomics.store alone does not promise on memory it does not own.
Napi::Value Fence(const Napi::CallbackInfo& info) {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  return info.Env().Undefined();
}

// The sealed memfd of a ring or doorbell page: sized, then sealed against shrinking and
// growing (a program that could shrink it would make the device take SIGBUS), mapped here.
std::shared_ptr<Mapping> MapSealed(Napi::Env env, size_t size) {
  auto m = std::make_shared<Mapping>();
  m->size = size;
  m->fd = memfd_create("pagefault-rdma-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (m->fd < 0) ThrowSystemError(env, errno, "memfd_create");
  if (ftruncate(m->fd, static_cast<off_t>(size)) != 0) ThrowSystemError(env, errno, "ftruncate");
  if (fcntl(m->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) ThrowSystemError(env, errno, "fcntl(F_ADD_SEALS)");
  void* addr = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, m->fd, 0);
  if (addr == MAP_FAILED) ThrowSystemError(env, errno, "mmap");
  m->addr = static_cast<uint8_t*>(addr);
  return m;
}

// mapSealed(size) -> { id, address, buffer, pageSize, fd }: a region over a sealed memfd; fd is
// the region's own (valid until closeRegion), the one to send to a program.
Napi::Value MapSealedRegion(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const size_t size = ArgSize(info, 0, "size");
  if (size == 0 || size % PageSize() != 0) throw Napi::RangeError::New(env, "size must be a positive multiple of the page size");
  auto m = MapSealed(env, size);
  const int fd = m->fd;
  Napi::Object out = PublishMapping(env, std::move(m));
  out.Set("fd", Napi::Number::New(env, fd));
  return out;
}

// A doorbell: an eventfd the program writes when it produced into a sleeping device's rings
// (docs/device-abi.md §3), watched with uv_poll on the JS thread. On each wake-up the counter
// is read (reset) and the callback runs once. The fd stays the caller's: unwatch before closing it.
struct Doorbell {
  uint32_t handle = 0;
  int fd = -1;
  uv_poll_t* poll = nullptr;
  Napi::FunctionReference onRing;
  std::unique_ptr<Napi::AsyncContext> async;
};

std::unordered_map<uint32_t, Doorbell*> g_doorbells;
uint32_t g_next_doorbell = 1;

void OnDoorbell(uv_poll_t* h, int status, int events) {
  Doorbell* d = static_cast<Doorbell*>(h->data);
  uint64_t count = 0;
  while (read(d->fd, &count, sizeof(count)) < 0 && errno == EINTR) {
  }
  Napi::Env env = d->onRing.Env();
  Napi::HandleScope scope(env);
  try {
    d->onRing.MakeCallback(env.Global(), {Napi::Number::New(env, status < 0 ? status : 0)}, *d->async);
  } catch (const Napi::Error& e) {
    napi_fatal_exception(env, e.Value());
  }
}

// eventfdWatch(fd, onRing) -> handle: onRing(status) after each wake-up of the eventfd.
Napi::Value EventfdWatch(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const int fd = static_cast<int>(ArgU32(info, 0, "fd"));
  if (!info[1].IsFunction()) throw Napi::TypeError::New(env, "onRing must be a function");
  uv_loop_t* loop = nullptr;
  if (napi_get_uv_event_loop(env, &loop) != napi_ok || loop == nullptr) throw Napi::Error::New(env, "no event loop for this environment");
  const int flags = fcntl(fd, F_GETFL);
  if (flags >= 0 && !(flags & O_NONBLOCK)) fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  auto* d = new Doorbell();
  d->fd = fd;
  d->onRing = Napi::Persistent(info[1].As<Napi::Function>());
  d->async = std::make_unique<Napi::AsyncContext>(env, "pagefault-rdma:doorbell");
  d->poll = new uv_poll_t();
  int err = uv_poll_init(loop, d->poll, fd);
  if (err != 0) {
    delete d->poll;
    delete d;
    ThrowSystemError(env, -err, "uv_poll_init");
  }
  d->poll->data = d;
  d->handle = g_next_doorbell++;
  g_doorbells[d->handle] = d;
  uv_poll_start(d->poll, UV_READABLE, OnDoorbell);
  return Napi::Number::New(env, d->handle);
}

// eventfdUnwatch(handle): stop watching (idempotent); the fd is not closed.
Napi::Value EventfdUnwatch(const Napi::CallbackInfo& info) {
  auto it = g_doorbells.find(ArgU32(info, 0, "handle"));
  if (it != g_doorbells.end()) {
    Doorbell* d = it->second;
    g_doorbells.erase(it);
    uv_poll_stop(d->poll);
    uv_close(reinterpret_cast<uv_handle_t*>(d->poll), [](uv_handle_t* h) { delete reinterpret_cast<uv_poll_t*>(h); });
    delete d;
  }
  return info.Env().Undefined();
}

}  // namespace

void InitSeqpacket(Napi::Env env, Napi::Object exports) {
  exports.Set("seqpacketListen", Napi::Function::New(env, Listen, "seqpacketListen"));
  exports.Set("seqpacketConnect", Napi::Function::New(env, Connect, "seqpacketConnect"));
  exports.Set("seqpacketAdopt", Napi::Function::New(env, Adopt, "seqpacketAdopt"));
  exports.Set("seqpacketSend", Napi::Function::New(env, Send, "seqpacketSend"));
  exports.Set("seqpacketClose", Napi::Function::New(env, CloseSocket, "seqpacketClose"));
  exports.Set("fdClose", Napi::Function::New(env, FdClose, "fdClose"));
  exports.Set("fdKind", Napi::Function::New(env, FdKind, "fdKind"));
  exports.Set("fdWrite", Napi::Function::New(env, FdWrite, "fdWrite"));
  exports.Set("lockFile", Napi::Function::New(env, LockFile, "lockFile"));
  exports.Set("fence", Napi::Function::New(env, Fence, "fence"));
  exports.Set("eventfdWatch", Napi::Function::New(env, EventfdWatch, "eventfdWatch"));
  exports.Set("eventfdUnwatch", Napi::Function::New(env, EventfdUnwatch, "eventfdUnwatch"));
  exports.Set("mapSealed", Napi::Function::New(env, MapSealedRegion, "mapSealed"));
}

}  // namespace pfr
