"""Toy teacher-student engine (paper §4, App. C): teachers, batched training, fits, resume, CLI.

Everything runs on tiny settings (teacher depth 16, small batches); the whole file takes seconds on a CPU.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch

from depthlib import cli
from depthlib.errors import InputError
from depthlib.toy import analysis, chapter, sweep
from depthlib.toy.engine import BatchedStudents, StudentSpec
from depthlib.toy.models import ResidualNet, ToyShape, derive_seed, init_student, make_teacher, rms_norm, variant
from depthlib.toy.reference import train_alone

SHAPE = ToyShape(teacher_depth=8)


pytestmark = pytest.mark.usefixtures("one_torch_thread")   # small ops: one thread is fastest


# ---- teachers ------------------------------------------------------------------------------------------
def test_rho_edges_are_the_papers_teachers():
    """ρ=0: independent U(±1/√fan_in) draws per layer; ρ=1: the same tensors in every layer (paper App. C)."""
    L = 128
    indep, tied = make_teacher(0.0, 3), make_teacher(1.0, 3)
    d, H = 32, 128
    # tied: identical tensors across layers, after the 1/√ℓ* scaling of W_down
    for name in ("W_up", "b_up", "W_down"):
        w = getattr(tied, name)
        assert all(torch.equal(w[0], w[l]) for l in range(L)), name
    # independent: every layer differs, draws are uniform with PyTorch's nn.Linear bounds
    assert not torch.equal(indep.W_up[0], indep.W_up[1])
    assert indep.W_up.abs().max() <= 1 / math.sqrt(d)
    assert indep.b_up.abs().max() <= 1 / math.sqrt(d)
    assert indep.W_down.abs().max() <= 1 / math.sqrt(H) / math.sqrt(L)
    assert indep.W_down.abs().max() > 0.95 / math.sqrt(H) / math.sqrt(L)   # the scaling is 1/√ℓ*, not more
    var_uniform = 1 / (3 * d)                                              # Var U(−a, a) = a²/3
    assert abs(indep.W_up.var().item() / var_uniform - 1) < 0.01
    # same raw draws: ρ only mixes them, the head is shared
    assert torch.equal(indep.head, tied.head)
    assert torch.equal(make_teacher(0.0, 3).W_up, indep.W_up)              # seeded: reproducible


@pytest.mark.parametrize("rho", [0.0, 0.3, 0.7, 1.0])
def test_intermediate_rho_correlation_and_variance(rho):
    """Neighbouring layers correlate by ρ; the per-entry variance stays 1/(3·fan_in) (pooled over 6 teachers,
    because one teacher's shared draw is a single sample of 4096 entries)."""
    corrs, rel_vars = [], []
    for seed in range(6):
        w = make_teacher(rho, seed).W_up.reshape(128, -1)                  # (layers, entries)
        corrs.append(np.mean([np.corrcoef(w[l], w[l + 1])[0, 1] for l in range(127)]))
        rel_vars.append(w.var().item() * 3 * 32)
    assert abs(np.mean(corrs) - rho) < 0.02
    assert abs(np.mean(rel_vars) - 1) < 0.02


def test_bad_rho_is_input_error():
    with pytest.raises(InputError):
        make_teacher(1.2, 0)
    with pytest.raises(InputError):
        chapter.profile_config("smoke", rhos=[-0.1])


# ---- students -------------------------------------------------------------------------------------------
def test_zero_w_down_student_is_identity():
    train = variant("exp-9")
    w = init_student(7, 0, train, SHAPE)
    x = torch.randn(64, 32)
    states = ResidualNet.from_weights(w, SHAPE).hidden(x, all_states=True)
    assert torch.equal(states[0], rms_norm(x))
    assert all(torch.equal(states[0], s) for s in states)
    # masking: a trained student padded with zero-W_down blocks computes the same function
    w.W_down.normal_(0, 0.05)
    net = ResidualNet.from_weights(w, SHAPE)
    pad = init_student(10, 1, train, SHAPE)
    pad.W_up[:7], pad.b_up[:7], pad.W_down[:7] = w.W_up, w.b_up, w.W_down
    assert torch.equal(net.hidden(x), ResidualNet.from_weights(pad, SHAPE).hidden(x))


def _specs(depths=(1, 2, 4), temps=(1.0, 0.1)):
    return [StudentSpec(t, T, d, derive_seed(0, "s", d)) for t in (0, 1) for T in temps for d in depths]


@pytest.mark.parametrize("name,steps,check", [("exp-9", 200, (2, 7, 11)), ("exp-9-decay", 50, (2, 9)),
                                               ("exp-9-3", 50, (2, 9)), ("exp-9-2", 50, (2, 9)),
                                               ("exp-9-4", 50, (2, 9))])
def test_batched_equals_alone(name, steps, check):
    """Batched (chunks of 4, mixed depths, shared teachers) == engine with one student == plain autograd loop.

    Tolerances: batched vs engine-alone agree to 1e-6 relative (same arithmetic, only the batching differs);
    vs the plain nn.Module + torch.optim.Adam loop to 2e-5 relative over every step (measured ≤ 4e-6:
    fp32 rounding differences).
    """
    train = variant(name)
    teachers = [make_teacher(0.0, 1, SHAPE), make_teacher(1.0, 1, SHAPE)]
    specs = _specs()
    B = 48
    eng = BatchedStudents(teachers, specs, train, steps, data_seeds=[7], batch=B, chunk=4, shape=SHAPE)
    batched = torch.stack([eng.step() for _ in range(steps)]).double()     # (steps, K)
    for k in check:
        alone = BatchedStudents(teachers, [specs[k]], train, steps, data_seeds=[7], batch=B, shape=SHAPE)
        a = torch.stack([alone.step()[0] for _ in range(steps)]).double()
        torch.testing.assert_close(batched[:, k], a, rtol=1e-6, atol=0)
        ref, _ = train_alone(teachers[specs[k].teacher], specs[k], train, steps, B, 7, SHAPE)
        torch.testing.assert_close(batched[:, k], torch.tensor(ref, dtype=torch.float64), rtol=2e-5, atol=0)
    assert batched[-1].mean() < batched[0].mean()                          # it learns


def test_engine_is_bit_reproducible_and_evaluates():
    train = variant("exp-9")
    teachers = [make_teacher(0.5, 2, SHAPE)]
    specs = [StudentSpec(0, 0.3, d, derive_seed(1, d)) for d in (1, 4)]
    runs = []
    for _ in range(2):
        eng = BatchedStudents(teachers, specs, train, 30, batch=32, eval_batches=2, eval_batch_size=64, shape=SHAPE)
        losses = torch.stack([eng.step() for _ in range(30)])
        runs.append((losses, eng.evaluate(), eng.P.clone()))
    assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][2], runs[1][2])
    assert torch.equal(runs[0][1], runs[1][1]) and runs[0][1].shape == (2,)


# ---- analysis -------------------------------------------------------------------------------------------
def test_alpha_fit_recovers_known_exponent():
    rng = np.random.default_rng(0)
    depths = np.array([6, 12, 16, 24, 32, 48])
    rows = []
    for r in range(3):
        losses = 2.5 * depths ** -1.3 * np.exp(rng.normal(0, 0.02, len(depths)))
        rows += [{"rho": 1.0, "temperature": 0.5, "replicate": r, "step": 100, "depth": d, "test_loss": l}
                 for d, l in zip(depths, losses)]
    df = pd.DataFrame(rows)
    exact = analysis.fit_power_law(depths, 2.5 * depths ** -1.3)
    assert exact["alpha"] == pytest.approx(1.3, abs=1e-12) and exact["c"] == pytest.approx(2.5)
    summary = analysis.final_alpha(df)
    assert summary["alpha"].iloc[0] == pytest.approx(1.3, abs=0.05)
    assert summary["lo"].iloc[0] < 1.3 < summary["hi"].iloc[0]
    # a subset of depths and a single replicate still work
    one = analysis.final_alpha(df[df.replicate == 0], depths=[6, 24, 48])
    assert one["alpha"].iloc[0] == pytest.approx(1.3, abs=0.1)
    with pytest.raises(InputError):
        analysis.alpha_table(df, depths=[6])


def test_signatures_of_straight_and_random_walks():
    torch.manual_seed(0)
    h0 = torch.randn(50, 32)
    v = torch.randn(50, 32) * 0.1
    straight = torch.stack([h0 + l * v for l in range(9)])
    s = analysis.signatures(straight)
    assert np.allclose(s["theta_update"].iloc[:-1], 0, atol=1e-6)
    walk = torch.cumsum(torch.randn(200, 50, 512) * 0.01, 0)
    s = analysis.signatures(walk)
    assert abs(s["theta_update"].iloc[:-1].mean() - math.pi / 2) < 0.05
    assert len(s) == 199 and np.isnan(s["theta_update"].iloc[-1])


# ---- sweeps: cache and resume ---------------------------------------------------------------------------
TINY = sweep.SweepConfig("smoke", variant="exp-9-decay", cells=sweep.grid((0.0, 1.0), (1.0,)), depths=(1, 2, 4),
                         replicates=2, steps=30, batch=32, eval_every=10, eval_batches=2, eval_batch_size=64,
                         teacher_depth=8, signature_inputs=32)


def test_resume_does_not_redo_finished_work(tmp_path):
    full = sweep.run_sweep(TINY, root=tmp_path / "a", progress=False)
    assert full.manifest["steps_trained_this_call"] == 30
    assert sweep.run_sweep(TINY, root=tmp_path / "b", progress=False, stop_at_step=20) is None
    resumed = sweep.run_sweep(TINY, root=tmp_path / "b", progress=False)
    assert resumed.manifest["resumed_from_step"] == 20
    assert resumed.manifest["steps_trained_this_call"] == 10
    pd.testing.assert_frame_equal(full.table("curves"), resumed.table("curves"))   # bit for bit
    again = sweep.run_sweep(TINY, root=tmp_path / "b", progress=False)           # complete: loaded
    assert again.manifest == resumed.manifest
    curves = full.table("curves")
    assert set(curves.columns) >= {"rho", "temperature", "replicate", "depth", "step", "train_loss", "test_loss"}
    assert sorted(curves["step"].unique()) == [10, 20, 30] and len(curves) == 3 * 2 * 2 * 3
    alpha = full.table("alpha")
    assert len(alpha) == 2 and alpha["n_replicates"].eq(2).all()
    sig = full.table("signatures")
    assert set(sig["net"]) == {"student", "teacher"}


# ---- command line ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv", [["--rho", "1.5"], ["--rho", "-0.2"], ["--temperature", "0"], ["--depths", "0"],
                                  ["--steps", "0"], ["--device", "tpu"], ["--variant", "exp-42"],
                                  ["--profile", "huge"]])
def test_cli_bad_input_exit_2(argv, capsys):
    with pytest.raises(SystemExit) if argv[0] == "--profile" else _nullcontext():
        assert cli.main(["toy", *argv]) == 2
    assert "error" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA present")
def test_cli_cuda_absent_exit_2(capsys):
    assert cli.main(["toy", "--device", "cuda"]) == 2
    assert "cuda" in capsys.readouterr().err.lower()


def test_cli_json(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DEPTHLIB_CACHE_DIR", str(tmp_path))
    assert cli.main(["toy", "--steps", "8", "--depths", "1", "2", "--rho", "0", "1", "--temperature", "1",
                     "--threads", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["profile"] == "custom" and not out["meaningful"]
    assert [a["rho"] for a in out["alpha"]] == [0.0, 1.0]
    assert out["throughput"]["model_steps_per_s"] > 0


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


# ---- the hand-written backward, normalised teachers, honest intervals, long-lag signature ------
@pytest.mark.parametrize("name", ["exp-9", "exp-9-3", "exp-9-2", "exp-9-4"])
def test_backward_equals_float64_autograd(name, monkeypatch):
    """The engine's hand-written gradients (every weight, bias and head of mixed-depth students, random non-zero
    weights) equal float64 autograd through the plain nn.Module model to fp32 accuracy. Adam ignores a constant
    factor on a gradient, so the loss-trajectory tests cannot see one; this test can."""
    train = variant(name)
    teachers = [make_teacher(0.5, 4, SHAPE)]
    specs = [StudentSpec(0, T, d, derive_seed(3, d, T)) for d in (1, 3) for T in (1.0, 0.2)]
    eng = BatchedStudents(teachers, specs, train, 10, data_seeds=[5], batch=40, chunk=3, shape=SHAPE)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():                                   # random non-zero weights everywhere, W_down included
        eng.P.copy_(torch.randn(eng.P.shape, generator=g) * 0.2)
    x = torch.randn((1, 40, SHAPE.d_model), generator=g)
    monkeypatch.setattr(eng, "_adam", lambda: None)         # keep the gradients, skip the update
    eng.step(x)
    head = "none" if train.head == "none" else train.head
    teacher = ResidualNet.from_weights(teachers[0], SHAPE, "euler", "fixed" if head == "fixed" else "trained").double()
    for k, s in enumerate(specs):
        w = eng.export_student(k)
        net = ResidualNet.from_weights(w, SHAPE, train.block, head).double()
        if train.loss == "mse":
            target = teacher.hidden(x[0].double())
            loss = torch.nn.functional.mse_loss(net.hidden(x[0].double()), target)
        else:
            logits_t = teacher.head(teacher.hidden(x[0].double())) if head == "trained" else \
                teacher.logits(x[0].double(), s.temperature)
            if head == "trained":
                logits_t = logits_t / s.temperature
            target = torch.log_softmax(logits_t, -1)
            logq = torch.log_softmax(net.logits(x[0].double(), s.temperature), -1)
            loss = torch.nn.functional.kl_div(logq, target, reduction="batchmean", log_target=True)
        grads = torch.autograd.grad(loss, [p for p in net.parameters()])
        named = dict(zip([n for n, _ in net.named_parameters()], grads))
        pos = eng.inverse[k]
        for j, mlp in enumerate(net.mlps):
            for got, want in ((eng.gWu[j][pos].T, named[f"mlps.{j}.up.weight"]),
                              (eng.gb[j][pos, 0], named[f"mlps.{j}.up.bias"]),
                              (eng.gWd[j][pos].T, named[f"mlps.{j}.down.weight"])):
                torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4 * want.abs().max().item())
        if head == "trained":
            want = named["head.weight"]
            torch.testing.assert_close(eng.ghead[pos].T.double(), want, rtol=1e-4, atol=1e-4 * want.abs().max().item())


def test_normalised_teachers_share_the_independent_displacement():
    """Displacement normalisation: every ρ > 0 teacher is shrunk to the ρ = 0 teacher's mean ‖h_ℓ* − h_0‖;
    ρ = 0 is untouched, and without ``normalise`` the paper's teachers are bit for bit unchanged."""
    from depthlib.toy.models import displacement, displacement_inputs
    x = displacement_inputs(SHAPE)
    ref = displacement(make_teacher(0.0, 2, SHAPE), x)
    raw = [displacement(make_teacher(rho, 2, SHAPE), x) for rho in (0.5, 1.0)]
    assert raw[0] > 1.2 * ref and raw[1] > 1.5 * raw[0]                   # correlated layers go further
    for rho in (0.5, 1.0):
        t = make_teacher(rho, 2, SHAPE, normalise=True)
        assert 0 < t.scale < 1
        assert abs(displacement(t, x) / ref - 1) < 1e-6
        assert torch.equal(t.W_up, make_teacher(rho, 2, SHAPE).W_up)
    assert make_teacher(0.0, 2, SHAPE, normalise=True).scale == 1.0
    with pytest.raises(InputError, match="teacher_norm"):
        chapter.profile_config("smoke", teacher_norm="bogus")


def test_one_replicate_interval_uses_t_with_n_minus_2_df():
    """With one replicate the interval is the fit's t-interval on n_depths − 2 df (4 depths: t = 4.30, not 1.96)."""
    from scipy import stats
    rng = np.random.default_rng(1)
    depths = np.array([6, 12, 24, 48])
    df = pd.DataFrame({"rho": 1.0, "temperature": 1.0, "replicate": 0, "step": 10, "depth": depths,
                       "test_loss": depths ** -2.0 * np.exp(rng.normal(0, 0.1, 4))})
    per = analysis.alpha_per_replicate(df)
    out = analysis.summarize_alpha(per).iloc[0]
    half = (out["hi"] - out["lo"]) / 2
    assert half == pytest.approx(stats.t.ppf(0.975, 2) * per["alpha_se"].iloc[0])
    assert "2 df" in out["interval"]


def test_lag_cosines_tell_a_shared_drift_from_an_ensemble():
    """cos(Δh_l, Δh_{l+k}): ≈ 0 at every lag for independent random updates, ≈ the drift's share for a random walk
    with a constant drift, although its neighbouring update angle is large in both cases."""
    g = torch.Generator().manual_seed(0)
    L, B, d = 40, 256, 64
    noise = torch.randn((L, B, d), generator=g)
    drift = torch.randn((1, B, d), generator=g)
    for updates, expect in ((noise, 0.0), (noise + drift, 0.5)):
        states = torch.cat([torch.zeros(1, B, d), updates.cumsum(0)])
        lag = analysis.lag_cosines(states)
        assert list(lag["lag"]) == list(range(1, L - 2))                   # middle blocks 1..L−2
        assert abs(lag["cos"].mean() - expect) < 0.05
    # θ(Δh) of the drifting walk is still far from 0 (≈ 60°): the neighbour rule alone would call it an ensemble
    sig = analysis.signatures(states).assign(net="x", depth=L)
    assert analysis.signature_summary(sig)["theta_update"].iloc[0] > 0.9


def test_update_angle_averages_over_the_same_middle_blocks():
    """θ(Δh_l, Δh_{l+1}) is averaged over pairs of middle blocks only (not the pair with the last block)."""
    sig = pd.DataFrame({"net": "x", "depth": 6, "layer": range(6), "theta_step": 1.0, "step_norm": 1.0,
                        "rel_step": 1.0, "theta_update": [9.0, 1.0, 1.0, 1.0, 9.0, np.nan]})
    assert analysis.signature_summary(sig)["theta_update"].iloc[0] == 1.0


def test_calibration_runs_cli_and_findings(tmp_path, monkeypatch, capsys):
    """The calibration pair (smoke): the CLI trains one teacher's run into its own experiment, the chapter finds
    both, and the generated findings quote each run's final α_ℓ with its t interval."""
    monkeypatch.setenv("DEPTHLIB_CACHE_DIR", str(tmp_path))
    assert cli.main(["toy", "--calibration", "tied", "--threads", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["alpha"][0]["rho"] == 1.0 and "/toy-calibration/" in out["run"]
    assert cli.main(["toy", "--calibration", "tied", "--steps", "5"]) == 2
    assert "--calibration runs a profile's fixed settings" in capsys.readouterr().err
    runs = chapter.calibration_runs("smoke", rerun=True)
    assert set(runs) == {"tied", "independent"} and str(runs["tied"].path) == out["run"]
    summary = chapter.calibration_summary(runs)
    row = summary.set_index("teacher").loc["tied"]
    final = runs["tied"].table("alpha").iloc[0]
    assert row["alpha"] == pytest.approx(final["alpha"]) and row["steps"] == 80
    assert {"slope_2_4", "slope_4_8", "loss_depth_8"} <= set(summary.columns)
    lines = chapter.calibration_findings(summary)
    assert lines[0].startswith("tied teacher") and f"{final['alpha']:.2f}" in lines[0]
    assert lines[-1].startswith("Tied minus independent")


def test_gpu_session_script_plans_and_runs_a_step(tmp_path, monkeypatch):
    """benchmarks/gpu_session.py (all GPU work in one prepared script): the dry run lists every step; a smoke step
    on the CPU runs for real and its finished run is copied to OUT/results; bad input exits with 2."""
    import importlib.util
    from pathlib import Path
    spec = importlib.util.spec_from_file_location("gpu_session", Path(__file__).parent.parent / "benchmarks" / "gpu_session.py")
    gs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gs)
    monkeypatch.setenv("DEPTHLIB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert gs.main(["--dry-run", "--out", str(tmp_path / "plan")]) == 0
    plan = json.loads((tmp_path / "plan" / "gpu_session.json").read_text())
    assert [s["name"] for s in plan["steps"]] == ["toy-speed", "toy-paper", "calibration", "probes-bf16", "lm"]
    assert gs.main(["--device", "cpu", "--profile", "smoke", "--only", "toy-paper", "--out", str(tmp_path / "o")]) == 0
    done = json.loads((tmp_path / "o" / "gpu_session.json").read_text())["steps"][0]
    assert done["status"] == "done" and list((tmp_path / "o" / "results" / "toy").glob("*/manifest.json"))
    with pytest.raises(SystemExit) as err:
        gs.main(["--only", "nope", "--dry-run"])
    assert err.value.code == 2
    # the reports it reads: bench_toy prints two indented objects, the projection last; a command its one-line summary
    printed = ("round 0: 20 model-steps/s\n" + json.dumps({"device": "cuda"}, indent=2) + "\n"
               + json.dumps({"paper_sweep": {"fp32": {"projected_wall_min": 3.0}}}, indent=2) + "\n")
    assert gs._projected_toy_s(gs._last_json(printed)) == 180.0
    assert gs._last_json('progress\n{"run": "x"}\n') == {"run": "x"} and gs._last_json("no report") is None
