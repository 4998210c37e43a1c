// Remote paging's Redis client (lib/remote-paging/redis-store.ts): hiredis, synchronous with a
// timeout, on the DM-Handler's own thread. That thread never touches a missing page of the
// region it serves, so it never waits on a fault of its own; a fetch is then one write and one
// read of the server's socket with no event-loop turn in between, as the C reference does
// (bench/c/remote-handler.c), and its pages are checked here (CRC-32C over bytes and trailer)
// and laid out in one buffer: no JavaScript object per page. A cluster's nodes are fetched from
// in one call: every node's commands go out before any reply is read, so the shards work at once.
// Built only when hiredis's headers are there (binding.gyp: pkg-config hiredis); the library is
// dlopen'ed at the first connect under the soname of those headers, so a prebuilt addon still
// loads where hiredis is missing, and only the Redis store says what to install.
#include <dlfcn.h>
#include <hiredis/hiredis.h>
#include <poll.h>
#include <sys/time.h>

#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

#include "common.h"

namespace pfr {

namespace {

#define PFR_STR2(x) #x
#define PFR_STR(x) PFR_STR2(x)
constexpr const char* kSoname = "libhiredis.so." PFR_STR(HIREDIS_SONAME);

struct HiredisApi {
  decltype(&::redisConnectUnixWithTimeout) connectUnix;
  decltype(&::redisConnectWithTimeout) connectTcp;
  decltype(&::redisReconnect) reconnect;
  decltype(&::redisSetTimeout) setTimeout;
  decltype(&::redisFree) free;
  decltype(&::redisAppendCommandArgv) append;
  decltype(&::redisBufferWrite) write;
  decltype(&::redisGetReply) getReply;
  decltype(&::freeReplyObject) freeReply;
};
HiredisApi hr{};

void LoadHiredis(Napi::Env env) {
  static std::once_flag once;
  static std::string failed;
  std::call_once(once, [] {
    void* h = dlopen(kSoname, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      failed = dlerror();
      return;
    }
    hr.connectUnix = reinterpret_cast<decltype(hr.connectUnix)>(dlsym(h, "redisConnectUnixWithTimeout"));
    hr.connectTcp = reinterpret_cast<decltype(hr.connectTcp)>(dlsym(h, "redisConnectWithTimeout"));
    hr.reconnect = reinterpret_cast<decltype(hr.reconnect)>(dlsym(h, "redisReconnect"));
    hr.setTimeout = reinterpret_cast<decltype(hr.setTimeout)>(dlsym(h, "redisSetTimeout"));
    hr.free = reinterpret_cast<decltype(hr.free)>(dlsym(h, "redisFree"));
    hr.append = reinterpret_cast<decltype(hr.append)>(dlsym(h, "redisAppendCommandArgv"));
    hr.write = reinterpret_cast<decltype(hr.write)>(dlsym(h, "redisBufferWrite"));
    hr.getReply = reinterpret_cast<decltype(hr.getReply)>(dlsym(h, "redisGetReply"));
    hr.freeReply = reinterpret_cast<decltype(hr.freeReply)>(dlsym(h, "freeReplyObject"));
    if (!hr.connectUnix || !hr.connectTcp || !hr.reconnect || !hr.setTimeout || !hr.free || !hr.append || !hr.write ||
        !hr.getReply || !hr.freeReply)
      failed = std::string(kSoname) + " lacks a function this addon was built against";
  });
  if (!failed.empty()) {
    Napi::Error e = Napi::Error::New(env, "hiredis could not be loaded (" + failed + "): install it (Debian/Ubuntu: apt-get install libhiredis-dev) and rebuild");
    e.Set("code", Napi::String::New(env, "ERR_HIREDIS_MISSING"));
    throw e;
  }
}

struct Reply {
  redisReply* r = nullptr;
  ~Reply() {
    if (r) hr.freeReply(r);
  }
};

struct Conn {
  redisContext* c = nullptr;
  uint32_t timeout_ms = 0;
  ~Conn() {
    if (c) hr.free(c);
  }
};

std::mutex conns_mu;
std::unordered_map<uint32_t, std::shared_ptr<Conn>> conns;
uint32_t next_conn = 1;

std::shared_ptr<Conn> FindConn(Napi::Env env, uint32_t id) {
  std::lock_guard<std::mutex> lock(conns_mu);
  auto it = conns.find(id);
  if (it == conns.end()) throw Napi::TypeError::New(env, "redis: unknown or closed connection");
  return it->second;
}

timeval Tv(uint32_t ms) { return timeval{static_cast<time_t>(ms / 1000), static_cast<suseconds_t>((ms % 1000) * 1000)}; }

// Ready to send: reconnected if the last request broke the connection (a timeout leaves a
// reply in flight that would answer the next request), with this request's timeout. Empty, or why not.
std::string Ready(Conn& k, uint32_t timeout_ms) {
  // An idle connection with something to read was closed by the server (a restart): start over.
  pollfd p{k.c->fd, POLLIN | POLLRDHUP, 0};
  if (!k.c->err && poll(&p, 1, 0) > 0) k.c->err = REDIS_ERR_EOF;
  if (k.c->err) {
    if (hr.reconnect(k.c) != REDIS_OK) return std::string("reconnect failed: ") + k.c->errstr;
    k.timeout_ms = 0;
  }
  if (k.timeout_ms != timeout_ms) {
    if (hr.setTimeout(k.c, Tv(timeout_ms)) != REDIS_OK) return std::string("setting the timeout failed: ") + k.c->errstr;
    k.timeout_ms = timeout_ms;
  }
  return {};
}

// Why the connection failed, in words (a read that ran out of time says so).
std::string IoError(const Conn& k) {
  if (k.c->err == REDIS_ERR_IO && (errno == EAGAIN || errno == EWOULDBLOCK)) return "timed out after " + std::to_string(k.timeout_ms) + " ms";
  if (k.c->err == REDIS_ERR_EOF) return "the server closed the connection";
  return k.c->errstr;
}

// Send everything appended so far; false on an I/O error.
bool Flush(Conn& k) {
  int done = 0;
  while (!done)
    if (hr.write(k.c, &done) != REDIS_OK) return false;
  return true;
}

// Redis Cluster's key slot: CRC16 (XMODEM) of the key's hash tag, or of the whole key.
uint16_t Crc16(const char* p, size_t n) {
  uint16_t crc = 0;
  while (n--) {
    crc ^= static_cast<uint16_t>(static_cast<uint8_t>(*p++)) << 8;
    for (int i = 0; i < 8; i++) crc = (crc & 0x8000) ? static_cast<uint16_t>((crc << 1) ^ 0x1021) : static_cast<uint16_t>(crc << 1);
  }
  return crc;
}
uint16_t KeySlot(const char* k, size_t n) {
  const char* open = static_cast<const char*>(memchr(k, '{', n));
  if (open) {
    const char* close = static_cast<const char*>(memchr(open + 1, '}', n - (open + 1 - k)));
    if (close && close > open + 1) return Crc16(open + 1, static_cast<size_t>(close - open - 1)) & 16383;
  }
  return Crc16(k, n) & 16383;
}

// The nodes of a request: node i's connection handle (-1: known down, not asked), and the
// slot -> node table of a cluster (empty: one server, node 0).
struct Route {
  std::vector<std::shared_ptr<Conn>> nodes;
  const int32_t* slot_node = nullptr;
  size_t slots = 0;
  int NodeOf(const char* key, size_t n) const { return slots ? slot_node[KeySlot(key, n)] : 0; }
};

Route ReadRoute(Napi::Env env, const Napi::Value& handles, const Napi::Value& slot_node) {
  Route r;
  auto h = handles.As<Napi::Int32Array>();
  for (size_t i = 0; i < h.ElementLength(); i++) r.nodes.push_back(h[i] < 0 ? nullptr : FindConn(env, static_cast<uint32_t>(h[i])));
  auto s = slot_node.As<Napi::Int32Array>();
  if (s.ElementLength() != 0 && s.ElementLength() != 16384) throw Napi::RangeError::New(env, "redis: the slot table must have 16384 entries");
  r.slot_node = s.Data();
  r.slots = s.ElementLength();
  return r;
}

// A reply as JavaScript: bulk strings as Buffers, arrays as arrays; an error reply throws.
Napi::Value ToJs(Napi::Env env, const redisReply* r) {
  switch (r->type) {
    case REDIS_REPLY_STRING:
      return Napi::Buffer<char>::Copy(env, r->str, r->len);
    case REDIS_REPLY_STATUS:
      return Napi::String::New(env, r->str, r->len);
    case REDIS_REPLY_INTEGER:
      return Napi::Number::New(env, static_cast<double>(r->integer));
    case REDIS_REPLY_ARRAY: {
      Napi::Array a = Napi::Array::New(env, r->elements);
      for (size_t i = 0; i < r->elements; i++) a.Set(static_cast<uint32_t>(i), ToJs(env, r->element[i]));
      return a;
    }
    case REDIS_REPLY_ERROR: {
      Napi::Error e = Napi::Error::New(env, std::string(r->str, r->len));
      e.Set("code", Napi::String::New(env, "ERR_REDIS_REPLY"));
      throw e;
    }
    default:
      return env.Null();
  }
}

Napi::Error ConnError(Napi::Env env, const std::string& message) {
  Napi::Error e = Napi::Error::New(env, message);
  e.Set("code", Napi::String::New(env, "ERR_REDIS_IO"));
  return e;
}

// redisConnect(path, host, port, timeoutMs) -> handle. A failed connect throws a system error
// (code ENOENT, ECONNREFUSED, EACCES…) where the socket said why.
Napi::Value RedisConnect(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  LoadHiredis(env);
  std::string path = info[0].As<Napi::String>();
  std::string host = info[1].As<Napi::String>();
  int port = info[2].As<Napi::Number>().Int32Value();
  uint32_t timeout_ms = ArgU32(info, 3, "timeoutMs");
  errno = 0;
  redisContext* c = path.empty() ? hr.connectTcp(host.c_str(), port, Tv(timeout_ms)) : hr.connectUnix(path.c_str(), Tv(timeout_ms));
  int err = errno;
  if (!c) throw ConnError(env, "redis: out of memory");
  auto k = std::make_shared<Conn>();
  k->c = c;
  if (c->err) {
    if (c->err == REDIS_ERR_IO && err) ThrowSystemError(env, err, "connect");
    throw ConnError(env, c->errstr);
  }
  std::lock_guard<std::mutex> lock(conns_mu);
  uint32_t id = next_conn++;
  conns[id] = std::move(k);
  return Napi::Number::New(env, id);
}

Napi::Value RedisClose(const Napi::CallbackInfo& info) {
  std::lock_guard<std::mutex> lock(conns_mu);
  conns.erase(ArgU32(info, 0, "handle"));
  return info.Env().Undefined();
}

// redisCommand(handle, args, timeoutMs) -> the reply. An error reply throws ERR_REDIS_REPLY,
// a connection that failed ERR_REDIS_IO (the next request reconnects).
Napi::Value RedisCommand(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  auto k = FindConn(env, ArgU32(info, 0, "handle"));
  auto args = info[1].As<Napi::Array>();
  uint32_t timeout_ms = ArgU32(info, 2, "timeoutMs");
  std::vector<std::string> owned(args.Length());
  std::vector<const char*> argv(args.Length());
  std::vector<size_t> lens(args.Length());
  for (uint32_t i = 0; i < args.Length(); i++) {
    Napi::Value a = args[i];
    if (a.IsBuffer()) {
      auto b = a.As<Napi::Buffer<char>>();
      owned[i].assign(b.Data(), b.Length());
    } else {
      owned[i] = a.As<Napi::String>().Utf8Value();
    }
    argv[i] = owned[i].data();
    lens[i] = owned[i].size();
  }
  std::string why = Ready(*k, timeout_ms);
  if (!why.empty()) throw ConnError(env, why);
  Reply r;
  if (hr.append(k->c, static_cast<int>(argv.size()), argv.data(), lens.data()) != REDIS_OK || !Flush(*k) ||
      hr.getReply(k->c, reinterpret_cast<void**>(&r.r)) != REDIS_OK)
    throw ConnError(env, IoError(*k));
  return ToJs(env, r.r);
}

// Statuses of redisFetch, per page (ReadStatus in lib/remote-paging/store.ts).
enum Status : int32_t { kOk = 0, kLost = 1, kLength = 2, kChecksum = 3, kAddress = 4, kVersion = 5, kRefused = 6, kUnreachable = 7, kDown = 8, kShape = 9 };
constexpr size_t kTrailer = 24;
// Pages per MGET: Redis writes a reply over 64 KiB in several turns of its event loop, and one
// MGET of 32 pages was measured at 3× two pipelined MGETs of 16 (226 against 78 µs, C + hiredis).
constexpr size_t kMgetPages = 16;

// Check a stored value against the page it must be (stored form: store.ts) and copy the page
// to `out`. detail: what the value said instead (length; stored and computed CRC; address; version).
int32_t CheckStored(const char* v, size_t len, uint64_t address, uint64_t version, uint32_t seed, size_t ps, uint8_t* out, uint32_t* crc,
                    double* detail) {
  uint32_t n = 0;
  if (len == ps + kTrailer) memcpy(&n, v + ps + 16, 4);
  if (len != ps + kTrailer || n != ps) {
    detail[0] = static_cast<double>(len);
    return kLength;
  }
  const auto* p = reinterpret_cast<const uint8_t*>(v);
  uint32_t page_crc = Crc32c(seed, p, ps);
  uint32_t sum = Crc32c(page_crc, p + ps, 20), stored;
  memcpy(&stored, p + ps + 20, 4);
  if (sum != stored) {
    detail[0] = stored;
    detail[1] = sum;
    return kChecksum;
  }
  uint64_t a, ver;
  memcpy(&a, p + ps, 8);
  memcpy(&ver, p + ps + 8, 8);
  if (a != address) {
    detail[0] = static_cast<double>(a);
    return kAddress;
  }
  if (ver != version) {
    detail[0] = static_cast<double>(ver);
    return kVersion;
  }
  memcpy(out, p, ps);
  *crc = page_crc;
  return kOk;
}

// The key of the page at `address`: PREFIX:ADDR, or in a cluster PREFIX:{RUN}:ADDR, whose hash
// tag (the run: address >> tagShift) puts a run of pages on one shard.
void PageKey(std::string& out, const std::string& prefix, uint32_t tag_shift, uint64_t address) {
  char buf[64];
  int n = tag_shift ? snprintf(buf, sizeof buf, ":{%llx}:%llx", static_cast<unsigned long long>(address >> tag_shift), static_cast<unsigned long long>(address))
                    : snprintf(buf, sizeof buf, ":%llx", static_cast<unsigned long long>(address));
  out.assign(prefix).append(buf, static_cast<size_t>(n));
}

// redisFetch(handles, slotNode, prefix, tagShift, addresses, versions, count, seed, pageSize,
//            out, status, crcs, detail, timeoutMs) -> undefined, or the messages of the pages
// that failed as a whole request (by page index: error reply, connection, shape of the reply).
// MGETs of at most kMgetPages per node (per hash slot in a cluster), all sent before any reply is read.
Napi::Value RedisFetch(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Route route = ReadRoute(env, info[0], info[1]);
  std::string prefix = info[2].As<Napi::String>();
  uint32_t tag_shift = ArgU32(info, 3, "tagShift");
  const double* addresses = info[4].As<Napi::Float64Array>().Data();
  const double* versions = info[5].As<Napi::Float64Array>().Data();
  size_t count = ArgSize(info, 6, "count");
  uint32_t seed = ArgU32(info, 7, "seed");
  size_t ps = ArgSize(info, 8, "pageSize");
  auto out = info[9].As<Napi::Buffer<uint8_t>>();
  auto status = info[10].As<Napi::Int32Array>();
  auto crcs = info[11].As<Napi::Uint32Array>();
  auto detail = info[12].As<Napi::Float64Array>();
  uint32_t timeout_ms = ArgU32(info, 13, "timeoutMs");
  if (info[4].As<Napi::Float64Array>().ElementLength() < count || info[5].As<Napi::Float64Array>().ElementLength() < count ||
      out.Length() < count * ps || status.ElementLength() < count || crcs.ElementLength() < count || detail.ElementLength() < 2 * count)
    throw Napi::RangeError::New(env, "redisFetch: an array is shorter than count");

  // Keys, and the MGET groups: one per node, or per (node, slot) in a cluster (MGET's keys must share a slot).
  struct Group {
    int node;
    int slot;
    std::vector<size_t> pages;
    bool sent = false;
  };
  std::vector<std::string> keys(count);
  std::vector<Group> groups;
  std::unordered_map<int, size_t> by_slot;
  for (size_t i = 0; i < count; i++) {
    PageKey(keys[i], prefix, tag_shift, static_cast<uint64_t>(addresses[i]));
    int slot = route.slots ? KeySlot(keys[i].data(), keys[i].size()) : 0;
    int node = route.slots ? route.slot_node[slot] : 0;
    auto it = by_slot.find(slot);  // (a slot decides its node)
    if (it == by_slot.end() || groups[it->second].pages.size() == kMgetPages) {
      by_slot[slot] = groups.size();
      it = by_slot.find(slot);
      groups.push_back({node, slot, {}});
    }
    groups[it->second].pages.push_back(i);
  }

  Napi::Array messages;
  bool failed = false;
  auto fail = [&](const Group& g, Status s, const std::string& why) {
    if (!failed) messages = Napi::Array::New(env, count), failed = true;
    for (size_t i : g.pages) {
      status[i] = s;
      if (!why.empty()) messages.Set(static_cast<uint32_t>(i), Napi::String::New(env, why));
    }
  };
  std::vector<std::string> node_error(route.nodes.size());
  // Send: append every group's MGET to its node, then flush each node once.
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  for (auto& g : groups) {
    if (g.node < 0 || static_cast<size_t>(g.node) >= route.nodes.size()) {
      fail(g, kUnreachable, "no node of the cluster serves hash slot " + std::to_string(g.slot));
      continue;
    }
    Conn* k = route.nodes[g.node].get();
    if (!k) {
      fail(g, kDown, "");
      continue;
    }
    std::string& why = node_error[g.node];
    if (why.empty()) why = Ready(*k, timeout_ms);
    if (!why.empty()) continue;
    argv.assign(1, "MGET");
    lens.assign(1, 4);
    for (size_t i : g.pages) argv.push_back(keys[i].data()), lens.push_back(keys[i].size());
    if (hr.append(k->c, static_cast<int>(argv.size()), argv.data(), lens.data()) != REDIS_OK) why = IoError(*k);
    g.sent = why.empty();
  }
  for (size_t n = 0; n < route.nodes.size(); n++)
    if (route.nodes[n] && node_error[n].empty() && !Flush(*route.nodes[n])) node_error[n] = IoError(*route.nodes[n]);
  // Receive, group by group in the order sent (each node answers its own in order).
  for (auto& g : groups) {
    if (g.node < 0 || static_cast<size_t>(g.node) >= route.nodes.size() || !route.nodes[g.node]) continue;
    std::string& why = node_error[g.node];
    Conn* k = route.nodes[g.node].get();
    Reply r;
    if (why.empty() && g.sent && hr.getReply(k->c, reinterpret_cast<void**>(&r.r)) != REDIS_OK) why = IoError(*k);
    if (!why.empty() || !g.sent) {
      fail(g, kUnreachable, why);
      continue;
    }
    if (r.r->type == REDIS_REPLY_ERROR) {
      fail(g, kRefused, std::string(r.r->str, r.r->len));
      continue;
    }
    if (r.r->type != REDIS_REPLY_ARRAY || r.r->elements != g.pages.size()) {
      const char* kind = r.r->type == REDIS_REPLY_INTEGER ? "number" : r.r->type == REDIS_REPLY_NIL ? "null" : r.r->type == REDIS_REPLY_STRING ? "string" : "status";
      std::string what = r.r->type == REDIS_REPLY_ARRAY ? std::to_string(r.r->elements) + " values" : kind;
      fail(g, kShape, what + " for " + std::to_string(g.pages.size()) + " pages");
      continue;
    }
    for (size_t j = 0; j < g.pages.size(); j++) {
      size_t i = g.pages[j];
      const redisReply* e = r.r->element[j];
      if (e->type == REDIS_REPLY_NIL) {
        status[i] = kLost;
      } else if (e->type != REDIS_REPLY_STRING) {
        status[i] = kLength;
        detail[2 * i] = 0;
      } else {
        status[i] = CheckStored(e->str, e->len, static_cast<uint64_t>(addresses[i]), static_cast<uint64_t>(versions[i]), seed, ps,
                                out.Data() + i * ps, &crcs[i], &detail[2 * i]);
      }
    }
  }
  return failed ? static_cast<Napi::Value>(messages) : env.Undefined();
}

// redisWrite(handles, slotNode, command, keys, values, timeoutMs) -> [sum of the integer
// replies, messages by key index or undefined ("down": its node's handle was -1), why each
// node whose connection failed did (by node index)]. One command per key (SET key value, or
// UNLINK key), pipelined: every node's commands go out before any reply is read.
Napi::Value RedisWrite(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Route route = ReadRoute(env, info[0], info[1]);
  std::string command = info[2].As<Napi::String>();
  auto keys = info[3].As<Napi::Array>();
  bool with_values = info[4].IsArray();
  Napi::Array values = with_values ? info[4].As<Napi::Array>() : Napi::Array();
  uint32_t timeout_ms = ArgU32(info, 5, "timeoutMs");
  uint32_t n = keys.Length();
  std::vector<std::string> ks(n);
  std::vector<int> node_of(n);
  std::vector<std::string> node_error(route.nodes.size());
  Napi::Array messages;
  bool failed = false;
  auto fail = [&](uint32_t i, const std::string& why) {
    if (!failed) messages = Napi::Array::New(env, n), failed = true;
    messages.Set(i, Napi::String::New(env, why));
  };
  for (uint32_t i = 0; i < n; i++) {
    ks[i] = keys.Get(i).As<Napi::String>().Utf8Value();
    int node = route.NodeOf(ks[i].data(), ks[i].size());
    node_of[i] = node < 0 || static_cast<size_t>(node) >= route.nodes.size() || !route.nodes[node] ? -1 : node;
    if (node_of[i] < 0) {
      fail(i, node < 0 ? "no node of the cluster serves this key's hash slot" : "down");
      continue;
    }
    Conn* k = route.nodes[node].get();
    std::string& why = node_error[node];
    if (why.empty()) why = Ready(*k, timeout_ms);
    if (!why.empty()) continue;
    const char* argv[3] = {command.data(), ks[i].data(), nullptr};
    size_t lens[3] = {command.size(), ks[i].size(), 0};
    if (with_values) {
      auto v = values.Get(i).As<Napi::Buffer<char>>();
      argv[2] = v.Data();
      lens[2] = v.Length();
    }
    if (hr.append(k->c, with_values ? 3 : 2, argv, lens) != REDIS_OK) why = IoError(*k);
  }
  for (size_t j = 0; j < route.nodes.size(); j++)
    if (route.nodes[j] && node_error[j].empty() && !Flush(*route.nodes[j])) node_error[j] = IoError(*route.nodes[j]);
  double sum = 0;
  for (uint32_t i = 0; i < n; i++) {
    if (node_of[i] < 0) continue;
    std::string& why = node_error[node_of[i]];
    Reply r;
    if (why.empty() && hr.getReply(route.nodes[node_of[i]]->c, reinterpret_cast<void**>(&r.r)) != REDIS_OK) why = IoError(*route.nodes[node_of[i]]);
    if (!why.empty()) fail(i, why);
    else if (r.r->type == REDIS_REPLY_ERROR) fail(i, std::string(r.r->str, r.r->len));
    else if (r.r->type == REDIS_REPLY_INTEGER) sum += static_cast<double>(r.r->integer);
  }
  Napi::Array unreachable = Napi::Array::New(env, node_error.size());
  for (size_t j = 0; j < node_error.size(); j++)
    if (!node_error[j].empty()) unreachable.Set(static_cast<uint32_t>(j), Napi::String::New(env, node_error[j]));
  Napi::Array result = Napi::Array::New(env, 3);
  result.Set(0u, Napi::Number::New(env, sum));
  result.Set(1u, failed ? static_cast<Napi::Value>(messages) : env.Undefined());
  result.Set(2u, unreachable);
  return result;
}

// redisKeySlot(key) -> the key's cluster hash slot (tests and routing checks).
Napi::Value RedisKeySlot(const Napi::CallbackInfo& info) {
  std::string k = info[0].As<Napi::String>();
  return Napi::Number::New(info.Env(), KeySlot(k.data(), k.size()));
}

}  // namespace

void InitRedis(Napi::Env env, Napi::Object exports) {
  exports.Set("redisConnect", Napi::Function::New(env, RedisConnect, "redisConnect"));
  exports.Set("redisClose", Napi::Function::New(env, RedisClose, "redisClose"));
  exports.Set("redisCommand", Napi::Function::New(env, RedisCommand, "redisCommand"));
  exports.Set("redisFetch", Napi::Function::New(env, RedisFetch, "redisFetch"));
  exports.Set("redisWrite", Napi::Function::New(env, RedisWrite, "redisWrite"));
  exports.Set("redisKeySlot", Napi::Function::New(env, RedisKeySlot, "redisKeySlot"));
}

}  // namespace pfr
