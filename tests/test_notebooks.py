"""The notebooks in notebooks/ run top to bottom on a real Jupyter kernel of this very
interpreter (``docs/_ext/notebook_run.py``: in a scratch folder, the kernel's
interpreter checked), and are committed without outputs.

The run is shared with the docs site's build (``test_docs_site.py``), which shows the
notebooks with their outputs: through the session's ``notebook_cache`` folder, whichever
comes first executes a notebook and the other reads it.
"""

from __future__ import annotations

import fcntl
import json
import pathlib
import sys
import threading

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


def test_execute_all_runs_the_free_notebooks_first_and_waits_for_the_others(tmp_path, monkeypatch):
    """The docs site's build skips a notebook another process is running (holds its lock),
    runs the rest, then waits for it: reading its result, not running it twice."""
    ran = []

    def fake_run(path):
        ran.append(path.name)
        return {"cells": [], "ran_by": "us", "name": path.name}

    monkeypatch.setattr(notebook_run, "_run", fake_run)
    paths = []
    for name in ("a.ipynb", "b.ipynb", "c.ipynb"):
        (tmp_path / name).write_text(json.dumps({"name": name}))
        paths.append(tmp_path / name)
    cache = tmp_path / "cache"
    cache.mkdir()
    key = f"b-{notebook_run.hashlib.sha256(paths[1].read_bytes()).hexdigest()[:16]}"
    other = open(cache / f"{key}.lock", "w")  # another process, running b
    fcntl.flock(other, fcntl.LOCK_EX)
    # with b's lock held, a blocking wait would hang: execute_all must skip it, so run
    # a and c first, in a thread, and finish b "in the other process" meanwhile
    result = {}
    thread = threading.Thread(target=lambda: result.update(out=notebook_run.execute_all(paths, cache)))
    thread.start()
    for _ in range(200):
        if ran == ["a.ipynb", "c.ipynb"]:
            break
        thread.join(0.05)
    assert ran == ["a.ipynb", "c.ipynb"]  # b skipped while locked, not waited for first
    (cache / f"{key}.ipynb").write_text(json.dumps({"cells": [], "ran_by": "other"}))
    fcntl.flock(other, fcntl.LOCK_UN)
    other.close()
    thread.join(10)
    assert [nb["ran_by"] for nb in result["out"]] == ["us", "other", "us"]
    assert ran == ["a.ipynb", "c.ipynb"]
