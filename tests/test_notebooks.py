"""The notebooks in notebooks/ run top to bottom on a real Jupyter kernel, and are
committed without outputs.

The kernel must be this interpreter (the venv's), whatever kernel specs the machine
has: the `python3` spec that ipykernel installs starts plain `python` from PATH. So the
test writes its own `python3` spec, whose argv is `sys.executable`, into a temporary
kernel directory and gives nbclient a KernelManager that looks only there.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

from jupyter_client import KernelManager  # noqa: E402  (after the importorskips)
from jupyter_client.kernelspec import KernelSpecManager  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
CELL_TIMEOUT = 300  # seconds, per cell


def test_there_are_notebooks():
    assert NOTEBOOKS, "notebooks/ holds no .ipynb files"


@pytest.fixture(scope="module")
def kernel_dir(tmp_path_factory) -> pathlib.Path:
    """A kernel directory with a `python3` spec that runs this very interpreter."""
    kernels = tmp_path_factory.mktemp("kernels")
    spec = kernels / "python3"
    spec.mkdir()
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": f"Python 3 ({sys.executable})",
        "language": "python",
    }))
    return kernels


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_has_no_outputs(path: pathlib.Path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        assert cell.get("outputs") == [], f"{path.name}: cell {index} has outputs; strip them"
        assert cell.get("execution_count") is None, (
            f"{path.name}: cell {index} has an execution count; strip it")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs(path: pathlib.Path, kernel_dir: pathlib.Path):
    nb = nbformat.read(path, as_version=4)  # executed in memory; the file is not rewritten
    # One more cell, at the end, to check which interpreter the kernel is.
    nb.cells.append(nbformat.v4.new_code_cell("import sys; print(sys.executable, end='')"))
    specs = KernelSpecManager(kernel_dirs=[str(kernel_dir)], ensure_native_kernel=False)
    km = KernelManager(kernel_name="python3", kernel_spec_manager=specs)
    assert km.kernel_spec.argv[0] == sys.executable
    # The kernel imports mlaxgraph from this checkout, installed or not.
    paths = [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
    client = nbclient.NotebookClient(
        nb, km=km, kernel_name="python3", timeout=CELL_TIMEOUT, allow_errors=False,
        resources={"metadata": {"path": str(path.parent)}})
    try:
        client.execute(env=env)
    except nbclient.exceptions.CellExecutionError as e:
        pytest.fail(f"{path.name} failed:\n{e}", pytrace=False)
    ran = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert all(cell.execution_count is not None for cell in ran)
    (output,) = nb.cells[-1].outputs
    assert output.text == sys.executable, "the kernel ran another interpreter"
