"""The package as a whole: every advertised name imports, and importing changes nothing in the process."""
from __future__ import annotations

import importlib
import json
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import depthlib

ROOT = Path(__file__).resolve().parents[1]
MODULES = sorted(m.name for m in pkgutil.walk_packages(depthlib.__path__, "depthlib."))


def test_every_name_in_every_all_imports():
    missing = []
    for name in ["depthlib"] + MODULES:
        module = importlib.import_module(name)
        missing += [f"{name}.{n}" for n in getattr(module, "__all__", ()) if not hasattr(module, n)]
    assert not missing, f"names in __all__ that the module does not define: {missing}"
    # the walk saw the chapter packages (a typo in the walk would make the check above vacuous)
    assert {"depthlib.lm", "depthlib.toy", "depthlib.scaling"} <= set(MODULES)


def test_importing_depthlib_leaves_the_process_alone():
    """No module sets environment variables (OMP_WAIT_POLICY ...) or calls glibc's mallopt when imported: the entry
    points do that (depthlib.runtime.configure_process). A fresh interpreter, so earlier imports cannot hide it."""
    code = ("import importlib, json, os, sys; before = dict(os.environ)\n"
            f"for name in {json.dumps(['depthlib.toy', 'depthlib.lm'] + MODULES)}: importlib.import_module(name)\n"
            "import depthlib.runtime as r\n"
            "changed = sorted(k for k in set(before) | set(os.environ) if before.get(k) != os.environ.get(k))\n"
            "print(json.dumps({'changed': changed, 'mallopt': r._DONE}))")
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"changed": [], "mallopt": False}


def test_configure_process_sets_what_the_entry_points_need():
    code = ("import os; from depthlib import runtime; runtime.configure_process(1)\n"
            "import torch; print(os.environ['OMP_WAIT_POLICY'], torch.get_num_threads(), runtime._DONE)")
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.split() == ["PASSIVE", "1", str(sys.platform.startswith("linux"))]


def _requirements():
    """Every requirement the package declares (dependencies and extras), as packaging Requirements."""
    tomllib = pytest.importorskip("tomllib")
    from packaging.requirements import Requirement
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = list(project["dependencies"]) + [r for extra in project["optional-dependencies"].values() for r in extra]
    return [Requirement(line) for line in lines]


def test_package_metadata_pins_nothing_exactly():
    """pip install depthlib into an environment with another torch (a GPU build) must keep it: ranges, no == or ===,
    each bounded above by the next major release."""
    for req in _requirements():
        ops = {spec.operator for spec in req.specifier}
        assert not ops & {"==", "===", "~="}, f"{req} pins a version: put the pin in constraints.txt"
        assert ">=" in ops and "<" in ops, f"{req} needs a tested lower bound and the next major as upper bound"


def test_constraints_pin_every_requirement_inside_its_range():
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.split("#")[0].strip():
            req = Requirement(line.split("#")[0].strip())
            (spec,) = req.specifier
            assert spec.operator == "==", f"constraints.txt: {line} is not an exact pin"
            pins[canonicalize_name(req.name)] = spec.version
    for req in _requirements():
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} has no pin in constraints.txt"
        assert req.specifier.contains(pins[name], prereleases=True), f"constraints.txt pins {req.name} outside {req}"


@pytest.mark.parametrize("bench", sorted(p.name for p in (ROOT / "benchmarks").glob("bench_*.py")))
def test_every_benchmark_takes_the_flag_make_bench_passes(bench):
    """``make bench`` runs each ``benchmarks/bench_*.py --quick``: a benchmark without the flag stopped the loop (it
    exits 2 on an unknown argument). ``--help`` parses the flags without running the benchmark."""
    makefile = (ROOT / "Makefile").read_text()
    assert "benchmarks/bench_*.py; do" in makefile and "--quick" in makefile
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / bench), "--help"], capture_output=True,
                         text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "--quick" in out.stdout, f"{bench} does not take --quick"
