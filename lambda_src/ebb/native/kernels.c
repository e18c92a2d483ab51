/* Ebb's compiled kernels: the hot loops of ISP's codec in one pass each.
 *
 * Each kernel computes exactly what its numpy fallback in ebb.sparse computes, with the
 * same float32 operations in the same order (one multiply per value; built with
 * -ffp-contract=off and no fast-math), so replicas that use either agree bit for bit.
 * Called through ctypes (ebb.native); no Python headers, no libc beyond the compiler's.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ebb.native loads a library only if this matches its KERNELS_VERSION: bump both when a
 * kernel's signature or meaning changes, so a stale build is never called. */
int ebb_kernels_version(void) { return 10; }

/* Whether a kernel may use the CPU's vector instructions (where it has a path for them);
 * the tests turn it off to check the portable path gives the same bits. Returns the old. */
static int use_simd = 1;
int ebb_set_simd(int on) {
    int was = use_simd;
    use_simd = on;
    return was;
}
int ebb_simd_enabled(void) { return use_simd; }

/* For a mask byte b: where each of its 8 entries finds its code among the next 8 carried
 * codes (0x80: nowhere, code 0; the form SSSE3's byte shuffle takes), and how many codes
 * it carries. */
static uint8_t SLOT[256][16] __attribute__((aligned(16)));
static uint8_t COUNT[256];
/* Its inverse, for encoding: which of a group's 8 entries is the row's next carried one
 * (the positions of b's set bits in order, then 0x80). */
static uint8_t PICK[256][16] __attribute__((aligned(16)));
/* At load time, before any caller (ctypes calls may run on several threads at once). */
__attribute__((constructor)) static void init_tables(void) {
    for (int b = 0; b < 256; b++) {
        int n = 0;
        for (int j = 0; j < 16; j++) SLOT[b][j] = j < 8 && (b >> j) & 1 ? (uint8_t)n++ : 0x80;
        COUNT[b] = (uint8_t)n;
        for (int j = 0; j < 16; j++) PICK[b][j] = 0x80;
        for (int j = 0, m = 0; j < 8; j++)
            if ((b >> j) & 1) PICK[b][m++] = (uint8_t)j;
    }
}

/* bfloat16 bits to float32, exactly. */
static float from_bf16(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* The bits of a row's last mask byte that stand for entries (the rest is padding). */
static unsigned tail_mask_of(int64_t dim, int64_t width) {
    const int64_t tail = dim - 8 * (width - 1);
    return tail >= 8 ? 0xffu : (1u << tail) - 1u;
}

static int64_t count_codes(const uint8_t *masks, int64_t k, int64_t width, unsigned tail_mask) {
    int64_t total = 0;
    for (int64_t r = 0; r < k; r++) {
        const uint8_t *m = masks + r * width;
        for (int64_t w = 0; w + 1 < width; w++) total += COUNT[m[w]];
        total += COUNT[m[width - 1] & tail_mask];
    }
    return total;
}

/* Portable: one entry at a time. */
static void expand_q8_scalar(const uint8_t *masks, int64_t k, int64_t dim, int64_t width, const int8_t *codes,
                             const uint16_t *scales, float *out, unsigned tail_mask) {
    int64_t p = 0;
    for (int64_t r = 0; r < k; r++) {
        const float s = from_bf16(scales[r]);
        const uint8_t *m = masks + r * width;
        float *o = out + r * dim;
        for (int64_t w = 0; w < width; w++) {
            unsigned b = w + 1 < width ? m[w] : m[w] & tail_mask;
            int64_t jmax = dim - 8 * w < 8 ? dim - 8 * w : 8;
            for (int64_t j = 0; j < jmax; j++) o[8 * w + j] = (float)(SLOT[b][j] & 0x80 ? 0 : codes[p + SLOT[b][j]]) * s;
            p += COUNT[b];
        }
    }
}

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

/* Eight entries a mask byte: shuffle the next 8 codes into place, widen, scale, store. A
 * row's last group may write up to 7 floats past the row: the next row overwrites them,
 * and the caller pads the output by 8 floats for the last row. */
__attribute__((target("sse4.1"))) static void expand_q8_sse41(
    const uint8_t *masks, int64_t k, int64_t dim, int64_t width, const int8_t *codes, const uint16_t *scales,
    float *out, unsigned tail_mask) {
    int64_t p = 0;
    for (int64_t r = 0; r < k; r++) {
        const __m128 s = _mm_set1_ps(from_bf16(scales[r]));
        const uint8_t *m = masks + r * width;
        float *o = out + r * dim;
        for (int64_t w = 0; w < width; w++) {
            unsigned b = w + 1 < width ? m[w] : m[w] & tail_mask;
            __m128i c = _mm_loadl_epi64((const __m128i *)(codes + p));
            __m128i d = _mm_shuffle_epi8(c, _mm_load_si128((const __m128i *)SLOT[b]));
            __m128 lo = _mm_mul_ps(_mm_cvtepi32_ps(_mm_cvtepi8_epi32(d)), s);
            __m128 hi = _mm_mul_ps(_mm_cvtepi32_ps(_mm_cvtepi8_epi32(_mm_srli_si128(d, 4))), s);
            _mm_storeu_ps(o + 8 * w, lo);
            _mm_storeu_ps(o + 8 * w + 4, hi);
            p += COUNT[b];
        }
    }
}
#endif

/* Decode masked int8 rows: out[r][j] = code * scale[r], where row r's codes are taken in
 * order for the set bits of its mask (LSB first, `width` bytes a row, bits past `dim`
 * ignored) and an unset bit stands for code 0. scales: bfloat16 bits. codes must be
 * readable 8 bytes past n, and out writable 8 floats past k * dim (the caller pads).
 * Returns the codes the masks carry; unless that is n, nothing is written. */
int64_t ebb_expand_q8(const uint8_t *masks, int64_t k, int64_t dim, int64_t width, const int8_t *codes,
                      int64_t n, const uint16_t *scales, float *out) {
    if (k == 0 || dim == 0) return 0;
    const unsigned tail_mask = tail_mask_of(dim, width);
    int64_t total = count_codes(masks, k, width, tail_mask);
    if (total != n) return total;
#if defined(__x86_64__) || defined(__i386__)
    if (use_simd && __builtin_cpu_supports("sse4.1")) {
        expand_q8_sse41(masks, k, dim, width, codes, scales, out, tail_mask);
        return n;
    }
#endif
    expand_q8_scalar(masks, k, dim, width, codes, scales, out, tail_mask);
    return n;
}

/* Masked rows as single entries, for updates that carry few: for the q-th set bit (row r,
 * entry j) rows_out[q] = idx[r], flat_out[q] = idx[r] * dim + j and, given int8 codes,
 * vals_out[q] = code_q * scale[r] (scales: bfloat16 bits). Returns the entries the masks
 * carry; unless that is n, nothing is written. */
int64_t ebb_mask_elements(const uint8_t *masks, int64_t k, int64_t dim, int64_t width, const int64_t *idx,
                          int64_t n, int64_t *rows_out, int64_t *flat_out, const int8_t *codes,
                          const uint16_t *scales, float *vals_out) {
    if (k == 0 || dim == 0) return 0;
    const unsigned tail_mask = tail_mask_of(dim, width);
    int64_t total = count_codes(masks, k, width, tail_mask);
    if (total != n) return total;
    int64_t q = 0;
    for (int64_t r = 0; r < k; r++) {
        const uint8_t *m = masks + r * width;
        const int64_t row = idx[r], base = row * dim;
        const float s = codes ? from_bf16(scales[r]) : 0.0f;
        for (int64_t w = 0; w < width; w++) {
            unsigned b = w + 1 < width ? m[w] : m[w] & tail_mask;
            while (b) {
                int j = __builtin_ctz(b);
                b &= b - 1u;
                rows_out[q] = row;
                flat_out[q] = base + 8 * w + j;
                if (codes) vals_out[q] = (float)codes[q] * s;
                q++;
            }
        }
    }
    return q;
}

/* float32 to bfloat16 bits, rounding to nearest even (as torch's .to(torch.bfloat16)) for
 * finite values. */
static uint16_t to_bf16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    return (uint16_t)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

/* Round half to even, as numpy's rint, for |c| < 2^22 (a code is within ±128 here). */
static float rint_small(float c) {
    const float magic = 12582912.0f; /* 1.5 * 2^23: adding it leaves no fraction bits */
    float big = c + magic;
    return big - magic;
}

/* float32 to float16 bits, rounding to nearest even (as torch's .to(torch.float16)), for
 * |f| ≤ 65504 (the caller clamps), -0.0 and half denormals included. */
static uint16_t to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax < 0x38800000u) /* below 2^-14: a denormal half, in units of 2^-24 (exact scaling) */
        return sign | (uint16_t)rint_small(fabsf(f) * 16777216.0f);
    uint32_t r = ax - 0x38000000u; /* rebias the exponent from 127 to 15 */
    r += 0xfffu + ((r >> 13) & 1u);
    return sign | (uint16_t)(r >> 13);
}

/* float16 bits (finite) to float32, exactly. */
static float from_f16(uint16_t h) {
    uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) {
        float f = (float)m * 5.9604644775390625e-8f; /* m × 2^-24 */
        return h & 0x8000u ? -f : f;
    }
    uint32_t bits = ((uint32_t)(h & 0x8000u) << 16) | ((e + 112u) << 23) | (m << 13);
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* ---- Applying a step's updates: every payload decoded and added in one call ----
 *
 * What ebb.engine.aggregate.RowMean.apply does with ebb.sparse.RowUpdate.decode of each
 * payload, straight from the wire (the EBU4 format, ebb/sparse.py) into the replica, with
 * no decoded arrays and no Python per payload: the same float32 operations in the same
 * order (contributions in the order given, each row's toucher counts first), so the
 * replica ends bit-identical to that path's.
 *
 * Sources, in order: n_src payloads (bufs[s], lens[s]); at position own_at (or none, -1)
 * the worker's own update in memory: per table p, own_k[p] rows own_rows[p] (int64) with
 * values own_vals[p] (float32 [own_k][dim]), own_k[p] < 0 when it has none.
 * Tables: n_params float32 [n_rows[p]][dims[p]], named by names (concatenated UTF-8,
 * name_lens[p] bytes each); counts[p] float32 [n_rows[p]], all zero, used as scratch and
 * left zero. A payload entry of an unknown name is skipped, as RowMean skips it.
 * divide: divide each row's values by max(1, touchers / per) (the row-wise mean: per 1;
 * the capped sum: per = the cap). element_cost: ebb.sparse.ELEMENT_COST (a masked entry
 * carrying fewer than 1/element_cost of its values decodes to single entries, which add
 * only what they carry and, with no touched rows sent, count no toucher).
 * Returns 0, or, having written nothing: -1 a corrupt payload, -2 a row out of range,
 * -3 a width that is not its table's, -4 out of memory. */

enum { W_GAPS = 1, W_MASKED = 2, W_BITMAP = 4, W_Q8 = 8, W_F16 = 16, W_SAME = 32, W_SUBSET = 64 };
enum { APPLY_OK = 0, APPLY_CORRUPT = -1, APPLY_BAD_ROW = -2, APPLY_BAD_DIM = -3, APPLY_NO_MEMORY = -4 };

typedef struct {
    int param; /* index among the tables, -1: a name not among them */
    int kind;  /* 0 values, 1 touched rows */
    int flags;
    int rows_form; /* values decoded as whole rows (else single entries) */
    int64_t k, dim, nnz;
    const int64_t *idx; /* k row ids */
    int64_t lo, hi;     /* their least and greatest (k > 0) */
    int64_t *owned;     /* idx, when this entry allocated it */
    const uint8_t *masks, *scales, *vals;
    int64_t r, q; /* while adding: the next row, and the next carried value */
} wire_entry;

typedef struct {
    int n;
    int has_touched;
    wire_entry *e;
} wire_payload;

static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t rd32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }

/* float16 bits to float32, exactly, infinities and NaN included. */
static float from_f16_any(uint16_t h) {
    if (((h >> 10) & 0x1fu) != 0x1fu) return from_f16(h);
    uint32_t bits = ((uint32_t)(h & 0x8000u) << 16) | 0x7f800000u | ((uint32_t)(h & 0x3ffu) << 13);
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static int64_t popcount_bits(const uint8_t *bits, int64_t n_bits) {
    int64_t total = 0, whole = n_bits / 8;
    for (int64_t b = 0; b < whole; b++) total += COUNT[bits[b]];
    if (n_bits % 8) total += COUNT[bits[whole] & ((1u << (n_bits % 8)) - 1u)];
    return total;
}

/* The positions of the set bits of a bitmap of n_bits (LSB first) in order, or of
 * them the entries of `of`, into out: a word at a time, set bits only. */
static void set_bits(const uint8_t *bits, int64_t n_bits, const int64_t *of, int64_t *out) {
    int64_t q = 0;
    for (int64_t base = 0; base < n_bits; base += 64) {
        uint64_t word = 0;
        const int64_t nbytes = n_bits - base >= 64 ? 8 : (n_bits - base + 7) / 8;
        memcpy(&word, bits + base / 8, (size_t)nbytes); /* little-endian hosts (x86-64, aarch64) */
        if (n_bits - base < 64) word &= (UINT64_C(1) << (n_bits - base)) - 1;
        while (word) {
            const int64_t r = base + __builtin_ctzll(word);
            word &= word - 1;
            out[q++] = of ? of[r] : r;
        }
    }
}

#define NEED(n)                                                  \
    do {                                                         \
        if ((int64_t)(n) < 0 || off + (int64_t)(n) > len) return APPLY_CORRUPT; \
    } while (0)

/* Read one payload's entries (their row ids materialised); checks every bound. */
static int parse_payload(const uint8_t *buf, int64_t len, int64_t n_params, const uint8_t *names,
                         const int64_t *name_lens, const int64_t *n_rows, const int64_t *dims, int64_t element_cost,
                         wire_payload *out) {
    int64_t off = 0;
    NEED(6);
    if (memcmp(buf, "EBU4", 4) != 0) return APPLY_CORRUPT;
    const int n = rd16(buf + 4);
    off = 6;
    out->n = 0;
    out->has_touched = 0;
    out->e = calloc(n ? (size_t)n : 1u, sizeof(wire_entry));
    if (!out->e) return APPLY_NO_MEMORY;
    for (int i = 0; i < n; i++) {
        wire_entry *e = &out->e[i];
        out->n = i + 1; /* freed on error from here */
        NEED(2);
        const int64_t name_len = rd16(buf + off);
        off += 2;
        NEED(name_len + 10);
        const uint8_t *name = buf + off;
        off += name_len;
        e->param = -1;
        for (int64_t p = 0, at = 0; p < n_params; at += name_lens[p], p++)
            if (name_lens[p] == name_len && memcmp(names + at, name, (size_t)name_len) == 0) e->param = (int)p;
        e->kind = buf[off];
        e->flags = buf[off + 1];
        e->k = rd32(buf + off + 2);
        e->dim = rd32(buf + off + 6);
        off += 10;
        const int64_t k = e->k;
        if (e->kind > 1) return APPLY_CORRUPT;
        /* the row ids */
        if (e->flags & (W_SAME | W_SUBSET)) {
            NEED(4);
            const uint32_t j = rd32(buf + off);
            off += 4;
            if (j >= (uint32_t)i) return APPLY_CORRUPT;
            const wire_entry *ref = &out->e[j];
            e->lo = ref->lo, e->hi = ref->hi; /* (a subset's rows lie within its superset's range) */
            if (e->flags & W_SAME) {
                if (ref->k != k) return APPLY_CORRUPT;
                e->idx = ref->idx;
            } else {
                const int64_t nbytes = (ref->k + 7) / 8;
                NEED(nbytes);
                if (popcount_bits(buf + off, ref->k) != k) return APPLY_CORRUPT;
                e->owned = malloc((size_t)(k ? k : 1) * sizeof(int64_t));
                if (!e->owned) return APPLY_NO_MEMORY;
                set_bits(buf + off, ref->k, ref->idx, e->owned);
                e->idx = e->owned;
                off += nbytes;
            }
        } else {
            e->owned = malloc((size_t)(k ? k : 1) * sizeof(int64_t));
            if (!e->owned) return APPLY_NO_MEMORY;
            e->idx = e->owned;
            if (e->flags & W_GAPS) {
                if (k < 1) return APPLY_CORRUPT;
                NEED(4 + 2 * (k - 1));
                int64_t row = rd32(buf + off);
                e->owned[0] = row;
                for (int64_t r = 1; r < k; r++) e->owned[r] = row += rd16(buf + off + 4 + 2 * (r - 1));
                e->lo = e->owned[0], e->hi = row; /* (gaps are not negative) */
                off += 4 + 2 * (k - 1);
            } else if (e->flags & W_BITMAP) {
                NEED(4);
                const int64_t n_bits = rd32(buf + off);
                off += 4;
                NEED((n_bits + 7) / 8);
                if (popcount_bits(buf + off, n_bits) != k) return APPLY_CORRUPT;
                set_bits(buf + off, n_bits, NULL, e->owned);
                if (k) e->lo = e->owned[0], e->hi = e->owned[k - 1];
                off += (n_bits + 7) / 8;
            } else {
                NEED(4 * k);
                int64_t lo = INT64_MAX, hi = INT64_MIN;
                for (int64_t r = 0; r < k; r++) {
                    const int64_t row = e->owned[r] = (int32_t)rd32(buf + off + 4 * r);
                    lo = row < lo ? row : lo;
                    hi = row > hi ? row : hi;
                }
                e->lo = lo, e->hi = hi;
                off += 4 * k;
            }
        }
        if (e->param >= 0 && k && (e->lo < 0 || e->hi >= n_rows[e->param])) return APPLY_BAD_ROW;
        if (e->kind == 1) {
            out->has_touched = 1;
            continue;
        }
        /* the values */
        const int64_t dim = e->dim;
        if (e->param >= 0 && dim != dims[e->param] && k) return APPLY_BAD_DIM;
        int64_t n_vals = k * dim;
        e->rows_form = 1;
        if (e->flags & W_MASKED) {
            const int64_t width = (dim + 7) / 8;
            NEED(k * width + 4);
            e->masks = buf + off;
            off += k * width;
            e->nnz = rd32(buf + off);
            off += 4;
            if (dim && count_codes(e->masks, k, width, tail_mask_of(dim, width)) != e->nnz) return APPLY_CORRUPT;
            n_vals = e->nnz;
            e->rows_form = !(e->nnz * element_cost < k * dim);
        }
        if (e->flags & W_Q8) {
            NEED(2 * k);
            e->scales = buf + off;
            off += 2 * k;
        }
        const int64_t size = e->flags & W_Q8 ? 1 : e->flags & W_F16 ? 2 : 4;
        NEED(size * n_vals);
        e->vals = buf + off;
        off += size * n_vals;
    }
    return APPLY_OK;
}

static void free_payload(wire_payload *w) {
    for (int i = 0; i < w->n; i++) free(w->e[i].owned);
    free(w->e);
    w->e = NULL;
    w->n = 0;
}

/* The carried value number q of a values entry (form: W_Q8, W_F16 or 0 for float32), of row scale s. */
static inline float wire_value(const uint8_t *vals, int form, int64_t q, float s) {
    if (form == W_Q8) return (float)(int8_t)vals[q] * s;
    if (form == W_F16) return from_f16_any(rd16(vals + 2 * q));
    float f;
    memcpy(&f, vals + 4 * q, sizeof f); /* little-endian hosts (x86-64, aarch64): a plain load, vectorised */
    return f;
}

/* The rows of a table a step touches are scattered over more than the caches hold: the
 * row AHEAD rows on is fetched while this one is added. */
#define AHEAD 32
#define BLOCK_BYTES (256 * 1024) /* a block of a table's rows that a core's cache holds */
#define APPLY_BODY static inline __attribute__((always_inline))
APPLY_BODY void prefetch_row(const float *table, int64_t row, int64_t dim) {
    /* Every cache line the row touches: a row 84 bytes wide (PMF's) may span three. */
    const uintptr_t first = (uintptr_t)(table + row * dim) & ~(uintptr_t)63;
    const uintptr_t last = (uintptr_t)(table + row * dim + dim - 1);
    for (uintptr_t line = first; line <= last; line += 64) __builtin_prefetch((const void *)line, 1, 3);
}

APPLY_BODY float divisor_of(const float *counts, int64_t row, int divide, float per) {
    if (!divide) return 1.0f;
    float d = counts[row];
    if (per != 1.0f) d = d / per;
    return d < 1.0f ? 1.0f : d;
}

#if defined(__x86_64__)
/* A masked int8 row, whole (t[j] += code_j × s / d, code 0 where no bit is set): eight
 * entries a mask byte, their codes shuffled into place (SLOT), widened, scaled, divided
 * and added 8 wide. The same float32 operations on every entry as the portable loop, so
 * the same bits. `avail`: the codes readable from `codes` (the payload's end); a group
 * nearer it than 8 reads a copy. Returns the codes the row carries. */
__attribute__((target("avx2"))) static inline int64_t q8_row_avx2(float *t, const uint8_t *m, int64_t width,
                                                                   int64_t dim, unsigned tail_mask,
                                                                   const int8_t *codes, int64_t avail, float s,
                                                                   float d) {
    const __m256 vs = _mm256_set1_ps(s), vd = _mm256_set1_ps(d);
    int64_t p = 0;
    for (int64_t w = 0; w < width; w++) {
        const unsigned b = w + 1 < width ? m[w] : m[w] & tail_mask;
        __m128i c;
        if (p + 8 <= avail)
            c = _mm_loadl_epi64((const __m128i *)(codes + p));
        else {
            int8_t near_end[8] = {0};
            memcpy(near_end, codes + p, (size_t)(avail - p));
            c = _mm_loadl_epi64((const __m128i *)near_end);
        }
        c = _mm_shuffle_epi8(c, _mm_load_si128((const __m128i *)SLOT[b]));
        __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(c)), vs);
        v = _mm256_div_ps(v, vd); /* (always: whether a row is shared is random, a branch on it mispredicted) */
        float *o = t + 8 * w;
        if (8 * w + 8 <= dim)
            _mm256_storeu_ps(o, _mm256_add_ps(_mm256_loadu_ps(o), v));
        else { /* the row's last 1-7 entries: four at once, then one at a time */
            __m128 part = _mm256_castps256_ps128(v);
            int64_t left = dim - 8 * w;
            if (left >= 4) {
                _mm_storeu_ps(o, _mm_add_ps(_mm_loadu_ps(o), part));
                part = _mm256_extractf128_ps(v, 1);
                left -= 4, o += 4;
            }
            float rest[4];
            _mm_storeu_ps(rest, part);
            for (int64_t j = 0; j < left; j++) o[j] += rest[j];
        }
        p += COUNT[b];
    }
    return p;
}
#endif

/* The rows of one values entry below row `hi`, from its cursor on (e->r, e->q), of one
 * form (a constant where inlined: the compiler makes a loop per form); `simd` (a
 * constant too) for the AVX2 instance. */
APPLY_BODY void add_entry_form(wire_entry *e, int form, int simd, int64_t dim, int64_t hi, float *table,
                               const float *counts, int divide, float per) {
    const int64_t k = e->k;
    const uint8_t *vals = e->vals;
    int64_t r = e->r, q = e->q;
    if (!(e->flags & W_MASKED)) {
        for (; r < k && e->idx[r] < hi; r++) {
            if (r + AHEAD < k) prefetch_row(table, e->idx[r + AHEAD], dim);
            const float d = divisor_of(counts, e->idx[r], divide, per);
            const float s = form == W_Q8 ? from_bf16(rd16(e->scales + 2 * r)) : 1.0f;
            float *t = table + e->idx[r] * dim;
            for (int64_t j = 0; j < dim; j++) t[j] += wire_value(vals, form, r * dim + j, s) / d;
        }
        e->r = r;
        return;
    }
    const int64_t width = (dim + 7) / 8, last = e->nnz - 1;
    if (!e->rows_form && width <= 8) {
        /* Single entries, a few a row: only the set bits, found a word at a time. */
        for (; r < k && e->idx[r] < hi; r++) {
            uint64_t word = 0;
            memcpy(&word, e->masks + r * width, (size_t)width);
            if (dim < 64) word &= (UINT64_C(1) << dim) - 1;
            if (r + AHEAD < k) prefetch_row(table, e->idx[r + AHEAD], dim);
            if (!word) continue;
            const float d = divisor_of(counts, e->idx[r], divide, per);
            const float s = form == W_Q8 ? from_bf16(rd16(e->scales + 2 * r)) : 1.0f;
            float *t = table + e->idx[r] * dim;
            if (d == 1.0f) /* (x / 1 is x: the division skipped, the bits the same) */
                while (word) {
                    const int j = __builtin_ctzll(word);
                    word &= word - 1;
                    t[j] += wire_value(vals, form, q++, s);
                }
            else
                while (word) {
                    const int j = __builtin_ctzll(word);
                    word &= word - 1;
                    t[j] += wire_value(vals, form, q++, s) / d;
                }
        }
        e->r = r, e->q = q;
        return;
    }
    /* Whole rows add a zero where nothing was carried (as index_add_ of the decoded rows
     * does: -0.0 + 0.0 is +0.0); single entries add only what they carry. A row is
     * expanded into `row` (its set bits found a word at a time), then added in one loop
     * the compiler vectorises. */
    const int whole = e->rows_form;
#if defined(__x86_64__)
    if (simd && form == W_Q8 && whole) {
        const unsigned tail_mask = tail_mask_of(dim, width);
        const int8_t *codes = (const int8_t *)vals;
        for (; r < k && e->idx[r] < hi; r++) {
            if (r + AHEAD < k) prefetch_row(table, e->idx[r + AHEAD], dim);
            const float d = divisor_of(counts, e->idx[r], divide, per);
            const float s = from_bf16(rd16(e->scales + 2 * r));
            q += q8_row_avx2(table + e->idx[r] * dim, e->masks + r * width, width, dim, tail_mask, codes + q,
                             e->nnz - q, s, d);
        }
        e->r = r, e->q = q;
        return;
    }
#else
    (void)simd;
#endif
    float row[64];
    for (; r < k && e->idx[r] < hi; r++) {
        if (r + AHEAD < k) prefetch_row(table, e->idx[r + AHEAD], dim);
        const float d = divisor_of(counts, e->idx[r], divide, per);
        const float s = form == W_Q8 ? from_bf16(rd16(e->scales + 2 * r)) : 1.0f;
        float *t = table + e->idx[r] * dim;
        const uint8_t *m = e->masks + r * width;
        if (whole && dim <= 64) {
            const float zero = form == W_Q8 ? 0.0f * s : 0.0f;
            for (int64_t j = 0; j < dim; j++) row[j] = zero;
            uint64_t word = 0;
            memcpy(&word, m, (size_t)width);
            if (dim < 64) word &= (UINT64_C(1) << dim) - 1;
            while (word) {
                const int j = __builtin_ctzll(word);
                word &= word - 1;
                row[j] = wire_value(vals, form, q++, s);
            }
            for (int64_t j = 0; j < dim; j++) t[j] += row[j] / d;
            continue;
        }
        const float zero = (form == W_Q8 ? 0.0f * s : 0.0f) / d;
        for (int64_t j = 0; j < dim; j++) {
            const int bit = m[j >> 3] >> (j & 7) & 1;
            const float v = wire_value(vals, form, q < last ? q : last, s) / d;
            const float kept = whole ? t[j] + zero : t[j];
            t[j] = bit ? t[j] + v : kept;
            q += bit;
        }
    }
    e->r = r, e->q = q;
}

APPLY_BODY void add_entry(wire_entry *e, int simd, int64_t dim, int64_t hi, float *table, const float *counts,
                          int divide, float per) {
    if (e->flags & W_Q8)
        add_entry_form(e, W_Q8, simd, dim, hi, table, counts, divide, per);
    else if (e->flags & W_F16)
        add_entry_form(e, W_F16, simd, dim, hi, table, counts, divide, per);
    else
        add_entry_form(e, 0, simd, dim, hi, table, counts, divide, per);
}

static int ascending(const int64_t *idx, int64_t k) {
    for (int64_t r = 1; r < k; r++)
        if (idx[r] <= idx[r - 1]) return 0;
    return 1;
}

/* Add one table's values entries (in contribution order) a block of rows at a time: the
 * block's rows stay in cache while every contribution adds into them, and each row still
 * takes its contributions in their order. Rows not ascending in some entry: one block. */
APPLY_BODY void add_table(int simd, wire_entry *const *list, int64_t n, float *table, int64_t n_rows, int64_t dim,
                          const float *counts, int divide, float per) {
    int sorted = 1;
    for (int64_t i = 0; i < n && sorted; i++) sorted = ascending(list[i]->idx, list[i]->k);
    const int64_t block = sorted ? (BLOCK_BYTES / (int64_t)sizeof(float) + dim - 1) / dim : n_rows;
    for (int64_t lo = 0; lo < n_rows; lo += block) {
        const int64_t hi = lo + block < n_rows ? lo + block : n_rows;
        for (int64_t i = 0; i < n; i++) add_entry(list[i], simd, dim, hi, table, counts, divide, per);
    }
}

/* PMF's rows at the default rank (21 wide) have an instance of their own, their length
 * known to the compiler. (Every entry of a table is as wide as it: parse_payload checks.) */
APPLY_BODY void add_table_sized(int simd, wire_entry *const *list, int64_t n, float *table, int64_t n_rows,
                                int64_t dim, const float *counts, int divide, float per) {
    if (dim == 21)
        add_table(simd, list, n, table, n_rows, 21, counts, divide, per);
    else
        add_table(simd, list, n, table, n_rows, dim, counts, divide, per);
}

/* add_table twice: portable C, and on x86-64 for CPUs with AVX2 (8 floats wide, masked
 * int8 rows expanded by byte shuffles), chosen at run time. Both give the same bits. */
static void add_table_portable(wire_entry *const *list, int64_t n, float *table, int64_t n_rows, int64_t dim,
                               const float *counts, int divide, float per) {
    add_table_sized(0, list, n, table, n_rows, dim, counts, divide, per);
}
#if defined(__x86_64__)
__attribute__((target("avx2"))) static void add_table_avx2(wire_entry *const *list, int64_t n, float *table,
                                                            int64_t n_rows, int64_t dim, const float *counts,
                                                            int divide, float per) {
    add_table_sized(1, list, n, table, n_rows, dim, counts, divide, per);
}
#endif
static void add_table_any(wire_entry *const *list, int64_t n, float *table, int64_t n_rows, int64_t dim,
                          const float *counts, int divide, float per) {
#if defined(__x86_64__)
    if (use_simd && __builtin_cpu_supports("avx2")) {
        add_table_avx2(list, n, table, n_rows, dim, counts, divide, per);
        return;
    }
#endif
    add_table_portable(list, n, table, n_rows, dim, counts, divide, per);
}

/* ---- Encoding masked rows ----
 *
 * What ebb.sparse's encoder does for a masked values entry, in one pass: each row's mask
 * (bit j of byte w set when entry 8w + j is not zero: LSB first, `width` = ceil(dim/8)
 * bytes a row, padding bits clear) into masks[k][width], and the non-zero entries in
 * order into carried. v: k × dim entries of `size` bytes (1: int8 codes, 2: float16
 * bits, 4: float32). carried must hold k × dim entries and 8 bytes more. Returns the
 * entries carried. */

/* Whether an entry is zero as numpy's `v != 0` sees it: for floats, -0.0 is (not carried) and NaN is not. */
APPLY_BODY int pack_is_zero(const uint8_t *p, int size) {
    if (size == 1) return p[0] == 0;
    if (size == 2) return (rd16(p) & 0x7fffu) == 0;
    return (rd32(p) & 0x7fffffffu) == 0;
}

#if defined(__x86_64__)
/* int8 codes: a group's zeros by one compare, its carried codes by one shuffle. */
__attribute__((target("avx2"))) static inline int64_t pack_q8_avx2(const uint8_t *v, int64_t k, int64_t dim,
                                                                    uint8_t *masks, uint8_t *carried) {
    const int64_t width = (dim + 7) / 8, total = k * dim;
    const unsigned tail_mask = tail_mask_of(dim, width);
    int64_t n = 0;
    for (int64_t r = 0; r < k; r++)
        for (int64_t w = 0; w < width; w++) {
            const int64_t at = r * dim + 8 * w;
            __m128i c;
            if (at + 8 <= total)
                c = _mm_loadl_epi64((const __m128i *)(v + at));
            else {
                uint8_t near_end[8] = {0};
                memcpy(near_end, v + at, (size_t)(total - at));
                c = _mm_loadl_epi64((const __m128i *)near_end);
            }
            unsigned b = ~(unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(c, _mm_setzero_si128())) & 0xffu;
            if (w + 1 == width) b &= tail_mask;
            masks[r * width + w] = (uint8_t)b;
            _mm_storel_epi64((__m128i *)(carried + n), _mm_shuffle_epi8(c, _mm_load_si128((const __m128i *)PICK[b])));
            n += COUNT[b];
        }
    return n;
}
#endif

APPLY_BODY int64_t pack_masked_body(int simd, const uint8_t *v, int size, int64_t k, int64_t dim, uint8_t *masks,
                                    uint8_t *carried) {
    const int64_t width = (dim + 7) / 8;
    int64_t n = 0;
#if defined(__x86_64__)
    if (simd && size == 1) return pack_q8_avx2(v, k, dim, masks, carried);
#else
    (void)simd;
#endif
    for (int64_t r = 0; r < k; r++)
        for (int64_t w = 0; w < width; w++) {
            const int64_t jmax = dim - 8 * w < 8 ? dim - 8 * w : 8;
            unsigned b = 0;
            for (int64_t j = 0; j < jmax; j++) {
                const uint8_t *p = v + (r * dim + 8 * w + j) * size;
                const int keep = !pack_is_zero(p, size);
                memcpy(carried + n * size, p, (size_t)size); /* (overwritten unless kept) */
                b |= (unsigned)keep << j;
                n += keep;
            }
            masks[r * width + w] = (uint8_t)b;
        }
    return n;
}

static int64_t pack_masked_portable(const uint8_t *v, int size, int64_t k, int64_t dim, uint8_t *masks,
                                    uint8_t *carried) {
    return pack_masked_body(0, v, size, k, dim, masks, carried);
}
#if defined(__x86_64__)
__attribute__((target("avx2"))) static int64_t pack_masked_avx2(const uint8_t *v, int size, int64_t k, int64_t dim,
                                                                 uint8_t *masks, uint8_t *carried) {
    return pack_masked_body(1, v, size, k, dim, masks, carried);
}
#endif

int64_t ebb_pack_masked(const uint8_t *v, int size, int64_t k, int64_t dim, uint8_t *masks, uint8_t *carried) {
    if (k == 0 || dim == 0) return 0;
#if defined(__x86_64__)
    if (use_simd && __builtin_cpu_supports("avx2")) return pack_masked_avx2(v, size, k, dim, masks, carried);
#endif
    return pack_masked_portable(v, size, k, dim, masks, carried);
}

/* The ISP significance filter on one parameter's touched rows, as ebb.engine.isp's numpy
 * path computes it: δ = table[rows] + vals; an entry is significant when |δ| > v |x|; a
 * row is sent when one of its entries is. Sent rows go out with their significant
 * entries (quantize 1: int8 codes and a bfloat16 scale per row; 2: float16, for narrow
 * rows; 0: as they are; and the float32 values those stand for), and table[rows] keeps δ
 * minus what was sent.
 *
 * Outputs, compacted over the sent rows (q of them, in order): sent[q][dim] (float32),
 * codes[q][dim] (int8, or float16 bits) and scales[q] (quantize 1), at[q] (their
 * positions among `rows`, which are unique). backup is scratch, [k][dim] floats.
 * Returns q, or -1 when a row holds NaN or infinity (a diverging model): then `table` is
 * as it was (its rows restored from backup) and the caller runs numpy, whose rounding
 * of those rows is its own.
 *
 * One pass, a row at a time: its δ, significance and peak, then (if sent) its codes, and
 * its new δ written back while the row is in cache. The entries of a row are done free of
 * branches (significance is random, and a mispredicted branch per entry costs more than
 * the arithmetic), so they vectorise. */
APPLY_BODY int64_t isp_filter_rows(float *restrict table, int64_t dim, const int64_t *restrict rows, int64_t k,
                                   const float *restrict vals, const float *restrict x, float v, int quantize,
                                   float *restrict backup, float *restrict sent, void *restrict codes,
                                   uint16_t *restrict scales, int64_t *restrict at) {
    int64_t q = 0;
    for (int64_t r = 0; r < k; r++) {
        if (r + AHEAD < k) prefetch_row(table, rows[r + AHEAD], dim);
        float *restrict t = table + rows[r] * dim, *restrict old = backup + r * dim, *restrict o = sent + q * dim;
        const float *restrict u = vals + r * dim, *restrict xr = x + r * dim;
        /* A row's largest |sent value|: as bit patterns, non-negative floats order as
         * integers, and NaN and infinity lie above every finite one. */
        uint32_t top = 0;
        for (int64_t j = 0; j < dim; j++) {
            const float was = t[j];
            const float dj = was + u[j];
            const float mag = fabsf(dj);
            const float sig = mag > fabsf(xr[j]) * v ? 1.0f : 0.0f; /* NaN compares false */
            const float peak = mag * sig;                             /* ≥ +0, or NaN */
            uint32_t bits;
            memcpy(&bits, &peak, sizeof bits);
            top = bits > top ? bits : top;
            old[j] = was;
            t[j] = dj;
            o[j] = dj * sig;
        }
        if (top >= 0x7f800000u) {
            for (int64_t i = 0; i <= r; i++) memcpy(table + rows[i] * dim, backup + i * dim, (size_t)dim * sizeof(float));
            return -1;
        }
        if (top == 0) continue; /* nothing significant: δ stays as it is */
        if (quantize == 2) {
            uint16_t *h = (uint16_t *)codes + q * dim;
            for (int64_t j = 0; j < dim; j++) {
                float c = o[j] < -65504.0f ? -65504.0f : o[j];
                c = c > 65504.0f ? 65504.0f : c;
                h[j] = to_f16(c);
                o[j] = from_f16(h[j]);
            }
        } else if (quantize) {
            float peak;
            memcpy(&peak, &top, sizeof peak);
            uint16_t s16 = to_bf16(peak / 127.0f);
            if ((s16 & 0x7fffu) == 0) s16 = 0x3f80u; /* a zero scale (the peak underflowed): 1.0 */
            const float sc = from_bf16(s16);
            int8_t *c = (int8_t *)codes + q * dim;
            /* Two loops, so that each vectorises (one mixing the clamps and the narrowing
             * to int8 does not): the rounded codes as floats, then the codes and values. */
            for (int64_t j = 0; j < dim; j++) {
                float rc = rint_small(o[j] / sc);
                rc = rc < -127.0f ? -127.0f : rc;
                o[j] = rc > 127.0f ? 127.0f : rc;
            }
            for (int64_t j = 0; j < dim; j++) {
                const int32_t code = (int32_t)o[j]; /* (from the int: a code may be -0.0, its value +0) */
                c[j] = (int8_t)code;
                o[j] = (float)code * sc;
            }
            scales[q] = s16;
        }
        for (int64_t j = 0; j < dim; j++) t[j] -= o[j];
        at[q++] = r;
    }
    return q;
}

/* PMF's rows at the default rank (20, and a bias: 21 wide) have an instance of their own,
 * the row's length known to the compiler. */
APPLY_BODY int64_t isp_filter_sized(float *table, int64_t dim, const int64_t *rows, int64_t k, const float *vals,
                                    const float *x, float v, int quantize, float *backup, float *sent, void *codes,
                                    uint16_t *scales, int64_t *at) {
    if (dim == 21) return isp_filter_rows(table, 21, rows, k, vals, x, v, quantize, backup, sent, codes, scales, at);
    return isp_filter_rows(table, dim, rows, k, vals, x, v, quantize, backup, sent, codes, scales, at);
}

/* Portable C, and on x86-64 for CPUs with AVX2 (8 entries wide), chosen at run time; the same bits. */
static int64_t isp_filter_portable(float *table, int64_t dim, const int64_t *rows, int64_t k, const float *vals,
                                   const float *x, float v, int quantize, float *backup, float *sent, void *codes,
                                   uint16_t *scales, int64_t *at) {
    return isp_filter_sized(table, dim, rows, k, vals, x, v, quantize, backup, sent, codes, scales, at);
}
#if defined(__x86_64__)
__attribute__((target("avx2"))) static int64_t isp_filter_avx2(float *table, int64_t dim, const int64_t *rows,
                                                                int64_t k, const float *vals, const float *x, float v,
                                                                int quantize, float *backup, float *sent, void *codes,
                                                                uint16_t *scales, int64_t *at) {
    return isp_filter_sized(table, dim, rows, k, vals, x, v, quantize, backup, sent, codes, scales, at);
}
#endif

int64_t ebb_isp_filter(float *table, int64_t dim, const int64_t *rows, int64_t k, const float *vals, const float *x,
                       float v, int quantize, float *backup, float *sent, void *codes, uint16_t *scales, int64_t *at) {
#if defined(__x86_64__)
    if (use_simd && __builtin_cpu_supports("avx2"))
        return isp_filter_avx2(table, dim, rows, k, vals, x, v, quantize, backup, sent, codes, scales, at);
#endif
    return isp_filter_portable(table, dim, rows, k, vals, x, v, quantize, backup, sent, codes, scales, at);
}

/* Whether an entry's rows count as touchers: a payload's touched rows where it sent
 * them, else the rows of its values that decode to whole rows. */
static int counted(const wire_entry *e, int has_touched) {
    return e->param >= 0 && (has_touched ? e->kind == 1 : e->kind == 0 && e->rows_form);
}

int64_t ebb_apply_payloads(int64_t n_src, const uint8_t *const *bufs, const int64_t *lens, int64_t own_at,
                           int64_t n_params, const uint8_t *names, const int64_t *name_lens, float *const *tables,
                           const int64_t *n_rows, const int64_t *dims, float *const *counts,
                           const int64_t *const *own_rows, const float *const *own_vals, const int64_t *own_k,
                           int divide, float per, int64_t element_cost) {
    wire_payload *w = calloc(n_src ? (size_t)n_src : 1u, sizeof(wire_payload));
    if (!w) return APPLY_NO_MEMORY;
    int64_t status = APPLY_OK;
    for (int64_t s = 0; s < n_src && status == APPLY_OK; s++)
        if (s != own_at)
            status = parse_payload(bufs[s], lens[s], n_params, names, name_lens, n_rows, dims, element_cost, &w[s]);
    if (status == APPLY_OK && own_at >= 0)
        for (int64_t p = 0; p < n_params; p++)
            for (int64_t r = 0; r < own_k[p]; r++)
                if (own_rows[p][r] < 0 || own_rows[p][r] >= n_rows[p]) status = APPLY_BAD_ROW;
    /* The own update as float32 values entries, one a table; each table's entries are
     * listed in contribution order in `list` (at most every entry and the own one). */
    int64_t total = 1;
    for (int64_t s = 0; s < n_src; s++) total += w[s].n;
    wire_entry *own = calloc((size_t)(n_params ? n_params : 1), sizeof(wire_entry));
    wire_entry **list = malloc((size_t)total * sizeof(wire_entry *));
    if (status == APPLY_OK && (!own || !list)) status = APPLY_NO_MEMORY;
    for (int64_t p = 0; p < n_params && status == APPLY_OK && own_at >= 0; p++)
        if (own_k[p] > 0)
            own[p] = (wire_entry){.param = (int)p, .rows_form = 1, .k = own_k[p], .dim = dims[p],
                                  .idx = own_rows[p], .vals = (const uint8_t *)own_vals[p]};
    if (status != APPLY_OK) {
        free(own);
        free(list);
        for (int64_t s = 0; s < n_src; s++) free_payload(&w[s]);
        free(w);
        return status;
    }
    if (divide) /* each row's touchers */
        for (int64_t s = 0; s < n_src; s++) {
            if (s == own_at) {
                for (int64_t p = 0; p < n_params; p++)
                    for (int64_t r = 0; r < own_k[p]; r++) counts[p][own_rows[p][r]] += 1.0f;
                continue;
            }
            for (int i = 0; i < w[s].n; i++) {
                const wire_entry *e = &w[s].e[i];
                if (!counted(e, w[s].has_touched)) continue;
                for (int64_t r = 0; r < e->k; r++) counts[e->param][e->idx[r]] += 1.0f;
            }
        }
    for (int64_t p = 0; p < n_params; p++) {
        int64_t n = 0;
        for (int64_t s = 0; s < n_src; s++) {
            if (s == own_at) {
                if (own_k[p] > 0) list[n++] = &own[p];
                continue;
            }
            for (int i = 0; i < w[s].n; i++) {
                wire_entry *e = &w[s].e[i];
                if (e->param != p || e->kind != 0 || !e->k) continue;
                e->r = e->q = 0;
                list[n++] = e;
            }
        }
        add_table_any(list, n, tables[p], n_rows[p], dims[p], counts[p], divide, per);
    }
    free(own);
    free(list);
    if (divide)
        for (int64_t s = 0; s < n_src; s++) {
            if (s == own_at) {
                for (int64_t p = 0; p < n_params; p++)
                    for (int64_t r = 0; r < own_k[p]; r++) counts[p][own_rows[p][r]] = 0.0f;
                continue;
            }
            for (int i = 0; i < w[s].n; i++) {
                const wire_entry *e = &w[s].e[i];
                if (counted(e, w[s].has_touched))
                    for (int64_t r = 0; r < e->k; r++) counts[e->param][e->idx[r]] = 0.0f;
            }
        }
    for (int64_t s = 0; s < n_src; s++) free_payload(&w[s]);
    free(w);
    return APPLY_OK;
}
