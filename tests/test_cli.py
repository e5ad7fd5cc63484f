"""The `depthlib` command's contract: one JSON object on stdout, exit 2 with a one-line message on bad input."""
import json
import subprocess
import sys

import pytest

from depthlib import cli


def run(*args, env=None):
    return subprocess.run([sys.executable, "-m", "depthlib.cli", *args], capture_output=True, text=True, env=env)


def test_fit_paper_json_has_the_contract_keys():
    out = run("scaling", "--preset", "paper", "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    for key in ("alpha_m", "alpha_l", "alpha_D", "L0", "c_m", "c_l", "c_D", "mean_rel_err", "n_points", "se"):
        assert key in result
    assert result["alpha_l"] == pytest.approx(1.201, abs=0.005)
    assert result["n_points"] == 203
    assert set(result["se"]) >= {"alpha_m", "alpha_l", "alpha_D", "L0"}


def test_former_command_names_still_run(capsys):
    """Commands renamed to their chapter's one name (fit → scaling, …) still answer to the former name."""
    assert cli.main(["fit", "--preset", "paper", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["alpha_l"] == pytest.approx(1.201, abs=0.005)
    assert "tracing needs --model" in _fails(capsys, ["trace", "--prompt", "x"])
    usage = cli.build_parser().format_usage()            # the usage line names each chapter once, by its name
    assert "{scaling,probes,toy,tracing,interventions,lm,compose,book}" in usage and "fit" not in usage


def test_fit_converged_with_bootstrap(capsys):
    assert cli.main(["scaling", "--json", "--bootstrap", "20", "--exclude", "30"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["preset"] == "converged" and result["exclude"] == 30
    assert result["bootstrap"]["n_resamples"] == 20
    assert result["bootstrap"]["alpha_l"]["lo"] <= result["bootstrap"]["alpha_l"]["hi"]


@pytest.mark.parametrize("args, message", [
    (["scaling", "--exclude", "-3"], "exclude must be in [0, 244], got -3"),
    (["scaling", "--exclude", "400"], "exclude must be in"),
    (["scaling", "--bootstrap", "-1"], "--bootstrap must be >= 0"),
    (["scaling", "--preset", "fast"], "invalid choice: 'fast'"),
    (["scaling", "--depth-offset", "1"], "invalid choice: 1"),
    (["scaling", "--data", "/nonexistent/file.csv"], "Chinchilla CSV not found"),
    (["scaling", "--preset", "paper", "--objective", "huber"], "the paper preset uses the paper's objective"),
    (["nonsense"], "invalid choice"),
])
def test_bad_input_exits_2_with_one_line(args, message):
    out = run(*args)
    assert out.returncode == 2
    assert out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) >= 1 and message in lines[-1], out.stderr
    assert "Traceback" not in out.stderr


def test_fit_classic_chinchilla_law(capsys):
    """`depthlib scaling --law chinchilla` fits L = E + A/N^α + B/D^β (with a bootstrap); the depth offset is refused."""
    assert cli.main(["scaling", "--law", "chinchilla", "--json", "--bootstrap", "10"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["law"] == "chinchilla" and result["n_points"] == 203
    assert {"alpha_N", "alpha_D", "c_N", "c_D", "L0"} <= set(result) and "alpha_l" not in result
    assert 0.2 < result["alpha_N"] < 0.6 and result["mean_rel_err"] < 0.006
    assert set(result["se"]) == {"alpha_N", "alpha_D", "L0", "ln_c_N", "ln_c_D"}
    assert set(result["bootstrap"]) >= {"alpha_N", "alpha_D", "L0"}
    for args, message in ((["--depth-offset", "2"], "--depth-offset applies to the decomposed law only"),
                          (["--preset", "paper"], "the paper preset uses the paper's objective")):
        out = run("scaling", "--law", "chinchilla", *args)
        assert out.returncode == 2 and out.stdout == "" and message in out.stderr.strip().splitlines()[-1], out.stderr


# ---- nothing lost, nothing silently wrong ------------------------------------------------------------
# One test per case of the issue; the CLI runs in this process (cli.main) except where a real pipe or signal is
# the point. Every error case checks: the exit status, one line on stderr naming what is wrong, no traceback.
import errno  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from tests import tiny  # noqa: E402

PROBE = ["--corpus", "c.txt", "--docs", "2", "--max-length", "16", "--batch-size", "2", "--lens-tokens", "3"]
TRACE = ["--prompt", "The Space Needle is in downtown", "--subject", "Space Needle", "--samples", "1"]


@pytest.fixture(scope="module")
def tiny_folders(tmp_path_factory):
    """Two working directories, each with a model folder named `m` (a Llama in a/, a GPT-NeoX in b/), a GPT-2
    (128 positions) and the same corpus file c.txt."""
    root = tmp_path_factory.mktemp("issue10")
    for sub, arch in (("a", "llama"), ("b", "neox")):
        (root / sub).mkdir()
        tiny.save_model(root / sub / "m", arch, layers=2)
        (root / sub / "c.txt").write_text("\n\n".join(tiny.TEXTS))
    tiny.save_model(root / "g2", "gpt2", layers=2)
    return root


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DEPTHLIB_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / "results"


def _fails(capsys, argv, status=2):
    """Run the CLI; assert exit ``status``, empty stdout and exactly one stderr line; return that line."""
    assert cli.main(argv) == status
    captured = capsys.readouterr()
    assert captured.out == "" and "Traceback" not in captured.err
    lines = [ln for ln in captured.err.replace("\r", "\n").splitlines()
             if ln.strip() and "%|" not in ln and not ln.startswith("[depthlib]")]   # not progress bars, notes
    assert len(lines) == 1, captured.err
    return lines[0]


def _ok(capsys, argv):
    assert cli.main(argv) == 0
    captured = capsys.readouterr()
    return json.loads(captured.out), captured.err


def _probe(capsys, monkeypatch, folder, *extra, model="m"):
    monkeypatch.chdir(folder)
    return _ok(capsys, ["probes", "--model", model, *PROBE, *extra, "--json"])


# -- silently wrong ------------------------------------------------------------------------------------------
def test_probe_cache_keyed_on_what_the_model_is_and_says_when_cached(tiny_folders, cache, capsys, monkeypatch):
    a, err_a = _probe(capsys, monkeypatch, tiny_folders / "a")
    b, err_b = _probe(capsys, monkeypatch, tiny_folders / "b")          # same text `--model m`, another model: not the cache
    assert a["model_type"] == "llama" and b["model_type"] == "gpt_neox"
    assert "from the cache" not in err_a + err_b
    again, err = _probe(capsys, monkeypatch, tiny_folders / "b")
    assert again == b and f"[depthlib] loaded a finished run from the cache: {cache}" in err


def test_probe_cache_keyed_on_the_corpus_content(tiny_folders, cache, capsys, monkeypatch, tmp_path):
    work = tmp_path / "w"
    work.mkdir()
    (work / "m").symlink_to(tiny_folders / "a" / "m")
    (work / "c.txt").write_text("\n\n".join(tiny.TEXTS))
    first, _ = _probe(capsys, monkeypatch, work)
    (work / "c.txt").write_text("\n\n".join(reversed(tiny.TEXTS)))
    second, err = _probe(capsys, monkeypatch, work)
    assert "from the cache" not in err and first["theta_by_layer"] != second["theta_by_layer"]


def test_fit_with_one_point_is_refused(capsys):
    line = _fails(capsys, ["scaling", "--exclude", "244", "--json"])
    assert "only 1 point(s)" in line and "at least 5 points per free parameter" in line


@pytest.mark.parametrize("preset", ["paper", "converged"])
def test_fit_of_a_three_row_csv_is_refused(chinchilla_df, tmp_path, capsys, preset):
    chinchilla_df.head(3).to_csv(tmp_path / "three.csv", index=False)
    line = _fails(capsys, ["scaling", "--data", str(tmp_path / "three.csv"), "--exclude", "0", "--preset", preset])
    assert "only 3 point(s)" in line and "needs at least 35" in line


def test_fit_warns_on_duplicate_rows(chinchilla_df, tmp_path, capsys):
    pd.concat([chinchilla_df, chinchilla_df]).to_csv(tmp_path / "dup.csv", index=False)
    out, err = _ok(capsys, ["scaling", "--data", str(tmp_path / "dup.csv"), "--json"])
    warning = [ln for ln in err.splitlines() if "warning" in ln]
    assert len(warning) == 1 and "245 row(s) of the data repeat an earlier row" in warning[0], err


def test_json_output_is_strict(capsys):
    cli._print_json({"nan": float("nan"), "inf": np.float64(np.inf), "np": np.float32(0.5), "i": np.int64(3),
                     "list": [np.nan, 1.0], "array": np.array([1.0, -np.inf]), "nested": {"x": (np.float64(2.0),)}})
    text = capsys.readouterr().out
    parsed = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))
    assert parsed == {"nan": None, "inf": None, "np": 0.5, "i": 3, "list": [None, 1.0], "array": [1.0, None],
                      "nested": {"x": [2.0]}}


def test_probe_lens_docs_zero_is_refused(tiny_folders, cache, capsys, monkeypatch):
    monkeypatch.chdir(tiny_folders / "a")
    assert "lens documents must be >= 1" in _fails(capsys, ["probes", "--model", "m", *PROBE, "--lens-docs", "0", "--json"])


def test_toy_infinite_temperature_is_refused(cache, capsys):
    line = _fails(capsys, ["toy", "--temperature", "inf", "--json"])
    assert line == "depthlib toy: error: temperature must be a finite number, got inf"


def test_probe_negative_lens_docs_is_refused(tiny_folders, cache, capsys, monkeypatch):
    monkeypatch.chdir(tiny_folders / "a")
    assert "got -1" in _fails(capsys, ["probes", "--model", "m", *PROBE, "--lens-docs", "-1"])


def test_jsonl_null_text_is_refused(tiny_folders, cache, capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tiny_folders / "a")
    (tmp_path / "n.jsonl").write_text('{"text": "fine"}\n{"text": null}\n')
    line = _fails(capsys, ["probes", "--model", "m", "--corpus", str(tmp_path / "n.jsonl"), "--docs", "2"])
    assert "n.jsonl: line 2: 'text' must be a string, got null" in line


def test_more_docs_than_the_corpus_is_refused_with_the_real_count(tiny_folders, cache, capsys, monkeypatch):
    """The sweep's F4: it was clamped to the corpus with a warning, and cached under the settings asked for."""
    monkeypatch.chdir(tiny_folders / "a")
    line = _fails(capsys, ["probes", "--model", "m", *PROBE[:2], "--docs", "40", *PROBE[4:], "--json"])
    assert "--docs 40 asks for 40 documents, but corpus 'c.txt' has only 5; ask for at most 5" in line


def test_documents_longer_than_the_position_limit_are_refused(tiny_folders, cache, capsys, monkeypatch):
    monkeypatch.chdir(tiny_folders / "a")
    line = _fails(capsys, ["probes", "--model", str(tiny_folders / "g2"), "--corpus", "c.txt", "--docs", "2",
                           "--max-length", "1000"])
    assert "max_length 1000 exceeds the model's position limit of 128 tokens" in line


def test_prompts_longer_than_the_position_limit_are_refused(tiny_folders, capsys):
    line = _fails(capsys, ["tracing", "--model", str(tiny_folders / "g2"), "--prompt", "The Space Needle is in " * 60,
                           "--subject", "Space Needle", "--samples", "1"])
    assert "more than the model's limit of 128" in line


def test_trace_target_without_leading_space_warns(tiny_folders, capsys):
    out, err = _ok(capsys, ["tracing", "--model", str(tiny_folders / "a" / "m"), *TRACE, "--target", "Se", "--json"])
    assert "[depthlib] warning: target 'Se' is glued to the prompt's last word" in err and "' Se'" in err


def test_trace_zero_noise_warns_once(tiny_folders, capsys):
    out, err = _ok(capsys, ["tracing", "--model", str(tiny_folders / "a" / "m"), *TRACE, "--noise", "0", "--json"])
    warnings_ = [ln for ln in err.splitlines() if "warning" in ln]
    assert len(warnings_) == 1 and "σ = 0" in warnings_[0]


@pytest.mark.parametrize("depths, message", [(["4", "4"], "depths has duplicates: 4"),
                                             (["4"], "depths needs at least 2 distinct values, got 1")])
def test_toy_duplicate_or_single_depths_are_refused(cache, capsys, depths, message):
    assert message in _fails(capsys, ["toy", "--depths", *depths, "--json"])


# -- tracebacks where the contract promises one line ------------------------------------------------------
@pytest.mark.parametrize("content, message", [(b"caf\xe9\n\nabc\n", "not UTF-8 text (byte 0xe9 at byte offset 3)"),
                                              (b"ab\x00\x01\xff", "a NUL byte at byte offset 2")])
def test_latin1_or_binary_corpus_is_one_line(tiny_folders, cache, capsys, monkeypatch, tmp_path, content, message):
    monkeypatch.chdir(tiny_folders / "a")
    (tmp_path / "bad.txt").write_bytes(content)
    line = _fails(capsys, ["probes", "--model", "m", "--corpus", str(tmp_path / "bad.txt"), "--docs", "2"])
    assert str(tmp_path / "bad.txt") in line and message in line


def test_trace_unknown_device_is_one_line(tiny_folders, capsys):
    line = _fails(capsys, ["tracing", "--model", str(tiny_folders / "a" / "m"), *TRACE, "--device", "tpu"])
    assert line == "depthlib tracing: error: device must be cpu, cuda or cuda:N, got 'tpu'"


def test_negative_seed_is_one_line(tiny_folders, cache, capsys, monkeypatch):
    assert "--seed must be in [0, " in _fails(capsys, ["scaling", "--seed", "-1"])
    monkeypatch.chdir(tiny_folders / "a")
    assert "seed must be in [0, " in _fails(capsys, ["probes", "--model", "m", *PROBE, "--seed", "-1"])


def test_unreadable_data_folder_is_one_line(tmp_path, capsys, monkeypatch):
    folder = tmp_path / "locked"
    folder.mkdir()
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if Path(p) == folder else real(p, mode, **kw))
    line = _fails(capsys, ["scaling", "--data", str(folder)])
    assert line == f"depthlib scaling: error: cannot read --data {folder}: permission denied"
    inner = folder / "get_fitting_data_chinchilla.csv"
    real_stat = Path.stat

    def untraversable(self, *a, **kw):       # what stat() says inside a folder without search permission
        if self == inner:
            raise PermissionError(13, "Permission denied", str(self))
        return real_stat(self, *a, **kw)
    monkeypatch.setattr(Path, "stat", untraversable)
    line = _fails(capsys, ["scaling", "--data", str(inner)])
    assert line == f"depthlib scaling: error: cannot read --data {inner}: permission denied (on a folder on its way)"


@pytest.mark.parametrize("depth", ["100000", "100000000"])
def test_huge_toy_depths_are_refused_at_once(cache, capsys, depth):
    t0 = time.perf_counter()
    assert f"student depth must be in [1, 4096], got {depth}" in _fails(capsys, ["toy", "--depths", "2", depth])
    assert time.perf_counter() - t0 < 10


def test_read_only_cache_is_one_line_exit_1(tmp_path, capsys, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("DEPTHLIB_CACHE_DIR", str(blocker / "cache"))
    line = _fails(capsys, ["toy", "--steps", "2", "--json"], status=1)
    assert line.startswith(f"depthlib toy: error: cannot write {blocker}") and "DEPTHLIB_CACHE_DIR" in line
    real_mkdir = Path.mkdir

    def read_only(self, *a, **kw):
        raise OSError(errno.EROFS, "Read-only file system", str(self))
    monkeypatch.setenv("DEPTHLIB_CACHE_DIR", str(tmp_path / "ro"))
    monkeypatch.setattr(Path, "mkdir", read_only)
    line = _fails(capsys, ["toy", "--steps", "2", "--json"], status=1)
    monkeypatch.setattr(Path, "mkdir", real_mkdir)
    assert "read-only file system" in line and str(tmp_path / "ro") in line


def test_full_disk_is_one_line_and_leaves_no_tmp_files(cache, capsys, monkeypatch):
    import torch
    real_save = torch.save

    def full(obj, f, *a, **kw):       # what a full disk does to torch.save: half a file, then a RuntimeError
        Path(f).write_bytes(b"PK half")
        raise RuntimeError("[enforce fail at inline_container.cc:603] . unexpected pos 64 vs 0: "
                           "PytorchStreamWriter failed writing file data/0: file write failed")
    monkeypatch.setattr(torch, "save", full)
    line = _fails(capsys, ["toy", "--steps", "20", "--json"], status=1)
    monkeypatch.setattr(torch, "save", real_save)
    assert "cannot write a checkpoint in" in line and "the disk is full" in line
    assert not list(cache.rglob("*.tmp*"))

    def no_space(self, path, *a, **kw):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))
    monkeypatch.setattr(pd.DataFrame, "to_parquet", no_space)
    line = _fails(capsys, ["toy", "--steps", "20", "--force", "--json"], status=1)
    assert "the disk is full" in line and not list(cache.rglob("*.tmp*"))


def test_json_into_a_closed_pipe_is_quiet(tmp_path):
    script = f"{sys.executable} -m depthlib.cli fit --json | head -c 100 > /dev/null; echo ${{PIPESTATUS[0]}}"
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True)
    assert out.stdout.strip() == "0" and out.stderr == "", out.stderr


def test_ctrl_c_says_what_was_saved_and_how_to_resume(tmp_path):
    env = {**os.environ, "DEPTHLIB_CACHE_DIR": str(tmp_path / "cache")}
    # a pytest-xdist worker ignores SIGINT, and a child that inherits SIG_IGN never sees Ctrl-C: restore the default
    proc = subprocess.Popen([sys.executable, "-m", "depthlib.cli", "toy", "--steps", "100000", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    # generous limits: with one pytest worker per core and the other worker busy, start-up (imports, the teachers) and
    # the checkpoint written on Ctrl-C take minutes on a loaded 2-core machine, seconds on an idle one
    deadline = time.time() + 600
    while not list((tmp_path / "cache").rglob("checkpoint.pt")) and time.time() < deadline:
        time.sleep(0.2)
    assert list((tmp_path / "cache").rglob("checkpoint.pt")), "no checkpoint within 10 minutes"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 130 and out == "" and "Traceback" not in err
    last = err.strip().replace("\r", "\n").splitlines()[-1]
    assert last.startswith("depthlib toy: interrupted: the sweep's last checkpoint") and str(tmp_path) in last
    assert last.endswith("run `depthlib toy --steps 100000 --json` again to resume")


# -- a corrupt cache ---------------------------------------------------------------------------------------
def test_probe_truncated_manifest_is_recomputed_also_with_force(tiny_folders, cache, capsys, monkeypatch):
    first, _ = _probe(capsys, monkeypatch, tiny_folders / "a")
    (manifest,) = cache.glob("probes-m/*/manifest.json")
    for extra in ((), ("--force",)):
        manifest.write_text(manifest.read_text()[:40])
        again, err = _probe(capsys, monkeypatch, tiny_folders / "a", *extra)
        assert again == first
        assert (f"damaged run {manifest.parent}: removed its manifest (its manifest.json is unreadable)" in err
                or f"--force: deleting the cached run {manifest.parent}" in err)


def test_probe_truncated_table_is_recomputed(tiny_folders, cache, capsys, monkeypatch):
    first, _ = _probe(capsys, monkeypatch, tiny_folders / "a")
    (table,) = cache.glob("probes-m/*/tokens.parquet")
    table.write_bytes(table.read_bytes()[:100])
    again, err = _probe(capsys, monkeypatch, tiny_folders / "a")
    assert again == first and f"damaged run {table.parent}: removed table tokens (it failed its checksum)" in err


def _partial_toy(steps=60, stop=40):
    from depthlib.toy import chapter, sweep
    cfg = chapter.profile_config("smoke", steps=steps)
    assert sweep.run_sweep(cfg, progress=False, stop_at_step=stop) is None
    return sweep.open_sweep_run(cfg).path


def test_toy_force_recomputes(cache, capsys):
    _ok(capsys, ["toy", "--steps", "20", "--json"])
    out, err = _ok(capsys, ["toy", "--steps", "20", "--json"])
    assert out["throughput"]["loaded_from_cache"] and "loaded a finished run from the cache" in err
    out, err = _ok(capsys, ["toy", "--steps", "20", "--force", "--json"])
    assert not out["throughput"]["loaded_from_cache"] and "--force: deleting the cached run" in err


def test_toy_garbled_curve_table_is_found_before_training(cache, capsys):
    folder = _partial_toy()
    table = folder / "curve_0000020.parquet"
    data = bytearray(table.read_bytes())
    data[10:60] = b"x" * 50
    table.write_bytes(bytes(data))
    out, err = _ok(capsys, ["toy", "--steps", "60", "--json"])
    assert f"[depthlib] damaged run {folder}: removed the unreadable table curve_0000020.parquet" in err
    assert "the evaluation at step 20 is missing" in err and "training again from step 0" in err
    out2, err2 = _ok(capsys, ["toy", "--steps", "60", "--json"])     # and the rerun simply loads it
    assert out2["alpha"] == out["alpha"] and "corrupt" not in err2


def test_toy_truncated_checkpoint_is_one_line_and_restarts(cache, capsys):
    folder = _partial_toy()
    ckpt = folder / "checkpoint.pt"
    ckpt.write_bytes(ckpt.read_bytes()[:1000])
    out, err = _ok(capsys, ["toy", "--steps", "60", "--json"])
    assert f"[depthlib] damaged run {folder}: removed the unreadable checkpoint checkpoint.pt;" in err
    assert all(a["alpha"] is None or math.isfinite(a["alpha"]) for a in out["alpha"])


# -- messages ----------------------------------------------------------------------------------------------
def test_header_only_csv_is_named_as_such(chinchilla_df, tmp_path, capsys):
    chinchilla_df.head(0).to_csv(tmp_path / "h.csv", index=False)
    line = _fails(capsys, ["scaling", "--data", str(tmp_path / "h.csv")])
    assert "no data rows (only a header)" in line and "exclude" not in line


def test_infinite_value_is_called_not_finite_and_no_numpy_reprs(chinchilla_df, tmp_path, capsys):
    df = chinchilla_df.copy()
    df.loc[5, "loss"] = np.inf
    df.to_csv(tmp_path / "inf.csv", index=False)
    line = _fails(capsys, ["scaling", "--data", str(tmp_path / "inf.csv")])
    assert "value inf is not finite" in line
    df.loc[5, "loss"] = -1.5
    df.to_csv(tmp_path / "neg.csv", index=False)
    line = _fails(capsys, ["scaling", "--data", str(tmp_path / "neg.csv")])
    assert "value -1.5 is not positive" in line and "np." not in line


def test_every_experiment_command_takes_force():
    parser = cli.build_parser()
    for command in ("scaling", "toy", "probe", "trace"):
        sub = parser._subparsers._group_actions[0].choices[command]
        assert any("--force" in a.option_strings for a in sub._actions), command


def test_a_single_fits_defaults_are_the_codes():
    """``depthlib scaling`` fills its unset flags from ``scaling.bootstrap``'s defaults (``cli._fill_from``) and
    passes them to the fit as well: the two functions must agree on every default they share."""
    import inspect

    from depthlib import scaling
    fit, boot = (inspect.signature(f).parameters for f in (scaling.fit_decomposed_law, scaling.bootstrap))
    shared = set(fit) & set(boot) - {"df"}
    assert shared == {"exclude", "depth_offset", "law", "objective"}
    assert all(fit[k].default == boot[k].default for k in shared)
