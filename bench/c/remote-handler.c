// The C reference for `npm run bench:remote`: the major-fault round trip of remote paging,
// fault -> Redis GET (hiredis) -> UFFDIO_COPY, with nothing else in the way. A handler thread
// reads the userfaultfd and serves each fault from Redis; the main thread reads one byte of
// every page, in order, and times each access. The pages are the ones the TypeScript pager
// stored (same server, same keys, same stored form: the page, then a 24-byte trailer).
//
// usage: remote-handler SOCKET PREFIX BASE_HEX PAGES ROUNDS
//   PREFIX: the pager's key prefix (RemotePager.keyPrefix: application prefix and instance id).
//   BASE_HEX: the address the pages were stored under (EDM's key is the page's address).
// Prints one JSON line: {"rounds":[{"medianUs":…,"p99Us":…,"meanUs":…}, …]}.
// Build: cc -O2 -pthread remote-handler.c -lhiredis  (Debian: libhiredis-dev)
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define TRAILER 24

static int uffd;
static char *area;
static long page_size;
static const char *prefix;
static uint64_t base;
static redisContext *redis;
static volatile int stop;

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void die(const char *what) {
  fprintf(stderr, "remote-handler: %s: %s\n", what, strerror(errno));
  exit(1);
}

static void *handler(void *arg) {
  (void)arg;
  struct pollfd p = {uffd, POLLIN, 0};
  while (!stop) {
    if (poll(&p, 1, 100) <= 0) continue;
    struct uffd_msg msg;
    if (read(uffd, &msg, sizeof(msg)) != sizeof(msg)) continue;
    if (msg.event != UFFD_EVENT_PAGEFAULT) continue;
    uint64_t page = msg.arg.pagefault.address & ~(uint64_t)(page_size - 1);
    uint64_t offset = page - (uint64_t)(uintptr_t)area;
    redisReply *r = redisCommand(redis, "GET %s:%llx", prefix, (unsigned long long)(base + offset));
    if (r == NULL || r->type != REDIS_REPLY_STRING || r->len != (size_t)(page_size + TRAILER)) {
      fprintf(stderr, "remote-handler: page %llx missing from Redis\n", (unsigned long long)(base + offset));
      exit(1);
    }
    struct uffdio_copy c = {page, (uint64_t)(uintptr_t)r->str, (uint64_t)page_size, 0, 0};
    if (ioctl(uffd, UFFDIO_COPY, &c) != 0 && errno != EEXIST) die("UFFDIO_COPY");
    freeReplyObject(r);
  }
  return NULL;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  if (argc != 6) {
    fprintf(stderr, "usage: remote-handler SOCKET PREFIX BASE_HEX PAGES ROUNDS\n");
    return 2;
  }
  prefix = argv[2];
  base = strtoull(argv[3], NULL, 16);
  long pages = atol(argv[4]), rounds = atol(argv[5]);
  page_size = sysconf(_SC_PAGESIZE);
  redis = redisConnectUnix(argv[1]);
  if (redis == NULL || redis->err) {
    fprintf(stderr, "remote-handler: cannot connect to Redis at %s\n", argv[1]);
    return 1;
  }
  size_t len = (size_t)pages * (size_t)page_size;
  area = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (area == MAP_FAILED) die("mmap");
  madvise(area, len, MADV_NOHUGEPAGE);
  uffd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
  if (uffd < 0) die("userfaultfd");
  struct uffdio_api api = {UFFD_API, 0, 0};
  if (ioctl(uffd, UFFDIO_API, &api) != 0) die("UFFDIO_API");
  struct uffdio_register reg = {{(uint64_t)(uintptr_t)area, len}, UFFDIO_REGISTER_MODE_MISSING, 0};
  if (ioctl(uffd, UFFDIO_REGISTER, &reg) != 0) die("UFFDIO_REGISTER");
  pthread_t t;
  pthread_create(&t, NULL, handler, NULL);
  double *us = malloc(sizeof(double) * (size_t)pages);
  printf("{\"rounds\":[");
  for (long round = 0; round < rounds; round++) {
    double sum = 0;
    for (long i = 0; i < pages; i++) {
      uint64_t t0 = now_ns();
      (void)*(volatile char *)(area + i * page_size);
      us[i] = (double)(now_ns() - t0) / 1000.0;
      sum += us[i];
    }
    qsort(us, (size_t)pages, sizeof(double), cmp);
    printf("%s{\"medianUs\":%.3f,\"p99Us\":%.3f,\"meanUs\":%.3f}", round ? "," : "", us[pages / 2], us[(pages * 99) / 100], sum / (double)pages);
    if (madvise(area, len, MADV_DONTNEED) != 0) die("madvise(MADV_DONTNEED)");
  }
  printf("]}\n");
  stop = 1;
  pthread_join(t, NULL);
  return 0;
}
