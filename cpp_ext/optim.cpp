// optim.cpp: flat-tensor kernels for the optimizer / AMP paths of tensor_ops.tex
// (adam_step, scale with non-finite detection, sum of squares); compiled per ISA variant.
#include "vmath.h"
#include "variant.h"

namespace to {
namespace TO_NS {
namespace {

// One Adam step on a flat range (see TEX_API.md multi_tensor_adam). Math in fp32; with a
// master copy the update runs on master and p receives cast(master).
//
// Every rounding is torch.optim.AdamW/Adam(foreach=True)'s on CPU, op by op (the same math as
// TE's kernel, (m/bc1)/(sqrt(v/bc2)+eps), in torch's order), so that a model trained through
// tex stays on torch's trajectory instead of drifting (tests/test_tex_training_parity.py
// compares bit for bit):
//   p *= 1 - lr*wd                        (AdamW; Adam/L2: g = fma(wd, p, g), torch's add(alpha))
//   m = lerp(m, g, 1 - beta1)             torch's lerp: fma(w, g - m, m) for w < 0.5,
//                                         fma(w - 1, g - m, g) otherwise
//   v = v*beta2;  v = fma((1-beta2)*g, g, v) (mul_, then addcmul_: torch's kernel fuses its add)
//   d = sqrt(v) / sqrt(bc2) + eps         (foreach sqrt, div_, add_)
//   p = p + ((-lr/bc1) * m) / d           (addcdiv_: value*t1 first, then / t2)
// with 1 - beta1, 1 - beta2, lr/bc1, sqrt(bc2), 1 - lr*wd from the caller's doubles, rounded
// once, as torch's Python scalars are.
//
// One loop per combination of the flags (L2 or AdamW, torch's lerp branch, master copy;
// variant.h with_flag), the parameters in locals.
template <class TG, class TP, bool L2, bool SMALL, bool MASTER>
void adam_loop(const TG* g, TP* p, float* m, float* v, float* master, int64_t n, const AdamParams q) {
    const V b2 = vset(q.beta2), ob2 = vset(q.one_m_beta2);
    const V lw = vset(SMALL ? q.one_m_beta1 : q.one_m_beta1 - 1.0f);
    const V nstep = vset(-q.step_size), bc2s = vset(q.bc2_sqrt), eps = vset(q.eps);
    const V wd = vset(q.weight_decay), decay = vset(q.decay);
    for_vectors(n, [&](int64_t i, int64_t k) {
        V P = MASTER ? ld(master + i, k) : ld(p + i, k);
        V G = ld(g + i, k);
        // vopaque: torch rounds p * (1 - lr*wd) before the update is added; with the flag a constant,
        // GCC contracted the two into one FMA (test_tex_train_parity.py caught the ulp)
        if constexpr (L2) G = vfma_once(wd, P, G);
        else P = vopaque(P * decay);
        const V M0 = ld(m + i, k);
        const V Mv = vfma_once(lw, G - M0, SMALL ? M0 : G);
        const V Vv = vfma_once(ob2 * G, G, ld(v + i, k) * b2);
        const V denom = vsqrt(Vv) / bc2s + eps;
        P = P + (nstep * Mv) / denom;
        st(m + i, Mv, k);
        st(v + i, Vv, k);
        if constexpr (MASTER) st(master + i, P, k);
        st(p + i, P, k);
    });
}

template <class TG, class TP>
void adam_k(const void* gv, void* pv, float* m, float* v, float* master, int64_t n, const AdamParams* a) {
    const AdamParams q = *a;
    with_flag(q.mode == 0, [&](auto l2) {
        with_flag(q.one_m_beta1 < 0.5f, [&](auto small) {
            with_flag(master != nullptr, [&](auto with_master) {
                adam_loop<TG, TP, l2(), small(), with_master()>((const TG*)gv, (TP*)pv, m, v, master, n, q);
            });
        });
    });
}

// out = in*s. Non-finite detection costs one add per vector: x*0 is 0 for finite x and
// NaN for Inf/NaN, so the running sum of x*0 is NaN iff some input was non-finite.
template <class TI, class TO>
int scale_k(const void* iv, void* ov, int64_t n, float s) {
    const TI* in = (const TI*)iv;
    TO* out = (TO*)ov;
    const V vs = vset(s), zero = vset(0.0f);
    V bad = vset(0.0f);
    for_vectors(n, [&](int64_t i, int64_t k) {
        const V x = ld(in + i, k);
        bad = vfma(x, zero, bad);
        st(out + i, x * vs, k);
    });
    const float b = hsum(bad);
    return b != b;
}

template <class T>
double sumsq_k(const void* xv, int64_t n) { return row_sumsq((const T*)xv, n); }

template <class T>
void from_f32_k(const float* in, void* ov, int64_t n) {
    T* out = (T*)ov;
    for_vectors(n, [&](int64_t i, int64_t k) { st(out + i, ld(in + i, k), k); });
}

template <class T>
void to_f32_k(const void* iv, float* out, int64_t n) {
    const T* in = (const T*)iv;
    for_vectors(n, [&](int64_t i, int64_t k) { st(out + i, ld(in + i, k), k); });
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
