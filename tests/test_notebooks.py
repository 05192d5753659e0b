"""The notebooks in notebooks/ run top to bottom on a real Jupyter kernel of this very
interpreter (``docs/_ext/notebook_run.py``: in a scratch folder, the kernel's
interpreter checked), and are committed without outputs.

The run is shared with the docs site's build (``test_docs_site.py``), which shows the
notebooks with their outputs: through the session's ``notebook_cache`` folder, whichever
comes first executes a notebook and the other reads it.
"""

from __future__ import annotations

import pathlib
import sys

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "docs" / "_ext"))
import notebook_run  # noqa: E402  (docs/_ext, after the importorskips)

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert NOTEBOOKS, "notebooks/ holds no .ipynb files"


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


# last to first: the docs site's build runs them first to last, so the two, on two
# workers at once, each execute about half and read the other half
@pytest.mark.parametrize("path", NOTEBOOKS[::-1], ids=lambda p: p.name)
def test_notebook_runs(path: pathlib.Path, notebook_cache: pathlib.Path):
    try:
        executed = notebook_run.execute(path, notebook_cache)
    except nbclient.exceptions.CellExecutionError as e:
        pytest.fail(f"{path.name} failed:\n{e}", pytrace=False)
    except notebook_run.WrongInterpreter as e:
        pytest.fail(str(e), pytrace=False)
    ran = [cell for cell in executed["cells"] if cell["cell_type"] == "code"]
    assert ran and all(cell["execution_count"] is not None for cell in ran)
    assert len(executed["cells"]) == len(nbformat.read(path, as_version=4).cells)
