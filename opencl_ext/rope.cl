/* Rotary position embedding. x, y: (rows, n); cos, sin: (T, n) float32, row r uses
 * position r % T. Rows by FOR_ROWS2D/FOR_COLS (common.cl): the 2D grid (column groups * LWS,
 * rows) on GPUs, whole rows (or ncut pieces of rows) per work-item on CPUs; float4 steps
 * plus a scalar tail.
 * The non-interleaved form writes the two halves in two loops: each loop has 4 input
 * streams and 1 output (the other half of x is reread from cache) instead of 6 and 2 in
 * one loop, which the CPU's prefetchers follow better: measured ~1.4x faster on PoCL
 * (8192x4096 fp32, 8192 positions). Not for half storage: there the second load of x
 * costs a second conversion, and the single loop was faster (27 vs 36 ms).
 *
 * Non-interleaved, h = n/2: y[i] = x[i] c[i] - x[i+h] s[i]; y[i+h] = x[i+h] c[i+h] + x[i] s[i+h].
 * Interleaved: y[2i] = x[2i] c[2i] - x[2i+1] s[2i]; y[2i+1] = x[2i+1] c[2i+1] + x[2i] s[2i+1]. */

KERNEL void KN(rope)(__global const T *restrict x, __global const float *cs,
                     __global const float *sn, __global T *y, const int n, const int npos,
                     const int rows, const int ncut)
{
    FOR_ROWS2D(row, rows, ncut) {
    const long pos = row % npos;
    __global const T *xr = x + (long)row * n;
    __global T *yr = y + (long)row * n;
    __global const float *c = cs + pos * n;
    __global const float *s = sn + pos * n;
    const int h = n >> 1;
    const int h4 = h >> 2;
#if STORAGE == 2
    /* half: one loop, each x element loaded (and converted) once */
    FOR_COLS(i, h4) {
        const float4 a = LD4(i, xr), b = LD4(i, xr + h);
        ST4(a * LDF4(i, c) - b * LDF4(i, s), i, yr);
        ST4(b * LDF4(i, c + h) + a * LDF4(i, s + h), i, yr + h);
    }
#else
    FOR_COLS(i, h4)
        ST4(LD4(i, xr) * LDF4(i, c) - LD4(i, xr + h) * LDF4(i, s), i, yr);
    FOR_COLS(i, h4)
        ST4(LD4(i, xr + h) * LDF4(i, c + h) + LD4(i, xr) * LDF4(i, s + h), i, yr + h);
#endif
    for (int t = COL_TAIL(h4 << 2, h, 1); t < h; t += COL_STEP) {
        const float a = LD1(t, xr), b = LD1(t + h, xr);
        ST1(a * c[t] - b * s[t], t, yr);
        ST1(b * c[t + h] + a * s[t + h], t + h, yr);
    }
    }
    NT_FENCE();
}

KERNEL void KN(rope_interleaved)(__global const T *restrict x, __global const float *cs,
                                 __global const float *sn, __global T *y, const int n,
                                 const int npos, const int rows, const int ncut)
{
    FOR_ROWS2D(row, rows, ncut) {
    const long pos = row % npos;
    __global const T *xr = x + (long)row * n;
    __global T *yr = y + (long)row * n;
    __global const float *c = cs + pos * n;
    __global const float *s = sn + pos * n;
    const int n4 = n >> 2;
    const float4 sign = (float4)(-1.0f, 1.0f, -1.0f, 1.0f);
    FOR_COLS(i, n4) {
        const float4 v = LD4(i, xr);
        ST4(v * LDF4(i, c) + v.s1032 * LDF4(i, s) * sign, i, yr);
    }
    /* n is even, so the tail is one (even, odd) pair. */
    for (int t = COL_TAIL(n4 << 2, n, 2); t + 1 < n; t += 2 * COL_STEP) {
        const float a = LD1(t, xr), b = LD1(t + 1, xr);
        ST1(a * c[t] - b * s[t], t, yr);
        ST1(b * c[t + 1] + a * s[t + 1], t + 1, yr);
    }
    }
    NT_FENCE();
}
