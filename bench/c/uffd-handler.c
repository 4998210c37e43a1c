// The C reference for bench/faults.ts: the same userfaultfd round trip the library does,
// with nothing but C in the way.
//
// A faulter thread reads one byte of every page of a fresh anonymous region, in order,
// timing each page with CLOCK_MONOTONIC. Every missing page is a genuine fault that the
// kernel hands to the handler, which answers it with one UFFDIO_COPY of the aligned group
// of `pagesPerFault` pages around it (touch-ahead).
//
// Two handler shapes:
//   direct  one handler thread blocks in poll()+read() on the uffd and copies (2 threads
//           per round trip: faulter, handler). The floor.
//   relay   a reader thread reads the uffd and passes each fault through a mutex queue and
//           an eventfd to a resolver thread blocked in epoll_wait(), which copies: the
//           shape of the addon's reader thread + thread-safe function + libuv loop (3
//           threads per round trip), without any JavaScript.
//   rate    the direct handler thread, pinned to one CPU, serving `faulters` threads pinned
//           to another, each reading its own slice of the region: how many faults one
//           handler thread resolves per second when it never waits for a faulter to run
//           (faultCopiedNs gives the rate).
//
// Usage: uffd-handler <pages> <pagesPerFault> [direct|relay|rate <faulters> <handlerCpu> <faulterCpu>]
// Output: one JSON object on stdout: pageNs (the faulter's ns per page), totalNs, and per
// fault the CLOCK_MONOTONIC times at which the uffd was read, the resolving thread took
// the fault up and UFFDIO_COPY returned (faultReadNs, faultHandledNs, faultCopiedNs),
// with faulterStartNs to place the pages on the same clock.
// Exit codes: 2 usage, 3 a system call failed, 4 a fault was not resolved in time, 5 the
// pages read back were wrong.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#ifndef UFFD_USER_MODE_ONLY
#define UFFD_USER_MODE_ONLY 1
#endif

enum { EXIT_USAGE = 2, EXIT_SYSCALL = 3, EXIT_TIMEOUT = 4, EXIT_VERIFY = 5 };

// Every wait has a deadline: a lost wake-up must end the run, not hang the benchmark.
#define WAIT_MS 10000
#define FILL 0xA7

static size_t page_size, pages, per_fault, region_len;
static uint8_t *region, *source;
static int uffd = -1, stop_fd = -1;
static int relay;

enum { MAX_FAULTERS = 64 };
static size_t n_faulters = 1;
static int handler_cpu = -1, faulter_cpu = -1;  // rate: where the threads pin themselves
static _Atomic pid_t faulter_tids[MAX_FAULTERS];  // set by each faulter before its first fault
static uint64_t *page_ns;                         // faulters: ns spent on each page
static uint64_t faulter_start, total_ns, checksum;  // the first faulter's start; the longest walk; all pages
static uint64_t faulter_sum[MAX_FAULTERS], faulter_begin[MAX_FAULTERS], faulter_ns[MAX_FAULTERS];
// handler: when each fault was read from the uffd, taken up by the resolving thread, copied
static uint64_t *fault_read, *fault_handled, *fault_copied;
static size_t faults, foreign_faults;

// relay: the queue between the reader and the resolver (one fault in flight at a time
// here, but sized for the worst case so the reader never blocks)
static pthread_mutex_t queue_mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t *queue_addr, *queue_read;
static size_t queue_head, queue_tail;
static int relay_fd = -1;

static void die(int code, const char *what, int err, const char *fix) {
  fprintf(stderr, "uffd-handler: %s failed: %s%s%s\n", what, strerror(err), fix ? ". " : "", fix ? fix : "");
  exit(code);
}

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static size_t parse_count(const char *s, const char *name, size_t max) {
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || *end || v == 0 || v > max) {
    fprintf(stderr, "uffd-handler: %s must be an integer in 1..%zu, got '%s'\n", name, max, s);
    exit(EXIT_USAGE);
  }
  return (size_t)v;
}

static int parse_cpu(const char *s, const char *name) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || *end || end == s || v < 0 || v >= CPU_SETSIZE) {
    fprintf(stderr, "uffd-handler: %s must be a CPU number in 0..%d, got '%s'\n", name, CPU_SETSIZE - 1, s);
    exit(EXIT_USAGE);
  }
  return (int)v;
}

static int open_uffd(void) {
  int fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
  // vm.unprivileged_userfaultfd=0: user-mode faults (all the faulter takes) are still ours.
  if (fd < 0 && errno == EPERM) fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY);
  if (fd < 0)
    die(EXIT_SYSCALL, "userfaultfd", errno,
        errno == ENOSYS ? "This kernel has no userfaultfd (CONFIG_USERFAULTFD)" : "Run as root or set sysctl vm.unprivileged_userfaultfd=1");
  struct uffdio_api api = {.api = UFFD_API, .features = UFFD_FEATURE_THREAD_ID};
  if (ioctl(fd, UFFDIO_API, &api) != 0) die(EXIT_SYSCALL, "ioctl(UFFDIO_API) with UFFD_FEATURE_THREAD_ID", errno, "Linux 4.14 or newer is needed");
  return fd;
}

// One UFFDIO_COPY of the group holding `addr`. EEXIST: someone resolved it first, which
// counts as success once the waiters are woken; EAGAIN: continue from what was copied.
static void resolve(uint64_t addr) {
  const uint64_t group = per_fault * page_size;
  uint64_t start = (addr - (uint64_t)(uintptr_t)region) / group * group;
  uint64_t len = start + group > region_len ? region_len - start : group;
  uint64_t done = 0;
  while (done < len) {
    struct uffdio_copy c = {
        .dst = (uint64_t)(uintptr_t)region + start + done,
        .src = (uint64_t)(uintptr_t)source + done,
        .len = len - done,
    };
    if (ioctl(uffd, UFFDIO_COPY, &c) == 0) return;
    int err = errno;
    if (c.copy > 0) {
      done += (uint64_t)c.copy;
    } else if (err == EEXIST) {
      struct uffdio_range r = {.start = (uint64_t)(uintptr_t)region + start, .len = len};
      if (ioctl(uffd, UFFDIO_WAKE, &r) != 0) die(EXIT_SYSCALL, "ioctl(UFFDIO_WAKE)", errno, NULL);
      return;
    } else if (err != EAGAIN) {
      die(EXIT_SYSCALL, "ioctl(UFFDIO_COPY)", err, NULL);
    }
  }
}

static void note_fault(const struct uffd_msg *m) {
  for (size_t k = 0; k < n_faulters; k++)
    if (m->arg.pagefault.feat.ptid == (uint32_t)atomic_load(&faulter_tids[k])) return;
  foreign_faults++;
}

static void pin_self(int cpu) {
  if (cpu < 0) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  int err = pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
  if (err != 0) die(EXIT_SYSCALL, "pthread_setaffinity_np", err, "Pick CPUs this process may run on");
}

// Waits for the uffd (or the stop eventfd); returns the messages read, 0 when stopped.
static size_t read_faults(struct uffd_msg *msgs, size_t max) {
  struct pollfd pfd[2] = {{uffd, POLLIN, 0}, {stop_fd, POLLIN, 0}};
  for (;;) {
    int n = poll(pfd, 2, WAIT_MS);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) die(EXIT_SYSCALL, "poll(userfaultfd)", errno, NULL);
    if (n == 0) {
      fprintf(stderr, "uffd-handler: no fault and no stop for %d ms: the faulter is stuck\n", WAIT_MS);
      exit(EXIT_TIMEOUT);
    }
    if (pfd[1].revents) return 0;
    ssize_t got = read(uffd, msgs, max * sizeof(*msgs));
    if (got < 0 && errno == EAGAIN) continue;  // another reader won (never here) or spurious
    if (got < 0) die(EXIT_SYSCALL, "read(userfaultfd)", errno, NULL);
    return (size_t)got / sizeof(*msgs);
  }
}

static void *direct_handler(void *arg) {
  (void)arg;
  pin_self(handler_cpu);
  struct uffd_msg msgs[64];
  size_t n;
  while ((n = read_faults(msgs, 64)) > 0) {
    uint64_t t = now_ns();
    for (size_t i = 0; i < n; i++) {
      if (msgs[i].event != UFFD_EVENT_PAGEFAULT) continue;
      note_fault(&msgs[i]);
      resolve(msgs[i].arg.pagefault.address);
      if (faults < pages) {
        fault_read[faults] = fault_handled[faults] = t;
        fault_copied[faults] = now_ns();
      }
      faults++;
    }
  }
  return NULL;
}

static void *relay_reader(void *arg) {
  (void)arg;
  struct uffd_msg msgs[64];
  size_t n;
  while ((n = read_faults(msgs, 64)) > 0) {
    uint64_t t = now_ns();
    pthread_mutex_lock(&queue_mu);
    for (size_t i = 0; i < n; i++) {
      if (msgs[i].event != UFFD_EVENT_PAGEFAULT || queue_tail >= pages) continue;
      note_fault(&msgs[i]);
      queue_addr[queue_tail] = msgs[i].arg.pagefault.address;
      queue_read[queue_tail++] = t;
    }
    pthread_mutex_unlock(&queue_mu);
    uint64_t one = 1;
    if (write(relay_fd, &one, sizeof(one)) != sizeof(one)) die(EXIT_SYSCALL, "write(eventfd)", errno, NULL);
  }
  return NULL;
}

static void *relay_resolver(void *arg) {
  (void)arg;
  int ep = epoll_create1(EPOLL_CLOEXEC);
  if (ep < 0) die(EXIT_SYSCALL, "epoll_create1", errno, NULL);
  struct epoll_event ev = {.events = EPOLLIN, .data.fd = relay_fd}, out[2];
  if (epoll_ctl(ep, EPOLL_CTL_ADD, relay_fd, &ev) != 0) die(EXIT_SYSCALL, "epoll_ctl", errno, NULL);
  ev.data.fd = stop_fd;
  if (epoll_ctl(ep, EPOLL_CTL_ADD, stop_fd, &ev) != 0) die(EXIT_SYSCALL, "epoll_ctl", errno, NULL);
  for (;;) {
    int n = epoll_wait(ep, out, 2, WAIT_MS);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) die(EXIT_SYSCALL, "epoll_wait", errno, NULL);
    if (n == 0) {
      fprintf(stderr, "uffd-handler: resolver idle for %d ms: the faulter is stuck\n", WAIT_MS);
      exit(EXIT_TIMEOUT);
    }
    for (int i = 0; i < n; i++)
      if (out[i].data.fd == stop_fd) goto done;
    uint64_t count;
    if (read(relay_fd, &count, sizeof(count)) < 0 && errno != EAGAIN) die(EXIT_SYSCALL, "read(eventfd)", errno, NULL);
    for (;;) {
      pthread_mutex_lock(&queue_mu);
      int empty = queue_head == queue_tail;
      uint64_t addr = empty ? 0 : queue_addr[queue_head];
      uint64_t read_at = empty ? 0 : queue_read[queue_head];
      if (!empty) queue_head++;
      pthread_mutex_unlock(&queue_mu);
      if (empty) break;
      uint64_t handled_at = now_ns();
      resolve(addr);
      fault_read[faults] = read_at;
      fault_handled[faults] = handled_at;
      fault_copied[faults++] = now_ns();
    }
  }
done:
  close(ep);
  return NULL;
}

// Faulter k of n_faulters reads its slice of the region (the last takes the remainder).
static void *faulter(void *arg) {
  size_t k = (size_t)(uintptr_t)arg, slice = pages / n_faulters;
  size_t first = k * slice, end = k + 1 == n_faulters ? pages : first + slice;
  pin_self(faulter_cpu);
  faulter_tids[k] = (pid_t)syscall(SYS_gettid);
  uint64_t sum = 0;
  uint64_t start = now_ns(), last = start;
  for (size_t p = first; p < end; p++) {
    sum += *(volatile uint8_t *)(region + p * page_size);
    uint64_t t = now_ns();
    page_ns[p] = t - last;
    last = t;
  }
  faulter_begin[k] = start;
  faulter_ns[k] = last - start;
  faulter_sum[k] = sum;
  return NULL;
}

static void print_json(void) {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  sched_getaffinity(0, sizeof(allowed), &allowed);  // lets the caller check its placement
  // Large arrays, so one buffered stream; the caller parses it with JSON.parse.
  printf("{\"handler\":\"%s\",\"faulters\":%zu,\"pages\":%zu,\"pagesPerFault\":%zu,\"pageSize\":%zu,", relay ? "relay" : handler_cpu >= 0 ? "rate" : "direct", n_faulters,
         pages, per_fault, page_size);
  printf("\"cpusAllowed\":%d,\"faults\":%zu,\"foreignFaults\":%zu,\"checksum\":%llu,\"totalNs\":%llu,\"faulterStartNs\":%llu,", CPU_COUNT(&allowed), faults, foreign_faults,
         (unsigned long long)checksum, (unsigned long long)total_ns, (unsigned long long)faulter_start);
  printf("\"pageNs\":[");
  for (size_t i = 0; i < pages; i++) printf(i ? ",%llu" : "%llu", (unsigned long long)page_ns[i]);
  printf("],\"faultReadNs\":[");
  for (size_t i = 0; i < faults && i < pages; i++) printf(i ? ",%llu" : "%llu", (unsigned long long)fault_read[i]);
  printf("],\"faultHandledNs\":[");
  for (size_t i = 0; i < faults && i < pages; i++) printf(i ? ",%llu" : "%llu", (unsigned long long)fault_handled[i]);
  printf("],\"faultCopiedNs\":[");
  for (size_t i = 0; i < faults && i < pages; i++) printf(i ? ",%llu" : "%llu", (unsigned long long)fault_copied[i]);
  printf("]}\n");
}

int main(int argc, char **argv) {
  const char *mode = argc > 3 ? argv[3] : "direct";
  int rate = strcmp(mode, "rate") == 0;
  if (argc < 3 || (rate ? argc != 7 : argc > 4 || (strcmp(mode, "direct") != 0 && strcmp(mode, "relay") != 0))) {
    fprintf(stderr, "usage: %s <pages> <pagesPerFault> [direct|relay|rate <faulters> <handlerCpu> <faulterCpu>]\n", argv[0]);
    return EXIT_USAGE;
  }
  page_size = (size_t)sysconf(_SC_PAGESIZE);
  pages = parse_count(argv[1], "pages", (size_t)1 << 24);
  per_fault = parse_count(argv[2], "pagesPerFault", pages);
  relay = strcmp(mode, "relay") == 0;
  if (rate) {
    n_faulters = parse_count(argv[4], "faulters", MAX_FAULTERS < pages ? MAX_FAULTERS : pages);
    handler_cpu = parse_cpu(argv[5], "handlerCpu");
    faulter_cpu = parse_cpu(argv[6], "faulterCpu");
  }
  region_len = pages * page_size;

  page_ns = calloc(pages, sizeof(*page_ns));
  fault_read = calloc(pages, sizeof(*fault_read));
  fault_handled = calloc(pages, sizeof(*fault_handled));
  fault_copied = calloc(pages, sizeof(*fault_copied));
  queue_addr = calloc(pages, sizeof(*queue_addr));
  queue_read = calloc(pages, sizeof(*queue_read));
  source = aligned_alloc(page_size, per_fault * page_size);
  if (!page_ns || !fault_read || !fault_handled || !fault_copied || !queue_addr || !queue_read || !source) die(EXIT_SYSCALL, "malloc", ENOMEM, NULL);
  memset(source, FILL, per_fault * page_size);  // the handler's data: proves the pages came from it

  region = mmap(NULL, region_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (region == MAP_FAILED) die(EXIT_SYSCALL, "mmap", errno, "Map fewer pages");
  // 4 KiB faults, as the library maps its regions: THP would make one fault cover 2 MiB.
  if (madvise(region, region_len, MADV_NOHUGEPAGE) != 0) die(EXIT_SYSCALL, "madvise(MADV_NOHUGEPAGE)", errno, NULL);

  uffd = open_uffd();
  struct uffdio_register reg = {.range = {(uint64_t)(uintptr_t)region, region_len}, .mode = UFFDIO_REGISTER_MODE_MISSING};
  if (ioctl(uffd, UFFDIO_REGISTER, &reg) != 0) die(EXIT_SYSCALL, "ioctl(UFFDIO_REGISTER)", errno, NULL);
  if (!(reg.ioctls & ((uint64_t)1 << _UFFDIO_COPY))) die(EXIT_SYSCALL, "ioctl(UFFDIO_REGISTER)", ENOTSUP, "UFFDIO_COPY is not offered on this range");

  stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  relay_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (stop_fd < 0 || relay_fd < 0) die(EXIT_SYSCALL, "eventfd", errno, NULL);

  pthread_t handler, resolver, touch[MAX_FAULTERS];
  int err;
  if ((err = pthread_create(&handler, NULL, relay ? relay_reader : direct_handler, NULL)) != 0) die(EXIT_SYSCALL, "pthread_create", err, NULL);
  if (relay && (err = pthread_create(&resolver, NULL, relay_resolver, NULL)) != 0) die(EXIT_SYSCALL, "pthread_create", err, NULL);
  for (size_t k = 0; k < n_faulters; k++)
    if ((err = pthread_create(&touch[k], NULL, faulter, (void *)(uintptr_t)k)) != 0) die(EXIT_SYSCALL, "pthread_create", err, NULL);

  // The handler threads exit the process themselves if they wait too long; this bounds
  // the faulters too, in case a wake-up is lost inside the kernel.
  struct timespec deadline;
  clock_gettime(CLOCK_REALTIME, &deadline);
  deadline.tv_sec += 120;
  for (size_t k = 0; k < n_faulters; k++) {
    if ((err = pthread_timedjoin_np(touch[k], NULL, &deadline)) != 0) {
      fprintf(stderr, "uffd-handler: a faulter did not finish within 120 s (%s): a fault was never resolved\n", strerror(err));
      return EXIT_TIMEOUT;
    }
    checksum += faulter_sum[k];
    if (faulter_ns[k] > total_ns) total_ns = faulter_ns[k];
  }
  faulter_start = faulter_begin[0];
  uint64_t one = 1;
  if (write(stop_fd, &one, sizeof(one)) != sizeof(one)) die(EXIT_SYSCALL, "write(eventfd)", errno, NULL);
  pthread_join(handler, NULL);
  if (relay) pthread_join(resolver, NULL);

  size_t expected = (pages + per_fault - 1) / per_fault;
  if (checksum != (uint64_t)pages * FILL || faults != expected || foreign_faults) {
    fprintf(stderr, "uffd-handler: wrong outcome: checksum %llu (want %llu), %zu faults (want %zu), %zu from another thread\n",
            (unsigned long long)checksum, (unsigned long long)pages * FILL, faults, expected, foreign_faults);
    return EXIT_VERIFY;
  }
  print_json();
  if (fflush(stdout) != 0) die(EXIT_SYSCALL, "write(stdout)", errno, NULL);
  return 0;
}
