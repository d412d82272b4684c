"""The package reads top-down: no cycle between pipert's packages, counting imports inside
functions (a lazy import still ties its module to the one it imports)."""
import ast
from pathlib import Path

import pipert

ROOT = Path(pipert.__file__).parent


def _package(module: str) -> str:
    """``pipert.exec.executor`` -> ``pipert.exec``; top-level modules are their own package."""
    parts = module.split(".")
    path = ROOT.joinpath(*parts[1:])
    return module if not path.is_dir() and len(parts) == 2 else ".".join(parts[:2])


def _modules() -> dict[str, Path]:
    out = {}
    for f in ROOT.rglob("*.py"):
        rel = f.relative_to(ROOT.parent).with_suffix("")
        name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        out[name] = f
    return out


def _imports(name: str, path: Path, is_pkg: bool) -> set[str]:
    tree = ast.parse(path.read_text())
    base = name if is_pkg else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = base.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                target = ".".join(anchor + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.startswith("pipert"):
                out.add(target)
                out.update(f"{target}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("pipert"))
    return out


def module_graph() -> dict[str, set[str]]:
    """Module -> the pipert modules it imports (imports inside functions included)."""
    mods = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        for target in _imports(name, path, path.name == "__init__.py"):
            while target not in mods and "." in target:
                target = target.rpartition(".")[0]
            if target in mods and target != name:
                graph.setdefault(name, set()).add(target)
    return graph


def _reaches(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for m in graph.get(todo.pop(), ()):
            if m not in seen:
                seen.add(m)
                todo.append(m)
    return seen


def package_graph() -> dict[str, set[str]]:
    mods = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        src = _package(name)
        for target in _imports(name, path, path.name == "__init__.py"):
            while target not in mods and "." in target:
                target = target.rpartition(".")[0]
            dst = _package(target)
            if target in mods and dst != src and dst != "pipert":
                graph.setdefault(src, set()).add(dst)
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str]:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return []
    for n in sorted(graph):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return []


def test_no_import_cycle_between_packages():
    cycle = _cycle(package_graph())
    assert not cycle, " -> ".join(cycle)


def test_replication_imports_no_family_and_is_in_no_module_cycle():
    """Data-parallel replication sits below the families: a family's policy (PipeMesh's overlap)
    registers itself with it, so no import cycle runs through it (the data_parallel <-> pipemesh
    one included), and it reaches no family module."""
    graph = module_graph()
    dp = "pipert.schedules.data_parallel"
    reached = _reaches(graph, dp)
    assert dp not in reached, "an import cycle runs through " + dp
    families = {"pipert.schedules.pipemesh", "pipert.schedules.classic", "pipert.schedules.weipipe",
                "pipert.schedules.helixpipe", "pipert.schedules.tawpipe", "pipert.schedules.crosspipe"}
    assert not reached & families, sorted(reached & families)
    assert dp in _reaches(graph, "pipert.schedules.pipemesh")   # the family imports the replication it extends
