"""The controller's layers, written down once: every import of a controller module (at run time, inside a
function, or for type checking only) goes to a module of a lower layer. A circle, an import against the order,
or a module not placed here fails (DESIGN.md, "Layout": no import circles; errors and outcome enums in a leaf).
And the size bounds: no module over 600 lines, no function over 60, but for the few named in ``OVER_BOUNDS``.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import ROOT

#: Bottom to top. A module imports only from layers below its own.
LAYERS: list[set[str]] = [
    {  # leaves: vocabularies and pure logic that need nothing of the project's
        "queue_processor",
        "queue_processor.outcomes",
        "queue_processor.events",
        "queue_processor.permissions",
        "queue_processor.drain",
        "queue_processor.observe",
        "queue_processor.observe.logs",
    },
    {
        "queue_processor.observe.templates",
        "queue_processor.observe.metrics",
        "queue_processor.parse",
        "queue_processor.rest",
    },
    {
        "queue_processor.config",
    },
    {
        "queue_processor.kube",
        "queue_processor.aws",
        "queue_processor.rules",
    },
    {"queue_processor.watch"},
    {
        "queue_processor.drain.surge",
        "queue_processor.observe.events",
        "queue_processor.leases",
    },
    {"queue_processor.drain.plan"},
    {"queue_processor.drain.node_writes"},
    {"queue_processor.drain.evictions"},
    {
        "queue_processor.drain.drainer",
        "queue_processor.drain.explain",
        "queue_processor.observe.webhook",
        "queue_processor.lifecycle",
    },
    {"queue_processor.returns"},
    {"queue_processor.steps", "queue_processor.settlement"},
    {"queue_processor.launch", "queue_processor.turns"},
    {"queue_processor.handler"},
    {"queue_processor.consumer"},
    {"queue_processor.app"},
    {"queue_processor.cli"},
]


def layer_of(module: str) -> int:
    """The index in :data:`LAYERS` of ``module`` (a dotted name); raises ``KeyError`` for one not placed."""
    return next(index for index, layer in enumerate(LAYERS) if module in layer)


#: Not the controller: the test bench (the distribution in sandbox/), which the controller never imports.
BENCH = "queue_processor_sandbox"


def controller_modules() -> dict[str, Path]:
    package = ROOT / "queue_processor"
    return {
        ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): path
        for path in package.rglob("*.py")
    }


def imports_of(path: Path) -> set[str]:
    """Every project module ``path`` imports, wherever the import statement is."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.ImportFrom)
            and node.module
            and node.module.split(".")[0] == "queue_processor"
        ):
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.split(".")[0] == "queue_processor")
    return found


def test_every_controller_module_has_a_layer() -> None:
    placed = set().union(*LAYERS)
    assert sorted(set(controller_modules()) - placed) == []
    assert sorted(placed - set(controller_modules())) == []  # no stale entry
    assert sum(len(layer) for layer in LAYERS) == len(placed)  # none placed twice


def test_imports_point_down_the_layers() -> None:
    layer = {module: index for index, modules in enumerate(LAYERS) for module in modules}
    against = [
        f"{module} (layer {layer[module]}) imports {target} (layer {layer[target]})"
        for module, path in controller_modules().items()
        for target in sorted(imports_of(path))
        if layer.get(target, 0) >= layer[module]
    ]
    assert against == []


def test_the_controller_imports_nothing_of_the_sandbox() -> None:
    """The sandbox is a distribution of its own: the controller reaches its command only through an entry
    point (``queue_processor.commands``), never by importing it."""
    reaches = [
        f"{module}: {node.module if isinstance(node, ast.ImportFrom) else ast.unparse(node)}"
        for module, path in controller_modules().items()
        for node in ast.walk(ast.parse(path.read_text()))
        if (isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == BENCH)
        or (isinstance(node, ast.Import) and any(a.name.split(".")[0] == BENCH for a in node.names))
    ]
    assert reaches == []
    assert not list((ROOT / "queue_processor" / "sandbox").rglob("*.py"))  # (bytecode a pull leaves)


#: Names with a leading underscore that are public API of the library that defines them: ``os._exit``, a
#: NamedTuple's ``_replace``, and moto's SQS queue ``_messages`` (moto has no public reader for them).
PUBLIC_UNDERSCORED = {"_exit", "_replace", "_messages"}


def test_no_module_reaches_into_another_modules_privates() -> None:
    """A name with a leading underscore is read only where it is defined: by ``self``/``cls``, or in the
    module that defines it (issue 28: the sandbox's moto patches called ``AwsSandbox._raise_injected`` and
    ``_scale_in_to``; they now talk to a protocol, ``moto_server.ServedActions``)."""
    reaches = []
    paths = [*(ROOT / "queue_processor").rglob("*.py"), *(ROOT / "sandbox" / BENCH).rglob("*.py")]
    for path in sorted(paths):
        tree = ast.parse(path.read_text())
        defined = {
            name
            for node in ast.walk(tree)
            for name in (
                [node.name]
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
                else [node.attr]
                if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                else [node.id]
                if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store)
                else []
            )
        }
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
                and node.attr not in defined | PUBLIC_UNDERSCORED
            ):
                reaches.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    assert reaches == []


#: Most lines of a controller module, and most lines of one of its functions (issue 49's bounds).
MODULE_MOST_LINES = 600
FUNCTION_MOST_LINES = 60

#: The modules and functions over those bounds today, each at most as long as it is now: the bounds hold for
#: every other, and these may only shrink.
OVER_BOUNDS: dict[str, int] = {}


def sizes() -> dict[str, int]:
    """Lines of every controller module (``module``) and of every function (``module:Class.function``)."""
    found: dict[str, int] = {}
    for module, path in controller_modules().items():
        tree = ast.parse(path.read_text())
        found[module] = len(path.read_text().splitlines())
        scopes: list[tuple[str, ast.AST]] = [("", tree)]
        while scopes:
            prefix, scope = scopes.pop()
            for node in ast.iter_child_nodes(scope):
                if isinstance(node, ast.ClassDef):
                    scopes.append((f"{prefix}{node.name}.", node))
                elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    assert node.end_lineno is not None
                    found[f"{module}:{prefix}{node.name}"] = node.end_lineno - node.lineno + 1
    return found


def test_modules_and_functions_keep_within_their_bounds() -> None:
    over = {
        name: lines
        for name, lines in sizes().items()
        if lines > OVER_BOUNDS.get(name, FUNCTION_MOST_LINES if ":" in name else MODULE_MOST_LINES)
    }
    assert over == {}
    stale = {name for name, lines in sizes().items() if name in OVER_BOUNDS and lines < OVER_BOUNDS[name]}
    assert stale == set(), "shrunk: lower (or drop) its entry in OVER_BOUNDS"
