"""The sampler's draw among kept logits: float32 weights, the top-p nucleus, one draw; defined once in numpy
(`draw_plain`) and compiled from the same constants into a C kernel (`draw`) that is equal to it bit for bit
(tests/test_sampling_draw.py) and is what the sampler runs; the numpy definition is the fallback where no C
compiler is there.

For `values`, the logits that top-k kept (the whole row without top-k), in vocabulary order:

* x = values / temperature in float32 (values rounded to float32 first; x / 1 is x); w = exp(x - max x).
* exp: Cody-Waite reduction by ln 2 in two parts, the degree-6 polynomial of Cephes' expf and a scale by 2^n, every
  step a float32 operation without fused multiply-add (n = d log2(e) rounded half to even by adding and subtracting
  1.5 x 2^23). Within one float32 step of exp for d in [-87, 0]; d below -87 (e^-87 < 2^-125, under float32's
  smallest normal) gives 0, so -Inf logits weigh nothing. The largest weight is 1.
* the total: 16 float32 lanes, lane j adding the weights at positions j, j + 16, j + 32, ... in order, then the lanes
  folded in halves (lane j += lane j + 8, then + 4, + 2, + 1): the order a 16-wide vector accumulator keeps.
* top-p < 1: the nucleus is the shortest prefix of the weights sorted descending (ties by position) whose running
  float32 sum reaches float32(top_p) x total (all of them if none does); the other weights become 0.
* the draw: cdf = the running float32 sum of the weights in order; with u in [0, 1) (the sampler's one random number
  for the token), the first position whose cdf exceeds u x cdf[-1] (a float64 product), but no later than the first
  position whose cdf reaches cdf[-1].

The kernel finds the nucleus by popping a heap of the weights >= NEAR = 2^-16 (found while weighing) in descending order
until the target is reached; only rows whose nucleus reaches below NEAR heap the rest.
"""
from __future__ import annotations

import ctypes
import threading

import numpy as np

from ringgpt.hw import native

LOG2E = np.float32(1.44269504088896341)
LN2_HI = np.float32(0.693359375)
"""ln 2 to 9 bits: n x LN2_HI is exact for |n| <= 128."""
LN2_LO = np.float32(-2.12194440e-4)
POLY = tuple(np.float32(c) for c in (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2,
                                     1.6666665459e-1, 5.0000001201e-1))
"""exp(r) = 1 + r + r^2 (POLY[5] + r (POLY[4] + ...)): Cephes' expf, highest power first."""
FLUSH = np.float32(-87.0)
ROUND = np.float32(12582912.0)
"""1.5 x 2^23: v + ROUND - ROUND is v rounded to an integer, half to even, for |v| < 2^22."""
LANES = 16
NEAR = np.float32(2.0 ** -16)
"""The kernel finds the weights >= NEAR (of the largest, 1) while weighing: the nucleus is looked for there first."""
NOT_FINITE = -1
"""What draw returns when max x is not finite (a NaN or +Inf logit, or all -Inf): the weights are undefined."""


def exp_weights(d: np.ndarray) -> np.ndarray:
    """exp(d) for float32 d <= 0 as defined above (0 below FLUSH)."""
    d = np.asarray(d, np.float32)
    live = d >= FLUSH
    d = np.where(live, d, np.float32(0))
    n = (d * LOG2E + ROUND) - ROUND
    r = (d - n * LN2_HI) - n * LN2_LO
    p = np.full_like(r, POLY[0])
    for c in POLY[1:]:
        p = p * r + c
    y = (p * (r * r) + r) + np.float32(1)
    scale = ((n.astype(np.int32) + 127) << 23).view(np.float32)
    return np.where(live, y * scale, np.float32(0))


def lane_sum(terms: np.ndarray) -> np.float32:
    """The sum of float32 `terms` in the lane order defined above."""
    terms = np.asarray(terms, np.float32)
    padded = np.zeros(max(1, -(-terms.size // LANES)) * LANES, np.float32)
    padded[:terms.size] = terms
    lanes = np.add.accumulate(padded.reshape(-1, LANES), axis=0)[-1]
    while lanes.size > 1:
        lanes = lanes[:lanes.size // 2] + lanes[lanes.size // 2:]
    return lanes[0]


def draw_plain(values: np.ndarray, temperature: float, top_p: float, u: float) -> int:
    """The position among `values` that the definition above draws with `u`, or NOT_FINITE."""
    x = np.asarray(values).astype(np.float32)
    if temperature != 1.0:
        x = x / np.float32(temperature)
    top = x.max()
    if not np.isfinite(top):
        return NOT_FINITE
    weights = exp_weights(x - top)
    if top_p < 1.0:
        order = np.argsort(-weights, kind="stable")
        nucleus = order[: int(np.searchsorted(np.cumsum(weights[order]), np.float32(top_p) * lane_sum(weights))) + 1]
        weights = np.where(np.isin(np.arange(weights.size), nucleus), weights, np.float32(0))
    cdf = np.cumsum(weights)
    last_possible = int(np.searchsorted(cdf, cdf[-1]))  # guards against u * total rounding up to total
    return min(int(np.searchsorted(cdf.astype(np.float64), u * float(cdf[-1]), side="right")), last_possible)


_SOURCE = native.FP16_SOURCE + r"""
#include <math.h>
#define LOG2E %(LOG2E)sf
#define LN2_HI %(LN2_HI)sf
#define LN2_LO %(LN2_LO)sf
#define FLUSH %(FLUSH)sf
#define ROUND %(ROUND)sf
#define LANES %(LANES)d
#define NEAR %(NEAR)sf
#define NOT_FINITE %(NOT_FINITE)d
static const float POLY[6] = {%(POLY)s};

/* One block of LANES floats in a GCC vector: the same IEEE operations whichever instructions -march=native gives
   (no contraction into fused multiply-adds: -ffp-contract=off). */
typedef float vf __attribute__((vector_size(4 * LANES)));
typedef int vi __attribute__((vector_size(4 * LANES)));
typedef float vf_u __attribute__((vector_size(4 * LANES), aligned(4)));
#define INLINE static inline __attribute__((always_inline))

/* The larger of a and b, NaN where either is NaN (as numpy's max) */
INLINE vf vmax(vf a, vf b) { vi m = (a > b) | (a != a); return (vf)(((vi)a & m) | ((vi)b & ~m)); }

INLINE vf exp_weights(vf d) {
    vi live = d >= FLUSH;
    d = (vf)((vi)d & live);
    vf n = (d * LOG2E + ROUND) - ROUND;
    vf r = (d - n * LN2_HI) - n * LN2_LO;
    vf p = (vf){} + POLY[0];
    for (int i = 1; i < 6; i++) p = p * r + POLY[i];
    vf y = (p * (r * r) + r) + 1.0f;
    vf scale = (vf)((__builtin_convertvector(n, vi) + 127) << 23);
    return (vf)((vi)(y * scale) & live);
}

/* Bit j set where lane j of `hit` is set (-1). */
INLINE unsigned lane_mask(vi hit) {
#if defined(__AVX512F__) && LANES == 16
    return _mm512_cmpneq_epi32_mask((__m512i)hit, _mm512_setzero_si512());
#elif defined(__AVX2__) && LANES == 16
    __m256 half[2];
    memcpy(half, &hit, sizeof hit);
    return (unsigned)_mm256_movemask_ps(half[0]) | (unsigned)_mm256_movemask_ps(half[1]) << 8;
#else
    unsigned mask = 0;
    for (int j = 0; j < LANES; j++) mask |= (unsigned)(hit[j] & 1) << j;
    return mask;
#endif
}

/* Heap order: larger weight first, then lower position (the stable descending sort). Keys: weight bits above the
   complement of the position; the weights are >= 0, so their bits order as they do. */
INLINE unsigned long long key(const float *w, int pos) {
    unsigned bits; memcpy(&bits, w + pos, 4);
    return (unsigned long long)bits << 32 | (unsigned)~pos;
}

/* x in place: w = exp_weights(x - max x) in blocks of LANES (the last one padded with -Inf, which weighs 0), their
   total into *total, max x into *top; the heap keys of the weights >= NEAR into keys[]; returns their count. */
static long weigh(float *x, long n, float *top_out, float *total, unsigned long long *keys) {
    long full = n / LANES * LANES;
    vf pad, top;
    for (int j = 0; j < LANES; j++) pad[j] = full + j < n ? x[full + j] : -INFINITY;
    top = pad;
    for (long i = 0; i < full; i += LANES) top = vmax(top, *(vf_u *)(x + i));
    float best = top[0];
    for (int j = 1; j < LANES; j++) best = top[j] > best || top[j] != top[j] ? top[j] : best;
    *top_out = best;
    vf acc = {};
    long count = 0;
    for (long i = 0; i <= full; i += LANES) {
        vf e = exp_weights((i < full ? *(vf_u *)(x + i) : pad) - best);
        if (i < full) *(vf_u *)(x + i) = e;
        else for (int j = 0; full + j < n; j++) x[full + j] = e[j];
        acc += e;
        unsigned mask = lane_mask(e >= NEAR);
        while (mask) { int b = __builtin_ctz(mask); keys[count++] = key(x, (int)(i + b)); mask &= mask - 1; }
    }
    for (int half = LANES / 2; half >= 1; half /= 2)
        for (int j = 0; j < half; j++) acc[j] = acc[j] + acc[j + half];
    *total = acc[0];
    return count;
}

static void sift(unsigned long long *heap, long size, long at) {
    unsigned long long item = heap[at];
    for (;;) {
        long child = 2 * at + 1;
        if (child >= size) break;
        if (child + 1 < size && heap[child + 1] > heap[child]) child++;
        if (heap[child] <= item) break;
        heap[at] = heap[child]; at = child;
    }
    heap[at] = item;
}

/* Orders `count` keys into a heap; returns count. */
static long heapify(unsigned long long *heap, long count) {
    for (long k = count / 2 - 1; k >= 0; k--) sift(heap, count, k);
    return count;
}

/* x = the n values (FP16 when fp16, else float32) in float32, divided by the temperature, into w. */
static void scaled(const void *values, int fp16, long n, float temperature, float *w) {
    if (fp16) convert((const uint16_t *)values, w, n); else memcpy(w, values, n * sizeof(float));
    if (temperature != 1.0f) for (long i = 0; i < n; i++) w[i] = w[i] / temperature;
}

/* The weights of n values into w, out[0] = max x, out[1] = their total (what the draw works from). */
void row_weights(const void *values, int fp16, long n, float temperature, float *w, float *out,
                 unsigned long long *keys) {
    scaled(values, fp16, n, temperature, w);
    weigh(w, n, out, out + 1, keys);
}

/* The definition's draw (see draw_plain) over n values (FP16 when fp16, else float32). Scratch: w (n floats),
   kept (n ints), heap (n 64-bit keys). Returns the position, or NOT_FINITE. */
long draw(const void *values, int fp16, long n, float temperature, float top_p, double u,
          float *w, int *kept, unsigned long long *heap) {
    float top, total;
    scaled(values, fp16, n, temperature, w);
    long found = weigh(w, n, &top, &total, heap);
    if (!isfinite(top)) return NOT_FINITE;
    long count = n;  /* the kept positions: all, or the nucleus in kept[] */
    if (top_p < 1.0f) {
        /* The heap holds the weights >= NEAR; the rest join it if it runs dry (all below what was popped). */
        float target = top_p * total, running = 0.0f;
        long size = heapify(heap, found), rest = -1;
        count = 0;
        while (count < n) {
            if (size == 0 && rest < 0) {
                rest = 0;
                for (long i = 0; i < n; i++) if (!(w[i] >= NEAR)) heap[rest++] = key(w, (int)i);
                size = heapify(heap, rest);
            }
            int pos = (int)~(unsigned)heap[0];
            heap[0] = heap[--size];
            sift(heap, size, 0);
            kept[count++] = pos;
            running = running + w[pos];
            if (running >= target) break;
        }
        /* kept[] in ascending order through a bitmap in the heap's place */
        unsigned long long *bits = heap;
        long words = (n + 63) / 64;
        memset(bits, 0, words * sizeof *bits);
        for (long k = 0; k < count; k++) bits[kept[k] >> 6] |= 1ULL << (kept[k] & 63);
        for (long word = 0, k = 0; word < words; word++)
            for (unsigned long long m = bits[word]; m; m &= m - 1) kept[k++] = (int)(word * 64 + __builtin_ctzll(m));
    }
    float last = 0.0f;
    for (long k = 0; k < count; k++) last = last + w[count == n ? k : kept[k]];
    double threshold = u * (double)last;
    float cdf = 0.0f;
    long drawn = count, last_possible = count;
    for (long k = 0; k < count; k++) {
        cdf = cdf + w[count == n ? k : kept[k]];
        if (drawn == count && (double)cdf > threshold) drawn = k;
        if (cdf >= last) { last_possible = k; break; }
    }
    long chosen = drawn < last_possible ? drawn : last_possible;
    return count == n ? chosen : kept[chosen];
}
""" % {"LOG2E": float(LOG2E).hex(), "LN2_HI": float(LN2_HI).hex(), "LN2_LO": float(LN2_LO).hex(),
       "FLUSH": float(FLUSH).hex(), "ROUND": float(ROUND).hex(), "LANES": LANES, "NEAR": float(NEAR).hex(),
       "NOT_FINITE": NOT_FINITE, "POLY": ", ".join(f"{float(c).hex()}f" for c in POLY)}

_lock = threading.Lock()
_kernel = None
_tried = False
_local = threading.local()
_KERNEL_TYPES = (np.dtype(np.float16), np.dtype(np.float32))
_FP16 = np.dtype(np.float16)


def compiled():
    """The compiled kernel library, or None (turned off, no compiler, build failed)."""
    global _kernel, _tried
    if _tried:
        return _kernel
    with _lock:
        if not _tried:
            lib = native.build("draw", _SOURCE, for_this_cpu=True)
            if lib is not None:
                lib.draw.restype = ctypes.c_long
                lib.draw.argtypes = [ctypes.c_void_p, ctypes.c_bool, ctypes.c_long, ctypes.c_float, ctypes.c_float,
                                     ctypes.c_double, *[ctypes.c_void_p] * 3]
                lib.row_weights.restype = None
                lib.row_weights.argtypes = [ctypes.c_void_p, ctypes.c_bool, ctypes.c_long, ctypes.c_float,
                                            *[ctypes.c_void_p] * 3]
                _kernel = lib
            _tried = True
    return _kernel


def weights(values: np.ndarray, temperature: float) -> tuple[np.ndarray, np.float32]:
    """(the weights, their total) of FP16 or float32 `values` as the compiled kernel computes them (where it is
    built): exp_weights(x - max x) and lane_sum of them."""
    values = np.ascontiguousarray(values)
    w, out, keys = np.empty(values.size, np.float32), np.empty(2, np.float32), np.empty(values.size, np.uint64)
    compiled().row_weights(values.ctypes.data, values.dtype == _FP16, values.size, temperature,
                           *(native.address(a) for a in (w, out, keys)))
    return w, out[1]


def draw(values: np.ndarray, temperature: float, top_p: float, u: float) -> int:
    """draw_plain(values, temperature, top_p, u), with the compiled kernel for FP16 and float32 values."""
    kernel = compiled() if values.dtype in _KERNEL_TYPES and 0 < values.size < 2 ** 31 else None
    if kernel is None:
        return draw_plain(values, temperature, top_p, u)
    if not values.flags.c_contiguous:
        values = np.ascontiguousarray(values)
    scratch = getattr(_local, "scratch", None)
    if scratch is None or scratch.size < values.size:
        scratch = _local.scratch = _Scratch(values.size)
    return kernel.draw(values.ctypes.data, values.dtype == _FP16, values.size, temperature, top_p, u,
                       *scratch.addresses)


class _Scratch:
    """A thread's working arrays for the kernel, for up to `size` values (fresh pages for every row of 50,257 would
    cost more than the kernel)."""

    def __init__(self, size: int):
        self.size = size
        self.arrays = (np.empty(size, np.float32), np.empty(size, np.int32), np.empty(size, np.uint64))
        self.addresses = tuple(native.address(a) for a in self.arrays)
