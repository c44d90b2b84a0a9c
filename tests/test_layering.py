"""The import graph of ``tdfunc`` follows its floors.

Every module under ``tdfunc/`` is parsed (not imported): module-level and
function-level imports are edges, relative imports are resolved, and imports
under ``if TYPE_CHECKING:`` are not edges (they never run). Floors, from the
ground up:

1. ``tdfunc._core``: the container core; imports nothing of tdfunc above it. Inside it,
   three floors: ``helpers/`` (imports only helpers), one folder per concern holding
   only its mixins (imports only helpers: no mixin imports another), and the
   composition modules at its top (``tensor_like``, ``ops``, ``container``, ``base``).
2. Features: ``_persist``, ``_distributed``, ``_modules``, ``_pytree``,
   ``_tensorclass``. They build on the core and import each other only where
   ``ALLOWED_FEATURE_EDGES`` says.
3. ``tdfunc._assembly``: composes ``TensorDict`` and ``TensorClass``; the only
   module importing every feature.
4. On top: ``_ensemble``, ``optim``, ``_capture``, ``demo`` and the public facade.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "tdfunc"
FEATURES = ("_persist", "_distributed", "_modules", "_pytree", "_tensorclass")
TOP = ("_assembly", "_ensemble", "optim", "demo", "_capture")

# feature -> the other features it may import, and why
ALLOWED_FEATURE_EDGES: dict[str, set[str]] = {
    "_persist": set(),
    # map sends file-backed leaves by file name and identity (_persist/sharing.py)
    "_distributed": {"_persist"},
    "_modules": set(),
    "_pytree": set(),
    "_tensorclass": set(),
}

# What the top floor may import besides the public API (``tdfunc`` / ``tdfunc._assembly``)
# and its own package: lower-level helpers it needs, named one by one.
TOP_FLOOR_HELPERS: dict[str, set[str]] = {
    # the ensemble swaps parameters through the module-swapping feature's own tools
    "_ensemble": {
        "tdfunc._modules.slots",
        # whether a call is traced, compiled or transformed: one module answers for all
        "tdfunc._core.helpers.tracing",
        # the one code generator, shared with the swap plans and TensorClass
        "tdfunc._core.helpers.codegen",
    },
    # an ensemble declares which of its parameters carry the member dim (optimizer groups)
    # and which tensors it keeps shared (no member dim, whatever their size)
    "optim": {
        "tdfunc._ensemble.members",
        "tdfunc._ensemble.shared",
        # the update picks its kernel by whether it is compiled or transformed
        "tdfunc._core.helpers.tracing",
    },
    # a captured step runs the user's function; it needs nothing of tdfunc
    "_capture": set(),
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, module: str, is_package: bool, known: set[str]) -> set[str]:
    """The tdfunc modules ``module`` imports (skipping ``if TYPE_CHECKING:`` blocks)."""
    found: set[str] = set()
    package = module if is_package else module.rpartition(".")[0]

    def resolve(name: str) -> str | None:
        # the longest known module that ``name`` starts with (``a.b.c`` may be ``a.b`` + attr)
        while name:
            if name in known:
                return name
            name = name.rpartition(".")[0]
        return None

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "tdfunc":
                    target = resolve(alias.name)
                    if target:
                        found.add(target)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            if stem.split(".")[0] == "tdfunc":
                for alias in node.names:  # ``from . import x``: x may be a module
                    target = resolve(f"{stem}.{alias.name}") or resolve(stem)
                    if target:
                        found.add(target)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    found.discard(module)
    return found


def _parse() -> tuple[dict[str, set[str]], dict[str, ast.AST]]:
    paths = sorted(ROOT.rglob("*.py"))
    names = {_module_name(path): path for path in paths}
    trees = {name: ast.parse(path.read_text(), str(path)) for name, path in names.items()}
    known = set(names)
    graph = {
        name: _imports(trees[name], name, names[name].name == "__init__.py", known)
        for name in names
    }
    return graph, trees


GRAPH, TREES = _parse()


def _floor(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _is_package_face(module: str) -> bool:
    # ``from .x import y`` in a package runs the package's __init__ first: that is
    # an import of the parent package, which the graph does not count as an edge
    return module == "tdfunc"


# floors whose modules must not import the package face at all: ``tdfunc`` imports them
NO_FACE_IMPORT = ("optim",)


def test_floors_imported_by_the_face_do_not_import_it():
    wrong = {
        module: "tdfunc"
        for module, targets in GRAPH.items()
        if _floor(module) in NO_FACE_IMPORT and "tdfunc" in targets
    }
    assert not wrong, wrong


def test_the_graph_sees_the_whole_package():
    assert "tdfunc._core.container" in GRAPH and "tdfunc._assembly" in GRAPH
    assert "tdfunc._core.keys.access" in GRAPH["tdfunc._core.ops"]
    assert len(GRAPH) > 60


def test_no_import_circle():
    """Depth-first search over the graph; a back edge is a circle, reported as a path."""
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for target in sorted(GRAPH[node]):
            if _is_package_face(target):
                continue
            if state.get(target) == 1:
                circles.append([*stack[stack.index(target) :], target])
            elif target not in state:
                visit(target)
        stack.pop()
        state[node] = 2

    for node in sorted(GRAPH):
        if node not in state:
            visit(node)
    assert not circles, "import circles:\n" + "\n".join(" -> ".join(c) for c in circles)


def test_the_core_imports_only_the_core():
    wrong = {
        module: sorted(t for t in targets if _floor(t) != "_core")
        for module, targets in GRAPH.items()
        if _floor(module) == "_core"
    }
    assert not {m: t for m, t in wrong.items() if t}, wrong


CORE_CONCERNS = ("keys", "state", "shape", "math", "convert")
CORE_COMPOSITION = ("tensor_like", "ops", "container", "base")


def _core_floor(module: str) -> int:
    """1 helpers, 2 a concern's mixins, 3 composition (0: the package face)."""
    parts = module.split(".")
    if len(parts) == 2:
        return 0
    if parts[2] == "helpers":
        return 1
    if parts[2] in CORE_CONCERNS:
        return 2
    assert parts[2] in CORE_COMPOSITION, f"{module}: not on a floor of tdfunc._core"
    return 3


def test_the_core_modules_each_stand_on_a_floor():
    core = [module for module in GRAPH if _floor(module) == "_core"]
    assert {_core_floor(module) for module in core} == {0, 1, 2, 3}


def test_no_arrow_runs_back_up_inside_the_core():
    """Helpers import only helpers; a concern's mixins import only helpers, so every
    concern folder stands on one floor; only the composition modules combine mixins."""
    wrong = []
    for module, targets in GRAPH.items():
        if _floor(module) != "_core" or _core_floor(module) in (0, 3):
            continue
        for target in sorted(targets):
            if _floor(target) == "_core" and _core_floor(target) != 1:
                wrong.append(f"{module} -> {target}")
    assert not wrong, "arrows up inside tdfunc._core:\n" + "\n".join(wrong)


def _classes(module: str) -> list[str]:
    return [node.name for node in TREES[module].body if isinstance(node, ast.ClassDef)]


def test_concern_folders_hold_mixins_and_helpers_hold_none():
    for module in GRAPH:
        if _floor(module) != "_core" or module.endswith("__init__"):
            continue
        floor = _core_floor(module)
        mixins = [name for name in _classes(module) if name.endswith("Mixin")]
        if floor == 2 and not _source_is_package(module):
            assert mixins, f"{module}: a concern folder holds mixins; move helpers to helpers/"
        if floor == 1:
            assert set(mixins) <= {"ContainerMixin"}, f"{module}: a mixin among the helpers"


def test_features_import_only_the_core_and_allowed_features():
    wrong = {}
    for module, targets in GRAPH.items():
        floor = _floor(module)
        if floor not in FEATURES:
            continue
        allowed = {"_core", floor} | ALLOWED_FEATURE_EDGES[floor]
        bad = sorted(t for t in targets if _floor(t) not in allowed)
        if bad:
            wrong[module] = bad
    assert not wrong, wrong


def test_features_never_import_the_floors_above():
    for module, targets in GRAPH.items():
        if _floor(module) in FEATURES or _floor(module) == "_core":
            above = sorted(t for t in targets if _floor(t) in TOP or t == "tdfunc")
            assert not above, (module, above)


def test_only_the_assembly_imports_every_feature():
    every = set(FEATURES)
    importers = sorted(
        module for module, targets in GRAPH.items() if every <= {_floor(t) for t in targets}
    )
    assert importers == ["tdfunc._assembly"], importers


def test_the_top_floor_uses_the_public_api_and_named_helpers():
    public = {"tdfunc", "tdfunc._assembly"}
    for top, helpers in TOP_FLOOR_HELPERS.items():
        for module, targets in GRAPH.items():
            if _floor(module) != top:
                continue
            extra = sorted(
                t for t in targets if _floor(t) != top and t not in public and t not in helpers
            )
            assert not extra, (module, extra)


def _source(module: str) -> str:
    path = ROOT.parent / module.replace(".", "/")
    return (path / "__init__.py" if path.is_dir() else path.with_suffix(".py")).read_text()


def _is_class_name(name: str) -> bool:
    return name[:1].isupper() and not name.isupper()  # CamelCase, not a CONSTANT


def test_no_class_placeholder():
    """No ``TensorDict = None`` waiting to be bound later (by ``global`` or from outside)."""
    for module, tree in TREES.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Global):
                classes = [name for name in node.names if _is_class_name(name)]
                assert not classes, f"{module}: `global {', '.join(classes)}` rebinds a class"
        for node in tree.body:  # module level, also under `if`/`else`
            for inner in ast.walk(node):
                if isinstance(inner, (ast.Assign, ast.AnnAssign)):
                    targets = inner.targets if isinstance(inner, ast.Assign) else [inner.target]
                    value = inner.value
                    for target in targets:
                        if (
                            isinstance(target, ast.Name)
                            and _is_class_name(target.id)
                            and isinstance(value, ast.Constant)
                            and value.value is None
                        ):
                            raise AssertionError(f"{module}: {target.id} = None (a placeholder)")
        assert "# bound by" not in _source(module), f"{module}: a placeholder bound elsewhere"


def test_no_module_assigns_attributes_of_another_tdfunc_module():
    """``othermodule.Name = value`` at import time is a placeholder patched from outside."""
    for module, tree in TREES.items():
        package = module if _source_is_package(module) else module.rpartition(".")[0]
        modules_bound: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (
                node.level or (node.module or "").startswith("tdfunc")
            ):
                base = package.split(".")[: len(package.split(".")) - max(node.level - 1, 0)]
                stem = (
                    ".".join(base + [node.module])
                    if node.level and node.module
                    else (".".join(base) if node.level else node.module)
                )
                for alias in node.names:
                    if f"{stem}.{alias.name}" in GRAPH:
                        modules_bound.add(alias.asname or alias.name)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("tdfunc"):
                        modules_bound.add((alias.asname or alias.name).split(".")[0])
        for node in ast.walk(tree):
            targets = node.targets if isinstance(node, ast.Assign) else []
            for target in targets:
                if (
                    isinstance(target, ast.Attribute)
                    and isinstance(target.value, ast.Name)
                    and target.value.id in modules_bound
                ):
                    raise AssertionError(
                        f"{module}: assigns {target.value.id}.{target.attr} (another module's name)"
                    )


def _source_is_package(module: str) -> bool:
    return (ROOT.parent / module.replace(".", "/")).is_dir()
