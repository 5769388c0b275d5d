// softmax_rows.h: softmax rows pipelined - row r + 1's exp pass inside row r's write
// (included by softmax.cpp after softmax_row, whose SHIFT_LANES / SHIFT_MAX rule it follows).
#pragma once

namespace to {
namespace TO_NS {
namespace {

// The logits of a row of x, as softmax_row's z(i) / zp(i, k) give them: full(x, i) lanes [i,
// i + W), part(x, i, k) k of them (the rest anything). SCALED: TE's z = x * scale, a rounded
// product (vopaque; see vexp_shift). tsoftmax_k's unpipelined rows read them too.
template <bool SCALED>
struct Logits {
    V vs = vset(1.0f);
    Logits() = default;
    explicit Logits(float scale) : vs(vset(scale)) {}
    template <class T>
    inline V full(const T* x, int64_t i) const { return f(vload_permw(x + i)); }  // simd.h vload_permw
    template <class T>
    inline V part(const T* x, int64_t i, int64_t k) const { return f(vload_part(x + i, k, 0.f)); }
    inline V f(V v) const {
        if constexpr (SCALED) return vopaque(v * vs);
        return v;
    }
};

// TE's masked logits (SM_MASK): x * scale, -10000 where the row's mask byte is set.
struct MaskedLogits {
    V vs = vset(1.0f);
    const uint8_t* mr = nullptr;
    template <class T>
    inline V full(const T* x, int64_t i) const {
        return vsel(vmask_u8(mr + i), vset(-10000.0f), vopaque(vload_permw(x + i) * vs));
    }
    template <class T>
    inline V part(const T* x, int64_t i, int64_t k) const {
        const V v = vopaque(vload_part(x + i, k, 0.f) * vs);
        alignas(64) float mk[W];
        for (int64_t j = 0; j < W; ++j) mk[j] = (j < k && mr[i + j] == 1) ? 1.0f : 0.0f;
        return vsel(vlt(vset(0.5f), vload(mk)), vset(-10000.0f), v);
    }
};

// Whether every byte of a mask row is 1 (every logit masked: a row of zeros, its exp pass
// skipped), eight bytes a step; most rows answer at their first step.
inline bool all_masked(const uint8_t* m, int64_t n) {
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        uint64_t w;
        std::memcpy(&w, m + j, 8);
        if (w != 0x0101010101010101ull) return false;
    }
    for (; j < n; ++j)
        if (m[j] != 1) return false;
    return true;
}

// The shift c of a row (softmax_row's: the max of its first SHIFT_LANES logits, in its order).
template <class T, class Z>
inline float head_max(const T* x, int64_t n, const Z& z) {
    const int64_t end = n < SHIFT_LANES ? n : SHIFT_LANES;
    const float ninf = -__builtin_inff();
    V m0 = vset(ninf), m1 = vset(ninf);
    int64_t i = 0;
    for (; i + 2 * W <= end; i += 2 * W) {
        m0 = vmax(m0, z.full(x, i));
        m1 = vmax(m1, z.full(x, i + W));
    }
    for (; i + W <= end; i += W) m0 = vmax(m0, z.full(x, i));
    if (i < end) m0 = vmax(m0, lanes_below(z.part(x, i, end - i), end - i, -__builtin_inff()));
    return hmax(vmax(m0, m1));
}

// A row's exp pass (softmax_row's exp_pass over a row in memory, its max tracked), taken a
// step at a time so that the previous row's write can carry it (rowio.h StepWith), as the
// norms carry the next row's statistics: e = e^(x - c) into the scratch row, its sum in the
// same blocks and order, so the row's output is bitwise what softmax_row gives it.
template <bool LP, class Z, class T>
struct ExpSteps {
    const T* x = nullptr;
    float* e = nullptr;
    int64_t n = 0, i = 0, end = 0;
    bool open = false;
    Z z{};
    V vc = vset(0.0f), m0 = vset(-__builtin_inff()), m1 = vset(-__builtin_inff()), s0 = vset(0.0f), s1 = vset(0.0f);
    double sum = 0.0;
    ExpSteps() = default;
    ExpSteps(const T* x_, float* e_, int64_t n_, float c, Z z_)
        : x(x_), e(e_), n(n_), end(n_ > 1024 ? 1024 : n_), open(n_ > 0), z(z_), vc(vset(c)) {}
    inline void pair() {
        const V z0 = z.full(x, i), z1 = z.full(x, i + W);
        m0 = vmax(m0, z0);
        m1 = vmax(m1, z1);
        const V v0 = vexp_shift<LP>(z0, vc), v1 = vexp_shift<LP>(z1, vc);
        vstore(e + i, v0);
        vstore(e + i + W, v1);
        s0 = s0 + v0;
        s1 = s1 + v1;
        i += 2 * W;
    }
    void close() {  // the block's last vectors, its sum into the double total
        for (; i < end; i += W) {
            const int64_t k = end - i < W ? end - i : W;
            const V zz = k == W ? z.full(x, i) : z.part(x, i, k);
            m0 = vmax(m0, k == W ? zz : lanes_below(zz, k, -__builtin_inff()));
            V v = vexp_shift<LP>(zz, vc);
            st(e + i, v, k);
            if (k < W) v = vload_part(e + i, k, 0.0f);  // padded lanes must not count
            s0 = s0 + v;
        }
        sum += (double)hsum(s0 + s1);
        s0 = s1 = vset(0.0f);
        open = i < n;
        end = (n - i > 1024) ? i + 1024 : n;
    }
    inline void operator()() {
        if (i + 2 * W <= end) pair();
        else if (open) close();
    }
    inline void finish() {
        while (open) {
            while (i + 2 * W <= end) pair();
            close();
        }
    }
    inline float max() const { return hmax(vmax(m0, m1)); }
};

// Rows pipelined (as the norms', norm.cpp): row r's write pass from the scratch row also runs
// row r + 1's exp pass from memory into the other scratch row (ExpSteps), while row r + 2 is
// prefetched, so reads and streaming writes overlap; a row whose max is more than SHIFT_MAX
// above its shift runs its exp pass again with c = its max before its write, as softmax_row
// does. ab_builds.py --copies 2 --rounds 9 --out-offset 0 against softmax_row's loop, 8192 x
// 4096, Zen 4: fp32 softmax 1.10-1.20x (eight runs), TE's plain scaled softmax 1.10-1.21x,
// the unchanged bf16 rows beside them 0.97-1.09x (one run 1.16-1.27x): ~5-12 % net; TE's
// masked form 1.08 / 1.14x against the build that pipelined only the other two; TE's causal
// rows (len < n, zeros after) 1.27 / 1.23x against the build that pipelined only full rows
// (2026-12-06, the plain and facade rows beside them 0.97-1.00x). Only
// AVX-512 fp32 rows on 64-byte lines (softmax_lines): with np.empty's placement (16 past a
// line) the same loop ran fp32 0.81-0.95x, fp16 / bf16 0.58-0.72x off a line and 0.89-0.95x on
// one, the AVX2 variant's fp32 0.94-0.99x (CONTRIBUTING "Softmax rows pipelined").
// zrow(r) gives row r's logits (Logits, MaskedLogits) and its length len in [0, n]: the
// softmax of its first len logits, zeros after (TE's causal rows: len = its limit + 1); len 0
// is an empty row (every element masked, or a causal limit below 0: zeros). Only the len
// logits of a row are read and prefetched. MaskedLogits rows: TE's rule of mask_scale too.
// scratch: softmax_scratch(n) floats.
template <class T, class ZRow>
void softmax_rows_pipelined(const T* x, T* y, int64_t rows, int64_t n, const ZRow& zrow, float* scratch, bool nt) {
    constexpr bool LP = sizeof(T) == 2;
    using Z = decltype(zrow(0).first);
    using Steps = ExpSteps<LP, Z, T>;
    float* ea = scratch;                          // row r's e
    float* eb = scratch + softmax_row_floats(n);  // row r + 1's, during row r's write
    using Row = std::pair<Z, int64_t>;
    const auto row_at = [&](int64_t r) { return r < rows ? Row(zrow(r)) : Row(Z{}, 0); };  // once per row
    int64_t len = 0;
    float c = 0.0f;
    Steps cur;
    if (rows > 0) {
        const auto [z0, l0] = zrow(0);
        len = l0;
        if (len > 0) {
            c = head_max(x, len, z0);
            cur = Steps(x, ea, len, c, z0);
            cur.finish();
        }
    }
    Row row1 = row_at(1);
    for (int64_t r = 0; r < rows; ++r) {
        const T* xr = x + r * n;
        if (len > 0 && !(cur.max() - c <= SHIFT_MAX)) {  // far above the shift, Inf or NaN: shift by the row's max
            c = cur.max();
            cur = Steps(xr, ea, len, c, cur.z);
            cur.finish();
        }
        const V inv = vset(len == 0 ? 0.0f : (float)(mask_scale(std::is_same_v<Z, MaskedLogits>, cur.max()) / cur.sum));
        const int64_t len1 = row1.second;
        float c1 = 0.0f;
        Steps next;
        if (len1 > 0) {
            c1 = head_max(xr + n, len1, row1.first);
            next = Steps(xr + n, eb, len1, c1, row1.first);
        }
        const Row row2 = row_at(r + 2);  // its len logits prefetched during this write
        const Prefetch pf = row2.second > 0 ? Prefetch(xr + 2 * n, row2.second * (int64_t)sizeof(T), n / (2 * W)) : Prefetch();
        const float* er = ea;
        T* yr = y + r * n;
        const StepWith<Steps> sw{pf, next};
        if (len == 0)
            cur = write_row(yr, n, nt, [&](int64_t) { return vset(0.0f); }, [&](int64_t, int64_t) { return vset(0.0f); }, sw).s;
        else if (len == n)
            cur = write_row(
                      yr, n, nt, [&](int64_t j) { return vload(er + j) * inv; },
                      [&](int64_t j, int64_t k) { return vload_part(er + j, k, 0.f) * inv; }, sw)
                      .s;
        else
            cur = write_causal(yr, n, len, er, inv, nt, sw).s;
        c = c1;
        len = len1;
        row1 = row2;
        std::swap(ea, eb);
    }
}

// Whether rows of x and y take softmax_rows_pipelined (its comment).
template <class T>
inline bool softmax_lines(const void* x, const void* y, int64_t n) {
    return TO_ISA == 2 && std::is_same_v<T, float> && (uintptr_t)x % 64 == 0 && (uintptr_t)y % 64 == 0 &&
           n * (int64_t)sizeof(T) % 64 == 0;
}

}  // namespace
}  // namespace TO_NS
}  // namespace to
