/* Elementwise activations and gated (GLU) activations.
 *
 * Grid: (column groups * LWS, rows). Each work-item walks its row in float4 steps of the
 * global x size, then the first n % 4 work-items of the row do the scalar tail.
 * Plain activations are launched on the flat array as one row; swiglu/geglu use rows of
 * x (rows, 2h) -> y (rows, h). F4/F1 are the float4/float forms of each function. */

#ifndef ACTIVATIONS_HELPERS
#define ACTIVATIONS_HELPERS
/* erf by Abramowitz & Stegun 7.1.26 (|error| <= 1.5e-7, ~5e-7 in fp32 arithmetic): one exp
 * instead of PoCL's erf, which is ~5x slower on float4. gelu's error is then
 * <= 0.5 |x| 5e-7, inside the fp32 tolerance (rtol 1.3e-6, atol 1e-5). */
inline float4 erf4(float4 x)
{
    const float4 ax = fabs(x);
    const float4 t = 1.0f / (1.0f + 0.3275911f * ax);
    float4 p = 1.061405429f;
    p = p * t - 1.453152027f;
    p = p * t + 1.421413741f;
    p = p * t - 0.284496736f;
    p = p * t + 0.254829592f;
    return copysign(1.0f - p * t * exp(-ax * ax), x);
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
    return copysign(1.0f - p * t * exp(-ax * ax), x);
}
#endif

#define SILU(v) ((v) / (1.0f + exp(-(v))))
#define RELU4(v) select((v), (float4)(0.0f), isless((v), (float4)(0.0f)))
#define RELU1(v) (isless((v), 0.0f) ? 0.0f : (v))
#define GELU4(v) (0.5f * (v) * (1.0f + erf4((v) * 0.70710678118654752f)))
#define GELU1(v) (0.5f * (v) * (1.0f + erf1((v) * 0.70710678118654752f)))
/* 0.5 (1 + tanh(u)) == 1 / (1 + exp(-2u)): one exp, no tanh. */
#define GELU_TANH(v) \
    ((v) / (1.0f + exp(-1.5957691216057308f * ((v) + 0.044715f * (v) * (v) * (v)))))

#define ELTWISE(name, F4, F1)                                                         \
    KERNEL void KN(name)(__global const T *x, __global T *y, const long n)             \
    {                                                                                  \
        const long n4 = n >> 2;                                                        \
        FOR_GRID(long, i, n4) {             \
            const float4 v = LD4(i, x);                                                \
            ST4(F4(v), i, y);                                                          \
        }                                                                              \
        const long t = (n4 << 2) + get_global_id(0);                                   \
        if (t < n) {                                                                   \
            const float v = LD1(t, x);                                                 \
            ST1(F1(v), t, y);                                                          \
        }                                                                              \
    }

ELTWISE(silu, SILU, SILU)
ELTWISE(relu, RELU4, RELU1)
ELTWISE(gelu, GELU4, GELU1)
ELTWISE(gelu_tanh, GELU_TANH, GELU_TANH)

/* y[r, j] = F(x[r, j]) * x[r, h + j], x row length 2h, y row length h. */
#define GATED(name, F4, F1)                                                               \
    KERNEL void KN(name)(__global const T *x, __global T *y, const int h)              \
    {                                                                                  \
        const long row = get_global_id(1);                                             \
        __global const T *a = x + row * 2 * h;                                         \
        __global const T *g = a + h;                                                   \
        __global T *yr = y + row * h;                                                  \
        const int h4 = h >> 2;                                                         \
        FOR_GRID(int, i, h4) {              \
            const float4 v = LD4(i, a);                                                \
            ST4(F4(v) * LD4(i, g), i, yr);                                              \
        }                                                                              \
        const int t = (h4 << 2) + get_global_id(0);                                    \
        if (t < h) {                                                                   \
            const float v = LD1(t, a);                                                 \
            ST1(F1(v) * LD1(t, g), t, yr);                                              \
        }                                                                              \
    }

GATED(swiglu, SILU, SILU)
GATED(geglu, GELU4, GELU1)
GATED(geglu_tanh, GELU_TANH, GELU_TANH)
