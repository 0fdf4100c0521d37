"""The import rules, checked on the source with ``ast`` (nothing is imported).

Rules over our packages (``autoscaler``, ``coadapt_common``, ``providers``, ``trainer``, and, for
cycles, ``benchmarks`` and ``tests`` too):

1. ``providers`` and ``trainer`` import nothing from ``autoscaler`` (the act and train planes
   never depend on the decision plane; ``autoscaler`` may import ``providers``).
2. ``coadapt_common`` (the shared kernel) imports none of our other packages.
3. ``providers/local_agent.py`` imports none of our packages: it runs as a standalone script
   (the local instance agent) and keeps its own tiny atomic writer by design.
3b. Nothing imports the CLI (``autoscaler.cli``) but the CLI itself and tests: it is the top,
   where commands parse, call and print.
4. No import cycles among modules. Every import counts, including function-level (lazy) imports
   and imports between a package ``__init__`` and its modules; the one exemption is imports
   under ``if TYPE_CHECKING:``, which never run. ``from pkg import name`` is an edge to the
   module ``pkg.name`` when that is a module, else to ``pkg``; importing ``pkg.mod`` is not
   counted as importing ``pkg/__init__.py`` (Python runs it, but that would make every package
   that imports its own submodules a cycle).
5. No module of the four packages uses another module's private names: no ``from ours import
   _x``, no ``ours_module._x``, and no ``obj._x`` for a private name that the using module does
   not define itself (a cheap, conservative proxy for "another module's private attribute";
   receivers bound to third-party imports, e.g. ``torch._foreach_mul``, are not ours and are
   skipped). Tests are exempt from this rule: they may exercise internals.
6. The layers of ``autoscaler`` (ARCHITECTURE.md, "Packages by layer"): directly under
   ``autoscaler/`` sit only the package faces (:data:`FACES`), which import no layer; every other
   module belongs to the layer of the longest prefix in :data:`LAYERS` that names it, and imports
   only its own layer, the layers listed for it and the faces. The model imports no other layer;
   the market only the model; decide only the model and the market; the controller those and
   the pure ledger (``accounting``: the cost ledger and the dashboard page), never the bill,
   the reports, the simulator, the analysis or the CLI; the bill (which reads the controller's
   store), the analysis and the simulator sit above the controller, the reports above the
   analysis. The layers are package prefixes, so a module renamed or split inside its package
   keeps its rules. Where today's code breaks a rule, :data:`LAYER_EXCEPTIONS` says so with the
   reason; an exception no import needs any more is reported too, so that it goes when its
   import goes.
7. No two classes of one name in the four packages (one name per concept): a reader who meets
   ``JobSpec`` knows which one it is. Private classes (``_Row``) are local to their module and
   exempt; tests and benchmarks are not scanned.

The checker is tested on small synthetic trees too, so that each rule is known to fire.
"""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("autoscaler", "coadapt_common", "providers", "trainer", "benchmarks", "tests")
LIBRARY = ("autoscaler", "coadapt_common", "providers", "trainer")  # rule 5 applies to these
STANDALONE = ("providers.local_agent",)
PUBLIC_UNDERSCORE = frozenset({"_replace", "_asdict", "_fields", "_make"})  # namedtuple API


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    line: int


@dataclass
class Module:
    name: str
    path: Path
    is_package: bool
    tree: ast.Module
    edges: list[Edge] = field(default_factory=list)


def discover(root: Path, packages: Iterable[str] = PACKAGES) -> dict[str, Module]:
    """Every ``.py`` file under ``root/<package>`` as a parsed module, keyed by dotted name."""
    out: dict[str, Module] = {}
    for package in packages:
        base = root / package
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            is_package = parts[-1] == "__init__"
            name = ".".join(parts[:-1] if is_package else parts)
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            out[name] = Module(name, path, is_package, tree)
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node, except the bodies of ``if TYPE_CHECKING:`` blocks (their ``else`` runs)."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def _known(name: str, modules: dict[str, Module]) -> str | None:
    """``name`` or its longest prefix that is one of our modules."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def _from_base(module: Module, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    package = module.name if module.is_package else module.name.rpartition(".")[0]
    parts = package.split(".")
    if node.level > 1:
        parts = parts[: len(parts) - (node.level - 1)]
    base = ".".join(parts)
    return f"{base}.{node.module}" if node.module else base


def build_graph(modules: dict[str, Module]) -> None:
    """Fill ``Module.edges`` with the runtime imports between our modules."""
    for module in modules.values():
        for node in _runtime_nodes(module.tree):
            targets: list[str | None] = []
            if isinstance(node, ast.Import):
                targets = [_known(alias.name, modules) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _from_base(module, node)
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    targets.append(sub if sub in modules else _known(base, modules))
            for target in dict.fromkeys(targets):  # one edge per target and import statement
                if target is not None and target != module.name:
                    module.edges.append(Edge(module.name, target, node.lineno))


def _in(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def _where(modules: dict[str, Module], edge: Edge) -> str:
    return f"{modules[edge.source].path.relative_to(ROOT_OF[0])}:{edge.line}"


ROOT_OF = [ROOT]  # the root that paths in messages are relative to (synthetic trees change it)


def layering_violations(modules: dict[str, Module]) -> list[str]:
    """Rules 1-3, one line per offending import."""
    out = []
    for module in modules.values():
        for edge in module.edges:
            where = _where(modules, edge)
            if (_in(edge.source, "providers") or _in(edge.source, "trainer")) and _in(
                edge.target, "autoscaler"
            ):
                out.append(f"{where}: {edge.source} imports {edge.target} (the decision plane)")
            if _in(edge.source, "coadapt_common") and not _in(edge.target, "coadapt_common"):
                out.append(f"{where}: the kernel {edge.source} imports {edge.target}")
            if edge.source in STANDALONE:
                out.append(f"{where}: standalone script {edge.source} imports {edge.target}")
            cli = not _in(edge.source, "autoscaler.cli") and not _in(edge.source, "tests")
            if cli and _in(edge.target, "autoscaler.cli"):
                out.append(f"{where}: {edge.source} imports the CLI {edge.target}")
    return out


FACES = ("autoscaler", "autoscaler.errors")
"""The only modules directly under ``autoscaler/``: the package and its error root."""
MODEL = "autoscaler.model"
MARKET = "autoscaler.market"
DECIDE = "autoscaler.decide"
LEDGER = "autoscaler.accounting"  # the pure part: the cost ledger (costs), the dashboard page
CONTROLLER = "autoscaler.controller"
BILL = "autoscaler.accounting.billing"  # reads the controller's store
ANALYSIS = "autoscaler.analysis"
REPORTS = "autoscaler.accounting.report"  # the cost report and the frontier pages
SIM = "autoscaler.sim"
CLI = "autoscaler.cli"
LAYERS: dict[str, tuple[str, ...]] = {  # lowest first: each names only layers listed before it
    MODEL: (),
    MARKET: (MODEL,),
    DECIDE: (MODEL, MARKET),
    LEDGER: (MODEL, MARKET),
    CONTROLLER: (MODEL, MARKET, DECIDE, LEDGER),
    BILL: (MODEL, MARKET, DECIDE, LEDGER, CONTROLLER),
    ANALYSIS: (MODEL, MARKET, DECIDE, LEDGER, CONTROLLER),
    REPORTS: (MODEL, MARKET, DECIDE, LEDGER, ANALYSIS),
    SIM: (MODEL, MARKET, DECIDE, LEDGER, CONTROLLER, BILL, ANALYSIS, REPORTS),
    CLI: (MODEL, MARKET, DECIDE, LEDGER, CONTROLLER, BILL, ANALYSIS, REPORTS, SIM),
}
"""Rule 6: each layer (a package prefix) and the layers it may import."""
LAYER_EXCEPTIONS: dict[tuple[str, str], str] = {}
"""Imports between layers that break rule 6 today, each with its reason (by layer, so that they
survive renames inside a package)."""


def layer_of(name: str) -> str | None:
    """The layer of module ``name``: the longest of :data:`LAYERS` that is ``name`` or a
    package holding it; ``None`` if none is."""
    found = [layer for layer in LAYERS if _in(name, layer)]
    return max(found, key=len) if found else None


def layer_violations(
    modules: dict[str, Module], exceptions: Iterable[tuple[str, str]] = ()
) -> list[str]:
    """Rule 6, one line per offending module or import (``exceptions``: the layer pairs let
    through; one that lets nothing through is reported)."""
    out = []
    allowed_pairs = set(exceptions)
    used: set[tuple[str, str]] = set()
    for module in modules.values():
        if not _in(module.name, "autoscaler"):
            continue
        rel = module.path.relative_to(ROOT_OF[0])
        if module.name in FACES:
            for edge in module.edges:
                if _in(edge.target, "autoscaler") and edge.target not in FACES:
                    where = _where(modules, edge)
                    out.append(f"{where}: the face {edge.source} imports {edge.target}")
            continue
        if module.name.count(".") == 1 and not module.is_package:
            out.append(f"{rel}: {module.name} sits directly under autoscaler/, not in a layer")
            continue
        layer = layer_of(module.name)
        if layer is None:
            out.append(f"{rel}: {module.name} is in no layer (see LAYERS)")
            continue
        for edge in module.edges:
            target = edge.target
            if not _in(target, "autoscaler") or target in FACES or _in(target, CLI):
                continue  # outside autoscaler (rules 1-3), a face, or the CLI (rule 3b)
            below = layer_of(target)
            if below is None or below == layer or below in LAYERS[layer]:
                continue
            if (layer, below) in allowed_pairs:
                used.add((layer, below))
                continue
            may = ", ".join(LAYERS[layer]) or "no other layer"
            out.append(
                f"{_where(modules, edge)}: {edge.source} ({layer}) imports {target} ({below}):"
                f" {layer} imports only {may}"
            )
    for source, target in sorted(allowed_pairs - used):
        out.append(f"the exception {source} -> {target} lets no import through: remove it")
    return out


def find_cycles(modules: dict[str, Module]) -> list[str]:
    """Rule 4: one line per strongly connected component with more than one module, showing one
    cycle through it with the file and line of each import."""
    graph: dict[str, dict[str, Edge]] = {name: {} for name in modules}
    for module in modules.values():
        for edge in module.edges:
            graph[edge.source].setdefault(edge.target, edge)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = [0]

    def connect(v: str) -> None:  # Tarjan (recursion depth is bounded by the module count)
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
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
                components.append(sorted(component))

    for name in sorted(graph):
        if name not in index:
            connect(name)
    out = []
    for component in components:
        members = set(component)
        start = component[0]
        # Breadth-first search inside the component for the shortest way back to ``start``.
        previous: dict[str, Edge] = {}
        frontier = [start]
        found: Edge | None = None
        while frontier and found is None:
            nxt = []
            for v in frontier:
                for w, edge in sorted(graph[v].items()):
                    if w == start:
                        found = edge
                        break
                    if w in members and w not in previous and w != start:
                        previous[w] = edge
                        nxt.append(w)
                if found is not None:
                    break
            frontier = nxt
        assert found is not None  # a component of size > 1 always has a cycle through start
        path = [found]
        while path[-1].source != start:
            path.append(previous[path[-1].source])
        path.reverse()
        hops = " -> ".join([start, *(e.target for e in path)])
        lines = ", ".join(_where(modules, e) for e in path)
        out.append(f"import cycle {hops} (imports at {lines})")
    return out


def private_name_uses(modules: dict[str, Module]) -> list[str]:
    """Rule 5 (library modules only), in file and line order."""
    found: list[tuple[str, int, str]] = []
    for module in modules.values():
        if not any(_in(module.name, p) for p in LIBRARY):
            continue
        rel = module.path.relative_to(ROOT_OF[0])
        ours: set[str] = set()  # local names bound to our modules
        foreign: set[str] = set()  # local names bound to third-party/stdlib imports
        defined: set[str] = set()  # private names this module defines (functions, attributes)
        for node in ast.walk(module.tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    bound = alias.asname or alias.name.split(".")[0]
                    (ours if _known(alias.name, modules) is not None else foreign).add(bound)
            elif isinstance(node, ast.ImportFrom):
                base = _from_base(module, node)
                for alias in node.names:
                    bound = alias.asname or alias.name
                    if _known(base, modules) is None:
                        foreign.add(bound)
                    elif f"{base}.{alias.name}" in modules:
                        ours.add(bound)
                    private = alias.name.startswith("_") and not alias.name.startswith("__")
                    if _known(base, modules) is not None and private:
                        found.append(
                            (str(rel), node.lineno, f"imports private {base}.{alias.name}")
                        )
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defined.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                defined.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                defined.add(node.id)
            elif isinstance(node, ast.arg):
                defined.add(node.arg)
        for node in ast.walk(module.tree):
            if not isinstance(node, ast.Attribute):
                continue
            attr = node.attr
            if not attr.startswith("_") or attr.startswith("__") or attr in PUBLIC_UNDERSCORE:
                continue
            root: ast.expr = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            receiver = root.id if isinstance(root, ast.Name) else None
            if receiver in ours and root is node.value:
                found.append(
                    (str(rel), node.lineno, f"uses private {receiver}.{attr} of our module")
                )
            elif (receiver in ("self", "cls") and root is node.value) or attr in defined:
                continue  # its own attribute, or a private name this module defines
            elif receiver in foreign:
                continue
            else:
                found.append(
                    (str(rel), node.lineno, f"uses {attr}, a private name defined elsewhere")
                )
    return [f"{rel}:{line}: {message}" for rel, line, message in sorted(found)]


def duplicate_class_names(modules: dict[str, Module]) -> list[str]:
    """Rule 7 (library modules only): one line per public class name defined more than once,
    with every place it is defined."""
    places: dict[str, list[str]] = {}
    for module in sorted(modules.values(), key=lambda m: str(m.path)):
        if not any(_in(module.name, p) for p in LIBRARY):
            continue
        rel = module.path.relative_to(ROOT_OF[0])
        for node in ast.walk(module.tree):
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                places.setdefault(node.name, []).append(f"{rel}:{node.lineno}")
    return [
        f"class {name} is defined {len(where)} times: {', '.join(where)}"
        for name, where in sorted(places.items())
        if len(where) > 1
    ]


def check(root: Path, exceptions: Iterable[tuple[str, str]] = ()) -> list[str]:
    """Every violation of rules 1-7 under ``root``, as messages (empty when all hold);
    ``exceptions``: the layer pairs rule 6 lets through (:data:`LAYER_EXCEPTIONS`)."""
    ROOT_OF[0] = root
    try:
        modules = discover(root)
        build_graph(modules)
        return (
            layering_violations(modules)
            + layer_violations(modules, exceptions)
            + find_cycles(modules)
            + private_name_uses(modules)
            + duplicate_class_names(modules)
        )
    finally:
        ROOT_OF[0] = ROOT


# ---------------------------------------------------------------------- the tree itself


@pytest.mark.slow
def test_the_tree_follows_the_import_rules() -> None:
    problems = check(ROOT, LAYER_EXCEPTIONS)
    assert not problems, "import rules broken:\n" + "\n".join(problems)


@pytest.mark.slow
def test_the_graph_sees_the_real_edges() -> None:
    """Guards the checker against silently seeing nothing (e.g. a path change)."""
    modules = discover(ROOT)
    build_graph(modules)
    edges = {(e.source, e.target) for m in modules.values() for e in m.edges}
    assert ("providers.local", "coadapt_common.procfs") in edges
    assert ("trainer.api", "trainer.stepping") in edges
    assert (
        "autoscaler.decide.policy",
        "autoscaler.decide.policy.pollux",
    ) in edges  # lazy, function-level
    assert ("tests.trainer.test_launch_support", "tests.trainer.harness") in edges  # relative
    assert len(modules) > 100


def test_one_copy_of_atomic_writes_and_proc_parsing() -> None:
    """Renames over a target (``os.replace``/``os.rename``/``mkstemp``) only in
    ``coadapt_common/atomic.py`` (and the standalone agent's own writer); ``/proc`` paths only in
    ``coadapt_common/procfs.py``. Tests are not scanned: they read ``/proc`` independently, as an
    oracle for the code under test."""
    allowed_rename = {"coadapt_common/atomic.py", "providers/local_agent.py"}
    allowed_proc = {"coadapt_common/procfs.py"}
    found = []
    for package in (*LIBRARY, "benchmarks", "examples"):
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                    call = f"{node.value.id}.{node.attr}"
                    renames = call in ("os.replace", "os.rename", "tempfile.mkstemp")
                    if renames and rel not in allowed_rename:
                        found.append(f"{rel}:{node.lineno}: {call}")
                elif (  # also the literal parts of f-strings, which ast.walk visits
                    isinstance(node, ast.Constant)
                    and isinstance(node.value, str)
                    and node.value.startswith("/proc")
                    and rel not in allowed_proc
                ):
                    found.append(f"{rel}:{node.lineno}: {node.value!r}")
    assert not found, "a second copy of the kernel:\n" + "\n".join(found)


# ---------------------------------------------------------------------- the checker itself


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")
    return tmp_path


CLEAN = {
    "coadapt_common/__init__.py": "",
    "coadapt_common/clock.py": "import time\n",
    "autoscaler/__init__.py": "",
    "autoscaler/decide/jobs.py": "from coadapt_common.clock import time\n",
    "providers/__init__.py": "",
    "providers/base.py": "from coadapt_common import clock\n",
    "providers/local_agent.py": "import os\n",
    "trainer/__init__.py": "",
}


def test_checker_passes_a_clean_tree(tmp_path: Path) -> None:
    assert check(_tree(tmp_path, CLEAN)) == []


def test_checker_flags_a_forbidden_import(tmp_path: Path) -> None:
    root = _tree(tmp_path, {**CLEAN, "providers/base.py": "import autoscaler.decide.jobs\n"})
    assert check(root) == [
        "providers/base.py:1: providers.base imports autoscaler.decide.jobs (the decision plane)"
    ]


def test_checker_flags_the_kernel_and_the_standalone_agent(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            **CLEAN,
            "coadapt_common/clock.py": "def f():\n    from trainer import x\n",
            "providers/local_agent.py": "from coadapt_common.clock import time\n",
        },
    )
    problems = check(root)
    assert "coadapt_common/clock.py:2: the kernel coadapt_common.clock imports trainer" in problems
    assert any("standalone script providers.local_agent" in p for p in problems)


def test_checker_flags_the_controller_importing_the_simulator(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            **CLEAN,
            "autoscaler/controller/__init__.py": "",
            "autoscaler/controller/loop.py": "from autoscaler.sim.cloud import FleetView\n",
            "autoscaler/sim/__init__.py": "",
            "autoscaler/sim/cloud.py": "FleetView = 1\n",
        },
    )
    assert check(root) == [
        "autoscaler/controller/loop.py:1: autoscaler.controller.loop (autoscaler.controller) "
        "imports autoscaler.sim.cloud (autoscaler.sim): autoscaler.controller imports only "
        "autoscaler.model, autoscaler.market, autoscaler.decide, autoscaler.accounting"
    ]


LAYERED = {  # one module in each layer, each importing nothing
    **CLEAN,
    "autoscaler/errors.py": "from coadapt_common.clock import time\n",
    "autoscaler/model/goodput.py": "",
    "autoscaler/market/prices.py": "",
    "autoscaler/decide/sizing.py": "",
    "autoscaler/accounting/__init__.py": "",
    "autoscaler/accounting/costs.py": "",
    "autoscaler/accounting/billing.py": "",
    "autoscaler/accounting/report/rows.py": "",
    "autoscaler/controller/loop.py": "",
    "autoscaler/analysis/floor.py": "",
    "autoscaler/sim/world.py": "",
    "autoscaler/cli/main.py": "",
    "benchmarks/round.py": "",
    "tests/cli/test_cli.py": "",
}


@pytest.mark.parametrize(
    ("source", "imported", "target_layer"),
    [
        ("autoscaler/model/goodput.py", "autoscaler.market.prices", MARKET),
        ("autoscaler/market/prices.py", "autoscaler.decide.sizing", DECIDE),
        ("autoscaler/decide/sizing.py", "autoscaler.accounting.costs", LEDGER),
        ("autoscaler/decide/sizing.py", "autoscaler.controller.loop", CONTROLLER),
        ("autoscaler/accounting/costs.py", "autoscaler.controller.loop", CONTROLLER),
        ("autoscaler/controller/loop.py", "autoscaler.accounting.billing", BILL),
        ("autoscaler/controller/loop.py", "autoscaler.accounting.report.rows", REPORTS),
        ("autoscaler/controller/loop.py", "autoscaler.analysis.floor", ANALYSIS),
        ("autoscaler/analysis/floor.py", "autoscaler.sim.world", SIM),
        ("autoscaler/accounting/report/rows.py", "autoscaler.controller.loop", CONTROLLER),
    ],
)
def test_checker_flags_an_import_against_the_layers(
    tmp_path: Path, source: str, imported: str, target_layer: str
) -> None:
    root = _tree(tmp_path, {**LAYERED, source: f"import {imported}\n"})
    name = source.removesuffix(".py").replace("/", ".")
    layer = layer_of(name)
    assert layer is not None
    may = ", ".join(LAYERS[layer]) or "no other layer"
    assert check(root) == [
        f"{source}:1: {name} ({layer}) imports {imported} ({target_layer}): "
        f"{layer} imports only {may}"
    ]


@pytest.mark.parametrize(
    ("source", "imported"),
    [
        ("autoscaler/market/prices.py", "autoscaler.model.goodput"),
        ("autoscaler/decide/sizing.py", "autoscaler.market.prices"),
        ("autoscaler/accounting/costs.py", "autoscaler.market.prices"),
        ("autoscaler/controller/loop.py", "autoscaler.accounting.costs"),
        ("autoscaler/controller/loop.py", "autoscaler.decide.sizing"),
        ("autoscaler/accounting/billing.py", "autoscaler.controller.loop"),
        ("autoscaler/accounting/report/rows.py", "autoscaler.analysis.floor"),
        ("autoscaler/sim/world.py", "autoscaler.controller.loop"),
        ("autoscaler/sim/world.py", "autoscaler.analysis.floor"),
        ("autoscaler/cli/main.py", "autoscaler.sim.world"),
        ("autoscaler/model/goodput.py", "autoscaler.errors"),
        ("autoscaler/cli/main.py", "autoscaler"),
        ("tests/cli/test_cli.py", "autoscaler.cli.main"),
    ],
)
def test_checker_lets_the_layers_import_downwards(
    tmp_path: Path, source: str, imported: str
) -> None:
    assert check(_tree(tmp_path, {**LAYERED, source: f"import {imported}\n"})) == []


def test_checker_flags_whatever_imports_the_cli(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            **LAYERED,
            "benchmarks/round.py": "from autoscaler.cli import main\n",
            "autoscaler/sim/world.py": "def f():\n    import autoscaler.cli.main\n",
        },
    )
    assert check(root) == [
        "autoscaler/sim/world.py:2: autoscaler.sim.world imports the CLI autoscaler.cli.main",
        "benchmarks/round.py:1: benchmarks.round imports the CLI autoscaler.cli.main",
    ]


def test_checker_flags_modules_outside_the_layers_and_faces_that_import_one(
    tmp_path: Path,
) -> None:
    root = _tree(
        tmp_path,
        {
            **LAYERED,
            "autoscaler/helpers.py": "",
            "autoscaler/tools/__init__.py": "",
            "autoscaler/tools/csvs.py": "",
            "autoscaler/errors.py": "from autoscaler.model import goodput\n",
        },
    )
    assert check(root) == [
        "autoscaler/errors.py:1: the face autoscaler.errors imports autoscaler.model.goodput",
        "autoscaler/helpers.py: autoscaler.helpers sits directly under autoscaler/, not in a layer",
        "autoscaler/tools/__init__.py: autoscaler.tools is in no layer (see LAYERS)",
        "autoscaler/tools/csvs.py: autoscaler.tools.csvs is in no layer (see LAYERS)",
    ]


def test_checker_lets_an_exception_through_and_flags_one_no_longer_needed(
    tmp_path: Path,
) -> None:
    root = _tree(
        tmp_path, {**LAYERED, "autoscaler/market/prices.py": "import autoscaler.decide.sizing\n"}
    )
    needed = ("autoscaler.market", "autoscaler.decide")
    stale = ("autoscaler.model", "autoscaler.sim")
    assert check(root, [needed]) == []
    assert check(root, [needed, stale]) == [
        "the exception autoscaler.model -> autoscaler.sim lets no import through: remove it"
    ]
    assert len(check(root)) == 1


@pytest.mark.slow
def test_the_layer_table_runs_one_way_over_packages_of_the_tree() -> None:
    """Each layer names only layers listed before it (so no two may import each other), every
    layer and every exception's layer is a package or module of the tree, and the layers of the
    rules as ARCHITECTURE.md states them hold."""
    modules = discover(ROOT)
    for i, (layer, below) in enumerate(LAYERS.items()):
        assert set(below) <= set(list(LAYERS)[:i]), layer
        assert layer in modules, layer
    for source, target in LAYER_EXCEPTIONS:
        assert source in LAYERS and target in LAYERS
    assert LAYERS["autoscaler.model"] == ()
    assert LAYERS["autoscaler.market"] == ("autoscaler.model",)
    assert set(LAYERS["autoscaler.decide"]) == {"autoscaler.model", "autoscaler.market"}
    controller = set(LAYERS["autoscaler.controller"])
    assert not controller & {"autoscaler.sim", "autoscaler.analysis", "autoscaler.cli"}
    assert layer_of("autoscaler.accounting.costs") == "autoscaler.accounting"
    assert layer_of("autoscaler.accounting.billing") == "autoscaler.accounting.billing"
    assert all("autoscaler.cli" not in below for below in LAYERS.values())


def test_checker_reports_a_lazy_cycle_with_its_path(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            **CLEAN,
            "trainer/a.py": "from trainer.b import B\n",
            "trainer/b.py": "def f():\n    from trainer.c import C\n",
            "trainer/c.py": "from trainer import a\n",
            "trainer/d.py": (
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from trainer.a import A\n"
            ),
        },
    )
    assert check(root) == [
        "import cycle trainer.a -> trainer.b -> trainer.c -> trainer.a "
        "(imports at trainer/a.py:1, trainer/b.py:2, trainer/c.py:1)"
    ]


def test_checker_flags_a_package_init_cycle(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            **CLEAN,
            "autoscaler/decide/policy/__init__.py": (
                "def make():\n    from autoscaler.decide.policy import p\n"
            ),
            "autoscaler/decide/policy/p.py": "from autoscaler.decide.policy import make\n",
        },
    )
    assert check(root) == [
        "import cycle autoscaler.decide.policy -> autoscaler.decide.policy.p -> "
        "autoscaler.decide.policy (imports at autoscaler/decide/policy/__init__.py:2, "
        "autoscaler/decide/policy/p.py:1)"
    ]


def test_checker_flags_private_names_of_other_modules(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            **CLEAN,
            "trainer/api.py": "class Job:\n    def _step(self):\n        self._n = 1\n",
            "trainer/data.py": """\
                import torch
                from trainer import api
                from trainer.api import _helper


                class Loader:
                    def go(self, job):
                        self.job._step()
                        job._step()
                        api._x
                        torch._foreach_mul
                        self._own = 1
                        job._mine = 1
                        return job._mine, self._own, self.__class__
                """,
        },
    )
    assert check(root) == [
        "trainer/data.py:3: imports private trainer.api._helper",
        "trainer/data.py:8: uses _step, a private name defined elsewhere",
        "trainer/data.py:9: uses _step, a private name defined elsewhere",
        "trainer/data.py:10: uses private api._x of our module",
    ]


def test_checker_flags_two_classes_of_one_name(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            **CLEAN,
            "autoscaler/decide/jobs.py": "class JobSpec:\n    pass\n\n\nclass _Row:\n    pass\n",
            "autoscaler/controller/__init__.py": "",
            "autoscaler/controller/jobspec.py": (
                "class _Row:\n    pass\n\n\ndef f():\n    class JobSpec:\n        pass\n"
            ),
            "tests/test_x.py": "class JobSpec:\n    pass\n",
        },
    )
    assert check(root) == [
        "class JobSpec is defined 2 times: autoscaler/controller/jobspec.py:6, "
        "autoscaler/decide/jobs.py:1"
    ]


# Whole-tree checks: the only test modules at the top of tests/.
WHOLE_TREE_TESTS = frozenset(
    {"test_imports.py", "test_lint.py", "test_readme.py", "test_suite_cpu_bench.py"}
)


def test_tests_mirror_the_packages() -> None:
    """Every test package names a package of the tree (``tests/decide/policy`` tests
    ``autoscaler/decide/policy``, ``tests/providers`` tests ``providers``, ``tests/common``
    tests ``coadapt_common``, ``tests/terraform`` the modules); no test module sits at the top
    of ``tests/`` but the whole-tree checks."""
    tests = ROOT / "tests"
    unmatched = []
    for init in sorted(tests.rglob("__init__.py")):
        rel = init.parent.relative_to(tests)
        if rel == Path("."):
            continue
        homes = (ROOT / "autoscaler" / rel, ROOT / rel, ROOT / f"coadapt_{rel}")
        if not any(home.is_dir() for home in homes):
            unmatched.append(str(rel))
    assert unmatched == [], f"test packages with no package of that name: {unmatched}"
    top = sorted(p.name for p in tests.glob("test_*.py"))
    assert set(top) <= WHOLE_TREE_TESTS, f"tests at the top of tests/: {top}"
