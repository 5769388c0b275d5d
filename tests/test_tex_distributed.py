"""torch.distributed (gloo, 2 processes): the tex training step, data-parallel over a split batch,
gives the same parameters as one process on the concatenated batch."""
from __future__ import annotations

import os
import socket
import sys

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available in this torch build", allow_module_level=True)

from tensor_ops.tex import _testing as T  # noqa: E402

STEPS = 8


def _train(x_parts, t_parts, world, rank):
    params = [p.clone().requires_grad_(True) for p in T.mlp_params()]
    opt = T.TexAdamW(params, lr=1e-2)
    for step in range(STEPS):
        x, t = x_parts[step], t_parts[step]
        for p in params:
            p.grad = None
        loss = (T.mlp_tex(x, params) - t).square().mean()
        loss.backward()
        if world > 1:
            for p in params:
                dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
                p.grad /= world
        opt.step()
    return [p.detach() for p in params]


def _worker(rank, world, port, out_dir):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        xs, ts = [], []
        for step in range(STEPS):
            x, t = T.mlp_data(step, batch=4)
            half = x.shape[0] // world
            xs.append(x[rank * half:(rank + 1) * half])
            ts.append(t[rank * half:(rank + 1) * half])
        params = _train(xs, ts, world, rank)
        torch.save(params, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_gloo_two_processes_match_single_process(tmp_path):
    import torch.multiprocessing as mp
    mp.start_processes(_worker, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True, start_method="spawn")
    xs, ts = zip(*(T.mlp_data(step, batch=4) for step in range(STEPS)))
    single = _train(list(xs), list(ts), 1, 0)
    p0 = torch.load(tmp_path / "rank0.pt")
    p1 = torch.load(tmp_path / "rank1.pt")
    for a, b, s in zip(p0, p1, single):
        assert torch.equal(a, b)  # replicas stay identical
        torch.testing.assert_close(a, s, rtol=1e-5, atol=1e-6)
