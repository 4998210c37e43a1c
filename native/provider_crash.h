// A crash inside libfabric, said so. Its providers parse what peers send, and libfabric 1.17's
// tcp provider dereferences NULL on some messages a peer can send before any hello (a tagged
// message to an endpoint with no shared receive context, an ACK for no send): nothing inside
// the process can refuse them first (README, "Security"). The process still dies of the
// signal, as before; first a line on stderr says that it was libfabric, on a peer's message.
#pragma once

namespace pfr {

// Watch SIGSEGV, SIGBUS, SIGILL and SIGFPE for faults whose instruction lies in the shared
// object that holds `symbol` (libfabric.so.1). Once; each signal then goes on to the handler
// that was there before (Node's, V8's), or the default action.
void NoteProviderCrashes(const void* symbol);

}  // namespace pfr
