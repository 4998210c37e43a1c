// TCP connections a listener's provider accepted that never sent a byte. libfabric 1.17's tcp
// provider accepts every TCP connection on a passive endpoint's port and waits, with no timer,
// for its connection request: a connection that sends nothing stays open for ever, a
// descriptor of this process each, and the application is never told (it sees a connection
// only once its request arrived). These are found among the process's own descriptors (IPv4:
// the transport's addresses are FI_SOCKADDR_IN) and shut down (not closed: the fd is the
// provider's), which wakes the provider, which reads the end of the stream and closes it itself.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <unordered_map>

namespace pfr {

// The bare connections of one listening port seen so far: fd -> when first seen (and its
// inode, so that a number reused by another socket starts afresh).
struct BareSockets {
  struct Seen {
    ino_t inode;
    uint64_t sinceNs;
  };
  std::unordered_map<int, Seen> seen;
};

// Shut down the connections on local `port` that have received no byte and are older than
// `maxAgeNs`, and the oldest beyond `keep`; returns how many. A connection that has received
// a byte is the provider's business (its request arrived, or a partial one it refuses).
size_t ReapBareSockets(uint16_t port, BareSockets& bare, uint64_t nowNs, uint64_t maxAgeNs, size_t keep);

}  // namespace pfr
