/* Rotary position embedding. x, y: (rows, n); cos, sin: (T, n) float32, row r uses
 * position r % T. Grid: (column groups * LWS, rows), float4 steps plus a scalar tail.
 *
 * Non-interleaved, h = n/2: y[i] = x[i] c[i] - x[i+h] s[i]; y[i+h] = x[i+h] c[i+h] + x[i] s[i+h].
 * Interleaved: y[2i] = x[2i] c[2i] - x[2i+1] s[2i]; y[2i+1] = x[2i+1] c[2i+1] + x[2i] s[2i+1]. */

KERNEL void KN(rope)(__global const T *restrict x, __global const float *cs,
                     __global const float *sn, __global T *y, const int n, const int npos)
{
    const long row = get_global_id(1);
    const long pos = row % npos;
    __global const T *xr = x + row * n;
    __global T *yr = y + row * n;
    __global const float *c = cs + pos * n;
    __global const float *s = sn + pos * n;
    const int h = n >> 1;
    const int h4 = h >> 2;
    FOR_GRID(int, i, h4) {
        const float4 a = LD4(i, xr), b = LD4(i, xr + h);
        ST4(a * LDF4(i, c) - b * LDF4(i, s), i, yr);
        ST4(b * LDF4(i, c + h) + a * LDF4(i, s + h), i, yr + h);
    }
    const int t = (h4 << 2) + get_global_id(0);
    if (t < h) {
        const float a = LD1(t, xr), b = LD1(t + h, xr);
        ST1(a * c[t] - b * s[t], t, yr);
        ST1(b * c[t + h] + a * s[t + h], t + h, yr);
    }
    NT_FENCE();
}

KERNEL void KN(rope_interleaved)(__global const T *restrict x, __global const float *cs,
                                 __global const float *sn, __global T *y, const int n,
                                 const int npos)
{
    const long row = get_global_id(1);
    const long pos = row % npos;
    __global const T *xr = x + row * n;
    __global T *yr = y + row * n;
    __global const float *c = cs + pos * n;
    __global const float *s = sn + pos * n;
    const int n4 = n >> 2;
    const float4 sign = (float4)(-1.0f, 1.0f, -1.0f, 1.0f);
    FOR_GRID(int, i, n4) {
        const float4 v = LD4(i, xr);
        ST4(v * LDF4(i, c) + v.s1032 * LDF4(i, s) * sign, i, yr);
    }
    /* n is even, so the tail is one (even, odd) pair. */
    const int t = (n4 << 2) + 2 * get_global_id(0);
    if (t + 1 < n) {
        const float a = LD1(t, xr), b = LD1(t + 1, xr);
        ST1(a * c[t] - b * s[t], t, yr);
        ST1(b * c[t + 1] + a * s[t + 1], t + 1, yr);
    }
    NT_FENCE();
}
