"""Chapter 7, toy part: looped students (one residual block applied ℓ times with step 1/ℓ) in chapter 3's toy."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from depthlib.compose import looped_toy as lt
from depthlib.toy import converged
from depthlib.toy.models import MLP, ResidualNet, ToyShape, derive_seed, init_student, make_teacher, rms_norm

SHAPE = ToyShape(d_model=8, d_mlp=32, teacher_depth=8)
PROTOCOL = converged.ConvergedConfig("smoke", cells=((1.0, 1.0, 1), (0.0, 1.0, 1)), depths=(2, 4, 8), steps_deepest=20,
                                     batch=16, pool_batches=4, evals=5, eval_batches=2, eval_batch_size=64,
                                     teacher_depth=16, d_model=8)


pytestmark = pytest.mark.usefixtures("one_torch_thread")   # small ops: one thread is fastest


def _cfg(**protocol) -> lt.LoopedToyConfig:
    return lt.LoopedToyConfig("smoke", dataclasses.replace(PROTOCOL, **protocol)).validate()


def _block(seed: int = 0, scale: float = 0.3) -> "lt.StudentWeights":
    """A trained-looking block: default W_up, b_up and a non-zero W_down."""
    cfg = _cfg()
    w = init_student(1, seed, cfg.training("scratch"), PROTOCOL.shape(), fixed_head=torch.randn(PROTOCOL.shape().vocab, 8))
    g = torch.Generator().manual_seed(seed + 1)
    return dataclasses.replace(w, W_down=torch.randn(w.W_down.shape, generator=g) * scale / 32 ** 0.5)


def _engine(cfg, depth: int, block=None, seed: int = 0) -> lt.LoopedStudents:
    teacher = make_teacher(1.0, seed, cfg.protocol.shape())
    pool = converged.make_pool(cfg.protocol, teacher, 0)
    spec = converged.StudentSpec(0, 1.0, depth, derive_seed(0, "s", depth))
    eng = lt.LoopedStudents(*pool, 7, [teacher], [spec], cfg.training("scratch"), 100, data_seeds=[0], test_seeds=[1],
                            batch=cfg.protocol.batch, eval_batches=1, eval_batch_size=32, shape=cfg.protocol.shape(),
                            chunk=1)
    if block is not None:
        eng.load_block(block)
    return eng


def _hidden(eng: lt.LoopedStudents, x: torch.Tensor) -> torch.Tensor:
    h0, _ = converged._rms(x[None], eng.eps)
    hL, _ = eng._forward(0, 1, h0, save=False)
    return hL[0]


def test_l_applications_of_one_block_are_l_calls_of_that_block():
    """The engine's depth-ℓ looped student equals calling the one block (an ``MLP`` module) ℓ times, and equals the
    chapter-3 reference network built from the looped weights."""
    cfg, block = _cfg(), _block()
    x = torch.randn(32, 8, generator=torch.Generator().manual_seed(3))
    mlp = MLP(SHAPE)
    with torch.no_grad():
        mlp.up.weight.copy_(block.W_up[0])
        mlp.up.bias.copy_(block.b_up[0])
        mlp.down.weight.copy_(block.W_down[0])
    for depth in (1, 3, 5):
        eng = _engine(cfg, depth, block)
        calls = 0
        h = rms_norm(x)
        with torch.no_grad():
            for _ in range(depth):
                h = h + mlp(h)
                calls += 1
        assert calls == depth
        torch.testing.assert_close(_hidden(eng, x), h, rtol=1e-5, atol=1e-6)
        ref = ResidualNet.from_weights(lt.looped_weights(block, depth), SHAPE, "euler", "fixed")
        with torch.no_grad():
            torch.testing.assert_close(ref.hidden(x, all_states=True)[-1], h, rtol=1e-5, atol=1e-6)


def test_parameter_count_does_not_depend_on_depth():
    cfg = _cfg()
    counts = set()
    for depth in (1, 2, 8):
        eng = _engine(cfg, depth)
        counts.add(sum(p.numel() for p in eng._shared))
        counts.add(lt.n_parameters(eng.export_block()))
    d, H = 8, 32
    assert counts == {H * d + H + d * H}


def test_one_step_is_adam_on_the_tied_weights():
    """One engine step equals torch.optim.Adam on (W_up, b_up, V) of the looped network written with autograd
    (h += V/ℓ · ReLU(W_up·RMSNorm(h) + b)², KL to the teacher's tempered logits through its fixed head); afterwards
    every layer holds the same block."""
    cfg, block, depth = _cfg(), _block(2), 4
    eng = _engine(cfg, depth, block)
    x = eng.pool_x[0]
    target = torch.log_softmax(eng.pool_logits[0], -1)
    Wu = block.W_up[0].clone().requires_grad_()
    b = block.b_up[0].clone().requires_grad_()
    V = (block.W_down[0] * depth).clone().requires_grad_()
    opt = torch.optim.Adam([Wu, b, V], lr=eng.train.base_lr(depth) * eng.train.schedule(0, eng.total_steps),
                           betas=eng.train.betas, eps=eng.train.eps)
    h = rms_norm(x)
    for _ in range(depth):
        h = h + (torch.relu(rms_norm(h) @ Wu.T + b) ** 2) @ (V / depth).T
    logits = rms_norm(h) @ eng.export_block().head.T
    loss = torch.nn.functional.kl_div(torch.log_softmax(logits, -1), target, reduction="batchmean", log_target=True)
    opt.zero_grad()
    loss.backward()
    opt.step()
    eng.pool_gen.manual_seed(0)
    eng.draw_batch = lambda: x[None]
    eng._pending = None
    eng.teacher_outputs = lambda _x: eng.pool_logits[0][None]
    eng.step()
    out = eng.export_block()
    torch.testing.assert_close(out.W_up[0], Wu.detach(), rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(out.b_up[0], b.detach(), rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(out.W_down[0] * depth, V.detach(), rtol=1e-4, atol=1e-6)
    for j in range(1, depth):
        assert torch.equal(eng.Wu[j], eng.Wu[0]) and torch.equal(eng.b[j], eng.b[0]) and torch.equal(eng.Wd[j], eng.Wd[0])


def test_halving_reproduces_the_function_up_to_discretisation():
    """The depth-2ℓ student with W_down halved integrates the same flow with half the step: its output is close to the
    depth-ℓ student's, and the gap shrinks about in proportion to the step (first-order Euler)."""
    cfg, block = _cfg(), _block(4, scale=1.0)
    x = torch.randn(256, 8, generator=torch.Generator().manual_seed(5))
    gaps = []
    for depth in (4, 8, 16):
        coarse = _hidden(_engine(cfg, depth, block), x)
        fine = _hidden(_engine(cfg, 2 * depth, lt.halve(block)), x)
        move = (coarse - rms_norm(x)).norm(dim=-1).mean()
        gaps.append(float((fine - coarse).norm(dim=-1).mean() / move))
        block = lt.halve(block)          # the next pair: depth 2ℓ against 4ℓ, the same flow again
    assert gaps[0] < 0.2
    assert gaps[1] < 0.7 * gaps[0] and gaps[2] < 0.7 * gaps[1]


def test_halving_keeps_the_flow():
    """halve() keeps W_up, b_up and the vector field V = ℓ·W_down."""
    block = _block(1)
    half = lt.halve(block)
    assert torch.equal(half.W_up, block.W_up) and torch.equal(half.b_up, block.b_up)
    torch.testing.assert_close(half.W_down * 8, block.W_down * 4)


def test_the_euler_block_is_the_tied_teacher():
    """At the teacher's own depth the Euler looped student is the teacher (its one block, W_down unchanged): the
    held-out loss starts at 0; at half the depth it is the same flow with twice the step."""
    cfg = _cfg()
    teacher = make_teacher(1.0, 0, cfg.protocol.shape())
    block = lt.euler_block(teacher, teacher.depth)
    torch.testing.assert_close(block.W_down[0], teacher.W_down[0])
    eng = _engine(cfg, teacher.depth, block)
    assert float(eng.evaluate()[0]) < 1e-8
    half = lt.euler_block(teacher, teacher.depth // 2)
    torch.testing.assert_close(half.W_down, block.W_down * 2)


def test_signatures_of_the_euler_block_at_the_teachers_depth_are_the_teachers(tmp_path):
    """A known answer for the signature measurement: the Euler looped student at ℓ = ℓ* is the tied teacher, so
    :func:`looped_toy.signatures` must give it the teacher's own signatures and long-lag cosines (the same network
    built two ways: from the stored block applied ℓ* times, and from the teacher's weights)."""
    import pandas as pd

    from depthlib import results
    cfg = _cfg(cells=((1.0, 1.0, 1),))
    cell = cfg.units()[0]
    teacher = lt.unit_teacher(cfg, cell)
    store = results.Run(lt.EXPERIMENT, {}, tmp_path)
    torch.save(lt.euler_block(teacher, teacher.depth), tmp_path / f"{lt.unit_name(cell, teacher.depth, 'euler')}.pt")
    best = pd.DataFrame([{"teacher": "tied", **cell, "depth": teacher.depth, "route": "euler"}])
    sig, lag = lt.signatures(cfg, best, store)
    cols = ["layer", "theta_step", "step_norm", "rel_step", "theta_update"]
    s, t = (sig[sig["net"] == net][cols].reset_index(drop=True) for net in ("looped student", "teacher"))
    pd.testing.assert_frame_equal(s, t, rtol=1e-9, atol=1e-12)
    a, b = (lag[lag["net"] == net][["lag", "cos"]].reset_index(drop=True) for net in ("looped student", "teacher"))
    pd.testing.assert_frame_equal(a, b, rtol=1e-9, atol=1e-12)
    assert (lag.loc[lag["net"] == "teacher", "cos"] > 0.3).all(), "a tied teacher's updates point the same way"


def test_depths_must_double_and_stay_below_the_teacher():
    with pytest.raises(lt.InputError):
        _cfg(depths=(2, 4, 6))
    with pytest.raises(lt.InputError):
        _cfg(depths=(2, 4, 8, 16))


def test_a_tiny_run_trains_converges_and_resumes(cache):
    """A tiny run of both teachers: the looped students learn (held-out loss falls from the identity start), the
    deeper ones start from the halved shallower one, every student's relative improvement is the protocol's, the
    α_ℓ tables exist; a second call loads the finished run."""
    cfg = lt.LoopedToyConfig("smoke", dataclasses.replace(PROTOCOL, steps_deepest=100),
                             continuations=1).validate()
    run = lt.run_looped_toy(cfg, progress=False)
    rows, curves = run.table("looped"), run.table("curves")
    assert set(rows["teacher"]) == {"tied", "independent"}
    scratch = rows[rows["route"] == "scratch"]
    assert (scratch["test_loss"] < scratch["initial_loss"] / 2).all()
    assert (rows["test_loss"] < 1.05 * rows["initial_loss"]).all()     # a warm start is not trained away
    assert set(rows.loc[rows["depth"] > 2, "route"]) <= {"halved", "euler", "continued1"}
    assert set(rows.loc[rows["route"] == "euler", "teacher"]) == {"tied"}
    assert (rows.groupby("teacher")["depth"].nunique() == len(PROTOCOL.depths)).all()
    assert (rows.loc[rows["route"] == "halved", "initial_loss"].to_numpy()
            < rows.loc[rows["route"] == "scratch", "initial_loss"].max()).all()
    for r in rows.itertuples():
        c = curves[(curves["teacher"] == r.teacher) & (curves["depth"] == r.depth) & (curves["route"] == r.route)]
        assert r.rel_improvement_last20 == pytest.approx(converged.relative_improvement(c))
        assert r.converged == (r.rel_improvement_last20 < converged.CONVERGED_BELOW)
    assert rows["parameters"].nunique() == 1
    tied = rows[(rows["teacher"] == "tied") & (rows["route"] == "scratch")].iloc[0]
    assert tied["converged"], "the tiny tied looped student meets the 1 % rule"
    assert set(run.table("alpha_summary")["teacher"]) == {"tied", "independent"}
    sig = run.table("signatures")
    assert set(sig["net"]) == {"looped student", "teacher"}
    assert len(sig[sig["net"] == "looped student"].groupby(["teacher", "depth"])) == len(run.table("best"))
    assert run.table("lags")["cos"].between(-1 - 1e-9, 1 + 1e-9).all()
    again = lt.run_looped_toy(cfg, progress=False)
    assert again.path == run.path and again.table("best").equals(run.table("best"))
    # the chapter's views and figures of a toy run (here set beside itself in place of chapter 3's run)
    from depthlib import plots
    from depthlib.compose import analysis, chapter
    from depthlib.plots import compose as figs
    losses, alphas = analysis.toy_losses(run, run), analysis.toy_alphas(run, run)
    assert set(losses["kind"]) == {"looped", analysis.TOY_CHAIN, "untied"} and (losses["n"] == 1).all()
    assert set(losses.loc[losses["kind"] == analysis.TOY_CHAIN, "teacher"]) == {"tied"}
    assert len(alphas) == 5 and alphas["alpha"].notna().all()
    for fig in (figs.toy_loss_vs_depth(losses), figs.toy_alpha_forest(alphas)):
        assert plots.figure_problems(fig) == []
    rep = chapter.replay(run)
    assert len(rep) == 2 and rep["committed"].notna().all()
    assert np.allclose(rep["committed"], rep["replayed"], rtol=1e-6)       # same machine: bit for bit up to float
    s = chapter.summary(run)
    assert set(s["alpha"]) == {"tied", "independent"} and len(s["rel_improvement"]) == len(run.table("best"))


def test_the_chapter_registers_the_toy_part():
    from depthlib import results
    from depthlib.chapters import by_name, compute_entry
    from depthlib.compose import chapter
    assert by_name("compose").owns(lt.EXPERIMENT)
    assert compute_entry(lt.EXPERIMENT) == "depthlib.compose.looped_toy:run_looped_toy"
    assert "depthlib.compose.looped_toy" in results.compute_modules(compute_entry(lt.EXPERIMENT))
    for name, prof in chapter.PROFILES.items():
        assert chapter.ComposeProfile.from_dict(prof.to_dict()) == prof, name
        cfg = prof.toy.validate()
        assert lt.LoopedToyConfig.from_dict(cfg.to_dict()) == cfg
        assert len(cfg.protocol.depths) >= 4, "α_ℓ (2 parameters) is fitted on at least 4 depths"
