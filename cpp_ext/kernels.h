// kernels.h: the ISA-independent kernel table shared by the bindings and every variant.
//
// Each variant (scalar, avx2, avx512) fills one KernelTable with pointers to its own
// instantiations; runtime.cpp picks a table at import. Kernels are single-threaded over
// the range they are given; the bind_*.cpp files split rows (or flat chunks) across
// OpenMP threads (runtime.h).
// Array arguments are raw pointers to C-contiguous data of dtype index [DT_*].
#pragma once
#include <cstdint>

namespace to {

enum Dt : int { DT_F32 = 0, DT_F16 = 1, DT_BF16 = 2, DT_COUNT = 3 };
// UN_EXP / UN_TANH are bound as _cpp._exp / _cpp._tanh so the tests can check vexp/vtanh.
enum Unary : int { UN_SILU = 0, UN_RELU = 1, UN_GELU_ERF = 2, UN_GELU_TANH = 3, UN_EXP = 4, UN_TANH = 5, UN_COUNT = 6 };
enum Glu : int { GLU_SWIGLU = 0, GLU_GEGLU_ERF = 1, GLU_GEGLU_TANH = 2, GLU_COUNT = 3 };
// rope: at most this many sequences share a pass over the table rows (rope.cpp, bind_facade.cpp).
constexpr int64_t ROPE_MAX_HEADS = 8;

// The derivative kernels' activations (tex_train.cpp, backward.cpp): plain ones and the gate of a GLU.
enum DAct : int { DA_GELU_TANH = 0, DA_SILU = 1, DA_QGELU = 2, DA_RELU = 3, DA_SRELU = 4, DA_SIGMOID = 5, DA_COUNT = 6 };
// TE's scaled softmax: plain, uint8 mask (masked logits -> -10000), causal (columns > limit excluded)
enum SoftmaxMode : int { SM_PLAIN = 0, SM_MASK = 1, SM_CAUSAL = 2 };
// The AVX-512 fp16 softmax computes exp twice (once for the sum, again in the write pass)
// instead of storing it and reading it back: the same bits either way. Which is faster
// depends on the core (softmax.cpp softmax_row: Intel's computes, AMD's Zen 4 and Zen 5
// store), so it is chosen at import from the CPU's vendor (runtime.cpp cpu_amd) and reported by
// build_info()["softmax_exp_twice"]; _set_tuning(softmax_exp_twice=) overrides it (A/B, tests).
extern bool g_softmax_exp_twice;
// Whether AVX2's fp16 kernels of the cheaper functions (silu, tanh-GELU, exp; swiglu, the tanh
// geglu, the autograd's glu2 and every gated backward but relu's) read them from a table
// (lut16.h lut_flex) as the dear ones (exact GELU, tanh, TE's flat derivatives) always do: on a
// core with 128-bit vector pipes (Zen 1) computing them costs twice the pipe slots it costs Zen 3,
// where the table lost (0.75-1.02x). Chosen at import (runtime.cpp cpu_halves_256),
// build_info()["fp16_tables_all"], _set_tuning(f16_lut=). The same bits either way (the tables are
// the kernels' own functions).
extern bool g_f16_lut;
// rope over several heads (bind_facade.cpp rope): heads per group and bytes of cos + sin per
// block of positions; _set_tuning(rope_group=, rope_block=).
extern int64_t g_rope_group, g_rope_block;

struct SgdParams {
    float wd, momentum, dampening, lr, scale;
    bool nesterov, first_run, wd_after;
};

struct AdamParams {
    float lr, beta1, beta2, eps, bc1, bc2, weight_decay;
    int mode;  // 0: L2 (g += wd*p), 1: AdamW (decoupled)
    // derived in double by the binding, rounded once (as torch.optim's scalars are):
    // lr / bc1, sqrt(bc2), 1 - lr*weight_decay, 1 - beta1, 1 - beta2 (from the caller's double betas:
    // 1.0f - 0.999f is 1.3e-5 off 0.001, which biased v every step)
    float step_size, bc2_sqrt, decay, one_m_beta1, one_m_beta2;
};

// The fused adds' per-thread scratch, in floats: s = x + r in fp32 (n, padded to 64 bytes),
// used by fp32, then s in a 16-bit dtype (n halves), the only row a 16-bit form keeps: the
// norm widens it and res_out copies it as bits (norm.cpp AddSrc, s_row).
inline int64_t fused_add_e16_at(int64_t n) { return (n + 15) & ~(int64_t)15; }  // where the 16-bit copy starts
inline int64_t fused_add_row(int64_t n) { return fused_add_e16_at(n) + (((n + 1) / 2 + 15) & ~(int64_t)15); }
// two rows: the pipelined fused add (norm.cpp) sums row r + 1 into one while row r is written from the other
inline int64_t fused_add_scratch(int64_t n) { return 2 * fused_add_row(n); }

// The facade softmax's per-thread scratch, in floats: two rows of e (softmax.cpp softmax_k
// writes row r from one while row r + 1's exp pass fills the other), each padded to 64 bytes.
inline int64_t softmax_row_floats(int64_t n) { return (n + 15) & ~(int64_t)15; }
inline int64_t softmax_scratch(int64_t n) { return 2 * softmax_row_floats(n); }

// The norms' weight formats (KernelTable rms_norm ... add_layer_norm, `wf`; bind_facade.cpp
// NormParams picks one per call, norm.cpp with_w says why): fp32 (zero-centred gamma's +1
// already added), fp16 as the caller's (fp16 x), or for bf16 x with a bias one uint32 per
// element, the weight's bf16 bits low and the bias's high (w and b both point at it).
enum NormWeights { NW_F32 = 0, NW_F16 = 1, NW_BF16_PAIRS = 2 };

struct KernelTable {
    const char* isa;
    int width;  // fp32 lanes
    // y = x * rsigma * w; rsigma (float, per row) written when non-null. The weights (and
    // bias) in the format wf (NormWeights above), prepared once per call by the binding.
    void (*rms_norm[DT_COUNT])(const void* x, const void* w, void* y, int64_t rows, int64_t n,
                               float eps, float* rsigma, bool nt, int wf);
    // b may be null (no bias); mu/rsigma written when non-null.
    void (*layer_norm[DT_COUNT])(const void* x, const void* w, const void* b, void* y, int64_t rows,
                                 int64_t n, float eps, float* mu, float* rsigma, bool nt, int wf);
    // Fused residual add: s = x + r (rounded to x's dtype, like adding in that dtype), written
    // to res_out, and y = norm(s). res_out may be r and y may be x (exactly; row by row every
    // input row is read before its outputs are written). scratch: fused_add_scratch(n) floats
    // per thread (below).
    void (*add_rms_norm[DT_COUNT])(const void* x, const void* r, const void* w, void* y, void* res_out,
                                   int64_t rows, int64_t n, float eps, float* scratch, bool nt, int wf);
    void (*add_layer_norm[DT_COUNT])(const void* x, const void* r, const void* w, const void* b, void* y,
                                     void* res_out, int64_t rows, int64_t n, float eps, float* scratch, bool nt,
                                     int wf);
    // scratch: softmax_scratch(n) floats (per thread).
    void (*softmax[DT_COUNT])(const void* x, void* y, int64_t rows, int64_t n, float* scratch, bool nt);
    void (*unary[DT_COUNT][UN_COUNT])(const void* x, void* y, int64_t count, bool nt);
    // x (rows, 2h) -> y (rows, h)
    void (*glu[DT_COUNT][GLU_COUNT])(const void* x, void* y, int64_t rows, int64_t h, bool nt);
    // cos/sin float32 (T, n); row r of this chunk uses position (row0 + r) % T. heads (1 ..
    // ROPE_MAX_HEADS) sequences at once, hstride elements apart: each position's table row
    // serves all of them while it is in L1.
    void (*rope[DT_COUNT])(const void* x, const float* cos, const float* sin, void* y, int64_t rows,
                           int64_t n, int64_t T, int64_t row0, bool interleaved, bool nt, int64_t heads,
                           int64_t hstride);
    // dx written (streaming stores with nt); dg_acc (and db_acc) are fp32 [n] accumulators the
    // rows are added into; gp: gamma in fp32 (a 16-bit one widened by the caller), read as gp + 1 with zc.
    void (*rms_norm_bwd[DT_COUNT])(const void* dz, const void* x, const float* rsigma, const float* gp,
                                   void* dx, float* dg_acc, int64_t rows, int64_t n, bool zc, bool nt);
    void (*layer_norm_bwd[DT_COUNT])(const void* dz, const void* x, const float* mu, const float* rsigma,
                                     const float* gp, void* dx, float* dg_acc, float* db_acc,
                                     int64_t rows, int64_t n, bool zc, bool nt);
    // [grad dtype][param dtype]; m, v (and master when non-null) are fp32.
    void (*adam[DT_COUNT][DT_COUNT])(const void* g, void* p, float* m, float* v, float* master,
                                     int64_t n, const AdamParams* a);
    // [in dtype][out dtype]; out = in*s; returns 1 if any input is non-finite.
    int (*scale[DT_COUNT][DT_COUNT])(const void* in, void* out, int64_t n, float s);
    double (*sumsq[DT_COUNT])(const void* x, int64_t n);
    void (*from_f32[DT_COUNT])(const float* in, void* out, int64_t n);
    void (*to_f32[DT_COUNT])(const void* in, float* out, int64_t n);
    // tex training kernels (tex_train.cpp; tsoftmax / tsoftmax_bwd: softmax.cpp). dact: y =
    // g*act'(x) over rows x n; acc (fp32 [n], may be null) gets the column sums of y added.
    // dglu: x (rows, 2h), g (rows, h) -> y (rows, 2h) (backward.cpp: glu2_bwd's kernel on the
    // [a | b] halves).
    void (*dact[DT_COUNT][DA_COUNT])(const void* g, const void* x, void* y, int64_t rows, int64_t n, float* acc,
                                     bool nt);
    void (*dglu[DT_COUNT][DA_COUNT])(const void* g, const void* x, void* y, int64_t rows, int64_t h, bool nt);
    // rows of n (= sk) of x viewed (batches*heads*sq, sk); row0 = global index of the first row;
    // mask uint8 [mask_batches, sq, sk] (SM_MASK); causal: column limit (row % sq) + causal_off.
    // scratch: softmax_scratch(n) floats, at least n + 64 (per thread).
    void (*tsoftmax[DT_COUNT])(const void* x, void* y, int64_t rows, int64_t n, float scale, int mode,
                               const uint8_t* mask, int64_t mask_batches, int64_t heads, int64_t row0, int64_t sq,
                               int64_t causal_off, float* scratch, bool nt);
    void (*tsoftmax_bwd[DT_COUNT])(const void* dy, const void* y, void* dx, int64_t rows, int64_t n, float scale,
                                   bool nt);
    // x, y (tokens, heads, d); tokens [t0, t1); cos/sin (P, d2) fp32; pos[t] in [0, P).
    void (*trope[DT_COUNT])(const void* x, const float* cos, const float* sin, const int64_t* pos, void* y, int64_t t0,
                            int64_t t1, int64_t heads, int64_t d, int64_t d2, bool interleaved, bool transpose,
                            bool nt);
    // g, p, momentum buffer of one dtype; in place.
    void (*sgd[DT_COUNT])(const void* g, void* p, void* buf, int64_t n, const SgdParams* a);
    // column sums of x (rows, n) added to tot (fp64 [n]); blk: fp32 [n] scratch.
    void (*colsum[DT_COUNT])(const void* x, int64_t rows, int64_t n, float* blk, double* tot);
    // Autograd kernels (backward.cpp). Row-strided gated forms (strides in elements): the
    // two-operand layout of Hugging Face MLPs (gate and up projections in separate arrays)
    // and the facade's [a | b] halves (b = a + h, both strides 2h) are the same kernel.
    // glu2: y = act(a) * b; glu2_bwd: da = dy * b * act'(a), db = dy * act(a).
    void (*glu2[DT_COUNT][GLU_COUNT])(const void* a, const void* b, void* y, int64_t rows, int64_t h, int64_t sa,
                                      int64_t sb, int64_t sy, bool nt);
    void (*glu2_bwd[DT_COUNT][GLU_COUNT])(const void* dy, const void* a, const void* b, void* da, void* db,
                                          int64_t rows, int64_t h, int64_t sdy, int64_t sa, int64_t sb, int64_t sda,
                                          int64_t sdb, bool nt);
    // dx = dy * gelu'(x), exact (erf) GELU, flat.
    void (*gelu_erf_bwd[DT_COUNT])(const void* dy, const void* x, void* dx, int64_t count, bool nt);
    // dst[0, n) = src[0, n) (bytes) with non-temporal stores where the ISA has them, then a
    // store fence (common.cpp). Any alignment; the ranges must not overlap. pages > 1: in
    // blocks of that many 4 KiB pages copied a piece of each in turn.
    void (*stream_copy)(const void* src, void* dst, int64_t nbytes, int pages);
};

// One per compiled variant (defined only if that variant was built).
const KernelTable* table_scalar();
const KernelTable* table_avx2();
const KernelTable* table_avx512();
const KernelTable* table_avx512bf16();

}  // namespace to
