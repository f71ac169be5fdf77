/* AES loops of crypten_lite/_native/otkernels.c (included there, once): AES-128 with AES-NI
 * (own key expansion, 8 blocks in flight) and with VAES (AVX-512, 16 in flight) where the CPU
 * has it; the TCCR hash and one GGM level. Needs OTK_AESNI (x86-64, GCC or clang). */
/* ---- AES-128 with AES-NI ------------------------------------------------------------ */

#ifdef OTK_AESNI
typedef struct { __m128i k[11]; } aes_key;

TGT static inline __m128i key_step(__m128i key, __m128i gen) {
    gen = _mm_shuffle_epi32(gen, 0xff);
    key = _mm_xor_si128(key, _mm_slli_si128(key, 4));
    key = _mm_xor_si128(key, _mm_slli_si128(key, 4));
    key = _mm_xor_si128(key, _mm_slli_si128(key, 4));
    return _mm_xor_si128(key, gen);
}

#define KEY_ROUND(i, rcon) ks->k[i] = key_step(ks->k[i - 1], _mm_aeskeygenassist_si128(ks->k[i - 1], rcon))

TGT static void aes_expand(const uint8_t *key, aes_key *ks) {
    ks->k[0] = _mm_loadu_si128((const __m128i *)key);
    KEY_ROUND(1, 0x01); KEY_ROUND(2, 0x02); KEY_ROUND(3, 0x04); KEY_ROUND(4, 0x08);
    KEY_ROUND(5, 0x10); KEY_ROUND(6, 0x20); KEY_ROUND(7, 0x40); KEY_ROUND(8, 0x80);
    KEY_ROUND(9, 0x1b); KEY_ROUND(10, 0x36);
}

/* n <= 8 blocks through AES at once (the rounds interleaved: AESENC's latency hidden) */
TGT static inline void aes_n(const aes_key *ks, __m128i *b, int n) {
    for (int i = 0; i < n; i++)
        b[i] = _mm_xor_si128(b[i], ks->k[0]);
    for (int r = 1; r < 10; r++)
        for (int i = 0; i < n; i++)
            b[i] = _mm_aesenc_si128(b[i], ks->k[r]);
    for (int i = 0; i < n; i++)
        b[i] = _mm_aesenclast_si128(b[i], ks->k[10]);
}

/* 4 blocks under key a and 4 under key b (a == b: 8 blocks under one key), fully unrolled:
 * the blocks stay in registers, 8 AESENC in flight */
TGT static inline void aes_4x2(const aes_key *ka, const aes_key *kb, __m128i *b) {
    __m128i b0 = _mm_xor_si128(b[0], ka->k[0]), b1 = _mm_xor_si128(b[1], ka->k[0]);
    __m128i b2 = _mm_xor_si128(b[2], ka->k[0]), b3 = _mm_xor_si128(b[3], ka->k[0]);
    __m128i b4 = _mm_xor_si128(b[4], kb->k[0]), b5 = _mm_xor_si128(b[5], kb->k[0]);
    __m128i b6 = _mm_xor_si128(b[6], kb->k[0]), b7 = _mm_xor_si128(b[7], kb->k[0]);
#pragma GCC unroll 9
    for (int r = 1; r < 10; r++) {
        __m128i k = ka->k[r], l = kb->k[r];
        b0 = _mm_aesenc_si128(b0, k); b1 = _mm_aesenc_si128(b1, k);
        b2 = _mm_aesenc_si128(b2, k); b3 = _mm_aesenc_si128(b3, k);
        b4 = _mm_aesenc_si128(b4, l); b5 = _mm_aesenc_si128(b5, l);
        b6 = _mm_aesenc_si128(b6, l); b7 = _mm_aesenc_si128(b7, l);
    }
    __m128i k = ka->k[10], l = kb->k[10];
    b[0] = _mm_aesenclast_si128(b0, k); b[1] = _mm_aesenclast_si128(b1, k);
    b[2] = _mm_aesenclast_si128(b2, k); b[3] = _mm_aesenclast_si128(b3, k);
    b[4] = _mm_aesenclast_si128(b4, l); b[5] = _mm_aesenclast_si128(b5, l);
    b[6] = _mm_aesenclast_si128(b6, l); b[7] = _mm_aesenclast_si128(b7, l);
}

/* ---- the same with VAES (AVX-512: 4 blocks per instruction), where the CPU has it ---- */

#define TGT5 __attribute__((target("aes,sse4.1,avx512f,vaes")))
typedef struct { __m512i k[11]; } aes_key4;

TGT5 static void key4(const aes_key *ks, aes_key4 *k4) {
    for (int r = 0; r < 11; r++)
        k4->k[r] = _mm512_broadcast_i32x4(ks->k[r]);
}

/* b[0..1] under key a, b[2..3] under key b (a == b: 16 blocks under one key) */
TGT5 static inline void aes16(const aes_key4 *ka, const aes_key4 *kb, __m512i *b) {
    __m512i b0 = _mm512_xor_si512(b[0], ka->k[0]), b1 = _mm512_xor_si512(b[1], ka->k[0]);
    __m512i b2 = _mm512_xor_si512(b[2], kb->k[0]), b3 = _mm512_xor_si512(b[3], kb->k[0]);
#pragma GCC unroll 9
    for (int r = 1; r < 10; r++) {
        b0 = _mm512_aesenc_epi128(b0, ka->k[r]);
        b1 = _mm512_aesenc_epi128(b1, ka->k[r]);
        b2 = _mm512_aesenc_epi128(b2, kb->k[r]);
        b3 = _mm512_aesenc_epi128(b3, kb->k[r]);
    }
    b[0] = _mm512_aesenclast_epi128(b0, ka->k[10]);
    b[1] = _mm512_aesenclast_epi128(b1, ka->k[10]);
    b[2] = _mm512_aesenclast_epi128(b2, kb->k[10]);
    b[3] = _mm512_aesenclast_epi128(b3, kb->k[10]);
}

/* tccr_loop's first m - m % 16 blocks, 16 at a time; returns the blocks done */
TGT5 static Py_ssize_t tccr_wide(const aes_key *ks, const uint8_t *src, uint8_t *out,
                                 Py_ssize_t m, uint64_t first, uint64_t domain,
                                 const uint8_t *mask) {
    aes_key4 k4;
    key4(ks, &k4);
    __m512i mk = mask ? _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)mask))
                      : _mm512_setzero_si512();
    __m512i y[4], z[4];
    Py_ssize_t s = 0;
    for (; s + 16 <= m; s += 16) {
        for (int q = 0; q < 4; q++)
            y[q] = _mm512_xor_si512(_mm512_loadu_si512(src + 16 * (s + 4 * q)), mk);
        aes16(&k4, &k4, y);
        for (int q = 0; q < 4; q++) {
            long long f = (long long)(first + (uint64_t)(s + 4 * q)), d = (long long)domain;
            z[q] = _mm512_xor_si512(y[q], _mm512_set_epi64(d, f + 3, d, f + 2, d, f + 1, d, f));
        }
        aes16(&k4, &k4, z);
        for (int q = 0; q < 4; q++)
            _mm512_storeu_si512(out + 16 * (s + 4 * q), _mm512_xor_si512(z[q], y[q]));
    }
    return s;
}

/* ggm_loop's children and folds for trees [0, g - g % 8) of every position, 8 trees at a
 * time; acc: 2g blocks (left sums, then right sums), zeroed by the caller */
TGT5 static void ggm_wide(const aes_key *kl, const aes_key *kr, __m128i *node, Py_ssize_t w,
                          Py_ssize_t g, __m128i *acc, int clear) {
    aes_key4 l4, r4;
    key4(kl, &l4);
    key4(kr, &r4);
    Py_ssize_t total = w * g, g8 = g - g % 8;
    __m512i cm = clear ? _mm512_set_epi64(-1LL, (long long)~1ULL, -1LL, (long long)~1ULL, -1LL,
                                          (long long)~1ULL, -1LL, (long long)~1ULL)
                       : _mm512_set1_epi64(-1LL);
    for (Py_ssize_t p = 0; p < w; p++) {
        __m128i *row = node + p * g;
        for (Py_ssize_t t = 0; t < g8; t += 8) {
            __m512i par[2], b[4];
            par[0] = _mm512_loadu_si512(row + t);
            par[1] = _mm512_loadu_si512(row + t + 4);
            b[0] = par[0]; b[1] = par[1]; b[2] = par[0]; b[3] = par[1];
            aes16(&l4, &r4, b);
            for (int q = 0; q < 2; q++) {
                __m512i a = _mm512_xor_si512(b[q], par[q]), c = _mm512_xor_si512(b[2 + q], par[q]);
                __m128i *al = acc + t + 4 * q, *ar = acc + g + t + 4 * q;
                _mm512_storeu_si512(al, _mm512_xor_si512(_mm512_loadu_si512(al), a));
                _mm512_storeu_si512(ar, _mm512_xor_si512(_mm512_loadu_si512(ar), c));
                _mm512_storeu_si512(row + t + 4 * q, _mm512_and_si512(a, cm));
                _mm512_storeu_si512(row + total + t + 4 * q, _mm512_and_si512(c, cm));
            }
        }
    }
}

static int wide_ok = -1;     /* VAES + AVX-512F on this CPU (set_wide may turn it off) */

static int use_wide(void) {
    if (wide_ok < 0) {
        __builtin_cpu_init();
        wide_ok = __builtin_cpu_supports("vaes") && __builtin_cpu_supports("avx512f");
    }
    return wide_ok;
}

/* nodes [s0, s1) of one level (tree of s0: t0, the trees following on) with 128-bit AES */
TGT static void ggm_narrow(const aes_key *kl, const aes_key *kr, __m128i *node, Py_ssize_t total,
                           Py_ssize_t s0, Py_ssize_t s1, Py_ssize_t t0, __m128i *fold, __m128i cm) {
    Py_ssize_t t = t0;
    for (Py_ssize_t s = s0; s < s1; s += 4) {
        int n = (int)(s1 - s < 4 ? s1 - s : 4);
        __m128i p[4], l[8], *r = l + 4;
        for (int i = n; i < 4; i++)     /* a short tail: lanes not used (no uninitialized read) */
            p[i] = l[i] = r[i] = _mm_setzero_si128();
        for (int i = 0; i < n; i++) {
            p[i] = _mm_loadu_si128(node + s + i);
            l[i] = p[i];
            r[i] = p[i];
        }
        if (n == 4) {
            aes_4x2(kl, kr, l);
        } else {
            aes_n(kl, l, n);
            aes_n(kr, r, n);
        }
        for (int i = 0; i < n; i++) {
            __m128i a = _mm_xor_si128(l[i], p[i]), b = _mm_xor_si128(r[i], p[i]);
            _mm_storeu_si128(fold + 2 * t, _mm_xor_si128(_mm_loadu_si128(fold + 2 * t), a));
            _mm_storeu_si128(fold + 2 * t + 1, _mm_xor_si128(_mm_loadu_si128(fold + 2 * t + 1), b));
            _mm_storeu_si128(node + s + i, _mm_and_si128(a, cm));
            _mm_storeu_si128(node + total + s + i, _mm_and_si128(b, cm));
            t++;
        }
    }
}

TGT static void ecb_loop(const aes_key *ks, const uint8_t *src, uint8_t *out, Py_ssize_t m) {
    __m128i b[8];
    for (Py_ssize_t s = 0; s < m; s += 8) {
        int n = (int)(m - s < 8 ? m - s : 8);
        for (int i = 0; i < n; i++)
            b[i] = _mm_loadu_si128((const __m128i *)(src + 16 * (s + i)));
        if (n == 8)
            aes_4x2(ks, ks, b);
        else
            aes_n(ks, b, n);
        for (int i = 0; i < n; i++)
            _mm_storeu_si128((__m128i *)(out + 16 * (s + i)), b[i]);
    }
}

TGT static void tccr_loop(const aes_key *ks, const uint8_t *src, uint8_t *out, Py_ssize_t m,
                          uint64_t first, uint64_t domain, const uint8_t *mask) {
    __m128i y[8], z[8];
    __m128i mk = mask ? _mm_loadu_si128((const __m128i *)mask) : _mm_setzero_si128();
    Py_ssize_t s0 = use_wide() ? tccr_wide(ks, src, out, m, first, domain, mask) : 0;
    for (Py_ssize_t s = s0; s < m; s += 8) {
        int n = (int)(m - s < 8 ? m - s : 8);
        for (int i = 0; i < n; i++)
            y[i] = _mm_xor_si128(_mm_loadu_si128((const __m128i *)(src + 16 * (s + i))), mk);
        if (n == 8)
            aes_4x2(ks, ks, y);
        else
            aes_n(ks, y, n);
        for (int i = 0; i < n; i++)    /* tweak j: word 0 first + row (wraps as numpy's), word 1 domain */
            z[i] = _mm_xor_si128(y[i], _mm_set_epi64x((long long)domain,
                                                     (long long)(first + (uint64_t)(s + i))));
        if (n == 8)
            aes_4x2(ks, ks, z);
        else
            aes_n(ks, z, n);
        for (int i = 0; i < n; i++)
            _mm_storeu_si128((__m128i *)(out + 16 * (s + i)), _mm_xor_si128(z[i], y[i]));
    }
}

/* One GGM level in place: parents buf[0 .. w*g) ([w, g] nodes) -> children [2w, g]: left of
 * node i at i, right at w*g + i, child = pi_side(parent) ^ parent. folds[t] = (XOR of tree
 * t's left children, XOR of its right children), taken before `clear` (which clears bit 0 of
 * each stored child). zero[t] (optional; scratch: 2g blocks): the parent of tree t whose two
 * children are stored as 0 and left out of the folds. */
TGT static void ggm_loop(const aes_key *kl, const aes_key *kr, uint8_t *buf, Py_ssize_t w,
                         Py_ssize_t g, uint8_t *folds, const int64_t *zero, int clear,
                         __m128i *scratch) {
    __m128i *node = (__m128i *)buf, *fold = (__m128i *)folds;
    Py_ssize_t total = w * g;
    __m128i cm = clear ? _mm_set_epi64x(-1LL, (long long)~1ULL) : _mm_set1_epi64x(-1LL);
    for (Py_ssize_t t = 0; t < 2 * g; t++)
        _mm_storeu_si128(fold + t, _mm_setzero_si128());
    if (zero) {   /* the children about to be made at the zeroed parents (before overwriting) */
        for (Py_ssize_t u = 0; u < g; u++) {
            __m128i p = _mm_loadu_si128(node + zero[u] * g + u), c[2] = {p, p};
            aes_n(kl, c, 1);
            aes_n(kr, c + 1, 1);
            scratch[2 * u] = _mm_xor_si128(c[0], p);
            scratch[2 * u + 1] = _mm_xor_si128(c[1], p);
        }
    }
    Py_ssize_t g8 = 0;    /* trees [0, g8) of every position made by ggm_wide */
    if (use_wide() && g >= 8) {
        __m128i *acc = scratch + 2 * g;
        for (Py_ssize_t u = 0; u < 2 * g; u++)
            acc[u] = _mm_setzero_si128();
        ggm_wide(kl, kr, node, w, g, acc, clear);
        g8 = g - g % 8;
        for (Py_ssize_t u = 0; u < g8; u++) {
            _mm_storeu_si128(fold + 2 * u, acc[u]);        /* folds: the caller's, any alignment */
            _mm_storeu_si128(fold + 2 * u + 1, acc[g + u]);
        }
    }
    for (Py_ssize_t p = 0; g8 < g && p < w; p++)
        ggm_narrow(kl, kr, node, total, p * g + g8, p * g + g, g8, fold, cm);
    if (zero) {
        for (Py_ssize_t u = 0; u < g; u++) {
            Py_ssize_t i = zero[u] * g + u;
            _mm_storeu_si128(fold + 2 * u, _mm_xor_si128(_mm_loadu_si128(fold + 2 * u), scratch[2 * u]));
            _mm_storeu_si128(fold + 2 * u + 1,
                             _mm_xor_si128(_mm_loadu_si128(fold + 2 * u + 1), scratch[2 * u + 1]));
            _mm_storeu_si128(node + i, _mm_setzero_si128());
            _mm_storeu_si128(node + total + i, _mm_setzero_si128());
        }
    }
}


#endif
