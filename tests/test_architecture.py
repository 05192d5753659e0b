"""The package's shape: imports go one way, each subpackage imports alone, modules stay
small, and nested blocks are resolved in one place."""

import ast
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "mlaxgraph"

# The layers, bottom first. A module may import, at module level, modules of its own
# layer or of layers below it; imports inside functions (the thin entry points such as
# ``Graph.to_json``) are not module-level. The package's ``__init__`` (the public API)
# and ``__main__`` sit above everything.
LAYERS = [
    ("core",),
    ("ir",),
    ("ops",),
    ("compiler",),
    ("distributed",),
    ("io",),
    ("analysis",),
    ("render",),
    ("examples", "models"),
    ("train",),
    ("cli",),
]
LEVEL = {name: level for level, names in enumerate(LAYERS) for name in names}


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _module_level_imports(path: pathlib.Path):
    """(line, imported module) of every import at module level (TYPE_CHECKING blocks
    left out: they are never executed)."""
    tree = ast.parse(path.read_text())
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]

    def visit(body):
        for stmt in body:
            if isinstance(stmt, ast.If) and "TYPE_CHECKING" in ast.unparse(stmt.test):
                continue
            if isinstance(stmt, (ast.If, ast.Try)):
                yield from visit(stmt.body)
                yield from visit(getattr(stmt, "orelse", []))
                for handler in getattr(stmt, "handlers", []):
                    yield from visit(handler.body)
            elif isinstance(stmt, ast.ImportFrom):
                if stmt.level:
                    base = package.split(".")
                    base = base[:len(base) - (stmt.level - 1)]
                    target = ".".join(base + ([stmt.module] if stmt.module else []))
                else:
                    target = stmt.module or ""
                if target.startswith("mlaxgraph"):
                    names = [a.name for a in stmt.names]
                    for name in names:  # `from . import ops` imports a subpackage
                        sub = f"{target}.{name}"
                        if (PACKAGE.parent / sub.replace(".", "/")).exists() or \
                                (PACKAGE.parent / (sub.replace(".", "/") + ".py")).exists():
                            yield stmt.lineno, sub
                        else:
                            yield stmt.lineno, target
            elif isinstance(stmt, ast.Import):
                for alias in stmt.names:
                    if alias.name.startswith("mlaxgraph"):
                        yield stmt.lineno, alias.name

    yield from visit(tree.body)


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def _modules():
    return sorted(p for p in PACKAGE.rglob("*.py") if p.name != "__main__.py")


def test_every_subpackage_has_a_layer():
    packages = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert packages == set(LEVEL), "add the new subpackage to LAYERS"
    modules = {p.stem for p in PACKAGE.glob("*.py")}
    assert modules == {"__init__", "__main__"}, "top-level modules belong in a subpackage"


def test_imports_go_one_way():
    wrong = []
    for path in _modules():
        module = _module_name(path)
        own = _layer(module)
        if own is None:
            continue  # mlaxgraph/__init__.py: the public API imports everything
        for line, target in _module_level_imports(path):
            other = _layer(target)
            if other is None:
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports the top-level package")
            elif LEVEL[other] > LEVEL[own]:
                wrong.append(f"{path.relative_to(ROOT)}:{line}: {own} imports {target} ({other} "
                             f"is above it)")
    assert not wrong, "\n".join(wrong)


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
