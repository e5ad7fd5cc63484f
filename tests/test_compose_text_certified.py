"""Chapter 7's families on chapter 6's text at chapter 6's certified budget (depthlib.lm.families,
depthlib.compose.text_certified), on answers known by construction:

* a tied member is chapter 6's model with one block applied ℓ times: its logits and its tapped hidden states equal those
  of an untied model whose ℓ blocks are copies of that block, bit for bit (the same operations in the same order);
* the schedules are chapter 7's families' (compose.network.schedule, passed in), and the untied one is chapter 6's model;
* a tied member of effective depth 1 *is* chapter 6's untied member of depth 1 (same seed, same initialisation, same
  data and schedule): its certified loss equals the untied member's exactly;
* the tied − untied difference is computed on paired resamples (its point value is the difference of the two fits).
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from depthlib.compose import chapter
from depthlib.compose.network import schedule
from depthlib.errors import InputError
from depthlib.executors import ExecutorConfig
from depthlib.lm.families import build_family_model
from depthlib.lm.model import ModelConfig, build_model, parameter_counts
from depthlib.probes.tap import tap_hidden_states

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CFG = ModelConfig(d_model=16, n_heads=2)


def _member(family: str, depth: int):
    return build_family_model(CFG, depth, 64, 0, blocks=schedule(family, depth)[1])


def test_the_untied_schedule_is_chapter_sixs_model_and_a_bad_schedule_is_refused():
    assert type(build_family_model(CFG, 3, 64, 0, blocks=[0, 1, 2]).gpt_neox.layers[1]).__name__ == "GPTNeoXLayer"
    with pytest.raises(ValueError, match="schedule of 2 steps for depth 3"):
        build_family_model(CFG, 3, 64, 0, blocks=[0, 0])


def _copies_of_block_zero(depth: int):
    model = build_model(CFG, depth, 64, 0).eval()
    sd = model.state_dict()
    for k in list(sd):
        if ".layers." in k:
            prefix, rest = k.split(".layers.")
            sd[k] = sd[f"{prefix}.layers.0.{rest.split('.', 1)[1]}"].clone()
    model.load_state_dict(sd)
    return model


def test_a_tied_member_is_one_block_applied_at_every_depth():
    tied = _member("tied", 3).eval()
    copies = _copies_of_block_zero(3)
    ids = torch.randint(0, 64, (2, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(tied(input_ids=ids).logits, copies(input_ids=ids).logits)
    a, b = tap_hidden_states(tied, ids), tap_hidden_states(copies, ids)
    assert len(a.hidden) == 4                                   # h_0 … h_3: each application tapped once
    assert all(torch.equal(x, y) for x, y in zip(a.hidden, b.hidden))
    # one block's parameters, shared: two blocks fewer than the untied model
    block = sum(p.numel() for p in tied.gpt_neox.layers[0].parameters())
    assert parameter_counts(copies)["n_params"] - parameter_counts(tied)["n_params"] == 2 * block


def test_a_looped_member_shares_its_core_and_trains_it_with_summed_gradients():
    looped = _member("looped", 6)
    blocks = [layer.block for layer in looped.gpt_neox.layers]
    assert blocks[1] is blocks[2] is blocks[4] and blocks[0] is not blocks[1] and blocks[5] is not blocks[1]
    block = sum(p.numel() for p in blocks[0].parameters())
    assert parameter_counts(looped)["n_params"] - parameter_counts(
        _member("tied", 6))["n_params"] == 2 * block
    assert looped.config.use_cache is False                   # a shared block must not append to one cache entry


def test_bad_settings_are_one_line_errors():
    cfg = chapter.PROFILES["smoke"].text_certified
    with pytest.raises(InputError, match="untied members are chapter 6's"):
        type(cfg)(cfg.profile, series=cfg.series, families=("untied",)).validate()
    with pytest.raises(InputError, match="not in chapter 6's series"):
        type(cfg)(cfg.profile, series=cfg.series, depths=(1, 3)).validate()
    with pytest.raises(InputError, match="no effective depth"):
        type(cfg)(cfg.profile, series=cfg.series, families=("looped",), depths=(1, 2)).validate()


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:              # an empty results cache for this module's runs
        mp.setenv("DEPTHLIB_CACHE_DIR", str(tmp_path_factory.mktemp("text-certified")))
        yield chapter.compute(chapter.PROFILES["smoke"].text_certified, executor=ExecutorConfig("serial"), progress=False)


def test_the_tied_member_of_depth_one_is_chapter_sixs_untied_member(smoke_run):
    m = smoke_run.table("members").set_index(["family", "depth", "seed"])
    assert m.loc[("tied", 1, 0), "val_loss"] == m.loc[("untied", 1, 0), "val_loss"]
    assert m.loc[("tied", 1, 0), "n_params"] == m.loc[("untied", 1, 0), "n_params"]
    # deeper tied members have the parameters of depth 1, untied ones grow
    assert m.loc[("tied", 8, 0), "n_params"] == m.loc[("tied", 1, 0), "n_params"] < m.loc[("untied", 8, 0), "n_params"]
    cfg = chapter.PROFILES["smoke"].text_certified
    assert len(m) == len(cfg.units()) + len(cfg.depths) * len(cfg.seeds)        # trained here + chapter 6's untied


def test_the_difference_is_the_paired_difference_of_the_fits(smoke_run):
    fit = smoke_run.table("fit").set_index(["family", "quantity"])
    for r in smoke_run.table("difference").itertuples():
        assert r.alpha == pytest.approx(fit.loc[(r.family, "alpha"), "value"])
        assert r.value == pytest.approx(r.alpha - r.alpha_untied)
        assert r.lo <= r.value <= r.hi
    # the looped family has two effective depths here (4 and 8): its law is not defined and it is not compared
    assert not bool(fit.loc[("looped", "alpha"), "defined"])
    assert "looped" not in set(smoke_run.table("difference")["family"])


def test_replay_and_summary(smoke_run):
    replayed = chapter.replay(smoke_run)
    assert (replayed["committed"] == replayed["replayed"]).all()
    s = chapter.summary(smoke_run)
    assert s["series_run"].startswith("lm-converged/") and set(s["losses"]) == {"untied", "looped", "tied"}


# ---- the views' rules, on tables whose answers are known -----------------------------------------------------------
def _tables(tied_hi=1.6, drop_tied=(1.1, 1.5), certified=True):
    import numpy as np
    import pandas as pd
    fit = pd.DataFrame([
        {"family": "untied", "quantity": "alpha", "value": 0.9, "lo": 0.8, "hi": 1.0, "n_depths": 6, "defined": True},
        {"family": "tied", "quantity": "alpha", "value": 1.3, "lo": 1.0, "hi": tied_hi, "n_depths": 6, "defined": True},
        {"family": "looped", "quantity": "alpha", "value": np.nan, "lo": np.nan, "hi": np.nan, "n_depths": 3,
         "defined": False}])
    sens = pd.DataFrame([{"family": f, "left_out": k, "alpha": a} for f, ks in
                         (("untied", ((0, 0.9), (1, 0.7), (2, 1.0))), ("tied", ((0, 1.3), (1, drop_tied[0]),
                                                                               (2, drop_tied[1]))))
                         for k, a in ks])
    members = pd.DataFrame([{"family": f, "depth": d, "seed": 0, "n_params": 1, "val_loss": 3.0,
                             "certified": certified, "continuations": 1, "gains": "+0.0100",
                             "last_gain": 0.01 if certified else 0.05, "tokens_main": 6_758_400}
                            for f, ds in (("untied", (1, 2, 3)), ("tied", (1, 2, 3)), ("looped", (3, 4, 6)))
                            for d in ds])
    diff = pd.DataFrame([{"family": "tied", "depths": "1, 2, 3", "alpha": 1.3, "alpha_untied": 0.9, "value": 0.4,
                          "lo": 0.1, "hi": 0.7}])
    # held-out documents: a member's loss is 4 − 0.1·(depth − 1) for untied, flat at 3.9 for the reused families
    # beyond their shallowest; document k adds k/100 for every member (differences are the same on every resample)
    def loss(f, d):
        return 4.0 - 0.1 * (d - 1) if f == "untied" or d == min(ds[f]) else 3.9
    ds = {"untied": (1, 2, 3), "tied": (1, 2, 3), "looped": (3, 4, 6)}
    docs = pd.DataFrame([{"family": f, "depth": d, "seed": 0, "doc_id": f"doc{k}", "n_tokens": 100,
                          "nll_sum": 100 * (loss(f, d) + k / 100)} for f in ds for d in ds[f] for k in range(4)])
    return {"fit": fit, "sensitivity": sens, "members": members, "difference": diff, "final_docs": docs}


def test_what_more_applications_buy_is_a_paired_difference_over_documents():
    import numpy as np

    from depthlib.compose import text_certified_views as v
    c = v.loss_changes(_tables(), n_resamples=50).set_index(["family", "depth", "against"])
    # untied 1 → 3: −0.2 on every resample; tied 3 (3.9) against untied 3 (3.8): +0.1; looped 6 against looped 3 (3.8)
    for key, want in {("untied", 3, "shallowest"): -0.2, ("tied", 3, "untied"): 0.1, ("tied", 3, "shallowest"): -0.1,
                      ("looped", 6, "shallowest"): 0.1, ("looped", 3, "untied"): 0.0}.items():
        assert np.allclose(c.loc[key, ["value", "lo", "hi"]].to_numpy(float), want), key
    assert ("untied", 1, "shallowest") not in c.index and ("untied", 2, "untied") not in c.index
    assert "tied (ℓ = 1 → 3) -0.100 [-0.100, -0.100]" in v.answer(_tables())


def test_views_show_an_exponent_only_where_no_bound_and_no_single_depth_decides_it():
    from depthlib.compose import text_certified_views as v
    e = v.exponent_table(_tables()).set_index("family")
    assert e.loc["untied", "shown"] and e.loc["tied", "shown"] and not e.loc["looped", "shown"]
    assert "needs 4" in e.loc["looped", "why_not"]
    assert e.loc["tied", "without_1"] == 1.1 and (e.loc["tied", "drop_one_min"], e.loc["tied", "drop_one_max"]) == (
        1.1, 1.5)
    at_bound = v.exponent_table(_tables(tied_hi=8.0)).set_index("family")
    assert not at_bound.loc["tied", "shown"] and "interval" in at_bound.loc["tied", "why_not"]
    fragile = v.exponent_table(_tables(drop_tied=(8.0, 1.2))).set_index("family")
    assert not fragile.loc["tied", "shown"] and "one point" in fragile.loc["tied", "why_not"]
    # a family whose exponent is not shown is not compared with untied
    assert v.difference_table(_tables()).loc[0, "reading"] == "steeper than untied"
    assert v.difference_table(_tables(tied_hi=8.0)).empty


def test_views_answer_is_undecided_unless_every_member_is_certified():
    import numpy as np

    from depthlib.compose import text_certified_views as v
    assert "All 9 members are certified" in v.answer(_tables())
    open_ = v.answer(_tables(certified=False))
    assert "**Undecided:** 9 of 9 members" in open_ and "5.0–5.0 %" in open_
    assert "tied 1.30 [1.00, 1.60] (drop-one-depth 1.10–1.50)" in open_ and "+0.40 [+0.10, +0.70]" in open_
    # every reused family reaches the verdict: one without an exponent as no value and its reason (undecided)
    looped, tied = v.measurements(_tables())
    assert (tied["family"], tied["value"], tied["certified"]) == ("tied", 1.3, True)
    assert looped["family"] == "looped" and np.isnan(looped["value"]) and "needs 4" in looped["note"]
    assert looped["certified"] is False
    assert v.measurements(_tables(certified=False))[1]["certified"] is False
    # the reader's tables: formatted numbers under readable headers, the reason where no exponent is shown
    e = v.exponent_display(_tables())
    assert e.loc["tied", "α_ℓ [95 % bootstrap]"] == "1.30 [1.00, 1.60]" and e.loc["tied", "drop-one-depth range"] == (
        "1.10–1.50")
    assert e.loc["looped", "α_ℓ [95 % bootstrap]"].startswith("not shown: 3 effective depths")
    assert v.difference_display(_tables()).loc["tied", "α_ℓ − α_ℓ(untied) [95 % paired]"] == "+0.40 [+0.10, +0.70]"
    assert set(v.member_display(_tables(certified=False))["continuation gains (held-out loss lowered)"]) == {"+1.00 %"}


def test_figures_draw_the_smoke_run_without_problems(smoke_run):
    from depthlib import plots
    from depthlib.compose import text_certified_views as v
    from depthlib.plots import compose as figs
    losses = figs.text_certified_losses(v.loss_table(smoke_run))
    assert not plots.figure_problems(losses) and len(losses.data) == 3                # one line per family
    e = v.exponent_table(smoke_run).assign(shown=True).dropna(subset=["alpha"])
    alphas = figs.text_certified_alphas(e)
    assert not plots.figure_problems(alphas) and list(alphas.data[0].x) == list(e["alpha"])
    settings = v.settings_table(smoke_run).set_index("setting")["value"]
    assert settings["families (effective depths ℓ)"] == "untied: 1, 2, 4, 8; looped: 4, 8; tied: 1, 2, 4, 8"
    sig = v.signatures_display(smoke_run)                            # one row per member, families in the book's order
    assert len(sig) == len(v.loss_table(smoke_run)) and list(dict.fromkeys(sig.index.get_level_values(0))) == [
        "untied", "looped", "tied"]
    assert sig.loc[("tied", 1), "θ(Δh_l, Δh_l+1) (rad)"] == "—"     # one application: no consecutive updates
    assert all(0 <= float(x) <= np.pi for x in sig["θ(h_l, h_l+1), middle (rad)"] if x != "—")
    assert v.signatures_text(smoke_run).startswith("At effective depth ℓ = 8 ")
    known = {"probe_summary": pd.DataFrame({"family": ["untied", "looped", "tied"], "depth": [12, 12, 12],
                                            "theta_dh_mean": [1.42, 0.13, 0.9]})}
    text = v.signatures_text(known)                               # a known answer: only the looped family below π/4
    assert "1.42 rad (untied), 0.13 rad (looped), 0.90 rad (tied)" in text and text.endswith("ones: looped.")
    assert "tokens a member" in settings["main training"]


def test_a_committed_chapter_6_run_is_extended_not_retrained(roots):
    """On a fresh checkout the part reads chapter 6's committed converged run (its tables and tokenizer digest) and
    trains only its own families: no chapter 6 member is trained again, and the run records which run it extended."""
    import shutil

    from depthlib import results
    from depthlib.compose import text_certified
    from depthlib.lm import converged
    committed_root, local_root = roots
    cfg = chapter.PROFILES["smoke"].text_certified
    six = converged.run_converged(cfg.series, progress=False)
    kept = results.commit_run(six)
    shutil.rmtree(local_root / converged.EXPERIMENT)
    assert text_certified.series_run(cfg).path == kept                   # found, not computed
    run = chapter.compute(cfg, executor=ExecutorConfig("serial"), progress=False)
    assert not (local_root / converged.EXPERIMENT).exists()             # chapter 6 was not trained again
    assert run.manifest["series_run"] == f"{converged.EXPERIMENT}/{kept.name}"
    assert run.manifest["train_tokens"] == results.Run.load(kept).manifest["train_tokens"]
