"""setuptools entry point: the C++ extension plus the project's custom commands.

Commands (``python setup.py <cmd> --help`` for options):

- ``test_capabilities``  detect ISA / OpenMP / compilers / CUDA / OpenCL, record under ``detected``
- ``build_ext``          build ``tensor_ops._cpp`` (scalar + AVX2 + AVX-512 variants, OpenMP)
- ``build_cuda``         compile ``cuda_ext/`` into a fatbin with nvcc
- ``build_opencl``       build and cache ``opencl_ext/`` programs for every OpenCL device
- ``configure_backend``  ``--show`` / ``--backend`` / ``--priority`` / ``--op`` / ``--strict`` / ``--reset``

The build helpers live in ``tensor_ops/_build/`` and are loaded by file path, so building
never imports the ``tensor_ops`` package (which needs NumPy at run time).
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


def _load_build_module(name: str):
    """Import tensor_ops/_build/<name>.py without importing the tensor_ops package."""
    path = HERE / "tensor_ops" / "_build" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"_tensor_ops_build_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


capabilities = _load_build_module("capabilities")
configure = _load_build_module("configure")
cpp_build = _load_build_module("cpp_build")
cuda_build = _load_build_module("cuda_build")
opencl_build = _load_build_module("opencl_build")



class BuildPy(build_py):
    """Also ship the kernel sources a wheel needs at run time: opencl_ext/*.cl (built per
    device at first use) and cuda_ext/*.cu{,h} (NVRTC fallback when no fatbin fits)."""

    def run(self):
        super().run()
        import shutil
        for folder, patterns in (("opencl_ext", ("*.cl",)), ("cuda_ext", ("*.cu", "*.cuh"))):
            dest = Path(self.build_lib) / "tensor_ops" / folder
            dest.mkdir(parents=True, exist_ok=True)
            for pattern in patterns:
                for src in sorted((HERE / folder).glob(pattern)):
                    shutil.copy2(src, dest / src.name)


setup(
    ext_modules=cpp_build.extensions(),
    cmdclass={
        "build_py": BuildPy,
        "test_capabilities": capabilities.TestCapabilities,
        "configure_backend": configure.ConfigureBackend,
        "build_ext": cpp_build.BuildExt,
        "build_cuda": cuda_build.BuildCuda,
        "build_opencl": opencl_build.BuildOpenCL,
    },
)
