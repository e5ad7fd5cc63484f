"""The `depthlib` command's contract: one JSON object on stdout, exit 2 with a one-line message on bad input."""
import json
import subprocess
import sys

import pytest

from depthlib import cli


def run(*args, env=None):
    return subprocess.run([sys.executable, "-m", "depthlib.cli", *args], capture_output=True, text=True, env=env)


def test_fit_paper_json_has_the_contract_keys():
    out = run("fit", "--preset", "paper", "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    for key in ("alpha_m", "alpha_l", "alpha_D", "L0", "c_m", "c_l", "c_D", "mean_rel_err", "n_points", "se"):
        assert key in result
    assert result["alpha_l"] == pytest.approx(1.201, abs=0.005)
    assert result["n_points"] == 203
    assert set(result["se"]) >= {"alpha_m", "alpha_l", "alpha_D", "L0"}


def test_fit_converged_with_bootstrap(capsys):
    assert cli.main(["fit", "--json", "--bootstrap", "20", "--exclude", "30"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["preset"] == "converged" and result["exclude"] == 30
    assert result["bootstrap"]["n_resamples"] == 20
    assert result["bootstrap"]["alpha_l"]["lo"] <= result["bootstrap"]["alpha_l"]["hi"]


@pytest.mark.parametrize("args, message", [
    (["fit", "--exclude", "-3"], "exclude must be in [0, 244], got -3"),
    (["fit", "--exclude", "400"], "exclude must be in"),
    (["fit", "--bootstrap", "-1"], "--bootstrap must be >= 0"),
    (["fit", "--preset", "fast"], "invalid choice: 'fast'"),
    (["fit", "--depth-offset", "1"], "invalid choice: 1"),
    (["fit", "--data", "/nonexistent/file.csv"], "Chinchilla CSV not found"),
    (["fit", "--preset", "paper", "--objective", "huber"], "the paper preset uses the paper's objective"),
    (["nonsense"], "invalid choice"),
])
def test_bad_input_exits_2_with_one_line(args, message):
    out = run(*args)
    assert out.returncode == 2
    assert out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) >= 1 and message in lines[-1], out.stderr
    assert "Traceback" not in out.stderr
