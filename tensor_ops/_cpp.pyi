# Type stub of the pybind11 module tensor_ops._cpp (source: cpp_ext/; binding.h says which
# file binds what; a test checks that every public name of the module is declared here).
#
# Checked against the built module with (from the repository root, after build_ext --inplace):
#
#   python -m mypy.stubtest tensor_ops._cpp --mypy-config-file cpp_ext/stubtest_mypy.ini
#
# (the config only silences mypy errors in the package's pure-Python modules, which stubtest
# type-checks too; without it stubtest stops at those). What it checks: every runtime name is
# in the stub and vice versa, ISA's type, and the _fast_* signatures (they carry a
# __text_signature__). pybind11 functions expose no signature to inspect, so stubtest cannot
# compare their parameters: tests/test_cpp.py::test_stub_signatures_match_the_bindings
# compares them with the signature line pybind11 writes into each __doc__. No allowlist is
# needed (stubtest reports nothing it cannot express).
#
# Notes for callers (the facade backend tensor_ops/backends/cpp.py and the tex adapters):
#
# * Arrays are numpy.ndarray, C-contiguous, aligned to their itemsize. Accepted storage:
#   float32, float16 and bfloat16. bfloat16 arrives as raw bits in an int16 or uint16
#   array (e.g. numpy view of `torch_tensor.view(torch.int16)`), together with
#   dtype="bfloat16": in a call with dtype="bfloat16" every int16/uint16 array is read and
#   written as bfloat16. (An ml_dtypes "bfloat16" numpy dtype is recognised by itself.)
#   Math is fp32 for every storage type; 16-bit results are rounded to nearest-even once.
# * Anything else is refused: TypeError (not an ndarray, wrong dtype) or ValueError
#   (non-contiguous, misaligned, read-only output, wrong shape). float64 is refused on
#   purpose: the numpy backend serves it.
# * The feature axis is the last one; x may have any number of leading axes (rows =
#   size // n). Outputs: `out=None` allocates; a given `out` is written in place (no copy)
#   and returned. Empty inputs return at once. Fresh outputs of >= 1 MiB come from a
#   bounded cache of 2 MiB-aligned blocks (their .base is a capsule that gives the block
#   back when NumPy frees the array): see cache_info() / empty_cache().
# * Norm statistics (mu, rsigma) are always float32 with one value per row;
#   rsigma = 1/sqrt(var + eps) (layer_norm) or 1/sqrt(mean(x^2) + eps) (rms_norm).
#   zero_centered_gamma=True uses (1 + weight) instead of weight (TE's flag).
# * weight/bias/gamma have the dtype of x. The GIL is released inside every kernel;
#   calls above 128 KiB of traffic run on set_num_threads() OpenMP threads.
# * Kernel variants: "scalar" (portable), "avx2" (AVX2+FMA+F16C), "avx512"
#   (F/BW/DQ/VL), "avx512bf16" (avx512 + AVX512_BF16: bfloat16 stores by vcvtneps2bf16,
#   which flushes denormal bfloat16 results to zero), chosen at import by CPUID;
#   TENSOR_OPS_MAX_ISA=scalar|avx2|avx512|avx512bf16 caps
#   the choice (an unknown value makes the import fail with ValueError).
# * Accuracy (fp32 math, tests/test_cpp.py): exp <= 4 ulp over the fp32 range (including
#   denormal results), erf-GELU <= 10 eps absolute, tanh-GELU via x/(1+e^(-2u)).
from __future__ import annotations

from typing import Literal, Optional, Union

import numpy as np

_Arr = np.ndarray
_BF16 = Optional[Literal["bfloat16"]]

ISA: str  # the selected variant: "scalar", "avx2", "avx512" or "avx512bf16"

# ---- facade ops (signatures = the backend contract in CONTRIBUTING.md) ----------------
def rms_norm(x: _Arr, weight: _Arr, eps: float, out: Optional[_Arr] = None, *,
             rsigma: Optional[_Arr] = None, zero_centered_gamma: bool = False,
             dtype: _BF16 = None) -> _Arr:
    """y = x * rsigma * weight, rsigma = 1/sqrt(mean(x^2, -1) + eps); rsigma (float32,
    one per row) is also written into `rsigma` when given."""
def layer_norm(x: _Arr, weight: _Arr, bias: Optional[_Arr], eps: float, out: Optional[_Arr] = None, *,
               mu: Optional[_Arr] = None, rsigma: Optional[_Arr] = None,
               zero_centered_gamma: bool = False, dtype: _BF16 = None) -> _Arr:
    """y = (x - mu) * rsigma * weight + bias (biased variance); mu/rsigma float32 per row."""
def add_rms_norm(x: _Arr, residual: _Arr, weight: _Arr, eps: float, out: Optional[_Arr] = None,
                 residual_out: Optional[_Arr] = None, *, dtype: _BF16 = None) -> tuple[_Arr, _Arr]:
    """(rms_norm(s, weight, eps), s) with s = x + residual rounded to x's dtype, in one pass.
    out may be x and residual_out may be residual (the same arrays: vLLM's in-place form);
    any other overlap is a ValueError."""
def add_layer_norm(x: _Arr, residual: _Arr, weight: _Arr, bias: Optional[_Arr], eps: float,
                   out: Optional[_Arr] = None, residual_out: Optional[_Arr] = None, *,
                   dtype: _BF16 = None) -> tuple[_Arr, _Arr]:
    """(layer_norm(s, weight, bias, eps), s) with s = x + residual, like add_rms_norm."""
def softmax(x: _Arr, out: Optional[_Arr] = None, *, dtype: _BF16 = None) -> _Arr: ...
def silu(x: _Arr, out: Optional[_Arr] = None, *, dtype: _BF16 = None) -> _Arr: ...
def relu(x: _Arr, out: Optional[_Arr] = None, *, dtype: _BF16 = None) -> _Arr: ...
def gelu(x: _Arr, approximate: Literal["none", "tanh"] = "none", out: Optional[_Arr] = None, *,
         dtype: _BF16 = None) -> _Arr: ...
def swiglu(x: _Arr, out: Optional[_Arr] = None, *, dtype: _BF16 = None) -> _Arr:
    """x (..., 2h) -> (..., h): silu(x[..., :h]) * x[..., h:]."""
def geglu(x: _Arr, approximate: Literal["none", "tanh"] = "none", out: Optional[_Arr] = None, *,
          dtype: _BF16 = None) -> _Arr:
    """x (..., 2h) -> (..., h): gelu(x[..., :h]) * x[..., h:]."""
def rope(x: _Arr, cos: _Arr, sin: _Arr, interleaved: bool = False, out: Optional[_Arr] = None, *,
         dtype: _BF16 = None) -> _Arr:
    """cos/sin: float32 (T, n); row r uses position r % T (see CONTRIBUTING.md for the
    interleaved and half-split formulas). n must be even."""

# ---- tex (TransformerEngine) kernels ---------------------------------------------------
def rms_norm_bwd(dz: _Arr, x: _Arr, rsigma: _Arr, gamma: _Arr, dx: Optional[_Arr] = None,
                 dgamma: Optional[_Arr] = None, zero_centered_gamma: bool = False, *,
                 dtype: _BF16 = None) -> tuple[_Arr, _Arr]:
    """Returns (dx, dgamma). dx like x, dgamma like gamma; rsigma from the forward.
    dgamma is accumulated in fp32 per thread over rows, then reduced and cast once."""
def layer_norm_bwd(dz: _Arr, x: _Arr, mu: _Arr, rsigma: _Arr, gamma: _Arr, dx: Optional[_Arr] = None,
                   dgamma: Optional[_Arr] = None, dbeta: Optional[_Arr] = None,
                   zero_centered_gamma: bool = False, *, dtype: _BF16 = None) -> tuple[_Arr, _Arr, _Arr]:
    """Returns (dx, dgamma, dbeta), fp32 accumulation of dgamma/dbeta across rows."""
# ---- autograd kernels (bind_autograd.cpp, backward.cpp; used by tensor_ops.torch) -------
_Act = Literal["silu", "gelu", "gelu_tanh"]

def glu2(a: _Arr, b: _Arr, out: Optional[_Arr] = None, *, act: _Act = "silu", dtype: _BF16 = None) -> _Arr:
    """out = act(a) * b (a, b, out of one shape; act 'gelu' is the exact erf form)."""
def glu2_bwd(dy: _Arr, a: _Arr, b: _Arr, da: Optional[_Arr] = None, db: Optional[_Arr] = None, *,
             act: _Act = "silu", dtype: _BF16 = None) -> tuple[_Arr, _Arr]:
    """(da, db) = (dy * b * act'(a), dy * act(a))."""
def glu_bwd(dy: _Arr, x: _Arr, dx: Optional[_Arr] = None, *, act: _Act = "silu", dtype: _BF16 = None) -> _Arr:
    """dx of act(x[..., :h]) * x[..., h:] (dy has x's shape with the last axis halved)."""
def gelu_erf_bwd(dy: _Arr, x: _Arr, out: Optional[_Arr] = None, *, dtype: _BF16 = None) -> _Arr:
    """out = dy * gelu'(x), exact (erf) GELU."""

def adam_step(g: _Arr, p: _Arr, m: _Arr, v: _Arr, lr: float, beta1: float, beta2: float, eps: float,
              bc1: float, bc2: float, mode: int, weight_decay: float, master: Optional[_Arr] = None, *,
              dtype: _BF16 = None) -> None:
    """One Adam step in place over flat tensors of equal size (TEX_API.md multi_tensor_adam).
    g: float32/float16/bfloat16; m, v: float32; p: any of the three. With `master` (float32)
    the math runs on master and p = cast(master); without it on p itself (16-bit p rounded on
    store, as upstream's kernel does for a bf16 model without master weights).
    bc1 = 1 - beta1**step and bc2 = 1 - beta2**step (or 1 without bias correction).
    mode 0 (L2): g += wd*p before the moments; mode 1 (AdamW): p -= lr*(update + wd*p)."""
def scale(inp: _Arr, out: _Arr, scale: float, *, dtype: _BF16 = None) -> bool:
    """out = inp * scale (any of the three storage types each; inp is out allowed when the
    dtypes match). Returns True when some input element is Inf or NaN (out still written)."""
def l2norm_sq(x: _Arr, *, dtype: _BF16 = None) -> float:
    """sum(x**2) over all elements: fp32 lanes per 1024-element block, blocks summed in
    double. Inf/NaN inputs give Inf/NaN."""

# ---- tex training kernels (bind_tex_train.cpp); outputs given and written in place ----------
#: activation codes of dact/dglu: gelu (tanh form), silu, qgelu, relu, srelu, sigmoid
DACT_CODES: dict[str, int]
def dact(grad: _Arr, x: _Arr, out: _Arr, kind: int, dbias: Optional[_Arr] = None, *, dtype: _BF16 = None) -> None:
    """out = grad * act'(x) (kind from DACT_CODES; grad, x, out of one shape and dtype). dbias
    (float32 [n], n = x's last dim) receives the column sums of out as stored (TE's dbias_d*)."""
def dglu(grad: _Arr, x: _Arr, out: _Arr, kind: int, *, dtype: _BF16 = None) -> None:
    """Gated backward: x (rows, 2h) = [a | b], grad (rows, h), out (rows, 2h) =
    [grad*b*act'(a) | grad*act(a)] (kind: the gate's activation, DACT_CODES)."""
def tex_softmax(x: _Arr, out: _Arr, scale: float, mode: int = 0, mask: Optional[_Arr] = None, heads: int = 1,
                sq: int = 1, causal_off: int = 0, *, dtype: _BF16 = None) -> None:
    """TE's scaled softmax over the rows of x (batches*heads*sq rows of sk): softmax(x*scale).
    mode 1: mask uint8/bool [b or 1, sq, sk] (row r uses batch (r // sq) // heads), masked logits
    become -10000 and a fully masked row gives 0; mode 2: causal, columns past
    (r % sq) + causal_off excluded (0 out; a row with none left gives 0)."""
def tex_softmax_bwd(dy: _Arr, y: _Arr, out: _Arr, scale: float, *, dtype: _BF16 = None) -> None:
    """out = scale * y * (dy - sum(dy * y, row))."""
def tex_rope(x: _Arr, cos: _Arr, sin: _Arr, pos: _Arr, out: _Arr, heads: int, interleaved: bool = False,
             transpose: bool = False, *, dtype: _BF16 = None) -> None:
    """Fused RoPE over x viewed (tokens, heads, d): token t uses row pos[t] (int64) of the float32
    (P, d2) cos/sin tables on its first d2 channels (the rest copied); transpose=True is the
    backward. ValueError for a position outside [0, P)."""
def sgd_step(g: _Arr, p: _Arr, buf: _Arr, wd: float, momentum: float, dampening: float, lr: float, nesterov: bool,
             first_run: bool, wd_after: bool, scale: float, *, dtype: _BF16 = None) -> None:
    """One SGD step in place (apex/TE multi_tensor_sgd): g*scale, weight decay before or after the
    momentum buffer (buf = g on the first run), Nesterov; g, p, buf of one dtype."""

def col_sums(x: _Arr, out: _Arr, *, dtype: _BF16 = None) -> None:
    """out (float32 [n]) = the column sums of x (rows, n = x's last dim): a GEMM's bias gradient
    (cuBLASLt BGRADB). fp32 sums of blocks of 64 rows, folded in fp64."""

# ---- runtime -----------------------------------------------------------------------------
def set_num_threads(n: int) -> int:
    """Threads for the kernels (default: omp_get_max_threads(), i.e. OMP_NUM_THREADS).
    Returns the count in force: always 1 in a process forked after its parent ran OpenMP
    kernels (libgomp hangs in such a child; build_info()["threads_note"] says so)."""
def get_num_threads() -> int: ...
def build_info() -> dict[str, Union[str, int, bool, list, dict]]:
    """selected_isa, vector_width_fp32, compiled_variants, cpu_supports, isa_note, openmp,
    openmp_version, omp_max_threads, num_threads, threads_note, parallel_threshold_bytes,
    nontemporal_threshold_bytes, output_cache, compiler, flags."""
def cache_info() -> dict[str, int]:
    """The fresh-output block cache: cap_bytes (TENSOR_OPS_CPP_CACHE_MB; default 1024 MiB
    or 1/16 of physical memory, whichever is less; 0 disables it), min_bytes (smaller
    outputs use NumPy's allocator), cached_bytes, cached_blocks, hits, misses."""
def empty(shape: Union[int, tuple[int, ...]], dtype: Union[str, np.dtype]) -> _Arr:
    """A new uninitialised C-contiguous array, from the block cache when >= min_bytes (the
    tex adapters allocate their torch outputs with it, through torch.from_numpy)."""
def empty_cache() -> int:
    """Free every cached output block (arrays still alive keep theirs); returns the bytes freed."""
def _set_cache(cap_bytes: int = -1, min_bytes: int = -1) -> None:
    """Test/benchmark hook: set the cache cap (also empties the cache) / the minimum size."""
def stream_copy(src: _Arr, dst: _Arr, pages: int = 1) -> None:
    """dst = src byte for byte: C-contiguous arrays of any dtype (no object dtypes) with the
    same nbytes, any alignment, not overlapping (the same buffer is a no-op). Non-temporal
    stores (AVX-512 / AVX2; memcpy in the scalar variant), the GIL released, split over
    set_num_threads() threads above the usual threshold: the memory ceiling the benchmark
    engine times kernels against. ``pages`` > 1 (at most 16) copies blocks of that many
    4 KiB pages 128 bytes of each in turn (glibc's large-copy pattern; faster on some
    hosts). ValueError for different sizes (both named), a read-only or non-contiguous
    array, overlap, pages outside [1, 16]; TypeError for a non-ndarray or an object dtype."""

# ---- the facade's plain-call entries (tensor_ops/_facade.py) ------------------------------
# METH_FASTCALL functions, positional only. Each takes the facade op's arguments without
# backend= (out= as an optional last argument: a plain array of the result's shape and dtype
# sharing no memory with an input, written and returned; the fused add + norm take none),
# computes when they need no normalisation (exactly ndarray, >= 1 dim, non-empty,
# C-contiguous, aligned, native float32/float16, weights of x's dtype and length, eps a finite
# float >= 0, approximate "none"/"tanh", softmax axis -1) and returns None otherwise, so the
# facade's general path gives the result or its error.
def _fast_rms_norm(x: _Arr, weight: _Arr, eps: float, out: Optional[_Arr] = None, /) -> Optional[_Arr]: ...
def _fast_layer_norm(x: _Arr, weight: _Arr, bias: Optional[_Arr], eps: float,
                     out: Optional[_Arr] = None, /) -> Optional[_Arr]: ...
def _fast_softmax(x: _Arr, axis: int, out: Optional[_Arr] = None, /) -> Optional[_Arr]: ...
def _fast_silu(x: _Arr, out: Optional[_Arr] = None, /) -> Optional[_Arr]: ...
def _fast_relu(x: _Arr, out: Optional[_Arr] = None, /) -> Optional[_Arr]: ...
def _fast_gelu(x: _Arr, approximate: str, out: Optional[_Arr] = None, /) -> Optional[_Arr]: ...
def _fast_swiglu(x: _Arr, out: Optional[_Arr] = None, /) -> Optional[_Arr]: ...
def _fast_geglu(x: _Arr, approximate: str, out: Optional[_Arr] = None, /) -> Optional[_Arr]: ...
def _fast_rope(x: _Arr, cos: _Arr, sin: _Arr, interleaved: bool, out: Optional[_Arr] = None,
               /) -> Optional[_Arr]: ...
def _fast_add_rms_norm(x: _Arr, residual: _Arr, weight: _Arr, eps: float, out: None = None,
                       /) -> Optional[tuple[_Arr, _Arr]]: ...
def _fast_add_layer_norm(x: _Arr, residual: _Arr, weight: _Arr, bias: Optional[_Arr], eps: float,
                         out: None = None, /) -> Optional[tuple[_Arr, _Arr]]: ...
# For autograd (tensor_ops/torch/_kernels.py; the backward ones are not counted as facade
# calls): the norms' plain case of _fast_rms_norm / _fast_layer_norm without out=, with the
# per-row float32 statistics of shape x.shape[:-1] (PlainEntry.stats), and the backward from
# them (dy and x of one plain dtype and shape, the statistics float32, >= 1-D); dy * act'(x)
# (act "silu", "gelu", "gelu_tanh", "relu"), the gated ops' dx (dy: x's shape, last axis
# halved) and softmax's over the last axis, into fresh outputs.
def _fast_rms_norm_stats(x: _Arr, weight: _Arr, eps: float, /) -> Optional[tuple[_Arr, _Arr]]: ...
def _fast_layer_norm_stats(x: _Arr, weight: _Arr, bias: Optional[_Arr], eps: float,
                           /) -> Optional[tuple[_Arr, _Arr, _Arr]]: ...
def _fast_rms_norm_bwd(dy: _Arr, x: _Arr, rsigma: _Arr, weight: _Arr, /) -> Optional[tuple[_Arr, _Arr]]: ...
def _fast_layer_norm_bwd(dy: _Arr, x: _Arr, mu: _Arr, rsigma: _Arr, weight: _Arr,
                         /) -> Optional[tuple[_Arr, _Arr, _Arr]]: ...
def _fast_act_bwd(dy: _Arr, x: _Arr, act: str, /) -> Optional[_Arr]: ...
def _fast_glu_bwd(dy: _Arr, x: _Arr, act: str, /) -> Optional[_Arr]: ...
def _fast_softmax_bwd(dy: _Arr, y: _Arr, scale: float, /) -> Optional[_Arr]: ...
def _set_torch(tensor: type, float32: object, float16: object, bfloat16: object, from_numpy: object,
               numpy_bfloat16: object = None, parameter: object = None, is_grad_enabled: object = None) -> None:
    """Let the _fast_* entries take torch CPU tensors (views in, torch.from_numpy out)."""
def _torch_views(*args: object) -> Optional[tuple]:
    """args with each torch CPU tensor as a NumPy view of it (None when one cannot be viewed)."""
def _fast_calls() -> dict[str, int]:
    """Calls each entry served (get_backend_info() adds them to default.cpp's counts)."""
def _exp(x: _Arr, out: Optional[_Arr] = None, *, dtype: _BF16 = None) -> _Arr:
    """Test hook: the vectorised exp the kernels use."""
def _tanh(x: _Arr, out: Optional[_Arr] = None, *, dtype: _BF16 = None) -> _Arr:
    """Test hook: the vectorised tanh (sign(x)*(1 - 2/(e^(2|x|)+1)), odd series near 0)."""
def _set_tuning(parallel_threshold_bytes: int = -1, nontemporal_threshold_bytes: int = -1,
                softmax_exp_twice: int = -1, norm_w16: int = -1, rope_group: int = -1,
                rope_block: int = -1, f16_lut: int = -1) -> None:
    """Benchmark hook: bytes of traffic from which calls go multi-threaded / outputs from
    which stores are non-temporal; whether the AVX-512 fp16 softmax computes exp twice
    instead of storing it, and whether the norms read 16-bit weights as they are (1 / 0;
    both chosen at import from the CPU: build_info()["softmax_exp_twice"],
    ["norm_weights_16bit"]); how many heads of a multi-head rope share each table row and
    how many bytes of cos + sin make a block of positions (build_info()["rope_group"],
    ["rope_block_bytes"]; values <= 0 keep them); whether AVX2's fp16 kernels of the cheaper
    functions (silu, tanh-GELU, exp and their gated forms and backward) read tables (1 / 0;
    build_info()["fp16_tables_all"], chosen at import: a Zen 1 does); -1 keeps the current
    value."""
