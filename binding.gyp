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
        "native/checksum.cc"
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
    }
  ]
}
