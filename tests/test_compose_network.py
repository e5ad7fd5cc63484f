"""Chapter 7's members on chapter 6's model (compose.network) and the hierarchy control computed unit by unit on it
(compose.hierarchy): the interface the training, edits and diagnostics call, the parameters tying shares, the
residual stream before the final norm, resume bit for bit through the units runner, replay, one-line errors."""
from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pandas as pd
import pytest
import torch

from depthlib import units
from depthlib.compose import certify, hierarchy, network, rhm
from depthlib.compose.train import GrammarTrainConfig
from depthlib.errors import InputError

pytestmark = pytest.mark.usefixtures("one_torch_thread")
CFG = network.GrammarModelConfig(d_model=16, n_heads=2)


def test_a_member_is_chapter_6s_model_with_the_familys_schedule():
    one = network.parameter_counts(network.build_model(CFG, "untied", 1, 4, 8, 0))
    block = one["n_block_params"]
    # GPT-NeoX's parallel block: two LayerNorms, qkv and output projections, the 4d MLP, every bias
    assert block == 2 * 2 * 16 + 16 * 48 + 48 + 16 * 16 + 16 + 16 * 64 + 64 + 64 * 16 + 16
    outside = one["n_params"] - block
    for family, depth, blocks in [("untied", 5, 5), ("looped", 5, 3), ("looped", 9, 3), ("tied", 5, 1)]:
        m = network.build_model(CFG, family, depth, 4, 8, 0)
        c = network.parameter_counts(m)
        assert c["n_blocks"] == blocks and c["n_block_params"] == blocks * block
        assert c["n_params"] == outside + blocks * block              # a shared block is counted once
        assert m.schedule == rhm_schedule(family, depth)
    with pytest.raises(InputError, match="looped depth"):
        network.build_model(CFG, "looped", 2, 4, 8, 0)
    with pytest.raises(InputError, match="family"):
        network.build_model(CFG, "recurrent", 3, 4, 8, 0)
    with pytest.raises(InputError, match="arch"):
        network.GrammarModelConfig(arch="gpt2").validate()
    with pytest.raises(InputError, match="positions"):
        network.GrammarModelConfig(positions="yes").validate()


def test_absolute_positions_are_an_embedding_added_to_the_tokens():
    x = torch.randint(0, 4, (2, 8))
    with_pos = network.build_model(CFG, "untied", 2, 4, 8, seed=5)
    rotary = network.build_model(network.GrammarModelConfig(d_model=16, n_heads=2, positions=False), "untied", 2, 4, 8,
                                 seed=5)
    assert with_pos.position.shape == (8, 16) and rotary.position is None
    assert network.parameter_counts(with_pos)["n_params"] == network.parameter_counts(rotary)["n_params"] + 8 * 16
    with torch.no_grad():
        embed = rotary.lm.get_input_embeddings()(rotary.inputs(x))
        assert torch.equal(rotary(x, states=True)[1][0], embed)
        assert torch.equal(with_pos(x, states=True)[1][0], embed + with_pos.position)   # the same seed: the same lm


def rhm_schedule(family, depth):
    return network.schedule(family, depth)[1]


@pytest.mark.parametrize("family, depth", [("untied", 4), ("looped", 5), ("tied", 3)])
def test_logits_states_and_edits_through_one_interface(family, depth):
    m = network.build_model(CFG, family, depth, 4, 8, seed=3)
    x = torch.randint(0, 4, (5, 8))
    with torch.no_grad():
        logits, hs = m(x, states=True)
        assert logits.shape == (5, 8, 4) and len(hs) == depth + 1
        assert torch.equal(m(x), logits) and torch.equal(m(x, m.schedule), logits)
        # h_0 embeds the start symbol and the leaves before each position, and the position; h_ℓ is before the final
        # norm, so the final norm and the unembedding of h_ℓ are the logits
        assert torch.equal(hs[0], m.lm.get_input_embeddings()(m.inputs(x)) + m.position)
        head = m.lm.get_output_embeddings()(m.lm.gpt_neox.final_layer_norm(hs[-1]))[..., :4]
        assert torch.allclose(head, logits, atol=1e-6)
        # an edit is a forward pass with another schedule, and leaves the member as it was
        deleted = m(x, m.schedule[:1] + m.schedule[2:])
        assert not torch.allclose(deleted, logits) and torch.equal(m(x), logits)
        # a copy (the certificate continues one) computes the same function with its own weights
        twin = copy.deepcopy(m)
        assert torch.equal(twin(x), logits)
        assert all(p.data_ptr() != q.data_ptr() for p, q in zip(twin.parameters(), m.parameters()))
    with pytest.raises(InputError, match="block"):
        m(x, [0, 7])


def test_r_applications_of_a_shared_block_apply_it_r_times():
    m = network.build_model(CFG, "tied", 3, 4, 8, seed=1)
    x = torch.randint(0, 4, (2, 8))
    with torch.no_grad():
        _, hs = m(x, states=True)
        block = m.blocks[0]
        for h_in, h_out in zip(hs[:-1], hs[1:]):
            assert not torch.equal(h_in, h_out)
    loss = network.token_nll(m, x).mean()
    loss.backward()
    grads = [p.grad for p in block.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


def test_the_member_is_causal_and_seeded():
    a, b = network.build_model(CFG, "untied", 3, 4, 8, 1), network.build_model(CFG, "untied", 3, 4, 8, 1)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    c = network.build_model(CFG, "untied", 3, 4, 8, 2)
    assert not all(torch.equal(p, q) for p, q in zip(a.parameters(), c.parameters()))
    x = torch.randint(0, 4, (2, 8))
    y = x.clone()
    y[:, 5] = (y[:, 5] + 1) % 4
    with torch.no_grad():
        assert torch.allclose(a(x)[:, :6], a(y)[:, :6])       # position t reads leaves < t only
        assert not torch.allclose(a(x)[:, 6:], a(y)[:, 6:])


# ---- the hierarchy control, unit by unit -------------------------------------------------------------------
TINY = hierarchy.HierarchyConfig(
    "smoke", grammar=rhm.RHMConfig(4, 2, 2, 3), families=("untied", "tied"), depths=(1, 2), seeds=(0, 1),
    model=network.GrammarModelConfig(d_model=8, n_heads=2),
    train=GrammarTrainConfig(steps=10, batch_size=8, evals=5, n_held_out=32),
    certificate=certify.Certificate(max_continuations=1), n_probe=16, n_permutations=2, n_bootstrap=20)


def _tables(run):
    return {p.stem: pd.read_parquet(p).drop(columns=["seconds"], errors="ignore")
            for p in sorted(run.path.glob("*.parquet"))}


def test_units_resume_bit_for_bit_merge_and_replay(cache, monkeypatch):
    from depthlib.compose import chapter
    from depthlib.executors import ExecutorConfig
    serial = ExecutorConfig("serial", threads=1)       # the replay trains on one thread, as the units
    whole = chapter.compute(TINY, executor=serial)
    assert whole.experiment == hierarchy.EXPERIMENT and whole.complete and not whole.stale
    reference = _tables(whole)
    assert len(reference["members"]) == 2 * 2 * 2 * 2 and len(whole.manifest["units"]) == len(TINY.cells()) == 8
    assert {"ngram", "root_members", "root_bayes", "fit_exponents", "fit_rounds", "stages"} <= set(reference)
    assert whole.manifest["held_out_overlap"] == 0 and whole.manifest["summary"]["n_members"] == 16
    rep = chapter.replay(whole)
    assert len(rep) and np.array_equal(rep["committed"], rep["replayed"])
    unit = next(iter((cache / "results" / hierarchy.UNITS).glob("*/manifest.json"))).parent
    from depthlib import results
    rep = chapter.replay(results.Run.load(unit))
    assert len(rep) and np.array_equal(rep["committed"], rep["replayed"])

    # the same run again in another cache, interrupted after three members, then resumed: no member trains twice
    monkeypatch.setenv("DEPTHLIB_CACHE_DIR", str(cache / "again"))
    real, trained = hierarchy.train_member, []

    def stop_after_three(*args, **kwargs):
        if len(trained) == 3:
            raise KeyboardInterrupt
        trained.append(args[3:])
        return real(*args, **kwargs)

    monkeypatch.setattr(hierarchy, "train_member", stop_after_three)
    with pytest.raises(KeyboardInterrupt):
        chapter.compute(TINY, executor=serial)
    monkeypatch.setattr(hierarchy, "train_member", lambda *a, **k: trained.append(a[3:]) or real(*a, **k))
    again = chapter.compute(TINY, executor=serial)
    assert len(trained) == 16 and len(set(trained)) == 16
    resumed = _tables(again)
    for name, table in reference.items():
        pd.testing.assert_frame_equal(resumed[name], table, check_exact=True, obj=name)


def test_the_part_is_the_hierarchy_control_on_chapter_6s_model():
    from depthlib.compose import chapter
    for name, p in chapter.PROFILES.items():
        lm, own = p.hierarchy_lm.validate(), p.hierarchy
        assert lm.profile == name and hierarchy.HierarchyConfig.from_dict(lm.to_dict()) == lm
        same = {f.name for f in dataclasses.fields(own)} - {"model"}
        assert all(getattr(lm, f) == getattr(own, f) for f in same)
        assert (lm.model.d_model, lm.model.n_heads, lm.model.mlp_ratio, lm.model.arch) == \
            (own.model.d_model, own.model.n_heads, own.model.mlp_ratio, "neox")
        assert len(lm.cells()) == len(own.seeds) * len(own.tasks) * len(own.families)
    assert "hierarchy_lm" in chapter.PARTS and "hierarchy_lm" not in chapter.SHOWN_PARTS
    assert units.merged_by_units()[hierarchy.UNITS] == hierarchy.EXPERIMENT
    assert chapter.HIERARCHY_LM_PROTOCOL.label({"seed": 2, "task": "leaf", "family": "tied"}) == \
        "hierarchy-2-leaf-tied"
