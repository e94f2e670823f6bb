/* Byte movers between GGML blocks and Hurray buffers: the compiled twin of
 * the numpy twins in hurray_interop/kernels.py and, for ggml's own block structs
 * (hk_q5_*, hk_q5_k_*, hk_dsc_scales, hk_q6k_*), hurray_interop/conversions/gguf_kernels.py (same results, byte for byte;
 * tests/test_kernels.py proves it).  Portable C99 (the two nibble movers have an
 * SSE2 body where the compiler targets SSE2, as every x86-64 compiler does; the
 * portable body elsewhere: the same bytes), no Python C-API: hurray_interop/kernels.py loads it with ctypes, which releases
 * the GIL around each call, so worker threads run these in parallel.
 *
 * Every function takes raw pointers, a block count n and byte strides between
 * consecutive blocks (rows), so a strided view of the memory-mapped GGUF is read
 * in place and a Hurray or GGML buffer is written in place.  Within a row the
 * bytes are contiguous.  Nothing is decoded: codes and scale bits are moved
 * (docs/conversion-rules.md § 1.2) -- except by hk_dsc_scales, which forms the
 * K-quants' float32 products d*sc and -(dmin*m) (one IEEE multiplication each, as
 * numpy does; § 9); nibble orders are in § 2:
 *   GGML:   element j low nibble, element j+16 high nibble of byte j (j < 16);
 *   Hurray: element 2k low nibble, element 2k+1 high nibble of byte k.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#define HK_SSE2 1
#endif
#if defined(HK_SSE2) && defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#include <immintrin.h>
#define HK_AVX2 1  /* compiled with target("avx2"), run only where the CPU has it (hk_dequant) */
#endif

#if defined(_WIN32)
#define HK_API __declspec(dllexport)
#else
#define HK_API __attribute__((visibility("default")))
#endif

typedef ptrdiff_t hk_stride;

/* Bumped whenever a signature changes: the loader refuses a stale library. */
HK_API int hk_abi_version(void) { return 16; }

/* Little-endian 64-bit loads and stores: the movers work on eight bytes at once. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
static inline uint64_t ld64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static inline void st64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
#else
static inline uint64_t ld64(const uint8_t *p) {
    uint64_t v = 0;
    for (int k = 7; k >= 0; k--) v = v << 8 | p[k];
    return v;
}
static inline void st64(uint8_t *p, uint64_t v) {
    for (int k = 0; k < 8; k++) p[k] = (uint8_t)(v >> (8 * k));
}
#endif

#define LO4_8 0x0F0F0F0F0F0F0F0FULL /* low nibble of each byte */
#define HI4_8 0xF0F0F0F0F0F0F0F0ULL
#define BYTE_LSB 0x0101010101010101ULL

/* The even bytes (0, 2, 4, 6) of w, packed into its low 4 bytes. */
static inline uint64_t evens(uint64_t w) {
    w &= 0x00FF00FF00FF00FFULL;
    w = (w | w >> 8) & 0x0000FFFF0000FFFFULL;
    return (w | w >> 16) & 0xFFFFFFFFULL;
}

/* The inverse: the low 4 bytes of v spread to the even bytes. */
static inline uint64_t spread_evens(uint64_t v) {
    v &= 0xFFFFFFFFULL;
    v = (v | v << 16) & 0x0000FFFF0000FFFFULL;
    return (v | v << 8) & 0x00FF00FF00FF00FFULL;
}

/* (n, w) GGML split-half nibbles -> (n, w) Hurray pairs, each byte XOR x; w a
 * multiple of 16.  With a = qs[2i] and b = qs[2i+1] (the even and odd bytes),
 * Hurray byte i is (a & 15) | (b & 15) << 4 and byte w/2 + i is a >> 4 | (b & 0xF0). */
#if HK_SSE2
/* The SSE2 bodies of hk_split_to_pairs.  In 16-bit lanes l = qs[2i] | qs[2i+1] << 8: the low
 * nibbles' byte (a & 15) | (b & 15) << 4 is the low byte of n | n >> 4 with n = l & 0x0F0F
 * (pair_low), the high nibbles' likewise with n = l >> 4 & 0x0F0F (pair_high); a saturating
 * pack then puts eight such bytes of one vector before eight of the next.  w == 16: the
 * low-nibble bytes of the row, then its high-nibble bytes. */
static inline __m128i pair_low(__m128i v) {
    const __m128i n = _mm_and_si128(v, _mm_set1_epi8(0x0F));
    return _mm_and_si128(_mm_or_si128(n, _mm_srli_epi16(n, 4)), _mm_set1_epi16(0x00FF));
}
static inline __m128i pair_high(__m128i v) {
    return pair_low(_mm_srli_epi16(v, 4));
}

static void split16_sse2(const uint8_t *src, hk_stride ss, size_t n, uint8_t *dst, hk_stride ds, uint8_t x) {
    const __m128i xx = _mm_set1_epi8((char)x);
    for (size_t r = 0; r < n; r++) {
        __m128i v = _mm_loadu_si128((const __m128i *)(const void *)(src + (hk_stride)r * ss));
        _mm_storeu_si128((__m128i *)(void *)(dst + (hk_stride)r * ds),
                         _mm_xor_si128(_mm_packus_epi16(pair_low(v), pair_high(v)), xx));
    }
}

/* hk_split_to_pairs for w a multiple of 32 (Q4_K, Q5_K: 32-byte runs): per 32 bytes g, the
 * low nibbles' pairs of both 16-byte halves packed into the 16 bytes at g/2, the high
 * nibbles' into the 16 bytes at w/2 + g/2. */
static void split32_sse2(const uint8_t *src, hk_stride ss, size_t n, size_t w, uint8_t *dst, hk_stride ds,
                         uint8_t x) {
    const __m128i xx = _mm_set1_epi8((char)x);
    for (size_t r = 0; r < n; r++) {
        const uint8_t *q = src + (hk_stride)r * ss;
        uint8_t *o = dst + (hk_stride)r * ds;
        for (size_t g = 0; g < w; g += 32) {
            __m128i v0 = _mm_loadu_si128((const __m128i *)(const void *)(q + g));
            __m128i v1 = _mm_loadu_si128((const __m128i *)(const void *)(q + g + 16));
            _mm_storeu_si128((__m128i *)(void *)(o + g / 2), _mm_xor_si128(_mm_packus_epi16(pair_low(v0), pair_low(v1)), xx));
            _mm_storeu_si128((__m128i *)(void *)(o + w / 2 + g / 2),
                             _mm_xor_si128(_mm_packus_epi16(pair_high(v0), pair_high(v1)), xx));
        }
    }
}

/* hk_pairs_to_split for w == 16: the two 8-byte halves interleaved into lanes
 * l = lo_i | hi_i << 8, and GGML's bytes a_i | b_i << 8 are
 * (l & 0xF00F) | (l >> 4 & 0x00F0) | (l << 4 & 0x0F00). */
static void pairs16_sse2(const uint8_t *src, hk_stride ss, size_t n, uint8_t *dst, hk_stride ds) {
    const __m128i keep = _mm_set1_epi16((short)0xF00F), down = _mm_set1_epi16(0x00F0), up = _mm_set1_epi16(0x0F00);
    for (size_t r = 0; r < n; r++) {
        const uint8_t *h = src + (hk_stride)r * ss;
        __m128i l = _mm_unpacklo_epi8(_mm_loadl_epi64((const __m128i *)(const void *)h),
                                      _mm_loadl_epi64((const __m128i *)(const void *)(h + 8)));
        __m128i o = _mm_or_si128(_mm_and_si128(l, keep),
                                 _mm_or_si128(_mm_and_si128(_mm_srli_epi16(l, 4), down),
                                              _mm_and_si128(_mm_slli_epi16(l, 4), up)));
        _mm_storeu_si128((__m128i *)(void *)(dst + (hk_stride)r * ds), o);
    }
}
#endif

HK_API void hk_split_to_pairs(const uint8_t *src, hk_stride ss, size_t n, size_t w,
                              uint8_t *dst, hk_stride ds, uint8_t x) {
    uint64_t xx = BYTE_LSB * x;
#if HK_SSE2
    if (w == 16) { /* Q4_0, MXFP4: one 16-byte block row per vector, 3-4x the portable body */
        split16_sse2(src, ss, n, dst, ds, x);
        return;
    }
    if (w % 32 == 0) { /* Q4_K, Q5_K: 32-byte runs */
        split32_sse2(src, ss, n, w, dst, ds, x);
        return;
    }
#endif
    for (size_t r = 0; r < n; r++) {
        const uint8_t *q = src + (hk_stride)r * ss;
        uint8_t *o = dst + (hk_stride)r * ds;
        for (size_t g = 0; g < w; g += 16) {
            uint64_t w0 = ld64(q + g), w1 = ld64(q + g + 8);
            uint64_t a = evens(w0) | evens(w1) << 32, b = evens(w0 >> 8) | evens(w1 >> 8) << 32;
            st64(o + g / 2, ((a & LO4_8) | (b << 4 & HI4_8)) ^ xx);
            st64(o + w / 2 + g / 2, ((a >> 4 & LO4_8) | (b & HI4_8)) ^ xx);
        }
    }
}

/* The inverse (without XOR): (n, w) Hurray pairs -> GGML split halves. */
HK_API void hk_pairs_to_split(const uint8_t *src, hk_stride ss, size_t n, size_t w,
                              uint8_t *dst, hk_stride ds) {
#if HK_SSE2
    if (w == 16) {
        pairs16_sse2(src, ss, n, dst, ds);
        return;
    }
#endif
    for (size_t r = 0; r < n; r++) {
        const uint8_t *h = src + (hk_stride)r * ss;
        uint8_t *o = dst + (hk_stride)r * ds;
        for (size_t g = 0; g < w; g += 16) {
            uint64_t lo = ld64(h + g / 2), hi = ld64(h + w / 2 + g / 2);
            uint64_t a = (lo & LO4_8) | (hi << 4 & HI4_8), b = (lo >> 4 & LO4_8) | (hi & HI4_8);
            st64(o + g, spread_evens(a) | spread_evens(b) << 8);
            st64(o + g + 8, spread_evens(a >> 32) | spread_evens(b >> 32) << 8);
        }
    }
}

/* Bit k of each of the 8 bytes v (LSB first) -> byte k's bit 4 (spread), and back (gather). */
static inline uint64_t spread_bits(uint8_t v) {
    uint64_t m = (BYTE_LSB * v) & 0x8040201008040201ULL; /* byte k keeps bit k */
    return ((m + 0x7F7F7F7F7F7F7F7FULL) >> 7 & BYTE_LSB) << 4;
}
static inline uint8_t gather_bits(uint64_t w) {
    return (uint8_t)(((w >> 4 & BYTE_LSB) * 0x0102040810204080ULL) >> 56);
}

/* GGML Q5-style parts -> k codes 0..31 per row (k a multiple of 16): qs (k/2 bytes)
 * holds code j in the low and code k/2 + j in the high nibble of byte j; qh (k/8
 * bytes, little-endian bit order) holds bit 4 of code j as its bit j. */
HK_API void hk_q5_codes(const uint8_t *qs, hk_stride qss, const uint8_t *qh, hk_stride qhs,
                        size_t n, size_t k, uint8_t *dst, hk_stride ds) {
    for (size_t r = 0; r < n; r++) {
        const uint8_t *q = qs + (hk_stride)r * qss;
        const uint8_t *h = qh + (hk_stride)r * qhs;
        uint8_t *o = dst + (hk_stride)r * ds;
        for (size_t g = 0; g < k / 2; g += 8) {
            uint64_t w = ld64(q + g);
            st64(o + g, (w & LO4_8) | spread_bits(h[g / 8]));
            st64(o + k / 2 + g, (w >> 4 & LO4_8) | spread_bits(h[(k / 2 + g) / 8]));
        }
    }
}

/* k codes per row (only bits 0..4 used) -> qs (k/2 bytes) and qh (k/8 bytes). */
HK_API void hk_q5_pack(const uint8_t *src, hk_stride ss, size_t n, size_t k, uint8_t *qs,
                       hk_stride qss, uint8_t *qh, hk_stride qhs) {
    for (size_t r = 0; r < n; r++) {
        const uint8_t *c = src + (hk_stride)r * ss;
        uint8_t *q = qs + (hk_stride)r * qss;
        uint8_t *h = qh + (hk_stride)r * qhs;
        for (size_t g = 0; g < k / 2; g += 8) {
            uint64_t lo = ld64(c + g), hi = ld64(c + k / 2 + g);
            st64(q + g, (lo & LO4_8) | (hi & LO4_8) << 4);
            h[g / 8] = gather_bits(lo);
            h[(k / 2 + g) / 8] = gather_bits(hi);
        }
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

/* Bit-field runs (the K-quant code and scale fields): run r is six int32
 * (item, byte, length, shift, mask, dst); item item+j of a block is
 *   ((block[byte + j] >> shift) & mask) << dst, ORed over the runs.
 * hk_unpack_runs writes n rows of `items` values of `isize` bytes (1: uint8,
 * 2: native uint16), each zeroed first; hk_pack_runs is the inverse: it ORs
 * (uint8)(((value >> dst) & mask) << shift) into block[byte + j]. */
/* o[j] |= ((s[j] >> sh) & m) << d, truncated to 8 bits: eight bytes at a time (the
 * per-byte masks keep bits from crossing into a neighbouring byte), then the tail. */
static inline void or_run8(uint8_t *restrict o, const uint8_t *restrict s, unsigned len,
                           unsigned sh, unsigned m, unsigned d) {
    const uint64_t keep = BYTE_LSB * ((0xFFu >> sh) & m), high = BYTE_LSB * ((0xFFu << d) & 0xFFu);
    unsigned j = 0;
    for (; j + 8 <= len; j += 8) st64(o + j, ld64(o + j) | ((((ld64(s + j) >> sh) & keep) << d) & high));
    for (; j < len; j++) o[j] |= (uint8_t)(((unsigned)(s[j] >> sh) & m) << d);
}

static inline void or_run16(uint16_t *restrict o, const uint8_t *restrict s, unsigned len,
                            unsigned sh, unsigned m, unsigned d) {
    for (unsigned j = 0; j < len; j++) o[j] |= (uint16_t)(((unsigned)(s[j] >> sh) & m) << d);
}

static inline void pack_run16(uint8_t *restrict o, const uint16_t *restrict v, unsigned len,
                              unsigned sh, unsigned m, unsigned d) {
    for (unsigned j = 0; j < len; j++) o[j] |= (uint8_t)(((unsigned)(v[j] >> d) & m) << sh);
}

/* Both directions: unpack (clear = bytes to zero per output row) reads block bytes and ORs
 * items; pack reads items and ORs block bytes (or_run8 with the shifts swapped). */
static void move_runs(const uint8_t *src, hk_stride ss, size_t n, const int32_t *runs, size_t nruns,
                      size_t isize, uint8_t *dst, hk_stride ds, size_t clear, int pack) {
    for (size_t i = 0; i < n; i++, src += ss, dst += ds) {
        if (clear) memset(dst, 0, clear);
        for (size_t r = 0; r < nruns; r++) {
            const int32_t *R = runs + 6 * r;
            const unsigned len = (unsigned)R[2], sh = (unsigned)R[3], m = (unsigned)R[4], d = (unsigned)R[5];
            if (pack && isize == 1)
                or_run8(dst + R[1], src + R[0], len, d, m, sh);
            else if (pack)
                pack_run16(dst + R[1], (const uint16_t *)src + R[0], len, sh, m, d);
            else if (isize == 1)
                or_run8(dst + R[0], src + R[1], len, sh, m, d);
            else
                or_run16((uint16_t *)dst + R[0], src + R[1], len, sh, m, d);
        }
    }
}

HK_API void hk_unpack_runs(const uint8_t *src, hk_stride ss, size_t n, const int32_t *runs,
                           size_t nruns, size_t items, size_t isize, uint8_t *dst, hk_stride ds) {
    move_runs(src, ss, n, runs, nruns, isize, dst, ds, items * isize, 0);
}

HK_API void hk_pack_runs(const uint8_t *src, hk_stride ss, size_t n, const int32_t *runs,
                         size_t nruns, size_t isize, uint8_t *dst, hk_stride ds) {
    move_runs(src, ss, n, runs, nruns, isize, dst, ds, 0, 1);
}

/* GGUF string arrays: walk up to `count` strings (a little-endian uint64 length, then the
 * bytes) from `pos`, storing the offset of each string's bytes in `starts`.  Stops at the
 * first string whose length prefix or bytes run past `end` (pos <= end on entry); returns
 * the number of strings walked, and in *stop the offset after the last one (which is the
 * length prefix of the offending string when fewer than `count` were walked). */
HK_API size_t hk_string_starts(const uint8_t *buf, size_t end, size_t pos, size_t count,
                               int64_t *starts, size_t *stop) {
    size_t i = 0;
    for (; i < count; i++) {
        if (end - pos < 8) break;
        const uint64_t n = ld64(buf + pos);
        if (n > end - pos - 8) break;
        starts[i] = (int64_t)(pos + 8);
        pos += 8 + (size_t)n;
    }
    *stop = pos;
    return i;
}

/* float16 bits -> float32, exactly (subnormals scaled by 2^-24, which float32 holds). */
static inline float half_to_float(unsigned h) {
    unsigned e = h >> 10 & 0x1Fu, m = h & 0x3FFu;
    uint32_t bits = (uint32_t)(h & 0x8000u) << 16;
    float f;
    if (e == 0) {
        f = (float)m * 5.9604644775390625e-8f; /* m * 2^-24: exact */
        return (h & 0x8000u) ? -f : f;
    }
    bits |= e == 31 ? 0x7F800000u | (uint32_t)m << 13 : (uint32_t)(e + 112) << 23 | (uint32_t)m << 13;
    memcpy(&f, &bits, 4);
    return f;
}

/* One block's items of the bit-field runs into `items` (zeroed first; at most 64 items).
 * The run fields are read into locals once: `items` may alias them (int and unsigned). */
static void runs_row(const uint8_t *restrict blk, const int32_t *restrict runs, size_t nruns,
                     unsigned *restrict items, size_t n_items) {
    for (size_t k = 0; k < n_items; k++) items[k] = 0;
    for (size_t r = 0; r < nruns; r++) {
        const int32_t *R = runs + 6 * r;
        const unsigned len = (unsigned)R[2], sh = (unsigned)R[3], m = (unsigned)R[4], d = (unsigned)R[5];
        unsigned *restrict o = items + R[0];
        const uint8_t *restrict b = blk + R[1];
        for (unsigned j = 0; j < len; j++) o[j] |= ((unsigned)(b[j] >> sh) & m) << d;
    }
}

/* A dsc field as per-item tables: item s is lut[s][0][blk[b[s][0]]] | lut[s][1][blk[b[s][1]]],
 * each table the part's ((byte >> sh) & m) << d for every byte value (a missing second part:
 * byte 0, a table of zeros).  Built once per call from the runs; returns 0 when some item has
 * more than two parts (the caller then interprets the runs, runs_row). */
typedef struct {
    uint16_t b[64][2];
    uint8_t lut[64][2][256];
} field_luts;

static int luts_of(const int32_t *runs, size_t nruns, size_t subs, field_luts *f) {
    uint8_t count[64] = {0};
    memset(f->b, 0, sizeof f->b);
    memset(f->lut, 0, subs * sizeof f->lut[0]);
    for (size_t r = 0; r < nruns; r++) {
        const int32_t *R = runs + 6 * r;
        const unsigned sh = (unsigned)R[3], m = (unsigned)R[4], d = (unsigned)R[5];
        for (int32_t j = 0; j < R[2]; j++) {
            size_t it = (size_t)(R[0] + j);
            unsigned k = count[it]++;
            if (k > 1) return 0;
            f->b[it][k] = (uint16_t)(R[1] + j);
            for (unsigned v = 0; v < 256; v++) f->lut[it][k][v] = (uint8_t)(((v >> sh) & m) << d);
        }
    }
    return 1;
}

/* One block's field items: by the tables when there are (`f` not NULL), else the runs. */
static inline void field_row(const uint8_t *blk, const field_luts *f, const int32_t *runs, size_t nruns,
                             unsigned *items, size_t subs) {
    if (f) {
        for (size_t s = 0; s < subs; s++)
            items[s] = (unsigned)f->lut[s][0][blk[f->b[s][0]]] | f->lut[s][1][blk[f->b[s][1]]];
    } else {
        runs_row(blk, runs, nruns, items, subs);
    }
}

/* The two-level scales of the K-quants (docs/conversion-rules.md § 9), per block:
 * scales[s] = float32(d) * float32(sc[s] + add) (sc the runs `scr`, read as int8 when
 * sc_signed), and where dmin_off >= 0, corr[s] = -(float32(dmin) * float32(m[s])) (m the
 * runs `mr`).  d and dmin are little-endian float16 at d_off / dmin_off.  flags[i]:
 * bit 0 some scale is +-0, bit 1 d not finite, bit 2 dmin not finite.  Returns how many
 * blocks have a flag.  subs <= 64; items are bytes (the caller checks).  Per call, the runs
 * become per-item byte tables (every K-quant field has at most two parts per item) and the
 * items' float32 values one table: a block costs a few loads per item. */
HK_API size_t hk_dsc_scales(const uint8_t *src, hk_stride ss, size_t n, size_t subs, size_t d_off,
                            const int32_t *scr, size_t nscr, int sc_signed, int add, ptrdiff_t dmin_off,
                            const int32_t *mr, size_t nmr, float *scales, float *corr, uint8_t *flags) {
    unsigned sc[64], m[64];
    float vsc[256], vm[256];
    field_luts *t = malloc(2 * sizeof *t); /* 66 KB: off the stack (threads' stacks can be small) */
    const field_luts *ps = t && luts_of(scr, nscr, subs, t) ? t : NULL;
    const field_luts *pm = t && dmin_off >= 0 && luts_of(mr, nmr, subs, t + 1) ? t + 1 : NULL;
    for (unsigned v = 0; v < 256; v++) {
        vsc[v] = sc_signed ? (float)(int8_t)(uint8_t)v : (float)((int)v + add);
        vm[v] = (float)v;
    }
    size_t count = 0;
    for (size_t i = 0; i < n; i++, src += ss, scales += subs) {
        unsigned hd = (unsigned)src[d_off] | (unsigned)src[d_off + 1] << 8;
        float d = half_to_float(hd);
        uint8_t fl = (hd & 0x7C00u) == 0x7C00u ? 2 : 0;
        field_row(src, ps, scr, nscr, sc, subs);
        unsigned zero = 0;
        for (size_t s = 0; s < subs; s++) {
            float x = d * vsc[sc[s] & 255u];
            scales[s] = x;
            zero |= x == 0.0f;
        }
        fl |= (uint8_t)zero;
        if (dmin_off >= 0) {
            unsigned hm = (unsigned)src[dmin_off] | (unsigned)src[dmin_off + 1] << 8;
            float dm = half_to_float(hm);
            fl |= (hm & 0x7C00u) == 0x7C00u ? 4 : 0;
            field_row(src, pm, mr, nmr, m, subs);
            for (size_t s = 0; s < subs; s++) corr[s] = -(dm * vm[m[s] & 255u]);
            corr += subs;
        }
        flags[i] = fl;
        count += fl != 0;
    }
    free(t);
    return count;
}

/* Q6_K code fields (ggml's block_q6_K: ql[128], qh[64] at 128; docs/format-notes.md § 1.4):
 * per half h of 128 elements and l < 32, with a = ql[64h + l], b = ql[64h + 32 + l],
 * q = qh[32h + l], the 6-bit values of elements 128h + l, +32, +64, +96 are
 *   a & 15 | (q & 3) << 4,  b & 15 | (q >> 2 & 3) << 4,  a >> 4 | (q >> 4 & 3) << 4,
 *   b >> 4 | (q >> 6 & 3) << 4;
 * the Hurray int8 code is that value - 32.  Eight elements per 64-bit word. */
#define B03 0x0303030303030303ULL
#define B30 0x3030303030303030ULL
#define B3F 0x3F3F3F3F3F3F3F3FULL
#define B20 0x2020202020202020ULL

/* Bytes 0..63 minus 32 as int8: flip bit 5, then set bits 6-7 where it became 1. */
static inline uint64_t minus32(uint64_t x) {
    uint64_t t = x ^ B20;
    return t | ((t >> 5 & BYTE_LSB) * 0xC0u);
}

HK_API void hk_q6k_codes(const uint8_t *src, hk_stride ss, size_t n, uint8_t *dst, hk_stride ds) {
    for (size_t r = 0; r < n; r++) {
        const uint8_t *b = src + (hk_stride)r * ss;
        uint8_t *o = dst + (hk_stride)r * ds;
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = b + 64 * h, *qh = b + 128 + 32 * h;
            uint8_t *oo = o + 128 * h;
            for (int l = 0; l < 32; l += 8) {
                uint64_t a = ld64(ql + l), c = ld64(ql + 32 + l), q = ld64(qh + l);
                st64(oo + l, minus32((a & LO4_8) | (q << 4 & B30)));
                st64(oo + 32 + l, minus32((c & LO4_8) | (q << 2 & B30)));
                st64(oo + 64 + l, minus32((a >> 4 & LO4_8) | (q & B30)));
                st64(oo + 96 + l, minus32((c >> 4 & LO4_8) | (q >> 2 & B30)));
            }
        }
    }
}

/* The inverse: OR the codes' fields into the blocks' ql and qh (a code's value is
 * (code + 32) & 63, as for any byte).  Returns how many rows hold a code outside
 * -32..31 (bits 5-7 of its byte not all equal). */
HK_API size_t hk_q6k_pack(const uint8_t *src, hk_stride ss, size_t n, uint8_t *dst, hk_stride ds) {
    size_t bad_rows = 0;
    for (size_t r = 0; r < n; r++) {
        const uint8_t *c = src + (hk_stride)r * ss;
        uint8_t *b = dst + (hk_stride)r * ds;
        uint64_t bad = 0;
        for (int h = 0; h < 2; h++) {
            uint8_t *ql = b + 64 * h, *qh = b + 128 + 32 * h;
            const uint8_t *cc = c + 128 * h;
            for (int l = 0; l < 32; l += 8) {
                uint64_t x1 = ld64(cc + l), x2 = ld64(cc + 32 + l), x3 = ld64(cc + 64 + l), x4 = ld64(cc + 96 + l);
                bad |= (x1 ^ x1 << 1) | (x2 ^ x2 << 1) | (x3 ^ x3 << 1) | (x4 ^ x4 << 1);
                uint64_t r1 = (x1 ^ B20) & B3F, r2 = (x2 ^ B20) & B3F, r3 = (x3 ^ B20) & B3F, r4 = (x4 ^ B20) & B3F;
                st64(ql + l, ld64(ql + l) | (r1 & LO4_8) | (r3 << 4 & HI4_8));
                st64(ql + 32 + l, ld64(ql + 32 + l) | (r2 & LO4_8) | (r4 << 4 & HI4_8));
                st64(qh + l, ld64(qh + l) | (r1 >> 4 & B03) | (r2 >> 2 & (B03 << 2)) | (r3 & B30) | (r4 << 2 & (B03 << 6)));
            }
        }
        bad_rows += (bad & 0xC0C0C0C0C0C0C0C0ULL) != 0;
    }
    return bad_rows;
}

/* Q5_K's high bits as a Hurray uint2 plane (docs/conversion-rules.md § 11): element e's bit is
 * bit e / 32 of qh[e % 32] (block_q5_K.qh at qh_off); plane byte k holds elements 4k..4k+3 at
 * bits 0, 2, 4, 6.  For bit j and the four bytes l0..l0+3 (a little-endian uint32 w),
 * x = (w >> j) & 0x01010101 and the low byte of x | x >> 6 | x >> 12 | x >> 18 is that byte. */
HK_API void hk_q5_k_plane(const uint8_t *src, hk_stride ss, size_t n, size_t qh_off, uint8_t *dst, hk_stride ds) {
    for (size_t r = 0; r < n; r++) {
        const uint8_t *qh = src + (hk_stride)r * ss + qh_off;
        uint8_t *o = dst + (hk_stride)r * ds;
        for (int m = 0; m < 8; m++) {
            uint32_t w = (uint32_t)qh[4 * m] | (uint32_t)qh[4 * m + 1] << 8 | (uint32_t)qh[4 * m + 2] << 16 |
                         (uint32_t)qh[4 * m + 3] << 24;
            for (int j = 0; j < 8; j++) {
                uint32_t x = (w >> j) & 0x01010101u;
                o[8 * j + m] = (uint8_t)(x | x >> 6 | x >> 12 | x >> 18);
            }
        }
    }
}

/* Codes lo + 16*hi of k elements per row from a uint4 plane (element 2i low nibble of byte
 * i) and a uint2 plane (element 4i + t at bits 2t of byte i): one byte per element.  Four
 * elements at a time, by two tables made per call: a lo byte's two codes (16 bits) and a hi
 * byte's four crumbs, each shifted to bit 4 of its byte (32 bits). */
HK_API void hk_q5_k_join(const uint8_t *lo, hk_stride ls, const uint8_t *hi, hk_stride hs, size_t n, size_t k,
                         uint8_t *dst, hk_stride ds) {
    uint16_t lo_t[256];
    uint32_t hi_t[256];
    for (uint32_t v = 0; v < 256; v++) {
        lo_t[v] = (uint16_t)((v & 15) | (v >> 4) << 8);
        hi_t[v] = ((v & 3) | (v >> 2 & 3) << 8 | (v >> 4 & 3) << 16 | (v >> 6) << 24) << 4;
    }
    for (size_t r = 0; r < n; r++) {
        const uint8_t *a = lo + (hk_stride)r * ls, *b = hi + (hk_stride)r * hs;
        uint8_t *o = dst + (hk_stride)r * ds;
        size_t g = 0;
        for (; g + 4 <= k; g += 4) {
            uint32_t v = ((uint32_t)lo_t[a[g / 2]] | (uint32_t)lo_t[a[g / 2 + 1]] << 16) | hi_t[b[g / 4]];
            o[g] = (uint8_t)v, o[g + 1] = (uint8_t)(v >> 8), o[g + 2] = (uint8_t)(v >> 16), o[g + 3] = (uint8_t)(v >> 24);
        }
        for (; g < k; g++)
            o[g] = (uint8_t)((a[g / 2] >> (4 * (g & 1)) & 15) | (b[g / 4] >> (2 * (g & 3)) & 3) << 4);
    }
}

/* float -> IEEE half bits, round to nearest even (numpy's astype(float16)). */
static uint16_t float_to_half(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u, mag = x & 0x7FFFFFFFu;
    if (mag >= 0x7F800000u) /* inf or NaN */
        return (uint16_t)(sign | 0x7C00u | (mag > 0x7F800000u ? 0x200u | (mag >> 13 & 0x3FFu) : 0));
    if (mag >= 0x477FF000u) /* rounds to >= 65520: inf */
        return (uint16_t)(sign | 0x7C00u);
    if (mag < 0x38800000u) { /* below the smallest normal half: subnormal or zero */
        if (mag < 0x33000000u) /* < 2^-25: rounds to 0 (2^-25 exactly is a tie to even: 0) */
            return (uint16_t)sign;
        /* value = m24·2^(e−150); in units of the half subnormal step 2^-24: m24·2^(e−126) */
        uint32_t e = mag >> 23, m24 = (mag & 0x7FFFFFu) | 0x800000u, shift = 126 - e; /* 14..24 */
        uint32_t q = m24 >> shift, rest = m24 & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rest > half || (rest == half && (q & 1u)))
            q++;
        return (uint16_t)(sign | q);
    }
    uint32_t r = mag - 0x38000000u; /* rebias 127 -> 15 */
    uint32_t q = r >> 13, rest = r & 0x1FFFu;
    if (rest > 0x1000u || (rest == 0x1000u && (q & 1u)))
        q++;
    return (uint16_t)(sign | q);
}

/* numpy's rint: nearest integer, ties to even, the sign of zero kept, NaN/inf/large as they are
 * (adding and removing 2^23 rounds in the default rounding mode; no libm needed). */
static float rint_even(float q) {
    float a = fabsf(q);
    if (!(a < 8388608.0f))
        return q;
    return copysignf((a + 8388608.0f) - 8388608.0f, q);
}

/* The first candidate of the derived record's factorization (conversions/gguf_expanded.py
 * _factor, numpy twin: its first round). Per row r not marked in `skip`: t (n, subs) float32
 * (the target divided by post), tg (n, subs) the target, z (n, subs) the zero sub-blocks (or
 * NULL). The anchor is the first sub-block of largest |t| among the non-zero ones; d = half(t_a
 * / v0) must be nonzero, finite and float(d)·v0 == t_a; then each non-zero sub-block's raw value
 * is clip(rint((t/d − add)/mul)) and rule(d, raw) = (d·(add + raw·mul))·post must give tg back
 * as bits (zero sub-blocks take zraw; without one (has_zraw 0) a row with a zero sub-block
 * fails). Writes per row d's half bits, the raw values (float32) and ok. */
HK_API void hk_factor_first(const float *t, const float *tg, const uint8_t *z, size_t n, size_t subs, float v0,
                            float add, float mul, float post, float rmin, float rmax, float zraw, int has_zraw,
                            const uint8_t *skip, uint16_t *d_out, float *raw_out, uint8_t *ok_out) {
    for (size_t r = 0; r < n; r++) {
        const float *tr = t + r * subs, *gr = tg + r * subs;
        const uint8_t *zr = z ? z + r * subs : NULL;
        float *rr = raw_out + r * subs;
        ok_out[r] = 0;
        if (skip[r])
            continue;
        size_t a = 0;
        float best = -1.0f;
        for (size_t j = 0; j < subs; j++) {
            float v = (zr && zr[j]) ? 0.0f : fabsf(tr[j]);
            if (v > best)
                best = v, a = j;
        }
        float ta = tr[a], q0 = ta / v0;
        uint16_t h = float_to_half(q0);
        d_out[r] = h;
        float d = half_to_float(h);
        if ((h & 0x7FFFu) == 0 || (h & 0x7C00u) == 0x7C00u || d * v0 != ta)
            continue;
        int good = 1;
        for (size_t j = 0; j < subs; j++) {
            if (zr && zr[j]) {
                rr[j] = zraw;
                if (!has_zraw)
                    good = 0;
                continue;
            }
            float q = tr[j] / d;
            if (add != 0.0f)
                q -= add;
            if (mul != 1.0f)
                q /= mul;
            q = rint_even(q);
            if (q < rmin)
                q = rmin;
            else if (q > rmax)
                q = rmax;
            rr[j] = q;
            float f = q;
            if (mul != 1.0f)
                f = f * mul;
            if (add != 0.0f)
                f = add + f;
            float s = d * f;
            if (post != 1.0f)
                s = s * post;
            uint32_t sb, gb;
            memcpy(&sb, &s, 4), memcpy(&gb, gr + j, 4);
            if (sb != gb)
                good = 0;
        }
        ok_out[r] = (uint8_t)good;
    }
}

/* One row's raw values at the half `d` (hk_factor_first's loop, raw as int16): nonzero when a
 * non-zero sub-block's rule(d, raw) is not tg as bits, or its quotient is NaN. */
static uint32_t factor_tail(const float *tr, const float *gr, const uint8_t *zr, size_t subs, float d, float add,
                            float mul, float post, float rmin, float rmax, int16_t zraw, int16_t *rr) {
    for (size_t j = 0; j < subs; j++) {
        if (zr[j]) {
            rr[j] = zraw;
            continue;
        }
        float q = tr[j] / d;
        if (add != 0.0f)
            q -= add;
        if (mul != 1.0f)
            q /= mul;
        if (q != q) /* (NaN: not an int16; the caller's rounds decide) */
            return 1;
        q = rint_even(q);
        if (q < rmin)
            q = rmin;
        else if (q > rmax)
            q = rmax;
        rr[j] = (int16_t)q;
        float f = q;
        if (mul != 1.0f)
            f = f * mul;
        if (add != 0.0f)
            f = add + f;
        float s = d * f;
        if (post != 1.0f)
            s = s * post;
        uint32_t sb, gb;
        memcpy(&sb, &s, 4), memcpy(&gb, gr + j, 4);
        if (sb != gb)
            return 1;
    }
    return 0;
}

/* The derived record's factorization when every row takes the first candidate (gguf_expanded.py
 * _all_first; its numpy twin is _factor's rounds): as hk_factor_first on every row, with t = tg /
 * post computed here (one IEEE division, as numpy's; none when post is 1) and the raw values
 * written as int16; a row of zero sub-blocks only takes the `empty` d bits and raw value. Stops at
 * the first row that does not factor at the first candidate (or whose quotient is NaN) and returns
 * its index; n: every row factored. At most 64 sub-blocks a row (the caller checks). */
HK_API size_t hk_factor_rows(const float *tg, const uint8_t *z, size_t n, size_t subs, float v0, float add, float mul,
                             float post, float rmin, float rmax, float zraw, int has_zraw, unsigned empty_d,
                             int empty_raw, uint16_t *d_out, int16_t *raw_out) {
    float tr[64];
    for (size_t r = 0; r < n; r++) {
        const float *gr = tg + r * subs;
        const uint8_t *zr = z + r * subs;
        int16_t *rr = raw_out + r * subs;
        size_t a = 0, zeros = 0;
        float best = -1.0f;
        for (size_t j = 0; j < subs; j++) {
            tr[j] = post != 1.0f ? gr[j] / post : gr[j];
            float v = zr[j] ? 0.0f : fabsf(tr[j]);
            zeros += zr[j] != 0;
            if (v > best)
                best = v, a = j;
        }
        if (zeros == subs) {
            d_out[r] = (uint16_t)empty_d;
            for (size_t j = 0; j < subs; j++) rr[j] = (int16_t)empty_raw;
            continue;
        }
        if (zeros && !has_zraw)
            return r;
        float ta = tr[a];
        uint16_t h = float_to_half(ta / v0);
        float d = half_to_float(h);
        if ((h & 0x7FFFu) == 0 || (h & 0x7C00u) == 0x7C00u || d * v0 != ta)
            return r;
        d_out[r] = h;
        if (factor_tail(tr, gr, zr, subs, d, add, mul, post, rmin, rmax, (int16_t)zraw, rr))
            return r;
    }
    return n;
}

/* ---------------------------------------------------------------------------
 * The shared dequantizer's compiled path (hurray_interop/dequant.py): per-block affine and
 * MXFP tensors along the last axis, alone or as the members of a sealed overlay `add`
 * evaluated in float32, written into a float32 window.  Element g of the row-major order
 * belongs to block g / block of every member (the caller checks that rows hold whole
 * blocks).  Per element, in this order (numpy's operations, one IEEE rounding each, no
 * contraction: C99 mode):
 *   integer codes:  v = (float)(code - zero)          (code - zero exact in 64 bits)
 *   table codes:    v = table[code]                   (float codes, code books; no zero)
 *   member value:   w = v * scale                     (scale from its table / bits)
 *   first member:   out = w;   later members: out = out + w
 * A constant member (strides all 0) has one code, element 0, for every element.
 * Scales: kind 1 float16 and 4 float8_e8m0 through the caller's value table (`stable`),
 * 2 bfloat16 (the high half of a float32), 3 float32. */
typedef struct {
    const uint8_t *codes;  /* element 0's byte (byte_offset applied) */
    const void *scale;     /* one scale per block */
    const int32_t *zero;   /* one zero point per block, or NULL */
    const float *table;    /* code -> value (2^bits entries), or NULL: integer codes */
    const float *stable;   /* scale bits -> value for kinds 1 and 4 */
    int64_t block;         /* elements per block */
    int32_t bits;          /* 1, 2, 4 or 8 */
    int32_t is_signed;     /* integer codes are two's complement of `bits` bits */
    int32_t scale_kind;
    int32_t constant;
} hk_dq_member;

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("O3")  /* the loops below vectorize (the file is built at -O2) */
#endif

static inline float dq_scale(const hk_dq_member *m, size_t b) {
    switch (m->scale_kind) {
    case 1: return m->stable[((const uint16_t *)m->scale)[b]];
    case 2: {
        uint32_t u = (uint32_t)((const uint16_t *)m->scale)[b] << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    case 3: return ((const float *)m->scale)[b];
    default: return m->stable[((const uint8_t *)m->scale)[b]];
    }
}

/* Codes of elements g .. g+n-1 as bytes: unsigned codes as they are, signed ones
 * sign-extended to int8 (the same bytes read as int8_t). */
static void dq_codes(const hk_dq_member *m, size_t g, size_t n, uint8_t *restrict c) {
    const uint8_t *p = m->codes;
    unsigned bits = (unsigned)m->bits;
    size_t i = 0;
    if (bits == 8) {
        memcpy(c, p + g, n);
        return;
    }
    unsigned per = 8u / bits, mask = (1u << bits) - 1u;
    for (; i < n && (g + i) % per; i++) {  /* to a byte boundary */
        size_t bit = (g + i) * bits;
        c[i] = (uint8_t)(p[bit >> 3] >> (bit & 7u) & mask);
    }
    const uint8_t *q = p + (g + i) / per;
    size_t whole = (n - i) / per;
#if defined(HK_SSE2)
    if (bits == 4) {
        const __m128i lo = _mm_set1_epi8(0x0F);
        size_t k = 0;
        for (; k + 16 <= whole; k += 16) {
            __m128i v = _mm_loadu_si128((const __m128i *)(q + k));
            __m128i a = _mm_and_si128(v, lo), b = _mm_and_si128(_mm_srli_epi16(v, 4), lo);
            _mm_storeu_si128((__m128i *)(c + i + 2 * k), _mm_unpacklo_epi8(a, b));
            _mm_storeu_si128((__m128i *)(c + i + 2 * k + 16), _mm_unpackhi_epi8(a, b));
        }
        q += k, i += 2 * k, whole -= k;
    } else if (bits == 2) {
        const __m128i lo = _mm_set1_epi8(0x03);
        size_t k = 0;
        for (; k + 16 <= whole; k += 16) {
            __m128i v = _mm_loadu_si128((const __m128i *)(q + k));
            __m128i a0 = _mm_and_si128(v, lo), a1 = _mm_and_si128(_mm_srli_epi16(v, 2), lo);
            __m128i a2 = _mm_and_si128(_mm_srli_epi16(v, 4), lo), a3 = _mm_and_si128(_mm_srli_epi16(v, 6), lo);
            __m128i p01l = _mm_unpacklo_epi8(a0, a1), p01h = _mm_unpackhi_epi8(a0, a1);
            __m128i p23l = _mm_unpacklo_epi8(a2, a3), p23h = _mm_unpackhi_epi8(a2, a3);
            uint8_t *o = c + i + 4 * k;
            _mm_storeu_si128((__m128i *)o, _mm_unpacklo_epi16(p01l, p23l));
            _mm_storeu_si128((__m128i *)(o + 16), _mm_unpackhi_epi16(p01l, p23l));
            _mm_storeu_si128((__m128i *)(o + 32), _mm_unpacklo_epi16(p01h, p23h));
            _mm_storeu_si128((__m128i *)(o + 48), _mm_unpackhi_epi16(p01h, p23h));
        }
        q += k, i += 4 * k, whole -= k;
    }
#endif
    for (size_t k = 0; k < whole; k++, i += per) {
        unsigned b = q[k];
        for (unsigned j = 0; j < per; j++)
            c[i + j] = (uint8_t)(b >> (j * bits) & mask);
    }
    for (; i < n; i++) {
        size_t bit = (g + i) * bits;
        c[i] = (uint8_t)(p[bit >> 3] >> (bit & 7u) & mask);
    }
    if (m->is_signed && bits < 8) {  /* two's complement of `bits` bits -> int8 */
        uint8_t sign = (uint8_t)(1u << (bits - 1));
        for (size_t k = 0; k < n; k++)
            c[k] = (uint8_t)((c[k] ^ sign) - sign);
    }
}

/* x + y and v * s as numpy computes them, NaN payloads included: where both operands are
 * NaN, x86 returns the first one (quieted), but a compiler may swap the operands of a
 * commutative operation -- so a NaN first operand is returned explicitly. */
static inline float dq_quiet(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    u |= 0x00400000u;
    memcpy(&x, &u, 4);
    return x;
}
static inline float dq_add(float x, float y) { return x != x ? dq_quiet(x) : x + y; }
static inline float dq_mul(float v, float s) { return v != v ? dq_quiet(v) : v * s; }
#if defined(HK_SSE2)
static inline __m128 dq_add4(__m128 x, __m128 y) {
    __m128 nan = _mm_cmpunord_ps(x, x);
    __m128 xq = _mm_or_ps(x, _mm_castsi128_ps(_mm_set1_epi32(0x00400000)));
    return _mm_or_ps(_mm_and_ps(nan, xq), _mm_andnot_ps(nan, _mm_add_ps(x, y)));
}
#endif

/* o[0 .. n) (=, or `add`: +=) v * s over one block's codes c (v: the code's value). */
static inline void dq_block(const hk_dq_member *m, const uint8_t *restrict c, size_t n, float s, int32_t z,
                            int add, float *restrict o) {
    if (m->table) {
        const float *t = m->table;
        if (add) {
            for (size_t i = 0; i < n; i++) o[i] = dq_add(o[i], dq_mul(t[c[i]], s));
        } else if (s == s) {  /* a NaN product then has one NaN operand: either order gives it */
            for (size_t i = 0; i < n; i++) o[i] = t[c[i]] * s;
        } else {
            for (size_t i = 0; i < n; i++) o[i] = dq_mul(t[c[i]], s);
        }
        return;
    }
    if (z < -(1 << 30) || z > (1 << 30)) {  /* code - z beyond int32: 64-bit differences */
        for (size_t i = 0; i < n; i++) {
            int64_t q = m->is_signed ? (int64_t)(int8_t)c[i] : (int64_t)c[i];
            float w = (float)(q - z) * s;
            o[i] = add ? dq_add(o[i], w) : w;
        }
        return;
    }
    const int8_t *sc = (const int8_t *)c;
#if defined(HK_SSE2)
    size_t i = 0;
    const __m128i zero = _mm_setzero_si128(), zv = _mm_set1_epi32(z);
    const __m128 sv = _mm_set1_ps(s);
    for (; i + 16 <= n; i += 16) {  /* 16 codes -> 4 x 4 int32 -> float (same roundings) */
        __m128i v = _mm_loadu_si128((const __m128i *)(c + i)), w16[2], w32[4];
        if (m->is_signed) {
            w16[0] = _mm_srai_epi16(_mm_unpacklo_epi8(v, v), 8);
            w16[1] = _mm_srai_epi16(_mm_unpackhi_epi8(v, v), 8);
            for (int h = 0; h < 2; h++) {
                w32[2 * h] = _mm_srai_epi32(_mm_unpacklo_epi16(w16[h], w16[h]), 16);
                w32[2 * h + 1] = _mm_srai_epi32(_mm_unpackhi_epi16(w16[h], w16[h]), 16);
            }
        } else {
            w16[0] = _mm_unpacklo_epi8(v, zero), w16[1] = _mm_unpackhi_epi8(v, zero);
            for (int h = 0; h < 2; h++) {
                w32[2 * h] = _mm_unpacklo_epi16(w16[h], zero);
                w32[2 * h + 1] = _mm_unpackhi_epi16(w16[h], zero);
            }
        }
        for (int k = 0; k < 4; k++) {
            __m128 x = _mm_mul_ps(_mm_cvtepi32_ps(_mm_sub_epi32(w32[k], zv)), sv);
            if (add)
                x = dq_add4(_mm_loadu_ps(o + i + 4 * k), x);
            _mm_storeu_ps(o + i + 4 * k, x);
        }
    }
    c += i, sc += i, o += i, n -= i;
#endif
    if (m->is_signed) {
        if (add)
            for (size_t i = 0; i < n; i++) o[i] = dq_add(o[i], (float)((int32_t)sc[i] - z) * s);
        else
            for (size_t i = 0; i < n; i++) o[i] = (float)((int32_t)sc[i] - z) * s;
    } else {
        if (add)
            for (size_t i = 0; i < n; i++) o[i] = dq_add(o[i], (float)((int32_t)c[i] - z) * s);
        else
            for (size_t i = 0; i < n; i++) o[i] = (float)((int32_t)c[i] - z) * s;
    }
}

#define HK_DQ_CHUNK 4096
#define HK_DQ_FUSED 4

/* A member's value at one element as the generic path computes it (dq_block of one code). */
static inline float dq_one(const hk_dq_member *m, uint8_t c, float s, int32_t z) {
    float w;
    dq_block(m, &c, 1, s, z, 0, &w);
    return w;
}

#if defined(HK_SSE2)
/* Four int32 lanes of 16 codes (k: which four), sign-extended or zero-extended. */
static inline __m128i dq_lanes(__m128i v, int is_signed, int k) {
    __m128i w16, zero = _mm_setzero_si128();
    if (is_signed) {
        w16 = k < 2 ? _mm_srai_epi16(_mm_unpacklo_epi8(v, v), 8) : _mm_srai_epi16(_mm_unpackhi_epi8(v, v), 8);
        return k & 1 ? _mm_srai_epi32(_mm_unpackhi_epi16(w16, w16), 16) : _mm_srai_epi32(_mm_unpacklo_epi16(w16, w16), 16);
    }
    w16 = k < 2 ? _mm_unpacklo_epi8(v, zero) : _mm_unpackhi_epi8(v, zero);
    return k & 1 ? _mm_unpackhi_epi16(w16, zero) : _mm_unpacklo_epi16(w16, zero);
}
#endif

#if defined(HK_SSE2)
/* dq_fused's elements i .. stop in groups of 16 (returns where it stopped); `tame`: no value
 * or sum can be NaN, so plain additions give numpy's bits. */
static inline size_t dq_fused16(const hk_dq_member *ms, size_t nm, uint8_t (*c)[HK_DQ_CHUNK], size_t c0, size_t i,
                                size_t stop, const float *s, const int32_t *z, const float *w, int tame,
                                float *restrict o) {
    for (; i + 16 <= stop; i += 16) {
        __m128 x[4];
        for (size_t j = 0; j < nm; j++) {
            __m128 y[4];
            if (ms[j].constant) {
                y[0] = y[1] = y[2] = y[3] = _mm_set1_ps(w[j]);
            } else {
                __m128i v = _mm_loadu_si128((const __m128i *)(c[j] + (i - c0)));
                __m128i zv = _mm_set1_epi32(z[j]);
                __m128 sv = _mm_set1_ps(s[j]);
                for (int k = 0; k < 4; k++)
                    y[k] = _mm_mul_ps(_mm_cvtepi32_ps(_mm_sub_epi32(dq_lanes(v, ms[j].is_signed, k), zv)), sv);
            }
            for (int k = 0; k < 4; k++)
                x[k] = !j ? y[k] : tame ? _mm_add_ps(x[k], y[k]) : dq_add4(x[k], y[k]);
        }
        for (int k = 0; k < 4; k++)
            _mm_storeu_ps(o + (i - c0) + 4 * k, x[k]);
    }
    return i;
}
#endif

#if defined(HK_AVX2)
/* dq_fused16 with eight lanes a vector: the same operations on the same values in the same
 * order (integer codes widened, minus the zero point, converted, times the scale; members
 * added in order), so the same bits; no FMA (not in the target, and C99 mode contracts
 * nothing).  Only integer-code or constant members come here (dq_fusable).  `tame` 2: as 1,
 * and every zero point is 0 (the subtraction is left out). */
__attribute__((target("avx2"))) static inline __m256 dq_add8(__m256 x, __m256 y) {
    __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    __m256 xq = _mm256_or_ps(x, _mm256_castsi256_ps(_mm256_set1_epi32(0x00400000)));
    return _mm256_blendv_ps(_mm256_add_ps(x, y), xq, nan);
}

__attribute__((target("avx2"))) static inline size_t dq_fused16_avx2(const hk_dq_member *ms, size_t nm,
                                                                    uint8_t (*c)[HK_DQ_CHUNK], size_t c0, size_t i,
                                                                    size_t stop, const float *s, const int32_t *z,
                                                                    const float *w, int tame, float *restrict o) {
    for (; i + 16 <= stop; i += 16) {
        __m256 x0 = _mm256_setzero_ps(), x1 = x0;
        for (size_t j = 0; j < nm; j++) {
            __m256 y0, y1;
            if (ms[j].constant) {
                y0 = y1 = _mm256_set1_ps(w[j]);
            } else {
                __m128i v = _mm_loadu_si128((const __m128i *)(c[j] + (i - c0)));
                __m256i a, b, zv = _mm256_set1_epi32(z[j]);
                if (ms[j].is_signed)
                    a = _mm256_cvtepi8_epi32(v), b = _mm256_cvtepi8_epi32(_mm_srli_si128(v, 8));
                else
                    a = _mm256_cvtepu8_epi32(v), b = _mm256_cvtepu8_epi32(_mm_srli_si128(v, 8));
                __m256 sv = _mm256_set1_ps(s[j]);
                if (tame != 2)  /* 2: every zero point is 0 */
                    a = _mm256_sub_epi32(a, zv), b = _mm256_sub_epi32(b, zv);
                y0 = _mm256_mul_ps(_mm256_cvtepi32_ps(a), sv);
                y1 = _mm256_mul_ps(_mm256_cvtepi32_ps(b), sv);
            }
            if (!j)
                x0 = y0, x1 = y1;
            else if (tame)
                x0 = _mm256_add_ps(x0, y0), x1 = _mm256_add_ps(x1, y1);
            else
                x0 = dq_add8(x0, y0), x1 = dq_add8(x1, y1);
        }
        _mm256_storeu_ps(o + (i - c0), x0);
        _mm256_storeu_ps(o + (i - c0) + 8, x1);
    }
    return i;
}
#endif

/* Block by block over every member at once (members of one block size, integer codes
 * with zero points within int32 range, or constant): per element base, then + each
 * member, in registers -- the generic path's operations in its order, stored once. */
/* Scales of blocks b0 .. b0+nb-1 of a member as float32 (the switch on the kind hoisted out
 * of the loop, which then vectorizes or is one table load per block). */
static void dq_scales(const hk_dq_member *m, size_t b0, size_t nb, float *restrict out) {
    switch (m->scale_kind) {
    case 1: {
        const uint16_t *p = (const uint16_t *)m->scale + b0;
        for (size_t k = 0; k < nb; k++) out[k] = m->stable[p[k]];
        return;
    }
    case 2: {
        const uint16_t *p = (const uint16_t *)m->scale + b0;
        uint32_t *u = (uint32_t *)(void *)out;
        for (size_t k = 0; k < nb; k++) u[k] = (uint32_t)p[k] << 16;
        return;
    }
    case 3:
        memcpy(out, (const float *)m->scale + b0, nb * sizeof(float));
        return;
    default: {
        const uint8_t *p = (const uint8_t *)m->scale + b0;
        for (size_t k = 0; k < nb; k++) out[k] = m->stable[p[k]];
    }
    }
}

/* Blocks per chunk at most (the smallest block size is 2), plus one straddling block. */
#define HK_DQ_CHUNK_BLOCKS (HK_DQ_CHUNK / 2 + 1)

/* dq_fused's blocks from c0 to end, each block's scales from `sb` (from block b0); `easy`
 * (a constant where it is inlined, so each case is a loop of its own): no zero points,
 * integer codes, every scale tame -- the per-block checks then hold for the whole chunk
 * (|code| <= 255: every value and sum finite), and a constant member's value is cq * s. */
static inline __attribute__((always_inline)) void dq_fused_blocks(const hk_dq_member *ms, size_t nm, size_t c0,
                                                                  size_t end, uint8_t (*c)[HK_DQ_CHUNK],
                                                                  float *restrict o, int avx2, int easy,
                                                                  float (*sb)[HK_DQ_CHUNK_BLOCKS], const float *cq) {
    size_t K = (size_t)ms[0].block, b0 = c0 / K;
    float s[HK_DQ_FUSED], w[HK_DQ_FUSED];
    int32_t z[HK_DQ_FUSED] = {0};
    for (size_t g = c0, b = b0; g < end; b++) {  /* b = g / K without a division per block */
        size_t stop = (b + 1) * K < end ? (b + 1) * K : end, i = g;
        int wide = 0, tame = 1;
        for (size_t j = 0; j < nm; j++) {
            s[j] = sb[j][b - b0];
            if (easy) {
                w[j] = cq[j] * s[j];  /* a constant member's value: (float)(q - 0) * s */
                continue;
            }
            z[j] = ms[j].zero ? ms[j].zero[b] : 0;
            wide |= z[j] < -(1 << 30) || z[j] > (1 << 30);  /* code - z beyond int32: dq_one */
            tame &= fabsf(s[j]) < 0x1p90f;  /* |code - z| < 2^32: every value and sum finite */
            if (ms[j].constant) {  /* dq_one of its one code, inline (once per block) */
                uint8_t q = c[j][0];
                w[j] = ms[j].table ? dq_mul(ms[j].table[q], s[j])
                                   : (float)((ms[j].is_signed ? (int64_t)(int8_t)q : (int64_t)q) - z[j]) * s[j];
                tame &= fabsf(w[j]) < 0x1p122f;
            }
        }
#if defined(HK_AVX2)
        if (avx2 && easy)  /* tame 2: no subtraction of the zero points (all 0) */
            i = dq_fused16_avx2(ms, nm, c, c0, i, stop, s, z, w, 2, o);
        else if (avx2 && !wide)
            i = tame ? dq_fused16_avx2(ms, nm, c, c0, i, stop, s, z, w, 1, o)
                     : dq_fused16_avx2(ms, nm, c, c0, i, stop, s, z, w, 0, o);
#endif
#if defined(HK_SSE2)
        if (!wide)
            i = tame ? dq_fused16(ms, nm, c, c0, i, stop, s, z, w, 1, o) : dq_fused16(ms, nm, c, c0, i, stop, s, z, w, 0, o);
#endif
        for (; i < stop; i++) {
            float x = 0.0f;
            for (size_t j = 0; j < nm; j++) {
                float y = ms[j].constant ? w[j] : dq_one(ms + j, c[j][i - c0], s[j], z[j]);
                x = j ? dq_add(x, y) : y;
            }
            o[i - c0] = x;
        }
        g = stop;
    }
}

static inline __attribute__((always_inline)) void dq_fused(const hk_dq_member *ms, size_t nm, size_t c0,
                                                           size_t end, uint8_t (*c)[HK_DQ_CHUNK], float *restrict o,
                                                           int avx2) {
    size_t K = (size_t)ms[0].block;
    size_t b0 = c0 / K, nb = (end - 1) / K - b0 + 1;
    float sb[HK_DQ_FUSED][HK_DQ_CHUNK_BLOCKS], cq[HK_DQ_FUSED];
    int easy = 1;
    for (size_t j = 0; j < nm; j++) {
        dq_scales(ms + j, b0, nb, sb[j]);
        easy &= !ms[j].zero && !ms[j].table;
    }
    for (size_t j = 0; easy && j < nm; j++) {
        int ok = 1;
        for (size_t k = 0; k < nb; k++)
            ok &= fabsf(sb[j][k]) < 0x1p90f;  /* false for NaN */
        easy &= ok;
        cq[j] = ms[j].constant ? (float)(ms[j].is_signed ? (int32_t)(int8_t)c[j][0] : (int32_t)c[j][0]) : 0.0f;
    }
    if (easy)
        dq_fused_blocks(ms, nm, c0, end, c, o, avx2, 1, sb, cq);
    else
        dq_fused_blocks(ms, nm, c0, end, c, o, avx2, 0, sb, cq);
}

/* dq_fused over one chunk, the member count a constant where it is small (the loops over
 * members unroll); `avx2`: the eight-lane loop (dq_fused_avx2 is the same code compiled for
 * AVX2, called only where the CPU has it). */
static inline __attribute__((always_inline)) void dq_fused_n(const hk_dq_member *ms, size_t nm, size_t c0,
                                                             size_t end, uint8_t (*c)[HK_DQ_CHUNK],
                                                             float *restrict o, int avx2) {
    if (nm == 1)
        dq_fused(ms, 1, c0, end, c, o, avx2);
    else if (nm == 2)
        dq_fused(ms, 2, c0, end, c, o, avx2);
    else if (nm == 3)
        dq_fused(ms, 3, c0, end, c, o, avx2);
    else
        dq_fused(ms, nm, c0, end, c, o, avx2);
}

static void dq_fused_plain(const hk_dq_member *ms, size_t nm, size_t c0, size_t end, uint8_t (*c)[HK_DQ_CHUNK],
                           float *restrict o) {
    dq_fused_n(ms, nm, c0, end, c, o, 0);
}

#if defined(HK_AVX2)
__attribute__((target("avx2"))) static void dq_fused_avx2(const hk_dq_member *ms, size_t nm, size_t c0, size_t end,
                                                          uint8_t (*c)[HK_DQ_CHUNK], float *restrict o) {
    dq_fused_n(ms, nm, c0, end, c, o, 1);
}
#endif

/* Whether the AVX2 loops run: where the CPU has AVX2, unless switched off.  mode < 0 asks,
 * 0 switches them off, 1 on (where the CPU has AVX2); returns the state after the call.  The
 * tests run both loops against each other and against numpy (kernels.dequant_avx2). */
static int dq_avx2_state = -1;

HK_API int hk_dequant_avx2(int mode) {
#if defined(HK_AVX2)
    if (dq_avx2_state < 0 || mode >= 0) {
        __builtin_cpu_init();
        dq_avx2_state = __builtin_cpu_supports("avx2") && mode != 0;
    }
    return dq_avx2_state;
#else
    (void)mode;
    return 0;
#endif
}

/* Whether dq_fused takes the members. */
static int dq_fusable(const hk_dq_member *ms, size_t nm) {
    if (nm < 1 || nm > HK_DQ_FUSED)
        return 0;
    for (size_t j = 0; j < nm; j++)
        if (ms[j].block != ms[0].block || (ms[j].table && !ms[j].constant))
            return 0;
    return 1;
}

/* out[0 .. n) = the values of elements g0 .. g0+n-1 of the overlay of the `nm` members,
 * HK_DQ_CHUNK elements at a time (every member over one chunk while it is in L1). */
static void hk_dequant(const hk_dq_member *members, size_t nm, size_t g0, size_t n, float *out) {
    uint8_t c[HK_DQ_FUSED][HK_DQ_CHUNK];
    int fused = dq_fusable(members, nm), avx2 = fused && (dq_avx2_state < 0 ? hk_dequant_avx2(-1) : dq_avx2_state);
    for (size_t c0 = g0; c0 < g0 + n; c0 += HK_DQ_CHUNK) {
        size_t end = c0 + HK_DQ_CHUNK < g0 + n ? c0 + HK_DQ_CHUNK : g0 + n;
        if (fused) {
            for (size_t j = 0; j < nm; j++) {
                if (members[j].constant)
                    dq_codes(members + j, 0, 1, c[j]);
                else
                    dq_codes(members + j, c0, end - c0, c[j]);
            }
#if defined(HK_AVX2)
            if (avx2) {
                dq_fused_avx2(members, nm, c0, end, c, out + (c0 - g0));
                continue;
            }
#endif
            dq_fused_plain(members, nm, c0, end, c, out + (c0 - g0));
            continue;
        }
        for (size_t j = 0; j < nm; j++) {
            const hk_dq_member *m = members + j;
            size_t K = (size_t)m->block;
            if (m->constant)
                dq_codes(m, 0, 1, c[0]);
            else
                dq_codes(m, c0, end - c0, c[0]);
            for (size_t g = c0; g < end;) {
                size_t b = g / K;
                size_t stop = (b + 1) * K < end ? (b + 1) * K : end;
                float s = dq_scale(m, b);
                int32_t z = m->zero ? m->zero[b] : 0;
                float *o = out + (g - g0);
                if (m->constant) {  /* one value for the block */
                    float w;
                    dq_block(m, c[0], 1, s, z, 0, &w);
                    size_t len = stop - g;
                    if (j)
                        for (size_t i = 0; i < len; i++) o[i] = dq_add(o[i], w);
                    else
                        for (size_t i = 0; i < len; i++) o[i] = w;
                } else if (stop - g == 32) {  /* the common block sizes, unrolled */
                    dq_block(m, c[0] + (g - c0), 32, s, z, j != 0, o);
                } else if (stop - g == 16) {
                    dq_block(m, c[0] + (g - c0), 16, s, z, j != 0, o);
                } else {
                    dq_block(m, c[0] + (g - c0), stop - g, s, z, j != 0, o);
                }
                g = stop;
            }
        }
    }
}

/* float32 values of n 16-bit floats (the dequantizer's plain float16 / bfloat16 tensors):
 * kind 1 float16 through `table` (numpy's own cast of every bit pattern, 64 Ki entries, so
 * numpy's bits by construction), 2 bfloat16 (the high half of a float32). */
static void dq_halves(const uint16_t *h, size_t n, int kind, const float *table, float *out) {
    if (kind == 2) {
        uint32_t *o = (uint32_t *)(void *)out;
        for (size_t i = 0; i < n; i++) o[i] = (uint32_t)h[i] << 16;
        return;
    }
    for (size_t i = 0; i < n; i++) out[i] = table[h[i]];
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif

/* The index of the first element whose float32 bits differ between a and b, or n when none
 * does; with `zero_equal`, +0 and -0 count as equal.  verify's value check runs it on every
 * window (kernels.first_diff_f32; its numpy twin gives the same index). */
HK_API size_t hk_first_diff_f32(const uint32_t *a, const uint32_t *b, size_t n, int zero_equal) {
    size_t i = 0;
#if defined(HK_SSE2)
    const __m128i zero = _mm_setzero_si128();
    for (; i + 16 <= n; i += 16) {  /* sixteen at a time: OR of XORs, then find the lane */
        __m128i x = zero;
        for (int k = 0; k < 4; k++)
            x = _mm_or_si128(x, _mm_xor_si128(_mm_loadu_si128((const __m128i *)(a + i + 4 * k)),
                                              _mm_loadu_si128((const __m128i *)(b + i + 4 * k))));
        if (_mm_movemask_epi8(_mm_cmpeq_epi32(x, zero)) != 0xFFFF)
            break;
    }
#endif
    for (; i + 8 <= n; i += 8) {  /* eight at a time */
        uint32_t x = 0;
        for (int k = 0; k < 8; k++)
            x |= a[i + k] ^ b[i + k];
        if (x)
            break;
    }
    for (; i < n; i++) {
        uint32_t x = a[i] ^ b[i];
        if (x && !(zero_equal && x == 0x80000000u && (a[i] & 0x7FFFFFFFu) == 0))
            return i;
    }
    return n;
}

/* The index of the first differing byte of a and b (n bytes each), or n: memcmp over 4 KiB
 * runs, then the run's bytes (kernels.first_diff_bytes; verify's byte comparisons). */
HK_API size_t hk_first_diff_u8(const uint8_t *a, const uint8_t *b, size_t n) {
    for (size_t i = 0; i < n; i += 4096) {
        size_t k = n - i < 4096 ? n - i : 4096;
        if (memcmp(a + i, b + i, k) != 0)
            for (size_t j = i; j < i + k; j++)
                if (a[j] != b[j])
                    return j;
    }
    return n;
}

/* A compiled evaluation (kernels.DequantPlan / HalvesPlan): a dequantization of `nm`
 * members (hk_dequant), or, with members NULL, plain 16-bit floats (dq_halves). */
typedef struct {
    const hk_dq_member *members;
    size_t nm;
    const uint16_t *halves;
    int32_t kind;
    const float *table;
} hk_plan;

static void plan_values(const hk_plan *p, size_t g, size_t n, float *out) {
    if (p->members)
        hk_dequant(p->members, p->nm, g, n, out);
    else
        dq_halves(p->halves + g, n, p->kind, p->table, out);
}

/* out[0 .. n) = the plan's values of elements g0 .. g0+n-1. */
HK_API void hk_plan_window(const hk_plan *p, size_t g0, size_t n, float *out) { plan_values(p, g0, n, out); }

typedef void (*hk_to_float)(const void *, float *, int64_t);

/* The first element of g0 .. g0+n-1 whose value (the plan's) differs in its bits from the
 * reference's (zero_equal: +0 and -0 alike), or n.  Each chunk of ours is computed into a
 * buffer that stays in L1 and compared there, so our values never travel through memory.
 * The reference is `ref[0 .. n)`, or, with ref NULL, `decode` (a ggml to_float: void (const
 * void *blocks, float *out, int64_t count)) run here over whole blocks of `src` (element g0
 * is the first of its first block; block_elems values of block_bytes bytes each, block_elems
 * <= HK_DQ_CHUNK, n a multiple of it) into a second L1 buffer: then neither side's values
 * travel through memory.  The caller bounds-checks src for the n / block_elems blocks
 * (kernels.dequant_diff_decoded); with ref, block_elems is 1. */
HK_API size_t hk_plan_diff(const hk_plan *p, size_t g0, size_t n, const float *ref, void *decode, const uint8_t *src,
                           size_t block_elems, size_t block_bytes, int zero_equal) {
    float buf[HK_DQ_CHUNK], dec[HK_DQ_CHUNK];
    hk_to_float fn = NULL;
    if (!ref)
        memcpy(&fn, &decode, sizeof fn);  /* an object pointer to a function pointer, as POSIX allows */
    size_t step = HK_DQ_CHUNK / block_elems * block_elems;
    for (size_t c0 = 0; c0 < n; c0 += step) {
        size_t len = n - c0 < step ? n - c0 : step;
        const float *r = ref ? ref + c0 : dec;
        if (!ref)
            fn(src + c0 / block_elems * block_bytes, dec, (int64_t)len);
        plan_values(p, g0 + c0, len, buf);
        size_t i = hk_first_diff_f32((const uint32_t *)(const void *)buf, (const uint32_t *)(const void *)r, len,
                                     zero_equal);
        if (i < len)
            return c0 + i;
    }
    return n;
}

/* The index of the first scale that is not finite or is +-0 -- IEEE bit patterns of `bits`
 * 16 (exponent mask `expm`: float16 0x7C00, bfloat16 0x7F80) or 32 (float32) -- or n:
 * the descriptor rules' check of every per-block scale, one pass (kernels.first_bad_scale). */
HK_API size_t hk_first_bad_scale(const void *scales, size_t n, int bits, uint32_t expm) {
    size_t i0 = 0;
#if defined(HK_SSE2)
    {  /* 64 scales a run, in vectors: a run with a bad one is searched by the loops below */
        const __m128i zero = _mm_setzero_si128();
        const __m128i e = bits == 16 ? _mm_set1_epi16((short)expm) : _mm_set1_epi32(0x7F800000);
        const __m128i m = bits == 16 ? _mm_set1_epi16(0x7FFF) : _mm_set1_epi32(0x7FFFFFFF);
        size_t per = bits == 16 ? 8 : 4;
        const __m128i *p = (const __m128i *)scales;
        for (; i0 + 64 <= n; i0 += 64, p += 64 / per) {
            __m128i bad = zero;
            for (size_t k = 0; k < 64 / per; k++) {
                __m128i v = _mm_loadu_si128(p + k);
                __m128i x = _mm_and_si128(v, e), y = _mm_and_si128(v, m);
                bad = _mm_or_si128(bad, bits == 16 ? _mm_or_si128(_mm_cmpeq_epi16(x, e), _mm_cmpeq_epi16(y, zero))
                                                   : _mm_or_si128(_mm_cmpeq_epi32(x, e), _mm_cmpeq_epi32(y, zero)));
            }
            if (_mm_movemask_epi8(bad))
                break;
        }
    }
#endif
    if (bits == 16) {
        const uint16_t *p = (const uint16_t *)scales;
        for (size_t i = i0; i < n; i += 64) {  /* 64 at a time: a flag per run, then the lane */
            size_t e = i + 64 < n ? i + 64 : n;
            unsigned bad = 0;
            for (size_t k = i; k < e; k++)
                bad |= ((p[k] & expm) == expm) | ((p[k] & 0x7FFFu) == 0);
            if (bad)
                for (size_t k = i; k < e; k++)
                    if (((p[k] & expm) == expm) || ((p[k] & 0x7FFFu) == 0))
                        return k;
        }
        return n;
    }
    const uint32_t *p = (const uint32_t *)scales;
    for (size_t i = i0; i < n; i += 64) {
        size_t e = i + 64 < n ? i + 64 : n;
        unsigned bad = 0;
        for (size_t k = i; k < e; k++)
            bad |= ((p[k] & 0x7F800000u) == 0x7F800000u) | ((p[k] & 0x7FFFFFFFu) == 0);
        if (bad)
            for (size_t k = i; k < e; k++)
                if (((p[k] & 0x7F800000u) == 0x7F800000u) || ((p[k] & 0x7FFFFFFFu) == 0))
                    return k;
    }
    return n;
}

/* compare's sums over two float32 windows a, b of n values (kernels.compare_stats): sums[0..4] =
 * Σd², Σa², Σb², Σab (float64, in four interleaved lanes added at the end) and max|d|,
 * counts[0] = the unequal pairs, counts[1] = the first of them (n: none).  A pair is equal when
 * a == b as floats (+0 == -0) or both are NaN; d = (double)a - (double)b elsewhere, 0 there.
 * max|d| is NaN when some d is NaN (one side alone NaN), as numpy's max says it. */
typedef struct { double ss[4], sa[4], sb[4], ab[4], mx; uint64_t differing, first; int nan; } hk_cmp;

static int hk_cmp_equal(float x, float y) { return x == y || (x != x && y != y); }

static void hk_cmp_scalar(hk_cmp *c, const float *a, const float *b, size_t i, size_t n) {
    for (; i < n; i++) {
        const double x = a[i], y = b[i];
        const int k = (int)(i & 3);
        c->sa[k] += x * x;
        c->sb[k] += y * y;
        c->ab[k] += x * y;
        if (hk_cmp_equal(a[i], b[i]))
            continue;
        const double d = x - y;
        if (c->first == (uint64_t)-1)
            c->first = i;
        c->differing++;
        c->ss[k] += d * d;
        if (d != d)
            c->nan = 1;
        else if (fabs(d) > c->mx)
            c->mx = fabs(d);
    }
}

#if defined(HK_SSE2)
/* Σx² of 4k floats into two float64 lanes each of lo, hi (a run equal bit for bit in a and b:
 * there Σa² = Σb² = Σab, added once; d = 0). */
static void hk_cmp_sq(const float *a, size_t n, __m128d *lo, __m128d *hi) {
    for (size_t i = 0; i < n; i += 4) {
        const __m128 v = _mm_loadu_ps(a + i);
        const __m128d x0 = _mm_cvtps_pd(v), x1 = _mm_cvtps_pd(_mm_movehl_ps(v, v));
        *lo = _mm_add_pd(*lo, _mm_mul_pd(x0, x0));
        *hi = _mm_add_pd(*hi, _mm_mul_pd(x1, x1));
    }
}

static int hk_same_bits(const float *a, const float *b, size_t n) {  /* n: a multiple of 16 */
    __m128i x = _mm_setzero_si128();
    for (size_t i = 0; i < n; i += 4)
        x = _mm_or_si128(x, _mm_xor_si128(_mm_loadu_si128((const __m128i *)(const void *)(a + i)),
                                          _mm_loadu_si128((const __m128i *)(const void *)(b + i))));
    return _mm_movemask_epi8(_mm_cmpeq_epi32(x, _mm_setzero_si128())) == 0xFFFF;
}

/* Four pairs at a time: two float64 lanes for the low pair, two for the high one; runs of 64
 * pairs equal bit for bit take the one-sum path. */
static size_t hk_cmp_sse2(hk_cmp *c, const float *a, const float *b, size_t n) {
    static const unsigned char pop[16] = {0, 1, 1, 2, 1, 2, 2, 3, 1, 2, 2, 3, 2, 3, 3, 4};
    const __m128d sign = _mm_set1_pd(-0.0);
    __m128d ss0 = _mm_setzero_pd(), ss1 = ss0, sa0 = ss0, sa1 = ss0, sb0 = ss0, sb1 = ss0, ab0 = ss0, ab1 = ss0;
    __m128d eq0 = ss0, eq1 = ss0, mx = ss0;
    int nan = 0;
    size_t i = 0;
    while (i + 4 <= n) {
        if ((i & 63) == 0 && i + 64 <= n && hk_same_bits(a + i, b + i, 64)) {
            hk_cmp_sq(a + i, 64, &eq0, &eq1);
            i += 64;
            continue;
        }
        const __m128 va = _mm_loadu_ps(a + i), vb = _mm_loadu_ps(b + i);
        const __m128 eq = _mm_or_ps(_mm_cmpeq_ps(va, vb), _mm_and_ps(_mm_cmpunord_ps(va, va), _mm_cmpunord_ps(vb, vb)));
        const int mask = _mm_movemask_ps(eq);
        const __m128d xa0 = _mm_cvtps_pd(va), xa1 = _mm_cvtps_pd(_mm_movehl_ps(va, va));
        const __m128d xb0 = _mm_cvtps_pd(vb), xb1 = _mm_cvtps_pd(_mm_movehl_ps(vb, vb));
        sa0 = _mm_add_pd(sa0, _mm_mul_pd(xa0, xa0));
        sa1 = _mm_add_pd(sa1, _mm_mul_pd(xa1, xa1));
        sb0 = _mm_add_pd(sb0, _mm_mul_pd(xb0, xb0));
        sb1 = _mm_add_pd(sb1, _mm_mul_pd(xb1, xb1));
        ab0 = _mm_add_pd(ab0, _mm_mul_pd(xa0, xb0));
        ab1 = _mm_add_pd(ab1, _mm_mul_pd(xa1, xb1));
        if (mask != 0xF) {
            if (c->first == (uint64_t)-1)
                for (int k = 0; k < 4; k++)
                    if (!(mask >> k & 1)) {
                        c->first = i + (size_t)k;
                        break;
                    }
            c->differing += 4u - pop[mask];
            const __m128d d0 = _mm_andnot_pd(_mm_castps_pd(_mm_unpacklo_ps(eq, eq)), _mm_sub_pd(xa0, xb0));
            const __m128d d1 = _mm_andnot_pd(_mm_castps_pd(_mm_unpackhi_ps(eq, eq)), _mm_sub_pd(xa1, xb1));
            ss0 = _mm_add_pd(ss0, _mm_mul_pd(d0, d0));
            ss1 = _mm_add_pd(ss1, _mm_mul_pd(d1, d1));
            nan |= _mm_movemask_pd(_mm_cmpunord_pd(d0, d1));
            mx = _mm_max_pd(mx, _mm_max_pd(_mm_andnot_pd(sign, d0), _mm_andnot_pd(sign, d1)));
        }
        i += 4;
    }
    sa0 = _mm_add_pd(sa0, eq0), sa1 = _mm_add_pd(sa1, eq1);
    sb0 = _mm_add_pd(sb0, eq0), sb1 = _mm_add_pd(sb1, eq1);
    ab0 = _mm_add_pd(ab0, eq0), ab1 = _mm_add_pd(ab1, eq1);
    double t[2];
    _mm_storeu_pd(t, ss0); c->ss[0] += t[0]; c->ss[1] += t[1];
    _mm_storeu_pd(t, ss1); c->ss[2] += t[0]; c->ss[3] += t[1];
    _mm_storeu_pd(t, sa0); c->sa[0] += t[0]; c->sa[1] += t[1];
    _mm_storeu_pd(t, sa1); c->sa[2] += t[0]; c->sa[3] += t[1];
    _mm_storeu_pd(t, sb0); c->sb[0] += t[0]; c->sb[1] += t[1];
    _mm_storeu_pd(t, sb1); c->sb[2] += t[0]; c->sb[3] += t[1];
    _mm_storeu_pd(t, ab0); c->ab[0] += t[0]; c->ab[1] += t[1];
    _mm_storeu_pd(t, ab1); c->ab[2] += t[0]; c->ab[3] += t[1];
    _mm_storeu_pd(t, mx);
    c->mx = t[0] > t[1] ? t[0] : t[1];
    c->nan |= nan != 0;
    return i;
}
#endif

HK_API void hk_compare_stats(const float *a, const float *b, size_t n, double *sums, uint64_t *counts) {
    hk_cmp c;
    memset(&c, 0, sizeof c);
    c.first = (uint64_t)-1;
    size_t i = 0;
#if defined(HK_SSE2)
    i = hk_cmp_sse2(&c, a, b, n);
#endif
    hk_cmp_scalar(&c, a, b, i, n);
    sums[0] = (c.ss[0] + c.ss[1]) + (c.ss[2] + c.ss[3]);
    sums[1] = (c.sa[0] + c.sa[1]) + (c.sa[2] + c.sa[3]);
    sums[2] = (c.sb[0] + c.sb[1]) + (c.sb[2] + c.sb[3]);
    sums[3] = (c.ab[0] + c.ab[1]) + (c.ab[2] + c.ab[3]);
    sums[4] = c.nan ? (double)NAN : c.mx;
    counts[0] = c.differing;
    counts[1] = c.first == (uint64_t)-1 ? n : c.first;
}
