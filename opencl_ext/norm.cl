/* rms_norm and layer_norm over rows of n: FOR_ROWS/FOR_ROW (common.cl) give a work-group
 * per row with a local-memory reduction on GPUs, whole rows per work-item on CPUs.
 * Row r of x/y starts at r*n; 8 elements per step (LD8/ST8: float4 accesses, float8 math;
 * vload4 in the unaligned variant needs element alignment only), scalar tail for n % 8.
 * The row is read twice (layer_norm: three times for rows whose one-pass moments would
 * cancel); the rereads come from cache. */

/* max|x| over the row (NaN ignored), reduced over the row's items: the scale of the rare
 * rescaled pass of both norms when their fp32 sums overflow. */
float KN(row_absmax)(__global const T *restrict xr, const int n, const int n8, __local float *scratch)
{
    float8 mx = 0.0f;
    FOR_ROW(i, n8)
        mx = nmax8(mx, as_float8(as_int8(LD8(i, xr)) & (int8)(0x7fffffff)));
    float amax = hmax8(mx);
    for (int i = (n8 << 3) + ROW_LID; i < n; i += ROW_STEP)
        amax = nmax1(amax, fabs(LD1(i, xr)));
    return ROW_MAX(amax, scratch);
}

/* One row of rms_norm: xr -> yr (the kernels below; the fused add passes its s row). */
void KN(rms_row)(__global const T *restrict xr, __global const T *restrict w, __global T *restrict yr,
                 const int n, const int n8, const float eps, __local float *scratch)
{
    sum8 acc8 = sum8_new();      /* lane sums, one horizontal sum per row, not per step */
    FOR_ROW(i, n8) {
        const float8 v = LD8(i, xr);
        sum8_add(&acc8, v * v);
    }
    float acc = sum8_total(&acc8);
    for (int i = (n8 << 3) + ROW_LID; i < n; i += ROW_STEP) {
        const float v = LD1(i, xr);
        acc += v * v;
    }
    float ss = ROW_SUM(acc, scratch), sc = 1.0f, eps_s = eps;
    if (!isfinite(ss)) {
        /* x^2 overflowed (|x| > ~1.8e19 on finite input): the sum again for x*sc, sc the power
         * of two that puts max|x| in [0.5, 1) (exact scaling, and never a subnormal scale: 1/max|x|
         * was one above ~8.5e37, 0 on devices that flush subnormals), and y = x * (sc *
         * rsqrt(ss'/n + eps*sc^2)), as layer_norm below does; inf/NaN rows keep the plain
         * formula's NaN/0. Uniform over the work-group (ss is reduced), so the barriers inside
         * ROW_MAX/ROW_SUM are reached by all items or none. */
        const float amax = KN(row_absmax)(xr, n, n8, scratch);
        if (isfinite(amax) && amax > 0.0f) {
            int e;
            frexp(amax, &e);
            sc = ldexp(1.0f, e < 126 ? -e : -126);
            eps_s = eps * sc * sc;
            sum8 s8 = sum8_new();
            FOR_ROW(i, n8) {
                const float8 v = LD8(i, xr) * sc;
                sum8_add(&s8, v * v);
            }
            float a = sum8_total(&s8);
            for (int i = (n8 << 3) + ROW_LID; i < n; i += ROW_STEP) {
                const float v = LD1(i, xr) * sc;
                a += v * v;
            }
            ss = ROW_SUM(a, scratch);
        }
    }
    const float inv = sc * rsqrt(ss / (float)n + eps_s);   /* sc folded: the write is unchanged */

    FOR_ROW(i, n8)
        ST8(LD8(i, xr) * inv * LD8(i, w), i, yr);
    for (int i = (n8 << 3) + ROW_LID; i < n; i += ROW_STEP)
        ST1(LD1(i, xr) * inv * LD1(i, w), i, yr);
}

KERNEL void KN(rms_norm)(__global const T *restrict x, __global const T *restrict w,
                         __global T *restrict y, const int n, const float eps,
                         const int rows)
{
    __local float scratch[LWS];
    const int n8 = n >> 3;
    FOR_ROWS(row, rows) {
        const long base = (long)row * n;
        KN(rms_row)(x + base, w, y + base, n, n8, eps, scratch);
    }
    NT_FENCE();
}

/* The mean and the biased variance of the row scaled by sc, in two passes (the sum, then the
 * centred squares: no cancellation; the rereads come from cache). */
void KN(ln_moments)(__global const T *restrict xr, const int n, const int n8, const float sc,
                    float *mean, float *var, __local float *scratch)
{
    sum8 s1 = sum8_new();
    FOR_ROW(i, n8)
        sum8_add(&s1, LD8(i, xr) * sc);
    float a1 = sum8_total(&s1);
    for (int i = (n8 << 3) + ROW_LID; i < n; i += ROW_STEP)
        a1 += LD1(i, xr) * sc;
    const float m = ROW_SUM(a1, scratch) / (float)n;
    sum8 s2 = sum8_new();
    FOR_ROW(i, n8) {
        const float8 d = LD8(i, xr) * sc - m;
        sum8_add(&s2, d * d);
    }
    float a2 = sum8_total(&s2);
    for (int i = (n8 << 3) + ROW_LID; i < n; i += ROW_STEP) {
        const float d = LD1(i, xr) * sc - m;
        a2 += d * d;
    }
    *mean = m;
    *var = ROW_SUM(a2, scratch) / (float)n;
}

/* One row of layer_norm: biased variance from one pass of shifted moments (see below), then
 * the write pass. has_bias == 0: b is ignored (the host passes any buffer). */
void KN(ln_row)(__global const T *restrict xr, __global const T *restrict w, __global const T *restrict b,
                __global T *restrict yr, const int n, const int n8, const float eps, const int has_bias,
                __local float *scratch)
{
    /* One pass over the row for both moments, shifted by the row's first element K:
     * var = E[(x-K)^2] - m1^2 with m1 = E[x-K]. That difference cancels when K is far from
     * the mean (x[0] = 1000 in a row of N(0, 1) gave 1.8e-2 absolute error in y), so when
     * m1^2 > 4 var - K more than two sigma from the mean, a few rows in a hundred of random
     * data - the moments are recomputed in two passes (ln_moments): a third pass over the
     * row, which made every row 27 % slower on PoCL's CPU device when all rows took it. The
     * output is computed as (x*sc - mean) * inv, with sc = 1 unless the moments overflowed
     * on finite input (|x - mean| > ~1.8e19, or a sum past FLT_MAX): then they are
     * recomputed for x * 2^-e, max|x| * 2^-e in [0.5, 1) (a power of two: the scaling is
     * exact, so a contracted x*sc - mean rounds like the scaled value minus the mean). On
     * GPUs these branches are uniform over the work-group (every item holds the same reduced
     * values), so their barriers are reached by all items or none; on CPUs a row has one
     * item and there are no barriers. */
    float k = LD1(0, xr);
    k = isfinite(k) ? k : 0.0f;          /* an inf/NaN row must still come out NaN */
    float sc = 1.0f, eps_s = eps, mean, var, m1;
    {
        sum8 s1 = sum8_new(), s2 = sum8_new();
        FOR_ROW(i, n8) {
            const float8 d = LD8(i, xr) - k;
            sum8_add(&s1, d);
            sum8_add(&s2, d * d);
        }
        float a1 = sum8_total(&s1), a2 = sum8_total(&s2);
        for (int i = (n8 << 3) + ROW_LID; i < n; i += ROW_STEP) {
            const float d = LD1(i, xr) - k;
            a1 += d;
            a2 += d * d;
        }
        m1 = ROW_SUM(a1, scratch) / (float)n;
        mean = k + m1;
        var = ROW_SUM(a2, scratch) / (float)n - m1 * m1;
    }
    if (!(isfinite(mean) && isfinite(var))) {
        const float amax = KN(row_absmax)(xr, n, n8, scratch);
        if (isfinite(amax) && amax > 0.0f) {   /* finite row: rescale; else NaN stays */
            int e;
            frexp(amax, &e);
            sc = ldexp(1.0f, e < 126 ? -e : -126);
            eps_s = eps * sc * sc;
            KN(ln_moments)(xr, n, n8, sc, &mean, &var, scratch);
        }
    } else if (m1 * m1 > 4.0f * var) {
        KN(ln_moments)(xr, n, n8, 1.0f, &mean, &var, scratch);
    }
    var = var < 0.0f ? 0.0f : var;       /* rounding; NaN passes (fmax would drop it) */
    float inv = rsqrt(var + eps_s);
    /* Scaled, eps * sc^2 can underflow: a row of equal values then gets y = b, as in fp64. */
    if (sc != 1.0f && eps > 0.0f) inv = fmin(inv, FLT_MAX);

    if (has_bias) {
        FOR_ROW(i, n8)
            ST8((LD8(i, xr) * sc - mean) * inv * LD8(i, w) + LD8(i, b), i, yr);
        for (int i = (n8 << 3) + ROW_LID; i < n; i += ROW_STEP)
            ST1((LD1(i, xr) * sc - mean) * inv * LD1(i, w) + LD1(i, b), i, yr);
    } else {
        FOR_ROW(i, n8)
            ST8((LD8(i, xr) * sc - mean) * inv * LD8(i, w), i, yr);
        for (int i = (n8 << 3) + ROW_LID; i < n; i += ROW_STEP)
            ST1((LD1(i, xr) * sc - mean) * inv * LD1(i, w), i, yr);
    }
}

KERNEL void KN(layer_norm)(__global const T *restrict x, __global const T *restrict w,
                           __global const T *restrict b, __global T *restrict y,
                           const int n, const float eps, const int has_bias, const int rows)
{
    __local float scratch[LWS];
    const int n8 = n >> 3;
    FOR_ROWS(row, rows) {
        const long base = (long)row * n;
        KN(ln_row)(x + base, w, b, y + base, n, n8, eps, has_bias, scratch);
    }
    NT_FENCE();
}

/* ---- fused residual add + norm (vLLM's fused_add_rms_norm) ----------------------------
 * s = x + r, stored rounded to T (STC8: a cached store, reread at once), then the norm of
 * the stored s row (rms_row / ln_row, with their rescaled pass for rows whose fp32 sums
 * overflow). y may be x and s may be r (the same buffers: the in-place form), so these
 * pointers are not restrict: a row of x and r is read (by the item that then writes the
 * same elements of s) before anything of the row is written, and every item rereads only
 * the elements of s it wrote itself (rms_row/ln_row/row_absmax walk the row with the same
 * FOR_ROW / ROW_LID mapping), so no barrier is needed between the add and the norm. */
void KN(add_row)(__global const T *xr, __global const T *rr, __global T *sr, const int n, const int n8)
{
    FOR_ROW(i, n8)
        STC8(LD8(i, xr) + LD8(i, rr), i, sr);
    for (int i = (n8 << 3) + ROW_LID; i < n; i += ROW_STEP)
        ST1(LD1(i, xr) + LD1(i, rr), i, sr);
}

KERNEL void KN(add_rms_norm)(__global const T *x, __global const T *r, __global const T *restrict w,
                             __global T *y, __global T *s, const int n, const float eps, const int rows)
{
    __local float scratch[LWS];
    const int n8 = n >> 3;
    FOR_ROWS(row, rows) {
        const long base = (long)row * n;
        KN(add_row)(x + base, r + base, s + base, n, n8);
        KN(rms_row)(s + base, w, y + base, n, n8, eps, scratch);
    }
    NT_FENCE();
}

KERNEL void KN(add_layer_norm)(__global const T *x, __global const T *r, __global const T *restrict w,
                               __global const T *restrict b, __global T *y, __global T *s,
                               const int n, const float eps, const int has_bias, const int rows)
{
    __local float scratch[LWS];
    const int n8 = n >> 3;
    FOR_ROWS(row, rows) {
        const long base = (long)row * n;
        KN(add_row)(x + base, r + base, s + base, n, n8);
        KN(ln_row)(s + base, w, b, y + base, n, n8, eps, has_bias, scratch);
    }
    NT_FENCE();
}
