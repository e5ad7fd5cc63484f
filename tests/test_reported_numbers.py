"""Numbers the commands print must be what they say: a fit at a search bound is no exponent (4), a merged run's wall
time is the whole run's (5), and a model whose hidden states overflow float32 stops with one line and leaves no
complete run behind (6). Tiny models and corpora built here (tests/tiny.py); each test has its own cache."""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
import torch

from depthlib import executors, paths, results
from depthlib.cli import main
from tests import tiny

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "data" / "results"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DEPTHLIB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    return tmp_path / "cache"


def _committed(experiment: str) -> results.Run:
    folders = sorted((COMMITTED / experiment).glob("*/manifest.json"))
    if not folders:
        pytest.skip(f"no committed {experiment} run in this checkout")
    return results.Run.load(folders[0].parent)


def _json(capsys) -> dict:
    return json.loads(capsys.readouterr().out)


def _one_line(err: str) -> str:
    """The one message line of stderr (progress bars aside)."""
    lines = [ln for ln in err.replace("\r", "\n").strip().splitlines() if ln.strip() and "%|" not in ln]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


# ---- 4: a fit at a search bound is not an exponent ---------------------------------------------------------
def test_lm_json_prints_no_exponent_at_the_search_bound(cache, capsys):
    """`depthlib lm --part series --json` (smoke): four depths whose loss is flat beyond ℓ = 1, so α_ℓ runs to the search bound 8
    in every resample; the fit is printed as null with the reason, never as "value": 8.0."""
    assert main(["lm", "--part", "series", "--json"]) == 0
    out = _json(capsys)
    fit = out["fit"]
    assert fit["share_undefined_or_at_bound"] == 1.0
    alpha = fit["alpha_l"]
    assert alpha["value"] is None and alpha["lo"] is None and alpha["hi"] is None, alpha
    assert "search bound 8.0" in alpha["reason"] and "100 % of the 100 resamples" in alpha["reason"], alpha
    assert "4 depths (the law needs 5)" in alpha["reason"]          # chapter 7's rule, reused
    for name in ("L_inf", "c_l"):                                    # parameters of the same fit
        assert fit[name]["value"] is None and fit[name]["lo"] is None and fit[name]["hi"] is None
        assert "alpha_l" in fit[name]["reason"]
    assert 8.0 not in [v for p in ("alpha_l", "L_inf", "c_l") for v in fit[p].values()]


def test_lm_summary_shows_an_exponent_inside_the_range():
    """The committed cpu series (five depths, α_ℓ 0.81 [0.68, 0.93], no resample at a bound) is shown as before."""
    from depthlib.lm import chapter
    run = _committed("lm")
    fit = chapter.summary(run)["fit"]
    committed = run.manifest["summary"]
    assert fit["alpha_l"] == committed["alpha_l"] and "reason" not in fit["alpha_l"]
    assert fit["L_inf"] == committed["L_inf"] and fit["c_l"] == committed["c_l"]


def test_compose_summary_prints_no_undefined_exponent_as_a_value():
    """Chapter 7's hierarchy run: a law that is not defined for every replicate (here the looped family's free-floor
    law: four effective depths, the law needs five) is printed as null with its reason, the defined ones as before."""
    from depthlib.compose import analysis, chapter
    run = _committed("compose-rhm")
    alphas = analysis.alpha_table(run)
    s = chapter.summary(run)["alpha"]
    assert not alphas["defined"].all()
    for r in alphas.itertuples():
        entry = s[f"{r.family} ({r.law})"]
        if r.defined:
            assert entry["value"] == r.value and entry["lo"] == r.lo and "reason" not in entry
        else:
            assert entry["value"] is None and entry["lo"] is None and entry["hi"] is None, entry
            assert entry["reason"] and entry["defined"] is False
    assert s["looped (free floor)"]["reason"] == "4 depths (the free-floor law needs 5)"


# ---- 5: the wall time of a merged run is the whole run's ---------------------------------------------------
def test_converged_protocol_json_reports_the_whole_wall_time(cache, capsys):
    """`depthlib toy --protocol converged --json` (smoke): its units train for seconds and the merge takes a fraction
    of one; ``wall_time_s`` is the whole run (units and merge), not the merge; a rerun loads the recorded total."""
    t0 = time.perf_counter()
    assert main(["toy", "--protocol", "converged", "--json"]) == 0
    elapsed = time.perf_counter() - t0
    out = _json(capsys)
    run = results.Run.load(out["run"])
    units = run.manifest["units"]
    longest = max(u["wall_time_s"] for u in units.values())
    assert out["unit_wall_time_s"] == pytest.approx(sum(u["wall_time_s"] for u in units.values()), abs=1e-2)
    assert 0 <= out["merge_wall_time_s"] < longest
    assert longest + out["merge_wall_time_s"] <= out["wall_time_s"] <= elapsed, (out, elapsed)
    assert run.manifest["wall_time_s"] == out["wall_time_s"]        # the manifest's own wall time: the whole run
    assert main(["toy", "--protocol", "converged", "--json"]) == 0
    again = _json(capsys)
    assert again["run"] == out["run"]
    assert {k: again[k] for k in ("wall_time_s", "unit_wall_time_s", "merge_wall_time_s")} == \
        {k: out[k] for k in ("wall_time_s", "unit_wall_time_s", "merge_wall_time_s")}

    # a run merged before this fix recorded the merge alone as its wall time: the units are added back
    old = cache / "old" / run.experiment / run.path.name
    shutil.copytree(run.path, old)
    m = json.loads((old / "manifest.json").read_text())
    merge = m.pop("merge_wall_time_s")
    m["wall_time_s"] = merge
    (old / "manifest.json").write_text(json.dumps(m))
    from depthlib.toy import chapter
    s = chapter.summary(results.Run.load(old))
    assert s["merge_wall_time_s"] == merge
    assert s["wall_time_s"] == pytest.approx(m["unit_wall_time_s"] + merge, abs=1e-2)


def test_committed_converged_run_reports_its_recorded_total():
    """The committed cpu protocol run recorded its whole wall time (5,319 s on two workers; 10,579 s of unit time)."""
    from depthlib.toy import chapter
    run = _committed("toy-converged")
    s = chapter.summary(run)
    assert s["wall_time_s"] == run.manifest["wall_time_s"] and s["unit_wall_time_s"] == run.manifest["unit_wall_time_s"]
    assert s["wall_time_s"] >= max(u["wall_time_s"] for u in run.manifest["units"].values())


def test_sharded_toy_sweep_wall_time_covers_its_shards(cache):
    """A sweep trained as shards (serial executor: one after another) records the shards' time in its wall time."""
    from depthlib.toy import chapter, shards
    cfg = chapter.profile_config("smoke", rhos=[0.0, 1.0], temperatures=[1.0], depths=[2, 4], steps=20)
    run = shards.run_sharded(cfg, executors.ExecutorConfig("serial", threads=1))
    m = run.manifest
    assert len(m["shard_wall_time_s"]) == 2
    assert m["wall_time_s"] >= sum(m["shard_wall_time_s"])
    assert chapter.summary(run)["throughput"]["wall_time_s"] == m["wall_time_s"]


def test_sharded_probe_wall_time_covers_its_shards(cache, tmp_path):
    from depthlib.probes import ProbeConfig
    from depthlib.probes import chapter as probe_chapter
    folder = tiny.save_model(tmp_path / "tiny-llama")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(tiny.TEXTS))
    cfg = ProbeConfig(max_length=16, batch_size=2, lens_tokens_per_doc=2, reservoir_size=40)
    run = probe_chapter.run_sharded(str(folder), str(corpus), 4, cfg, executors.ExecutorConfig("serial", threads=1),
                                   n_shards=2)
    m = run.manifest
    assert len(m["shard_wall_time_s"]) == 2 and m["wall_time_s"] >= sum(m["shard_wall_time_s"])


# ---- 6: hidden states that overflow float32 ---------------------------------------------------------------
def _fp32_overflow(m) -> None:
    """Every weight finite, but block 1's MLP output reaches ~1e31: the squared norm of the hidden states after it
    is beyond float32's 3.4e38 (their norm is inf), so no angle between them is defined."""
    m.model.layers[1].mlp.down_proj.weight.fill_(1e30)


def _overflowing_model(folder: Path) -> Path:
    tok = tiny.tokenizer()
    m = tiny.model("llama", len(tok), layers=4)
    with torch.no_grad():
        _fp32_overflow(m)
    assert all(bool(torch.isfinite(p).all()) for p in m.parameters())
    m.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def test_probe_of_hidden_states_that_overflow_float32_fails_in_one_line_and_keeps_no_run(cache, tmp_path, capsys):
    folder = _overflowing_model(tmp_path / "huge")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(tiny.TEXTS))
    capsys.readouterr()
    argv = ["probes", "--model", str(folder), "--corpus", str(corpus), "--docs", "2", "--max-length", "16",
            "--batch-size", "2", "--json"]
    lines = []
    for _ in range(2):                                   # the rerun fails the same way: nothing complete was kept
        assert main(argv) == 2
        captured = capsys.readouterr()
        assert captured.out == ""
        lines.append(_one_line(captured.err))
    assert lines[0] == lines[1]
    line = lines[0]
    assert line.startswith("depthlib probes: error: ") and str(folder) in line, line
    assert "overflow float32" in line and "block 1" in line, line
    assert "loaded a finished run" not in line
    assert not list((paths.local_results_dir()).glob("probes-*/*/manifest.json"))


def test_a_sharded_probe_that_overflows_keeps_neither_the_run_nor_its_shards(cache, tmp_path):
    from depthlib.errors import InputError
    from depthlib.probes import ProbeConfig, chapter
    folder = _overflowing_model(tmp_path / "huge")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(tiny.TEXTS))
    cfg = ProbeConfig(max_length=16, batch_size=2, reservoir_size=40)
    with pytest.raises(InputError, match=r"overflow float32 .*block 1"):
        chapter.compute(chapter.ProbeRun(str(folder), str(corpus), 4, cfg),
                        executor=executors.ExecutorConfig("submitit", jobs=2, cluster="debug", shards=2))
    assert not list(paths.local_results_dir().glob("*/*/manifest.json"))


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning", "ignore:run .* not finite:UserWarning")
def test_a_complete_run_cached_before_the_check_is_not_handed_back(cache, tmp_path):
    """A run of the overflowing model that an older version cached as complete: loading it gives the same error, and
    the local folder is deleted so that the next command computes (and checks) it again."""
    from depthlib.errors import InputError
    from depthlib.probes import ProbeConfig, chapter, run_probe
    folder = _overflowing_model(tmp_path / "huge")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(tiny.TEXTS))
    cfg = ProbeConfig(max_length=16, batch_size=2, reservoir_size=40)
    cached = run_probe(str(folder), str(corpus), 2, cfg, progress=False)        # no check here: what was cached
    assert cached.complete
    with pytest.raises(InputError, match="overflow float32"):
        chapter.summary(cached)                          # a view: it says why, and deletes nothing
    assert cached.complete
    with pytest.raises(InputError, match="overflow float32"):
        chapter.compute(chapter.ProbeRun(str(folder), str(corpus), 2, cfg), progress=False)
    assert not cached.path.exists()
