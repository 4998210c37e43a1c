// CRC-32C (Castagnoli) of a byte range, for remote paging's stored pages (lib/remote-paging/
// store.ts). Here rather than zlib.crc32 because that arrived only in Node 20.15 and the
// package supports 20.0; CRC-32C because x86 has an instruction for it (SSE4.2), with a
// slicing-by-8 table where it does not. The seed is the CRC so far (zlib's convention), so a
// checksum can cover key material and a page without copying them into one buffer.
#include <cstring>

#include "common.h"

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace pfr {

namespace {

constexpr uint32_t kPoly = 0x82f63b78;  // CRC-32C, reflected

struct Tables {
  uint32_t t[8][256];
  Tables() {
    for (uint32_t i = 0; i < 256; i++) {
      uint32_t c = i;
      for (int k = 0; k < 8; k++) c = (c >> 1) ^ (kPoly & (0u - (c & 1)));
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
      for (int s = 1; s < 8; s++) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xff];
  }
};

uint32_t Crc32cTable(uint32_t crc, const uint8_t* p, size_t n) {
  static const Tables tables;  // built once, on first use (thread-safe static init)
  const auto& t = tables.t;
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);  // little-endian: the only byte order Linux on x86/arm64 runs here
    w ^= crc;
    crc = t[7][w & 0xff] ^ t[6][(w >> 8) & 0xff] ^ t[5][(w >> 16) & 0xff] ^ t[4][(w >> 24) & 0xff] ^
          t[3][(w >> 32) & 0xff] ^ t[2][(w >> 40) & 0xff] ^ t[1][(w >> 48) & 0xff] ^ t[0][w >> 56];
  }
  while (n--) crc = (crc >> 8) ^ t[0][(crc ^ *p++) & 0xff];
  return crc;
}

#if defined(__x86_64__)
// Three streams at once: the instruction's latency is 3 cycles, its throughput 1. Each stream
// takes kShort bytes; the first two are then carried over the bytes after them with a
// table-driven multiply by x^(8·kShort) (the CRC of kShort zero bytes), which is linear.
constexpr size_t kShort = 256;

struct ShiftTable {
  uint32_t t[4][256];
  ShiftTable() {
    static const uint8_t zeros[kShort] = {};
    for (int k = 0; k < 4; k++)
      for (uint32_t b = 0; b < 256; b++) t[k][b] = Crc32cTable(b << (8 * k), zeros, kShort);
  }
  uint32_t Shift(uint32_t crc) const { return t[0][crc & 0xff] ^ t[1][(crc >> 8) & 0xff] ^ t[2][(crc >> 16) & 0xff] ^ t[3][crc >> 24]; }
};

__attribute__((target("sse4.2"))) uint32_t Crc32cSse42(uint32_t crc, const uint8_t* p, size_t n) {
  static const ShiftTable shift;
  uint64_t c0 = crc;
  for (; n >= 3 * kShort; n -= 3 * kShort, p += 3 * kShort) {
    uint64_t c1 = 0, c2 = 0;
    for (size_t i = 0; i < kShort; i += 8) {
      uint64_t w0, w1, w2;
      std::memcpy(&w0, p + i, 8);
      std::memcpy(&w1, p + kShort + i, 8);
      std::memcpy(&w2, p + 2 * kShort + i, 8);
      c0 = _mm_crc32_u64(c0, w0);
      c1 = _mm_crc32_u64(c1, w1);
      c2 = _mm_crc32_u64(c2, w2);
    }
    c0 = shift.Shift(shift.Shift(static_cast<uint32_t>(c0)) ^ static_cast<uint32_t>(c1)) ^ static_cast<uint32_t>(c2);
  }
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    c0 = _mm_crc32_u64(c0, w);
  }
  uint32_t c32 = static_cast<uint32_t>(c0);
  while (n--) c32 = _mm_crc32_u8(c32, *p++);
  return c32;
}
const bool kHaveSse42 = __builtin_cpu_supports("sse4.2");
#endif

}  // namespace

uint32_t Crc32c(uint32_t seed, const uint8_t* p, size_t n) {
  uint32_t crc = ~seed;
#if defined(__x86_64__)
  if (kHaveSse42) return ~Crc32cSse42(crc, p, n);
#endif
  return ~Crc32cTable(crc, p, n);
}

namespace {

// crc32c(seed, bytes): the CRC-32C of a Uint8Array's bytes, continuing from `seed` (0 to start).
Napi::Value Crc32cJs(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  uint32_t seed = ArgU32(info, 0, "seed");
  if (!info[1].IsTypedArray() || info[1].As<Napi::TypedArray>().TypedArrayType() != napi_uint8_array)
    throw Napi::TypeError::New(env, "crc32c: bytes must be a Uint8Array");
  auto v = info[1].As<Napi::Uint8Array>();
  return Napi::Number::New(env, Crc32c(seed, v.Data(), v.ByteLength()));
}

}  // namespace

void InitChecksum(Napi::Env env, Napi::Object exports) { exports.Set("crc32c", Napi::Function::New(env, Crc32cJs, "crc32c")); }

}  // namespace pfr
