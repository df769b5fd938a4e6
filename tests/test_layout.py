"""The layout's rules (``STYLE.md``, "Layout"), checked on the source with ``ast``.

- **Size.** Every module under ``lightning_speedpack/`` and ``benchmarks/`` has at most
  :data:`MAX_LINES` lines: past that it is two concepts.
- **No import circle** among the package's modules. Every ``import`` statement counts: at
  module level, inside a function, and under ``if TYPE_CHECKING:``. A function-level import is
  a circle deferred to run time, and a type-only one is a circle that mypy and the reader still
  walk; either way the two modules are one concept, or a helper both sides need belongs a floor
  down. ``from pkg import name`` is an import of ``pkg.name`` when that is a module, else of
  ``pkg`` (its ``__init__``). The parent packages Python imports on the way (``a`` and ``a.b``
  for ``a.b.c``) are not counted: that would make every re-exporting ``__init__`` a circle.
- **Floors.** :data:`LAYERS` puts every room (``lightning_speedpack/<room>/``, or a top-level
  module) on a floor. A module imports from its own room or from a room on a lower floor, never
  upward and never sideways (another room on its floor). Here a module named in a string
  (a lazy table of ``module -> name``, ``importlib.import_module``) counts too, as well as the
  three kinds of ``import`` above. A new room fails the test until it is given a floor.

Each check is a plain function run on the real tree, and once on a tiny synthetic input that
breaks it, so a check that can no longer fail is noticed.
"""

from __future__ import annotations

import ast
import functools
import itertools
from collections import defaultdict, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "lightning_speedpack"

#: The most lines a module may have (``STYLE.md``: past ~450, ask whether it is two).
MAX_LINES = 600

#: Where the size rule applies.
SIZED = ("lightning_speedpack", "benchmarks")

#: Every room's floor, lowest first. A module may import its own room and lower floors only.
LAYERS: dict[str, int] = {
    # 0: the shared vocabulary (findings, registry, tables, events) and the Lightning namespace
    # layer, imported by every tool, importing none of them.
    "core": 0,
    "__about__": 0,
    # 1: the tools, one room each: they import core, never one another.
    "advisor": 1,
    "batch_size": 1,
    "cache": 1,
    "comm": 1,
    "data_xray": 1,
    "retention": 1,
    "strategies": 1,
    "sync_points": 1,
    "throughput": 1,
    "timeline": 1,
    "wall_time": 1,
    "world": 1,  # the DDP world's table and revisions; only the doctor imports it
    # 2: rooms made of several tools.
    "what_if": 2,  # tries the cache's, the tuner's and the data X-ray's remedies
    "data": 2,  # one name for the cache and the data X-ray (lazy re-exports)
    # 3: the app on top: runner, CLI, report, compare.
    "doctor": 3,
    # 4: the entry points: the flat public API and ``python -m lightning_speedpack``.
    "__init__": 4,
    "__main__": 4,
}

#: How a module imports another (the first kind found is kept per pair of modules).
MODULE, FUNCTION, TYPE_ONLY, BY_NAME = "module level", "in a function", "TYPE_CHECKING", "by name"


@dataclass(frozen=True)
class Import:
    """``source`` imports ``target`` (both dotted module names) at ``line``, ``how``."""

    source: str
    target: str
    line: int
    how: str


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its ``__init__``)."""
    found: dict[str, Path] = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _type_checking(test: ast.expr) -> bool:
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


def _base(node: ast.ImportFrom, source: str, is_package: bool) -> str:
    """The module ``from <base> import ...`` reads, relative imports resolved."""
    if not node.level:
        return node.module or ""
    package = source.split(".") if is_package else source.split(".")[:-1]
    package = package[: len(package) - (node.level - 1)]  # one level up per extra dot
    return ".".join([*package, node.module] if node.module else package)


def imports_of(source: str, path: Path, known: Mapping[str, Path]) -> list[Import]:
    """The package modules ``source`` (at ``path``) imports, one :class:`Import` per statement.

    ``from a import b`` names ``a.b`` when it is a module, else ``a``; strings naming a package
    module (``"lightning_speedpack.x.y"``) are kept as :data:`BY_NAME`.
    """
    is_package = path.name == "__init__.py"
    found: list[Import] = []

    def add(names: Iterable[str], line: int, how: str) -> None:
        for name in names:
            if name in known and name != source:
                found.append(Import(source, name, line, how))
                return

    def visit(node: ast.AST, how: str) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                add([alias.name], node.lineno, how)
            return
        if isinstance(node, ast.ImportFrom):
            base = _base(node, source, is_package)
            for alias in node.names:
                add([f"{base}.{alias.name}", base], node.lineno, how)
            return
        if isinstance(node, ast.If) and _type_checking(node.test):
            for child in node.body:
                visit(child, TYPE_ONLY)
            for child in node.orelse:
                visit(child, how)
            return
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value.startswith(f"{PACKAGE}."):
                add([node.value], node.lineno, BY_NAME)
            return
        inner = how
        if how == MODULE and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            inner = FUNCTION
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)), MODULE)
    return found


def import_graph(root: Path = ROOT) -> list[Import]:
    """Every import among the package's modules (see :func:`imports_of`)."""
    known = modules(root)
    return [imp for name, path in known.items() for imp in imports_of(name, path, known)]


def find_cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """One circle per strongly connected group of ``graph``, as a path ``[a, b, ..., a]``.

    Example:
        >>> find_cycles({"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]})
        [['a', 'b', 'c', 'a']]
    """
    edges = {node: sorted(set(targets)) for node, targets in graph.items()}
    for targets in list(edges.values()):
        for target in targets:
            edges.setdefault(target, [])
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def connect(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in edges[node]:
            if target not in index:
                connect(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1 or node in edges[node]:
                groups.append(sorted(group))

    for node in sorted(edges):
        if node not in index:
            connect(node)
    return sorted(_shortest_cycle(edges, group) for group in groups)


def _shortest_cycle(edges: Mapping[str, list[str]], group: list[str]) -> list[str]:
    start, members = group[0], set(group)
    came_from: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for target in edges[node]:
            if target == start:
                path = [node]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                return [*reversed(path), start]
            if target in members and target not in came_from:
                came_from[target] = node
                queue.append(target)
    raise AssertionError(f"no circle through {start}")  # a group always holds one


def describe_cycle(cycle: list[str], imports: Iterable[Import]) -> str:
    """``a -> b (line 3, in a function) -> a (line 9, module level)``: one circle, explained."""
    where: dict[tuple[str, str], Import] = {}
    for imp in imports:
        where.setdefault((imp.source, imp.target), imp)
    steps = [cycle[0]]
    for source, target in itertools.pairwise(cycle):
        found = where.get((source, target))
        steps.append(f"{target} ({source}:{found.line}, {found.how})" if found else target)
    return " -> ".join(steps)


def room(module: str) -> str:
    """The room of a package module: its subpackage, or the top-level module's own name.

    Example:
        >>> room("lightning_speedpack.doctor.html.page"), room("lightning_speedpack")
        ('doctor', '__init__')
    """
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def layer_violations(imports: Iterable[Import], layers: Mapping[str, int] = LAYERS) -> list[str]:
    """Each import that goes up or sideways between rooms, or from or to a room with no floor."""
    found = []
    for imp in imports:
        source, target = room(imp.source), room(imp.target)
        if source == target:
            continue
        missing = [r for r in (source, target) if r not in layers]
        what = f"{imp.source}:{imp.line} imports {imp.target} ({imp.how})"
        if missing:
            found.append(f"{what}: room {missing[0]!r} has no floor in LAYERS")
            continue
        below, above = layers[target], layers[source]
        if below >= above:
            way = "goes up" if below > above else "goes sideways"
            found.append(f"{what}: {source} (floor {above}) -> {target} (floor {below}) {way}")
    return found


def long_modules(folders: Iterable[Path], limit: int = MAX_LINES) -> list[str]:
    """``path: N lines`` for each ``.py`` file under ``folders`` longer than ``limit``."""
    found = []
    for folder in folders:
        for path in sorted(folder.rglob("*.py")):
            lines = len(path.read_text(encoding="utf-8").splitlines())
            if lines > limit:
                found.append(f"{path.relative_to(folder.parent)}: {lines} lines (at most {limit})")
    return found


# --- the rules on the real tree ------------------------------------------------------------


@functools.cache
def _real_imports() -> tuple[Import, ...]:
    return tuple(import_graph())


def test_every_module_is_at_most_600_lines() -> None:
    too_long = long_modules(ROOT / folder for folder in SIZED)
    assert not too_long, "split by concept (STYLE.md, Layout):\n" + "\n".join(too_long)


def test_no_import_circle_in_the_package() -> None:
    imports = [i for i in _real_imports() if i.how != BY_NAME]
    graph: dict[str, set[str]] = defaultdict(set)
    for imp in imports:
        graph[imp.source].add(imp.target)
    cycles = [describe_cycle(c, imports) for c in find_cycles(graph)]
    assert not cycles, "import circles (move what both sides need down a floor):\n" + "\n".join(
        cycles
    )


def test_imports_run_downward_between_rooms() -> None:
    violations = layer_violations(_real_imports())
    assert not violations, "imports against LAYERS:\n" + "\n".join(violations)


def test_every_room_has_a_floor() -> None:
    rooms = {room(name) for name in modules()}
    assert rooms == set(LAYERS), f"rooms without a floor: {sorted(rooms - set(LAYERS))}"


def test_the_graph_sees_every_kind_of_import() -> None:
    # The checks read what they should: one known import of each kind in the real tree.
    seen = {(i.source, i.target, i.how) for i in _real_imports()}
    advisor = f"{PACKAGE}.advisor.callback"
    assert (advisor, f"{PACKAGE}.core.registry", MODULE) in seen
    assert (f"{PACKAGE}.doctor.runner", f"{PACKAGE}.what_if.callback", BY_NAME) in seen
    assert (f"{PACKAGE}.doctor.cli", f"{PACKAGE}.cache.reclaim", FUNCTION) in seen
    assert (PACKAGE, f"{PACKAGE}.throughput", TYPE_ONLY) in seen


# --- each check fails when it should -------------------------------------------------------


def _package(tmp_path: Path, files: Mapping[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / PACKAGE / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_a_long_module_is_reported(tmp_path: Path) -> None:
    folder = tmp_path / "benchmarks"
    folder.mkdir()
    (folder / "ok.py").write_text("x = 1\n" * MAX_LINES)
    (folder / "long.py").write_text("x = 1\n" * (MAX_LINES + 1))
    assert long_modules([folder]) == [f"benchmarks/long.py: {MAX_LINES + 1} lines (at most 600)"]


def test_a_circle_through_a_function_and_type_checking_import_is_found(tmp_path: Path) -> None:
    root = _package(
        tmp_path,
        {
            "__init__.py": "",
            "core/__init__.py": "",
            "core/a.py": "def f():\n    from lightning_speedpack.core import b\n",
            "core/b.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    from lightning_speedpack.core.c import C\n"
            ),
            "core/c.py": "from lightning_speedpack.core.a import f\n",
            "core/d.py": "import lightning_speedpack.core.a\n",
        },
    )
    imports = import_graph(root)
    graph: dict[str, set[str]] = defaultdict(set)
    for imp in imports:
        graph[imp.source].add(imp.target)
    cycles = find_cycles(graph)
    assert cycles == [[f"{PACKAGE}.core.{m}" for m in "abca"]]
    assert describe_cycle(cycles[0], imports) == (
        "lightning_speedpack.core.a"
        " -> lightning_speedpack.core.b (lightning_speedpack.core.a:2, in a function)"
        " -> lightning_speedpack.core.c (lightning_speedpack.core.b:3, TYPE_CHECKING)"
        " -> lightning_speedpack.core.a (lightning_speedpack.core.c:1, module level)"
    )


def test_a_self_import_and_two_circles_are_found() -> None:
    graph = {"a": ["a"], "b": ["c"], "c": ["b", "d"], "d": ["c"]}
    assert find_cycles(graph) == [["a", "a"], ["b", "c", "b"]]
    assert find_cycles({"a": ["b"], "b": ["c"]}) == []


def test_upward_sideways_and_unknown_imports_are_violations(tmp_path: Path) -> None:
    root = _package(
        tmp_path,
        {
            "__init__.py": "",
            "core/__init__.py": "",
            "core/x.py": "def f():\n    import lightning_speedpack.doctor\n",  # up
            "cache/__init__.py": "from lightning_speedpack.core import x\n",  # down: fine
            "advisor/__init__.py": "WHERE = {'C': 'lightning_speedpack.cache'}\n",  # sideways
            "doctor/__init__.py": "from lightning_speedpack.newroom import y\n",
            "newroom/__init__.py": "",
            "newroom/y.py": "",
        },
    )
    assert layer_violations(import_graph(root)) == [
        "lightning_speedpack.advisor:1 imports lightning_speedpack.cache (by name): "
        "advisor (floor 1) -> cache (floor 1) goes sideways",
        "lightning_speedpack.core.x:2 imports lightning_speedpack.doctor (in a function): "
        "core (floor 0) -> doctor (floor 3) goes up",
        "lightning_speedpack.doctor:1 imports lightning_speedpack.newroom.y (module level): "
        "room 'newroom' has no floor in LAYERS",
    ]
