"""Chapter 7, text part: the three families on chapter 6's text (held-out scoring, training, the fits, the run)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
import torch

from depthlib.compose import analysis, chapter
from depthlib.compose import text as X
from depthlib.compose.model import ModelConfig, build_model
from depthlib.compose.train import TrainConfig
from depthlib.lm.corpus import TokenData

pytestmark = pytest.mark.usefixtures("one_torch_thread")   # small ops: one thread is fastest

V, T = 40, 8


def _data(n_train: int = 64, seed: int = 0) -> TokenData:
    """Synthetic windows: a training stream with structure (token t+1 = token t + 1 mod V) and three held-out
    documents, the last with a short, padded window."""
    g = torch.Generator().manual_seed(seed)
    start = torch.randint(0, V, (n_train, 1), generator=g)
    train = (start + torch.arange(T)) % V
    val = (torch.randint(0, V, (5, 1), generator=g) + torch.arange(T)) % V
    mask = torch.ones(5, T, dtype=torch.bool)
    mask[4, 5:] = False
    return TokenData(train, val, mask, torch.tensor([0, 0, 1, 2, 2]), ["a", "b", "c"], n_train * T)


def _model(family="untied", depth=2, seed=0):
    return build_model(ModelConfig(d_model=16, n_heads=2), family, depth, V, T, seed)


def test_document_losses_are_the_masked_token_losses_from_position_one():
    """Against a float64 recomputation: position 0 of each window is not scored, padding is not scored, and the
    nats of a document's windows are summed before dividing by its scored tokens."""
    data, model = _data(), _model()
    got = X.document_losses(model, data, batch=2)
    with torch.no_grad():
        logits = model(data.val).double()
    nll = -torch.log_softmax(logits, -1).gather(-1, data.val[..., None])[..., 0]          # (windows, T)
    scored = data.val_mask.clone()
    scored[:, 0] = False
    for k, doc in enumerate(data.val_ids):
        rows = data.val_doc == k
        want_n = int(scored[rows].sum())
        want = float((nll[rows] * scored[rows]).sum())
        r = got.set_index("doc_id").loc[doc]
        assert r["n_tokens"] == want_n
        assert r["nll_sum"] == pytest.approx(want, rel=1e-5)   # fp32 logits against fp64: a few float32 eps per term
    assert got["n_tokens"].tolist() == [14, 7, 11]


def test_training_learns_and_a_stopped_run_is_its_prefix():
    """A tiny member learns the synthetic stream (held-out loss falls well below log V), its curve is reproducible,
    and stopping at an evaluation step gives exactly that prefix of the full curve (the replay check's premise)."""
    data, cfg = _data(256), TrainConfig(steps=100, batch_size=16, lr=1e-2, evals=10, n_held_out=1)
    full = X.train_text(_model(), data, cfg, seed=3)
    c = full["curve"]
    assert c["val_loss"].iloc[-1] < 0.5 * np.log(V)
    assert full["rel_improvement"] == pytest.approx(
        (c.loc[c.step == 80, "val_loss"].iloc[0] - c["val_loss"].iloc[-1]) / c.loc[c.step == 80, "val_loss"].iloc[0])
    part = X.train_text(_model(), data, cfg, seed=3, stop_at=30)["curve"]
    pd.testing.assert_frame_equal(part, c[c["step"] <= 30].reset_index(drop=True))


def _law_docs(depths, alpha=1.0, floor=3.0, c=2.0, n_docs=12, seed=0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for d in depths:
        for k in range(n_docs):
            n = 500 + 10 * k
            loss = floor + c * d ** -alpha + rng.normal(0, 0.002)
            rows.append({"family": "untied", "depth": d, "seed": 0, "step": 10, "doc_id": f"d{k}",
                         "n_tokens": n, "nll_sum": loss * n, "loss": loss})
    return pd.DataFrame(rows)


def test_the_fit_recovers_a_known_law_and_refuses_too_few_depths():
    cfg = dataclasses.replace(X.TextConfig("smoke"), train=TrainConfig(steps=10, evals=5, n_held_out=1),
                              n_bootstrap=200)
    fit, boot = X.fits(cfg, _law_docs((1, 2, 3, 4, 6, 8), alpha=1.0))
    a = fit[fit["quantity"] == "alpha"].iloc[0]
    assert a["defined"] and a["lo"] < 1.0 < a["hi"] and abs(a["value"] - 1.0) < 0.1
    assert len(boot) == 200
    fit4, _ = X.fits(cfg, _law_docs((1, 2, 4, 8), alpha=1.0))
    assert not fit4[fit4["quantity"] == "alpha"].iloc[0]["defined"], "3 parameters need at least 5 depths"


def test_probe_windows_are_full_and_spread():
    data = _data()
    w = X.probe_windows(data, 3)
    assert w.shape == (3, T)
    full = data.val[data.val_mask.all(1)]
    assert all(any(torch.equal(r, f) for f in full) for r in w)


def test_a_tiny_run_is_the_same_in_parallel_and_its_views_and_replay_hold(cache):
    """The smoke text run (chapter 6's smoke corpus) with two workers equals the serial one; its views, figures,
    verdict-facing numbers and replay hold."""
    from depthlib import plots
    from depthlib.plots import compose as figs
    cfg = dataclasses.replace(chapter.PROFILES["smoke"].text, families=("untied", "tied"), depths=(1, 2),
                              train=TrainConfig(steps=10, batch_size=4, evals=5, n_held_out=1))
    par = X.run_text(cfg, jobs=2, progress=False)
    a = par.table("doc_losses").sort_values(["family", "depth", "step", "doc_id"]).reset_index(drop=True)
    ser = X.run_text(cfg, jobs=1, progress=False, force=True)
    b = ser.table("doc_losses").sort_values(["family", "depth", "step", "doc_id"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(a, b)
    assert ser.manifest["tokenizer"] and len(ser.manifest["held_out_documents"]) == ser.table("doc_losses")["doc_id"].nunique()
    losses = analysis.text_losses(ser)
    assert (losses["val_lo"] <= losses["val_loss"]).all() and (losses["val_loss"] <= losses["val_hi"]).all()
    diffs = analysis.text_differences(ser)
    same = diffs[diffs["against"] == "same parameters"]
    assert same[["family", "depth", "untied_depth"]].values.tolist() == [["tied", 2, 1]], \
        "a tied member has the one-block untied member's parameters (at ℓ = 1 that is the same-depth comparison)"
    gain = analysis.text_decay_gain(ser)
    assert len(gain) == len(ser.table("members")) and gain["step_from"].iloc[0] < gain["step_to"].iloc[0]
    assert gain["gain"].notna().all()
    alphas = analysis.text_alphas(ser)
    assert not alphas["shown"].any() and alphas["why_not"].str.contains("depths").all(), "two depths: no fit is shown"
    for fig in (figs.loss_vs_depth(losses, None, excess=False, interval="bootstrap"), figs.paired_differences(diffs)):
        assert plots.figure_problems(fig) == []
    rep = chapter.replay(ser)
    assert len(rep) >= 2 and np.allclose(rep["committed"], rep["replayed"], rtol=1e-6)


def test_the_chapter_registers_the_text_part():
    from depthlib import results
    from depthlib.chapters import by_name, compute_entry
    assert by_name("compose").owns(X.EXPERIMENT)
    assert compute_entry(X.EXPERIMENT) == "depthlib.compose.text:run_text"
    assert "depthlib.compose.text" in results.compute_modules(compute_entry(X.EXPERIMENT))
    cpu = chapter.PROFILES["cpu"].text
    assert all(len(cpu.family_depths(f)) >= X.MIN_DEPTHS for f in cpu.families), "every family's law is defined"
