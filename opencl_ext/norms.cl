/* rms_norm and layer_norm: one work-group per row, local-memory reduction.
 * Row r of x/y starts at r*n; float4 loads (vload4 needs element alignment only) with a
 * scalar tail for n % 4. The row is read twice; the second read comes from cache. */

KERNEL void KN(rms_norm)(__global const T *x, __global const T *w, __global T *y,
                         const int n, const float eps)
{
    __local float scratch[LWS];
    const int lid = get_local_id(0);
    const long base = (long)get_group_id(0) * n;
    __global const T *xr = x + base;
    __global T *yr = y + base;
    const int n4 = n >> 2;

    float acc = 0.0f;
    FOR_ROW(i, n4) {
        const float4 v = LD4(i, xr);
        acc += hsum4(v * v);
    }
    for (int i = (n4 << 2) + lid; i < n; i += LWS) {
        const float v = LD1(i, xr);
        acc += v * v;
    }
    const float inv = rsqrt(block_sum(acc, scratch) / (float)n + eps);

    FOR_ROW(i, n4)
        ST4(LD4(i, xr) * inv * LD4(i, w), i, yr);
    for (int i = (n4 << 2) + lid; i < n; i += LWS)
        ST1(LD1(i, xr) * inv * LD1(i, w), i, yr);
}

/* Biased variance, two passes over the row (mean, then squared deviations) so large
 * means do not cancel. has_bias == 0: b is ignored (the host passes any buffer). */
KERNEL void KN(layer_norm)(__global const T *x, __global const T *w, __global const T *b,
                           __global T *y, const int n, const float eps, const int has_bias)
{
    __local float scratch[LWS];
    const int lid = get_local_id(0);
    const long base = (long)get_group_id(0) * n;
    __global const T *xr = x + base;
    __global T *yr = y + base;
    const int n4 = n >> 2;

    float acc = 0.0f;
    FOR_ROW(i, n4)
        acc += hsum4(LD4(i, xr));
    for (int i = (n4 << 2) + lid; i < n; i += LWS)
        acc += LD1(i, xr);
    const float mean = block_sum(acc, scratch) / (float)n;

    acc = 0.0f;
    FOR_ROW(i, n4) {
        const float4 d = LD4(i, xr) - mean;
        acc += hsum4(d * d);
    }
    for (int i = (n4 << 2) + lid; i < n; i += LWS) {
        const float d = LD1(i, xr) - mean;
        acc += d * d;
    }
    const float inv = rsqrt(block_sum(acc, scratch) / (float)n + eps);

    if (has_bias) {
        FOR_ROW(i, n4)
            ST4((LD4(i, xr) - mean) * inv * LD4(i, w) + LD4(i, b), i, yr);
        for (int i = (n4 << 2) + lid; i < n; i += LWS)
            ST1((LD1(i, xr) - mean) * inv * LD1(i, w) + LD1(i, b), i, yr);
    } else {
        FOR_ROW(i, n4)
            ST4((LD4(i, xr) - mean) * inv * LD4(i, w), i, yr);
        for (int i = (n4 << 2) + lid; i < n; i += LWS)
            ST1((LD1(i, xr) - mean) * inv * LD1(i, w), i, yr);
    }
}
