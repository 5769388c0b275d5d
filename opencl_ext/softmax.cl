/* softmax over the last axis: one work-group per row; max, then sum of exp(x - max),
 * then write. exp is recomputed in the last pass instead of storing it (memory-bound). */

KERNEL void KN(softmax)(__global const T *x, __global T *y, const int n)
{
    __local float scratch[LWS];
    const int lid = get_local_id(0);
    const long base = (long)get_group_id(0) * n;
    __global const T *xr = x + base;
    __global T *yr = y + base;
    const int n4 = n >> 2;

    float m = -INFINITY;
    FOR_ROW(i, n4)
        m = fmax(m, hmax4(LD4(i, xr)));
    for (int i = (n4 << 2) + lid; i < n; i += LWS)
        m = fmax(m, LD1(i, xr));
    m = block_max(m, scratch);

    float acc = 0.0f;
#if STORAGE == 2
    FOR_ROW(i, n4)
        acc += hsum4(exp(LD4(i, xr) - m));
    for (int i = (n4 << 2) + lid; i < n; i += LWS)
        acc += exp(LD1(i, xr) - m);
    const float inv = 1.0f / block_sum(acc, scratch);
    FOR_ROW(i, n4)
        ST4(exp(LD4(i, xr) - m) * inv, i, yr);
    for (int i = (n4 << 2) + lid; i < n; i += LWS)
        ST1(exp(LD1(i, xr) - m) * inv, i, yr);
#else
    /* fp32: store exp(x - max) and rescale it in place (one exp per element; the row is
     * still in cache). fp16 recomputes instead, to round only once. */
    FOR_ROW(i, n4) {
        const float4 e = exp(LD4(i, xr) - m);
        ST4(e, i, yr);
        acc += hsum4(e);
    }
    for (int i = (n4 << 2) + lid; i < n; i += LWS) {
        const float e = exp(LD1(i, xr) - m);
        ST1(e, i, yr);
        acc += e;
    }
    const float inv = 1.0f / block_sum(acc, scratch);
    FOR_ROW(i, n4)
        ST4(LD4(i, yr) * inv, i, yr);
    for (int i = (n4 << 2) + lid; i < n; i += LWS)
        ST1(LD1(i, yr) * inv, i, yr);
#endif
}
