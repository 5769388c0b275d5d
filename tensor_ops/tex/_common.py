"""Argument checks shared by the tex families (run once, before dispatch)."""
from __future__ import annotations

import logging
import numbers

import torch

log = logging.getLogger("tensor_ops.tex")

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def check_quantizer(op: str, quantizer) -> None:
    if quantizer is not None:
        raise NotImplementedError(
            f"tex.{op}: quantizer {type(quantizer).__module__}.{type(quantizer).__qualname__} is not "
            f"supported (FP8/MXFP8/NVFP4 quantization is out of scope); pass quantizer=None")


def check_tensor(op: str, name: str, t, *, optional: bool = False, float_only: bool = False) -> None:
    if t is None and optional:
        return
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"tex.{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if float_only and t.dtype not in FLOAT_DTYPES:
        raise TypeError(f"tex.{op}: {name} has dtype {t.dtype}; expected one of "
                        f"{sorted(str(d) for d in FLOAT_DTYPES)}")


def check_same_device(op: str, **tensors) -> None:
    if all(t is None or (isinstance(t, torch.Tensor) and t.is_cpu) for t in tensors.values()):
        return  # the common case, without a torch.device per tensor
    devs = {n: t.device for n, t in tensors.items() if isinstance(t, torch.Tensor)}
    if len(set(devs.values())) > 1:
        desc = ", ".join(f"{n} on {d}" for n, d in devs.items())
        raise ValueError(f"tex.{op}: tensors are on different devices ({desc}); move them to one device")


def check_shape(op: str, name: str, t: torch.Tensor, shape) -> None:
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"tex.{op}: {name} has shape {tuple(t.shape)}, expected {tuple(shape)}")


def nargs_error(op: str, expected: str, got: int) -> TypeError:
    return TypeError(f"tex.{op}() takes {expected} positional arguments but {got} were given")


def rows_2d(t: torch.Tensor) -> torch.Tensor:
    """View as (N, H) with N = product of leading dims."""
    h = t.shape[-1] if t.dim() else 1
    return t.reshape(-1, h)


def as_float(op: str, name: str, v) -> float:
    """A real-number argument as float, with an error that names it."""
    if isinstance(v, (int, float, numbers.Real)) and not isinstance(v, bool):
        return float(v)
    if isinstance(v, torch.Tensor) and v.numel() == 1 and v.dtype.is_floating_point:
        return float(v)
    if isinstance(v, str):
        raise ValueError(f"tex.{op}: {name}={v!r} is not a number; pass a float")
    raise TypeError(f"tex.{op}: {name} must be a real number, got {type(v).__name__} {v!r}")


def as_int(op: str, name: str, v) -> int:
    if isinstance(v, (int, numbers.Integral)) and not isinstance(v, bool):
        return int(v)
    if isinstance(v, bool):
        return int(v)
    raise TypeError(f"tex.{op}: {name} must be an int, got {type(v).__name__} {v!r}")
