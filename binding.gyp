{
  "targets": [
    {
      "target_name": "pagefault_rdma",
      "sources": [
        "native/addon.cc",
        "native/region.cc",
        "native/uffd.cc",
        "native/toucher.cc",
        "native/copy_engine.cc",
        "native/sigbus.cc",
        "native/checksum.cc",
        "native/seqpacket.cc",
        "native/foreign.cc"
      ],
      "include_dirs": ["<!(node -p \"require('node-addon-api').include_dir\")"],
      "defines": ["NAPI_VERSION=8", "NAPI_CPP_EXCEPTIONS", "NODE_API_SWALLOW_UNTHROWABLE_EXCEPTIONS"],
      "cflags!": ["-fno-exceptions"],
      "cflags_cc!": ["-fno-exceptions", "-std=gnu++17"],
      "cflags_cc": ["-std=c++17", "-fexceptions", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Wno-missing-field-initializers", "-fstack-protector-strong"],
      # nodelete: Node unloads an addon when the last worker that loaded it ends, but our
      # detached copy threads and the process-wide SIGBUS handler still run its code.
      "ldflags": ["-pthread", "-Wl,-z,nodelete"],
      "conditions": [
        ["<!(pkg-config --exists libfabric && echo 1 || echo 0)==1", {
          "sources": ["native/fabric.cc", "native/bare_sockets.cc", "native/provider_crash.cc"],
          "defines": ["PFR_HAVE_LIBFABRIC"],
          "cflags_cc": ["<!@(pkg-config --cflags libfabric 2>/dev/null || true)"],
          "libraries": ["-ldl"]
        }],
        ["<!(pkg-config --exists hiredis && echo 1 || echo 0)==1", {
          "sources": ["native/redis.cc"],
          "defines": ["PFR_HAVE_HIREDIS"],
          "cflags_cc": ["<!@(pkg-config --cflags-only-I hiredis 2>/dev/null || true)"],
          "libraries": ["-ldl"]
        }]
      ]
    },
    # The project's libibverbs.so.1 (native/libibverbs): C11 against libibverbs-dev's headers, so
    # its structures are the programs' ABI. Built only where the headers are; without them the
    # addon installs alone and `pagefault-rdma libdir` names the package to install.
    {
      "target_name": "ibverbs",
      "type": "none",
      "conditions": [
        ["<!(echo '#include <infiniband/verbs.h>' | cc -E - >/dev/null 2>&1 && echo 1 || echo 0)==1", {
          "type": "shared_library",
          "product_prefix": "lib",
          "product_name": "ibverbs",
          "product_dir": "<(PRODUCT_DIR)/libibverbs",
          "product_extension": "so.1",
          "sources": [
            "native/libibverbs/compat.c",
            "native/libibverbs/control.c",
            "native/libibverbs/cq.c",
            "native/libibverbs/device.c",
            "native/libibverbs/fault_thread.c",
            "native/libibverbs/memory.c",
            "native/libibverbs/private.c",
            "native/libibverbs/post.c",
            "native/libibverbs/qp.c",
            "native/libibverbs/query.c",
            "native/libibverbs/rings.c",
            "native/libibverbs/strings.c",
            "native/libibverbs/table.c"
          ],
          "cflags": ["-std=c11", "-D_GNU_SOURCE", "-fPIC", "-Wall", "-Wextra", "-fvisibility=hidden", "-O2"],
          "ldflags": ["-pthread", "-Wl,-z,defs", "-Wl,--version-script=<(module_root_dir)/native/libibverbs/libibverbs.map"]
        }]
      ]
    }
  ]
}
