"""depthlib's modules import one another without loops: every import counts, a function-level one too (a lazy
import only hides a loop from the interpreter, not from a reader). A package's ``__init__`` only re-exports its
modules, so importing the package never sends a module back to it."""
from __future__ import annotations

import ast
from pathlib import Path

import depthlib

PACKAGE = Path(depthlib.__file__).parent


def import_graph() -> dict[str, set[str]]:
    """{module: the depthlib modules it imports anywhere in its source} (``from a import b`` counts as a.b when that
    is a module, else as a)."""
    mods = {}
    for f in PACKAGE.rglob("*.py"):
        parts = ("depthlib",) + f.relative_to(PACKAGE).with_suffix("").parts
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    graph = {}
    for name, f in mods.items():
        out = set()
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                out |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in mods else node.module
                        for a in node.names}
            elif isinstance(node, ast.Import):
                out |= {a.name for a in node.names}
        graph[name] = {m for m in out if m in mods and m != name}
    return graph


def loops(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm, iterative)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.add(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(comp)
    return out


def test_the_loop_finder_finds_a_known_loop():
    assert loops({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
    assert loops({"a": {"b"}, "b": set()}) == []


def test_depthlib_has_no_import_loops():
    found = loops(import_graph())
    assert not found, f"import loops: {[sorted(c) for c in found]}"
