// Kernel ABI newer than the system headers: Debian 12 ships the 6.1 uapi headers, and the
// features below came later. Each is defined only where the headers lack it, with the value
// and layout of include/uapi/linux/userfaultfd.h, fs.h and asm-generic/mman-common.h.
// Whether the running kernel has a feature is found at run time (UFFDIO_API, the ioctl mask
// of UFFDIO_REGISTER, EINVAL from an older kernel), never assumed from these definitions.
#pragma once

#include <linux/fs.h>
#include <linux/userfaultfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>

#include <cstdint>

#ifndef UFFD_USER_MODE_ONLY
#define UFFD_USER_MODE_ONLY 1
#endif

// Features (uffdio_api.features).
#ifndef UFFD_FEATURE_WP_UNPOPULATED
#define UFFD_FEATURE_WP_UNPOPULATED (1 << 13)  // 6.4
#endif
#ifndef UFFD_FEATURE_POISON
#define UFFD_FEATURE_POISON (1 << 14)  // 6.6
#endif
#ifndef UFFD_FEATURE_WP_ASYNC
#define UFFD_FEATURE_WP_ASYNC (1 << 15)  // 6.7
#endif
#ifndef UFFD_FEATURE_MOVE
#define UFFD_FEATURE_MOVE (1 << 16)  // 6.8
#endif

// UFFDIO_CONTINUE_MODE_WP (6.4): map the page-cache page write-protected.
#ifndef UFFDIO_CONTINUE_MODE_WP
#define UFFDIO_CONTINUE_MODE_WP ((__u64)1 << 1)
#endif

// UFFDIO_POISON (6.6): later accesses to the range get SIGBUS (VM_FAULT_HWPOISON).
#ifndef UFFDIO_POISON
#define _UFFDIO_POISON (0x08)
struct uffdio_poison {
  struct uffdio_range range;
#define UFFDIO_POISON_MODE_DONTWAKE ((__u64)1 << 0)
  __u64 mode;
  __s64 updated;
};
#define UFFDIO_POISON _IOWR(UFFDIO, _UFFDIO_POISON, struct uffdio_poison)
#endif

// UFFDIO_MOVE (6.8): move anonymous pages between two ranges of this mm without copying.
#ifndef UFFDIO_MOVE
#define _UFFDIO_MOVE (0x05)
struct uffdio_move {
  __u64 dst;
  __u64 src;
  __u64 len;
#define UFFDIO_MOVE_MODE_DONTWAKE ((__u64)1 << 0)
#define UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES ((__u64)1 << 1)
  __u64 mode;
  __s64 move;
};
#define UFFDIO_MOVE _IOWR(UFFDIO, _UFFDIO_MOVE, struct uffdio_move)
#endif

// PAGEMAP_SCAN (6.7): walk /proc/self/pagemap by category, optionally write-protecting the
// pages it reports (PM_SCAN_WP_MATCHING): with UFFD_FEATURE_WP_ASYNC, dirty tracking.
#ifndef PAGEMAP_SCAN
#define PAGE_IS_WPALLOWED (1 << 0)
#define PAGE_IS_WRITTEN (1 << 1)
#define PAGE_IS_FILE (1 << 2)
#define PAGE_IS_PRESENT (1 << 3)
#define PAGE_IS_SWAPPED (1 << 4)
#define PAGE_IS_PFNZERO (1 << 5)
#define PAGE_IS_HUGE (1 << 6)
struct page_region {
  __u64 start;
  __u64 end;
  __u64 categories;
};
#define PM_SCAN_WP_MATCHING (1 << 0)
#define PM_SCAN_CHECK_WPASYNC (1 << 1)
struct pm_scan_arg {
  __u64 size;
  __u64 flags;
  __u64 start;
  __u64 end;
  __u64 walk_end;
  __u64 vec;
  __u64 vec_len;
  __u64 max_pages;
  __u64 category_inverted;
  __u64 category_mask;
  __u64 category_anyof_mask;
  __u64 return_mask;
};
#define PAGEMAP_SCAN _IOWR('f', 16, struct pm_scan_arg)
#endif

#ifndef MADV_PAGEOUT
#define MADV_PAGEOUT 21  // 5.4
#endif
#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22  // 5.14
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25  // 6.1
#endif
#ifndef MFD_HUGETLB
#define MFD_HUGETLB 0x0004U
#endif
