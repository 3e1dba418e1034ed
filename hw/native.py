"""A compiled kernel for `numerics._matmul_acc`: the MAC tree's block-aligned sum of each tile's exact products
(`numerics.tile_sums`), the tile sums added in order, one pass per output element in cache instead of numpy passes
over whole blocks of products. On AVX2 with F16C a tile is two passes over its lanes: the exponent sums' maximum
(16 lanes a register), then each exact FP32 product scaled by a power of two and truncated to an integer by the
conversion instruction, which is the aligned term itself; elsewhere the same sum in integers. `matmul_fp16` also adds the bias and rounds to FP16 as `numerics.matmul` does (F16C's conversion, then
the canonical NaN). It is an implementation of the definition in numerics.py, not a second definition:
tests/test_numerics.py checks it bit for bit against `numerics._matmul_acc_blocks` and numerics.to_fp16 (random,
special and subnormal values), and those remain the fallback.

The C source is compiled on first use with the system C compiler (the project already needs one for Verilator;
`build`, which the sampler's kernel in host/reference/draw.py uses too) into $RINGGPT_CACHE_DIR/native
(default ~/.cache/ringgpt/native), keyed by the source's hash, with
-ffp-contract=off (no fused multiply-add) and without -ffast-math (IEEE binary32, round to nearest even,
gradual underflow). RINGGPT_NATIVE=0 turns it off; a missing compiler or a failed build falls back to numpy; a
cached library that fails to load (a damaged file) is built again, with a warning.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path

import numpy as np

FP16_SOURCE = r"""
#include <stdint.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

static inline float h2f(uint16_t h) {
    /* exact FP16 -> FP32 (normals, subnormals, zeros, infinities, NaN payloads) */
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0x1f) bits = sign | 0x7f800000u | (man << 13);
    else if (exp != 0) bits = sign | ((exp + 112) << 23) | (man << 13);
    else if (man == 0) bits = sign;
    else { float f = (float)man * (1.0f / 16777216.0f); memcpy(&bits, &f, 4); bits |= sign; }
    float out; memcpy(&out, &bits, 4); return out;
}

#if defined(__x86_64__)
__attribute__((target("avx,f16c")))
static void convert_f16c(const uint16_t *src, float *dst, long n) {
    long i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    for (; i < n; i++) dst[i] = h2f(src[i]);
}
#endif

static int use_f16c = -1;

static void convert(const uint16_t *src, float *dst, long n) {
#if defined(__x86_64__)
    if (use_f16c < 0) use_f16c = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
    if (use_f16c) { convert_f16c(src, dst, n); return; }
#endif
    for (long i = 0; i < n; i++) dst[i] = h2f(src[i]);
}

"""
"""The exact FP16 -> FP32 conversion (`convert`, F16C where the CPU has it), shared by every compiled kernel."""

SOURCE = FP16_SOURCE + r"""
#include <stdlib.h>
#include <pthread.h>

/* The MAC tree's numerics (numerics.tile_sums). GUARD (TREE_GUARD_BITS) and SCALE (PRODUCT_SCALE) are defined from
   numerics.py ahead of this source. The rows' significands are stored shifted left by XSHIFT and the columns' by
   WSHIFT, so that a product is already p << GUARD and still fits an int16 pair product; a tile's aligned terms are
   summed BATCH registers at a time in int32 before widening (|term| < 2^(22 + GUARD)). */
#if GUARD > 8
#error "the kernel's int16 significands hold at most 8 guard bits"
#endif
#define XSHIFT ((GUARD + 1) / 2)
#define WSHIFT (GUARD / 2)
#define BATCH (1 << (31 - 22 - GUARD))
#define ZERO_EXP (-64)

/* FP16 words split for the MAC tree: sig = signed significand << shift (0 for zeros, Inf and NaN), exp = exponent
   field (1 for subnormals; ZERO_EXP for zeros, Inf and NaN, so that no such product sets a tile's largest exponent);
   the n words zero-padded to np. Returns whether any word is Inf or NaN. */
static int split_scalar(const uint16_t *src, long from, long n, long np, int shift, int16_t *sig, int16_t *exp) {
    int special = 0;
    for (long i = from; i < n; i++) {
        int32_t h = src[i], e = (h >> 10) & 0x1f, man = h & 0x3ff;
        int32_t s = e == 0x1f ? 0 : e ? (man | 0x400) : man;
        special |= e == 0x1f;
        sig[i] = (int16_t)(((h & 0x8000) ? -s : s) * (1 << shift));
        exp[i] = (int16_t)(s ? (e ? e : 1) : ZERO_EXP);
    }
    for (long i = n; i < np; i++) { sig[i] = 0; exp[i] = ZERO_EXP; }
    return special;
}

#if defined(__x86_64__)
/* split_scalar, 16 words at a time in AVX2 registers. */
__attribute__((target("avx2"))) static int split_avx2(const uint16_t *src, long n, long np, int shift, int16_t *sig,
                                                      int16_t *exp) {
    const __m256i zero = _mm256_setzero_si256(), top = _mm256_set1_epi16(0x1f), hidden = _mm256_set1_epi16(0x400);
    const __m256i mant = _mm256_set1_epi16(0x3ff), one = _mm256_set1_epi16(1), none = _mm256_set1_epi16(ZERO_EXP);
    __m256i special = zero;
    long i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i h = _mm256_loadu_si256((const __m256i *)(src + i));
        __m256i e = _mm256_and_si256(_mm256_srli_epi16(h, 10), top);
        __m256i inf_nan = _mm256_cmpeq_epi16(e, top);
        __m256i s = _mm256_or_si256(_mm256_and_si256(h, mant), _mm256_andnot_si256(_mm256_cmpeq_epi16(e, zero), hidden));
        s = _mm256_andnot_si256(inf_nan, s);
        __m256i neg = _mm256_srai_epi16(h, 15);
        __m256i sg = _mm256_sub_epi16(_mm256_xor_si256(_mm256_sll_epi16(s, _mm_cvtsi32_si128(shift)), neg), neg);
        __m256i ex = _mm256_blendv_epi8(_mm256_max_epi16(e, one), none, _mm256_cmpeq_epi16(s, zero));
        _mm256_storeu_si256((__m256i *)(sig + i), sg);
        _mm256_storeu_si256((__m256i *)(exp + i), ex);
        special = _mm256_or_si256(special, inf_nan);
    }
    return split_scalar(src, i, n, np, shift, sig, exp) | !_mm256_testz_si256(special, special);
}
#endif

static int split(const uint16_t *src, long n, long np, int shift, int16_t *sig, int16_t *exp) {
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx2")) return split_avx2(src, n, np, shift, sig, exp);
#endif
    return split_scalar(src, 0, n, np, shift, sig, exp);
}

/* special[t] = whether tile t of `width` of the n words holds an Inf or NaN. */
static void special_tiles(const uint16_t *src, long n, long tiles, long width, uint8_t *special) {
    for (long t = 0; t < tiles; t++) {
        int any = 0;
        for (long l = t * width; l < (t + 1) * width && l < n; l++) any |= (src[l] & 0x7c00) == 0x7c00;
        special[t] = any;
    }
}

/* A tile whose sum is not the aligned integer sum: an Inf or NaN operand (canonical NaN, or a signed Inf), or a sum of
   zero (-0 only if every product is -0). x, w: the tile's FP16 words, `valid` of them, the rest +0. */
static float tile_exception(const uint16_t *x, const uint16_t *w, long valid, long width) {
    int nan = 0, pos_inf = 0, neg_inf = 0, all_neg_zero = 1;
    for (long l = 0; l < width; l++) {
        uint16_t a = l < valid ? x[l] : 0, b = l < valid ? w[l] : 0;
        int neg = ((a ^ b) >> 15) & 1;
        int a_inf = (a & 0x7fff) == 0x7c00, b_inf = (b & 0x7fff) == 0x7c00;
        int a_zero = (a & 0x7fff) == 0, b_zero = (b & 0x7fff) == 0;
        if ((a & 0x7fff) > 0x7c00 || (b & 0x7fff) > 0x7c00 || (a_inf && b_zero) || (b_inf && a_zero)) nan = 1;
        if (a_inf || b_inf) { if (neg) neg_inf = 1; else pos_inf = 1; }
        if (!((a_zero || b_zero) && neg)) all_neg_zero = 0;
    }
    uint32_t bits = (nan || (pos_inf && neg_inf)) ? 0x7fc00000u : pos_inf ? 0x7f800000u : neg_inf ? 0xff800000u
                    : all_neg_zero ? 0x80000000u : 0;
    float out; memcpy(&out, &bits, 4); return out;
}

/* The aligned integer sum of one tile of `width` split pairs without Inf or NaN; *qmax its largest exponent sum (0 if
   every product is zero). */
static int64_t tile_scalar(const int16_t *sx, const int16_t *ex, const int16_t *sw, const int16_t *ew, long width,
                           int32_t *qmax_out) {
    int32_t qmax = 0;
    for (long l = 0; l < width; l++) { int32_t q = ex[l] + ew[l]; qmax = q > qmax ? q : qmax; }
    int64_t total = 0;
    for (long l = 0; l < width; l++) {
        int32_t p = (int32_t)sx[l] * sw[l], sh = qmax - ex[l] - ew[l];
        int32_t mag = (p < 0 ? -p : p) >> (sh < 31 ? sh : 31);
        total += p < 0 ? -mag : mag;
    }
    *qmax_out = qmax;
    return total;
}

/* One output element from its tiles' aligned sums (totals, qmaxes): each rounded once to FP32 (the exceptions, an Inf
   or NaN operand or a zero sum, by tile_exception from the row's and the column's FP16 words), added in order. */
static inline float add_tiles(const int64_t *totals, const int32_t *qmaxes, const uint8_t *row_specials,
                              const uint8_t *col_specials, const uint16_t *row, const uint16_t *col, long k, long width,
                              long tiles) {
    float acc = 0.0f;
    for (long t = 0; t < tiles; t++) {
        float s;
        if (row_specials[t] | col_specials[t] | (totals[t] == 0)) {
            long valid = k - t * width < width ? k - t * width : width;
            s = tile_exception(row + t * width, col + t * width, valid, width);
        } else {
            uint64_t bits = (uint64_t)(qmaxes[t] - GUARD - SCALE + 1023) << 52;
            double scale; memcpy(&scale, &bits, 8);
            s = (float)((double)totals[t] * scale);
        }
        acc = t == 0 ? s : acc + s;
    }
    return acc;
}

/* The columns x rows loop of accumulate without AVX2: the columns split one at a time into ws, we, wspecial; the rows
   already split into xs, xe, specials; each row's tile sums formed before their rounding and accumulation. */
static void columns_scalar(const uint16_t *x, long x_stride, long m, const uint16_t *w, long w_stride, long n, long k,
                           long kp, long width, float *out, const int16_t *xs, const int16_t *xe, int16_t *ws,
                           int16_t *we, const uint8_t *specials, uint8_t *wspecial, int64_t *totals,
                           int32_t *qmaxes) {
    const long tiles = kp / width;
    for (long j = 0; j < n; j++) {
        const uint16_t *col = w + j * w_stride;
        if (split(col, k, kp, WSHIFT, ws, we)) special_tiles(col, k, tiles, width, wspecial);
        else memset(wspecial, 0, tiles);
        for (long i = 0; i < m; i++) {
            /* the tiles' sums first (independent of each other), then their rounding and accumulation */
            for (long t = 0; t < tiles; t++) {
                long o = i * kp + t * width;
                totals[t] = tile_scalar(xs + o, xe + o, ws + t * width, we + t * width, width, qmaxes + t);
            }
            out[i * n + j] = add_tiles(totals, qmaxes, specials + i * tiles, wspecial, x + i * x_stride, col, k, width,
                                       tiles);
        }
    }
}

#if defined(__x86_64__)
#define AVX2_F16C __attribute__((target("avx2,f16c")))
/* tile_scalar in AVX2 registers, the column's FP16 words read as they are: pass 1 takes the exponent sums of 16 lanes
   a register (int16; a zero weight's, and a zero, Inf or NaN x's, out of the max) and notes Inf or NaN weights in
   *special; pass 2 forms each product exactly in FP32 (F16C's conversion, one multiply), scales it by
   2^(GUARD + SCALE - qmax) (exact: a power of two, the result below 2^28 and above FP32's normals) and truncates it
   toward zero to an int32 (vcvttps2dq): the aligned term itself. x: the row as FP32, xe: its exponent fields. */
__attribute__((target("avx2,f16c"), always_inline)) static inline int64_t tile_f16c(
        const float *xf, const int16_t *xe, const uint16_t *w, long width, int32_t *qmax_out, uint8_t *special) {
    const __m256i top = _mm256_set1_epi16(0x1f), one = _mm256_set1_epi16(1), none = _mm256_set1_epi16(ZERO_EXP);
    const __m256i magnitude = _mm256_set1_epi16(0x7fff), zero = _mm256_setzero_si256();
    __m256i qmax = zero, tmax = zero;
    long r = 0;
    for (; r + 16 <= width; r += 16) {
        /* t: the weight's magnitude bits (its largest >= 0x7C00: an Inf or NaN); a zero weight's q is set to 0, which
           leaves the max as it is (qmax starts at 0; every nonzero product has q >= 2) */
        __m256i t = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(w + r)), magnitude);
        tmax = _mm256_max_epu16(tmax, t);
        __m256i q = _mm256_add_epi16(_mm256_max_epi16(_mm256_srli_epi16(t, 10), one),
                                     _mm256_loadu_si256((const __m256i *)(xe + r)));
        qmax = _mm256_max_epi16(qmax, _mm256_andnot_si256(_mm256_cmpeq_epi16(t, zero), q));
    }
    __m128i m8 = _mm_max_epi16(_mm256_castsi256_si128(qmax), _mm256_extracti128_si256(qmax, 1));
    __m128i spec8 = _mm_cmpgt_epi16(_mm_max_epu16(_mm256_castsi256_si128(tmax), _mm256_extracti128_si256(tmax, 1)),
                                    _mm_set1_epi16(0x7bff));
    if (r < width) {  /* the last 8 lanes of a width not a multiple of 16 */
        __m128i h = _mm_loadu_si128((const __m128i *)(w + r));
        __m128i e = _mm_and_si128(_mm_srli_epi16(h, 10), _mm256_castsi256_si128(top));
        spec8 = _mm_or_si128(spec8, _mm_cmpeq_epi16(e, _mm256_castsi256_si128(top)));
        __m128i q = _mm_add_epi16(_mm_max_epi16(e, _mm256_castsi256_si128(one)), _mm_loadu_si128((const __m128i *)(xe + r)));
        q = _mm_blendv_epi8(q, _mm256_castsi256_si128(none),
                            _mm_cmpeq_epi16(_mm_and_si128(h, _mm256_castsi256_si128(magnitude)), _mm_setzero_si128()));
        m8 = _mm_max_epi16(m8, q);
    }
    m8 = _mm_max_epi16(m8, _mm_shuffle_epi32(m8, 0x4e));
    m8 = _mm_max_epi16(m8, _mm_shuffle_epi32(m8, 0xb1));
    m8 = _mm_max_epi16(m8, _mm_srli_epi32(m8, 16));
    int32_t qm = (int16_t)_mm_cvtsi128_si32(m8);
    *special = !_mm_testz_si128(spec8, spec8);
    uint32_t scale_bits = (uint32_t)(GUARD + SCALE - qm + 127) << 23;
    float scale_f; memcpy(&scale_f, &scale_bits, 4);
    __m256 scale = _mm256_set1_ps(scale_f);
    __m256i sum = zero, wide = zero;
    for (long k = 0; k < width / 8; k++) {
        __m256 p = _mm256_mul_ps(_mm256_loadu_ps(xf + 8 * k), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + 8 * k))));
        sum = _mm256_add_epi32(sum, _mm256_cvttps_epi32(_mm256_mul_ps(p, scale)));
        if ((k + 1) % BATCH == 0 || k + 1 == width / 8) {
            wide = _mm256_add_epi64(wide, _mm256_add_epi64(_mm256_cvtepi32_epi64(_mm256_castsi256_si128(sum)),
                                                           _mm256_cvtepi32_epi64(_mm256_extracti128_si256(sum, 1))));
            sum = zero;
        }
    }
    int64_t lanes[4];
    _mm256_storeu_si256((__m256i *)lanes, wide);
    *qmax_out = qm;
    return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}

/* The columns x rows loop for tile_f16c, the width a constant where WIDTH is one: the rows prepared once (xf, xe,
   specials), each column read as it is (its last, partial tile from a zero-padded copy). */
#define COLUMNS_F16C(NAME, WIDTH) \
    AVX2_F16C static void NAME(const uint16_t *x, long x_stride, long m, const uint16_t *w, long w_stride, long n, \
                               long k, long kp, long width_arg, float *out, long ldo, const float *xf, \
                               const int16_t *xe, const uint8_t *specials, uint8_t *wspecial, int64_t *totals, \
                               int32_t *qmaxes) { \
        const long width = WIDTH, tiles = kp / width, inside = k / width; \
        uint16_t tail[128]; \
        (void)width_arg; \
        for (long j = 0; j < n; j++) { \
            const uint16_t *col = w + j * w_stride; \
            if (inside < tiles) { \
                for (long l = 0; l < width; l++) tail[l] = inside * width + l < k ? col[inside * width + l] : 0; \
            } \
            for (long i = 0; i < m; i++) { \
                for (long t = 0; t < tiles; t++) { \
                    long o = i * kp + t * width; \
                    totals[t] = tile_f16c(xf + o, xe + o, t < inside ? col + t * width : tail, width, qmaxes + t, \
                                          wspecial + t); \
                } \
                out[i * ldo + j] = add_tiles(totals, qmaxes, specials + i * tiles, wspecial, x + i * x_stride, col, \
                                             k, width, tiles); \
            } \
        } \
    }
COLUMNS_F16C(columns_f16c_8, 8) COLUMNS_F16C(columns_f16c_16, 16) COLUMNS_F16C(columns_f16c_32, 32)
COLUMNS_F16C(columns_f16c_64, 64) COLUMNS_F16C(columns_f16c_any, width_arg)

typedef void (*columns_fn)(const uint16_t *, long, long, const uint16_t *, long, long, long, long, long, float *, long,
                           const float *, const int16_t *, const uint8_t *, uint8_t *, int64_t *, int32_t *);

/* One thread's share of the columns (each output element is formed by one thread alone, by the same code: the
   results do not depend on how the columns are shared). */
struct columns_job {
    columns_fn fn;
    const uint16_t *x, *w;
    long x_stride, m, w_stride, n, k, kp, width, ldo;
    float *out;
    const float *xf;
    const int16_t *xe;
    const uint8_t *specials;
    uint8_t *wspecial;
    int64_t *totals;
    int32_t *qmaxes;
};

static void *run_columns_job(void *arg) {
    struct columns_job *J = arg;
    J->fn(J->x, J->x_stride, J->m, J->w, J->w_stride, J->n, J->k, J->kp, J->width, J->out, J->ldo, J->xf, J->xe,
          J->specials, J->wspecial, J->totals, J->qmaxes);
    return NULL;
}
#endif

#define MAX_THREADS 16
#define THREAD_WORK (1L << 18)
static int threads_wanted = 1;

/* Threads a large matrix product's columns are shared among (1 to MAX_THREADS; a product gets one thread per
   THREAD_WORK products at most). Returns the setting. */
int set_threads(int threads) {
    threads_wanted = threads < 1 ? 1 : threads > MAX_THREADS ? MAX_THREADS : threads;
    return threads_wanted;
}

#if defined(__x86_64__)
/* The columns shared among threads (see set_threads); one thread (this one) where the product is small, the
   threads' scratch cannot be allocated or a thread cannot be started (its share then run here). */
static void columns_threaded(columns_fn fn, const uint16_t *x, long x_stride, long m, const uint16_t *w,
                             long w_stride, long n, long k, long kp, long width, float *out, const float *xf,
                             const int16_t *xe, const uint8_t *specials, uint8_t *wspecial, int64_t *totals,
                             int32_t *qmaxes) {
    long tiles = kp / width, parts = threads_wanted, most = m * n * kp / THREAD_WORK;
    if (parts > n) parts = n;
    if (parts > most) parts = most;
    unsigned char *scratch = parts > 1 ? malloc((sizeof(int64_t) + sizeof(int32_t) + 1) * tiles * (parts - 1)) : 0;
    if (!scratch) {
        fn(x, x_stride, m, w, w_stride, n, k, kp, width, out, n, xf, xe, specials, wspecial, totals, qmaxes);
        return;
    }
    struct columns_job jobs[MAX_THREADS];
    pthread_t ids[MAX_THREADS];
    int started[MAX_THREADS] = {0};
    long share = (n + parts - 1) / parts;
    for (long p = 0; p < parts; p++) {
        long j0 = p * share < n ? p * share : n, j1 = j0 + share < n ? j0 + share : n;
        unsigned char *mine = scratch + (sizeof(int64_t) + sizeof(int32_t) + 1) * tiles * (p ? p - 1 : 0);
        jobs[p] = (struct columns_job){fn, x, w + j0 * w_stride, x_stride, m, w_stride, j1 - j0, k, kp, width, n,
                                       out + j0, xf, xe, specials,
                                       p ? mine + (sizeof(int64_t) + sizeof(int32_t)) * tiles : wspecial,
                                       p ? (int64_t *)mine : totals,
                                       p ? (int32_t *)(mine + sizeof(int64_t) * tiles) : qmaxes};
    }
    for (long p = 1; p < parts; p++)
        started[p] = pthread_create(&ids[p], NULL, run_columns_job, &jobs[p]) == 0;
    run_columns_job(&jobs[0]);
    for (long p = 1; p < parts; p++) {
        if (started[p]) pthread_join(ids[p], NULL);
        else run_columns_job(&jobs[p]);
    }
    free(scratch);
}
#endif

/* out[i * n + j] = dot_tiles(x[i, :], w[j, :], width): x: m rows of k FP16 words, row i at x + i * x_stride; w: n
   columns of k FP16 words, column j at w + j * w_stride; kp = k rounded up to whole tiles. Returns 0, or -1 when out
   of memory. */
static int accumulate(const uint16_t *x, long x_stride, long m, const uint16_t *w, long w_stride, long n, long k,
                      long kp, long width, float *out) {
    long tiles = kp / width;
    int16_t *xs = malloc(sizeof(int16_t) * 2 * (m + 1) * kp);
    float *xf = malloc(sizeof(float) * m * kp);
    uint8_t *specials = calloc((m + 1) * tiles, 1);
    int64_t *totals = malloc(sizeof(int64_t) * tiles);
    int32_t *qmaxes = malloc(sizeof(int32_t) * tiles);
    int ok = xs && xf && specials && totals && qmaxes;
    if (ok) {
        int16_t *xe = xs + m * kp, *ws = xe + m * kp, *we = ws + kp;
        uint8_t *wspecial = specials + m * tiles;
        for (long i = 0; i < m; i++)
            if (split(x + i * x_stride, k, kp, XSHIFT, xs + i * kp, xe + i * kp))
                special_tiles(x + i * x_stride, k, tiles, width, specials + i * tiles);
#if defined(__x86_64__)
        if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c") && width % 8 == 0 && width <= 128) {
            for (long i = 0; i < m; i++) {
                convert(x + i * x_stride, xf + i * kp, k);
                for (long c = k; c < kp; c++) xf[i * kp + c] = 0.0f;
            }
            columns_fn columns = width == 8 ? columns_f16c_8 : width == 16 ? columns_f16c_16
                                 : width == 32 ? columns_f16c_32 : width == 64 ? columns_f16c_64 : columns_f16c_any;
            columns_threaded(columns, x, x_stride, m, w, w_stride, n, k, kp, width, out, xf, xe, specials, wspecial,
                             totals, qmaxes);
        } else
#endif
        columns_scalar(x, x_stride, m, w, w_stride, n, k, kp, width, out, xs, xe, ws, we, specials, wspecial, totals,
                       qmaxes);
    }
    free(xs); free(xf); free(specials); free(totals); free(qmaxes);
    return ok ? 0 : -1;
}

#if defined(__x86_64__)
__attribute__((target("avx,f16c")))
static void round_f16c(const float *acc, long m, long n, const uint16_t *bias, uint16_t *out) {
    for (long i = 0; i < m; i++)
        for (long j = 0; j < n; j++) {
            float v = bias ? acc[i * n + j] + h2f(bias[j]) : acc[i * n + j];
            uint16_t h = _cvtss_sh(v, _MM_FROUND_TO_NEAREST_INT);
            out[i * n + j] = ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) ? 0x7e00 : h;
        }
}
#endif

/* out[i * n + j] = to_fp16(acc[i * n + j] + bias[j]) (no addition when bias is NULL): the FP32 addition, then FP32 ->
   FP16 rounded to nearest even (F16C: overflow to Inf, subnormals kept) and every NaN the canonical 0x7E00. Returns 0,
   writing nothing, without F16C. */
int round_to_fp16(const float *acc, long m, long n, const uint16_t *bias, uint16_t *out) {
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c")) {
        round_f16c(acc, m, n, bias, out);
        return 1;
    }
#endif
    return 0;
}

#if defined(__x86_64__)
/* The vector unit's element-wise operations on FP16 operands (numerics.vadd, vsub, vmul, vscale_shift): each
   operand element (i, j) at p + i * rs + j * cs (strides in words, 0 to broadcast), the FP32 operation (op 0: a + b,
   1: a - b, 2: a * b, 3: a * b + c, the product exact and the addition rounded once), rounded to FP16 (F16C: nearest
   even, overflow to Inf, subnormals kept) and every NaN the canonical 0x7E00; out: rows x n contiguous. */
__attribute__((target("avx2,f16c")))
static void elementwise_f16c(int op, const uint16_t *a, long ars, long acs, const uint16_t *b, long brs, long bcs,
                             const uint16_t *c, long crs, long ccs, long rows, long n, uint16_t *out) {
    const __m128i magnitude = _mm_set1_epi16(0x7fff), inf = _mm_set1_epi16(0x7c00), nan = _mm_set1_epi16(0x7e00);
    for (long i = 0; i < rows; i++) {
        const uint16_t *pa = a + i * ars, *pb = b + i * brs, *pc = c ? c + i * crs : 0;
        uint16_t *po = out + i * n;
        long j = 0;
        if (acs == 1 && (bcs == 1 || bcs == 0) && (!c || ccs == 1 || ccs == 0)) {
            /* 8 lanes at a time: the same conversions, operation and rounding per lane */
            const __m256 y0 = _mm256_set1_ps(_cvtsh_ss(pb[0])), z0 = _mm256_set1_ps(c ? _cvtsh_ss(pc[0]) : 0.0f);
            for (; j + 8 <= n; j += 8) {
                __m256 x = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(pa + j)));
                __m256 y = bcs ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(pb + j))) : y0, v;
                switch (op) {
                    case 0: v = _mm256_add_ps(x, y); break;
                    case 1: v = _mm256_sub_ps(x, y); break;
                    case 2: v = _mm256_mul_ps(x, y); break;
                    default: v = _mm256_add_ps(_mm256_mul_ps(x, y),
                                               ccs ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(pc + j))) : z0);
                }
                __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
                h = _mm_blendv_epi8(h, nan, _mm_cmpgt_epi16(_mm_and_si128(h, magnitude), inf));
                _mm_storeu_si128((__m128i *)(po + j), h);
            }
        }
        for (; j < n; j++) {
            float x = _cvtsh_ss(pa[j * acs]), y = _cvtsh_ss(pb[j * bcs]), v;
            switch (op) {
                case 0: v = x + y; break;
                case 1: v = x - y; break;
                case 2: v = x * y; break;
                default: { float p = x * y; v = p + _cvtsh_ss(pc[j * ccs]); }
            }
            uint16_t h = _cvtss_sh(v, _MM_FROUND_TO_NEAREST_INT);
            po[j] = ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) ? 0x7e00 : h;
        }
    }
}
#endif

/* elementwise_f16c where the CPU has AVX2 and F16C (returns 1); returns 0, writing nothing, elsewhere. */
int elementwise(int op, const uint16_t *a, long ars, long acs, const uint16_t *b, long brs, long bcs,
                const uint16_t *c, long crs, long ccs, long rows, long n, uint16_t *out) {
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c")) {
        elementwise_f16c(op, a, ars, acs, b, brs, bcs, c, crs, ccs, rows, n, out);
        return 1;
    }
#endif
    return 0;
}

/* acc[i] = dot_tiles(a[i, :], b[i, :], width) for each of m rows (row i of a at a + i * a_stride, of b at
   b + i * b_stride): accumulate of each row against its own one column; with out (only where round_to_fp16 runs),
   also out = round_to_fp16(acc). Returns 0, or -1 when out of memory. */
int row_dots(const uint16_t *a, long a_stride, const uint16_t *b, long b_stride, long m, long k, long kp, long width,
             float *acc, uint16_t *out) {
    for (long i = 0; i < m; i++)
        if (accumulate(a + i * a_stride, k, 1, b + i * b_stride, k, 1, k, kp, width, acc + i)) return -1;
    if (out) round_to_fp16(acc, m, 1, NULL, out);
    return 0;
}

/* acc[i * n + j] = dot_tiles(x[i, :], w[j, :], width) (see accumulate); with out (only where round_to_fp16 runs),
   also out = round_to_fp16(acc, bias). Returns 0, or -1 when out of memory. */
int tree_matmul(const uint16_t *x, long x_stride, long m, const uint16_t *w, long w_stride, long n, long k, long kp,
                long width, float *acc, const uint16_t *bias, uint16_t *out) {
    if (accumulate(x, x_stride, m, w, w_stride, n, k, kp, width, acc)) return -1;
    if (out) round_to_fp16(acc, m, n, bias, out);
    return 0;
}
"""
INT8_SOURCE = r"""
/* The INT8 tile's exact sums (numerics.int8_tile_sums, steps 1-3 before the rounding): for row i of x (m rows of k
   FP16 words, x_stride apart) and tile t (tile weights from t * tile), emax[i * tiles + t] = the largest exponent
   field of the tile's nonzero activations (subnormals 1; 1 for none), or -1 when one is Inf or NaN (the caller
   takes the definition there); each activation as the integer sig << INT8_GUARD >> (emax - exp), signed; and
   s[(i * n + j) * tiles + t] = its sum of products with column j's INT8 weights (k bytes at q + j * q_stride).
   Exact: at most 24-bit activations times 7-bit weights, 128 a tile at u280, in 64 bits. Returns 0, or -1 when
   out of memory. */
int int8_sums(const uint16_t *x, long x_stride, long m, const int8_t *q, long q_stride, long n, long k, long tile,
              int64_t *s, int32_t *emax_out) {
    long tiles = k > 0 ? (k + tile - 1) / tile : 1;
    int32_t *xi = (int32_t *)malloc(sizeof(int32_t) * (tile > 0 ? tile : 1));
    if (!xi) return -1;
    for (long i = 0; i < m; i++) {
        const uint16_t *row = x + i * x_stride;
        for (long t = 0; t < tiles; t++) {
            long k0 = t * tile, len = k - k0 < tile ? k - k0 : tile;
            int32_t emax = 1, special = 0;
            for (long kk = 0; kk < len; kk++) {
                uint16_t h = row[k0 + kk];
                int32_t e = (h >> 10) & 0x1f;
                if (e == 0x1f) special = 1;
                else if ((h & 0x7fff) && (e > emax)) emax = e;
            }
            emax_out[i * tiles + t] = special ? -1 : emax;
            for (long kk = 0; kk < len; kk++) {
                uint16_t h = row[k0 + kk];
                int32_t e = (h >> 10) & 0x1f, man = h & 0x3ff;
                int32_t sig = e == 0 ? man : (e == 0x1f ? 0 : (man | 0x400));
                int32_t shift = emax - (e == 0 ? 1 : e);
                int32_t v = shift >= 31 ? 0 : ((sig << INT8_GUARD) >> shift);
                xi[kk] = (h & 0x8000) ? -v : v;
            }
            for (long j = 0; j < n; j++) {
                const int8_t *col = q + j * q_stride + k0;
                int64_t acc = 0;
                for (long kk = 0; kk < len; kk++) acc += (int64_t)xi[kk] * col[kk];
                s[(i * n + j) * tiles + t] = acc;
            }
        }
    }
    free(xi);
    return 0;
}
"""
FLAGS = ["-O3", "-fPIC", "-shared", "-pthread", "-ffp-contract=off", "-fno-fast-math", "-fno-unsafe-math-optimizations"]
MAX_WIDTH = 1024

_lock = threading.Lock()
_lib = None
_tried = False
_rounds = False


def _source() -> str:
    """SOURCE with the MAC tree's constants from numerics.py."""
    from ringgpt.hw import numerics
    return (f"#define GUARD {numerics.TREE_GUARD_BITS}\n#define SCALE {numerics.PRODUCT_SCALE}\n"
            f"#define INT8_GUARD {numerics.INT8_GUARD_BITS}\n" + SOURCE + INT8_SOURCE)


def _cache_dir() -> Path:
    root = os.environ.get("RINGGPT_CACHE_DIR") or Path.home() / ".cache" / "ringgpt"
    return Path(root) / "native"


class NativeRebuildWarning(UserWarning):
    """A compiled kernel in the cache failed to load (a damaged file) and is being built again."""


def _flags(for_this_cpu: bool) -> list:
    return FLAGS + (["-march=native"] if for_this_cpu else [])


def library_path(name: str, source: str, *, for_this_cpu: bool = False) -> Path:
    """Where the cache keeps `source` compiled (keyed by the source, the flags and, for_this_cpu, this CPU)."""
    key = source + " ".join(_flags(for_this_cpu)) + (_cpu_features() if for_this_cpu else "")
    return _cache_dir() / f"{name}-{hashlib.sha256(key.encode()).hexdigest()[:16]}.so"


def _compile(path: Path, name: str, source: str, flags: list) -> None:
    """Compiles `source` into a temporary folder beside `path` and renames the library to `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        src = Path(tmp) / f"{name}.c"
        src.write_text(source)
        out = Path(tmp) / path.name
        subprocess.run([os.environ.get("CC", "cc"), *flags, str(src), "-o", str(out)], check=True,
                       capture_output=True, timeout=120)
        os.replace(out, path)


def build(name: str, source: str, *, for_this_cpu: bool = False):
    """C `source` compiled with FLAGS into the cache (keyed by its hash) and loaded: a ctypes.CDLL, or None when
    RINGGPT_NATIVE=0, no compiler is there or the build fails (callers fall back to their numpy definition).
    A cached library that fails to load (a damaged file) is built again, with a NativeRebuildWarning.
    `for_this_cpu` adds -march=native, the cache then keyed by this CPU's features too."""
    if os.environ.get("RINGGPT_NATIVE", "1") == "0":
        return None
    path = library_path(name, source, for_this_cpu=for_this_cpu)
    try:
        if not path.exists():
            _compile(path, name, source, _flags(for_this_cpu))
        try:
            return ctypes.CDLL(str(path))
        except OSError as exc:
            warnings.warn(NativeRebuildWarning(f"the compiled kernel {path} fails to load ({exc}): building it again"),
                          stacklevel=2)
        _compile(path, name, source, _flags(for_this_cpu))
        return ctypes.CDLL(str(path))
    except (OSError, subprocess.SubprocessError):
        return None


def _cpu_features() -> str:
    """What -march=native depends on: the machine and, on Linux, the CPU's model name and feature flags."""
    lines = []
    try:
        with open("/proc/cpuinfo") as f:
            lines = [line for line in f if line.startswith(("flags", "model name", "Features"))][:3]
    except OSError:
        pass
    return platform.machine() + "".join(lines)


def _threads() -> int:
    """Threads the matrix kernel shares a large product's columns among: RINGGPT_THREADS (default 1; the results are
    the same for any number). Not more by default: on a busy machine (the 2-core one measured, shared) a second
    thread made a 768 x 2096 decode product twice as slow in wall time, waiting for a core."""
    try:
        return max(1, int(os.environ.get("RINGGPT_THREADS", "1")))
    except ValueError:
        return 1


def library():
    """The loaded kernel library, or None (turned off, no compiler, build failed)."""
    global _lib, _tried, _rounds
    if _tried:
        return _lib
    with _lock:
        if _tried:
            return _lib
        _tried = True
        lib = build("treematmul", _source())
        if lib is None:
            return None
        fn = lib.tree_matmul
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_long, ctypes.c_long,
                       ctypes.c_long, ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        fn = lib.row_dots
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_long,
                       ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
        fn = lib.int8_sums
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_long, ctypes.c_long,
                       ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
        fn = lib.set_threads
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_int]
        fn(_threads())
        fn = lib.elementwise
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_int] + [ctypes.c_void_p, ctypes.c_long, ctypes.c_long] * 3 + [
            ctypes.c_long, ctypes.c_long, ctypes.c_void_p]
        fn = lib.round_to_fp16
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
        _rounds = bool(fn(None, 0, 0, None, None))
        _lib = lib
        return _lib


def matmul_acc(rows: np.ndarray, w: np.ndarray, width: int) -> np.ndarray | None:
    """numerics._matmul_acc(rows, w, width) with the compiled kernel, or None when it is not available."""
    if library() is None or width > MAX_WIDTH:
        return None
    return _tree_matmul(rows, w, width, None, False)


def int8_sums(rows: np.ndarray, q: np.ndarray, tile: int) -> tuple | None:
    """(s, emax) of numerics.int8_matmul_acc's tiles with the compiled kernel: s (M, N, tiles) int64, the exact sums
    of the tiles' aligned activations times the weights, and emax (M, tiles), each tile's largest exponent field (-1
    where an activation is Inf or NaN); None when the kernel is not available. rows (M, K) FP16, q (K, N) INT8."""
    if library() is None:
        return None
    m, k = rows.shape
    n = q.shape[1]
    tiles = max(1, -(-k // tile))
    rows, x_stride = _word_rows(rows, k)
    cols = q.T
    if cols.strides[1] != 1 or cols.strides[0] < 0:
        cols = np.ascontiguousarray(cols)
    s = np.empty((m, n, tiles), np.int64)
    emax = np.empty((m, tiles), np.int32)
    if m and n and _lib.int8_sums(address(rows), x_stride, m, address(cols), cols.strides[0] if n > 1 else k, n, k,
                                  tile, address(s), address(emax)):
        raise MemoryError(f"the compiled INT8 kernel could not allocate its scratch for a {tile}-weight tile")
    return s, emax


def rounds_fp16() -> bool:
    """Whether matmul_fp16 and round_fp16 run here: the kernel is built and the CPU converts to FP16 (F16C)."""
    return library() is not None and _rounds


def matmul_fp16(rows: np.ndarray, w: np.ndarray, width: int, bias=None) -> np.ndarray | None:
    """to_fp16(numerics._matmul_acc(rows, w, width) + bias) (FP32 addition of the FP16 bias per column, if given)
    with the compiled kernel, or None when it is not available (rounds_fp16)."""
    if not rounds_fp16() or width > MAX_WIDTH:
        return None
    return _tree_matmul(rows, w, width, bias, True)


ELEMENTWISE_OPS = {"add": 0, "sub": 1, "mul": 2, "scale_shift": 3}


def _word_strides(a: np.ndarray, rows: int, n: int):
    """(row stride, column stride) in FP16 words of an FP16 operand of a rows x n operation: 0-d (a scalar),
    (n,) or (1, n) (one row for every row), (rows, 1) (a scalar per row) or (rows, n); None for anything else."""
    if a.dtype != np.float16:
        return None
    shape, strides = a.shape, a.strides
    if len(shape) == 0:
        return 0, 0
    if len(shape) == 1:
        return (0, strides[0] >> 1) if shape[0] == n else (0, 0) if shape[0] == 1 else None
    if len(shape) != 2 or shape[0] not in (1, rows) or shape[1] not in (1, n):
        return None
    return (0 if shape[0] == 1 else strides[0] >> 1), (0 if shape[1] == 1 else strides[1] >> 1)


def elementwise_fp16(op: str, a: np.ndarray, b: np.ndarray, c: np.ndarray | None = None) -> np.ndarray | None:
    """numerics.vadd, vsub, vmul (op "add", "sub", "mul": a op b) or vscale_shift ("scale_shift": a * b + c) of FP16
    arrays with the compiled kernel: a of shape (n,) or (rows, n), the others broadcast to it (see _word_strides).
    None when the kernel or F16C is not there or the shapes are others (the caller's numpy definition then)."""
    if not rounds_fp16() or a.ndim not in (1, 2):
        return None
    rows, n = (1, a.shape[0]) if a.ndim == 1 else a.shape
    sa, sb = _word_strides(a, rows, n), _word_strides(b, rows, n)
    sc = (0, 0) if c is None else _word_strides(c, rows, n)
    if sa is None or sb is None or sc is None:
        return None
    out = np.empty(a.shape, np.float16)
    if out.size and not _lib.elementwise(ELEMENTWISE_OPS[op], address(a), sa[0], sa[1], address(b), sb[0], sb[1],
                                         None if c is None else address(c), sc[0], sc[1], rows, n, address(out)):
        return None
    return out


def row_dots_fp16(a: np.ndarray, b: np.ndarray, width: int) -> np.ndarray:
    """to_fp16 of dot_tiles(a[i], b[i], width) for every row i of a and b (2-D, one shape): matmul_fp16(a[i:i + 1],
    b[i:i + 1].T, width)[0, 0] per row, in one call; only where rounds_fp16() and width <= MAX_WIDTH."""
    m, k = a.shape
    if m == 0:
        return np.empty(0, np.float16)
    kp = max(1, -(-k // width)) * width
    a, a_stride = _word_rows(a, k)
    b, b_stride = _word_rows(b, k)
    memory = np.empty(m + -(-m // 2), np.float32)
    acc = address(memory)
    if _lib.row_dots(address(a), a_stride, address(b), b_stride, m, k, kp, width, acc, acc + 4 * m):
        raise MemoryError(f"the compiled kernel could not allocate its scratch for {m} dot products of {k}")
    return memory[m:].view(np.float16)[:m]


def round_fp16(acc: np.ndarray, bias=None) -> np.ndarray:
    """numerics.to_fp16(acc + bias) of FP32 accumulators (M, N) (bias: N FP16 values added in FP32, or None) with the
    compiled conversion; only where rounds_fp16()."""
    acc = np.ascontiguousarray(acc, np.float32)
    out = np.empty(acc.shape, np.float16)
    if out.size:
        bias = None if bias is None else np.ascontiguousarray(bias, np.float16)
        _lib.round_to_fp16(address(acc), acc.shape[0], acc.shape[1], None if bias is None else address(bias),
                           address(out))
    return out


def _tree_matmul(rows: np.ndarray, w: np.ndarray, width: int, bias, fp16: bool) -> np.ndarray:
    m, k = rows.shape
    n = w.shape[1]
    if m == 0 or n == 0:
        return np.empty((m, n), np.float16 if fp16 else np.float32)
    tiles = max(1, -(-k // width))
    kp = tiles * width
    rows, x_stride = _word_rows(rows, k)
    cols, w_stride = _word_rows(w.T, k)  # (n, k): column j's k weights
    if bias is not None:
        bias = np.ascontiguousarray(bias, np.float16)
    # One allocation: the FP32 result, then the FP16 result.
    memory = np.empty(m * n + (-(-m * n // 2) if fp16 else 0), np.float32)
    acc = address(memory)
    if _lib.tree_matmul(address(rows), x_stride, m, address(cols), w_stride, n, k, kp, width, acc,
                        None if bias is None else address(bias), acc + 4 * m * n if fp16 else None):
        raise MemoryError(f"the compiled matmul kernel could not allocate its scratch for {m} x {k} x {n}")
    if fp16:
        return memory[m * n:].view(np.float16)[:m * n].reshape(m, n)
    return memory[:m * n].reshape(m, n)


def _interface_address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def _data_field_reader():
    """A fast reader of an ndarray's data pointer: NumPy's array object (PyArrayObject_fields) holds it right after
    the object header (PyArray_DATA), read here through ctypes, a few times faster than __array_interface__. Used only
    once checked against __array_interface__ on arrays and views of several kinds; else None."""
    at = ctypes.c_void_p.from_address
    header = object.__basicsize__
    try:
        base = np.arange(64, dtype=np.float16)
        samples = [base, base[3:], base[::-2], base.reshape(8, 8)[1:, 2:].T, np.empty((0, 3)), np.float32(1)[()],
                   np.ndarray((2, 4), np.float16, base, 6, (16, 2))]
        samples = [x for x in samples if isinstance(x, np.ndarray)]
        if all((at(id(x) + header).value or 0) == _interface_address(x) for x in samples):
            return lambda a: at(id(a) + header).value or 0
    except (ValueError, OverflowError, TypeError):
        pass
    return None


address = _data_field_reader() or _interface_address
"""address(a): the address of an array's first element, for a kernel's pointer argument."""


def _word_rows(a: np.ndarray, k: int) -> tuple:
    """(a, its row stride in FP16 words) for the kernel: rows of k consecutive words (a copy if a is not)."""
    if a.dtype != np.float16 or a.strides[1] != 2 or a.strides[0] % 2 or a.strides[0] < 0:
        a = np.ascontiguousarray(a, np.float16)
    return a, (a.strides[0] // 2 if a.shape[0] > 1 else k)
