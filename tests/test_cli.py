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


def test_fit_classic_chinchilla_law(capsys):
    """`depthlib fit --law chinchilla` fits L = E + A/N^α + B/D^β (with a bootstrap); the depth offset is refused."""
    assert cli.main(["fit", "--law", "chinchilla", "--json", "--bootstrap", "10"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["law"] == "chinchilla" and result["n_points"] == 203
    assert {"alpha_N", "alpha_D", "c_N", "c_D", "L0"} <= set(result) and "alpha_l" not in result
    assert 0.2 < result["alpha_N"] < 0.6 and result["mean_rel_err"] < 0.006
    assert set(result["se"]) == {"alpha_N", "alpha_D", "L0", "ln_c_N", "ln_c_D"}
    assert set(result["bootstrap"]) >= {"alpha_N", "alpha_D", "L0"}
    for args, message in ((["--depth-offset", "2"], "--depth-offset applies to the decomposed law only"),
                          (["--preset", "paper"], "the paper preset uses the paper's objective")):
        out = run("fit", "--law", "chinchilla", *args)
        assert out.returncode == 2 and out.stdout == "" and message in out.stderr.strip().splitlines()[-1], out.stderr
