/* tensor_ops OpenCL backend: helpers shared by every program (OpenCL C 1.2).
 *
 * The host builds each program as: common.cl, then for each storage variant
 * (STORAGE = 0, 1, 2; see dtype.cl) dtype.cl followed by the family's body, so every
 * kernel exists as <name>_f32a, <name>_f32 and <name>_f16. Math is always fp32.
 *
 * LWS (the one fixed local size, a power of two) is passed with -DLWS=<n>.
 */
#ifndef LWS
#define LWS 64
#endif

/* Loops over the float4 indices [0, cnt) a work-item owns. GPUs (CPU_LAYOUT=0): strided
 * by the work-group/grid size so neighbouring work-items touch neighbouring addresses.
 * CPUs (CPU_LAYOUT=1, PoCL runs a work-group's items one after another): one contiguous
 * chunk per work-item, so each item streams through memory. */
#ifndef CPU_LAYOUT
#define CPU_LAYOUT 0
#endif
#if CPU_LAYOUT
#define FOR_ROW(i, cnt)                                                                  \
    for (int i = (int)get_local_id(0) * (((cnt) + LWS - 1) / LWS),                       \
             i##_end = min((int)(cnt), i + ((cnt) + LWS - 1) / LWS);                     \
         i < i##_end; ++i)
#define FOR_GRID(T_, i, cnt)                                                             \
    for (T_ i = (T_)get_global_id(0) * (((cnt) + (T_)get_global_size(0) - 1) /          \
                                        (T_)get_global_size(0)),                         \
             i##_end = min((T_)(cnt), i + (((cnt) + (T_)get_global_size(0) - 1) /        \
                                           (T_)get_global_size(0)));                     \
         i < i##_end; ++i)
#else
#define FOR_ROW(i, cnt) for (int i = get_local_id(0); i < (cnt); i += LWS)
#define FOR_GRID(T_, i, cnt) \
    for (T_ i = get_global_id(0); i < (cnt); i += get_global_size(0))
#endif

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define KN(name) CAT(name, SUF)
#define KERNEL __kernel __attribute__((reqd_work_group_size(LWS, 1, 1)))

/* Sum of one value per work-item over the work-group; every work-item gets the result.
 * Tree reduction in local memory; the trailing barrier lets the caller reuse scratch. */
inline float block_sum(float v, __local float *scratch)
{
    const int lid = get_local_id(0);
    scratch[lid] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = LWS / 2; s > 0; s >>= 1) {
        if (lid < s)
            scratch[lid] += scratch[lid + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float r = scratch[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}

/* max that propagates NaN (fmax drops it; softmax of a row with a NaN must be all NaN).
 * a + b is NaN when either is; operators only (see exp4). */
inline float nmax1(float a, float b) { return (a != a || b != b) ? a + b : (a > b ? a : b); }
inline float8 nmax8(float8 a, float8 b)
{
    return ((a != a) | (b != b)) ? a + b : (a > b ? a : b);
}

inline float block_max(float v, __local float *scratch)
{
    const int lid = get_local_id(0);
    scratch[lid] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = LWS / 2; s > 0; s >>= 1) {
        if (lid < s)
            scratch[lid] = nmax1(scratch[lid], scratch[lid + s]);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float r = scratch[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}

/* exp for fp32 math, Cephes polynomial with round-to-nearest by the 1.5*2^23 trick (no
 * floor/convert, which PoCL scalarises): ~2.7x faster than PoCL's float4 exp, max relative
 * error ~1e-7. Inputs below -87.3 give 0 (true value < 1.2e-38), above log(FLT_MAX) +inf,
 * NaN gives NaN (the comparisons are false for it), so silu(-1e30) is -0 as in fp64. Only operators, no
 * built-ins: PoCL calls built-ins such as clamp/fmax/fabs/isless out of line, one call per
 * vector, which costs more than the math here. The scale is applied as
 * 2^(n-1) * 2 so n = 128 (x just below log(FLT_MAX)) does not overflow the exponent. */
inline float4 exp4(float4 x0)
{
    float4 x = x0 < -87.3365478515625f ? (float4)(-87.3365478515625f) : x0;
    x = x > 88.72283935546875f ? (float4)(88.72283935546875f) : x;
    const float4 t = x * 1.44269504088896341f + 12582912.0f;
    const float4 n = t - 12582912.0f;
    const float4 r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
    float4 y = 1.9875691500e-4f;
    y = y * r + 1.3981999507e-3f;
    y = y * r + 8.3334519073e-3f;
    y = y * r + 4.1665795894e-2f;
    y = y * r + 1.6666665459e-1f;
    y = y * r + 5.0000001201e-1f;
    y = y * r * r + r + 1.0f;
    const float4 res = y * as_float4((as_int4(t) - 0x4B400000 + 126) << 23) * 2.0f;
    return x0 > 88.72283935546875f ? (float4)(INFINITY) : res;
}

inline float8 exp8(float8 x0)
{
    float8 x = x0 < -87.3365478515625f ? (float8)(-87.3365478515625f) : x0;
    x = x > 88.72283935546875f ? (float8)(88.72283935546875f) : x;
    const float8 t = x * 1.44269504088896341f + 12582912.0f;
    const float8 n = t - 12582912.0f;
    const float8 r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
    float8 y = 1.9875691500e-4f;
    y = y * r + 1.3981999507e-3f;
    y = y * r + 8.3334519073e-3f;
    y = y * r + 4.1665795894e-2f;
    y = y * r + 1.6666665459e-1f;
    y = y * r + 5.0000001201e-1f;
    y = y * r * r + r + 1.0f;
    const float8 res = y * as_float8((as_int8(t) - 0x4B400000 + 126) << 23) * 2.0f;
    return x0 > 88.72283935546875f ? (float8)(INFINITY) : res;
}

inline float exp1(float x0)
{
    float x = x0 < -87.3365478515625f ? -87.3365478515625f : x0;
    x = x > 88.72283935546875f ? 88.72283935546875f : x;
    const float t = x * 1.44269504088896341f + 12582912.0f;
    const float n = t - 12582912.0f;
    const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
    float y = 1.9875691500e-4f;
    y = y * r + 1.3981999507e-3f;
    y = y * r + 8.3334519073e-3f;
    y = y * r + 4.1665795894e-2f;
    y = y * r + 1.6666665459e-1f;
    y = y * r + 5.0000001201e-1f;
    y = y * r * r + r + 1.0f;
    const float res = y * as_float((as_int(t) - 0x4B400000 + 126) << 23) * 2.0f;
    return x0 > 88.72283935546875f ? INFINITY : res;
}

inline float hsum4(float4 v) { return (v.x + v.y) + (v.z + v.w); }
inline float hmax4(float4 v) { return fmax(fmax(v.x, v.y), fmax(v.z, v.w)); }
inline float hsum8(float8 v) { return hsum4(v.lo + v.hi); }
inline float hmax8(float8 v)
{
    return nmax1(nmax1(nmax1(v.s0, v.s1), nmax1(v.s2, v.s3)),
                 nmax1(nmax1(v.s4, v.s5), nmax1(v.s6, v.s7)));
}
