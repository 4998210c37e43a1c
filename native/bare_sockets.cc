// Bare connections on a listening port (see bare_sockets.h): found by walking /proc/self/fd.
#include "bare_sockets.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <unordered_set>
#include <vector>

namespace pfr {

namespace {

// The local port of a connected (not listening) TCP socket, or 0.
uint16_t ConnectedPort(int fd) {
  int listening = 0;
  socklen_t len = sizeof listening;
  if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 || listening) return 0;
  sockaddr_storage sa{};
  len = sizeof sa;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0) return 0;
  if (sa.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&sa)->sin_port);
  if (sa.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&sa)->sin6_port);
  return 0;
}

// An established connection that has received nothing at all (TCP_INFO's byte count, Linux 4.1+).
bool ReceivedNothing(int fd) {
  tcp_info ti{};
  socklen_t len = sizeof ti;
  if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0) return false;
  if (len < offsetof(tcp_info, tcpi_bytes_received) + sizeof ti.tcpi_bytes_received) return false;
  return ti.tcpi_state == 1 /* TCP_ESTABLISHED */ && ti.tcpi_bytes_received == 0;
}

}  // namespace

size_t ReapBareSockets(uint16_t port, BareSockets& bare, uint64_t nowNs, uint64_t maxAgeNs, size_t keep) {
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
    struct stat st {};
    if (fd == self || fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    if (ConnectedPort(fd) != port || !ReceivedNothing(fd)) continue;
    auto it = bare.seen.find(fd);
    if (it == bare.seen.end() || it->second.inode != st.st_ino) it = bare.seen.insert_or_assign(fd, BareSockets::Seen{st.st_ino, nowNs}).first;
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
