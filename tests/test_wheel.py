"""The library installs as a wheel and runs outside a checkout : package data (the fact set) is
inside the wheel, caches go to the user cache directory, and `depthlib tracing` / `depthlib probes` work on a tiny
model from a directory that is not the checkout."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests import tiny

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out),
                    str(ROOT)], check=True, capture_output=True, cwd=out)
    (whl,) = out.glob("depthlib-*.whl")
    return whl


def test_wheel_ships_the_fact_set_and_no_checkout_files(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert "depthlib/tracing/facts/facts.jsonl" in names
    assert not any(n.startswith(("tests/", "notebooks/", "data/")) for n in names)


@pytest.fixture(scope="module")
def fresh_env(wheel, tmp_path_factory) -> dict:
    """A new virtual environment with the wheel installed; its other dependencies are borrowed from the project's
    environment through a .pth line (whose own .pth files, like the editable install, are not processed)."""
    root = tmp_path_factory.mktemp("fresh")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    Path(site, "borrowed.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([str(py), "-m", "pip", "install", "--no-deps", "-q", str(wheel)], check=True, capture_output=True)
    home = root / "home"
    work = root / "work"
    home.mkdir()
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEPTHLIB_") and k not in ("PYTHONPATH",)}
    env.update(HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    tiny.save_model(work / "tiny-llama", "llama")
    (work / "corpus.txt").write_text("\n\n".join(tiny.TEXTS))
    return {"python": py, "depthlib": venv / "bin" / "depthlib", "env": env, "cwd": work, "home": home}


def _run(fresh, *args):
    return subprocess.run([str(fresh["depthlib"]), *args], capture_output=True, text=True, cwd=fresh["cwd"],
                          env=fresh["env"], timeout=600)


def test_installed_package_is_the_wheel_not_the_checkout(fresh_env):
    out = subprocess.run([str(fresh_env["python"]), "-c", "import depthlib, depthlib.paths as p; "
                          "print(depthlib.__file__); print(p.in_checkout()); print(p.cache_dir())"],
                         capture_output=True, text=True, check=True, cwd=fresh_env["cwd"], env=fresh_env["env"])
    file, in_checkout, cache = out.stdout.split("\n")[:3]
    assert str(ROOT) not in file and "site-packages" in file
    assert in_checkout == "False" and cache == str(fresh_env["home"] / ".cache" / "depthlib")


def test_trace_and_probe_run_from_a_wheel_outside_the_checkout(fresh_env):
    trace = _run(fresh_env, "tracing", "--model", "tiny-llama", "--prompt", "The Space Needle is in downtown",
                 "--subject", "Space Needle", "--samples", "2", "--json")
    assert trace.returncode == 0, trace.stderr[-2000:]
    assert "p_clean" in json.dumps(json.loads(trace.stdout))
    probe = _run(fresh_env, "probes", "--model", "tiny-llama", "--corpus", "corpus.txt", "--docs", "3",
                 "--max-length", "16", "--json")
    assert probe.returncode == 0, probe.stderr[-2000:]
    assert json.loads(probe.stdout)["n_layers"] == 4
    assert (fresh_env["home"] / ".cache" / "depthlib" / "results").is_dir()      # the user cache, not a checkout
