"""The code's shape, as docs/architecture.md states it: rooms, one-way imports, small modules.

Every import (also those inside functions) between the project's modules is
read with ``ast``; ``if __name__ == "__main__":`` blocks (a script's entry
point) and ``if TYPE_CHECKING:`` blocks (annotations only) are left out.
Checked:

* no import cycle between modules;
* a room imports only rooms below it (``LAYERS``) or itself;
* no module over 600 lines.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
PACKAGES = ("proxy", "fragments", "routing", "admin_api", "spark_load")
MAX_LINES = 600

# Lowest first: a room may import the rooms before it in this list, never after.
# Rooms on one line are peers and must not import each other.
LAYERS = [
    ["routing"],
    ["proxy.net", "proxy.journal", "proxy.paging", "proxy.auth", "proxy.metrics", "proxy.selectors"],
    ["proxy.amqp", "proxy.config"],
    ["proxy.upstream", "proxy.queues", "proxy.cluster"],
    ["proxy.links"],
    ["proxy.exchanges"],
    ["proxy.transactions"],
    ["proxy.broker"],
    ["proxy.server", "proxy.plugins", "proxy.workers", "proxy.admission"],
    ["proxy.node"],
    ["proxy.replication"],
    ["fragments"],
    ["admin_api"],
    ["proxy.cli"],
    ["proxy.__main__", "proxy"],
    ["spark_load"],
]
RANK = {room: rank for rank, rooms in enumerate(LAYERS) for room in rooms}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for package in PACKAGES for p in (ROOT / package).rglob("*.py")}


def resolve(name: str, known) -> str | None:
    parts = name.split(".")
    while parts:
        if ".".join(parts) in known:
            return ".".join(parts)
        parts.pop()
    return None


def _not_at_run_time(node: ast.AST) -> bool:
    """``if __name__ == "__main__":`` (a script's entry) and ``if TYPE_CHECKING:`` blocks."""
    if not isinstance(node, ast.If):
        return False
    test = node.test
    if isinstance(test, ast.Name) and test.id == "TYPE_CHECKING":
        return True
    return (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name)
            and test.left.id == "__name__")


def imports(name: str, path: Path, known) -> set[str]:
    tree = ast.parse(path.read_text())
    tree.body = [node for node in tree.body if not _not_at_run_time(node)]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            targets = [f"{module}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            resolved = resolve(target, known)
            if resolved is not None and resolved != name:
                found.add(resolved)
    return found


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def room(name: str) -> str:
    """The most specific entry of ``LAYERS`` that contains the module."""
    parts = name.split(".")
    while parts:
        if ".".join(parts) in RANK:
            return ".".join(parts)
        parts.pop()
    raise AssertionError(f"{name} is in no room of LAYERS")


def test_no_import_cycles():
    edges = graph()
    cycles = []
    state: dict[str, int] = {}  # 1 visiting, 2 done
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(edges[node]):
            if state.get(dep) == 1:
                cycles.append(stack[stack.index(dep):] + [dep])
            elif dep not in state:
                visit(dep)
        stack.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node)
    assert cycles == []


def test_rooms_import_only_rooms_below_them():
    wrong = []
    for name, deps in graph().items():
        mine = room(name)
        for dep in deps:
            theirs = room(dep)
            if theirs != mine and RANK[theirs] >= RANK[mine]:
                wrong.append(f"{name} -> {dep}")
    assert sorted(wrong) == []


def test_no_module_over_600_lines():
    long = {name: n for name, path in modules().items()
            if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_every_room_says_what_it_owns():
    """Each package under proxy/ opens with a note: what it owns, what it may import."""
    silent = [str(init.relative_to(ROOT)) for init in (ROOT / "proxy").glob("*/__init__.py")
              if len(ast.get_docstring(ast.parse(init.read_text())) or "") < 80]
    assert silent == []
