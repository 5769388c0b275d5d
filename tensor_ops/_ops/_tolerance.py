"""The one tolerance table: how close a result must be, per dtype, per kind of comparison.

Every comparison in the project reads it (the conformance harness, ``tensor_ops.testing``,
``detect_and_benchmark``'s validation, the fuzzers, the kernel unit tests, the CUDA
emulation), so a backend is held to the same bar everywhere.

Levels:

- ``conformance``: against the fp64 oracle on well-scaled inputs (standard normal × 2). fp32
  math with one rounding to the storage type: fp32 ~1e-6 relative; fp16 half an ulp is
  4.9e-4; bf16 half an ulp is 2e-3 (both doubled for the fp32 → storage rounding of inputs
  that differ in the last bit).
- ``fuzz``: against the fp64 oracle on adversarial inputs (the whole finite range, denormals,
  cancellation in layer_norm's centring, exp near overflow): fp32 gets 2e-5 relative.
- ``differential``: two implementations against each other (e.g. a tex backend against the
  PyTorch reference): both errors add up.

Reductions (rms_norm, layer_norm, softmax, matmul) sum a row: their tolerance grows with the
row length n (the error of a pairwise/SIMD-lane sum grows ~sqrt(n)): ``atol * max(1,
sqrt(n) / 8)``; on fuzz inputs (cancellation near the dtype's range) ``atol * max(1,
sqrt(n) / 4)`` and ``rtol * max(1, sqrt(n) / 8)``.
"""
from __future__ import annotations

import math

TOLERANCES: dict = {
    "conformance": {"float64": (1e-12, 1e-12), "float32": (1.3e-6, 1e-5), "float16": (1e-3, 2e-3),
                    "bfloat16": (8e-3, 1.6e-2)},
    "fuzz": {"float64": (1e-12, 1e-12), "float32": (2e-5, 1e-5), "float16": (2e-3, 2e-3),
             "bfloat16": (1.6e-2, 1.6e-2)},
    "differential": {"float64": (1e-12, 1e-12), "float32": (2e-5, 2e-5), "float16": (2e-3, 2e-3),
                     "bfloat16": (1.6e-2, 1.6e-2)},
}
CLASSES = ("elementwise", "reduction")
#: level -> (atol divisor, rtol divisor or None): reductions widen by max(1, sqrt(n) / divisor)
REDUCTION_SCALE = {"conformance": (8, None), "fuzz": (4, 8), "differential": (8, None)}


def dtype_name(dtype) -> str:
    """'float32' for np.float32, np.dtype('float32'), 'float32', torch.float32 ..."""
    if isinstance(dtype, str):
        return dtype.replace("torch.", "")
    name = getattr(dtype, "name", None)
    if isinstance(name, str):
        return name
    try:
        import numpy as np
        return np.dtype(dtype).name
    except TypeError:
        return str(dtype).replace("torch.", "")


def tolerance(dtype, cls: str = "elementwise", n: int = 1, level: str = "conformance") -> tuple[float, float]:
    """(rtol, atol) for a result of ``dtype`` with rows of length ``n``.

    Example:
        >>> tolerance("float32")
        (1.3e-06, 1e-05)
        >>> tolerance("float32", "reduction", n=4096)[1]
        8e-05
    """
    if cls not in CLASSES:
        raise ValueError(f"tolerance class must be one of {list(CLASSES)}, got {cls!r}")
    try:
        table = TOLERANCES[level]
    except KeyError:
        raise ValueError(f"tolerance level must be one of {sorted(TOLERANCES)}, got {level!r}") from None
    name = dtype_name(dtype)
    try:
        rtol, atol = table[name]
    except KeyError:
        raise ValueError(f"no tolerance for dtype {name!r}; known: {sorted(table)}") from None
    if cls == "reduction":
        a, r = REDUCTION_SCALE[level]
        atol *= max(1.0, math.sqrt(n) / a)
        if r is not None:
            rtol *= max(1.0, math.sqrt(n) / r)
    return rtol, atol
