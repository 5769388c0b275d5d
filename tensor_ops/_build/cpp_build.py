"""Build ``tensor_ops._cpp`` (cpp_ext/): one module, three ISA variants of the kernels.

setup.py loads this file by path (never ``import tensor_ops``) and uses::

    ext_modules=cpp_build.extensions(), cmdclass={"build_ext": cpp_build.BuildExt}

The kernel sources (``KERNEL_SOURCES``) are compiled once per variant, each time with
``-DTO_ISA=<n>`` and only that variant's flags, into separate object directories, and linked
with the binding sources (``BINDING_SOURCES``, compiled once with baseline flags, in the
same thread pool) into one extension; the module picks a variant at import with
``__builtin_cpu_supports``. Nothing is built with ``-march=native``.

Environment (declared in ``tensor_ops/_env.py``, read through it):
    TENSOR_OPS_SKIP_CPP=1       do not build the extension at all
    TENSOR_OPS_REQUIRE_CPP=1    a failed build is an error (default: report it, go on)
    TENSOR_OPS_CPP_SANITIZE=1   -O1 -g -fsanitize=address,undefined (see cpp_ext/sanitize.sh)
    TENSOR_OPS_CPP_VARIANTS=..  comma list to build (default: scalar,avx2,avx512 on x86)

A missing pybind11 or C++ compiler never breaks the install: the extension is skipped
with a printed reason, ``backend.json`` records it under ``built.cpp``, and the package
imports; the cpp backend then reports itself unavailable with the reason.

Only a command that really builds (``build_ext``, ``pip install``) looks for pybind11 or
records a result: setup.py evaluates :func:`extensions` for *every* command, and in a fresh
venv pybind11 exists only inside pip's isolated build environment, so a check there made
``configure_backend`` record a false "cpp not built". And a build that fails while a
working ``tensor_ops._cpp`` is already importable does not overwrite the good record: it
adds ``last_failed_build`` beside it (the old module stays in use).
"""
from __future__ import annotations

import contextlib
import importlib.util
import os
import platform
import sys
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from setuptools import Extension
from setuptools.command.build_ext import build_ext

try:
    from . import jsonfile
except ImportError:  # loaded by file path (setup.py): the package is not importable here
    _spec = importlib.util.spec_from_file_location("_tensor_ops_build_jsonfile",
                                                   Path(__file__).with_name("jsonfile.py"))
    assert _spec is not None and _spec.loader is not None, "tensor_ops/_build/jsonfile.py is missing"
    jsonfile = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(jsonfile)
_env = jsonfile.env

EXT_NAME = "tensor_ops._cpp"
SRC_DIR = "cpp_ext"  # relative to setup.py, as setuptools wants
# Compiled once per ISA variant (-DTO_ISA=<n> + that variant's flags).
# One file per op family; the family names (norm, softmax, activation, rope, optim, common)
# are the same in cpp_ext/, opencl_ext/ and cuda_ext/.
KERNEL_SOURCES = ["norm.cpp", "softmax.cpp", "activation.cpp", "rope.cpp", "optim.cpp", "common.cpp", "backward.cpp",
                  "tex_train.cpp", "table.cpp"]
HEADERS = ["simd.h", "rowio.h", "vmath.h", "kernels.h", "variant.h", "lut16.h", "softmax_rows.h"]
# Compiled once with the baseline flags; module.cpp holds only PYBIND11_MODULE. Only
# runtime.cpp is free of pybind11, whose headers cost ~8 s of CPU per file here (gcc 12,
# -O3 -g): the others compile in the kernels' thread pool. runtime.cpp alone uses what is
# known only after the kernels compiled (TO_HAVE_<variant>, the generated to_build_info.h).
BINDING_SOURCES = ["module.cpp", "runtime.cpp", "checks.cpp", "alloc.cpp", "bind_facade.cpp", "bind_tex.cpp",
                   "bind_tex_train.cpp", "bind_runtime.cpp", "fast_entry.cpp", "bind_autograd.cpp",
                   "torch_entry.cpp"]
LATE_BINDING_SOURCES = ["runtime.cpp"]
BINDING_HEADERS = ["kernels.h", "runtime.h", "checks.h", "alloc.h", "binding.h"]

_UNIX_VARIANTS = {
    "scalar": (0, []),
    "avx2": (1, ["-mavx2", "-mfma", "-mf16c"]),
    "avx512": (2, ["-mavx512f", "-mavx512bw", "-mavx512dq", "-mavx512vl", "-mavx2", "-mfma", "-mf16c"]),
    # the avx512 code with bfloat16 stores by vcvtneps2bf16 (simd.h, TO_ISA 3)
    "avx512bf16": (3, ["-mavx512f", "-mavx512bw", "-mavx512dq", "-mavx512vl", "-mavx512bf16", "-mavx2", "-mfma",
                       "-mf16c"]),
}
_MSVC_VARIANTS = {"scalar": (0, []), "avx2": (1, ["/arch:AVX2"]), "avx512": (2, ["/arch:AVX512"]),
                  "avx512bf16": (3, ["/arch:AVX512"])}


def _say(msg: str) -> None:
    print(f"build_ext[cpp]: {msg}", file=sys.stderr, flush=True)


def _is_x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64", "i386", "i686", "x86")


def _record(value: dict) -> None:
    """Write built.cpp into backend.json (jsonfile's write target)."""
    try:
        written = jsonfile.update_section("built", "cpp", value)
        _say(f"recorded built.cpp in {written}")
    except Exception as exc:  # recording is a convenience, never a build failure
        _say(f"could not record the build result ({type(exc).__name__}: {exc})")


def extensions() -> list:
    """The extension list for setup(); [] only when TENSOR_OPS_SKIP_CPP=1.

    Imports nothing and records nothing: pybind11 is looked for by :class:`BuildExt` when a
    build actually runs (see the module docstring for why)."""
    if _env.get("TENSOR_OPS_SKIP_CPP"):
        _say("TENSOR_OPS_SKIP_CPP=1: not building tensor_ops._cpp")
        return []
    src = Path(SRC_DIR)
    return [
        Extension(
            EXT_NAME,
            sources=[str(src / s) for s in BINDING_SOURCES],
            include_dirs=[SRC_DIR],
            depends=[str(src / h) for h in sorted(set(HEADERS) | set(BINDING_HEADERS))]
            + [str(src / s) for s in KERNEL_SOURCES],
            language="c++",
        )
    ]


def _pybind11_include() -> str:
    try:
        import pybind11
    except ImportError as exc:
        raise RuntimeError(f"pybind11 is not importable ({exc}); `pip install pybind11` and rebuild "
                           "(`pip install -e .` or `python setup.py build_ext --inplace`)") from None
    return pybind11.get_include()


def _importable_build() -> str:
    """The path of a ``tensor_ops._cpp`` that imports in a fresh interpreter, or ''."""
    import subprocess
    root = Path(__file__).resolve().parents[2]
    code = "import tensor_ops._cpp as m; print(m.__file__)"
    try:
        p = subprocess.run([sys.executable, "-c", code], cwd=str(root), capture_output=True, text=True,
                           timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return p.stdout.strip() if p.returncode == 0 else ""


def _record_failure(reason: str) -> None:
    """Record a failed build, unless a working build is importable: then keep its record and
    note the failure beside it (``built.cpp.ok`` must describe the module that loads)."""
    existing = _importable_build()
    if not existing:
        _record({"ok": False, "reason": reason})
        return
    _say(f"the existing build {existing} still imports and stays in use")
    old = jsonfile.recorded("built", "cpp")
    rec = dict(old) if isinstance(old, dict) and old.get("ok") else {"ok": True, "module": existing}
    rec["last_failed_build"] = reason
    _record(rec)


@contextlib.contextmanager
def _reuse_objects(compiler, prebuilt: dict):
    """Within the block, ``compiler.compile`` returns the objects already built for the
    sources in ``prebuilt`` ({source: [objects]}) and compiles only the others."""
    patched_before = "compile" in vars(compiler)
    real = compiler.compile

    def compile(sources, *args, **kwargs):
        out: list = []
        for src in sources:
            out += prebuilt[src] if src in prebuilt else real([src], *args, **kwargs)
        return out

    compiler.compile = compile
    try:
        yield
    finally:
        if patched_before:
            compiler.compile = real
        else:
            del compiler.compile  # back to the class's method


class BuildExt(build_ext):
    """build_ext that compiles the per-ISA kernel objects first and never fails the install."""

    def build_extensions(self):
        failed = []
        for ext in list(self.extensions):
            if ext.name != EXT_NAME:
                self.build_extension(ext)
                continue
            try:
                self._build_cpp(ext)
            except Exception as exc:
                reason = f"{type(exc).__name__}: {str(exc).strip() or traceback.format_exc(limit=1)}"
                _say(f"tensor_ops._cpp was NOT built ({reason}). The package still works; the cpp "
                     "backend reports itself unavailable. Install a C++17 compiler (g++ / clang++) and "
                     "re-run `python setup.py build_ext --inplace` or `pip install -e .`.")
                _record_failure(reason)
                if _env.get("TENSOR_OPS_REQUIRE_CPP"):
                    raise
                failed.append(ext)
        # Later steps (inplace copy, editable-wheel output mapping) must not look for it.
        for ext in failed:
            self.extensions.remove(ext)

    # -- helpers -----------------------------------------------------------------------
    def _flags(self):
        msvc = self.compiler.compiler_type == "msvc"
        sanitize = _env.get("TENSOR_OPS_CPP_SANITIZE")
        if msvc:
            common = ["/O2", "/std:c++17", "/EHsc"]
            variants = dict(_MSVC_VARIANTS)
            link = []
        else:
            # -Wno-(maybe-)uninitialized: gcc 12 reports its own AVX-512 intrinsics' undefined
            # vectors (_mm512_undefined_*, inside _mm512_reduce_add_ps, ...) as uninitialized
            # at every inlined use: ~100k lines of false positives (GCC bug 105593) that buried
            # real warnings. Real uninitialized reads are the sanitizer run's job (sanitize.sh).
            common = ["-std=c++17", "-fvisibility=hidden", "-fno-math-errno", "-Wno-maybe-uninitialized",
                      "-Wno-uninitialized"]
            if sanitize:
                common += ["-O1", "-g", "-fno-omit-frame-pointer", "-fsanitize=address,undefined",
                           "-fno-sanitize-recover=undefined"]
                link = ["-fsanitize=address,undefined"]
            else:
                common += ["-O3"]
                link = []
            variants = dict(_UNIX_VARIANTS)
        if not _is_x86():
            variants = {"scalar": variants["scalar"]}
        wanted = _env.get("TENSOR_OPS_CPP_VARIANTS")
        if wanted is not None:
            keep = set(wanted) | {"scalar"}
            variants = {k: v for k, v in variants.items() if k in keep}
        return msvc, common, link, variants

    def _openmp_flags(self, msvc: bool, tmp: Path):
        flag = "/openmp" if msvc else "-fopenmp"
        probe = tmp / "omp_probe.cpp"
        probe.write_text("#include <omp.h>\nint to_probe() { return omp_get_max_threads(); }\n")
        try:
            self.compiler.compile([str(probe)], output_dir=str(tmp / "omp_probe"), extra_postargs=[flag])
        except Exception as exc:
            _say(f"OpenMP not available ({type(exc).__name__}); building single-threaded kernels")
            return [], [], False
        return [flag], ([] if msvc else [flag]), True

    def _build_cpp(self, ext: Extension) -> None:
        include = _pybind11_include()
        msvc, common, link, variants = self._flags()
        tmp = Path(self.build_temp).resolve() / "tensor_ops_cpp"
        tmp.mkdir(parents=True, exist_ok=True)
        omp_c, omp_l, has_omp = self._openmp_flags(msvc, tmp)
        gen = tmp / "gen"
        gen.mkdir(exist_ok=True)
        ext.include_dirs = list(ext.include_dirs) + [include, str(gen)]
        ext.extra_compile_args = list(ext.extra_compile_args or []) + common + omp_c
        ext.extra_link_args = list(ext.extra_link_args or []) + link + omp_l

        # One pool for the kernel variants and the binding files (each binding file spends
        # seconds in the pybind11 headers): all but LATE_BINDING_SOURCES, which need to know
        # which variants compiled, build alongside the kernels; setuptools then compiles
        # those and links (the others are handed over by _reuse_objects).
        jobs = [("kernel", name, isa, vflags, src) for name, (isa, vflags) in variants.items() for src in KERNEL_SOURCES]
        jobs += [("binding", None, None, None, src) for src in ext.sources if Path(src).name not in LATE_BINDING_SOURCES]
        macros = list(ext.define_macros or []) + [(u,) for u in ext.undef_macros or []]

        def compile_one(job):
            kind, name, isa, vflags, src = job
            if kind == "binding":  # exactly what build_extension would do for it
                return self.compiler.compile([src], output_dir=self.build_temp, macros=macros,
                                             include_dirs=ext.include_dirs, debug=self.debug,
                                             extra_postargs=ext.extra_compile_args, depends=ext.depends)
            return self.compiler.compile(
                [f"{SRC_DIR}/{src}"],
                output_dir=str(tmp / f"isa_{name}"),
                macros=[("TO_ISA", str(isa))],
                include_dirs=[SRC_DIR],
                extra_postargs=common + vflags,
                depends=[f"{SRC_DIR}/{h}" for h in HEADERS],
            )

        objects: dict[str, list] = {name: [] for name in variants}
        prebuilt: dict[str, list] = {}
        errors: dict[str, str] = {}
        binding_errors: list[str] = []
        workers = max(1, min(len(jobs), os.cpu_count() or 1))
        with ThreadPoolExecutor(max_workers=workers) as pool:
            futures = [(job, pool.submit(compile_one, job)) for job in jobs]
            for job, fut in futures:
                try:
                    if job[0] == "binding":
                        prebuilt[job[4]] = fut.result()
                    else:
                        objects[job[1]].extend(fut.result())
                except Exception as exc:
                    if job[0] == "binding":
                        binding_errors.append(f"{job[4]}: {type(exc).__name__}: {exc}")
                    else:
                        errors.setdefault(job[1], f"{job[4]}: {type(exc).__name__}: {exc}")
        if binding_errors:
            raise RuntimeError(f"the binding failed to compile ({binding_errors[0]})")
        if "scalar" in errors:
            raise RuntimeError(f"the portable kernel variant failed to compile ({errors['scalar']})")
        built = [name for name in variants if name not in errors]
        for name, err in errors.items():
            _say(f"ISA variant {name} skipped (the compiler refused its flags): {err}")

        quote = lambda s: s.replace("\\", "\\\\").replace('"', '\\"')  # noqa: E731
        header = ["// generated by tensor_ops/_build/cpp_build.py", "#pragma once",
                  f'#define TO_FLAGS_COMMON "{quote(" ".join(common + omp_c))}"']
        for name in ("scalar", "avx2", "avx512", "avx512bf16"):
            fl = " ".join(variants[name][1]) if name in built else "(not built)"
            header.append(f'#define TO_FLAGS_{name.upper()} "{quote(fl)}"')
        (gen / "to_build_info.h").write_text("\n".join(header) + "\n")

        ext.extra_objects = list(ext.extra_objects or []) + [o for name in built for o in objects[name]]
        ext.define_macros = list(ext.define_macros or []) + [(f"TO_HAVE_{n.upper()}", "1") for n in built if n != "scalar"]
        # Relink whenever the variant objects change.
        ext.depends = list(ext.depends or []) + [o for name in built for o in objects[name]]
        with _reuse_objects(self.compiler, prebuilt):
            super().build_extension(ext)
        compiler = getattr(self.compiler, "compiler_so", None) or [self.compiler.compiler_type]
        _record({
            "ok": True,
            "variants": built,
            "skipped_variants": errors,
            "openmp": has_omp,
            "compiler": " ".join(compiler[:1]),
            "flags": {"common": common + omp_c, **{n: variants[n][1] for n in built}},
            "sanitize": _env.get("TENSOR_OPS_CPP_SANITIZE"),
        })
        _say(f"built {EXT_NAME} with variants {built}, OpenMP {'on' if has_omp else 'off'}")
