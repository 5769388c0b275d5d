/* softmax over the last axis, rows of n: FOR_ROWS/FOR_ROW (common.cl) give a work-group
 * per row with local-memory reductions on GPUs, whole rows per work-item on CPUs.
 * 8 elements per step (LD8/ST8, float8 math for exp8), scalar tail n % 8.
 *
 * NaN: the max pass uses a plain compare-select (one instruction; the NaN-propagating
 * form took seven). It is not needed for NaN: a row holding a NaN has a NaN term in the
 * sum, so 1/sum, and with it every output of the row, is NaN (as NumPy/torch); the isnan(m)
 * below covers a max that came out NaN. A +inf gives inf - inf = NaN likewise. */

KERNEL void KN(softmax)(__global const T *restrict x, __global T *restrict y, const int n,
                        const int rows)
{
    __local float scratch[LWS];
    const int n8 = n >> 3;
    FOR_ROWS(row, rows) {
    const long base = (long)row * n;
    __global const T *xr = x + base;
    __global T *yr = y + base;

    float8 m8 = (float8)(-INFINITY);
    FOR_ROW(i, n8) {
        const float8 v = LD8(i, xr);
        m8 = m8 > v ? m8 : v;
    }
    float m = hmax8(m8);
    for (int i = (n8 << 3) + ROW_LID; i < n; i += ROW_STEP)
        m = nmax1(m, LD1(i, xr));
    m = ROW_MAX(m, scratch);

    float acc = 0.0f;
#if STORAGE == 2
    /* fp16: recompute exp in the last pass, so the output is rounded to half only once */
    {
        sum8 a8 = sum8_new();
        FOR_ROW(i, n8)
            sum8_add(&a8, exp8(LD8(i, xr) - m));
        acc = sum8_total(&a8);
    }
    for (int i = (n8 << 3) + ROW_LID; i < n; i += ROW_STEP)
        acc += exp1(LD1(i, xr) - m);
    const float sum = ROW_SUM(acc, scratch);     /* every work-item reaches the barrier */
    const float inv = isnan(m) ? m : 1.0f / sum;
    FOR_ROW(i, n8)
        ST8(exp8(LD8(i, xr) - m) * inv, i, yr);
    for (int i = (n8 << 3) + ROW_LID; i < n; i += ROW_STEP)
        ST1(exp1(LD1(i, xr) - m) * inv, i, yr);
#else
    /* fp32: store exp(x - max), then rescale in place (one exp per element; each
     * work-item rereads only what it wrote, from cache). Both are cached stores (STC8):
     * a streaming store to a line just written through the cache is ~2x slower on PoCL. */
    sum8 acc8 = sum8_new();
    FOR_ROW(i, n8) {
        const float8 e = exp8(LD8(i, xr) - m);
        STC8(e, i, yr);
        sum8_add(&acc8, e);
    }
    acc = sum8_total(&acc8);
    for (int i = (n8 << 3) + ROW_LID; i < n; i += ROW_STEP) {
        const float e = exp1(LD1(i, xr) - m);
        ST1(e, i, yr);
        acc += e;
    }
    const float sum = ROW_SUM(acc, scratch);     /* every work-item reaches the barrier */
    const float inv = isnan(m) ? m : 1.0f / sum;
    FOR_ROW(i, n8)
        STC8(LD8(i, yr) * inv, i, yr);
    for (int i = (n8 << 3) + ROW_LID; i < n; i += ROW_STEP)
        ST1(LD1(i, yr) * inv, i, yr);
#endif
    }
    NT_FENCE();
}
