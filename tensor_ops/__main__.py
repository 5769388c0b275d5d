"""``python -m tensor_ops info`` — explain the selection; ``python -m tensor_ops bench`` — the
benchmark engine (no build, no config write by default)."""
from __future__ import annotations

import argparse
import json
import sys


def _cmd_info(args) -> int:
    import tensor_ops as to
    try:
        to.reload_config()
    except ValueError as exc:
        print(f"configuration error: {exc}", file=sys.stderr)
        return 1
    # Resolve every facade op once (one small conformance case each) so the table shows the
    # order and the selection.
    from tensor_ops.testing import cases
    errors = {}
    for case in cases(dtypes=("float32",), shapes=("5x17",)):
        if case.variant:
            continue
        try:
            case.call()
        except Exception as exc:  # shown in the table, not fatal
            errors[case.op] = f"{type(exc).__name__}: {exc}"
    if not args.no_torch:
        import importlib.util
        if importlib.util.find_spec("torch") is not None:
            import tensor_ops.torch as tot      # registers the torch ops: the info says if that worked
            tot.register()
    info = to.get_backend_info()
    if args.json:
        print(json.dumps(info, indent=2, default=str))
    else:
        print(to.format_info(info))
        for op, e in errors.items():
            print(f"{op}: {e}")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tensor_ops")
    sub = p.add_subparsers(dest="cmd", required=True)
    pi = sub.add_parser("info", help="explain which backend serves each op and why")
    pi.add_argument("--json", action="store_true", help="print get_backend_info() as JSON")
    pi.add_argument("--no-torch", action="store_true", help="do not import torch (its ops stay unregistered)")
    pb = sub.add_parser("bench", help="benchmark ops × backends against the ceiling (a streaming copy of each "
                                      "op's own pages, timed in the same rounds)")
    try:
        from ._bench_cli import add_arguments
        add_arguments(pb)
    except ImportError:
        pass
    args = p.parse_args(argv)
    if args.cmd == "info":
        return _cmd_info(args)
    try:
        from ._bench_cli import run_cli
    except ImportError:
        print("the benchmark engine is not part of this build", file=sys.stderr)
        return 1
    return run_cli(args)


if __name__ == "__main__":
    raise SystemExit(main())
