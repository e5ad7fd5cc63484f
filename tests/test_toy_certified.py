"""The certified protocol of chapter 3 (depthlib.toy.certified): schedule, group distillation, the pool and its exact
held-out check, the certificate, equal steps, resumable units and the fragility tables."""
from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
import torch

from depthlib.errors import InputError
from depthlib.toy import certified as C
from depthlib.toy.engine import BatchedStudents, StudentSpec
from depthlib.toy.models import ResidualNet, derive_seed, make_teacher, variant

CFG = C.CertifiedConfig("smoke", cells=((1.0, 1.0, 1), (0.0, 1.0, 1)), depths=(2, 4, 8), steps=20, batch=16,
                        pool_batches=24, evals=5, eval_batches=2, eval_batch_size=32, teacher_depth=16, d_model=8,
                        distill_inputs=256, distill_steps=10).validate()


def test_schedule_rewarms_holds_and_decays_to_the_final_rate():
    t = C.stage_training(0.1, 0.01)
    n = 1000
    m = [t.schedule(s, n) for s in range(n)]
    assert m[0] == pytest.approx(1 / 20) and m[19] == 1.0                    # warm-up over 2 % of the steps
    assert all(v == 1.0 for v in m[20:500])                                  # constant to 50 %
    assert m[-1] == pytest.approx(0.01 + 0.99 / 500) and m[-1] > 0.01        # linear to 1 % at the end
    assert all(a >= b for a, b in zip(m[500:], m[501:]))
    assert t.base_lr(16) == pytest.approx(0.1 * 6e-4 * 4 / 4)                # exp-9-3's 2.4e-3/√ℓ × the stage's scale


def test_group_distillation_recovers_the_teacher_when_groups_are_single_blocks():
    """With ℓ = ℓ* each group is one teacher block: the regression's features are that block's own, so the least-squares
    W_down is the teacher's (a known answer), and the distilled student's R² is 1 to float precision."""
    t = make_teacher(0.0, 4, CFG.shape())
    w, r2 = C.distilled_student(t, CFG.teacher_depth, dataclasses.replace(CFG, distill_steps=0), seed=1)
    torch.testing.assert_close(w.W_down, t.W_down, rtol=0, atol=2e-5)
    assert r2 > 1 - 1e-6
    # coarser groups: a tied teacher's group map is nearly one block with W_down × group size; an independent
    # teacher's is a sum of unrelated blocks, fitted less well (the untrained route says so by its R²)
    _, r2_tied = C.distilled_student(make_teacher(1.0, 4, CFG.shape()), 4, CFG, seed=1)
    _, r2_indep = C.distilled_student(t, 4, CFG, seed=1)
    assert r2_tied > 0.98 and r2_indep < r2_tied


def test_pool_targets_equal_the_live_teacher_and_no_heldout_input_is_in_the_pool():
    t = make_teacher(1.0, 2, CFG.shape())
    x, y = C.make_pool(CFG, t, 0)
    assert x.shape == y.shape == (CFG.pool_batches, CFG.batch, CFG.d_model)
    live = BatchedStudents([t], [StudentSpec(0, 1.0, 1, 0)], variant("exp-9-3"), 1, batch=CFG.batch,
                           eval_batches=1, eval_batch_size=8, shape=CFG.shape())
    logits = live.teacher_outputs(x[3][None])
    # the pool's states come from 64-batch teacher forwards, the live ones from one batch: the same float32 sums in
    # another blocking, so equal to a few float32 ulps of the O(1) logits after 16 blocks
    torch.testing.assert_close(torch.bmm(y[3][None], live.t_head), logits, rtol=0, atol=1e-5)
    eng = C.PoolStudents((x, y), 0, [t], [StudentSpec(0, 1.0, 2, 0)], variant("exp-9-3"), 5, batch=CFG.batch,
                         eval_batches=1, eval_batch_size=8, shape=CFG.shape())
    assert C.heldout_in_pool(x, eng.x_test) == 0
    planted = eng.x_test.clone()
    planted[0, 0, 3] = x[5, 7]                                    # one held-out input copied from the pool
    assert C.heldout_in_pool(x, planted) == 1
    seen = [eng.draw_batch() for _ in range(CFG.pool_batches)]    # one pass: every pool batch exactly once
    assert sorted(int((x == b[0]).all(-1).all(-1).nonzero()[0]) for b in seen) == list(range(CFG.pool_batches))


def _unit(cfg, cell, store, fail_after=None):
    calls = []

    def save(name, depth, student):
        if fail_after is not None and len(store) >= fail_after:
            raise KeyboardInterrupt
        store[(name, depth)] = student
        calls.append(name)

    stages, curves, cert = C.train_unit(cfg, cell, lambda n, d: store.get((n, d)), save)
    return stages, curves, cert, calls


def test_unit_certifies_by_continuation_gives_equal_steps_and_resumes_bit_for_bit():
    cell = {"rho": 1.0, "temperature": 1.0, "replicate": 0}
    stages, curves, cert, _ = _unit(CFG, cell, {})
    routes = stages[~stages["stage"].str.contains("+", regex=False)]
    assert set(routes["route"]) == {"scratch", "euler", "distilled", "progressive"}
    # every route trains the same number of steps at every depth; a continuation half of them
    assert set(routes["stage_steps"]) == {CFG.steps}
    # a continuation trains half the student's steps at its depth so far: 10 after the route's 20, then 15, then 25
    conts = stages[stages["stage"].str.contains("+", regex=False)]
    assert (conts["stage_steps"] == [CFG.continuation_steps(n) for n in conts["depth_steps"] - conts["stage_steps"]]).all()
    assert CFG.continuation_steps(20) == 10 and CFG.continuation_steps(30) == 15 and CFG.continuation_steps(45) == 25
    assert (routes["depth_steps"] == CFG.steps).all()
    assert list(cert["depth"]) == [2, 4, 8] and (cert["continuations"] >= 1).all()
    # certified exactly when the last continuation gained less than the threshold
    assert (cert["certified"] == (cert["last_continuation_gain"] < CFG.gain_below)).all()
    for r in cert.itertuples():                   # each gain is the continuation's own (initial − final) / initial
        last = stages[(stages["depth"] == r.depth) & (stages["stage"] == f"{r.route}+c{r.continuations}")]
        assert last["gain"].iloc[0] == pytest.approx(r.last_continuation_gain)
        assert r.test_loss <= stages.loc[stages["depth"] == r.depth, "test_loss"].min() + 0
    assert (cert["heldout_in_pool"] == 0).all()
    # interrupted after 5 saved stages, then resumed: the same tables, bit for bit
    store = {}
    with pytest.raises(KeyboardInterrupt):
        _unit(CFG, cell, store, fail_after=5)
    again, again_curves, again_cert, calls = _unit(CFG, cell, store)
    assert len(calls) == len(stages) - 5
    pd.testing.assert_frame_equal(again, stages)
    pd.testing.assert_frame_equal(again_cert, cert)
    pd.testing.assert_frame_equal(again_curves, curves)


def test_independent_teacher_has_no_euler_route_but_the_shared_warm_start():
    stages, _, _, _ = _unit(CFG, {"rho": 0.0, "temperature": 1.0, "replicate": 0}, {})
    assert "euler" not in set(stages["route"]) and "distilled" in set(stages["route"])
    assert stages.loc[stages["stage"] == "distilled", "distill_r2"].between(0, 1).all()


def _synthetic(alphas: dict, depths=(6, 12, 24, 48)) -> pd.DataFrame:
    rows = []
    for (teacher, rep), a in alphas.items():
        for d in depths:
            rows.append({"teacher": teacher, "rho": float(teacher == "tied"), "temperature": 1.0, "replicate": rep,
                         "depth": d, "route": "scratch", "stage": "scratch", "steps": 100,
                         "test_loss": 0.5 * d ** -a, "pool_loss": 0.5 * d ** -a, "certified": True})
    return pd.DataFrame(rows)


def test_fits_recover_known_exponents_and_their_difference():
    alphas = {("tied", 0): 3.0, ("tied", 1): 2.8, ("independent", 0): 1.0, ("independent", 1): 1.1}
    cert = _synthetic(alphas)
    sep = C.separation(cert)
    assert set(sep["fit"]) == {"all depths", "without ℓ = 6", "without ℓ = 12", "without ℓ = 24", "without ℓ = 48"}
    np.testing.assert_allclose(sep["diff"], 1.85, rtol=1e-12)             # exact power laws: every refit agrees
    frag = C.fragility(cert)
    assert "without ℓ ≤ 12" in set(frag["fit"])
    np.testing.assert_allclose(frag.loc[frag["teacher"] == "tied", "alpha"], 2.9, rtol=1e-12)
    slopes = C.local_slopes(cert)
    np.testing.assert_allclose(slopes.loc[slopes["replicate"] == -1].sort_values("teacher")["slope"],
                               [1.05] * 3 + [2.9] * 3, rtol=1e-12)
    gap = C.with_gap(cert.assign(pool_loss=cert["test_loss"] / 1.2))
    assert not gap["within_gap"].any() and gap["gap"].round(12).eq(0.2).all()
    assert (C.power_law_check(cert)["max_abs_log_residual"] < 1e-12).all()


def test_bad_settings_are_one_line_errors():
    for bad in ({"depths": (2, 4)}, {"cells": ((0.5, 1.0, 1),)}, {"steps": 21}, {"continuation": 0.0},
                {"decay_to": 0.0}, {"depths": (2, 4, 32)}):
        with pytest.raises(InputError):
            dataclasses.replace(CFG, **bad).validate()


def test_the_distilled_student_is_a_student_of_the_reference_network():
    """The distilled weights run in the plain nn.Module reference as the teacher's blocks do (shapes, fixed head)."""
    t = make_teacher(1.0, 6, CFG.shape())
    w, _ = C.distilled_student(t, 4, CFG, seed=derive_seed(0, "distill", 0, 4))
    net = ResidualNet.from_weights(w, CFG.shape(), "euler", "fixed")
    assert net.hidden(torch.randn(5, CFG.d_model)).shape == (5, CFG.d_model)
    assert torch.equal(w.head, t.fixed_head)


def test_smoke_run_merges_reports_and_draws(roots):
    """The smoke profile end to end through the chapter (units, merge, summary, findings, figures): every sentence
    carries its numbers and every figure draws marks with titled axes."""
    from depthlib import plots
    from depthlib.plots import toy as figs
    from depthlib.toy import chapter, views
    run = chapter.certified_run("smoke")
    cert, stages = run.table("certified"), run.table("stages")
    assert len(cert) == 6 * 3 and set(run.table("separation")["fit"]) >= {"all depths"}
    summary = chapter.summary(run)
    assert summary["heldout_in_pool"] == 0 and summary["students_certified"].endswith(f"of {len(cert)}")
    exponents = views.exponent_table(run)           # the tables that show the numbers, one row per fit
    envelope = exponents.xs("envelope", level="fit")
    assert len(envelope) == 3 and envelope["students certified"].str.endswith(" of 6").all()
    assert views.certificate_table(run).notna().to_numpy().sum() == len(cert) and len(views.separation_table(run))
    routes = stages[~stages["stage"].str.contains("+", regex=False)]
    for fig in (figs.converged_losses(cert, routes), figs.continuation_gains(stages, C.GAIN_BELOW),
                figs.alpha_by_fit(run.table("alpha_summary"), run.table("fragility")),
                figs.alpha_by_round(run.table("alpha_rounds"))):
        assert plots.figure_problems(fig) == []
    answer = views.certified_answer(run)
    assert answer.startswith(f"**{int(cert['certified'].sum())} of {len(cert)} students are certified**")
    for teacher, temp in (("tied", 1), ("independent", 1), ("tied", 0.01)):
        c = cert[(cert["teacher"] == teacher) & (cert["temperature"] == temp)]
        said = f"The {teacher} teacher at T = {temp:g} is " + ("certified" if c["certified"].all() else
                                                                "**undecided by the certificate**")
        assert said in answer
    uncertified = not cert[cert["temperature"] == 1]["certified"].all()
    assert ("not what the converged exponents are" in answer) == uncertified
    # the reading and the conclusion word the same tables: the certificate's count, the paired difference as the
    # separation table gives it, and "undecided" exactly when some student is not certified
    reading = views.certified_reading(run)
    n_cert = int(cert["certified"].sum())
    assert reading.startswith(f"**Reading it.** {n_cert} of {len(cert)} students are certified")
    every = run.table("separation").query("fit == 'all depths'").iloc[0]
    assert f"{every['diff']:+.2f} [{every['lo']:+.2f}, {every['hi']:+.2f}]" in reading
    assert ("the verdict counts the rows that rest on it as undecided" in reading) == (n_cert < len(cert))
    ending = views.conclusion({"certified": run})
    assert f"paired difference {every['diff']:+.2f}" in ending
    assert ("**undecided**" in ending) == (n_cert < len(cert))
    assert chapter.replay(run)[["committed", "replayed"]].notna().all().all()


def test_a_committed_unit_is_not_retrained_unless_it_is_stale(roots):
    """A run longer than a machine keeps its cache goes on from its committed units: a fresh committed unit of the
    same settings is returned as it is (nothing trains, its tables are the local unit's); one computed by other code
    (a changed fingerprint), or one of other settings, is not used."""
    import json
    import shutil

    from depthlib import results
    from depthlib.toy import chapter
    committed_root, local_root = roots
    cell = CFG.units()[0]
    local = results.Run.load(chapter.train_protocol_unit("certified", CFG.to_dict(), cell))
    assert local.path.is_relative_to(local_root) and list(local.path.glob("student_*.pt"))
    kept, table = results.commit_run(local), local.table("certified")
    assert not list(kept.glob("*.pt"))                       # tables and manifest only, never weights
    shutil.rmtree(local.path)
    again = results.Run.load(chapter.train_protocol_unit("certified", CFG.to_dict(), cell))
    assert again.path == kept and not local.path.exists()    # taken from data/results: nothing trained
    pd.testing.assert_frame_equal(again.table("certified"), table)
    assert chapter.committed_unit("certified", CFG.to_dict(), CFG.units()[1]) is None
    # a committed unit replays its own teacher's first student (tests/test_committed_runs.py): tied on the Euler
    # route, independent from scratch; the same code on the same machine gives the same numbers
    other = results.Run.load(chapter.train_protocol_unit("certified", CFG.to_dict(), CFG.units()[1]))
    for unit in (again, other):
        replayed = chapter.replay(unit)
        assert len(replayed) == 2 and replayed["committed"].notna().all()
        np.testing.assert_allclose(replayed["replayed"], replayed["committed"], rtol=1e-6)
    assert chapter.committed_unit("certified", dataclasses.replace(CFG, steps=40).to_dict(), cell) is None
    manifest = json.loads((kept / "manifest.json").read_text())
    (kept / "manifest.json").write_text(json.dumps({**manifest, "code_fingerprint": "000000000000"}))
    assert chapter.committed_unit("certified", CFG.to_dict(), cell) is None


def test_alpha_by_round_follows_the_best_loss_of_each_chain():
    """Round k takes each depth's lowest loss over its routes and continuations up to k: with losses that fall as
    ℓ^−1 on the routes and as ℓ^−2 after one continuation at every depth (known answers), α_ℓ is 1 then 2, and a
    chain that stopped keeps its last best loss."""
    rows = []
    for d in (2, 4, 8):
        rows += [dict(teacher="tied", temperature=1.0, replicate=0, depth=d, stage="scratch", test_loss=1.0 / d),
                 dict(teacher="tied", temperature=1.0, replicate=0, depth=d, stage="scratch+c1",
                      test_loss=1.0 / d ** 2)]
    rows.append(dict(teacher="tied", temperature=1.0, replicate=0, depth=8, stage="scratch+c2", test_loss=1.0 / 8 ** 3))
    out = C.alpha_by_round(pd.DataFrame(rows), 2).set_index("round")["alpha"]
    np.testing.assert_allclose(out[0], 1.0, rtol=1e-12)
    np.testing.assert_allclose(out[1], 2.0, rtol=1e-12)
    assert out[2] > 2.0                        # only ℓ = 8 moved on: depths 2 and 4 keep their round-1 losses
