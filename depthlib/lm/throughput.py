"""How fast the series trains, against what this machine's fp32 matmul can do (its budget and throughput).

The *ceiling* is the rate of one large square fp32 ``torch.mm`` on the training device: what dense linear algebra
reaches here. The *fraction* of it that training achieves is (training FLOPs, :func:`depthlib.lm.model.flops_per_token`
× tokens) / wall time / ceiling. The numbers describe a run; they never decide a result.
"""
from __future__ import annotations

import time


def matmul_ceiling(device: str = "cpu", n: int = 1024, reps: int = 8, rounds: int = 3) -> float:
    """fp32 GFLOP/s of an (n × n) @ (n × n) matmul on ``device``, the best of ``rounds`` timings of ``reps`` products."""
    import torch
    dev = torch.device(device)
    a = torch.randn(n, n, device=dev)
    b = torch.randn(n, n, device=dev)

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
    torch.mm(a, b)
    sync()
    best = 0.0
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(reps):
            torch.mm(a, b)
        sync()
        best = max(best, 2.0 * n ** 3 * reps / (time.perf_counter() - t0) / 1e9)
    return best


def achieved(flop: float, seconds: float, ceiling_gflops: float | None = None) -> dict:
    """GFLOP/s of ``flop`` in ``seconds`` and, given the ceiling, the fraction of it."""
    rate = flop / max(seconds, 1e-12) / 1e9
    out = {"gflop_per_s": rate}
    if ceiling_gflops:
        out["matmul_gflop_per_s"] = ceiling_gflops
        out["fraction_of_matmul"] = rate / ceiling_gflops
    return out
