// The SIGBUS handler shared by native threads that touch memory (see sigbus.h).
#include "sigbus.h"

#include <signal.h>

#include <mutex>

namespace pfr {

namespace {

struct sigaction g_previous;

// Runs on the faulting thread. Only async-signal-safe work: a TLS read (the guard's thread
// set its slot before the access, so the TLS block exists) and a siglongjmp.
void OnSigbus(int sig, siginfo_t* info, void* context) {
  SigbusGuard* guard = CurrentSigbusGuard();
  if (guard != nullptr) {
    guard->address = reinterpret_cast<uintptr_t>(info->si_addr);
    siglongjmp(guard->env, 1);
  }
  if (g_previous.sa_flags & SA_SIGINFO) {
    if (g_previous.sa_sigaction != nullptr) g_previous.sa_sigaction(sig, info, context);
    return;
  }
  if (g_previous.sa_handler == SIG_DFL || g_previous.sa_handler == SIG_IGN) {
    // Returning re-executes the access, which raises SIGBUS again, now with the default
    // action: the process ends by SIGBUS exactly as it would have without this handler.
    signal(SIGBUS, SIG_DFL);
    return;
  }
  g_previous.sa_handler(sig);
}

}  // namespace

SigbusGuard*& CurrentSigbusGuard() {
  static thread_local SigbusGuard* guard = nullptr;
  return guard;
}

void InstallSigbusHandler() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa {};
    sa.sa_sigaction = OnSigbus;
    sigemptyset(&sa.sa_mask);
    // NODEFER: siglongjmp(env, 0-mask) leaves SIGBUS unblocked, so the next one is caught too.
    sa.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
    sigaction(SIGBUS, &sa, &g_previous);
  });
}

}  // namespace pfr
