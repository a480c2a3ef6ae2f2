"""The package's shape: imports flow one way between its folders (no cycles), and files and
functions stay small enough to read. These are the rules ``docs/architecture.md`` draws."""

from __future__ import annotations

import ast
import pathlib

import pytest

SRC = pathlib.Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "tunekit"

#: each layer may import from the layers before it, and from itself
LAYERS = ["_version", "tunable", "backends", "kernels", "ops", "torch_compat", "offline", "bench", "cli"]
#: lines a file may have, and a function
MAX_FILE_LINES, MAX_FUNCTION_LINES = 400, 60
#: a function longer than MAX_FUNCTION_LINES must say why in a comment on its ``def`` line or up to
#: three lines above it
LONG_MARK = "# long:"


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, pathlib.Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imported(name: str, path: pathlib.Path, known: set[str]) -> set[str]:
    """The tunekit modules ``name`` imports, at any depth of its code (lazy imports count too)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # ``from pkg import module`` imports that module; ``from pkg import name``, pkg itself
            # (the parent packages Python initialises on the way are not edges: they import nothing
            # of their children's that is not already there)
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        for target in targets:
            while target and target not in known:  # a name imported from a module: the module
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: imported(name, path, known) for name, path in mods.items()}


def layer(name: str) -> int | None:
    parts = name.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else None


def find_cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, cycles, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return cycles


def test_the_cycle_finder_finds_cycles():
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    """Every strongly connected component of the import graph is a single module (the package's
    own ``__init__.py``, the facade that imports everything, left out)."""
    edges = {m: {t for t in targets if t != "tunekit"} for m, targets in graph().items() if m != "tunekit"}
    assert not find_cycles(edges), f"import cycles: {find_cycles(edges)}"


def test_imports_flow_from_lower_layers_only():
    """runtime <- backends <- ops <- torch integration <- offline / bench <- cli: a module imports
    only its own layer and the ones before it (``tunekit/__init__.py``, the facade, imports all)."""
    bad = []
    for name, targets in graph().items():
        mine = layer(name)
        if mine is None:
            continue
        for target in targets:
            theirs = layer(target)
            if target == "tunekit" or (theirs is not None and theirs > mine):
                bad.append(f"{name} -> {target}")
    assert not bad, "imports against the layer order: " + ", ".join(sorted(bad))


def test_the_test_sees_the_whole_package():
    g = graph()
    assert "tunekit.ops.silu" in g and "tunekit.tunable.registry" in g["tunekit.ops.silu"]
    assert "tunekit.backends.cuda" in g["tunekit.ops._shared.cuda_elementwise"]


def source_files():
    return sorted(p for p in PACKAGE.rglob("*") if p.suffix in (".py", ".cu", ".cuh", ".c", ".cpp"))


@pytest.mark.parametrize("path", source_files(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_files_are_short(path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_FILE_LINES, f"{path.name} has {lines} lines (at most {MAX_FILE_LINES}: split it by concern)"


def test_functions_are_short_unless_a_comment_says_why():
    long = []
    for path in PACKAGE.rglob("*.py"):
        lines = path.read_text().splitlines()
        for node in ast.walk(ast.parse("\n".join(lines))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                size = node.end_lineno - node.lineno + 1
                first = node.decorator_list[0].lineno if node.decorator_list else node.lineno
                said = any(LONG_MARK in lines[i - 1] for i in range(max(1, first - 3), node.lineno + 1))
                if size > MAX_FUNCTION_LINES and not said:
                    long.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name} ({size} lines)")
    assert not long, "functions over the limit without a '# long:' reason: " + ", ".join(long)
