/* tensor_ops OpenCL backend: helpers shared by every program (OpenCL C 1.2).
 *
 * The host builds each program as: common.cl, then for each storage variant
 * (STORAGE = 0..3; see dtype.cl) dtype.cl followed by the family's body (norm.cl,
 * softmax.cl, activation.cl, rope.cl), so every kernel exists as to_<name>_f32a,
 * to_<name>_f32, to_<name>_f16 and to_<name>_f32n (KN; "to_" is the project's one symbol
 * prefix, shared with the CUDA kernels). Math is always fp32.
 *
 * LWS (the one fixed local size, a power of two) is passed with -DLWS=<n>.
 */
#ifndef LWS
#define LWS 64
#endif

/* Loop shapes, by CPU_LAYOUT (a build option, see the host's _cpu_layout).
 *
 * FOR_GRID(T, i, cnt): the flat elementwise kernels' loop over [0, cnt). GPUs
 * (CPU_LAYOUT=0): strided by the grid size so neighbouring work-items touch neighbouring
 * addresses. CPUs (CPU_LAYOUT=1, PoCL runs a work-group's items one after another): one
 * contiguous chunk per work-item, so each item streams through memory.
 *
 * Row kernels (norms, softmax, gated activations, rope) loop FOR_ROWS(r, rows) over the
 * rows they own and, inside a row, FOR_ROW(i, cnt) over its float8 steps, with the scalar
 * tail from ROW_LID in steps of ROW_STEP; ROW_SUM/ROW_MAX reduce over the row's items.
 *   GPUs: one work-group per row (grid rows * LWS), the row's items share it (strided),
 *     work-group reductions in local memory.
 *   CPUs: a flat grid; each work-item owns a contiguous block of whole rows
 *     (FOR_BLOCKS_) and walks each row alone (no reduction, no barrier). Every stream it
 *     reads or writes is then a whole row long; with a row split over the 4 items of a
 *     group (1 KiB pieces of up to 8 streams in rope) the hardware prefetchers kept
 *     restarting: measured on PoCL (8192x4096 fp32) rope 20.4 -> 10.3 ms for the kernel
 *     alone.
 * The 2D row kernels (gated activations, rope: no reduction) loop FOR_ROWS2D(r, rows,
 * ncut) and FOR_COLS(i, cnt), scalar tail from COL_TAIL(base, end, w) (w elements per
 * item) in steps of w * COL_STEP.
 *   GPUs: grid (column groups * LWS, rows), strided over the columns; ncut unused.
 *   CPUs: a flat grid over rows * ncut units, a unit being one of ncut contiguous column
 *     pieces of a row (the last one also does the tail); the host picks ncut = 1 (whole
 *     rows, as above) unless there are fewer rows than work-groups, so that a few long rows
 *     still use every thread. */
#ifndef CPU_LAYOUT
#define CPU_LAYOUT 0
#endif
#if CPU_LAYOUT
/* The chunk end is clamped with ?: rather than min(): PoCL calls min() out of line, and a
 * call between the loops made LLVM keep the exp/erf constants in stack slots (no ymm
 * register survives a call) and reload them every iteration: silu's loop went from 36 to
 * 28 instructions, ~20% less time, without it. */
#define CHUNK_END_(T_, a, b) ((T_)(a) < (T_)(b) ? (T_)(a) : (T_)(b))
#define FOR_GRID(T_, i, cnt)                                                             \
    for (T_ i = (T_)get_global_id(0) * (((cnt) + (T_)get_global_size(0) - 1) /          \
                                        (T_)get_global_size(0)),                         \
             i##_end = CHUNK_END_(T_, cnt, i + (((cnt) + (T_)get_global_size(0) - 1) /   \
                                                (T_)get_global_size(0)));                \
         i < i##_end; ++i)
/* [0, cnt) in contiguous blocks, one per work-group, each split into contiguous pieces
 * over the group's items (items past the end get none). PoCL runs a group on one thread,
 * so blocks per group (the host launches min(groups, cnt) groups) spread a few rows over
 * every thread, which items of one group would not. */
#define FOR_BLOCKS_(r, cnt)                                                              \
    for (int r##_g = ((cnt) + (int)get_num_groups(0) - 1) / (int)get_num_groups(0),      \
             r##_a = (int)get_group_id(0) * r##_g,                                       \
             r##_b = CHUNK_END_(int, cnt, r##_a + r##_g),                                \
             r##_i = (r##_b - r##_a + LWS - 1) / LWS,                                    \
             r = r##_a + (int)get_local_id(0) * r##_i,                                   \
             r##_end = CHUNK_END_(int, r##_b, r + r##_i);                                \
         r < r##_end; ++r)
#define FOR_ROWS(r, rows) FOR_BLOCKS_(r, rows)
#define FOR_ROW(i, cnt) for (int i = 0; i < (cnt); ++i)
#define ROW_LID 0
#define ROW_STEP 1
#define ROW_SUM(v, scratch) (v)
#define ROW_MAX(v, scratch) (v)
#define FOR_ROWS2D(r, rows, ncut)                                                        \
    FOR_BLOCKS_(r##_u, (rows) * (ncut))                                                  \
    for (int r = r##_u / (ncut), cut_ = r##_u - r * (ncut), ncut_ = (ncut), r##_once = 1; \
         r##_once; r##_once = 0)
#define FOR_COLS(i, cnt)                                                                 \
    for (int i = cut_ * (((cnt) + ncut_ - 1) / ncut_),                                   \
             i##_end = CHUNK_END_(int, cnt, i + ((cnt) + ncut_ - 1) / ncut_);            \
         i < i##_end; ++i)
#define COL_TAIL(base, end, w) (cut_ == ncut_ - 1 ? (base) : (end))
#define COL_STEP 1
#else
#define FOR_GRID(T_, i, cnt) \
    for (T_ i = get_global_id(0); i < (cnt); i += get_global_size(0))
/* one pass: r = this group's row (the grid has exactly one group per row) */
#define FOR_ROWS(r, rows) for (int r = get_group_id(0), r##_once = 1; r##_once; r##_once = 0)
#define FOR_ROW(i, cnt) for (int i = get_local_id(0); i < (cnt); i += LWS)
#define ROW_LID ((int)get_local_id(0))
#define ROW_STEP LWS
#define ROW_SUM(v, scratch) block_sum((v), (scratch))
#define ROW_MAX(v, scratch) block_max((v), (scratch))
#define FOR_ROWS2D(r, rows, ncut) \
    for (int r = get_global_id(1), r##_once = 1; r##_once; r##_once = 0)
#define FOR_COLS(i, cnt) for (int i = get_global_id(0); i < (cnt); i += get_global_size(0))
#define COL_TAIL(base, end, w) ((base) + (w) * (int)get_global_id(0))
#define COL_STEP ((int)get_global_size(0))
#endif

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define KN(name) CAT(CAT(to_, name), SUF)
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
 * a + b is NaN when either is; operators only (see exp8). */
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

/* exp for fp32 math where a huge result only enters 1/(1 + e) (silu, tanh-GELU) or the
 * argument is <= 0 (softmax). Method: n = round(x / ln2) by the 1.5*2^23 trick with the
 * exponent bias folded into the magic constant (12582912 + 127), r = x - n ln2 by one FMA
 * with ln2 rounded to fp32 (error |n| * 1.9e-9, <= 2.4e-7 relative at |n| = 128), e^r on
 * |r| <= ln2/2 by a degree-5 polynomial fitted for minimum max relative error (1.1e-7),
 * evaluated by Horner, and 2^n by shifting as_int(t): its low 9 bits are n + 127, the
 * shift by 23 drops everything above them. Measured max relative error over the range,
 * in fp32 arithmetic: 4.0e-7 (rtol is 1.3e-6). No floor/convert (PoCL scalarises them), no
 * built-ins (PoCL calls clamp/fmax/fabs/isless/select out of line, one call per vector,
 * which costs more than this math): 12 vector operations, against 21 for the Cephes
 * degree-6 version with a Cody-Waite pair, an explicit inf select and a 2^(n-1) * 2 scale
 * it replaced (silu ~1.6x faster on PoCL/znver3 with the min() fix in FOR_GRID).
 * Range, by the clamps to [-88, 88.7] (n in [-127, 128]):
 *   x >= ~88.38 gives +inf (n = 128 is the inf bit pattern; the true value is finite up
 *     to 88.72), so silu(-1e30) = -1e30 / inf = -0 as in fp64;
 *   x < ~-87.68 gives 0 (n = -127 is the zero pattern; true value < 1e-38), so softmax's
 *     exp(-inf) is exactly 0;
 *   NaN gives NaN (the comparisons are false for it, and NaN * anything is NaN).
 * EXP_BODY(V, S, LO, HI) computes exp(S x), S = +1 or -1, x clamped to [LO, HI]: exp(-x)
 * (silu) negates the constants and the odd coefficients instead of x, saving the negation. */
#define EXP_C5 8.312482387e-3f
#define EXP_C4 4.189031199e-2f
#define EXP_C3 1.666711569e-1f
#define EXP_C2 4.999923110e-1f
#define EXP_BODY(V_, S_, LO_, HI_)                                                       \
    V_ xc = x < (LO_) ? (V_)(LO_) : x;                                                   \
    xc = xc > (HI_) ? (V_)(HI_) : xc;                                                    \
    const V_ t = xc * ((S_) * 1.44269504088896341f) + 12583039.0f;                       \
    const V_ r = (t - 12583039.0f) * ((S_) * -0.693147182464599609f) + xc;               \
    V_ y = (S_) * EXP_C5;                                                                \
    y = y * r + EXP_C4;                                                                  \
    y = y * r + (S_) * EXP_C3;                                                           \
    y = y * r + EXP_C2;                                                                  \
    y = y * r + (S_) * 1.0f;                                                             \
    y = y * r + 1.0f;
inline float8 exp8(float8 x)
{
    EXP_BODY(float8, 1.0f, -88.0f, 88.7f)
    return y * as_float8(as_int8(t) << 23);
}
inline float exp1(float x)
{
    EXP_BODY(float, 1.0f, -88.0f, 88.7f)
    return y * as_float(as_int(t) << 23);
}
/* exp(-x): the clamps mirrored */
inline float8 expn8(float8 x)
{
    EXP_BODY(float8, -1.0f, -88.7f, 88.0f)
    return y * as_float8(as_int8(t) << 23);
}
inline float expn1(float x)
{
    EXP_BODY(float, -1.0f, -88.7f, 88.0f)
    return y * as_float(as_int(t) << 23);
}

inline float hsum4(float4 v) { return (v.x + v.y) + (v.z + v.w); }
inline float hmax4(float4 v) { return fmax(fmax(v.x, v.y), fmax(v.z, v.w)); }
inline float hsum8(float8 v) { return hsum4(v.lo + v.hi); }

/* A row's sum in float8 lanes that stays accurate on long rows. One lane adding a term per
 * step for the whole row lost accuracy with its length (2^22-element fp32 rows: rms_norm
 * 5.5e-6 relative error, softmax 3.4e-6, against ~1e-7 from the C++ backend's blocks), so the
 * lanes take ACC_BLOCK steps at a time and are then folded into a compensated total (Kahan:
 * c carries what the total's rounding lost); the build has no fast-math option that would
 * reassociate it away. sum8_add per step, sum8_total once. */
#define ACC_BLOCK 128
typedef struct { float8 a, t, c; int k; } sum8;
inline sum8 sum8_new(void)
{
    sum8 s;
    s.a = 0.0f;
    s.t = 0.0f;
    s.c = 0.0f;
    s.k = 0;
    return s;
}
inline void sum8_fold(sum8 *s)
{
    const float8 y = s->a - s->c, u = s->t + y;
    /* once a lane's total is inf or NaN the compensation would be inf - inf = NaN and turn an
     * inf sum (a row holding inf: y = x * 0) into NaN: it stays 0, and the total is the plain one */
    s->c = select((float8)(0.0f), (u - s->t) - y, isfinite(u));
    s->t = u;
    s->a = 0.0f;
    s->k = 0;
}
inline void sum8_add(sum8 *s, const float8 v)
{
    s->a += v;
    if (++s->k == ACC_BLOCK) sum8_fold(s);
}
inline float sum8_total(sum8 *s)
{
    sum8_fold(s);
    return hsum8(s->t - s->c);
}
inline float hmax8(float8 v)
{
    return nmax1(nmax1(nmax1(v.s0, v.s1), nmax1(v.s2, v.s3)),
                 nmax1(nmax1(v.s4, v.s5), nmax1(v.s6, v.s7)));
}
