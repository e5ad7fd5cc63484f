"""The converged-loss protocol of chapter 3 (depthlib.toy.converged): warm starts, schedule, pooled engine,
convergence figure, resumable units."""
from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
import torch

from depthlib.errors import InputError
from depthlib.toy import converged as C
from depthlib.toy.engine import BatchedStudents, StudentSpec
from depthlib.toy.models import ResidualNet, ToyShape, derive_seed, make_teacher, rms_norm, variant

SHAPE = ToyShape(d_model=8, d_mlp=32, vocab=16, teacher_depth=16)
CFG = C.ConvergedConfig("smoke", cells=((1.0, 1.0, 1), (0.0, 1.0, 1)), depths=(2, 4, 8), steps_deepest=20, batch=16,
                        pool_batches=4, evals=5, eval_batches=2, eval_batch_size=32, teacher_depth=16, d_model=8)


def _shape(cfg=CFG):
    return dataclasses.replace(cfg.shape(), vocab=128)


def test_euler_warm_start_is_the_coarse_discretisation():
    """Student = ℓ explicit Euler steps of the tied teacher's flow dh/dt = ℓ*·f(h) over t ∈ [0, 1], i.e. step ℓ*/ℓ
    (computed here independently in float64)."""
    t = make_teacher(1.0, 3, SHAPE)
    x = torch.randn(64, SHAPE.d_model, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    Wu, b, Wd = t.W_up[0].double(), t.b_up[0].double(), t.W_down[0].double()

    def f(h):
        return (torch.relu(rms_norm(h) @ Wu.T + b) ** 2) @ Wd.T

    for depth in (2, 4, 16):
        h = rms_norm(x)
        for _ in range(depth):
            h = h + (SHAPE.teacher_depth / depth) * f(h)
        student = ResidualNet.from_weights(C.euler_student(t, depth), SHAPE, "euler", "fixed").double()
        torch.testing.assert_close(student.hidden(x, all_states=True)[-1], h, rtol=1e-12, atol=1e-12)
    # at depth ℓ* the discretisation is the teacher itself
    teacher = ResidualNet.from_weights(t, SHAPE, "euler", "fixed")
    student = ResidualNet.from_weights(C.euler_student(t, SHAPE.teacher_depth), SHAPE, "euler", "fixed")
    torch.testing.assert_close(student.hidden(x.float()), teacher.hidden(x.float()), rtol=0, atol=0)
    with pytest.raises(InputError):
        C.euler_student(make_teacher(0.0, 3, SHAPE), 4)


def test_split_changes_the_output_by_order_step_squared():
    """Splitting every block into two half steps changes h_ℓ by O(step²): shrinking every W_down by 2 shrinks the
    change 4× (measured 4.01, 4.00, 4.00 over three halvings; the state's displacement only halves: 1.35 → 0.17 while
    the change falls 0.079 → 0.0012)."""
    t = make_teacher(0.0, 5, SHAPE)
    x = torch.randn(256, SHAPE.d_model, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    base = C.euler_student(make_teacher(1.0, 5, SHAPE), 4)
    base = dataclasses.replace(base, W_up=t.W_up[:4].clone(), b_up=t.b_up[:4].clone(), W_down=t.W_down[:4] * 4)
    diffs = []
    torch.set_grad_enabled(False)
    for eps in (1.0, 0.5, 0.25, 0.125):
        w = dataclasses.replace(base, W_down=base.W_down * eps)
        a = ResidualNet.from_weights(w, SHAPE, "euler", "fixed").double().hidden(x, all_states=True)[-1]
        s = ResidualNet.from_weights(C.split_student(w), SHAPE, "euler", "fixed").double().hidden(x, all_states=True)[-1]
        diffs.append(float((a - s).norm(dim=-1).mean()))
    torch.set_grad_enabled(True)
    ratios = np.array(diffs[:-1]) / np.array(diffs[1:])
    assert np.all((ratios > 3.8) & (ratios < 4.2)), ratios
    assert C.split_student(base).W_up.shape[0] == 8


def test_schedule_warmup_constant_decay_then_final():
    tr = C.training("scratch", 0.1)
    n = 1000
    m = [tr.schedule(s, n) for s in range(n)]
    assert m[0] == pytest.approx(1 / 20) and m[19] == pytest.approx(1.0)       # 2 % warm-up
    assert m[20] == m[499] == 1.0
    assert 0.1 < m[650] < 1.0 and np.all(np.diff(m[500:800]) <= 0)
    assert set(m[800:]) == {0.1}                                              # the last 20 %: the final lr
    assert C.training("euler", 0.1).base_lr(16) == pytest.approx(0.1 * tr.base_lr(16))
    assert tr.base_lr(16) == pytest.approx(6e-4 * 4 / 4)                      # exp-9-3: 2.4e-3/√ℓ


def test_relative_improvement_is_the_last_fifth():
    curve = pd.DataFrame({"step": [0, 20, 40, 60, 80, 100], "test_loss": [9.0, 5.0, 4.0, 3.0, 2.0, 1.9]})
    assert C.relative_improvement(curve) == pytest.approx((2.0 - 1.9) / 2.0)
    with pytest.raises(InputError):
        C.relative_improvement(curve[curve["step"] != 80])


def test_steps_and_validation():
    cpu = C.ConvergedConfig("cpu", steps_deepest=4000)
    assert [cpu.steps(d) for d in cpu.depths] == [32000, 16000, 12000, 8000, 6000, 4000]
    assert all(cpu.steps(d) % cpu.evals == 0 for d in cpu.depths)
    with pytest.raises(InputError):
        dataclasses.replace(CFG, evals=4).validate()
    with pytest.raises(InputError):
        dataclasses.replace(CFG, cells=((0.5, 1.0, 1),)).validate()
    assert C.ConvergedConfig.from_dict(CFG.to_dict()) == CFG


def test_pooled_engine_equals_the_live_teacher_on_the_same_inputs():
    """The pool holds the live teacher's logits of its inputs, and a pooled student trains as a live-teacher student
    fed the same batches. Tolerance: the pool's teacher forward runs 64 batches per matmul, the live one a batch at a
    time; fp32 kernels block these shapes differently, so logits agree to a few float32 ulps (rtol 1e-5), and ten
    Adam steps on them to 1e-4."""
    cfg = dataclasses.replace(CFG, d_model=32)
    t = make_teacher(1.0, 2, cfg.shape())
    pool = C.make_pool(cfg, t, 0)
    spec = [StudentSpec(0, 1.0, 4, 7)]
    kw = dict(batch=cfg.batch, eval_batches=2, eval_batch_size=32, shape=cfg.shape(), chunk=1)
    pooled = C.PooledStudents(*pool, 11, [t], spec, variant("exp-9-3"), 10, **kw)
    live = BatchedStudents([t], spec, variant("exp-9-3"), 10, **kw)
    torch.testing.assert_close(live.teacher_outputs(pool[0][:1]), pool[1][:1], rtol=1e-5, atol=1e-6)
    seen = set()
    for _ in range(10):
        x = pooled.draw_batch()                      # picks a pool batch; its logits are used by the next step
        seen.add(pooled._pending)
        torch.testing.assert_close(pooled.step(x), live.step(x), rtol=1e-4, atol=1e-7)
    assert len(seen) > 1
    torch.testing.assert_close(pooled.evaluate(), live.evaluate(), rtol=1e-4, atol=1e-7)


def test_unit_resumes_to_the_uninterrupted_result():
    cell = {"rho": 1.0, "temperature": 1.0, "replicate": 0}
    store: dict = {}

    def load(route, depth):
        return store.get((route, depth))

    def save(route, depth, w, curve, row):
        store[(route, depth)] = (w, curve, row)

    rows, curves = C.train_unit(CFG, cell, load, save)
    full = pd.DataFrame(rows)
    assert {"scratch", "euler", "progressive"} <= set(full["route"])
    assert set(full.loc[full["route"] == "progressive", "depth"]) == {4, 8}
    for depth, g in full.groupby("depth"):     # a continuation follows exactly when the best so far is not converged
        routes = list(g["route"])
        base = g[~g["route"].str.startswith("continued")]
        first = base.loc[base["test_loss"].idxmin()]
        assert ("continued1" in routes) == (not first["converged"])
        if "continued1" in routes:
            assert g.loc[g["route"] == "continued1", "start"].iloc[0] == first["route"]

    partial: dict = {}
    calls = {"n": 0}

    def save_then_die(route, depth, w, curve, row):
        partial[(route, depth)] = (w, curve, row)
        calls["n"] += 1
        if calls["n"] == 4:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        C.train_unit(CFG, cell, lambda r, d: partial.get((r, d)), save_then_die)
    rows2, curves2 = C.train_unit(CFG, cell, lambda r, d: partial.get((r, d)),
                                  lambda r, d, *a: partial.__setitem__((r, d), a))
    pd.testing.assert_frame_equal(pd.DataFrame(rows2), full)
    pd.testing.assert_frame_equal(pd.concat(curves2, ignore_index=True), pd.concat(curves, ignore_index=True))


def test_best_routes_alpha_and_separation():
    rows = []
    for teacher, alpha in (("tied", 3.0), ("independent", 1.0)):
        for r in range(3):
            for d in (6, 12, 24, 48):
                for route, factor in (("scratch", 1.5), ("progressive", 1.0)):
                    rows.append({"teacher": teacher, "rho": float(teacher == "tied"), "temperature": 1.0,
                                 "replicate": r, "depth": d, "route": route, "steps": 100,
                                 "test_loss": factor * (1 + 0.01 * r) * d ** -(alpha + 0.05 * r)})
    best = C.best_routes(pd.DataFrame(rows))
    assert set(best["route"]) == {"progressive"} and len(best) == 24
    per, summary = C.alpha_tables(best)
    tied = summary[summary["teacher"] == "tied"].iloc[0]
    assert tied["alpha"] == pytest.approx(3.05) and tied["replicates"] == 3 and tied["lo"] < 3.05 < tied["hi"]
    sep = C.separation(per)
    assert sep["diff"] == pytest.approx(2.0) and sep["n"] == 3
    slopes = C.local_slopes(best)
    assert np.allclose(slopes.loc[slopes["teacher"] == "independent"].groupby("replicate")["slope"].mean(),
                       [1.0, 1.05, 1.1])


def test_seeds_match_the_committed_calibration():
    """Replicate r of the protocol learns from the committed calibration's teacher r and is tested on its inputs."""
    from depthlib.toy.chapter import PROFILES
    from depthlib.toy.sweep import build_engine
    cal = dataclasses.replace(PROFILES["smoke"].calibration[0], steps=1)
    eng, _, teachers = build_engine(cal)
    t = make_teacher(1.0, derive_seed(cal.seed, "teacher", 0), cal.shape())
    torch.testing.assert_close(teachers[0].W_up, t.W_up, rtol=0, atol=0)
    g = torch.Generator().manual_seed(derive_seed(0, "test", 0))
    torch.testing.assert_close(eng.x_test[0], torch.randn((cal.eval_batches, cal.eval_batch_size, cal.d_model),
                                                          generator=g), rtol=0, atol=0)
