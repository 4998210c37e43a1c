// Module entry: one export object assembled from the parts, one per concern.
#include "common.h"

namespace {

Napi::Object Init(Napi::Env env, Napi::Object exports) {
  pfr::InitRegion(env, exports);
  pfr::InitUffd(env, exports);
  pfr::InitToucher(env, exports);
  pfr::InitCopyEngine(env, exports);
  pfr::InitChecksum(env, exports);
  pfr::InitSeqpacket(env, exports);
  pfr::InitForeign(env, exports);
#ifdef PFR_HAVE_LIBFABRIC
  pfr::InitFabric(env, exports);  // only when libfabric-dev was there at build time
#endif
#ifdef PFR_HAVE_HIREDIS
  pfr::InitRedis(env, exports);  // only when libhiredis-dev was there at build time
#endif
  return exports;
}

}  // namespace

NODE_API_MODULE(pagefault_rdma, Init)
