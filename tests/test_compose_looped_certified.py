"""Chapter 7's looped toy students under chapter 3's certified protocol (depthlib.compose.looped_certified), at the
smoke size: the routes, the certificate, the tables chapter 3's fits read, the replay and the settings checks."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from depthlib.compose import chapter, looped_certified
from depthlib.compose.looped_certified import LoopedCertifiedConfig
from depthlib.errors import InputError
from depthlib.toy.certified import CertifiedConfig

CFG = chapter.PROFILES["smoke"].toy_certified


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("DEPTHLIB_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    mp.setenv("DEPTHLIB_RESULTS_DIR", str(tmp_path_factory.mktemp("none")))      # no committed runs
    try:
        yield chapter.runs("smoke", parts=("toy_certified",))["toy_certified"]
    finally:
        mp.undo()


def test_every_depth_has_its_routes_and_a_certificate(run):
    stages, cert = run.table("stages"), run.table("certified")
    p = CFG.protocol
    assert len(cert) == sum(n for _, _, n in p.cells) * len(p.depths)
    first, *deeper = sorted(p.depths)
    for (teacher, depth), g in stages.groupby(["teacher", "depth"]):
        routes = set(g["route"])
        assert routes >= ({"scratch"} if depth == first else {"halved"})
        assert ("euler" in routes) == (teacher == "tied")
        assert not ({"scratch"} if depth != first else {"halved"}) & routes
    for r in cert.itertuples():                       # the certificate: stop at the first gain below 2 %, else all
        gains = [float(g) for g in r.continuation_gains.split(", ")]        # printed to 4 decimals
        assert r.continuations == len(gains) and r.last_continuation_gain == pytest.approx(gains[-1], abs=5e-5)
        assert r.certified == (r.last_continuation_gain < p.gain_below)
        assert all(g >= p.gain_below for g in gains[:-1])
        assert len(gains) == p.max_continuations or r.certified
    # a looped student has one block: its parameters do not grow with depth
    assert cert["parameters"].nunique() == 1
    assert (cert["heldout_in_pool"] == 0).all()
    # every route trains the same steps at every depth, and a halved start carries its parent's steps
    routes = stages[~stages["stage"].str.contains("+", regex=False)]
    assert (routes["stage_steps"] == p.steps).all()
    halved = routes[routes["route"] == "halved"]
    assert (halved["steps"] > p.steps).all() and halved["start"].str.startswith("halved ").all()


def test_chapter_3s_fits_read_the_tables(run):
    summary = run.table("alpha_summary")
    assert {"envelope", "untrained euler"} <= set(summary["fit"])
    assert set(summary.loc[summary["fit"] == "envelope", "teacher"]) == {"tied", "independent"}
    assert not run.table("fragility").empty and not run.table("slopes").empty
    sig = run.table("signatures")
    assert set(sig["net"]) == {"looped student", "teacher"}
    assert set(sig.loc[sig["net"] == "looped student", "depth"]) == set(CFG.protocol.depths)


def test_the_euler_start_is_the_teachers_flow_in_l_steps():
    teacher = looped_certified.unit_teacher(CFG, {"rho": 1.0, "temperature": 1.0, "replicate": 0})
    block = looped_certified.euler_block(teacher, 4)
    torch.testing.assert_close(block.W_down[0] * 4, teacher.W_down[0] * teacher.depth)


def test_the_replay_recomputes_the_first_interval(run):
    replayed = chapter.replay(run)
    assert len(replayed) == 2
    # same code, same machine, same thread count: the same float32 operations in the same order
    np.testing.assert_allclose(replayed["replayed"], replayed["committed"], rtol=1e-6)


def test_bad_settings_are_one_line_errors():
    base = CFG.protocol
    with pytest.raises(InputError, match="must double"):
        LoopedCertifiedConfig("custom", dataclasses.replace(base, depths=(2, 3, 8))).validate()
    with pytest.raises(InputError, match="stay below"):
        LoopedCertifiedConfig("custom", dataclasses.replace(base, depths=(4, 8, 16))).validate()
    assert LoopedCertifiedConfig.from_dict(CFG.to_dict()) == CFG
    assert isinstance(LoopedCertifiedConfig("x").protocol, CertifiedConfig)
