"""Out-of-tree approach: a plugin package loaded by name from the environment.

Run: python examples/example_outtree.py
(It sets TENSOR_OPS_PLUGINS itself; with the package pip-installed, its entry point loads it.)
"""
from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent / "outtree_plugin"))
os.environ["TENSOR_OPS_PLUGINS"] = "acme_tensor_plugin"
os.environ.setdefault("TENSOR_OPS_LOG_LEVEL", "INFO")
logging.basicConfig(level=logging.INFO, format="[%(name)s %(filename)s:%(lineno)d %(levelname)s] %(message)s")

import tensor_ops as to  # noqa: E402


def main() -> None:
    to.reload_config()
    import acme_tensor_plugin
    x = np.linspace(-3, 3, 32, dtype=np.float32).reshape(2, 16)
    with to.use_backend("vendor:acme"):
        y = to.silu(x)
    assert acme_tensor_plugin.CALLS["silu"] == 1, acme_tensor_plugin.CALLS
    assert np.allclose(y, x / (1 + np.exp(-x)), rtol=1e-6)
    print("plugins:", [p["name"] for p in to.get_backend_info()["plugins"]["loaded"]])
    print("silu served by:", to.get_backend_info()["ops"]["silu"]["calls"])
    print("OK")


if __name__ == "__main__":
    main()
