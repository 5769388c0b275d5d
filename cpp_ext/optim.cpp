// optim.cpp: flat-tensor kernels for the optimizer / AMP paths of tensor_ops.tex
// (adam_step, scale with non-finite detection, sum of squares); compiled per ISA variant.
#include "vmath.h"
#include "variant.h"

namespace to {
namespace TO_NS {
namespace {

// One Adam step on a flat range (see TEX_API.md multi_tensor_adam). Math in fp32; with a
// master copy the update runs on master and p receives cast(master).
template <class TG, class TP>
void adam_k(const void* gv, void* pv, float* m, float* v, float* master, int64_t n, const AdamParams* a) {
    const TG* g = (const TG*)gv;
    TP* p = (TP*)pv;
    const V b1 = vset(a->beta1), b2 = vset(a->beta2), ob1 = vset(1.0f - a->beta1), ob2 = vset(1.0f - a->beta2);
    // The update in torch.optim's order (its AdamW/Adam foreach path): decay, moments,
    // denom = sqrt(v)/sqrt(bc2) + eps, p -= (lr/bc1) * m/denom, with lr/bc1, sqrt(bc2) and
    // 1 - lr*wd from double. The same math as TE's kernel ((m/bc1)/(sqrt(v/bc2)+eps)); this
    // rounding order keeps a model trained with it within 1e-7 of torch.optim per step instead
    // of drifting (a reciprocal 1/bc1 rounded in fp32 scales every update the same way).
    const V step = vset(a->step_size), bc2s = vset(a->bc2_sqrt), eps = vset(a->eps);
    const V wd = vset(a->weight_decay), decay = vset(a->decay);
    const bool l2 = a->mode == 0;
    for (int64_t i = 0; i < n; i += W) {
        const int64_t k = n - i < W ? n - i : W;
        V P = master ? ld(master + i, k) : ld(p + i, k);
        V G = ld(g + i, k);
        if (l2) G = vfma(wd, P, G);
        else P = P * decay;
        V Mv = vfma(b1, ld(m + i, k), ob1 * G);
        V Vv = vfma(b2, ld(v + i, k), ob2 * G * G);
        V denom = vsqrt(Vv) / bc2s + eps;
        P = vfnma(step, Mv / denom, P);
        st(m + i, Mv, k);
        st(v + i, Vv, k);
        if (master) st(master + i, P, k);
        st(p + i, P, k);
    }
}

// out = in*s. Non-finite detection costs one add per vector: x*0 is 0 for finite x and
// NaN for Inf/NaN, so the running sum of x*0 is NaN iff some input was non-finite.
template <class TI, class TO>
int scale_k(const void* iv, void* ov, int64_t n, float s) {
    const TI* in = (const TI*)iv;
    TO* out = (TO*)ov;
    const V vs = vset(s), zero = vset(0.0f);
    V bad = vset(0.0f);
    for (int64_t i = 0; i < n; i += W) {
        const int64_t k = n - i < W ? n - i : W;
        V x = ld(in + i, k);
        bad = vfma(x, zero, bad);
        st(out + i, x * vs, k);
    }
    const float b = hsum(bad);
    return b != b;
}

template <class T>
double sumsq_k(const void* xv, int64_t n) { return row_sumsq((const T*)xv, n); }

template <class T>
void from_f32_k(const float* in, void* ov, int64_t n) {
    T* out = (T*)ov;
    for (int64_t i = 0; i < n; i += W) {
        const int64_t k = n - i < W ? n - i : W;
        st(out + i, ld(in + i, k), k);
    }
}

template <class T>
void to_f32_k(const void* iv, float* out, int64_t n) {
    const T* in = (const T*)iv;
    for (int64_t i = 0; i < n; i += W) {
        const int64_t k = n - i < W ? n - i : W;
        st(out + i, ld(in + i, k), k);
    }
}

template <class TG>
void fill_g(KernelTable& t, int dg) {
    t.adam[dg][DT_F32] = adam_k<TG, float>;
    t.adam[dg][DT_F16] = adam_k<TG, f16>;
    t.adam[dg][DT_BF16] = adam_k<TG, bf16>;
    t.scale[dg][DT_F32] = scale_k<TG, float>;
    t.scale[dg][DT_F16] = scale_k<TG, f16>;
    t.scale[dg][DT_BF16] = scale_k<TG, bf16>;
    t.sumsq[dg] = sumsq_k<TG>;
    t.from_f32[dg] = from_f32_k<TG>;
    t.to_f32[dg] = to_f32_k<TG>;
}

}  // namespace

void fill_optim(KernelTable& t) {
    fill_g<float>(t, DT_F32);
    fill_g<f16>(t, DT_F16);
    fill_g<bf16>(t, DT_BF16);
}

}  // namespace TO_NS
}  // namespace to
