"""A compiled kernel for `numerics._matmul_acc`: the same FP32 operations in the same order (exact FP16 x FP16
products, the folding adder tree of `width` lanes per tile, tile sums added in order), one pass per output
element in cache instead of numpy/torch passes over whole product blocks (on AVX2, a tile's lanes in AVX registers and
the weights converted from FP16 there). `matmul_fp16` also adds the bias and rounds to FP16 as `numerics.matmul` does
(F16C's conversion, then the canonical NaN). It is an implementation of the definition in numerics.py, not a second
definition: tests/test_numerics.py checks it bit for bit against the torch path and numerics.to_fp16 (random,
special and subnormal values), and those remain the fallback.

The C source is compiled on first use with the system C compiler (the project already needs one for Verilator;
`build`, which the sampler's kernel in host/reference/weights.py uses too) into $RINGGPT_CACHE_DIR/native
(default ~/.cache/ringgpt/native), keyed by the source's hash, with
-ffp-contract=off (no fused multiply-add) and without -ffast-math (IEEE binary32, round to nearest even,
gradual underflow). RINGGPT_NATIVE=0 turns it off; a missing compiler or a failed build falls back to torch.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import subprocess
import tempfile
import threading
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
/* One tile: exact products, then the folding tree (lane l += lane l + half, half = W/2 ... 1), W a constant so
   that the compiler unrolls every level. */
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

/* The rows x (m rows of k FP16 words, row i at x + i * x_stride) as FP32 in xf, each zero-padded to kp. */
static void convert_rows(const uint16_t *x, long x_stride, long m, long k, long kp, float *xf) {
    for (long i = 0; i < m; i++) {
        convert(x + i * x_stride, xf + i * kp, k);
        for (long c = k; c < kp; c++) xf[i * kp + c] = 0.0f;
    }
}

/* out[i * n + j] = accumulate_tiles(x[i, :] * w[j, :], width) for the FP32 rows xf (zero-padded to kp = whole
   tiles) and the n columns of k FP16 words at w + j * w_stride; wbuf: kp floats of scratch. */
static void tree_matmul_generic(const float *xf, long m, const uint16_t *w, long w_stride, long n, long k, long kp,
                                long width, float *out, float *wbuf) {
    long tiles = kp / width;
    for (long c = k; c < kp; c++) wbuf[c] = 0.0f;
    for (long j = 0; j < n; j++) {
        convert(w + j * w_stride, wbuf, k);
        for (long i = 0; i < m; i++) {
            const float *xi = xf + i * kp;
            float acc = 0.0f;
            for (long t = 0; t < tiles; t++) {
                const float *xt = xi + t * width, *wt = wbuf + t * width;
                float s;
                switch (width) {
                case 8: s = tile8(xt, wt); break;
                case 16: s = tile16(xt, wt); break;
                case 32: s = tile32(xt, wt); break;
                case 64: s = tile64(xt, wt); break;
                case 128: s = tile128(xt, wt); break;
                default: s = tile_any(xt, wt, width);
                }
                acc = t == 0 ? s : acc + s;
            }
            out[i * n + j] = acc;
        }
    }
}

#if defined(__x86_64__)
/* The same tile with W = 8 * R lanes in AVX registers: register r holds lanes 8r ... 8r + 7, so a fold level over
   more than 8 lanes adds register r + R' to register r (R' = half / 8), and the last three levels fold within one
   register (lane l + lane l + 4, + 2, + 1): the same additions of the same pairs as tile##W. The weights are FP32
   (tile_avx##W) or FP16 converted exactly in registers (tile_avx_half##W). */
#define TILE_AVX(W, NAME, WTYPE, LOAD_W) \
    __attribute__((target("avx2,f16c"))) static inline float NAME##W(const float *x, const WTYPE *w) { \
        __m256 p[W / 8]; \
        for (int r = 0; r < W / 8; r++) p[r] = _mm256_mul_ps(_mm256_loadu_ps(x + 8 * r), LOAD_W(w + 8 * r)); \
        for (int regs = W / 16; regs >= 1; regs /= 2) \
            for (int r = 0; r < regs; r++) p[r] = _mm256_add_ps(p[r], p[r + regs]); \
        __m128 q = _mm_add_ps(_mm256_castps256_ps128(p[0]), _mm256_extractf128_ps(p[0], 1)); \
        q = _mm_add_ps(q, _mm_movehl_ps(q, q)); \
        q = _mm_add_ss(q, _mm_shuffle_ps(q, q, 1)); \
        return _mm_cvtss_f32(q); \
    }
#define LOAD_FLOAT(p) _mm256_loadu_ps(p)
#define LOAD_HALF(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))

/* tree_matmul_generic for width W on AVX2: the tiles inside k read the column's FP16 words directly, only the last,
   zero-padded tile goes through wbuf. */
#define TREE_MATMUL_AVX(W) \
    TILE_AVX(W, tile_avx, float, LOAD_FLOAT) \
    TILE_AVX(W, tile_avx_half, uint16_t, LOAD_HALF) \
    __attribute__((target("avx2,f16c"))) static void tree_matmul_avx##W(const float *xf, long m, const uint16_t *w, \
                                                                       long w_stride, long n, long k, long kp,      \
                                                                       float *out, float *wbuf) {                    \
        long tiles = kp / W, inside = k / W;                                                                     \
        for (long c = k; c < kp; c++) wbuf[c] = 0.0f;                                                            \
        for (long j = 0; j < n; j++) {                                                                           \
            const uint16_t *col = w + j * w_stride;                                                              \
            convert(col + inside * W, wbuf + inside * W, k - inside * W);                                        \
            for (long i = 0; i < m; i++) {                                                                       \
                const float *xi = xf + i * kp;                                                                   \
                float acc = 0.0f;                                                                                \
                for (long t = 0; t < tiles; t++) {                                                               \
                    float s = t < inside ? tile_avx_half##W(xi + t * W, col + t * W)                             \
                                         : tile_avx##W(xi + t * W, wbuf + t * W);                                \
                    acc = t == 0 ? s : acc + s;                                                                  \
                }                                                                                                \
                out[i * n + j] = acc;                                                                            \
            }                                                                                                    \
        }                                                                                                        \
    }
TREE_MATMUL_AVX(8) TREE_MATMUL_AVX(16) TREE_MATMUL_AVX(32) TREE_MATMUL_AVX(64) TREE_MATMUL_AVX(128)
#endif

static void accumulate(const float *xf, long m, const uint16_t *w, long w_stride, long n, long k, long kp, long width,
                       float *out, float *wbuf) {
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c")) {
        switch (width) {
        case 8: tree_matmul_avx8(xf, m, w, w_stride, n, k, kp, out, wbuf); return;
        case 16: tree_matmul_avx16(xf, m, w, w_stride, n, k, kp, out, wbuf); return;
        case 32: tree_matmul_avx32(xf, m, w, w_stride, n, k, kp, out, wbuf); return;
        case 64: tree_matmul_avx64(xf, m, w, w_stride, n, k, kp, out, wbuf); return;
        case 128: tree_matmul_avx128(xf, m, w, w_stride, n, k, kp, out, wbuf); return;
        }
    }
#endif
    tree_matmul_generic(xf, m, w, w_stride, n, k, kp, width, out, wbuf);
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

/* acc[i * n + j] = accumulate_tiles(x[i, :] * w[j, :], width): x: m rows of k FP16 words, row i at x + i * x_stride,
   w: n columns of k FP16 words, column j at w + j * w_stride; scratch: (m + 1) * kp floats, kp = k rounded up to
   whole tiles (the rows, then one column, as FP32 zero-padded to kp). With out (only where round_to_fp16 runs), also
   out = round_to_fp16(acc, bias). */
void tree_matmul(const uint16_t *x, long x_stride, long m, const uint16_t *w, long w_stride, long n, long k, long kp,
                 long width, float *acc, float *scratch, const uint16_t *bias, uint16_t *out) {
    convert_rows(x, x_stride, m, k, kp, scratch);
    accumulate(scratch, m, w, w_stride, n, k, kp, width, acc, scratch + m * kp);
    if (out) round_to_fp16(acc, m, n, bias, out);
}
"""
FLAGS = ["-O3", "-fPIC", "-shared", "-ffp-contract=off", "-fno-fast-math", "-fno-unsafe-math-optimizations"]
MAX_WIDTH = 1024

_lock = threading.Lock()
_lib = None
_tried = False
_rounds = False


def _cache_dir() -> Path:
    root = os.environ.get("RINGGPT_CACHE_DIR") or Path.home() / ".cache" / "ringgpt"
    return Path(root) / "native"


def build(name: str, source: str, *, for_this_cpu: bool = False):
    """C `source` compiled with FLAGS into the cache (keyed by its hash) and loaded: a ctypes.CDLL, or None when
    RINGGPT_NATIVE=0, no compiler is there or the build fails (callers fall back to their numpy definition).
    `for_this_cpu` adds -march=native, the cache then keyed by this CPU's features too."""
    if os.environ.get("RINGGPT_NATIVE", "1") == "0":
        return None
    flags = FLAGS + (["-march=native"] if for_this_cpu else [])
    key = source + " ".join(flags) + (_cpu_features() if for_this_cpu else "")
    path = _cache_dir() / f"{name}-{hashlib.sha256(key.encode()).hexdigest()[:16]}.so"
    try:
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
                src = Path(tmp) / f"{name}.c"
                src.write_text(source)
                out = Path(tmp) / path.name
                subprocess.run([os.environ.get("CC", "cc"), *flags, str(src), "-o", str(out)], check=True,
                               capture_output=True, timeout=120)
                os.replace(out, path)
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


def library():
    """The loaded kernel library, or None (turned off, no compiler, build failed)."""
    global _lib, _tried, _rounds
    if _tried:
        return _lib
    with _lock:
        if _tried:
            return _lib
        _tried = True
        lib = build("treematmul", SOURCE)
        if lib is None:
            return None
        fn = lib.tree_matmul
        fn.restype = None
        fn.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_long, ctypes.c_long,
                       ctypes.c_long, ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                       ctypes.c_void_p]
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


def rounds_fp16() -> bool:
    """Whether matmul_fp16 and round_fp16 run here: the kernel is built and the CPU converts to FP16 (F16C)."""
    return library() is not None and _rounds


def matmul_fp16(rows: np.ndarray, w: np.ndarray, width: int, bias=None) -> np.ndarray | None:
    """to_fp16(numerics._matmul_acc(rows, w, width) + bias) (FP32 addition of the FP16 bias per column, if given)
    with the compiled kernel, or None when it is not available (rounds_fp16)."""
    if not rounds_fp16() or width > MAX_WIDTH:
        return None
    return _tree_matmul(rows, w, width, bias, True)


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
    # One allocation: the FP32 result, the kernel's scratch, then the FP16 result.
    scratch = (m + 1) * kp
    memory = np.empty(m * n + scratch + (-(-m * n // 2) if fp16 else 0), np.float32)
    acc = address(memory)
    _lib.tree_matmul(address(rows), x_stride, m, address(cols), w_stride, n, k, kp, width, acc, acc + 4 * m * n,
                    None if bias is None else address(bias), acc + 4 * (m * n + scratch) if fp16 else None)
    if fp16:
        return memory[m * n + scratch:].view(np.float16)[:m * n].reshape(m, n)
    return memory[:m * n].reshape(m, n)


def address(a: np.ndarray) -> int:
    """The address of an array's first element, for a kernel's pointer argument."""
    return a.__array_interface__["data"][0]


def _word_rows(a: np.ndarray, k: int) -> tuple:
    """(a, its row stride in FP16 words) for the kernel: rows of k consecutive words (a copy if a is not)."""
    if a.dtype != np.float16 or a.strides[1] != 2 or a.strides[0] % 2 or a.strides[0] < 0:
        a = np.ascontiguousarray(a, np.float16)
    return a, (a.strides[0] // 2 if a.shape[0] > 1 else k)
