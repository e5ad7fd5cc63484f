"""Speed of the Chinchilla fits: converged fit, 1000-resample bootstrap, the paper preset, and the paper's loop
written the plain way (autograd + torch.optim.Adam), which the preset must equal bit for bit.

Prints wall times measured in one run (the machine is shared: compare ratios, not absolute numbers) and writes
benchmarks/out/bench_fit.json. Targets: converged fit < 0.1 s, 1000-resample bootstrap < 10 s on 2 cores.

    python benchmarks/bench_fit.py [--quick] [--repeats 5]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np

from depthlib import data, scaling


def plain_torch_adam(points: scaling.Points, steps: int) -> np.ndarray:
    """The paper's procedure written the plain way: torch eager, autograd, torch.optim.Adam, one start, with the
    original's dtypes (float64 ln c and data, 0-d float32 exponents and L0; paper App. B)."""
    import torch
    torch.set_num_threads(1)   # as the paper preset does: a second thread only spin-waits on these tiny tensors
    f = points.frame
    m, ell = torch.tensor(f["d_model"].to_numpy(float)), torch.tensor(f["n_layers"].to_numpy(float)) * 100
    D, loss = torch.tensor(f["num_tokens"].to_numpy(float)) / 1e6, torch.tensor(f["loss"].to_numpy(float))
    log_c = torch.tensor(scaling.PAPER_START[:3], requires_grad=True)
    alpha = torch.tensor(scaling.PAPER_START[3:6], dtype=torch.float32, requires_grad=True)
    l0 = torch.tensor(scaling.PAPER_START[6], dtype=torch.float32, requires_grad=True)
    opt = torch.optim.Adam([{"params": [log_c], "lr": 5e-3}, {"params": [alpha], "lr": 5e-4},
                            {"params": [l0], "lr": 5e-3}])
    for _ in range(steps):
        opt.zero_grad()
        (c_m, c_l, c_D), (a_m, a_l, a_D) = log_c, alpha
        pred = (c_D - a_D * D.log()).exp() + (c_m - a_m * m.log()).exp() + (c_l - a_l * ell.log()).exp() + l0
        risk = 100 * (loss.log() - pred.log()).pow(2).mean()
        risk.backward()
        opt.step()
    return np.concatenate([log_c.detach().numpy(), alpha.detach().double().numpy(), [l0.item()]])


def timed(fn, repeats: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repeats and a 5k-step Adam loop (time scaled to 50k)")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    repeats = 2 if args.quick else args.repeats
    adam_steps = 5_000 if args.quick else 50_000

    df = data.chinchilla()
    points = scaling.select_points(df)
    t_conv, fit = timed(lambda: scaling.fit_decomposed_law(df), repeats)
    t_boot, boot = timed(lambda: scaling.bootstrap(df, n_resamples=1000, seed=0), max(1, repeats // 2))
    t_paper, preset = timed(lambda: scaling.adam_paper(points, steps=adam_steps)[0], 1)
    t_torch, plain = timed(lambda: plain_torch_adam(points, adam_steps), 1)
    scale = 50_000 / adam_steps
    report = {
        "cores": os.cpu_count(),
        "converged_fit_s": round(t_conv, 4),
        "bootstrap_1000_s": round(t_boot, 3),
        "paper_preset_adam_50k_s": round(t_paper * scale, 2),
        "paper_preset_equals_plain_loop_bitwise": bool(np.array_equal(preset, plain)),
        "plain_torch_adam_50k_s": round(t_torch * scale, 2),
        "speedup_converged_vs_plain_adam": round(t_torch * scale / t_conv, 1),
        "plain_bootstrap_1000_estimate_s": round(1000 * t_torch * scale, 0),
        "speedup_bootstrap_vs_plain": round(1000 * t_torch * scale / t_boot, 0),
        "alpha_l_converged": round(fit.param("alpha_l"), 4),
        "bootstrap_converged": int(boot["converged"].sum()),
        "adam_steps_timed": adam_steps,
    }
    for key, value in report.items():
        print(f"{key:40s} {value}")
    out = Path(__file__).parent / "out"
    out.mkdir(exist_ok=True)
    (out / "bench_fit.json").write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
