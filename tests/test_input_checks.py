"""User-reported inputs that used to fail late or loudly: each is now one ``error:`` line, exit status 2, before any
expensive computation and with nothing cached as complete. Tiny random models (tests/tiny.py); no offline LM, no
network, no SLURM."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from depthlib import validate
from depthlib.cli import main
from depthlib.models import checks
from tests import tiny
from tests.test_reliability import _one_line

ROOT = Path(__file__).resolve().parents[1]


def _fails(capsys, argv: list[str]) -> str:
    assert main(argv) == 2, argv
    line = _one_line(capsys.readouterr().err)
    assert " error: " in line, line
    return line


def _complete_runs(cache: Path) -> list[Path]:
    return [m.parent for m in cache.rglob("manifest.json") if json.loads(m.read_text()).get("status") == "complete"]


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return tiny.save_model(tmp_path_factory.mktemp("tiny") / "llama")


@pytest.fixture
def corpus(tmp_path) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text("\n\n".join(tiny.TEXTS))
    return path


def _subprocess(argv: list[str], cache: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), DEPTHLIB_CACHE_DIR=str(cache), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "depthlib.cli", *argv], env=env, text=True, capture_output=True,
                          timeout=300)


# ---- 7: tracing --samples ----------------------------------------------------------------------------------
TRACE = ["tracing", "--prompt", "The Space Needle is in downtown", "--subject", "Space Needle"]


def test_tracing_samples_beyond_the_cap_is_one_line_before_loading(model, cache, capsys, monkeypatch):
    from depthlib.tracing import chapter
    monkeypatch.setattr(chapter, "trace_one", lambda *a, **k: pytest.fail("traced before checking --samples"))
    line = _fails(capsys, [*TRACE, "--model", str(model), "--samples", "1000000000"])
    assert "--samples must be in [1, 1000]" in line, line


def test_tracing_samples_beyond_memory_say_what_they_would_need(model, cache, capsys, monkeypatch):
    monkeypatch.setattr(validate, "available_memory", lambda device="cpu": 1 << 20)     # 1 MiB free
    line = _fails(capsys, [*TRACE, "--model", str(model), "--samples", "1000"])
    assert "--samples 1000" in line and "would need" in line and "1.0 MiB" in line, line


# ---- 8: scaling --bootstrap --------------------------------------------------------------------------------
def test_scaling_bootstrap_beyond_memory_is_one_line_in_a_subprocess(chinchilla_df, tmp_path):
    p = _subprocess(["scaling", "--bootstrap", "1000000000"], tmp_path / "cache")
    assert p.returncode == 2, p.stderr
    line = _one_line(p.stderr)
    assert "--bootstrap 1000000000" in line and "would need" in line and "TiB" in line, line


def test_scaling_bootstrap_is_checked_before_the_fit(chinchilla_df, capsys, monkeypatch):
    from depthlib import scaling
    assert validate.available_memory() > 0
    monkeypatch.setattr(scaling, "fit_decomposed_law", lambda *a, **k: pytest.fail("fitted before the check"))
    monkeypatch.setattr(validate, "available_memory", lambda device="cpu": 10 << 20)
    assert "would need" in _fails(capsys, ["scaling", "--bootstrap", "1000"])


# ---- 9: submitit failures ----------------------------------------------------------------------------------
TOY = ["toy", "--rho", "0", "1", "--temperature", "1", "--depths", "2", "3", "--steps", "5", "--executor", "submitit"]


def test_sbatch_refusal_is_one_line_naming_the_unit_and_its_log(cache, tmp_path, capsys, monkeypatch):
    """A fake sbatch that refuses the partition (as SLURM does): submitit raises FailedJobError (and prints
    sbatch's stderr); we say one line."""
    pytest.importorskip("submitit")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (("srun", "exit 0"),
                       ("sbatch", "echo 'sbatch: error: invalid partition specified: nope' >&2; exit 1")):
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    line = _fails(capsys, [*TOY, "--cluster", "slurm", "--partition", "nope"])
    assert "invalid partition specified: nope" in line and "unit toy-rho0 and 1 other unit" in line, line
    log = Path(line.split("(log: ")[1].rstrip(")"))
    assert log.is_file() and "invalid partition" in log.read_text()
    assert _complete_runs(cache) == []


def test_a_failed_slurm_job_is_one_line_naming_the_unit_and_its_log(cache, tmp_path, capsys, monkeypatch):
    """submitit's job objects faked: the job 'ran' and failed (srun refused it)."""
    submitit = pytest.importorskip("submitit")
    from submitit.core.utils import FailedJobError
    monkeypatch.setattr("depthlib.executors.ExecutorConfig.preflight", lambda self: self)
    log = tmp_path / "1_0_log.err"
    log.write_text("srun: error: Unable to create step for job 1: Invalid partition name specified\n")

    class Job:
        paths = type("Paths", (), {"stdout": tmp_path / "1_0_log.out", "stderr": log})()

        def done(self):
            return True

        def result(self):
            raise FailedJobError(f"Job 1_0 failed (state: FAILED)\nError stream produced:\n{log.read_text()}")

    class Executor:
        def __init__(self, **kwargs):
            pass

        def update_parameters(self, **kwargs):
            pass

        def submit_array(self, fns):
            return [Job() for _ in fns]

    monkeypatch.setattr(submitit, "AutoExecutor", Executor)
    line = _fails(capsys, [*TOY, "--cluster", "slurm"])
    assert "toy-rho0 failed" in line and "Invalid partition name" in line and str(log) in line, line
    assert _complete_runs(cache) == []


# ---- 16: a --model path that does not exist ---------------------------------------------------------------
@pytest.mark.parametrize("name", ["./no-such-model", "/nonexistent/model", "~/no-such-model-folder",
                                  "models/../no-such-model", "{tmp}/no-such-model"])
@pytest.mark.parametrize("command", [["probes"], ["interventions"], [*TRACE], ["tracing", "--profile", "smoke"]])
def test_a_model_path_that_does_not_exist_is_named(name, command, tmp_path, cache, capsys, monkeypatch):
    from depthlib.tracing import chapter
    monkeypatch.setattr(chapter, "compute", lambda *a, **k: pytest.fail("traced before checking --model"))
    name = name.format(tmp=tmp_path)
    line = _fails(capsys, [*command, "--model", name])
    assert f"no model folder at {os.path.abspath(os.path.expanduser(name))}" in line, line


def test_a_partial_path_that_exists_is_a_path_not_a_hub_id(tmp_path, cache, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    line = _fails(capsys, ["probes", "--model", "models/tiny-llama"])
    assert f"no model folder at {tmp_path / 'models' / 'tiny-llama'}" in line, line
    checks.model_files("--model", "EleutherAI/pythia-410m")   # a hub id whose namespace is no folder here


def test_every_model_of_a_tracing_run_is_checked_before_the_first_trace(cache, monkeypatch):
    from depthlib.errors import InputError
    from depthlib.tracing import chapter
    monkeypatch.setattr(chapter, "model_prompts", lambda *a, **k: pytest.fail("traced a model before the check"))
    with pytest.raises(InputError, match=f"no model folder at {Path.cwd() / 'nope' / 'missing-model'}"):
        chapter.compute(dataclasses.replace(chapter.PROFILES["smoke"], extra_models=("./nope/missing-model",)))
    assert _complete_runs(cache) == []


def test_a_missing_model_path_is_one_line_in_a_subprocess(tmp_path):
    p = _subprocess(["tracing", "--profile", "smoke", "--model", "./no-such-model"], tmp_path / "cache")
    assert p.returncode == 2, p.stderr
    assert f"no model folder at {Path.cwd() / 'no-such-model'}" in _one_line(p.stderr)


# ---- 17: probes with too few tokens for the trajectory analysis ---------------------------------------------
def test_probes_max_length_too_short_for_the_trajectories(model, corpus, cache, capsys, monkeypatch):
    from depthlib.probes import chapter
    monkeypatch.setattr(chapter, "compute", lambda *a, **k: pytest.fail("probed before the check"))
    line = _fails(capsys, ["probes", "--model", str(model), "--corpus", str(corpus), "--docs", "1",
                           "--max-length", "3"])
    assert "3 token trajectories" in line and "--max-length" in line, line


def test_probes_one_line_corpus_fails_before_computing(model, tmp_path, cache, capsys):
    one = tmp_path / "one.txt"
    one.write_text("Hi.")               # three tokens: two trajectories
    line = _fails(capsys, ["probes", "--model", str(model), "--corpus", str(one), "--docs", "1", "--max-length", "64"])
    assert "3 token trajectories" in line and "give 2" in line and "--docs" in line, line
    assert _complete_runs(cache) == []


def test_probes_with_just_enough_tokens_still_run(model, corpus, cache, capsys):
    """One document of four tokens: three trajectories (the check counts what the probe samples)."""
    assert main(["probes", "--model", str(model), "--corpus", str(corpus), "--docs", "1", "--max-length", "4",
                 "--no-lenses", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["n_tokens"] == 3


# ---- 20: lm --profile paper on a CPU -----------------------------------------------------------------------
def test_lm_paper_on_a_cpu_is_refused_with_its_cost(cache, capsys, monkeypatch):
    import torch

    from depthlib.lm import chapter
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(chapter, "compute", lambda *a, **k: pytest.fail("started training on the CPU"))
    line = _fails(capsys, ["lm", "--profile", "paper"])
    assert "30 models" in line and "PFLOP" in line and "hours" in line and "--allow-cpu" in line, line
    assert "--allow-cpu" in _fails(capsys, ["lm", "--profile", "paper", "--device", "cpu"])


def test_lm_paper_on_a_cpu_runs_with_allow_cpu(cache, capsys, monkeypatch):
    import torch

    from depthlib.lm import chapter
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)

    class Started(Exception):
        pass

    def started(cfg, device, **kwargs):
        assert cfg.profile == "paper" and device == "cpu"
        raise Started
    monkeypatch.setattr(chapter, "compute", started)
    with pytest.raises(Started):
        main(["lm", "--profile", "paper", "--allow-cpu"])
    assert "--allow-cpu" in subprocess.run([sys.executable, "-m", "depthlib.cli", "lm", "--help"], text=True,
                                           capture_output=True, env=dict(os.environ, PYTHONPATH=str(ROOT))).stdout


# ---- the sweep's F4, F5: a corpus too short, a length past the model's positions: before any run is opened -----
@pytest.fixture
def no_run_opened(monkeypatch):
    """Opening a run (the lifecycle's first step: a --force would delete it there) fails the test."""
    from depthlib import lifecycle
    monkeypatch.setattr(lifecycle, "prepare_run", lambda *a, **k: pytest.fail("opened the run before the check"))


INTERVENTIONS = ["interventions", "--plan", "delete:1", "--rank-docs", "2"]


@pytest.mark.parametrize("command", [["probes"], INTERVENTIONS])
def test_more_docs_than_the_corpus_has_is_one_line(command, model, corpus, cache, capsys, no_run_opened):
    """F4: ``--docs 1000000000`` was clamped to the corpus with a warning (a run of other settings than asked)."""
    line = _fails(capsys, [*command, "--model", str(model), "--corpus", str(corpus), "--docs", "1000000000",
                           "--max-length", "16"])
    assert f"documents, but corpus {str(corpus)!r} has only {len(tiny.TEXTS)}; ask for" in line, line
    assert "--docs 1000000000" in line and "1,000,000,0" in line, line
    assert not (cache / "results").exists()


def test_interventions_count_the_ranking_documents_too(model, corpus, cache, capsys, no_run_opened):
    n = len(tiny.TEXTS)
    line = _fails(capsys, [*INTERVENTIONS[:-2], "--rank-docs", str(n - 1), "--model", str(model), "--corpus",
                           str(corpus), "--docs", "2", "--max-length", "16"])
    assert line.endswith(f"error: --rank-docs {n - 1} + --docs 2 ask for {n + 1} documents, but corpus "
                         f"{str(corpus)!r} has only {n}; ask for --docs 1 at most"), line


@pytest.mark.parametrize("command", [["probes"], INTERVENTIONS])
@pytest.mark.parametrize("length", ["129", "1000000000"])
def test_max_length_past_the_position_limit_is_checked_before_the_run_opens(command, length, model, corpus, cache,
                                                                            capsys, no_run_opened):
    """F5: the position limit was checked once the model was loaded, in the opened run (probes left its folder with
    a progress.json behind; a --force had deleted the run first)."""
    line = _fails(capsys, [*command, "--model", str(model), "--corpus", str(corpus), "--docs", "2",
                           "--max-length", length])
    assert f"max_length {length} exceeds the model's position limit of 128 tokens" in line, line
    assert not (cache / "results").exists()


# ---- the sweep's F6: flags that contradict each other ------------------------------------------------------
def test_toy_tf32_on_the_cpu_is_one_line(cache, capsys, monkeypatch):
    """``--tf32`` allows TF32 matmuls on CUDA: on the CPU it changed nothing but the run's cache key."""
    from depthlib.toy import chapter
    monkeypatch.setattr(chapter, "run_sweep", lambda *a, **k: pytest.fail("trained with --tf32 on the CPU"))
    line = _fails(capsys, ["toy", "--tf32"])
    assert "--tf32" in line and "CUDA" in line and "cpu" in line, line
    with pytest.raises(validate.InputError, match="--tf32"):
        chapter.compute(dataclasses.replace(chapter.profile_config("smoke"), tf32=True), "cpu")


@pytest.mark.parametrize("flag", [["--lens-tokens", "4"], ["--lens-tokens", "0"], ["--lens-docs", "2"]])
def test_probes_lens_settings_without_lenses_are_one_line(flag, model, corpus, cache, capsys, monkeypatch):
    from depthlib.probes import chapter
    monkeypatch.setattr(chapter, "compute", lambda *a, **k: pytest.fail("probed with contradictory flags"))
    line = _fails(capsys, ["probes", "--model", str(model), "--corpus", str(corpus), "--docs", "2", "--no-lenses",
                           *flag])
    assert f"{flag[0]} sets the lenses, which --no-lenses turns off" in line, line


# ---- the sweep's F1: a toy sweep that cannot fit in memory --------------------------------------------------
def test_a_toy_sweep_beyond_memory_is_one_line_before_training(cache, capsys, monkeypatch):
    """``--depths 4096 4095 --replicates 1000`` (each within its own bound) asked the engine for terabytes: a
    traceback from the allocator, or a machine swapping for minutes."""
    from depthlib.toy import chapter
    monkeypatch.setattr(chapter, "run_sweep", lambda *a, **k: pytest.fail("built the engine"))
    monkeypatch.setattr(validate, "available_memory", lambda device="cpu": 64 * 2**30)
    line = _fails(capsys, ["toy", "--depths", "4096", "4095", "--replicates", "1000"])
    assert "a toy sweep of 12,000 students" in line and "TiB of memory, more than the 64.0 GiB available" in line, line
    assert "--depths" in line and "--replicates" in line, line
    assert not (cache / "results").exists()
    monkeypatch.setattr(validate, "available_memory", lambda device="cpu": 2**30)        # 1 GiB: the smoke sweep fits
    assert chapter.sweep_memory(chapter.profile_config("smoke"), "cpu") < 2**28


def test_a_toy_sweep_beyond_memory_is_one_line_in_a_subprocess(tmp_path):
    done = _subprocess(["toy", "--depths", "4096", "4095", "--replicates", "1000", "--rho", "0", "0.5", "1",
                        "--temperature", "0.1", "1"], tmp_path / "cache")
    assert done.returncode == 2, done.stderr
    assert "would need about" in _one_line(done.stderr)


def test_the_memory_check_leaves_a_damaged_run_to_its_repair(cache, capsys):
    """The check asks whether the run is finished (it then needs no memory): a corrupt manifest there (``toy
    --calibration both`` after a crash) is the lifecycle's to repair, not a CorruptRunError of the check."""
    from depthlib.toy import chapter
    cfg = chapter.profile_config("smoke", rhos=[0.0], temperatures=[1.0], depths=[1, 2], steps=2)
    run = chapter.compute(cfg, progress=False)
    (run.path / "manifest.json").write_text('{"status": "compl')
    capsys.readouterr()
    again = chapter.compute(cfg, progress=False)
    assert again.complete and again.path == run.path
    assert "damaged run" in capsys.readouterr().err
