"""A compiled kernel for `numerics._matmul_acc`: the same FP32 operations in the same order (exact FP16 x FP16
products, the folding adder tree of `width` lanes per tile, tile sums added in order), one pass per output
element in cache instead of numpy/torch passes over whole product blocks. It is an implementation of the
definition in numerics.py, not a second definition: tests/test_numerics.py checks it bit for bit against the
torch path (random, special and subnormal values), and the torch path remains the fallback.

The C source is compiled on first use with the system C compiler (the project already needs one for Verilator)
into $RINGGPT_CACHE_DIR/native (default ~/.cache/ringgpt/native), keyed by the source's hash, with
-ffp-contract=off (no fused multiply-add) and without -ffast-math (IEEE binary32, round to nearest even,
gradual underflow). RINGGPT_NATIVE=0 turns it off; a missing compiler or a failed build falls back to torch.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import tempfile
import threading
from pathlib import Path

import numpy as np

SOURCE = r"""
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

/* One tile: exact products, then the folding tree (lane l += lane l + half, half = W/2 ... 1), W a constant so
   that the compiler unrolls and vectorises every level. */
#define TILE(W) \
    static inline float tile##W(const float *x, const float *w) { \
        float p[W]; \
        for (int l = 0; l < W; l++) p[l] = x[l] * w[l]; \
        for (int half = W / 2; half >= 1; half /= 2) \
            for (int l = 0; l < half; l++) p[l] = p[l] + p[l + half]; \
        return p[0]; \
    }
TILE(8) TILE(16) TILE(32) TILE(64) TILE(128)

static float tile_any(const float *x, const float *w, long width) {
    float p[1024];
    for (long l = 0; l < width; l++) p[l] = x[l] * w[l];
    for (long half = width / 2; half >= 1; half /= 2)
        for (long l = 0; l < half; l++) p[l] = p[l] + p[l + half];
    return p[0];
}

/* out[i * n + j] = accumulate_tiles(x[i, :] * w[j, :], width), x: m rows of kp floats (zero-padded to
   tiles * width), w: n columns of k FP16 words, column j at w + j * w_stride; wbuf: kp floats of scratch. */
#define TREE_MATMUL(NAME, ATTR) \
ATTR static void NAME(const float *x, long m, long kp, const uint16_t *w, long w_stride, long k, long n,\
                 long width, float *out, float *wbuf) {                                             \
    long tiles = kp / width;                                                                        \
    for (long c = k; c < kp; c++) wbuf[c] = 0.0f;                                                   \
    for (long j = 0; j < n; j++) {                                                                  \
        convert(w + j * w_stride, wbuf, k);                                                         \
        for (long i = 0; i < m; i++) {                                                              \
            const float *xi = x + i * kp;                                                           \
            float acc = 0.0f;                                                                       \
            for (long t = 0; t < tiles; t++) {                                                      \
                const float *xt = xi + t * width, *wt = wbuf + t * width;                           \
                float s;                                                                            \
                switch (width) {                                                                    \
                case 8: s = tile8(xt, wt); break;                                                   \
                case 16: s = tile16(xt, wt); break;                                                 \
                case 32: s = tile32(xt, wt); break;                                                 \
                case 64: s = tile64(xt, wt); break;                                                 \
                case 128: s = tile128(xt, wt); break;                                               \
                default: s = tile_any(xt, wt, width);                                               \
                }                                                                                   \
                acc = t == 0 ? s : acc + s;                                                         \
            }                                                                                       \
            out[i * n + j] = acc;                                                                   \
        }                                                                                           \
    }                                                                                               \
}
TREE_MATMUL(tree_matmul_generic, )
#if defined(__x86_64__)
TREE_MATMUL(tree_matmul_avx2, __attribute__((target("avx2,f16c"))))
#endif

void tree_matmul(const float *x, long m, long kp, const uint16_t *w, long w_stride, long k, long n,
                 long width, float *out, float *wbuf) {
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c")) {
        tree_matmul_avx2(x, m, kp, w, w_stride, k, n, width, out, wbuf);
        return;
    }
#endif
    tree_matmul_generic(x, m, kp, w, w_stride, k, n, width, out, wbuf);
}
"""
FLAGS = ["-O3", "-fPIC", "-shared", "-ffp-contract=off", "-fno-fast-math", "-fno-unsafe-math-optimizations"]
MAX_WIDTH = 1024

_lock = threading.Lock()
_lib = None
_tried = False


def _cache_dir() -> Path:
    root = os.environ.get("RINGGPT_CACHE_DIR") or Path.home() / ".cache" / "ringgpt"
    return Path(root) / "native"


def library():
    """The loaded kernel library, or None (turned off, no compiler, build failed)."""
    global _lib, _tried
    if _tried:
        return _lib
    with _lock:
        if _tried:
            return _lib
        _tried = True
        if os.environ.get("RINGGPT_NATIVE", "1") == "0":
            return None
        digest = hashlib.sha256((SOURCE + " ".join(FLAGS)).encode()).hexdigest()[:16]
        path = _cache_dir() / f"treematmul-{digest}.so"
        try:
            if not path.exists():
                path.parent.mkdir(parents=True, exist_ok=True)
                with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
                    src = Path(tmp) / "treematmul.c"
                    src.write_text(SOURCE)
                    out = Path(tmp) / path.name
                    subprocess.run([os.environ.get("CC", "cc"), *FLAGS, str(src), "-o", str(out)], check=True,
                                   capture_output=True, timeout=120)
                    os.replace(out, path)
            lib = ctypes.CDLL(str(path))
        except (OSError, subprocess.SubprocessError):
            return None
        fn = lib.tree_matmul
        fn.restype = None
        fn.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_long, ctypes.c_long,
                       ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
        _lib = lib
        return _lib


def matmul_acc(rows: np.ndarray, w: np.ndarray, width: int) -> np.ndarray | None:
    """numerics._matmul_acc(rows, w, width) with the compiled kernel, or None when it is not available."""
    lib = library()
    if lib is None or width > MAX_WIDTH:
        return None
    m, k = rows.shape
    n = w.shape[1]
    tiles = max(1, -(-k // width))
    kp = tiles * width
    x = np.zeros((m, kp), np.float32)
    x[:, :k] = rows
    cols = w.T  # (n, k): column j's k weights
    if cols.strides[1] != 2 or cols.strides[0] % 2 or cols.strides[0] < 0 or n == 0:
        cols = np.ascontiguousarray(cols)
    stride = cols.strides[0] // 2 if n > 1 else k
    out = np.empty((m, n), np.float32)
    scratch = np.empty(kp, np.float32)
    if m and n:
        lib.tree_matmul(x.ctypes.data, m, kp, cols.ctypes.data, stride, k, n, width, out.ctypes.data,
                        scratch.ctypes.data)
    return out
