"""Code identity of a run (design: Data flow): which modules decide its numbers, derived from the imports of its
compute entry (:func:`compute_modules`), their fingerprint (:func:`code_fingerprint`: their syntax trees without
docstrings, so comments and docs do not count), that code at a git commit (:func:`code_at`, :func:`code_commit`), and
the machine and versions that computed it.
"""
from __future__ import annotations

import ast
import hashlib
import importlib.util
import os
import platform
import subprocess
from functools import lru_cache
from pathlib import Path
from typing import Sequence

from depthlib import paths
from depthlib.errors import InputError


def _strip_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
                    and isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]
    return tree


@lru_cache(maxsize=None)
def _module_digest(module: str) -> str:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        raise InputError(f"cannot fingerprint {module!r}: no Python source found")
    tree = _strip_docstrings(ast.parse(Path(spec.origin).read_text(encoding="utf-8")))
    return hashlib.sha256(ast.dump(tree).encode()).hexdigest()


#: Modules that orchestrate, store, validate or draw, never compute a run's numbers: the derived code of a run
#: (:func:`compute_modules`) leaves them out, so moving glue never makes a run stale. ``*.chapter`` (a chapter's
#: profiles, the calls its runs make, replay, describe), ``*.shards`` (units of work whose merge is tested to equal the
#: one-process run bit for bit) and ``depthlib.plots.*`` (figures drawn from the tables) are glue by their role.
#: ``depthlib.finite`` checks numbers a run produced (it stops a run, or nulls a value with a warning, where one is
#: not finite) and never changes a finite one: a validator, as ``depthlib.validate``. ``depthlib.inputs`` decides which
#: run a key finds (what a model and a corpus are), never a run's numbers; ``depthlib.models.checks`` refuses a model
#: or corpus argument before anything loads: a validator too. The readers of finished runs never compute one either:
#: ``*.views`` and ``*_views`` (a chapter's text and tables from its runs), ``depthlib.claims`` (the claims and the
#: status rule) and ``depthlib.verdict``; that no module that computes imports one is tested.
GLUE_MODULES = frozenset({
    "depthlib", "depthlib.errors", "depthlib.results", "depthlib.executors", "depthlib.paths", "depthlib.validate",
    "depthlib.finite", "depthlib.runtime", "depthlib.cli", "depthlib.book", "depthlib.chapters", "depthlib.contract",
    "depthlib.plots", "depthlib.inputs", "depthlib.store", "depthlib.lifecycle", "depthlib.selection",
    "depthlib.fingerprints", "depthlib.purity", "depthlib.models.checks", "depthlib.units", "depthlib.claims",
    "depthlib.verdict",
})
GLUE_SUFFIXES = (".chapter", ".shards", ".views", "_views")


def is_glue(module: str) -> bool:
    """Whether ``module`` orchestrates or reads finished runs rather than computes (:data:`GLUE_MODULES`,
    ``*.chapter``, ``*.shards``, ``*.views``, ``*_views``, ``depthlib.plots.*``)."""
    return (module in GLUE_MODULES or module.endswith(GLUE_SUFFIXES) or module.startswith("depthlib.plots."))


@lru_cache(maxsize=None)
def _module_tree(module: str) -> tuple[ast.Module, bool]:
    """(syntax tree, is a package) of a depthlib module's source."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        raise InputError(f"cannot read {module!r}: no Python source found")
    return ast.parse(Path(spec.origin).read_text(encoding="utf-8")), spec.submodule_search_locations is not None


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _defining_module(module: str, name: str, seen: frozenset = frozenset()) -> str:
    """The module whose code defines ``name`` as imported by ``from module import name``: a submodule of that name,
    else the module a re-export (``from X import name`` at the top of ``module``) comes from, else ``module``."""
    if _is_module(f"{module}.{name}"):
        return f"{module}.{name}"
    if (module, name) in seen:
        return module
    tree, _ = _module_tree(module)
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("depthlib"):
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    return _defining_module(node.module, alias.name, seen | {(module, name)})
    return module


def _imported_modules(module: str) -> set[str]:
    """The depthlib modules whose code ``module`` uses: every ``import depthlib.x`` and ``from depthlib.x import y``
    anywhere in it (functions included), a name resolved to the module that defines it (:func:`_defining_module`)."""
    tree, is_package = _module_tree(module)
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name == "depthlib" or a.name.startswith("depthlib.")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:                                      # relative: resolve against this module's package
                parts = module.split(".")
                base = parts if is_package else parts[:-1]
                base = base[: len(base) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source == "depthlib" or source.startswith("depthlib."):
                out |= {_defining_module(source, a.name) for a in node.names if a.name != "*"} or {source}
    return out - {module}


def compute_modules(*entries: str | Sequence[str]) -> tuple[str, ...]:
    """The modules whose code decides the numbers of a run computed by ``entries`` (dotted names, a module or
    ``module:function``, or a tuple of them where a run's numbers come from several functions): the entry modules
    and, transitively, the depthlib modules they import, restricted to modules that compute (:func:`is_glue` ones
    are neither counted nor followed, except an entry itself, whose imports are followed). This is what a run's
    manifest records under ``code_modules`` and fingerprints."""
    flat = [e for entry in entries for e in ((entry,) if isinstance(entry, str) else entry)]
    found: set[str] = set()
    todo: list[tuple[str, bool]] = [(e.split(":")[0], True) for e in flat]
    seen: set[str] = set()
    while todo:
        module, entry = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        if is_glue(module) and not entry:
            continue
        if not is_glue(module):
            found.add(module)
        todo += [(m, False) for m in _imported_modules(module)]
    return tuple(sorted(found))


def code_fingerprint(modules: Sequence[str]) -> str:
    """12 hex digits identifying the code of ``modules`` (dotted names): their syntax trees without docstrings.

    Formatting, comments and docstrings do not change it; any change to what the code does does."""
    h = hashlib.sha256()
    for module in sorted(set(modules)):
        h.update(f"{module}:{_module_digest(module)}\n".encode())
    return h.hexdigest()[:12]


def git_state() -> tuple[str | None, bool | None]:
    """(short commit, working tree dirty?) of the checkout, or (None, None) outside one."""
    sha, edited = git_edits()
    return sha, (bool(edited) if sha else None)


def git_edits() -> tuple[str | None, list[str]]:
    """(short commit, the package's files with uncommitted edits) of the checkout, or (None, []) outside one."""
    if not paths.in_checkout():
        return None, []
    try:
        sha = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=paths.REPO_ROOT,
                             capture_output=True, text=True, timeout=5).stdout.strip() or None
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "depthlib"],
                                cwd=paths.REPO_ROOT, capture_output=True, text=True, timeout=5).stdout
        return sha, sorted(line[3:].strip() for line in status.splitlines() if line.strip())
    except (OSError, subprocess.SubprocessError):
        return None, []


def environment_versions() -> dict[str, str]:
    """Versions of the packages that decide the numbers."""
    import importlib.metadata as md
    versions = {"python": platform.python_version()}
    for pkg in ("depthlib", "numpy", "scipy", "pandas", "torch", "transformers"):
        try:
            versions[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    return versions


def device_description(device: str | None = None) -> str:
    """A human-readable name of the machine a run used, e.g. 'cpu (2 cores, x86_64)' or 'cuda (NVIDIA H200)'."""
    if device and str(device).startswith("cuda"):
        try:
            import torch
            return f"cuda ({torch.cuda.get_device_name(torch.device(device))})"
        except Exception:  # noqa: BLE001 - description only
            return str(device)
    return f"cpu ({os.cpu_count()} cores, {platform.machine()})"


def _module_files(module: str) -> list[str]:
    """Where ``module``'s source may lie in the repository: its file in this checkout, else (a module the checkout
    has since deleted, e.g. a retired part's) the two places a module of that name can live, ``a/b.py`` and
    ``a/b/__init__.py``."""
    try:
        spec = importlib.util.find_spec(module)
    except ModuleNotFoundError:                       # its package is gone too
        spec = None
    if spec is not None and spec.origin:
        return [Path(spec.origin).resolve().relative_to(paths.REPO_ROOT.resolve()).as_posix()]
    base = module.replace(".", "/")
    return [f"{base}.py", f"{base}/__init__.py"]


def code_at(commit: str, module: str) -> str | None:
    """:func:`_module_digest` of ``module``'s source at git ``commit`` (None if it did not exist there)."""
    for rel in _module_files(module):
        shown = subprocess.run(["git", "show", f"{commit}:{rel}"], cwd=paths.REPO_ROOT, capture_output=True,
                               text=True)
        if shown.returncode == 0:
            return hashlib.sha256(ast.dump(_strip_docstrings(ast.parse(shown.stdout))).encode()).hexdigest()
    return None


def code_commit(m: dict) -> str | None:
    """The first commit, from the run's own on, whose code of the run's computing modules has the run's code
    fingerprint: the commit that holds the code of a run computed from a tree with local edits (None if none does)."""
    sha, modules = m.get("git_sha"), sorted(set(m.get("code_modules") or []))
    if not sha or not modules or not paths.in_checkout():
        return None
    later = subprocess.run(["git", "rev-list", "--reverse", "--ancestry-path", f"{sha}..HEAD"], cwd=paths.REPO_ROOT,
                           capture_output=True, text=True).stdout.split()
    for commit in [sha, *later]:
        h = hashlib.sha256()
        for module in modules:
            digest = code_at(commit, module)
            if digest is None:
                break
            h.update(f"{module}:{digest}\n".encode())
        else:
            if h.hexdigest()[:12] == m.get("code_fingerprint"):
                return subprocess.run(["git", "rev-parse", "--short=12", commit], cwd=paths.REPO_ROOT,
                                      capture_output=True, text=True).stdout.strip()
    return None
