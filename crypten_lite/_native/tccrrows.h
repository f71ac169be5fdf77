/* tccr_rows: the tweakable hash of ot._Hash fused with CorrelatedOT.prepare's bit transpose
 * (included by otkernels.c after t8x8 and the AES loops).
 *
 *   tccr_rows(key, src, rows, first, domain, mask, col, nrows)
 *       h_i = pi(pi(x_i) ^ j_i) ^ pi(x_i), x_i = src_i [^ mask], j_i = (first + i, domain);
 *       bit r of h_i (byte r / 8, bit r % 8) -> rows[r], bit col + i (byte (col + i) / 8, bit
 *       (col + i) % 8), for r < nrows: rows is [nrows, W] bytes, bits outside [col, col + n)
 *       left as they are. prepare's rows of a set whose OTs are hashed here piece by piece
 *       (col: the piece's first OT within the set), without the [n, 16] keys ever stored
 *       and read back (prepare uses 1 or 2 of each key's 16 bytes). The hashes go through a
 *       scratch of ROWS_BLOCK blocks in cache. */

#define ROWS_BLOCK 512

#ifdef OTK_AESNI
/* rows r < nrows of the n hashes h ([n, 16] bytes) at bits col .. col + n of each row */
static void rows_put(const uint8_t *h, Py_ssize_t n, Py_ssize_t col, int nrows, uint8_t *rows,
                     Py_ssize_t w) {
    int nbytes = (nrows + 7) / 8;
    Py_ssize_t i = 0;
    for (int pass = 0; pass < 2; pass++) {   /* 0: up to the first whole byte; 1: the tail */
        Py_ssize_t stop = pass == 0 ? (-col & 7) : n;
        if (stop > n)
            stop = n;
        for (; i < stop; i++) {               /* bit by bit: a byte shared with a neighbour */
            Py_ssize_t p = col + i;
            uint8_t bit = (uint8_t)(1u << (p & 7));
            for (int r = 0; r < nrows; r++) {
                uint8_t *b = rows + r * w + (p >> 3);
                *b = (uint8_t)((*b & ~bit) | (((h[16 * i + (r >> 3)] >> (r & 7)) & 1) ? bit : 0));
            }
        }
        if (pass == 1)
            break;
        for (; i + 8 <= n; i += 8) {          /* whole bytes: one 8x8 transpose per key byte */
            Py_ssize_t c = (col + i) >> 3;
            for (int j = 0; j < nbytes; j++) {
                uint64_t x = 0;
                for (int a = 0; a < 8; a++)
                    x |= (uint64_t)h[16 * (i + a) + j] << (8 * a);
                x = t8x8(x);
                for (int b = 0; b < 8 && 8 * j + b < nrows; b++)
                    rows[(8 * j + b) * w + c] = (uint8_t)(x >> (8 * b));
            }
        }
    }
}
#endif

static PyObject *py_tccr_rows(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *ko, *so, *ro, *fo, *dmo, *mo;
    Py_ssize_t col;
    int nrows;
    if (!PyArg_ParseTuple(args, "OOOOOOni:tccr_rows", &ko, &so, &ro, &fo, &dmo, &mo, &col, &nrows))
        return NULL;
#ifdef OTK_AESNI
    uint64_t first, domain;
    if (!aes_ready() || u64_arg(fo, &first, "first") < 0 || u64_arg(dmo, &domain, "domain") < 0)
        return NULL;
    Py_buffer k, s, o, m;
    int have_m = 0;
    PyObject *ret = NULL;
    PyObject *objs[] = {ko, so, ro};
    Py_buffer *const bufs[] = {&k, &s, &o};
    static const char *const names[] = {"key", "src", "+rows"};
    if (get_bufs(3, objs, bufs, names) < 0)
        return NULL;
    if (mask_arg(mo, &m, &have_m, "tccr_rows") < 0)
        goto done;
    if (!key_arg(&k, "key"))
        goto done;
    Py_ssize_t n = s.len / 16, w = nrows > 0 ? o.len / nrows : 0;
    if (s.len % 16 || nrows < 1 || nrows > 128 || o.len % nrows || col < 0
        || col > 8 * w || n > 8 * w - col) {
        PyErr_Format(PyExc_ValueError, "otkernels.tccr_rows: src must be whole 16-byte blocks "
                     "(%zd bytes), rows nrows = %d (1..128) rows of W bytes (%zd bytes) and "
                     "col %zd + n %zd <= 8 W", s.len, nrows, o.len, col, n);
        goto done;
    }
    aes_key ks;
    aes_expand((const uint8_t *)k.buf, &ks);
    const uint8_t *mask = have_m ? (const uint8_t *)m.buf : NULL;
    Py_BEGIN_ALLOW_THREADS
    uint8_t scratch[16 * ROWS_BLOCK];
    for (Py_ssize_t at = 0; at < n; at += ROWS_BLOCK) {
        Py_ssize_t cnt = n - at < ROWS_BLOCK ? n - at : ROWS_BLOCK;
        tccr_loop(&ks, (const uint8_t *)s.buf + 16 * at, scratch, cnt, first + (uint64_t)at,
                  domain, mask);
        rows_put(scratch, cnt, col + at, nrows, (uint8_t *)o.buf, w);
    }
    Py_END_ALLOW_THREADS
    ret = Py_NewRef(Py_None);
done:
    if (have_m)
        PyBuffer_Release(&m);
    release_bufs(3, bufs);
    return ret;
#else
    (void)ko; (void)so; (void)ro; (void)fo; (void)dmo; (void)mo; (void)col; (void)nrows;
    PyErr_SetString(PyExc_RuntimeError, "otkernels: built without AES-NI (not x86-64)");
    return NULL;
#endif
}
