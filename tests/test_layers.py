"""The import graph: no cycle anywhere, and no import up the layer order of docs/ARCHITECTURE.md.

Walks every module of vlserve (kernels/ and preprocess/ as vlserve.kernels / vlserve.preprocess)
with `ast`, function-level imports included (a lazy import is still a dependency); only imports
under `if TYPE_CHECKING:` are left out, since they never run.
"""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE_DIRS = {"vlserve": ROOT / "vlserve", "vlserve.kernels": ROOT / "kernels",
                "vlserve.preprocess": ROOT / "preprocess"}


def layers() -> list[list[str]]:
    """The ```layers block of docs/ARCHITECTURE.md: one line per layer, bottom first."""
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    block = re.search(r"```layers\n(.*?)```", text, re.S)
    assert block, "docs/ARCHITECTURE.md has no ```layers block"
    return [line.split(":", 1)[1].split() for line in block.group(1).splitlines() if ":" in line]


def modules() -> dict[str, Path]:
    found = {}
    for prefix, folder in PACKAGE_DIRS.items():
        for path in folder.rglob("*.py"):
            rel = path.relative_to(folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            name = ".".join([prefix, *parts])
            if prefix == "vlserve" and parts and parts[0] in ("kernels", "preprocess"):
                continue
            found[name] = path
    return found


def _is_type_checking(node: ast.If) -> bool:
    return isinstance(node.test, (ast.Name, ast.Attribute)) and "TYPE_CHECKING" in ast.unparse(node.test)


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    targets = set()

    def visit(node):
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            targets.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(up + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                targets.add(full if full in known else base)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return {t for t in targets if t in known and t != name}


def layer_of(name: str, order: list[list[str]]) -> int:
    best, level = "", None
    for i, members in enumerate(order):
        for m in members:
            if (name == m or name.startswith(m + ".")) and len(m) > len(best):
                best, level = m, i
    assert level is not None, f"{name} is in no layer of docs/ARCHITECTURE.md"
    return level


def graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imports_of(name, path, set(found)) for name, path in found.items()}


def test_every_module_has_a_layer_and_imports_only_down():
    order = layers()
    upward = []
    for name, targets in graph().items():
        for t in targets:
            if layer_of(t, order) > layer_of(name, order):
                upward.append(f"{name} (layer {layer_of(name, order)}) imports {t} (layer {layer_of(t, order)})")
    assert not upward, "imports up the layer order:\n" + "\n".join(sorted(upward))


def test_preprocess_and_kernels_never_import_the_rest_of_vlserve():
    bad = [(n, t) for n, ts in graph().items() if n.startswith(("vlserve.kernels", "vlserve.preprocess"))
           for t in ts if not t.startswith(n.split(".")[0] + "." + n.split(".")[1])]
    assert not bad, bad


def test_no_import_cycle():
    g = graph()
    cycles = [c for c in _strongly_connected(g) if len(c) > 1]
    assert not cycles, "import cycles: " + "; ".join(" ↔ ".join(sorted(c)) for c in cycles)


def test_the_walk_sees_cycles_and_upward_imports(tmp_path):
    """The checker itself: a planted cycle and a planted upward import are found."""
    g = {"vlserve.a": {"vlserve.b"}, "vlserve.b": {"vlserve.a"}, "vlserve.c": set()}
    assert [sorted(c) for c in _strongly_connected(g) if len(c) > 1] == [["vlserve.a", "vlserve.b"]]
    order = [["vlserve.core"], ["vlserve.engine"]]
    assert layer_of("vlserve.engine.loop", order) > layer_of("vlserve.core.request", order)
    src = tmp_path / "m.py"
    src.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import vlserve.x\n"
                   "def f():\n    from vlserve.y import z\n")
    assert imports_of("vlserve.m", src, {"vlserve.x", "vlserve.y", "vlserve.y.z"}) == {"vlserve.y.z"}


def _strongly_connected(g: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's algorithm, iterative."""
    index, low, on_stack, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in g:
        if root in index:
            continue
        work = [(root, iter(sorted(g.get(root, ()))))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = set()
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.add(w)
                        if w == node:
                            break
                    out.append(comp)
            elif child not in index:
                index[child] = low[child] = counter[0]
                counter[0] += 1
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(g.get(child, ())))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return out
