"""Chapter 5: plans, the edited forward pass on tiny random models, rankings, the suite, the fit, the CLI."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest
import torch

from depthlib.errors import InputError
from depthlib.interventions import plan as P
from depthlib.interventions.analysis import order_pairs, plan_effects
from depthlib.interventions.evaluate import score_plans
from depthlib.interventions.execute import capture_lm, run_plan
from depthlib.interventions.rankings import BlockSimilarity, gromov_blocks, shortgpt_blocks
from depthlib.interventions.suite import SuiteConfig, build_plans
from tests import tiny

ARCHS = ["llama", "gemma3", "neox"]


def _batch(arch: str, layers: int = 6, seed: int = 0):
    tok = tiny.tokenizer()
    m = tiny.model(arch, len(tok), layers=layers, seed=seed)
    enc = tok(tiny.TEXTS[:3], return_tensors="pt", padding=True)
    return m, tok, enc["input_ids"], enc["attention_mask"]


# ---- plans -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text", ["0-5", "0-1,3-5", "0,[1-3],4-5", "0,<1+2>,3-5", "0,1-4*1.25,5", "5-0", "0-2,2-5",
                                  "delete:1,4", "reverse:1-4", "swap:2", "parallel:1-4", "average:2-3"])
def test_plan_text_round_trips(text):
    plan = P.parse_plan(text, 6)
    assert P.parse_plan(plan.text(), 6) == plan


def test_rescaled_deletion_keeps_the_total_middle_step():
    plan = P.delete(10, [3, 4], rescale=True)           # 8 middle blocks, 2 deleted: the other 6 × 8/6
    scales = {s.blocks[0]: s.scale for s in plan.steps}
    assert 3 not in scales and scales[0] == scales[9] == 1.0
    assert sum(scales[b] for b in P.middle(10) if b in scales) == pytest.approx(8.0)
    assert P.parse_plan(plan.text(), 10) == plan


@pytest.mark.parametrize("text, message", [("", "empty plan"), ("0-6", "out of range"), ("[1+1]", "twice"),
                                           ("[1-3],[3-4]", "overlap"), ("a-b", "cannot read"), ("swap:5", "swap"),
                                           ("1*inf", "finite number"), ("delete:0-5", "empty plan")])
def test_bad_plans_are_one_line_input_errors(text, message):
    with pytest.raises(InputError, match=message) as err:
        P.parse_plan(text, 6)
    assert "\n" not in str(err.value)


def test_plain_prefix_and_identity():
    assert P.identity(5).is_identity and P.identity(5).plain_prefix() == 5
    assert P.parse_plan("0-1,3,2,4", 5).plain_prefix() == 2
    assert P.parse_plan("[0]", 1).is_identity                # a parallel group of one is the block itself


# ---- the edited forward pass -------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ARCHS)
def test_identity_plan_equals_the_unedited_model_exactly(arch):
    m, _, ids, mask = _batch(arch)
    with torch.no_grad():
        ref = m(input_ids=ids, attention_mask=mask).logits
        b = capture_lm(m, ids, mask)
        h = run_plan(P.identity(b.n_blocks), b.block, b.states, reuse_prefix=False)   # every block re-run
        logits = b.arch.unembed(h)
    assert torch.equal(h, b.states[-1])
    assert torch.equal(logits, ref)


@pytest.mark.parametrize("arch", ARCHS)
def test_trivial_edits_equal_the_model(arch):
    m, _, ids, mask = _batch(arch)
    with torch.no_grad():
        b = capture_lm(m, ids, mask)
        L = b.n_blocks
        ref = b.states[-1]
        group_of_one = P.Plan(tuple(P.Step((i,), 1.0, "sum") for i in range(L)), L)
        for plan in (P.delete(L, []), group_of_one, P.parse_plan(f"0-{L - 1}*1.0", L)):
            assert torch.equal(run_plan(plan, b.block, b.states, reuse_prefix=False), ref)
        # a reversed-then-reversed plan is the original: composing the reversal's order with itself
        rev = P.reorder(L, list(range(1, L - 1)), list(range(L - 2, 0, -1)))
        order = [s.blocks[0] for s in rev.steps]
        twice = P.sequence(L, [order[j] for j in order])
        assert torch.equal(run_plan(twice, b.block, b.states, reuse_prefix=False), ref)
        assert not torch.equal(run_plan(rev, b.block, b.states), ref)
        # prefix reuse changes nothing
        for plan in (P.delete(L, [3]), P.parallel(L, [2, 3]), rev):
            assert torch.equal(run_plan(plan, b.block, b.states), run_plan(plan, b.block, b.states, reuse_prefix=False))


def test_deleting_a_block_equals_a_model_without_it():
    """The edited pass is the model with that block removed from its ModuleList (masks and rotary kept)."""
    m, _, ids, mask = _batch("llama", layers=5)
    with torch.no_grad():
        b = capture_lm(m, ids, mask)
        h = run_plan(P.delete(5, [2]), b.block, b.states)
        edited = b.logprobs(h)
        layers = m.model.layers
        m.model.layers = torch.nn.ModuleList([layers[i] for i in (0, 1, 3, 4)])
        m.config.num_hidden_layers = 4
        try:
            ref = torch.log_softmax(m(input_ids=ids, attention_mask=mask, use_cache=False).logits[:, :-1].float(), -1)
        finally:
            m.model.layers, m.config.num_hidden_layers = layers, 5
    valid = (mask[:, :-1] & mask[:, 1:]).bool()
    torch.testing.assert_close(edited[valid], ref[valid], rtol=1e-5, atol=1e-5)


def test_parallel_group_sums_updates_on_one_input():
    m, _, ids, mask = _batch("llama")
    with torch.no_grad():
        b = capture_lm(m, ids, mask)
        x = b.states[2]
        expect = x + (b.block(2, x) - x) + (b.block(3, x) - x)
        expect = b.block(5, b.block(4, expect))
        torch.testing.assert_close(run_plan(P.parse_plan("0-1,[2+3],4-5", 6), b.block, b.states), expect)
        mean = run_plan(P.parallel(6, [2, 3], "mean"), b.block, b.states)
        seq = run_plan(P.identity(6), b.block, b.states)
        assert not torch.equal(mean, seq)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_padding_does_not_change_a_documents_scores(arch):
    m, tok, _, _ = _batch(arch)
    short, long = tiny.TEXTS[0], tiny.TEXTS[2] + " " + tiny.TEXTS[1]
    plan = P.delete(6, [2])
    with torch.no_grad():
        alone = tok([short], return_tensors="pt")
        b1 = capture_lm(m, alone["input_ids"], alone["attention_mask"])
        s1 = b1.score(run_plan(plan, b1.block, b1.states))
        both = tok([short, long], return_tensors="pt", padding=True)
        assert both["attention_mask"][0].sum() < both["attention_mask"].shape[1]      # the short one is padded
        b2 = capture_lm(m, both["input_ids"], both["attention_mask"])
        s2 = b2.score(run_plan(plan, b2.block, b2.states))
    assert s1["n"][0] == s2["n"][0]
    for k in ("loss", "kl"):
        assert s2[k][0].item() == pytest.approx(s1[k][0].item(), rel=1e-4, abs=1e-5)


def test_scores_against_a_plain_reference():
    """Per-document sums of cross-entropy and KL(unedited ‖ edited), against F.cross_entropy / F.kl_div."""
    import torch.nn.functional as F
    m, _, ids, mask = _batch("llama")
    with torch.no_grad():
        b = capture_lm(m, ids, mask)
        h = run_plan(P.delete(6, [1, 4]), b.block, b.states)
        s = b.score(h)
        lp = torch.log_softmax(b.arch.unembed(h)[:, :-1].double(), -1)
        ref = torch.log_softmax(m(input_ids=ids, attention_mask=mask).logits[:, :-1].double(), -1)
    valid = (mask[:, :-1] & mask[:, 1:]).bool()
    for d in range(ids.shape[0]):
        v = valid[d]
        ce = F.nll_loss(lp[d][v], ids[d, 1:][v], reduction="sum")
        kl = F.kl_div(lp[d][v], ref[d][v], log_target=True, reduction="sum")
        assert s["loss"][d].item() == pytest.approx(ce.item(), rel=1e-4)
        assert s["kl"][d].item() == pytest.approx(kl.item(), rel=1e-3, abs=1e-6)
        assert s["n"][d].item() == v.sum().item()


# ---- rankings and the suite --------------------------------------------------------------------------------
def test_rankings_against_a_direct_computation():
    g = torch.Generator().manual_seed(0)
    states = [torch.randn(2, 5, 8, generator=g) for _ in range(5)]       # 4 blocks
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0]]).bool()
    sim = BlockSimilarity(4)
    sim.update(states, mask)
    d = sim.distances().set_index(["start", "span"])["distance"]
    X = torch.stack(states)[:, mask].double()
    for i, n in [(0, 1), (1, 2), (0, 4)]:
        cos = torch.nn.functional.cosine_similarity(X[i], X[i + n], dim=-1)
        assert d[(i, n)] == pytest.approx(float(torch.arccos(cos).mean() / np.pi), rel=1e-5)
    bi = sim.influence()
    cos01 = torch.nn.functional.cosine_similarity(X[0], X[1], dim=-1).mean()
    assert bi.loc[0, "block_influence"] == pytest.approx(1 - float(cos01), rel=1e-5)
    dist = pd.DataFrame({"start": [0, 1, 2], "span": [2, 2, 2], "distance": [0.3, 0.1, 0.2]})
    assert gromov_blocks(dist, 2) == [1, 2]
    infl = pd.DataFrame({"block": [0, 1, 2, 3], "block_influence": [0.5, 0.1, 0.3, 0.05]})
    assert shortgpt_blocks(infl, 2) == [1, 3]


def test_suite_plans_are_valid_and_labelled():
    L = 12
    norms = np.linspace(1.0, 4.0, L)
    cfg = SuiteConfig(ks=(2, 4), draws=3, plateau_k=3, plateau_draws=2, norm_matched=2, permutations=2,
                      group_sizes=(2, 4), group_positions=2)
    plans, meta = build_plans(L, cfg, norms, plateau=[3, 4, 5, 6, 7])
    assert set(meta["plan"]) == set(plans) and meta["family"].iloc[0] == "identity"
    assert (meta["rule"] == "each").sum() == L
    rand = meta[(meta["rule"] == "random") & ~meta["rescale"] & (meta["scope"] == "middle")]
    assert sorted(rand.groupby("k").size().to_dict().items()) == [(2, 3), (4, 3)]
    for text in meta.loc[meta["rule"] == "random", "plan"]:
        kept = [s.blocks[0] for s in plans[text].steps]
        assert 0 in kept and L - 1 in kept                   # random subsets are middle blocks only
    # every reordering moves exactly the blocks its paired deletion removes, all of them
    shifts = meta[meta["rule"] == "shift"]
    assert len(shifts) == 3 * 2 + 2
    for r in shifts.itertuples():
        deleted = meta[(meta["pair"] == r.pair) & (meta["family"] == "delete") & ~meta["rescale"]]
        assert deleted["blocks"].iloc[0] == r.blocks
        order = [s.blocks[0] for s in plans[r.plan].steps]
        moved = [b for i, b in enumerate(order) if b != i]
        assert sorted(moved) == [int(b) for b in r.blocks.split()] and r.distance >= 1
    plateau = meta[meta["scope"] == "plateau"]
    assert len(plateau) == 4 and all(set(map(int, b.split())) <= {3, 4, 5, 6, 7} for b in plateau["blocks"])
    # norm-matched: each moved block's update scaled by the norm at its new slot over the norm at its own
    nm = meta[meta["rule"] == "shift-norm"]
    assert len(nm) == 2 and set(nm["k"]) == {4}
    for text in nm["plan"]:
        for slot, step in enumerate(plans[text].steps):
            assert step.scale == pytest.approx(norms[slot] / norms[step.blocks[0]])
    par = meta[meta["family"] == "parallel"]
    assert set(par["k"]) == {2, 4} and set(par["rule"]) == {"sum", "mean"}
    assert (meta["rule"] == "permutation").sum() == 2 and (meta["rule"] == "reverse").sum() == 1


# ---- evaluation, resume, analysis --------------------------------------------------------------------------
def test_score_plans_resumes_without_losing_finished_batches(tmp_path):
    m, tok, _, _ = _batch("llama")
    plans = {p.text(): p for p in (P.identity(6), P.delete(6, [2]), P.parallel(6, [1, 2]))}

    def batches(counter):
        out = []
        for start in range(0, 4, 2):
            def go(s=start):
                counter.append(s)
                enc = tok(tiny.TEXTS[s:s + 2], return_tensors="pt", padding=True)
                return capture_lm(m, enc["input_ids"], enc["attention_mask"])
            out.append((list(range(start, start + 2)), go))
        return out
    full, _ = score_plans(plans, batches([]), progress=False)
    ckpt = tmp_path / "c.pt"
    seen: list = []
    first, _ = score_plans(plans, batches(seen)[:1], checkpoint=ckpt, progress=False)   # "interrupted" after batch 1
    resumed, _ = score_plans(plans, batches(seen), checkpoint=ckpt, progress=False)
    assert seen == [0, 2]                                    # batch 0 was not recomputed
    pd.testing.assert_frame_equal(resumed, full)


def test_plan_effects_and_order_pairs_from_the_tables():
    meta = pd.DataFrame([dict(family="identity", rule="identity", scope="", k=0, rescale=False, blocks="", distance=0.0,
                              third="", pair="", plan="id"),
                         dict(family="delete", rule="random", scope="middle", k=2, rescale=False, blocks="2 5",
                              distance=0.0, third="first", pair="p", plan="d"),
                         dict(family="order", rule="shift", scope="middle", k=2, rescale=False, blocks="2 5",
                              distance=3.0, third="first", pair="p", plan="o")]).assign(model="m")
    rows = [dict(plan=p, doc_index=d, n=10, loss=20.0 + v, kl=0.0, agree=10.0)
            for p, v in (("id", 0.0), ("d", 5.0), ("o", 1.0)) for d in range(3)]
    eff = plan_effects(meta, pd.DataFrame(rows).assign(model="m"))
    assert eff.loc[eff["plan"] == "d", "delta_loss"].iloc[0] == pytest.approx(0.5)
    pairs = order_pairs(eff)
    assert len(pairs) == 1 and pairs["ratio"].iloc[0] == pytest.approx(0.2) and pairs["distance"].iloc[0] == 3.0


# ---- the toy students and the CLI --------------------------------------------------------------------------
def test_toy_controls_edit_chapter_3s_students(tmp_path, monkeypatch):
    monkeypatch.setenv("DEPTHLIB_CACHE_DIR", str(tmp_path))
    from depthlib.errors import ReplayUnavailable
    from depthlib.interventions.toy import UNITS, ToyInterventionConfig, load_student, run_toy_interventions
    suite = SuiteConfig(ks=(2,), draws=2, each_block=False, plateau_k=0, norm_matched=1, permutations=1,
                        group_sizes=(2,), group_positions=1)
    cfg = ToyInterventionConfig(profile="smoke", depth=8, replicates=1, docs=4, inputs_per_doc=8, rank_docs=2,
                                suite=suite)
    with pytest.raises(ReplayUnavailable, match="not in the local cache"):
        load_student(cfg, 0.0, 0)
    run = run_toy_interventions(cfg, progress=False)       # trains chapter 3's two smoke units first (seconds)
    student, _, row = load_student(cfg, 1.0, 0)
    from depthlib import results
    unit = results.open_run(UNITS, {**cfg.protocol().to_dict(),
                                    "cell": {"rho": 1.0, "temperature": 1.0, "replicate": 0}})
    chapter3 = unit.table("certified").set_index("depth").loc[cfg.depth]
    assert row["stage"] == chapter3["stage"] and row["test_loss"] == chapter3["test_loss"]   # the student ch. 3 fits
    x = torch.randn(5, 32)
    states = student.hidden(x, all_states=True)
    for i in range(cfg.depth):                                       # the adapter's block is the network's own
        torch.testing.assert_close(states[i] + student.mlps[i](states[i]), states[i + 1])
    eff = plan_effects(run.table("plans"), run.table("scores"))
    assert set(eff["model"]) == {"toy independent r0", "toy tied r0"}
    ident = eff[eff["family"] == "identity"]
    assert np.allclose(ident["delta_loss"], 0) and np.allclose(ident["kl"], 0, atol=1e-6)
    assert set(run.table("signature")["model"]) == set(eff["model"]) and len(run.table("signature")) == 2 * 2
    from depthlib.interventions import chapter
    replayed = chapter.replay(run)
    np.testing.assert_allclose(replayed["replayed"], replayed["committed"], rtol=1e-6)


def test_the_controls_units_train_exactly_chapter_3s_students(tmp_path, monkeypatch):
    """The controls train only the depths their student depends on (the halving chain): its stages, seeded by
    (replicate, depth, stage), and its warm starts come out bit for bit as in chapter 3's whole unit."""
    monkeypatch.setenv("DEPTHLIB_CACHE_DIR", str(tmp_path))
    from depthlib import results
    from depthlib.interventions.toy import UNITS, ToyInterventionConfig
    from depthlib.toy import chapter as toy_chapter
    cfg = ToyInterventionConfig(profile="smoke", depth=8, replicates=1)
    whole = cfg.protocol()
    assert cfg.units_protocol().depths == (2, 4, 8) and whole.depths == (2, 4, 8)
    deeper = dataclasses.replace(whole, depths=(2, 3, 4, 8))        # a depth off the chain is left out
    monkeypatch.setattr(ToyInterventionConfig, "protocol", lambda self: deeper)
    assert cfg.units_protocol().depths == (2, 4, 8)
    cell = {"rho": 1.0, "temperature": 1.0, "replicate": 0}
    full = results.Run.load(toy_chapter.train_protocol_unit("certified", deeper.to_dict(), cell, committed=False))
    part = results.Run.load(toy_chapter.train_protocol_unit("certified", cfg.units_protocol().to_dict(), cell,
                                                            committed=False))
    a = full.table("certified").set_index("depth").loc[8]
    b = part.table("certified").set_index("depth").loc[8]
    assert a["stage"] == b["stage"] and a["test_loss"] == b["test_loss"]
    wa = torch.load(full.path / f"student_{a['stage']}_008.pt", weights_only=False)["weights"]
    wb = torch.load(part.path / f"student_{b['stage']}_008.pt", weights_only=False)["weights"]
    for k in ("W_up", "b_up", "W_down"):
        assert torch.equal(wa[k], wb[k])
    assert results.open_run(UNITS, {**cfg.units_protocol().to_dict(), "cell": cell}).path == part.path


def test_cli_intervene_json_and_bad_plan(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DEPTHLIB_CACHE_DIR", str(tmp_path / "cache"))
    folder = tiny.save_model(tmp_path / "m", "llama", layers=4)
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n\n".join(tiny.TEXTS))
    from depthlib.cli import main
    rc = main(["interventions", "--model", str(folder), "--corpus", str(corpus), "--docs", "2", "--rank-docs", "2",
               "--max-length", "16", "--plan", "delete:1", "--plan", "0,[1-2],3", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["n_blocks"] == 4
    assert [p["plan"] for p in out["plans"]] == ["0-3", "0,2-3", "0,[1+2],3"]
    assert out["plans"][0]["delta_loss"] == 0.0 and out["plans"][0]["kl"] == 0.0
    rc = main(["interventions", "--model", str(folder), "--corpus", str(corpus), "--docs", "2", "--rank-docs", "2",
               "--max-length", "16", "--plan", "0-9", "--json"])
    err = capsys.readouterr().err
    assert rc == 2 and "block 9 is out of range" in err and len(err.strip().splitlines()) == 1
