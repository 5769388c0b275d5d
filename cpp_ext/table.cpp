// table.cpp: assembles this variant's KernelTable (compiled once per ISA variant).
#include "variant.h"

namespace to {
namespace TO_NS {
namespace {
KernelTable make() {
    KernelTable t = {};
#if TO_ISA == 0
    t.isa = "scalar";
#elif TO_ISA == 1
    t.isa = "avx2";
#elif defined(TO_AVX512_BF16)
    t.isa = "avx512bf16";
#else
    t.isa = "avx512";
#endif
    t.width = W;
    fill_norm(t);
    fill_softmax(t);
    fill_activation(t);
    fill_rope(t);
    fill_optim(t);
    fill_common(t);
    fill_tex_train(t);
    fill_backward(t);
    return t;
}
}  // namespace
}  // namespace TO_NS

const KernelTable* TO_TABLE_FN() {
    static const KernelTable t = TO_NS::make();
    return &t;
}

}  // namespace to
