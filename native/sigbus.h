// SIGBUS on a native thread: an access the kernel refuses (a poisoned page, UFFDIO_POISON;
// a missing page of a userfaultfd opened with UFFD_FEATURE_SIGBUS; a hugetlb page that could
// not be allocated) raises SIGBUS on the accessing thread. Without a handler it kills Node.
// A native thread that touches memory on purpose (the toucher) arms a guard around the
// access; the handler jumps back to the guard, which reports the access as failed. A SIGBUS
// on any other thread goes to whatever handler was there before (by default: the process
// dies, as it would have without us; JavaScript cannot survive a failed load).
#pragma once

#include <setjmp.h>

#include <cstdint>

namespace pfr {

struct SigbusGuard {
  sigjmp_buf env;
  volatile uintptr_t address = 0;  // si_addr of the last SIGBUS caught
};

// The guard armed on this thread, or nullptr. Set it before the access and clear it after.
SigbusGuard*& CurrentSigbusGuard();

// Install the process-wide handler once (idempotent, thread-safe).
void InstallSigbusHandler();

}  // namespace pfr
