/* softmax over the last axis: one work-group per row, local-memory reductions for the max
 * and the sum. 8 elements per step (LD8/ST8, float8 math for exp8), scalar tail n % 8. */

KERNEL void KN(softmax)(__global const T *restrict x, __global T *restrict y, const int n)
{
    __local float scratch[LWS];
    const int lid = get_local_id(0);
    const long base = (long)get_group_id(0) * n;
    __global const T *xr = x + base;
    __global T *yr = y + base;
    const int n8 = n >> 3;

    /* NaN-propagating max: a row holding a NaN comes out all NaN (as NumPy/torch), via inv */
    float8 m8 = (float8)(-INFINITY);
    FOR_ROW(i, n8)
        m8 = nmax8(m8, LD8(i, xr));
    float m = hmax8(m8);
    for (int i = (n8 << 3) + lid; i < n; i += LWS)
        m = nmax1(m, LD1(i, xr));
    m = block_max(m, scratch);

    float acc = 0.0f;
#if STORAGE == 2
    /* fp16: recompute exp in the last pass, so the output is rounded to half only once */
    FOR_ROW(i, n8)
        acc += hsum8(exp8(LD8(i, xr) - m));
    for (int i = (n8 << 3) + lid; i < n; i += LWS)
        acc += exp1(LD1(i, xr) - m);
    const float sum = block_sum(acc, scratch);     /* every work-item reaches the barrier */
    const float inv = isnan(m) ? m : 1.0f / sum;
    FOR_ROW(i, n8)
        ST8(exp8(LD8(i, xr) - m) * inv, i, yr);
    for (int i = (n8 << 3) + lid; i < n; i += LWS)
        ST1(exp1(LD1(i, xr) - m) * inv, i, yr);
#else
    /* fp32: store exp(x - max), then rescale in place (one exp per element; each
     * work-item rereads only what it wrote, from cache). Both are cached stores (STC8):
     * a streaming store to a line just written through the cache is ~2x slower on PoCL. */
    FOR_ROW(i, n8) {
        const float8 e = exp8(LD8(i, xr) - m);
        STC8(e, i, yr);
        acc += hsum8(e);
    }
    for (int i = (n8 << 3) + lid; i < n; i += LWS) {
        const float e = exp1(LD1(i, xr) - m);
        ST1(e, i, yr);
        acc += e;
    }
    const float sum = block_sum(acc, scratch);     /* every work-item reaches the barrier */
    const float inv = isnan(m) ? m : 1.0f / sum;
    FOR_ROW(i, n8)
        STC8(LD8(i, yr) * inv, i, yr);
    for (int i = (n8 << 3) + lid; i < n; i += LWS)
        ST1(LD1(i, yr) * inv, i, yr);
#endif
    NT_FENCE();
}
