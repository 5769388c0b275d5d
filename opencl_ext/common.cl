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

inline float block_max(float v, __local float *scratch)
{
    const int lid = get_local_id(0);
    scratch[lid] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = LWS / 2; s > 0; s >>= 1) {
        if (lid < s)
            scratch[lid] = fmax(scratch[lid], scratch[lid + s]);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float r = scratch[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}

inline float hsum4(float4 v) { return (v.x + v.y) + (v.z + v.w); }
inline float hmax4(float4 v) { return fmax(fmax(v.x, v.y), fmax(v.z, v.w)); }
