"""In-tree approach (TE-FL seed, unchanged): define an impl, register it, call via a manager.

Run: python examples/example_intree.py
"""
from __future__ import annotations

import logging

import numpy as np

from tensor_ops.plugin import BackendImplKind, OpImpl, OpManager, OpRegistry

logging.basicConfig(level=logging.INFO, format="[%(name)s %(filename)s:%(lineno)d %(levelname)s] %(message)s")


# 1. Define your operator implementation (TE's rmsnorm_fwd returns output and rsigma)
def my_rmsnorm(input, weight, eps=1e-5, **kwargs):
    rsigma = 1.0 / np.sqrt(np.mean(input * input, axis=-1, keepdims=True) + eps)
    return input * rsigma * weight, rsigma


def main() -> None:
    input = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    weight = np.ones(64, np.float32)

    # 2. Register to Registry
    registry = OpRegistry()
    registry.register_impl(OpImpl(op_name="rmsnorm_fwd", impl_id="vendor.mybackend", kind=BackendImplKind.VENDOR,
                                  vendor="mybackend", fn=my_rmsnorm, priority=200))

    # 3. Call via Manager
    manager = OpManager(registry)
    output, rsigma = manager.call("rmsnorm_fwd", input, weight)
    print(f"output {output.shape} {output.dtype}, rsigma {rsigma.shape}")

    # The same impl can serve the facade's global registry too: register a facade op.
    import tensor_ops as to
    reg = to.get_registry()
    impl = reg.register_impl(OpImpl(op_name="rms_norm", impl_id="vendor.mybackend", kind="vendor",
                                    vendor="mybackend", priority=200,
                                    fn=lambda x, w, eps, out: my_rmsnorm(x, w, eps)[0]))
    try:
        with to.use_backend("vendor:mybackend"):
            y = to.rms_norm(input, weight)
        print("facade served by", to.get_backend_info()["ops"]["rms_norm"]["calls"])
        assert np.allclose(y, output, rtol=1e-5, atol=1e-5)
    finally:
        reg.unregister_impl("rms_norm", impl.impl_id, "facade")
    print("OK")


if __name__ == "__main__":
    main()
