"""A pure refactor keeps its committed runs, provably (README: "When a committed run is recomputed").

The rule: a committed run whose code fingerprint no longer matches the current code is recomputed, **unless** a
replay that exercises every code path of the run gives bit-identical numbers before and after the change on the
same machine. The replay is the run's chapter's ``smoke`` profile computed from scratch (``runs("smoke",
rerun=True, parts=PARTS)``: every part — also one not shown yet — route and phase of the chapter at reduced size,
after the smoke runs of the chapters it ``needs``), once with the code of the commit
before the change (checked out in a temporary git worktree) and once with the current checkout, each in its own
process and its own empty results cache. Every table of a run's part must be equal on both sides, value for value
and type for type (columns that measure the machine, not the model — wall times, throughputs, folders — are left out:
:data:`VOLATILE`). Then, and only then, a committed run of that part that was fresh at the earlier commit is
re-stamped: its manifest gets the current code modules and fingerprint, and ``restamped_by_replay`` records both
fingerprints, both commits, the tables compared and the machine. The parts are judged one by one: a change that moves
one part's numbers (a new model for it) sends that part's runs to be recomputed and re-stamps the runs of the parts
whose replays stayed bit-identical. A part the change retires (computed before, not after) is not compared and takes
its committed run with it; a run of a part that was not compared is never re-stamped.

``python -m depthlib.purity --before COMMIT CHAPTER [CHAPTER ...]`` (``--dry-run`` compares without writing).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from depthlib import paths, results, units
from depthlib.chapters import by_name, compute_entry
from depthlib.errors import InputError

#: Columns that measure the machine or the folder a run was computed in, never a model: left out of the comparison.
VOLATILE = re.compile(r"(seconds|_s$|per_s|wall|elapsed|throughput|fraction_of_matmul|folder|path)")

#: The script each side runs: compute the chapter's smoke runs from scratch, copy every part's tables to ``out``.
_SIDE = r"""
import inspect, json, shutil, sys
from pathlib import Path
from depthlib.chapters import by_name
chapter, out = by_name(sys.argv[1]), Path(sys.argv[2])
for needed in sys.argv[3:]:                        # e.g. chapter 5 edits chapter 3's students: train them first
    by_name(needed).module.runs("smoke", rerun=True)

def flat(parts, prefix=""):
    for name, value in parts.items():
        if isinstance(value, dict):
            yield from flat(value, f"{prefix}{name}/")
        else:
            yield f"{prefix}{name}", value

index = {}
# every part the chapter has (PARTS), also those it does not show yet (SHOWN_PARTS): each is a committed run's code path
parts = getattr(chapter.module, "PARTS", None)
every = {"parts": parts} if parts and "parts" in inspect.signature(chapter.module.runs).parameters else {}
for part, run in flat(chapter.module.runs("smoke", rerun=True, **every)):
    folder = out / part.replace("/", "__")
    folder.mkdir(parents=True)
    for table in run.manifest.get("tables", {}):
        shutil.copy2(run.table_path(table), folder / f"{table}.parquet")
    index[part] = {"experiment": run.experiment, "key": run.key, "code_fingerprint": run.manifest["code_fingerprint"]}
(out / "index.json").write_text(json.dumps(index, indent=1, sort_keys=True))
"""


def _side(source: Path, chapter: str, out: Path, models: Path | None) -> dict:
    """Compute ``chapter``'s smoke runs with the code in ``source`` (a checkout) into an empty cache; returns the
    index of parts (experiment, key, fingerprint) and leaves their tables under ``out``."""
    cache = out.parent / f"{out.name}-cache"
    cache.mkdir(parents=True)
    if models is not None and models.is_dir():
        (cache / "models").symlink_to(models.resolve())   # converted offline models: inputs, not code under test
    env = {**os.environ, "PYTHONPATH": str(source), "DEPTHLIB_CACHE_DIR": str(cache),
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    env.pop("DEPTHLIB_RESULTS_DIR", None)
    needs = by_name(chapter).needs           # today's registry: the earlier commit's may not say
    done = subprocess.run([sys.executable, "-c", _SIDE, chapter, str(out), *needs], cwd=source, env=env,
                          capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise InputError(f"the smoke replay of chapter {chapter} failed with the code in {source}: {tail}")
    return json.loads((out / "index.json").read_text())


def _parts(side: Path) -> set[str]:
    return {p.name for p in side.iterdir() if p.is_dir()}


def retired_and_added(before: Path, after: Path) -> tuple[list[str], list[str]]:
    """The parts the change removed (computed before, not after) and added (after only): neither is compared, and
    no committed run of either can be re-stamped (:func:`restamp` re-stamps only runs of the compared parts)."""
    b, a = _parts(before), _parts(after)
    return sorted(b - a), sorted(a - b)


def compare(before: Path, after: Path) -> list[str]:
    """Differences between two sides' tables, part by part, over the parts both sides computed (empty: bit-identical
    outside :data:`VOLATILE` columns; a retired or added part is reported by :func:`retired_and_added`)."""
    problems = []
    for part in sorted(_parts(before) & _parts(after)):
        tables_b = sorted(p.name for p in (before / part).glob("*.parquet"))
        if tables_b != sorted(p.name for p in (after / part).glob("*.parquet")):
            problems.append(f"{part}: the tables differ")
            continue
        for name in tables_b:
            a, b = (pd.read_parquet(side / part / name) for side in (before, after))
            keep = [c for c in a.columns if not VOLATILE.search(str(c))]
            if list(a.columns) != list(b.columns) or not a[keep].equals(b[keep]):
                problems.append(f"{part}/{name}")
    return problems


def _count(folder: Path) -> tuple[int, int]:
    """(tables, rows) under a side's folder."""
    files = list(folder.glob("*/*.parquet"))
    return len(files), sum(len(pd.read_parquet(f)) for f in files)


def replay_chapter(chapter: str, before: str, work: Path) -> dict:
    """The smoke replay of ``chapter`` at commit ``before`` and with the current checkout; returns the record a
    re-stamped manifest keeps (``equal`` says whether every table was bit-identical)."""
    if not paths.in_checkout():
        raise InputError("the purity replay needs a git checkout (it checks out the earlier commit beside it)")
    sha = subprocess.run(["git", "rev-parse", "--short=12", before], cwd=paths.REPO_ROOT, capture_output=True,
                         text=True).stdout.strip()
    if not sha:
        raise InputError(f"no commit {before!r} in this checkout")
    tree = work / "before-tree"
    subprocess.run(["git", "worktree", "add", "--detach", str(tree), sha], cwd=paths.REPO_ROOT, check=True,
                   capture_output=True)
    models = paths.cache_dir() / "models"
    try:
        t0 = time.perf_counter()
        _side(tree, chapter, work / "before", models)
        index = _side(paths.REPO_ROOT, chapter, work / "after", models)
        problems = compare(work / "before", work / "after")
        retired, added = retired_and_added(work / "before", work / "after")
        compared = _with_units({index[p]["experiment"] for p in index if p.replace("/", "__") not in added})
        moved = {problem.split("/")[0].split(":")[0] for problem in problems}       # the parts whose tables differ
        differing = _with_units({index[p]["experiment"] for p in index if p.replace("/", "__") in moved})
        n_tables, n_rows = _count(work / "after")
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=paths.REPO_ROOT,
                       capture_output=True)
    head, dirty = results.git_state()
    return {"profile": "smoke", "before_commit": sha, "after_commit": head, "after_dirty": dirty,
            "tables": n_tables, "rows": n_rows, "equal": not problems, "differences": problems,
            "experiments": compared, "differing_experiments": differing, "retired_parts": retired,
            "added_parts": added,
            "ignored_columns": VOLATILE.pattern, "machine": results.device_description(),
            "replay_wall_time_s": round(time.perf_counter() - t0, 1),
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def _with_units(experiments: set[str]) -> list[str]:
    """``experiments`` and the units experiments that merge into them (a unit's tables are rows of its merged run's)."""
    return sorted(experiments | {u for u, merged in units.merged_by_units().items() if merged in experiments})


def _fresh_at(run: results.Run, commit: str) -> bool:
    """The run's recorded fingerprint is that of its code modules at ``commit`` (it was fresh there)."""
    import hashlib
    h = hashlib.sha256()
    for module in sorted(set(run.manifest.get("code_modules") or [])):
        digest = results.code_at(commit, module)
        if digest is None:
            return False
        h.update(f"{module}:{digest}\n".encode())
    return h.hexdigest()[:12] == run.manifest.get("code_fingerprint")


def restamp(run: results.Run, replay: dict) -> str:
    """Re-stamp a committed run by a passed replay (see the module's rule); returns what was done, in a line."""
    m = run.manifest
    if not run.stale:
        return f"fresh      {run.experiment}/{run.key}: already computed by the current code"
    compared = replay.get("experiments")
    # a record that does not name the parts that differ re-stamps nothing unless the whole replay is equal
    differing = replay.get("differing_experiments", [] if replay["equal"] else None)
    if differing is None:
        why = "the replay differs: " + ", ".join(replay["differences"][:4])
    elif run.experiment in differing:
        why = "its part's replay differs: " + ", ".join(replay["differences"][:4])
    elif not _fresh_at(run, replay["before_commit"]):
        why = f"it was not fresh at {replay['before_commit']}"
    elif compared is not None and run.experiment not in compared:
        why = "its part was not replayed (retired or added by the change)"
    else:
        why = None
    if why is not None:
        return f"recompute  {run.experiment}/{run.key}: {why}"
    modules = list(results.compute_modules(compute_entry(run.experiment)))
    m["restamped_by_replay"] = {**replay, "from_fingerprint": m.get("code_fingerprint"),
                                "from_modules": m.get("code_modules"), "to_fingerprint":
                                results.code_fingerprint(modules)}
    m["code_modules"], m["code_fingerprint"] = modules, results.code_fingerprint(modules)
    text = json.dumps(m, indent=2, sort_keys=True, default=str, allow_nan=False)
    results.atomic_write(run.path / "manifest.json", lambda tmp: tmp.write_text(text + "\n"))
    if replay["equal"]:
        return (f"restamped  {run.experiment}/{run.key}: {replay['tables']} smoke tables ({replay['rows']} rows) "
                f"bit-identical at {replay['before_commit']} and now")
    return (f"restamped  {run.experiment}/{run.key}: its part's smoke tables bit-identical at "
            f"{replay['before_commit']} and now (other parts differ: {', '.join(replay['differing_experiments'])})")


USAGE = "usage: python -m depthlib.purity --before COMMIT [--dry-run] CHAPTER [CHAPTER ...]"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    dry = "--dry-run" in argv
    argv = [a for a in argv if a != "--dry-run"]
    if len(argv) < 3 or argv[0] != "--before" or any(a.startswith("-") for a in argv[2:]):
        print(USAGE, file=sys.stderr)
        return 2
    before, names = argv[1], argv[2:]
    root = paths.committed_results_dir()
    try:
        chapters = [by_name(n) for n in names]
        failed = 0
        for chapter in chapters:
            with tempfile.TemporaryDirectory(prefix=f"purity-{chapter.name}-") as tmp:
                replay = replay_chapter(chapter.name, before, Path(tmp))
            print(f"chapter {chapter.name}: smoke replay {'bit-identical' if replay['equal'] else 'DIFFERS'} "
                  f"({replay['tables']} tables, {replay['rows']} rows, {replay['replay_wall_time_s']} s)"
                  + ("" if replay["equal"] else ": " + ", ".join(replay["differences"][:6]))
                  + "".join(f"; {kind} (not compared): {', '.join(replay[key])}"
                            for kind, key in (("retired", "retired_parts"), ("added", "added_parts")) if replay[key]))
            for manifest in sorted(root.glob("*/*/manifest.json")) if root is not None else []:
                run = results.Run.load(manifest.parent)
                if not chapter.owns(run.experiment):
                    continue
                if dry:
                    print(f"would check {run.experiment}/{run.key} (stale: {run.stale})")
                    continue
                line = restamp(run, replay)
                failed += line.startswith("recompute")
                print(line)
        return 1 if failed else 0
    except InputError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
