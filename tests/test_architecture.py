"""The package's shape: imports go one way (module level and function bodies alike, the
named facades aside), each subpackage imports alone, modules stay small, and nested
blocks are resolved in one place."""

import ast
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "mlaxgraph"

# The layers, bottom first. A module may import modules of its own layer or of layers
# below it, at module level and inside its functions alike. The package's ``__init__``
# (the public API) and ``__main__`` sit above everything.
LAYERS = [
    ("core",),
    ("ir",),
    ("ops",),
    ("compiler",),
    ("adapters", "decode"),
    ("distributed",),
    ("io",),
    ("onnx", "aten"),
    ("analysis",),
    ("render",),
    ("examples", "models"),
    ("train",),
    ("cli",),
]
LEVEL = {name: level for level, names in enumerate(LAYERS) for name in names}

# The facades: user-facing entry points on an object of a lower layer whose code lives
# above it (``graph.to_html()`` is the explorer's, in render), importing it inside the
# function. Only these functions may reach up, and nothing below the layer a facade
# reaches calls back through it (test_nothing_below_calls_back_through_a_facade).
FACADES = (
    # Graph (ir): its files (io) and its drawings, explorer and summary (render)
    "mlaxgraph.ir.graph:Graph.to_json",
    "mlaxgraph.ir.graph:Graph.to_onnx",
    "mlaxgraph.ir.graph:Graph.from_json",
    "mlaxgraph.ir.graph:Graph.to_dot",
    "mlaxgraph.ir.graph:Graph.render",
    "mlaxgraph.ir.graph:Graph.to_networkx",
    "mlaxgraph.ir.graph:Graph.from_networkx",
    "mlaxgraph.ir.graph:Graph._repr_svg_",
    "mlaxgraph.ir.graph:Graph.to_html",
    "mlaxgraph.ir.graph:Graph.to_model_explorer",
    "mlaxgraph.ir.graph:Graph._repr_html_",
    "mlaxgraph.ir.graph:Graph.summary",
    # CompiledModel (compiler): its cost table and HLO by layer (analysis), its export
    # folder (io), its summary, drawings and explorer (render)
    "mlaxgraph.compiler.compile:CompiledModel.cost_table",
    "mlaxgraph.compiler.compile:CompiledModel.hlo_by_layer",
    "mlaxgraph.compiler.compile:CompiledModel.save_hlo",
    "mlaxgraph.compiler.compile:CompiledModel.to_onnx",
    "mlaxgraph.compiler.compile:CompiledModel.summary",
    "mlaxgraph.compiler.compile:CompiledModel.to_dot",  # through Graph.to_dot
    "mlaxgraph.compiler.compile:CompiledModel.render",  # through Graph.render
    "mlaxgraph.compiler.compile:CompiledModel.to_html",
    "mlaxgraph.compiler.compile:CompiledModel._repr_html_",
    # mg.compile(graph, mesh=...) plans the sharding (distributed)
    "mlaxgraph.compiler.compile:compile",
)


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _package(path: pathlib.Path) -> str:
    """The package relative imports in the module at ``path`` start from."""
    module = _module_name(path)
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def _is_module(name: str) -> bool:
    path = PACKAGE.parent / name.replace(".", "/")
    return path.is_dir() or path.with_suffix(".py").is_file()


def _targets(stmt, package: str):
    """(bound name, imported mlaxgraph module) for each name an import statement binds
    to an mlaxgraph module or to something of one."""
    if isinstance(stmt, ast.ImportFrom):
        if stmt.level:
            base = package.split(".")
            base = base[:len(base) - (stmt.level - 1)]
            target = ".".join(base + ([stmt.module] if stmt.module else []))
        else:
            target = stmt.module or ""
        if target.startswith("mlaxgraph"):
            for alias in stmt.names:  # `from . import ops` imports a subpackage
                sub = f"{target}.{alias.name}"
                yield alias.asname or alias.name, sub if _is_module(sub) else target
    else:
        for alias in stmt.names:
            if alias.name.startswith("mlaxgraph"):
                yield alias.asname or alias.name.partition(".")[0], alias.name


def _imports(path: pathlib.Path):
    """(line, function, imported module) of every import of an mlaxgraph module, where
    ``function`` is the qualified name of the function whose body holds it
    (``Graph.to_json``), or None at module level (a class body included). TYPE_CHECKING
    blocks are left out: they are never executed."""
    package = _package(path)

    def visit(node, names: list[str], in_function: bool):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                for _, target in _targets(child, package):
                    yield child.lineno, ".".join(names) if in_function else None, target
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield from visit(child, [*names, child.name], True)
            elif isinstance(child, ast.ClassDef):
                yield from visit(child, [*names, child.name], in_function)
            else:
                yield from visit(child, names, in_function)

    yield from visit(ast.parse(path.read_text()), [], False)


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def _modules():
    return sorted(p for p in PACKAGE.rglob("*.py") if p.name != "__main__.py")


def _upward_imports():
    """(where, function key or None, own layer, target) of each import of a higher layer
    or of the top-level package; ``function key`` is ``module:qualified name``."""
    for path in _modules():
        module = _module_name(path)
        own = _layer(module)
        if own is None:
            continue  # mlaxgraph/__init__.py: the public API imports everything
        for line, function, target in _imports(path):
            other = _layer(target)
            if other is None or LEVEL[other] > LEVEL[own]:
                key = None if function is None else f"{module}:{function}"
                yield f"{path.relative_to(ROOT)}:{line}", key, own, target


def test_every_subpackage_has_a_layer():
    packages = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert packages == set(LEVEL), "add the new subpackage to LAYERS"
    modules = {p.stem for p in PACKAGE.glob("*.py")}
    assert modules == {"__init__", "__main__"}, "top-level modules belong in a subpackage"


def test_imports_go_one_way():
    wrong = []
    for where, function, own, target in _upward_imports():
        if function in FACADES:
            continue
        what = "the top-level package" if _layer(target) is None else \
            f"{target} ({_layer(target)} is above {own})"
        inside = "" if function is None else f" inside {function.partition(':')[2]}"
        wrong.append(f"{where}: imports {what}{inside}")
    assert not wrong, ("import from below, or make the function a facade (FACADES) if it is a "
                       "user-facing entry point whose code lives above:\n" + "\n".join(wrong))


def _facade_targets() -> dict[str, int]:
    """Each facade method's name (``to_html``) -> the highest layer its imports reach."""
    reach: dict[str, int] = {}
    for _, function, _, target in _upward_imports():
        if function in FACADES and "." in function.partition(":")[2] and _layer(target) is not None:
            name = function.rpartition(".")[2]
            reach[name] = max(reach.get(name, -1), LEVEL[_layer(target)])
    return reach


def _calls_back(path: pathlib.Path, reach: dict[str, int]):
    """(line, function, facade name) of each ``obj.name(...)`` call in the module whose
    ``name`` is a facade's that reaches above the module's layer; calls on a module
    (``jax.export.export``) are no facade calls."""
    tree = ast.parse(path.read_text())
    own = LEVEL[_layer(_module_name(path))]
    modules = {(a.asname or a.name).partition(".")[0] for node in ast.walk(tree)
               if isinstance(node, ast.Import) for a in node.names}
    modules |= {name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                for name, target in _targets(node, _package(path))
                if target.rpartition(".")[2] == name and _is_module(target)}

    def visit(node, names: list[str]):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute):
                root = child.func.value
                while isinstance(root, ast.Attribute):
                    root = root.value
                name = child.func.attr
                if reach.get(name, -1) > own and not (isinstance(root, ast.Name) and root.id in modules):
                    yield child.lineno, ".".join(names), name
            is_def = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            yield from visit(child, [*names, child.name] if is_def else names)

    yield from visit(tree, [])


def test_nothing_below_calls_back_through_a_facade():
    # io writing a model's export through ``model.export()`` went up to analysis and back
    # down: code below a facade's layer calls what the facade calls, not the facade.
    reach = _facade_targets()
    wrong = []
    for path in _modules():
        module = _module_name(path)
        if _layer(module) is None:
            continue
        for line, function, name in _calls_back(path, reach):
            if f"{module}:{function}" not in FACADES:
                wrong.append(f"{path.relative_to(ROOT)}:{line}: {function or 'module level'} "
                             f"calls .{name}(), a facade of {LAYERS[reach[name]][0]}")
    assert not wrong, "\n".join(wrong)


def test_every_facade_reaches_up():
    # An entry left in FACADES after its function stopped reaching up (or was renamed)
    # would let the next upward import in it pass unseen.
    importing = {function for _, function, _, _ in _upward_imports()}
    reach = _facade_targets()
    calling = set()
    for path in _modules():
        module = _module_name(path)
        if _layer(module) is not None:
            calling |= {f"{module}:{function}" for _, function, _ in _calls_back(path, reach)}
    stale = [f for f in FACADES if f not in importing and f not in calling]
    assert not stale, "no longer reaching up: remove from FACADES: " + ", ".join(stale)


@pytest.mark.parametrize("name", [names[0] for names in LAYERS])
def test_each_subpackage_imports_alone(name):
    # A fresh interpreter, and the package's own __init__ (which imports everything)
    # replaced by an empty package: an import cycle that only works in the package's
    # import order fails here.
    code = (f"import sys, types; package = types.ModuleType('mlaxgraph'); "
            f"package.__path__ = [{str(PACKAGE)!r}]; sys.modules['mlaxgraph'] = package; "
            f"import mlaxgraph.{name}")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_modules_are_small():
    large = [f"{p.relative_to(ROOT)}: {n} lines" for p in _modules()
             if (n := len(p.read_text().splitlines())) > 420]
    assert not large, "\n".join(large)


def test_blocks_are_resolved_in_the_ir_and_the_flattening_step():
    allowed = {"mlaxgraph/ir", "mlaxgraph/compiler/flatten.py"}
    found = []
    for path in _modules():
        rel = str(path.relative_to(ROOT))
        if any(rel.startswith(a) for a in allowed):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance"
                    and "Block" in ast.unparse(node.args[1])):
                found.append(f"{rel}:{node.lineno}")
    assert not found, "walk the Program, or use Layer.subgraph(): " + ", ".join(found)
