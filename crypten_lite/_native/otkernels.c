/* Native loops of provider pairwise's OT extension (crypten_lite/provider/ot.py, ferret.py).
 *
 * Byte-identical to the numpy paths they replace (tests/unit/test_pairwise_native.py checks
 * it on random inputs): numpy stays the reference and the fallback (crypten_lite/_native).
 *
 *   aes_ok()                                   AES-NI and SSE4.1 on this CPU (x86-64 only)
 *   aes_ecb(key, src, out)                     AES-128-ECB (AES-NI; for the tests)
 *   tccr(key, src, out, first, domain, mask)   out_i = pi(pi(x_i) ^ j_i) ^ pi(x_i),
 *                                              x_i = src_i [^ mask], j_i = (first + i, domain)
 *   ggm_level(key_l, key_r, buf, w, g, folds, zero, clear)
 *                                              one GGM level in place (MMO: pi_s(x) ^ x) and
 *                                              its left/right XOR sums per tree
 *   lpn_encode(acc, table, rows, d, bits)      acc_i ^= XOR_j table[rows[j, i]] (bits: bit 0)
 *   transpose(src, k, nb, stride, out)         the bit-matrix transpose of ot.transpose
 *   tccr_rows(key, src, rows, first, domain, mask, col, nrows)
 *                                              tccr fused with prepare's transpose (tccrrows.h)
 *
 *   set_wide(flag)                             VAES on (default, where the CPU has it) / off
 *
 * The AES loops are in aesloops.h (x86-64). Every buffer is checked (C-contiguous, writable
 * where written, size, integer format) before any loop; each loop runs without the GIL. Only the public fixed keys pass through here (the
 * AES keys are the protocol's public constants): secrets are data, never logged or echoed.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define OTK_AESNI 1
#include <immintrin.h>
#define TGT __attribute__((target("aes,sse4.1")))
#endif

/* ---- buffers ------------------------------------------------------------------------ */

static int get_buf(PyObject *o, Py_buffer *v, int writable, const char *name) {
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(o, v, flags) < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "otkernels: %s must be a C-contiguous%s buffer "
                     "(a numpy array made with np.ascontiguousarray)", name,
                     writable ? ", writable" : "");
        return -1;
    }
    return 0;
}

/* Acquire n buffers in order (a name starting with '+' is written to); on a failure release
   the ones acquired, so the caller returns NULL holding none. */
static int get_bufs(int n, PyObject *const objs[], Py_buffer *const bufs[], const char *const names[]) {
    for (int i = 0; i < n; i++) {
        int writable = names[i][0] == '+';
        if (get_buf(objs[i], bufs[i], writable, names[i] + writable) < 0) {
            while (i-- > 0)
                PyBuffer_Release(bufs[i]);
            return -1;
        }
    }
    return 0;
}

static void release_bufs(int n, Py_buffer *const bufs[]) {
    for (int i = 0; i < n; i++)
        PyBuffer_Release(bufs[i]);
}

/* The hashes' optional 16-byte mask (None: no mask); *have is set once it is held. */
static int mask_arg(PyObject *mo, Py_buffer *m, int *have, const char *fn) {
    if (mo == Py_None)
        return 0;
    if (get_buf(mo, m, 0, "mask") < 0)
        return -1;
    *have = 1;
    if (m->len != 16) {
        PyErr_Format(PyExc_ValueError, "otkernels.%s: mask must be 16 bytes, got %zd", fn, m->len);
        return -1;
    }
    return 0;
}

/* a signed integer format of `size` bytes, native byte order */
static int int_format(Py_buffer *v, Py_ssize_t size) {
    const char *f = v->format ? v->format : "B";
    if (*f == '@' || *f == '=' || *f == '<')
        f++;
    if (v->itemsize != size || f[0] == 0 || f[1] != 0)
        return 0;
    return strchr("bhilq", f[0]) != NULL;
}

static int u64_arg(PyObject *o, uint64_t *out, const char *name) {
    if (!PyLong_Check(o)) {
        PyErr_Format(PyExc_TypeError, "otkernels: %s must be an int", name);
        return -1;
    }
    unsigned long long x = PyLong_AsUnsignedLongLong(o);
    if (x == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "otkernels: %s must be in [0, 2^64)", name);
        return -1;
    }
    *out = (uint64_t)x;
    return 0;
}

#include "aesloops.h"   /* the AES kernels (x86-64 only) */

/* ---- Python functions ----------------------------------------------------------------- */

static PyObject *py_aes_ok(PyObject *self, PyObject *args) {
    (void)self; (void)args;
#ifdef OTK_AESNI
    __builtin_cpu_init();
    if (__builtin_cpu_supports("aes") && __builtin_cpu_supports("sse4.1"))
        Py_RETURN_TRUE;
#endif
    Py_RETURN_FALSE;
}

#ifdef OTK_AESNI
static int aes_ready(void) {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("aes") && __builtin_cpu_supports("sse4.1"))
        return 1;
    PyErr_SetString(PyExc_RuntimeError, "otkernels: this CPU has no AES-NI; use the numpy path "
                    "(crypten_lite._native.aes() returns None here)");
    return 0;
}

static int key_arg(Py_buffer *v, const char *name) {
    if (v->len != 16) {
        PyErr_Format(PyExc_ValueError, "otkernels: %s must be 16 bytes (AES-128), got %zd",
                     name, v->len);
        return 0;
    }
    return 1;
}
#endif

static PyObject *py_aes_ecb(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *ko, *so, *oo;
    if (!PyArg_ParseTuple(args, "OOO:aes_ecb", &ko, &so, &oo))
        return NULL;
#ifdef OTK_AESNI
    if (!aes_ready())
        return NULL;
    Py_buffer k, s, o;
    PyObject *objs[] = {ko, so, oo};
    Py_buffer *const bufs[] = {&k, &s, &o};
    static const char *const names[] = {"key", "src", "+out"};
    if (get_bufs(3, objs, bufs, names) < 0)
        return NULL;
    PyObject *ret = NULL;
    if (!key_arg(&k, "key"))
        goto done;
    if (s.len % 16 || o.len != s.len) {
        PyErr_Format(PyExc_ValueError, "otkernels.aes_ecb: src must be whole 16-byte blocks and "
                     "out the same size (got %zd and %zd bytes)", s.len, o.len);
        goto done;
    }
    aes_key ks;
    aes_expand((const uint8_t *)k.buf, &ks);
    Py_BEGIN_ALLOW_THREADS
    ecb_loop(&ks, (const uint8_t *)s.buf, (uint8_t *)o.buf, s.len / 16);
    Py_END_ALLOW_THREADS
    ret = Py_NewRef(Py_None);
done:
    release_bufs(3, bufs);
    return ret;
#else
    PyErr_SetString(PyExc_RuntimeError, "otkernels: built without AES-NI (not x86-64)");
    return NULL;
#endif
}

static PyObject *py_tccr(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *ko, *so, *oo, *fo, *dmo, *mo = Py_None;
    if (!PyArg_ParseTuple(args, "OOOOO|O:tccr", &ko, &so, &oo, &fo, &dmo, &mo))
        return NULL;
#ifdef OTK_AESNI
    uint64_t first, domain;
    if (!aes_ready() || u64_arg(fo, &first, "first") < 0 || u64_arg(dmo, &domain, "domain") < 0)
        return NULL;
    Py_buffer k, s, o, m;
    int have_m = 0;
    PyObject *ret = NULL;
    PyObject *objs[] = {ko, so, oo};
    Py_buffer *const bufs[] = {&k, &s, &o};
    static const char *const names[] = {"key", "src", "+out"};
    if (get_bufs(3, objs, bufs, names) < 0)
        return NULL;
    if (mask_arg(mo, &m, &have_m, "tccr") < 0)
        goto done;
    if (!key_arg(&k, "key"))
        goto done;
    if (s.len % 16 || o.len != s.len) {
        PyErr_Format(PyExc_ValueError, "otkernels.tccr: src must be whole 16-byte blocks and out "
                     "the same size (got %zd and %zd bytes)", s.len, o.len);
        goto done;
    }
    aes_key ks;
    aes_expand((const uint8_t *)k.buf, &ks);
    const uint8_t *mask = have_m ? (const uint8_t *)m.buf : NULL;
    Py_BEGIN_ALLOW_THREADS
    tccr_loop(&ks, (const uint8_t *)s.buf, (uint8_t *)o.buf, s.len / 16, first, domain, mask);
    Py_END_ALLOW_THREADS
    ret = Py_NewRef(Py_None);
done:
    if (have_m)
        PyBuffer_Release(&m);
    release_bufs(3, bufs);
    return ret;
#else
    PyErr_SetString(PyExc_RuntimeError, "otkernels: built without AES-NI (not x86-64)");
    return NULL;
#endif
}

static PyObject *py_ggm_level(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *klo, *kro, *bo, *fo, *zo;
    Py_ssize_t w, g;
    int clear;
    if (!PyArg_ParseTuple(args, "OOOnnOOp:ggm_level", &klo, &kro, &bo, &w, &g, &fo, &zo, &clear))
        return NULL;
#ifdef OTK_AESNI
    if (!aes_ready())
        return NULL;
    if (w < 1 || g < 1 || w > PY_SSIZE_T_MAX / 64 / g) {
        PyErr_Format(PyExc_ValueError, "otkernels.ggm_level: w and g must be positive (got %zd, %zd)",
                     w, g);
        return NULL;
    }
    Py_buffer bufs[5];
    PyObject *objs[5] = {klo, kro, bo, fo, zo};
    const char *names[5] = {"key_l", "key_r", "buf", "folds", "zero"};
    int got = 0, n = zo == Py_None ? 4 : 5;
    PyObject *ret = NULL;
    __m128i *scratch = NULL;
    for (; got < n; got++)
        if (get_buf(objs[got], &bufs[got], got == 2 || got == 3, names[got]) < 0)
            goto done;
    if (!key_arg(&bufs[0], "key_l") || !key_arg(&bufs[1], "key_r"))
        goto done;
    if (bufs[2].len < 2 * w * g * 16) {
        PyErr_Format(PyExc_ValueError, "otkernels.ggm_level: buf holds %zd bytes, a level of "
                     "%zd x %zd nodes needs %zd", bufs[2].len, w, g, 2 * w * g * 16);
        goto done;
    }
    if (bufs[3].len != g * 32) {
        PyErr_Format(PyExc_ValueError, "otkernels.ggm_level: folds must be %zd bytes ([g, 2, 2] "
                     "uint64), got %zd", g * 32, bufs[3].len);
        goto done;
    }
    const int64_t *zero = NULL;
    if (n == 5) {
        if (!int_format(&bufs[4], 8) || bufs[4].len != g * 8) {
            PyErr_Format(PyExc_ValueError, "otkernels.ggm_level: zero must be int64 [g = %zd]", g);
            goto done;
        }
        zero = (const int64_t *)bufs[4].buf;
        for (Py_ssize_t u = 0; u < g; u++)
            if (zero[u] < 0 || zero[u] >= w) {
                PyErr_Format(PyExc_ValueError, "otkernels.ggm_level: zero[%zd] = %lld is not a "
                             "position in [0, %zd)", u, (long long)zero[u], w);
                goto done;
            }
    }
    scratch = PyMem_Malloc(4 * g * sizeof(__m128i));   /* zeroed children, wide sums */
    if (!scratch) {
        PyErr_NoMemory();
        goto done;
    }
    aes_key kl, kr;
    aes_expand((const uint8_t *)bufs[0].buf, &kl);
    aes_expand((const uint8_t *)bufs[1].buf, &kr);
    Py_BEGIN_ALLOW_THREADS
    ggm_loop(&kl, &kr, (uint8_t *)bufs[2].buf, w, g, (uint8_t *)bufs[3].buf, zero, clear, scratch);
    Py_END_ALLOW_THREADS
    ret = Py_NewRef(Py_None);
done:
    PyMem_Free(scratch);
    for (int i = 0; i < got; i++)
        PyBuffer_Release(&bufs[i]);
    return ret;
#else
    PyErr_SetString(PyExc_RuntimeError, "otkernels: built without AES-NI (not x86-64)");
    return NULL;
#endif
}

/* four outputs at a time (40 independent table loads in flight: 25% faster than one). An
 * index outside the table reads entry 0 instead, and acc is zeroed at the end (the caller
 * raises): no read outside the table, no pass of its own over rows. bits (optional): bit 0
 * of each output's first word. */
#define LPN_IDX(x, u) do { u = (uint32_t)(x); if (u >= size) { bad = 1; u = 0; } } while (0)

static int lpn_loop(uint64_t *acc, const uint64_t *table, const int32_t *rows, Py_ssize_t n,
                    Py_ssize_t d, uint32_t size, uint8_t *bits) {
    Py_ssize_t i = 0;
    int bad = 0;
    uint32_t u0, u1, u2, u3;
#ifdef __SSE2__
    __m128i *a = (__m128i *)acc;
    const __m128i *t = (const __m128i *)table;
    for (; i + 4 <= n; i += 4) {
        __m128i x0 = _mm_loadu_si128(a + i), x1 = _mm_loadu_si128(a + i + 1);
        __m128i x2 = _mm_loadu_si128(a + i + 2), x3 = _mm_loadu_si128(a + i + 3);
        for (Py_ssize_t j = 0; j < d; j++) {
            const int32_t *r = rows + j * n + i;
            LPN_IDX(r[0], u0);
            LPN_IDX(r[1], u1);
            LPN_IDX(r[2], u2);
            LPN_IDX(r[3], u3);
            x0 = _mm_xor_si128(x0, _mm_loadu_si128(t + u0));
            x1 = _mm_xor_si128(x1, _mm_loadu_si128(t + u1));
            x2 = _mm_xor_si128(x2, _mm_loadu_si128(t + u2));
            x3 = _mm_xor_si128(x3, _mm_loadu_si128(t + u3));
        }
        _mm_storeu_si128(a + i, x0);
        _mm_storeu_si128(a + i + 1, x1);
        _mm_storeu_si128(a + i + 2, x2);
        _mm_storeu_si128(a + i + 3, x3);
        if (bits) {
            bits[i] = (uint8_t)(_mm_cvtsi128_si32(x0) & 1);
            bits[i + 1] = (uint8_t)(_mm_cvtsi128_si32(x1) & 1);
            bits[i + 2] = (uint8_t)(_mm_cvtsi128_si32(x2) & 1);
            bits[i + 3] = (uint8_t)(_mm_cvtsi128_si32(x3) & 1);
        }
    }
#endif
    for (; i < n; i++) {
        uint64_t a0 = acc[2 * i], a1 = acc[2 * i + 1];
        for (Py_ssize_t j = 0; j < d; j++) {
            LPN_IDX(rows[j * n + i], u0);
            a0 ^= table[2 * (Py_ssize_t)u0];
            a1 ^= table[2 * (Py_ssize_t)u0 + 1];
        }
        acc[2 * i] = a0;
        acc[2 * i + 1] = a1;
        if (bits)
            bits[i] = (uint8_t)(a0 & 1);
    }
    if (bad)
        memset(acc, 0, (size_t)n * 16);
    return !bad;
}

static PyObject *py_lpn_encode(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *ao, *to, *ro, *bo = Py_None;
    Py_ssize_t d;
    if (!PyArg_ParseTuple(args, "OOOn|O:lpn_encode", &ao, &to, &ro, &d, &bo))
        return NULL;
    Py_buffer a, t, r, bb;
    int have_b = 0;
    PyObject *ret = NULL;
    PyObject *objs[] = {ao, to, ro};
    Py_buffer *const bufs[] = {&a, &t, &r};
    static const char *const names[] = {"+acc", "table", "rows"};
    if (get_bufs(3, objs, bufs, names) < 0)
        return NULL;
    Py_ssize_t n = a.len / 16, size = t.len / 16;
    if (a.len % 16 || t.len % 16 || d < 0) {
        PyErr_SetString(PyExc_ValueError, "otkernels.lpn_encode: acc and table must be whole "
                        "16-byte values and d >= 0");
        goto done;
    }
    if (n && d > PY_SSIZE_T_MAX / 4 / n) {      /* 4 d n would overflow: no buffer is that long */
        PyErr_Format(PyExc_ValueError, "otkernels.lpn_encode: d = %zd rows of n = %zd indices "
                     "is past any buffer's size", d, n);
        goto done;
    }
    if (size == 0 && d && n) {                   /* no entry 0 to read for a bad index */
        PyErr_SetString(PyExc_ValueError, "otkernels.lpn_encode: the table is empty");
        goto done;
    }
    if (!int_format(&r, 4) || r.len != 4 * d * n) {
        PyErr_Format(PyExc_ValueError, "otkernels.lpn_encode: rows must be int32 [d = %zd, n = "
                     "%zd] (%zd bytes), got %zd bytes", d, n, 4 * d * n, r.len);
        goto done;
    }
    if (((uintptr_t)a.buf | (uintptr_t)t.buf | (uintptr_t)r.buf) & 3) {
        PyErr_SetString(PyExc_ValueError, "otkernels.lpn_encode: buffers must be 4-byte aligned");
        goto done;
    }
    if (size > 0xFFFFFFFFLL) {
        PyErr_SetString(PyExc_ValueError, "otkernels.lpn_encode: table over 2^32 values");
        goto done;
    }
    if (bo != Py_None) {
        if (get_buf(bo, &bb, 1, "bits") < 0)
            goto done;
        have_b = 1;
        if (bb.len != n || bb.itemsize != 1) {
            PyErr_Format(PyExc_ValueError, "otkernels.lpn_encode: bits must be %zd bytes (uint8, "
                         "one per output), got %zd", n, bb.len);
            goto done;
        }
    }
    int ok;
    uint8_t *bits = have_b ? (uint8_t *)bb.buf : NULL;
    Py_BEGIN_ALLOW_THREADS
    ok = lpn_loop((uint64_t *)a.buf, (const uint64_t *)t.buf, (const int32_t *)r.buf, n, d,
                  (uint32_t)size, bits);
    Py_END_ALLOW_THREADS
    if (!ok) {
        PyErr_Format(PyExc_ValueError, "otkernels.lpn_encode: rows hold an index outside the "
                     "table's %zd values (acc zeroed)", size);
        goto done;
    }
    ret = Py_NewRef(Py_None);
done:
    if (have_b)
        PyBuffer_Release(&bb);
    release_bufs(3, bufs);
    return ret;
}

/* bit-matrix transpose: src k rows of `stride` bytes (the first nb used), k a multiple of 8
 * -> out [8 nb, k / 8]: out row r, byte c, bit a = src row 8c + a, byte r / 8, bit r % 8
 * (ot.transpose's layout; each 8x8 block by Hacker's Delight's three delta swaps) */
static inline uint64_t t8x8(uint64_t x) {
    uint64_t t;
    t = (x ^ (x >> 7)) & 0x00AA00AA00AA00AAULL;
    x = x ^ t ^ (t << 7);
    t = (x ^ (x >> 14)) & 0x0000CCCC0000CCCCULL;
    x = x ^ t ^ (t << 14);
    t = (x ^ (x >> 28)) & 0x00000000F0F0F0F0ULL;
    return x ^ t ^ (t << 28);
}

static void transpose_loop(const uint8_t *src, Py_ssize_t k, Py_ssize_t nb, Py_ssize_t stride,
                           uint8_t *out) {
    Py_ssize_t kb = k / 8;
    for (Py_ssize_t j0 = 0; j0 < nb; j0 += 512) {      /* a tile of columns: output in cache */
        Py_ssize_t j1 = nb - j0 < 512 ? nb : j0 + 512;
        for (Py_ssize_t c = 0; c < kb; c++) {
            const uint8_t *r = src + 8 * c * stride;
            for (Py_ssize_t j = j0; j < j1; j++) {
                uint64_t x = 0;
                for (int a = 0; a < 8; a++)
                    x |= (uint64_t)r[a * stride + j] << (8 * a);
                x = t8x8(x);
                uint8_t *o = out + 8 * j * kb + c;
                for (int b = 0; b < 8; b++)
                    o[b * kb] = (uint8_t)(x >> (8 * b));
            }
        }
    }
}

static PyObject *py_transpose(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *so, *oo;
    Py_ssize_t k, nb, stride;
    if (!PyArg_ParseTuple(args, "OnnnO:transpose", &so, &k, &nb, &stride, &oo))
        return NULL;
    Py_buffer s, o;
    PyObject *ret = NULL;
    PyObject *objs[] = {so, oo};
    Py_buffer *const bufs[] = {&s, &o};
    static const char *const names[] = {"src", "+out"};
    if (get_bufs(2, objs, bufs, names) < 0)
        return NULL;
    if (k < 0 || k % 8 || nb < 0 || stride < nb || (stride && k > PY_SSIZE_T_MAX / stride)
        || s.len != k * stride || o.len != nb * k) {
        PyErr_Format(PyExc_ValueError, "otkernels.transpose: src must be k = %zd rows (a multiple "
                     "of 8) of stride %zd >= nb = %zd bytes (%zd bytes, got %zd), out 8 nb x k / 8 "
                     "bytes (got %zd)", k, stride, nb, k * stride, s.len, o.len);
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    transpose_loop((const uint8_t *)s.buf, k, nb, stride, (uint8_t *)o.buf);
    Py_END_ALLOW_THREADS
    ret = Py_NewRef(Py_None);
done:
    release_bufs(2, bufs);
    return ret;
}

#include "tccrrows.h"   /* tccr fused with the transpose (uses t8x8, tccr_loop) */

static PyObject *py_set_wide(PyObject *self, PyObject *arg) {
    (void)self;
#ifdef OTK_AESNI
    if (arg == Py_None)          /* a query: the setting in force */
        return PyBool_FromLong(use_wide());
#endif
    int want = PyObject_IsTrue(arg);
    if (want < 0)
        return NULL;
#ifdef OTK_AESNI
    int was = use_wide();
    __builtin_cpu_init();
    wide_ok = want && __builtin_cpu_supports("vaes") && __builtin_cpu_supports("avx512f");
    return PyBool_FromLong(was);
#else
    Py_RETURN_FALSE;
#endif
}

static PyMethodDef methods[] = {
    {"aes_ok", py_aes_ok, METH_NOARGS, "Whether this CPU has AES-NI and SSE4.1 (x86-64 build)."},
    {"aes_ecb", py_aes_ecb, METH_VARARGS, "aes_ecb(key16, src, out): AES-128-ECB with AES-NI."},
    {"tccr", py_tccr, METH_VARARGS,
     "tccr(key16, src, out, first, domain, mask=None): out_i = pi(pi(x_i) ^ j_i) ^ pi(x_i), "
     "x_i = src_i ^ mask, j_i = (first + i, domain) as two little-endian uint64."},
    {"ggm_level", py_ggm_level, METH_VARARGS,
     "ggm_level(key_l, key_r, buf, w, g, folds, zero, clear): one GGM level in place."},
    {"lpn_encode", py_lpn_encode, METH_VARARGS,
     "lpn_encode(acc, table, rows, d, bits=None): acc[i] ^= XOR_j table[rows[j, i]] (128-bit "
     "values); bits[i] = bit 0 of acc[i] after it."},
    {"set_wide", py_set_wide, METH_O,
     "set_wide(flag): use VAES (AVX-512) where the CPU has it (default) or 128-bit AES-NI "
     "only (the tests' check of both); returns the previous setting (None: only returns it)."},
    {"transpose", py_transpose, METH_VARARGS,
     "transpose(src, k, nb, stride, out): bit-matrix transpose, k rows of stride bytes (nb used) "
     "-> out [8 nb, k / 8]."},
    {"tccr_rows", py_tccr_rows, METH_VARARGS,
     "tccr_rows(key16, src, rows, first, domain, mask, col, nrows): tccr's hashes, bit r of "
     "hash i written to rows[r] at bit col + i (r < nrows <= 128; rows [nrows, W] bytes)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_otkernels",
    "Native loops of provider pairwise's OT extension (see crypten_lite/_native).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__otkernels(void) {
    return PyModule_Create(&module);
}
