// softmax_rows.h: softmax rows pipelined - row r + 1's exp pass inside row r's write
// (included by softmax.cpp after softmax_row, whose SHIFT_LANES / SHIFT_MAX rule it follows).
#pragma once

namespace to {
namespace TO_NS {
namespace {

// The shift c of a row (softmax_row's: the max of its first SHIFT_LANES logits, in its order).
// Lanes [0, k) of v, the rest -Inf (for a max; softmax_row's vmax_part).
inline V with_ninf_past(V v, int64_t k) {
    alignas(64) float t[W];
    vstore(t, v);
    return vload_part(t, k, -__builtin_inff());
}

template <class T, class Z>
inline float head_max(const T* x, int64_t n, const Z& z) {
    const int64_t end = n < SHIFT_LANES ? n : SHIFT_LANES;
    const float ninf = -__builtin_inff();
    V m0 = vset(ninf), m1 = vset(ninf);
    int64_t i = 0;
    for (; i + 2 * W <= end; i += 2 * W) {
        m0 = vmax(m0, z(vload(x + i)));
        m1 = vmax(m1, z(vload(x + i + W)));
    }
    for (; i + W <= end; i += W) m0 = vmax(m0, z(vload(x + i)));
    if (i < end) m0 = vmax(m0, with_ninf_past(z(vload_part(x + i, end - i, 0.f)), end - i));
    return hmax(vmax(m0, m1));
}

// A row's exp pass (softmax_row's exp_pass over a row in memory, its max tracked), taken a
// step at a time so that the previous row's write can carry it (rowio.h StepWith), as the
// norms carry the next row's statistics: e = e^(x - c) into the scratch row, its sum in the
// same blocks and order, so the row's output is bitwise what softmax_row gives it.
// SCALED: TE's logits z = x * scale (tsoftmax_k's, through vopaque as there).
template <bool SCALED>
struct Logits {
    V vs;
    explicit Logits(float scale) : vs(vset(scale)) {}
    inline V operator()(V x) const {
        if constexpr (SCALED) return vopaque(x * vs);
        return x;
    }
};

template <bool LP, bool SCALED, class T>
struct ExpSteps {
    const T* x = nullptr;
    float* e = nullptr;
    int64_t n = 0, i = 0, end = 0;
    bool open = false;
    Logits<SCALED> z{1.0f};
    V vc = vset(0.0f), m0 = vset(-__builtin_inff()), m1 = vset(-__builtin_inff()), s0 = vset(0.0f), s1 = vset(0.0f);
    double sum = 0.0;
    ExpSteps() = default;
    ExpSteps(const T* x_, float* e_, int64_t n_, float c, Logits<SCALED> z_)
        : x(x_), e(e_), n(n_), end(n_ > 1024 ? 1024 : n_), open(n_ > 0), z(z_), vc(vset(c)) {}
    inline void pair() {
        const V z0 = z(vload(x + i)), z1 = z(vload(x + i + W));
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
            const V zz = z(k == W ? vload(x + i) : vload_part(x + i, k, 0.f));
            m0 = vmax(m0, k == W ? zz : with_ninf_past(zz, k));
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

// Steps of the next row's exp pass taken before the write of y[0, n) begins, so that its loads
// run at or just past, modulo 4 KiB, the write's stores: a load is matched against older
// stores by its low 12 address bits, and one that overlapped a pending streaming store of the
// row being written waited for it (4 KiB aliasing). x and y at np.empty's offset (16 past a
// line) put the loads a streaming head's length behind the stores: fp32 0.81x, 16-bit 0.58x
// the unpipelined form before this lead (ab_builds.py --copies 2 --rounds 9, Zen 4).
template <class S, class T>
inline void lead_writes(S& s, const T* y, int64_t n, bool nt) {
    int64_t head = 0;
    if (nt && W > 1) {  // where write_row's streamed body starts
        const uintptr_t A = (uintptr_t)W * sizeof(T), mis = (uintptr_t)y % A;
        head = mis ? (int64_t)((A - mis) / sizeof(T)) : 0;
        if (head > n) head = n;
    }
    const uintptr_t delta = ((uintptr_t)(y + head) - (uintptr_t)(s.x)) % 4096;
    const int64_t k0 = (int64_t)((delta + sizeof(T) - 1) / sizeof(T));
    while (s.open && s.i < k0) s();
}

// Rows pipelined (as the norms', norm.cpp): row r's write pass from the scratch row also runs
// row r + 1's exp pass from memory into the other scratch row (ExpSteps), while row r + 2 is
// prefetched, so reads and streaming writes overlap; a row whose max is more than SHIFT_MAX
// above its shift runs its exp pass again with c = its max before its write, as softmax_row
// does. ab_builds.py --copies 2 --rounds 9 --out-offset 0 against softmax_row's loop, 8192 x
// 4096, Zen 4: fp32 softmax 1.10-1.20x (eight runs), TE's plain scaled softmax 1.10-1.21x,
// the unchanged bf16 rows beside them 0.97-1.09x (one run 1.16-1.27x): ~5-12 % net. Only AVX-512 fp32 rows on 64-byte lines (softmax_lines): with
// np.empty's placement (16 past a line) the same loop ran fp32 0.81-0.95x, fp16 / bf16
// 0.58-0.72x off a line and 0.89-0.95x on one, the AVX2 variant's fp32 0.94-0.99x (CONTRIBUTING
// "Softmax rows pipelined"). x's rows, scale as tsoftmax_k's when SCALED; scratch:
// softmax_scratch(n) floats.
template <bool SCALED, class T>
void softmax_rows_pipelined(const T* x, T* y, int64_t rows, int64_t n, float scale, float* scratch, bool nt) {
    constexpr bool LP = sizeof(T) == 2;
    using Steps = ExpSteps<LP, SCALED, T>;
    const Logits<SCALED> z(scale);
    float* ea = scratch;                          // row r's e
    float* eb = scratch + softmax_row_floats(n);  // row r + 1's, during row r's write
    float c = rows > 0 ? head_max(x, n, z) : 0.0f;
    Steps cur = rows > 0 ? Steps(x, ea, n, c, z) : Steps();
    cur.finish();
    for (int64_t r = 0; r < rows; ++r) {
        const T* xr = x + r * n;
        if (!(cur.max() - c <= SHIFT_MAX)) {  // far above the shift, Inf or NaN: shift by the row's max
            c = cur.max();
            cur = Steps(xr, ea, n, c, z);
            cur.finish();
        }
        const V inv = vset((float)(1.0 / cur.sum));
        const bool more = r + 1 < rows;
        const float c1 = more ? head_max(xr + n, n, z) : 0.0f;
        const float* er = ea;
        T* yr = y + r * n;
        Steps next = more ? Steps(xr + n, eb, n, c1, z) : Steps();
        lead_writes(next, yr, n, nt);
        cur = write_row(
                  yr, n, nt, [&](int64_t j) { return vload(er + j) * inv; },
                  [&](int64_t j, int64_t k) { return vload_part(er + j, k, 0.f) * inv; },
                  StepWith<Steps>{next_row(xr + n, n, r + 2 < rows, n), next})
                  .s;
        c = c1;
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
