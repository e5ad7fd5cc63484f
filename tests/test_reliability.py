"""Nothing silently wrong: non-finite numbers, executors that cannot start or are interrupted, options a command
would ignore, plan bounds and model files. Tiny random models built here (tests/tiny.py); no offline LM."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pandas as pd
import pytest
import torch

from depthlib import executors, finite
from depthlib.cli import main
from depthlib.errors import InputError, MachineError
from depthlib.interventions import plan as P
from depthlib.interventions.analysis import plan_effects
from depthlib.interventions.evaluate import score_plans
from depthlib.interventions.execute import capture_lm, run_plan
from tests import tiny

ROOT = Path(__file__).resolve().parents[1]


def _one_line(err: str) -> str:
    """The one message line of stderr (progress bars, which stop where the error came, aside)."""
    lines = [ln for ln in err.replace("\r", "\n").strip().splitlines() if ln.strip() and "%|" not in ln]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


@pytest.fixture
def corpus(tmp_path) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text("\n\n".join(tiny.TEXTS))
    return path


def _tiny_folder(folder: Path, arch: str = "llama", edit=None, max_positions: int = 128) -> Path:
    tok = tiny.tokenizer()
    m = tiny.model(arch, len(tok), layers=4, max_positions=max_positions)
    if edit is not None:
        with torch.no_grad():
            edit(m)
    m.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def _nan_weight(m) -> None:
    m.model.layers[2].mlp.down_proj.weight[0, 0] = float("nan")


def _fp16_overflow(m) -> None:
    """Block 1's MLP output reaches ~7.6e5: finite in fp32 (and every weight fits fp16), beyond fp16's 65504."""
    m.model.layers[1].mlp.down_proj.weight.fill_(6e4)
    m.model.layers[1].mlp.up_proj.weight.mul_(30)


# ---- plans and lengths -------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, message", [("0-99999999999999999999", "out of range"), ("0-9999999", "out of range"),
                                           ("delete:0-99999999999", "out of range"), ("[1-99999999]", "out of range"),
                                           ("٠-٣", "ASCII digits"), ("0-3*1e300", "scale"), ("0-3*1e40", "scale"),
                                           ("0-3*-1e7", "scale")])
def test_plan_bounds_are_checked_before_expanding(text, message):
    t0 = time.perf_counter()
    with pytest.raises(InputError, match=message) as err:
        P.parse_plan(text, 4)
    assert time.perf_counter() - t0 < 0.5 and "\n" not in str(err.value)


def test_identity_kl_is_exactly_zero_and_never_negative():
    tok = tiny.tokenizer()
    m = tiny.model("gemma3", len(tok), layers=6)
    enc = tok(tiny.TEXTS, return_tensors="pt", padding=True)
    with torch.no_grad():
        b = capture_lm(m, enc["input_ids"], enc["attention_mask"])
        ident = b.score(run_plan(P.identity(6), b.block, b.states))
        group_of_one = b.score(run_plan(P.parse_plan("0-5*1.0", 6), b.block, b.states, reuse_prefix=False))
        nearly = b.score(run_plan(P.parse_plan("0-5*1.000001", 6), b.block, b.states))
    assert torch.equal(ident["kl"], torch.zeros(len(tiny.TEXTS)))
    assert torch.equal(group_of_one["kl"], torch.zeros(len(tiny.TEXTS)))     # same stream, recomputed: same bits
    assert (nearly["kl"] >= 0).all()


# ---- non-finite numbers ------------------------------------------------------------------------------------
class _FakeBatch:
    """Scores of a 2-document batch: plan "0-3" finite, any other plan NaN on document 1 (an overflowed pass)."""

    states = [torch.zeros(2, 1, 1)] * 5

    def block(self, i, h):
        return h

    def score(self, h):
        return {"loss": torch.tensor([2.0, 3.0]), "kl": torch.tensor([0.0, 0.0]), "agree": torch.tensor([4.0, 5.0]),
                "n": torch.tensor([4.0, 5.0])}


def test_a_plan_that_overflows_is_null_with_a_warning_never_pooled_away():
    plans = {"0-3": P.identity(4), "0-3*2.0": P.parse_plan("0-3*2.0", 4)}

    class Overflowing(_FakeBatch):
        def score(self, h):
            s = super().score(h)
            if not torch.equal(h, self.states[-1]):
                s["loss"][1] = float("nan")
            return s

    class Scaled(Overflowing):
        def block(self, i, h):
            return h + 1.0
    rows, _ = score_plans(plans, [([0, 1], Scaled)], progress=False)
    bad = rows[rows["plan"] == "0-3*2.0"]
    assert bad["loss"].isna().tolist() == [False, True] and bad["kl"].isna().tolist() == [False, True]
    meta = pd.DataFrame({"family": ["identity", "custom"], "rule": "custom", "plan": list(plans)})
    with pytest.warns(UserWarning, match=r"0-3\*2\.0.*null"):
        eff = plan_effects(meta, rows)
    row = eff.set_index("plan").loc["0-3*2.0"]
    assert pd.isna(row["loss"]) and pd.isna(row["delta_loss"]) and pd.isna(row["kl"]) and pd.isna(row["agree"])
    assert eff.set_index("plan").loc["0-3", "delta_loss"] == 0.0


def test_a_non_finite_unedited_model_stops_the_scoring():
    class Broken(_FakeBatch):
        def score(self, h):
            s = super().score(h)
            s["loss"][0] = float("inf")
            return s
    with pytest.raises(finite.NonFiniteError, match=r"unedited model.*\[7\]"):
        score_plans({"0-3": P.identity(4)}, [([7, 8], Broken)], progress=False)


def test_nan_weight_stops_intervene_probe_and_trace(tmp_path, cache, corpus, capsys):
    folder = _tiny_folder(tmp_path / "nan", edit=_nan_weight)
    capsys.readouterr()                      # saving it printed progress
    common = ["--model", str(folder), "--corpus", str(corpus), "--docs", "2", "--max-length", "16"]
    for argv in (["interventions", *common, "--rank-docs", "2", "--plan", "delete:1"],
                 ["probes", *common, "--batch-size", "2"],
                 ["tracing", "--model", str(folder), "--prompt", "The Space Needle is in downtown",
                  "--subject", "Space Needle", "--samples", "2"]):
        assert main([*argv, "--json"]) == 2, argv
        out = capsys.readouterr()
        assert out.out == ""
        line = _one_line(out.err)
        assert "non-finite" in line and "model.layers.2.mlp.down_proj.weight" in line, line


def test_fp16_overflow_stops_probe_and_trace_naming_the_block(tmp_path, cache, corpus, capsys):
    folder = _tiny_folder(tmp_path / "big", edit=_fp16_overflow)
    capsys.readouterr()                      # saving it printed progress
    for argv in (["probes", "--model", str(folder), "--corpus", str(corpus), "--docs", "2", "--max-length", "16",
                  "--batch-size", "2", "--dtype", "float16"],
                 ["tracing", "--model", str(folder), "--prompt", "The Space Needle is in downtown",
                  "--subject", "Space Needle", "--samples", "2", "--dtype", "float16"]):
        assert main([*argv, "--json"]) == 2, argv
        line = _one_line(capsys.readouterr().err)
        assert "block 1" in line and "float16 overflowed" in line and "float32" in line, line


def test_a_manifest_stores_an_undefined_number_as_null_with_a_warning(cache):
    from depthlib import results
    run = results.open_run("reliability-test", {"a": 1})
    run.path.mkdir(parents=True)
    with pytest.warns(UserWarning, match=r"summary\.theta\[1\] not finite"):
        run.finish(profile="smoke", seed=0, wall_time_s=1.0, code=("depthlib.finite",),
                   summary={"theta": [0.5, float("nan")], "loss": 1.0})
    assert json.loads((run.path / "manifest.json").read_text())["summary"] == {"theta": [0.5, None], "loss": 1.0}


def test_guard_and_weight_check_leave_finite_numbers_unchanged():
    tok = tiny.tokenizer()
    m = tiny.model("llama", len(tok), layers=4)
    ids = tok(tiny.TEXTS[:2], return_tensors="pt", padding=True)
    with torch.no_grad():
        ref = m(**ids).logits
        finite.check_weights(m, "tiny")
        with finite.guard(m, "tiny"):
            guarded = m(**ids).logits
        after = m(**ids).logits
    assert torch.equal(ref, guarded) and torch.equal(ref, after)
    assert not any(mod._forward_hooks for mod in m.modules())          # every hook removed


# ---- executors -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv, message", [
    (["toy", "--jobs", "3"], "--jobs would be ignored by --executor serial"),
    (["toy", "--partition", "gpu", "--time", "5"], "--partition, --time would be ignored by --executor serial"),
    (["lm", "--executor", "joblib", "--partition", "gpu"], "--partition would be ignored by --executor joblib"),
    (["lm", "--executor", "submitit", "--jobs", "4"], "--jobs would be ignored by --executor submitit"),
    (["tracing", "--profile", "smoke", "--shards", "2"], "--shards would be ignored by --executor serial"),
    (["toy", "--executor", "submitit", "--time", "0"], "--time must be >= 1"),
])
def test_executor_flags_the_executor_would_ignore_are_rejected(argv, message, cache, capsys):
    assert main(argv) == 2
    assert message in _one_line(capsys.readouterr().err)


def test_slurm_without_slurm_fails_before_touching_a_run(cache, capsys, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")                 # no srun
    from depthlib.lm import chapter

    def never(*a, **k):
        raise AssertionError("lm started (and --force deleted) the run before the executor was checked")
    monkeypatch.setattr(chapter, "compute", never)
    for argv in (["lm", "--force"], ["toy"], ["probes", "--model", "x/y"]):
        assert main([*argv, "--executor", "submitit", "--cluster", "slurm"]) == 1
        line = _one_line(capsys.readouterr().err)
        assert "no SLURM" in line and "srun" in line, line
    with pytest.raises(MachineError):
        executors.ExecutorConfig("submitit", cluster="slurm").preflight()


_INTERRUPTED = """
import sys
from depthlib import executors
units = [executors.Unit(f"u{i}", "subprocess:call", {"args": ["sh", "-c", f"touch {sys.argv[2]}/started{i}; sleep 60"]})
         for i in range(2)]
try:
    executors.run_units(units, executors.ExecutorConfig(sys.argv[1], jobs=2, threads=1, cluster="local",
                                                        folder=sys.argv[2] + "/logs"))
except KeyboardInterrupt:
    print("interrupted: one line", file=sys.stderr)
    sys.exit(130)
"""


@pytest.mark.parametrize("kind", ["joblib", "submitit"])
def test_ctrl_c_under_an_executor_says_one_line_and_nothing_after(kind, tmp_path):
    """A terminal's Ctrl-C reaches the whole process group: workers and submitit's job controllers included."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), DEPTHLIB_CACHE_DIR=str(tmp_path / "cache"), OMP_NUM_THREADS="1")
    p = subprocess.Popen([sys.executable, "-c", _INTERRUPTED, kind, str(tmp_path)], env=env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    t0 = time.time()
    while not list(tmp_path.glob("started*")) and time.time() - t0 < 120 and p.poll() is None:
        time.sleep(0.2)
    time.sleep(1.0)
    os.killpg(p.pid, signal.SIGINT)
    _, err = p.communicate(timeout=120)
    time.sleep(1.0)
    assert p.returncode == 130, err
    tail = err[err.index("interrupted: one line"):]
    assert tail.strip() == "interrupted: one line", err
    assert "Traceback" not in err and "leaked" not in err and "KeyboardInterrupt" not in err, err


_INTERRUPTED_AT_START = """
import os, signal, sys, threading, time
from depthlib import executors
folder = sys.argv[1]
with open(folder + "/work.py", "w") as f:
    f.write("import time\\ntime.sleep(60)\\n")

def workers():
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            ppid = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
            if ppid == os.getpid() and "LokyProcess" in open(f"/proc/{pid}/cmdline").read():
                yield pid
        except (OSError, IndexError, ValueError):
            pass

def ctrl_c_as_the_workers_start():           # while they import joblib: a terminal's Ctrl-C reaches them all
    while not any(workers()):
        time.sleep(0.005)
    time.sleep(0.05)
    os.killpg(os.getpgid(0), signal.SIGINT)
if sys.argv[2] == "importing":
    threading.Thread(target=ctrl_c_as_the_workers_start, daemon=True).start()
else:                                        # while this process starts them, amid joblib's dispatch
    from joblib.externals.loky.backend import popen_loky_posix
    launch = popen_loky_posix.Popen._launch
    def launch_then_ctrl_c(self, process):
        launch(self, process)
        os.killpg(os.getpgid(0), signal.SIGINT)
    popen_loky_posix.Popen._launch = launch_then_ctrl_c
units = [executors.Unit(f"u{i}", "runpy:run_path", {"path_name": folder + "/work.py"}) for i in range(2)]
try:
    executors.run_units(units, executors.ExecutorConfig("joblib", jobs=2, threads=1, folder=folder + "/logs"))
except KeyboardInterrupt:
    print("interrupted: one line", file=sys.stderr)
    sys.exit(130)
"""


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the workers in /proc")
@pytest.mark.parametrize("when", ["importing", "starting"])
def test_ctrl_c_while_joblib_workers_start_is_one_line(tmp_path, when):
    """The sweep's case F3: Ctrl-C as ``--executor joblib`` starts its workers printed a ``KeyboardInterrupt``
    traceback from each worker still importing joblib; one amid the dispatch made loky's manager thread fail with a
    ``KeyError`` traceback, or joblib warn of cancelled tasks after the one line. The workers start with SIGINT
    blocked, a Ctrl-C meanwhile is raised once they are started, and this process stops them."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), DEPTHLIB_CACHE_DIR=str(tmp_path / "cache"), OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, "-c", _INTERRUPTED_AT_START, str(tmp_path), when], env=env, text=True,
                       capture_output=True, start_new_session=True, timeout=120,
                       preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    err = p.stderr
    assert p.returncode == 130, err
    assert err[err.index("interrupted: one line"):].strip() == "interrupted: one line", err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err and "leaked" not in err, err
    assert "warn" not in err.lower(), err


_CTRL_C_AS_IT_EXITS = """
import os, signal, sys
from depthlib import cli
sys.argv = ["depthlib", *sys.argv[1:]]
status = cli.main()
os.kill(os.getpid(), signal.SIGINT)          # Ctrl-C as the process exits (loky joins its idle workers then)
sys.exit(status)
"""


def test_ctrl_c_after_the_command_has_answered_changes_nothing(tmp_path):
    """The sweep's case F3, the run that exited 0: Ctrl-C after a joblib run had printed its result came while the
    interpreter, exiting, joined loky's idle workers: a ``KeyboardInterrupt`` traceback ("Exception ignored in
    threading"), after the answer. Once ``depthlib`` has answered, Ctrl-C changes neither what it said nor its status."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), DEPTHLIB_CACHE_DIR=str(tmp_path / "cache"), OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, "-c", _CTRL_C_AS_IT_EXITS, "toy", "--depths", "4"], env=env, text=True,
                       capture_output=True, timeout=120, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert p.returncode == 2, p.stderr
    assert _one_line(p.stderr) == "depthlib toy: error: depths needs at least 2 distinct values, got 1"


# ---- options a command would ignore ------------------------------------------------------------------------
def test_trace_profile_rejects_what_a_profile_does_not_take(cache, capsys, monkeypatch):
    from depthlib.tracing import chapter

    def never(*a, **k):
        raise AssertionError("traced before rejecting the options")
    monkeypatch.setattr(chapter, "compute", never)
    argv = ["tracing", "--profile", "smoke", "--force", "--samples", "50", "--noise", "99", "--kind", "attn", "--seed",
            "7", "--dtype", "float16", "--window", "3"]
    assert main(argv) == 2
    line = _one_line(capsys.readouterr().err)
    for flag in ("--force", "--samples", "--noise", "--kind", "--seed", "--dtype", "--window"):
        assert flag in line
    assert main(["tracing", "--profile", "smoke", "--seed", "1"]) == 2       # given, even at its default value
    capsys.readouterr()


def test_trace_profile_checks_the_model_before_tracing(tmp_path, cache, capsys, monkeypatch):
    from depthlib.tracing import chapter
    monkeypatch.setattr(chapter, "compute", lambda *a, **k: pytest.fail("traced before checking --model"))
    a_file = tmp_path / "notes.txt"
    a_file.write_text("not a model")
    assert main(["tracing", "--profile", "smoke", "--model", str(a_file)]) == 2
    assert "is a file" in _one_line(capsys.readouterr().err)
    assert main(["tracing", "--profile", "smoke", "--model", "no-such-model"]) == 2
    assert "unknown model" in _one_line(capsys.readouterr().err)


def test_a_model_that_knows_no_fact_is_counted_zero_with_a_warning():
    from depthlib.tracing.chapter import facts_traced
    facts = pd.DataFrame({"model": ["a", "a", "a"], "fact_id": ["f1", "f2", "f2"]})
    with pytest.warns(UserWarning, match="b knew none"):
        assert facts_traced(["a", "b"], facts) == {"a": 2, "b": 0}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert facts_traced(["a"], facts) == {"a": 2}


# ---- lengths and model files ----------------------------------------------------------------------------------
def test_intervene_checks_the_models_position_limit(tmp_path, cache, corpus, capsys):
    folder = _tiny_folder(tmp_path / "short", arch="gpt2", max_positions=16)
    capsys.readouterr()                      # saving it printed progress
    for length in ("32", "1000000000"):
        assert main(["interventions", "--model", str(folder), "--corpus", str(corpus), "--docs", "2", "--rank-docs", "2",
                     "--max-length", length, "--plan", "delete:1"]) == 2
        assert f"max_length {length} exceeds the model's position limit of 16" in _one_line(capsys.readouterr().err)


def test_truncated_weights_are_one_line_before_loading(tmp_path, cache, corpus, capsys):
    folder = _tiny_folder(tmp_path / "cut")
    capsys.readouterr()                      # saving it printed progress
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    for argv in (["interventions", "--plan", "delete:1"], ["probes"]):
        assert main([*argv, "--model", str(folder), "--corpus", str(corpus), "--docs", "2"]) == 2
        line = _one_line(capsys.readouterr().err)
        assert "cannot read the weights" in line and "truncated" in line, line


def test_docs_zero_says_the_same_in_probe_and_intervene(cache, corpus, capsys):
    for command in ("probes", "intervene"):
        assert main([command, "--model", "smollm2-135m", "--corpus", str(corpus), "--docs", "0"]) == 2
        assert _one_line(capsys.readouterr().err).endswith("error: --docs must be >= 1, got 0")


def test_cli_intervene_reports_identity_kl_zero(tmp_path, cache, corpus, capsys):
    folder = _tiny_folder(tmp_path / "ok")
    capsys.readouterr()                      # saving it printed progress
    assert main(["interventions", "--model", str(folder), "--corpus", str(corpus), "--docs", "2", "--rank-docs", "2",
                 "--max-length", "16", "--plan", "0-3*1.000001", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["plans"][0]["kl"] == 0.0 and out["plans"][1]["kl"] >= 0.0
