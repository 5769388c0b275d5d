/* Elementwise activations and gated (GLU) activations.
 *
 * Grid: (column groups * LWS, rows). Each work-item walks its part of the row in steps of
 * 8 elements (LD8/ST8: float4 loads and stores, float8 math), then the work-items of the
 * row share the scalar tail (n % 8 elements). Plain activations are launched on the flat
 * array as one row; swiglu/geglu on rows of x (rows, 2h) -> y (rows, h).
 * F8/F1 are the float8/float forms of each function. */

#ifndef ACTIVATIONS_HELPERS
#define ACTIVATIONS_HELPERS
/* erf(x) = x P(x^2) / Q(x^2) on [-4, 4], the rational minimax approximation Eigen and XLA
 * use for fp32 (a few ulp; the C++ backend's verf); |x| > 4 clamps, where erf is +-1 in
 * fp32 at the clamp (exactly). herf = erf / 2, with P halved (an exact scaling, so herf is
 * bit for bit half of erf): gelu = x (0.5 + herf(x / sqrt2)) is then one add and one
 * multiply, and exactly 0 for x < -5.66 (gelu(-1e30) = -0) and x for x > 5.66. One
 * division and 12 FMAs: it replaced Abramowitz & Stegun 7.1.26 (a division plus a full
 * exp), gelu 8192x4096 fp32 on PoCL/znver3 32.6 -> 17.7 ms of CPU time, the halving 6%
 * more (16.2 -> 15.3: it replaces two multiplies and an FMA). Horner on purpose: folding
 * 1/sqrt2 into the coefficients (one multiply less) or Estrin's scheme (~5% faster) round
 * erf at the clamp to 1 + 1 ulp, and gelu(-1e30) comes out ~1e23 instead of 0.
 * Clamps by operators (NaN passes: both comparisons are false), not clamp() (out of line
 * in PoCL). gelu's error is then ~0.5 |x| * few ulp, well inside rtol 1.3e-6, atol 1e-5. */
#define HERF_BODY(V_)                                                                    \
    V_ xc = x < -4.0f ? (V_)(-4.0f) : x;                                                 \
    xc = xc > 4.0f ? (V_)(4.0f) : xc;                                                    \
    const V_ x2 = xc * xc;                                                               \
    V_ p = 0.5f * -2.72614225801306e-10f;                                                \
    p = p * x2 + 0.5f * 2.77068142495902e-08f;                                           \
    p = p * x2 + 0.5f * -2.10102402082508e-06f;                                          \
    p = p * x2 + 0.5f * -5.69250639462346e-05f;                                          \
    p = p * x2 + 0.5f * -7.34990630326855e-04f;                                          \
    p = p * x2 + 0.5f * -2.95459980854025e-03f;                                          \
    p = p * x2 + 0.5f * -1.60960333262415e-02f;                                          \
    V_ q = -1.45660718464996e-05f;                                                       \
    q = q * x2 - 2.13374055278905e-04f;                                                  \
    q = q * x2 - 1.68282697438203e-03f;                                                  \
    q = q * x2 - 7.37332916720468e-03f;                                                  \
    q = q * x2 - 1.42647390514189e-02f;                                                  \
    return (p * xc) / q;
inline float8 herf8(float8 x) { HERF_BODY(float8) }
inline float herf1(float x) { HERF_BODY(float) }
#endif

#define SILU8(v) ((v) / (1.0f + expn8(v)))
#define SILU1(v) ((v) / (1.0f + expn1(v)))
/* operators, not select()/isless() (out-of-line calls in PoCL); NaN and -0.0 pass */
#define RELU8(v) ((v) < 0.0f ? (float8)(0.0f) : (v))
#define RELU1(v) ((v) < 0.0f ? 0.0f : (v))
/* x Phi(x) = x (0.5 + erf(x / sqrt2) / 2): see herf above */
#define GELU8(v) ((v) * (0.5f + herf8((v) * 0.70710678118654752f)))
#define GELU1(v) ((v) * (0.5f + herf1((v) * 0.70710678118654752f)))
/* 0.5 (1 + tanh(u)) == 1 / (1 + exp(-2u)): one exp, no tanh. -2u = v (a v^2 + b) with
 * a = -2 sqrt(2/pi) 0.044715, b = -2 sqrt(2/pi): a multiply and an FMA. */
#define GELU_TANH8(v) \
    ((v) / (1.0f + exp8((v) * ((v) * (v) * -0.0713548162726f - 1.5957691216057308f))))
#define GELU_TANH1(v) \
    ((v) / (1.0f + exp1((v) * ((v) * (v) * -0.0713548162726f - 1.5957691216057308f))))

#define ELTWISE(name, F8, F1)                                                         \
    KERNEL void KN(name)(__global const T *restrict x, __global T *restrict y,       \
                         const long n)                                         \
    {                                                                                  \
        const long n8 = n >> 3;                                                        \
        FOR_GRID(long, i, n8) {                                                        \
            const float8 v = LD8(i, x);                                                \
            ST8(F8(v), i, y);                                                          \
        }                                                                              \
        for (long t = (n8 << 3) + get_global_id(0); t < n; t += get_global_size(0)) { \
            const float v = LD1(t, x);                                                 \
            ST1(F1(v), t, y);                                                          \
        }                                                                              \
        NT_FENCE();                                                                    \
    }

ELTWISE(silu, SILU8, SILU1)
ELTWISE(relu, RELU8, RELU1)
ELTWISE(gelu, GELU8, GELU1)
ELTWISE(gelu_tanh, GELU_TANH8, GELU_TANH1)

/* y[r, j] = F(x[r, j]) * x[r, h + j], x row length 2h, y row length h. Rows by
 * FOR_ROWS2D/FOR_COLS (common.cl): the 2D grid (column groups * LWS, rows) on GPUs, whole
 * rows (or ncut pieces of rows) per work-item on CPUs. */
#define GATED(name, F8, F1)                                                            \
    KERNEL void KN(name)(__global const T *restrict x, __global T *restrict y,       \
                         const int h, const int rows, const int ncut)                  \
    {                                                                                  \
        const int h8 = h >> 3;                                                         \
        FOR_ROWS2D(row, rows, ncut) {                                                  \
            __global const T *a = x + (long)row * 2 * h;                               \
            __global const T *g = a + h;                                               \
            __global T *yr = y + (long)row * h;                                        \
            FOR_COLS(i, h8) {                                                          \
                const float8 v = LD8(i, a);                                            \
                ST8(F8(v) * LD8(i, g), i, yr);                                         \
            }                                                                          \
            for (int t = COL_TAIL(h8 << 3, h, 1); t < h; t += COL_STEP) {              \
                const float v = LD1(t, a);                                             \
                ST1(F1(v) * LD1(t, g), t, yr);                                         \
            }                                                                          \
        }                                                                              \
        NT_FENCE();                                                                    \
    }

GATED(swiglu, SILU8, SILU1)
GATED(geglu, GELU8, GELU1)
GATED(geglu_tanh, GELU_TANH8, GELU_TANH1)
