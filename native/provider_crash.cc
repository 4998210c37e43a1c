// Crashes inside libfabric, said so before the signal takes its course (see provider_crash.h).
#include "provider_crash.h"

#include <dlfcn.h>
#include <link.h>
#include <signal.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <mutex>

namespace pfr {

namespace {

constexpr int kSignals[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE};
struct sigaction g_previous[32];
// The library's mapped range: read by the handler, written once before it is installed.
uintptr_t g_start = 0;
uintptr_t g_end = 0;

constexpr char kMessage[] =
    "pagefault-rdma: libfabric crashed in its provider on a message a peer sent this process (libfabric 1.17's tcp provider cannot "
    "parse some messages a peer can send before any hello; README, \"Security\", says what a listener exposes and how to run one)\n";

uintptr_t FaultPc(void* context) {
  auto* uc = static_cast<ucontext_t*>(context);
#if defined(__x86_64__)
  return static_cast<uintptr_t>(uc->uc_mcontext.gregs[REG_RIP]);
#elif defined(__aarch64__)
  return static_cast<uintptr_t>(uc->uc_mcontext.pc);
#else
  (void)uc;
  return 0;
#endif
}

// Async-signal-safe: two loads, a write(2), then the previous disposition.
void OnCrash(int sig, siginfo_t* info, void* context) {
  uintptr_t pc = FaultPc(context);
  if (pc >= g_start && pc < g_end) {
    ssize_t ignored = write(STDERR_FILENO, kMessage, sizeof kMessage - 1);
    (void)ignored;
  }
  const struct sigaction& prev = g_previous[sig];
  if ((prev.sa_flags & SA_SIGINFO) && prev.sa_sigaction) return prev.sa_sigaction(sig, info, context);
  if (!(prev.sa_flags & SA_SIGINFO) && prev.sa_handler != SIG_DFL && prev.sa_handler != SIG_IGN) return prev.sa_handler(sig);
  // The default action: returning re-executes the instruction, which faults again and ends the
  // process by this signal, exactly as without this handler.
  signal(sig, SIG_DFL);
}

struct Range {
  uintptr_t base;
  uintptr_t start = UINTPTR_MAX;
  uintptr_t end = 0;
};

int FindRange(dl_phdr_info* info, size_t, void* data) {
  auto* r = static_cast<Range*>(data);
  if (info->dlpi_addr != r->base) return 0;
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_LOAD || !(ph.p_flags & PF_X)) continue;
    r->start = std::min<uintptr_t>(r->start, info->dlpi_addr + ph.p_vaddr);
    r->end = std::max<uintptr_t>(r->end, info->dlpi_addr + ph.p_vaddr + ph.p_memsz);
  }
  return 1;
}

}  // namespace

void NoteProviderCrashes(const void* symbol) {
  static std::once_flag once;
  std::call_once(once, [symbol] {
    Dl_info dl{};
    if (!symbol || !dladdr(symbol, &dl) || !dl.dli_fbase) return;
    Range r{reinterpret_cast<uintptr_t>(dl.dli_fbase)};
    dl_iterate_phdr(FindRange, &r);
    if (r.start >= r.end) return;
    g_start = r.start;
    g_end = r.end;
    for (int sig : kSignals) {
      struct sigaction sa {};
      sa.sa_sigaction = OnCrash;
      sigemptyset(&sa.sa_mask);
      sa.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
      sigaction(sig, &sa, &g_previous[sig]);
    }
  });
}

}  // namespace pfr
