// Bare connections on a listening port (see bare_sockets.h). Found without taking any socket's
// lock: getsockname, SIOCINQ and TCP_INFO all lock the socket, and a socket whose lock another
// thread holds (a provider thread copying a message into a page that is faulting, blocked until
// this very thread resolves the fault: stall mode's RMA connection) would block this thread in
// the kernel for as long. So the port's established connections come from /proc/net/tcp, their
// descriptors from /proc/self/fd's links, and only those (the listener's own, progressed on
// this thread alone) are asked how much they received.
#include "bare_sockets.h"

#include <dirent.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unordered_set>
#include <vector>

namespace pfr {

namespace {

// The inodes of the established TCP (IPv4) connections whose local port is `port`.
std::unordered_set<ino_t> EstablishedOn(uint16_t port) {
  std::unordered_set<ino_t> out;
  FILE* f = fopen("/proc/net/tcp", "r");
  if (!f) return out;
  char line[512];
  if (!fgets(line, sizeof line, f)) {  // the header
    fclose(f);
    return out;
  }
  while (fgets(line, sizeof line, f)) {
    unsigned local_port = 0, state = 0;
    unsigned long inode = 0;
    // "sl: local_addr:port rem_addr:port st tx:rx tr:when retrnsmt uid timeout inode"
    if (sscanf(line, " %*u: %*8x:%x %*8x:%*x %x %*x:%*x %*x:%*x %*x %*u %*u %lu", &local_port, &state, &inode) != 3) continue;
    if (local_port == port && state == 1 /* TCP_ESTABLISHED */ && inode) out.insert(static_cast<ino_t>(inode));
  }
  fclose(f);
  return out;
}

// The socket inode a descriptor of this process stands for (0 if it is no socket).
ino_t SocketInode(int dirFd, const char* name) {
  char link[64];
  ssize_t n = readlinkat(dirFd, name, link, sizeof link - 1);
  if (n <= 0) return 0;
  link[n] = 0;
  unsigned long inode = 0;
  return sscanf(link, "socket:[%lu]", &inode) == 1 ? static_cast<ino_t>(inode) : 0;
}

// An established connection that has received nothing at all (TCP_INFO's byte count, Linux 4.1+).
bool ReceivedNothing(int fd) {
  tcp_info ti{};
  socklen_t len = sizeof ti;
  if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0) return false;
  if (len < offsetof(tcp_info, tcpi_bytes_received) + sizeof ti.tcpi_bytes_received) return false;
  return ti.tcpi_bytes_received == 0;
}

}  // namespace

size_t ReapBareSockets(uint16_t port, BareSockets& bare, uint64_t nowNs, uint64_t maxAgeNs, size_t keep) {
  std::unordered_set<ino_t> onPort = EstablishedOn(port);
  if (onPort.empty()) {
    bare.seen.clear();
    return 0;
  }
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return 0;
  struct Found {
    int fd;
    uint64_t sinceNs;
  };
  std::vector<Found> found;
  std::unordered_set<int> present;
  int self = dirfd(dir);
  while (dirent* d = readdir(dir)) {
    if (d->d_name[0] < '0' || d->d_name[0] > '9') continue;
    int fd = atoi(d->d_name);
    ino_t inode = fd == self ? 0 : SocketInode(self, d->d_name);
    if (!inode || !onPort.count(inode) || !ReceivedNothing(fd)) continue;
    auto it = bare.seen.find(fd);
    if (it == bare.seen.end() || it->second.inode != inode) it = bare.seen.insert_or_assign(fd, BareSockets::Seen{inode, nowNs}).first;
    present.insert(fd);
    found.push_back({fd, it->second.sinceNs});
  }
  closedir(dir);
  for (auto it = bare.seen.begin(); it != bare.seen.end();) it = present.count(it->first) ? std::next(it) : bare.seen.erase(it);
  // Oldest first: past `keep`, the oldest go whatever their age.
  std::sort(found.begin(), found.end(), [](const Found& a, const Found& b) { return a.sinceNs < b.sinceNs; });
  size_t reaped = 0;
  for (size_t i = 0; i < found.size(); i++) {
    bool over = found.size() - i > keep;
    if (!over && nowNs - found[i].sinceNs < maxAgeNs) continue;
    shutdown(found[i].fd, SHUT_RDWR);
    bare.seen.erase(found[i].fd);
    reaped++;
  }
  return reaped;
}

}  // namespace pfr
