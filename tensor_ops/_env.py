"""Every environment variable tensor_ops reads, declared once: name, aliases, parser, default,
meaning, and which layer reads it.

Why one registry: the variables used to be read in a dozen modules (and C++), each with its
own spelling of "true", its own error text and its own idea of the alias order, and the
table in BACKEND_CONFIG.md drifted from the code (the build switches were missing). Now a
reader asks this module (:func:`get`, :func:`lookup`, :func:`raw`, :func:`enabled`), the
documentation table is generated from :data:`VARS` (``python tensor_ops/_env.py
--write-docs``), and ``tests/test_env.py`` fails when a ``TENSOR_OPS_*``/``TE_*`` name in the
source tree is not declared here or the table is stale.

This file imports only the standard library and never the ``tensor_ops`` package: setup.py's
build helpers load it by file path (through ``_build/jsonfile.py``) in pip's isolated build
environment, where the package (and NumPy) may not be importable.

Example:
    >>> from tensor_ops import _env
    >>> _env.get("TENSOR_OPS_STRICT", {"TE_FL_STRICT": "yes"})      # the alias is honoured
    True
    >>> _env.lookup("TENSOR_OPS_PER_OP", {"TE_FL_PER_OP": "silu=numpy"})
    ('silu=numpy', 'TE_FL_PER_OP')
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Literal, Mapping, Optional

# --------------------------------------------------------------------------- parsers
# A parser takes (value, variable name) — the value stripped and non-empty — and returns the
# typed value, or raises _Invalid(what is accepted); lookup() turns that into the caller's
# error class with the project's formula.

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


class _Invalid(Exception):
    """A parser's complaint: what the value should have been."""


def text(value: str, var: str) -> str:
    return value


def path(value: str, var: str) -> Path:
    return Path(value)


def path_or_off(value: str, var: str) -> Path | Literal[False]:
    """A directory, or ``off`` (any case): ``False``, the cache is not used at all."""
    return False if value.lower() == "off" else Path(value)


def boolean(value: str, var: str) -> bool:
    """``1/true/yes/on`` or ``0/false/no/off`` (any case); anything else is an error."""
    v = value.lower()
    if v in _TRUE or v in _FALSE:
        return v in _TRUE
    raise _Invalid(f"expected one of {sorted(_TRUE + _FALSE)}")


def flag(value: str, var: str) -> bool:
    """Exactly ``1`` switches it on; any other value leaves it off (the build switches)."""
    return value == "1"


def items(value: str, var: str) -> list:
    """A comma list, entries stripped, empty entries dropped, case kept."""
    return [p.strip() for p in value.split(",") if p.strip()]


def name_list(value: str, var: str) -> list:
    """A comma list of case-insensitive names (lower-cased)."""
    return [p.lower() for p in items(value, var)]


def choice(*choices: str, upper: bool = False, synonyms: Optional[dict] = None,
           lenient: bool = False) -> Callable[[str, str], Optional[str]]:
    """One of ``choices`` (case-insensitive; returned lower-case, or upper-case if ``upper``).
    ``synonyms`` are accepted without being listed; ``lenient``: anything else means unset."""
    norm = str.upper if upper else str.lower
    accepted = {norm(c): norm(c) for c in choices}
    accepted.update({norm(k): norm(v) for k, v in (synonyms or {}).items()})

    def parse(value: str, var: str) -> Optional[str]:
        v = norm(value)
        if v in accepted:
            return accepted[v]
        if lenient:
            return None
        raise _Invalid(f"expected one of {sorted(norm(c) for c in choices)}")
    parse.__doc__ = f"one of {sorted(choices)}"
    return parse


def whole_number(value: str, var: str) -> int:
    """An integer >= 0."""
    if value.isdigit():
        return int(value)
    raise _Invalid("expected a whole number >= 0")


def positive_int_or_none(value: str, var: str) -> Optional[int]:
    """A positive integer; anything else means unset (the OpenCL backend's leniency)."""
    return int(value) if value.isdigit() and int(value) > 0 else None


# --------------------------------------------------------------------------- declarations
@dataclass(frozen=True)
class Var:
    """One environment variable. ``layers``: who reads it — ``runtime`` (the resolver and
    config: _policy/_config/_global), ``tex``, ``opencl``/``cuda`` (that backend module),
    ``build`` (setup.py helpers), ``C++`` (the native module reads it itself), ``tests``.
    ``external``: a standard variable of another tool that tensor_ops honours."""

    name: str
    layers: tuple
    meaning: str
    example: str
    parse: Callable[[str, str], Any] = text
    default: Any = None
    default_doc: str = ""
    aliases: tuple = ()
    external: bool = False

    @property
    def all_names(self) -> tuple:
        return (self.name,) + self.aliases


_R, _T, _B, _C = ("runtime",), ("tex",), ("build",), ("C++",)

VARS: tuple = (
    # -- the resolver's settings (tensor_ops/_policy.py, _config.py, _global.py)
    Var("TENSOR_OPS_CONFIG", ("runtime", "build"), "path of the configuration file (a missing file there "
        "means an empty configuration)", "/etc/tensor_ops.json", path,
        default_doc="the project's `backend.json`, else the user config dir"),
    Var("TENSOR_OPS_BACKEND", _R, "force one backend (a comma list is an order)", "cpp"),
    Var("TENSOR_OPS_PRIORITY", _R, "order for every op", "cpp,opencl,numpy"),
    Var("TENSOR_OPS_PER_OP", _R, "per-op orders, `op=tok|tok;op2=tok` (`,` also separates tokens)",
        "rms_norm=cpp|numpy;softmax=numpy", aliases=("TE_FL_PER_OP",)),
    Var("TENSOR_OPS_STRICT", _R, "`1/true/yes/on` strict (failures raise), `0/false/no/off` not", "1",
        boolean, False, "`strict` of backend.json, else off", aliases=("TE_FL_STRICT",)),
    Var("TENSOR_OPS_DISABLE", _R, "comma list of backends never used (added to `disabled`)", "opencl,cuda"),
    Var("TENSOR_OPS_PLUGINS", _R, "comma list of plugin modules to load", "acme_tensor_plugin", items,
        aliases=("TE_FL_PLUGIN_MODULES",)),
    Var("TENSOR_OPS_LOG_LEVEL", _R, "level of the `tensor_ops` logger (a handler is added if none exists)",
        "INFO", choice("CRITICAL", "DEBUG", "ERROR", "INFO", "WARNING", upper=True), "WARNING",
        aliases=("TEFL_LOG_LEVEL",)),
    Var("TENSOR_OPS_ALLOW_VENDORS", _R, "only these vendors' impls may run (case-insensitive)", "acme",
        name_list, aliases=("TE_FL_ALLOW_VENDORS",), default_doc="all vendors"),
    Var("TENSOR_OPS_DENY_VENDORS", _R, "these vendors' impls never run (added to `deny_vendors`)",
        "nvidia,amd", name_list, aliases=("TE_FL_DENY_VENDORS",)),
    Var("TENSOR_OPS_FALLBACK_BACKEND", _R, "backend tried when a forced one lacks the op (the reference "
        "comes after it)", "numpy", aliases=("TE_FALLBACK_BACKEND",), default_doc="the reference"),
    Var("TE_FL_PREFER", _R, "put a kind first: `flagos` (= default), `vendor`, `reference`", "vendor",
        choice("flagos", "reference", "vendor", synonyms={"default": "flagos"})),
    Var("TE_FL_PREFER_VENDOR", _R, "`1` = prefer vendor impls (below `TE_FL_PREFER`)", "1", boolean, False),
    Var("TE_FL_DEBUG", _R, "`1` = log level DEBUG (above `TENSOR_OPS_LOG_LEVEL`)", "1", boolean, False),
    Var("TE_FL_SKIP_CUDA", ("runtime", "tex", "cuda"), "`1` = disable the `cuda` and `nvidia` backends",
        "1", boolean, False),
    # -- tex (tensor_ops/tex/_backends.py)
    Var("TE_BACKEND", _T, "force a backend for the **tex ops only** (TE-FL's meaning), by a name from "
        "`tex.list_backends()`, case-insensitive; precedence `tex.use_backend` > `tex.set_backend` > "
        "`TE_BACKEND` > `TE_PLUGIN` > the resolver's order; an unknown or unavailable name raises "
        "`RuntimeError: Backend 'x' not found. Available backends: [...]` at the first tex call",
        "torch, cpp", aliases=("TE_PLUGIN",)),
    # -- native C++ module (cpp_ext/): read by the extension itself at import
    Var("TENSOR_OPS_MAX_ISA", _C, "cap the C++ backend's ISA variant (`avx512bf16`: AVX-512 with the "
        "AVX512_BF16 conversion instructions)", "avx2",
        choice("scalar", "avx2", "avx512", "avx512bf16"), default_doc="the best the CPU supports"),
    Var("TENSOR_OPS_CPP_CACHE_MB", _C, "MiB of freed C++ output blocks (fresh outputs ≥ 1 MiB) kept for "
        "reuse; `0` disables the cache (`tensor_ops._cpp.cache_info()` / `empty_cache()`)", "0, 256",
        whole_number, default_doc="1024 or 1/16 of physical memory, whichever is less"),
    Var("OMP_NUM_THREADS", _C, "threads of the C++ kernels (read through the OpenMP runtime)", "2",
        default_doc="all cores", external=True),
    # -- OpenCL backend (tensor_ops/backends/opencl/settings.py)
    Var("TENSOR_OPS_OPENCL_DEVICE", ("opencl",), "OpenCL device: `platform:device` index or a name "
        "substring", "0:0, pthread", default_doc="the fastest GPU, else the first CPU device"),
    Var("TENSOR_OPS_OPENCL_CACHE", ("opencl", "build"), "OpenCL program-binary cache directory; `off`: "
        "no binary is read or written, every process builds from source (PoCL keeps its own kernel "
        "cache: its binary export compiles every kernel, ~14 s on a fresh machine)", "/tmp/clcache, off",
        path_or_off, default_doc="the platformdirs user cache dir + `/opencl`"),
    Var("TENSOR_OPS_OPENCL_SRC", ("opencl",), "directory holding the `.cl` sources", "./opencl_ext", path,
        default_doc="`opencl_ext/` of the checkout or the installed package"),
    Var("TENSOR_OPS_OPENCL_LWS", ("opencl",), "OpenCL local work size (rounded down to a power of two, "
        "at least 4; anything but a positive integer is ignored)", "64", positive_int_or_none,
        default_doc="4 on CPU devices, 256 on GPUs"),
    Var("TENSOR_OPS_OPENCL_LAYOUT", ("opencl",), "OpenCL loop layout: `cpu` (each work-item streams "
        "whole rows or one contiguous chunk; no work-group reductions) or `gpu` (one work-group per row "
        "with a local-memory reduction; strided, coalesced loops); other values are ignored", "gpu",
        choice("cpu", "gpu", lenient=True), default_doc="by device type"),
    # -- build (tensor_ops/_build/, setup.py)
    Var("TENSOR_OPS_SKIP_CPP", _B, "`1` = do not build the C++ extension (`build_ext`, `pip install`)",
        "1", flag, False),
    Var("TENSOR_OPS_REQUIRE_CPP", _B, "`1` = a failed C++ build fails the command (default: reported, "
        "recorded under `built.cpp`, the install goes on)", "1", flag, False),
    Var("TENSOR_OPS_CPP_SANITIZE", _B, "`1` = build the C++ extension with `-O1 -g "
        "-fsanitize=address,undefined` (what `cpp_ext/sanitize.sh` does)", "1", flag, False),
    Var("TENSOR_OPS_CPP_VARIANTS", _B, "comma list of ISA variants to build (`scalar` is always built)",
        "scalar,avx2", items, default_doc="scalar,avx2,avx512,avx512bf16 on x86; scalar elsewhere"),
    Var("CXX", _B, "the C++ compiler `test_capabilities` probes for OpenMP", "clang++",
        default_doc="g++", external=True),
    Var("CUDA_HOME", _B, "CUDA toolkit root: `build_cuda` looks for nvcc/cuobjdump in its `bin/` "
        "(after PATH)", "/usr/local/cuda-13.0", path, external=True),
    Var("CUDA_PATH", _B, "= `CUDA_HOME` (Windows' name; both are searched, `CUDA_HOME` first)",
        "/usr/local/cuda-13.0", path, external=True),
    Var("XDG_CONFIG_HOME", ("runtime", "build"), "base of the user config dir, used only when "
        "platformdirs is missing", "~/.config", path, default_doc="~/.config", external=True),
    # -- tests
    Var("TENSOR_OPS_EXPECT_ISA", ("tests",), "the ISA variant `tests/test_cpp.py` must find loaded "
        "(set by the test itself in a subprocess, next to `TENSOR_OPS_MAX_ISA`)", "avx2",
        choice("scalar", "avx2", "avx512", "avx512bf16")),
)

_BY_NAME: dict = {n: v for v in VARS for n in v.all_names}


def declared(name: str) -> Var:
    """The declaration of ``name`` (a canonical name or an alias)."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"environment variable {name!r} is not declared; declared: "
                       f"{sorted(_BY_NAME)}; add it to VARS in tensor_ops/_env.py") from None


# --------------------------------------------------------------------------- accessors
_ENCODED: dict = {}


def _encoded(n: str):
    """``n`` as ``os.environ`` keys its ``_data`` (``encodekey``). Why: ``os.environ.get`` of
    an unset name costs ~0.7 us (``__getitem__`` raises KeyError inside ``Mapping.get``), and
    tex reads TE_BACKEND / TE_PLUGIN on every call (~2 of an 8-row layernorm_fwd's ~22 us);
    a miss in ``_data`` costs ~0.04 us. A name that is there is read through ``get`` as before."""
    k = _ENCODED.get(n)
    if k is None:
        k = _ENCODED[n] = os.environ.encodekey(n)
    return k


def raw(name: str, environ: Optional[Mapping[str, str]] = None) -> tuple:
    """``(value, variable)`` of the first of ``name``'s names (canonical, then aliases) set to
    a non-blank value, stripped; ``(None, None)`` when none is. Never raises on a value."""
    env = os.environ if environ is None else environ
    data = getattr(env, "_data", None) if type(env) is os._Environ else None
    for n in declared(name).all_names:
        if data is not None and _encoded(n) not in data:
            continue
        v = env.get(n)
        if v is not None and v.strip():
            return v.strip(), n
    return None, None


def lookup(name: str, environ: Optional[Mapping[str, str]] = None, *,
           error: type = ValueError) -> tuple:
    """``(parsed value, variable)``; ``(default, None)`` when unset. An invalid value raises
    ``error`` naming the variable and its value, listing what is accepted."""
    value, var = raw(name, environ)
    spec = declared(name)
    if value is None:
        return spec.default, None
    try:
        return spec.parse(value, var), var
    except _Invalid as exc:
        raise error(f"environment variable {var}={value!r}: {exc}; unset it or set an accepted "
                    f"value") from None


def get(name: str, environ: Optional[Mapping[str, str]] = None, *, error: type = ValueError) -> Any:
    """The parsed value of ``name`` (or its default): the one-line accessor for readers.

    Example:
        >>> from tensor_ops import _env
        >>> _env.get("TENSOR_OPS_OPENCL_LWS", {"TENSOR_OPS_OPENCL_LWS": "64"})
        64
    """
    return lookup(name, environ, error=error)[0]


def enabled(name: str, environ: Optional[Mapping[str, str]] = None) -> bool:
    """True when ``name`` is set to ``1/true/yes/on``; never raises (for availability probes,
    which must not fail on a typo that the resolver reports anyway)."""
    value, _ = raw(name, environ)
    return value is not None and value.lower() in _TRUE


def names(layers: Iterable[str] = (), *, external: bool = False) -> tuple:
    """Every declared name (aliases included) of variables read by any of ``layers`` (all
    layers when empty); ``external`` also lists other tools' variables (CXX, CUDA_HOME, …)."""
    want = set(layers)
    return tuple(n for v in VARS if (external or not v.external) and (not want or want & set(v.layers))
                 for n in v.all_names)


def set_in(environ: Optional[Mapping[str, str]] = None) -> dict:
    """``{name: value}`` of the declared project variables set in ``environ`` (for info)."""
    env = os.environ if environ is None else environ
    return {n: env[n] for n in names() if n in env}


# --------------------------------------------------------------------------- documentation
DOCS = Path(__file__).resolve().parents[1] / "BACKEND_CONFIG.md"
START, END = "<!-- env-table:start -->", "<!-- env-table:end -->"


def _cell(s: str) -> str:
    return s.replace("|", "\\|")


def render_table() -> str:
    """The markdown table of every declared variable (BACKEND_CONFIG.md's env table)."""
    rows = ["| variable | read by | meaning | default | example |", "|---|---|---|---|---|"]
    for v in VARS:
        var = f"`{v.name}`" + (f" (alias {', '.join(f'`{a}`' for a in v.aliases)})" if v.aliases else "")
        default = v.default_doc or ("unset" if v.default in (None, False) else f"`{v.default}`")
        example = ", ".join(f"`{e.strip()}`" for e in v.example.split(", "))
        layers = ", ".join(v.layers) + (" (standard variable)" if v.external else "")
        rows.append(f"| {var} | {layers} | {_cell(v.meaning)} | {_cell(default)} | {_cell(example)} |")
    return "\n".join(rows) + "\n"


def docs_region(doc_text: str) -> str:
    """What stands between the markers in ``doc_text`` (ValueError if they are missing)."""
    if doc_text.count(START) != 1 or doc_text.count(END) != 1 or doc_text.index(START) > doc_text.index(END):
        raise ValueError(f"expected one {START!r} line before one {END!r} line; restore the markers "
                         f"around the environment table")
    return doc_text.split(START, 1)[1].split(END, 1)[0].strip("\n") + "\n"


def write_docs(doc: Path = DOCS) -> bool:
    """Regenerate the table in ``doc`` between the markers; True when the file changed."""
    text_ = Path(doc).read_text(encoding="utf-8")
    docs_region(text_)
    head, rest = text_.split(START, 1)
    tail = rest.split(END, 1)[1]
    new = f"{head}{START}\n{render_table()}{END}{tail}"
    if new == text_:
        return False
    Path(doc).write_text(new, encoding="utf-8")
    return True


def main(argv: Optional[list] = None) -> int:
    """``python tensor_ops/_env.py [--write-docs | --check-docs]`` (no option: print the table).

    Run by path: it needs nothing but the standard library (``python -m tensor_ops._env``
    works too, with runpy's warning that the package imported this module first)."""
    args = sys.argv[1:] if argv is None else argv
    if args == ["--write-docs"]:
        print(f"{DOCS}: {'table rewritten' if write_docs() else 'already up to date'}")
        return 0
    if args == ["--check-docs"]:
        stale = docs_region(DOCS.read_text(encoding="utf-8")) != render_table()
        if stale:
            print(f"{DOCS}: the environment table is stale; run `python tensor_ops/_env.py --write-docs`",
                  file=sys.stderr)
        return int(stale)
    if args:
        print(f"unknown arguments {args!r}; accepted: ['--check-docs', '--write-docs'] or none",
              file=sys.stderr)
        return 2
    print(render_table(), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
