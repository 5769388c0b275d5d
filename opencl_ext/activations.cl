/* Elementwise activations and gated (GLU) activations.
 *
 * Grid: (column groups * LWS, rows). Each work-item walks its part of the row in steps of
 * 8 elements (LD8/ST8: float4 loads and stores, float8 math), then the work-items of the
 * row share the scalar tail (n % 8 elements). Plain activations are launched on the flat
 * array as one row; swiglu/geglu on rows of x (rows, 2h) -> y (rows, h).
 * F8/F1 are the float8/float forms of each function. */

#ifndef ACTIVATIONS_HELPERS
#define ACTIVATIONS_HELPERS
/* erf by Abramowitz & Stegun 7.1.26 (|error| <= 1.5e-7, ~5e-7 in fp32 arithmetic), with one
 * exp8: PoCL's erf is ~5x slower on vectors. Sign handling by bit operations (fabs and
 * copysign are out-of-line calls in PoCL). gelu's error is then <= 0.5 |x| 5e-7, inside
 * the fp32 tolerance (rtol 1.3e-6, atol 1e-5). */
inline float8 erf8(float8 x)
{
    const int8 sign = as_int8(x) & (int8)(0x80000000);
    const float8 ax = as_float8(as_int8(x) ^ sign);
    const float8 t = 1.0f / (1.0f + 0.3275911f * ax);
    float8 p = 1.061405429f;
    p = p * t - 1.453152027f;
    p = p * t + 1.421413741f;
    p = p * t - 0.284496736f;
    p = p * t + 0.254829592f;
    return as_float8(as_int8(1.0f - p * t * exp8(-ax * ax)) | sign);
}
inline float erf1(float x)
{
    const float ax = fabs(x);
    const float t = 1.0f / (1.0f + 0.3275911f * ax);
    float p = 1.061405429f;
    p = p * t - 1.453152027f;
    p = p * t + 1.421413741f;
    p = p * t - 0.284496736f;
    p = p * t + 0.254829592f;
    return copysign(1.0f - p * t * exp1(-ax * ax), x);
}
#endif

#define SILU8(v) ((v) / (1.0f + exp8(-(v))))
#define SILU1(v) ((v) / (1.0f + exp1(-(v))))
/* operators, not select()/isless() (out-of-line calls in PoCL); NaN and -0.0 pass */
#define RELU8(v) ((v) < 0.0f ? (float8)(0.0f) : (v))
#define RELU1(v) ((v) < 0.0f ? 0.0f : (v))
#define GELU8(v) (0.5f * (v) * (1.0f + erf8((v) * 0.70710678118654752f)))
#define GELU1(v) (0.5f * (v) * (1.0f + erf1((v) * 0.70710678118654752f)))
/* 0.5 (1 + tanh(u)) == 1 / (1 + exp(-2u)): one exp, no tanh. */
#define GELU_TANH8(v) \
    ((v) / (1.0f + exp8(-1.5957691216057308f * ((v) + 0.044715f * (v) * (v) * (v)))))
#define GELU_TANH1(v) \
    ((v) / (1.0f + exp1(-1.5957691216057308f * ((v) + 0.044715f * (v) * (v) * (v)))))

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

/* y[r, j] = F(x[r, j]) * x[r, h + j], x row length 2h, y row length h. */
#define GATED(name, F8, F1)                                                            \
    KERNEL void KN(name)(__global const T *restrict x, __global T *restrict y,       \
                         const int h)                                          \
    {                                                                                  \
        const long row = get_global_id(1);                                             \
        __global const T *a = x + row * 2 * h;                                         \
        __global const T *g = a + h;                                                   \
        __global T *yr = y + row * h;                                                  \
        const int h8 = h >> 3;                                                         \
        FOR_GRID(int, i, h8) {                                                         \
            const float8 v = LD8(i, a);                                                \
            ST8(F8(v) * LD8(i, g), i, yr);                                             \
        }                                                                              \
        for (int t = (h8 << 3) + get_global_id(0); t < h; t += get_global_size(0)) {  \
            const float v = LD1(t, a);                                                 \
            ST1(F1(v) * LD1(t, g), t, yr);                                             \
        }                                                                              \
        NT_FENCE();                                                                    \
    }

GATED(swiglu, SILU8, SILU1)
GATED(geglu, GELU8, GELU1)
GATED(geglu_tanh, GELU_TANH8, GELU_TANH1)
