"""Chapter 7's members on chapter 6's model (compose.network): the interface the training, edits and diagnostics call,
the parameters tying shares, the residual stream before the final norm, seeding, one-line errors; the hierarchy
control's settings put them in its units (its run: test_compose_hierarchy)."""
from __future__ import annotations

import copy

import pytest
import torch

from depthlib import units
from depthlib.compose import hierarchy, network
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
        assert m.schedule == network.schedule(family, depth)[1]
    assert network.schedule("looped", 5) == (3, [0, 1, 1, 1, 2])
    assert network.schedule("tied", 3) == (1, [0, 0, 0])
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


@pytest.mark.parametrize("family", ["tied", "looped"])
def test_r_applications_of_a_shared_block_are_one_block_applied_r_times(family):
    """The residual stream of a member that applies its shared block r times: each application continues from the
    last (a schedule one application shorter gives the same first states), and the block's gradient sums them."""
    m = network.build_model(CFG, family, 6, 4, 8, seed=1)
    x = torch.randint(0, 4, (3, 8))
    with torch.no_grad():
        _, hs = m(x, states=True)
        shorter = m.schedule[:-2] + m.schedule[-1:]                     # one core application fewer
        _, hs_short = m(x, shorter, states=True)
        assert len(hs_short) == len(hs) - 1
        for a, b in zip(hs_short[:-1], hs[:-2]):                        # the same applications, the same states
            assert torch.equal(a, b)
        assert all(not torch.equal(a, b) for a, b in zip(hs[:-1], hs[1:]))
    shared = m.blocks[0] if family == "tied" else m.blocks[1]
    loss = network.token_nll(m, x).mean()
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0
               for p in shared.parameters() if p.requires_grad)


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


# ---- the hierarchy control: its members ---------------------------------------------------------------------
def test_the_hierarchy_part_is_a_run_of_units_on_chapter_6s_model():
    from depthlib.compose import chapter
    for name, p in chapter.PROFILES.items():
        cfg = p.hierarchy.validate()
        assert cfg.profile == name and hierarchy.HierarchyConfig.from_dict(cfg.to_dict()) == cfg
        assert cfg.model.arch == "neox"                                # chapter 6's model
        assert len(cfg.cells()) == len(cfg.seeds) * len(cfg.tasks) * len(cfg.families)
    assert "hierarchy" in chapter.SHOWN_PARTS
    assert units.merged_by_units()[hierarchy.UNITS] == hierarchy.EXPERIMENT
    assert chapter.HIERARCHY_PROTOCOL.label({"seed": 2, "task": "leaf", "family": "tied"}) == \
        "hierarchy-2-leaf-tied"
