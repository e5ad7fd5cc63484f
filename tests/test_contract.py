"""The chapter contract (depthlib.contract, depthlib.chapters), the derived code modules of a run
(results.compute_modules) and the one run lifecycle (results.computing)."""
from __future__ import annotations

import inspect
import json
from pathlib import Path

import pandas as pd
import pytest

from depthlib import contract, fingerprints, lifecycle, results
from depthlib.chapters import CHAPTERS, by_name, chapter_of, compute_entry
from depthlib.errors import InputError

#: what the hand-kept lists said before the modules were derived (each a subset of the derived modules), plus the
#: module the interventions list had missed (execute.py uses the hooks)
HAND_LISTS = {
    "scaling": ("depthlib.scaling.law", "depthlib.data"),
    "toy": ("depthlib.toy.models", "depthlib.toy.engine", "depthlib.toy.sweep", "depthlib.toy.analysis",
            "depthlib.measures"),
    "tracing": ("depthlib.tracing.locate", "depthlib.tracing.noise", "depthlib.tracing.patching",
                       "depthlib.tracing.tracer", "depthlib.tracing.facts", "depthlib.models.arch",
                       "depthlib.models.loading", "depthlib.models.hooks"),
    "probes-gemma-3-270m": ("depthlib.probes.tap", "depthlib.probes.metrics", "depthlib.probes.lenses",
                            "depthlib.probes.stream", "depthlib.models.arch", "depthlib.models.loading",
                            "depthlib.models.hooks", "depthlib.data", "depthlib.measures"),
    "interventions-gemma-3-270m": ("depthlib.interventions", "depthlib.interventions.plan",
                                   "depthlib.interventions.execute", "depthlib.interventions.rankings",
                                   "depthlib.interventions.suite", "depthlib.interventions.evaluate",
                                   "depthlib.measures", "depthlib.models.arch", "depthlib.models.loading",
                                   "depthlib.data", "depthlib.models.hooks"),
    "interventions-toy": ("depthlib.interventions.toy", "depthlib.interventions.plan",
                          "depthlib.interventions.execute", "depthlib.interventions.rankings",
                          "depthlib.interventions.suite", "depthlib.interventions.evaluate",
                          "depthlib.interventions.predictions", "depthlib.toy.models", "depthlib.toy.engine",
                          "depthlib.toy.converged", "depthlib.toy.certified", "depthlib.certificate",
                          "depthlib.measures", "depthlib.models.hooks"),
    "lm": ("depthlib.lm.tokenizer", "depthlib.lm.corpus", "depthlib.lm.model", "depthlib.lm.train",
                 "depthlib.lm.fit", "depthlib.lm.series", "depthlib.probes.tap", "depthlib.probes.metrics",
                 "depthlib.probes.lenses", "depthlib.probes.stream", "depthlib.probes.trajectory",
                 "depthlib.models.arch", "depthlib.models.hooks", "depthlib.data", "depthlib.measures"),
}


# ---- the registry and the contract ------------------------------------------------------------------------
def test_registry_names_every_chapter_once_in_order():
    assert [c.number for c in CHAPTERS] == list(range(1, len(CHAPTERS) + 1))
    names = [c.name for c in CHAPTERS]
    assert len(set(names)) == len(names)
    root = Path(__file__).parent.parent
    for c in CHAPTERS:      # one name in every place: package, notebook, plots module, cache experiments, command
        assert c.package == f"depthlib.{c.name}" and c.module.__name__ == f"depthlib.{c.name}.chapter"
        assert c.notebook == f"{c.number:02d}_{c.name}" and (root / "notebooks" / f"{c.notebook}.ipynb").is_file()
        assert c.plots_module.__name__ == f"depthlib.plots.{c.name}"
        assert all(e == c.name or e.startswith(c.name + "-") for e in c.experiments), c.experiments
        assert c.command == c.name and by_name(c.command) is c and by_name(str(c.number)) is c
        assert all(by_name(old) is c for old in c.former_commands)
    assert sorted(p.stem for p in (root / "notebooks").glob("*.ipynb")) == [c.notebook for c in CHAPTERS]
    assert chapter_of("probes-EleutherAI--pythia-410m").name == "probes"
    assert chapter_of("toy-calibration").name == "toy" and chapter_of("toy").name == "toy"
    with pytest.raises(InputError, match="no chapter"):
        chapter_of("nonsense")


def test_the_table_of_contents_lists_the_registrys_chapters_in_order():
    """_toc.yml's chapter part is the registry's notebooks, in the registry's order (a chapter added to one and not the
    other would be missing from the book or built without a page)."""
    import yaml
    root = Path(__file__).parent.parent
    toc = yaml.safe_load((root / "_toc.yml").read_text())
    files = [entry["file"] for part in toc["parts"] for entry in part["chapters"]]
    notebooks = [f for f in files if f.startswith("notebooks/")]
    assert notebooks == [f"notebooks/{c.notebook}" for c in CHAPTERS]
    pages = [f for f in files if not f.startswith("notebooks/")] + [toc["root"]]
    assert all((root / f"{page}.md").is_file() for page in pages), pages


_P = inspect.Parameter
#: ``compute(cfg, device="cpu", *, force=False, progress=True, executor=None)`` (:mod:`depthlib.contract`)
COMPUTE_SHAPE = [("cfg", _P.POSITIONAL_OR_KEYWORD, _P.empty), ("device", _P.POSITIONAL_OR_KEYWORD, "cpu"),
                 ("force", _P.KEYWORD_ONLY, False), ("progress", _P.KEYWORD_ONLY, True),
                 ("executor", _P.KEYWORD_ONLY, None)]


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda c: c.name)
def test_every_chapter_implements_the_contract(chapter):
    module = chapter.module
    for name in contract.NAMES:
        assert hasattr(module, name), f"{module.__name__} has no {name}"
    for name in ("runs", "compute", "replay", "describe", "summary"):
        assert callable(getattr(module, name))
    assert set(module.PROFILES) == {"smoke", "cpu", "paper"}
    kinds = {type(p) for p in module.PROFILES.values()}
    assert len(kinds) == 1 and issubclass(kinds.pop(), contract.Profile)       # one profile type per chapter
    for profile in module.PROFILES.values():
        data = profile.to_dict()
        assert json.loads(json.dumps(data)) == data                              # plain JSON
        assert type(profile).from_dict(data) == profile                          # and back, nested types included
    # every ``runs`` takes the profile and the same keywords (a chapter may add its own: parts, extra models, a CSV)
    keywords = inspect.signature(module.runs).parameters
    assert {"rerun", "executor", "device", "progress"} <= set(keywords), f"{module.__name__}.runs{keywords}"
    # one shape of ``compute`` for every chapter: the settings of one run, where, and the lifecycle's switches
    shape = [(p.name, p.kind, p.default) for p in inspect.signature(module.compute).parameters.values()]
    assert shape == COMPUTE_SHAPE, f"{module.__name__}.compute{inspect.signature(module.compute)}"
    for experiment, entry in module.COMPUTE.items():
        assert chapter.owns(experiment.rstrip("-") + ("-x" if experiment.endswith("-") else ""))
        for one in (entry,) if isinstance(entry, str) else entry:         # one function, or the several that compute
            mod, func = one.split(":")
            assert callable(getattr(__import__(mod, fromlist=[func]), func)), one


def test_from_dict_rebuilds_nested_configs_and_ignores_key_fields():
    from depthlib.interventions import InterventionConfig
    from depthlib.interventions.suite import SuiteConfig
    cfg = InterventionConfig(max_length=32, suite=SuiteConfig(ks=(1, 3), group_sizes=(2,)))
    stored = {**json.loads(json.dumps(contract.to_dict(cfg))), "model_fingerprint": "abc", "model": "m"}
    assert contract.from_dict(InterventionConfig, stored) == cfg
    with pytest.raises(TypeError, match="model"):
        contract.from_dict(InterventionConfig, stored, extra="forbid")


# ---- derived code modules ---------------------------------------------------------------------------------
@pytest.mark.parametrize("experiment", sorted(HAND_LISTS))
def test_compute_modules_cover_the_hand_lists_and_leave_out_glue(experiment):
    derived = results.compute_modules(compute_entry(experiment))
    assert set(HAND_LISTS[experiment]) <= set(derived), set(HAND_LISTS[experiment]) - set(derived)
    glue = [m for m in derived if results.is_glue(m)]
    assert not glue, glue
    for module in ("depthlib.results", "depthlib.executors", "depthlib.paths", "depthlib.errors", "depthlib.validate",
                   "depthlib.runtime", "depthlib.cli", "depthlib.book"):
        assert module not in derived
    assert not any(m.endswith((".chapter", ".shards")) or m.startswith("depthlib.plots") for m in derived)


def test_no_module_that_computes_imports_a_reader_of_runs():
    """Views, the claims and the verdict are glue because they only read finished runs (``fingerprints.is_glue``);
    were a module that computes to import one, its code would decide numbers without being fingerprinted."""
    import pkgutil

    import depthlib
    from depthlib.fingerprints import _imported_modules, is_glue

    def reader(module: str) -> bool:
        return module in ("depthlib.claims", "depthlib.verdict") or module.endswith((".views", "_views"))
    modules = [m.name for m in pkgutil.walk_packages(depthlib.__path__, "depthlib.")]
    assert sum(map(reader, modules)) >= 10 and all(is_glue(m) for m in modules if reader(m))
    computing = [m for m in modules if not is_glue(m)]
    assert len(computing) > 50
    bad = {m: [i for i in _imported_modules(m) if reader(i)] for m in computing}
    assert not any(bad.values()), {m: b for m, b in bad.items() if b}


def test_compute_modules_follow_imports_and_resolve_reexports():
    derived = results.compute_modules("depthlib.lm.series:run_series")
    assert "depthlib.probes.stream" in derived          # `from depthlib.probes import ProbeConfig` defines it there
    assert "depthlib.probes" not in derived             # ... so the package's own code is not a dependency
    assert "depthlib.models.hooks" in results.compute_modules("depthlib.interventions:run_interventions")


# ---- the run lifecycle ------------------------------------------------------------------------------------
@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DEPTHLIB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("DEPTHLIB_RESULTS_DIR", str(tmp_path / "committed"))
    return tmp_path / "cache" / "results"


CODE = ("depthlib.measures",)


def _compute(config, tables=("a", "b"), fail_after=None, calls=None):
    """A run of two tables through results.computing; ``fail_after`` raises after that many tables."""
    with results.computing("exp", config, profile="smoke", seed=0, code=CODE) as job:
        if job.complete:
            return job.run
        for i, name in enumerate(tables):
            if job.run.has(name):
                continue
            if fail_after is not None and i >= fail_after:
                raise RuntimeError("stopped")
            job.run.write_table(name, pd.DataFrame({"x": [float(i)]}))
            if calls is not None:
                calls.append(name)
            job.save_progress()
        job.record(note="done")
    return job.run


def test_computing_finishes_a_run_with_its_manifest(cache):
    run = _compute({"k": 1})
    m = run.manifest
    assert run.complete and not run.stale and m["note"] == "done" and m["profile"] == "smoke"
    assert m["code_modules"] == list(results.compute_modules(*CODE)) and set(m["tables"]) == {"a", "b"}
    assert not (run.path / results.PROGRESS).exists()
    assert not list(run.path.glob("*.tmp*"))


def test_computing_resumes_and_counts_the_time_of_every_segment(cache, monkeypatch):
    clock = iter([100.0, 105.0, 107.0,            # segment 1: opened at 100, table a saved at 105, fails at 107
                  200.0, 203.0, 204.0])           # segment 2: opened at 200, table b at 203, finished at 204
    monkeypatch.setattr(lifecycle, "_clock", lambda: next(clock))
    calls: list[str] = []
    with pytest.raises(RuntimeError, match="stopped"):
        _compute({"k": 2}, fail_after=1, calls=calls)
    run = results.open_run("exp", {"k": 2})
    assert not run.complete and run.elapsed_before() == pytest.approx(7.0)
    assert not list(run.path.glob("*.tmp*"))
    run = _compute({"k": 2}, calls=calls)
    assert calls == ["a", "b"]                    # table a was not computed again
    assert run.manifest["wall_time_s"] == pytest.approx(7.0 + 4.0)


def test_failure_leaves_no_temporary_files(cache, monkeypatch):
    def half_written(self, path, *a, **kw):
        Path(path).write_bytes(b"PAR1 half")
        raise OSError(28, "No space left on device", str(path))
    monkeypatch.setattr(pd.DataFrame, "to_parquet", half_written)
    with pytest.raises(OSError):
        _compute({"k": 3})
    folder = results.open_run("exp", {"k": 3}).path
    assert folder.is_dir() and not [p for p in folder.rglob("*") if ".tmp" in p.name]


def test_interrupt_says_what_is_kept_and_where(cache):
    with pytest.raises(results.RunInterrupted) as err:
        with results.computing("exp", {"k": 4}, profile="smoke", code=CODE, saves="the tables are in {folder}") as job:
            job.run.path.mkdir(parents=True)            # it has written there
            raise KeyboardInterrupt
    assert isinstance(err.value, KeyboardInterrupt) and str(err.value.folder) in err.value.saves
    with pytest.raises(results.RunInterrupted) as err:  # before it wrote anything: no folder is named
        with results.computing("exp", {"k": 6}, profile="smoke", code=CODE, saves="the tables are in {folder}"):
            raise KeyboardInterrupt
    assert err.value.saves is None and not err.value.folder.exists()
    with pytest.raises(results.CheckpointWriteError) as err:
        with results.guarding(cache / "somewhere"):
            raise RuntimeError("PytorchStreamWriter failed writing file data/0: file write failed")
    assert err.value.filename == str(cache / "somewhere")


def test_a_complete_run_is_returned_without_recomputation(cache):
    first = _compute({"k": 5})
    created = first.manifest["created"]
    calls: list[str] = []
    again = _compute({"k": 5}, calls=calls)
    assert again.path == first.path and calls == [] and again.manifest["created"] == created


def test_a_stale_complete_run_is_recomputed(cache, tmp_path, monkeypatch):
    module = tmp_path / "mods" / "fp_lifecycle.py"
    module.parent.mkdir()
    module.write_text("def f():\n    return 1\n")
    monkeypatch.syspath_prepend(str(module.parent))
    global CODE
    old_code, CODE = CODE, ("fp_lifecycle",)
    try:
        first = _compute({"k": 6})
        assert not first.stale
        module.write_text("def f():\n    return 2\n")
        fingerprints._module_digest.cache_clear()
        fingerprints._module_tree.cache_clear()
        assert first.stale
        calls: list[str] = []
        again = _compute({"k": 6}, calls=calls)
        assert calls == ["a", "b"] and not again.stale
    finally:
        CODE = old_code
        fingerprints._module_digest.cache_clear()
        fingerprints._module_tree.cache_clear()


def test_run_load_has_the_config_of_its_manifest(cache):
    run = _compute({"k": 7, "t": (1, 2)})
    loaded = results.Run.load(run.path)
    assert loaded.experiment == "exp" and loaded.config == {"k": 7, "t": [1, 2]}
