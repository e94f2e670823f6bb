/* Byte movers between GGML blocks and Hurray buffers: the compiled twin of
 * hurray_interop/conversions/_gguf_blocks.py (same results, byte for byte;
 * tests/test_kernels.py proves it).  Portable C99, no SIMD intrinsics, no
 * Python C-API: hurray_interop/kernels.py loads it with ctypes, which releases
 * the GIL around each call, so worker threads run these in parallel.
 *
 * Every function takes raw pointers, a block count n and byte strides between
 * consecutive blocks (rows), so a strided view of the memory-mapped GGUF is read
 * in place and a Hurray or GGML buffer is written in place.  Within a row the
 * bytes are contiguous.  Nothing is decoded: codes and scale bits are moved
 * (docs/conversion-rules.md § 1.2); nibble orders are in § 2:
 *   GGML:   element j low nibble, element j+16 high nibble of byte j (j < 16);
 *   Hurray: element 2k low nibble, element 2k+1 high nibble of byte k.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(_WIN32)
#define HK_API __declspec(dllexport)
#else
#define HK_API __attribute__((visibility("default")))
#endif

typedef ptrdiff_t hk_stride;

/* Bumped whenever a signature changes: the loader refuses a stale library. */
HK_API int hk_abi_version(void) { return 1; }

/* (n, 16) GGML split-half nibbles -> (n, 16) Hurray pairs, each byte XOR x. */
HK_API void hk_split_to_pairs(const uint8_t *src, hk_stride ss, size_t n,
                              uint8_t *dst, hk_stride ds, uint8_t x) {
    for (size_t r = 0; r < n; r++) {
        const uint8_t *q = src + (hk_stride)r * ss;
        uint8_t *o = dst + (hk_stride)r * ds;
        for (int i = 0; i < 8; i++) {
            uint8_t a = q[2 * i], b = q[2 * i + 1];
            o[i] = (uint8_t)(((a & 0x0F) | (b << 4)) ^ x);
            o[8 + i] = (uint8_t)(((a >> 4) | (b & 0xF0)) ^ x);
        }
    }
}

/* The inverse (without XOR): (n, 16) Hurray pairs -> GGML split halves. */
HK_API void hk_pairs_to_split(const uint8_t *src, hk_stride ss, size_t n,
                              uint8_t *dst, hk_stride ds) {
    for (size_t r = 0; r < n; r++) {
        const uint8_t *h = src + (hk_stride)r * ss;
        uint8_t *o = dst + (hk_stride)r * ds;
        for (int i = 0; i < 8; i++) {
            uint8_t a = h[i], b = h[8 + i];
            o[2 * i] = (uint8_t)((a & 0x0F) | (b << 4));
            o[2 * i + 1] = (uint8_t)((a >> 4) | (b & 0xF0));
        }
    }
}

/* GGML Q5 parts (qs: 16 bytes, qh: 4 bytes little-endian) -> 32 codes 0..31. */
HK_API void hk_q5_codes(const uint8_t *qs, hk_stride qss, const uint8_t *qh,
                        hk_stride qhs, size_t n, uint8_t *dst, hk_stride ds) {
    for (size_t r = 0; r < n; r++) {
        const uint8_t *q = qs + (hk_stride)r * qss;
        const uint8_t *h = qh + (hk_stride)r * qhs;
        uint32_t high = (uint32_t)h[0] | (uint32_t)h[1] << 8 |
                        (uint32_t)h[2] << 16 | (uint32_t)h[3] << 24;
        uint8_t *o = dst + (hk_stride)r * ds;
        for (int j = 0; j < 16; j++) {
            o[j] = (uint8_t)((q[j] & 0x0F) | ((high >> j) & 1u) << 4);
            o[16 + j] = (uint8_t)((q[j] >> 4) | ((high >> (16 + j)) & 1u) << 4);
        }
    }
}

/* 32 codes per row (only bits 0..4 used) -> GGML Q5 qs (16 bytes) and qh (4 bytes). */
HK_API void hk_q5_pack(const uint8_t *src, hk_stride ss, size_t n, uint8_t *qs,
                       hk_stride qss, uint8_t *qh, hk_stride qhs) {
    for (size_t r = 0; r < n; r++) {
        const uint8_t *c = src + (hk_stride)r * ss;
        uint8_t *q = qs + (hk_stride)r * qss;
        uint8_t *h = qh + (hk_stride)r * qhs;
        uint32_t high = 0;
        for (int j = 0; j < 16; j++)
            q[j] = (uint8_t)((c[j] & 0x0F) | (c[16 + j] << 4));
        for (int j = 0; j < 32; j++)
            high |= (uint32_t)((c[j] >> 4) & 1u) << j;
        for (int k = 0; k < 4; k++)
            h[k] = (uint8_t)(high >> (8 * k));
    }
}

/* Copy `size` bytes of every row: gathers a field out of blocks (dst rows
 * contiguous) or scatters one back into blocks (src rows contiguous).  The
 * common sizes get a fixed-size memcpy, which compilers turn into one move. */
HK_API void hk_move(const uint8_t *src, hk_stride ss, size_t n, size_t size,
                    uint8_t *dst, hk_stride ds) {
#define HK_MOVE_FIXED(K)                                                  \
    for (size_t r = 0; r < n; r++)                                        \
        memcpy(dst + (hk_stride)r * ds, src + (hk_stride)r * ss, K);      \
    return;
    switch (size) {
    case 1: HK_MOVE_FIXED(1)
    case 2: HK_MOVE_FIXED(2)
    case 4: HK_MOVE_FIXED(4)
    case 16: HK_MOVE_FIXED(16)
    case 32: HK_MOVE_FIXED(32)
    default: HK_MOVE_FIXED(size)
    }
#undef HK_MOVE_FIXED
}

/* Scale classes, one byte per block: 0 usable, 1 zero, 2 not finite / NaN. */
enum { HK_OK = 0, HK_ZERO = 1, HK_BAD = 2 };

/* float16 scale (2 bytes, little-endian) at each row: ±0 -> ZERO, inf/NaN -> BAD.
 * Returns how many rows are not OK. */
HK_API size_t hk_class_f16(const uint8_t *src, hk_stride ss, size_t n, uint8_t *dst) {
    size_t count = 0;
    for (size_t r = 0; r < n; r++) {
        const uint8_t *p = src + (hk_stride)r * ss;
        unsigned v = (unsigned)p[0] | (unsigned)p[1] << 8;
        uint8_t c = (v & 0x7C00u) == 0x7C00u ? HK_BAD : (v & 0x7FFFu) == 0 ? HK_ZERO : HK_OK;
        dst[r] = c;
        count += c != HK_OK;
    }
    return count;
}

/* E8M0 scale byte at each row: 0x00 -> ZERO, 0xFF (NaN) -> BAD. */
HK_API size_t hk_class_e8m0(const uint8_t *src, hk_stride ss, size_t n, uint8_t *dst) {
    size_t count = 0;
    for (size_t r = 0; r < n; r++) {
        uint8_t e = src[(hk_stride)r * ss];
        uint8_t c = e == 0xFF ? HK_BAD : e == 0 ? HK_ZERO : HK_OK;
        dst[r] = c;
        count += c != HK_OK;
    }
    return count;
}

/* Per row of `size` bytes: 1 when every byte AND mask is zero (all codes decode
 * to zero), else 0.  Returns how many rows are all zero. */
HK_API size_t hk_all_zero(const uint8_t *src, hk_stride ss, size_t n, size_t size,
                          uint8_t mask, uint8_t *dst) {
    size_t count = 0;
    for (size_t r = 0; r < n; r++) {
        const uint8_t *p = src + (hk_stride)r * ss;
        uint8_t acc = 0;
        for (size_t k = 0; k < size; k++)
            acc |= p[k];
        dst[r] = (acc & mask) == 0;
        count += dst[r];
    }
    return count;
}
