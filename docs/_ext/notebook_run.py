"""Runs a notebook of notebooks/ top to bottom on a Jupyter kernel of this very
interpreter, in a scratch folder, and returns it executed (as a dict, nbformat 4).

The docs site's notebook pages (``notebook_pages.py``) and the notebook tests
(``tests/test_notebooks.py``) both run the notebooks through ``execute`` (the site
all of them, ``execute_all``). Given a
``cache`` folder (the site build reads it from ``MLAXGRAPH_NOTEBOOK_CACHE``), a notebook
is executed once for every process that shares the folder: a lock per notebook, the
executed notebook kept under its name and the hash of its file. A test session gives
one folder to both, so it runs each notebook once, not twice.

The kernel's interpreter is ``sys.executable``, whatever kernel specs the machine has:
the ``python3`` spec that ipykernel installs starts plain ``python`` from PATH. A spec
written into the scratch folder names this interpreter, and a last cell checks it.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import pathlib
import shutil
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
CACHE_ENV = "MLAXGRAPH_NOTEBOOK_CACHE"
CELL_TIMEOUT = 300  # seconds, per cell
_CHECK = "import sys; print(sys.executable, end='')"


class WrongInterpreter(RuntimeError):
    """The kernel ran another interpreter than this one."""


def _kernel_manager(folder: pathlib.Path):
    from jupyter_client import KernelManager
    from jupyter_client.kernelspec import KernelSpecManager

    spec = folder / "kernels" / "python3"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": f"Python 3 ({sys.executable})",
        "language": "python",
    }))
    specs = KernelSpecManager(kernel_dirs=[str(spec.parent)], ensure_native_kernel=False)
    return KernelManager(kernel_name="python3", kernel_spec_manager=specs)


def _run(path: pathlib.Path) -> dict:
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.read(path, as_version=4)
    notebook.cells.append(nbformat.v4.new_code_cell(_CHECK))
    # the kernel imports this checkout's package, installed or not
    paths = [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
    with tempfile.TemporaryDirectory() as scratch:
        shutil.copy(path, scratch)  # nothing is written into notebooks/
        km = _kernel_manager(pathlib.Path(scratch))
        # cleanup_kc: the kernel is shut down when the notebook ends (nbclient keeps a
        # kernel it did not start alive until the process exits, holding its memory)
        NotebookClient(notebook, km=km, kernel_name="python3", timeout=CELL_TIMEOUT,
                       allow_errors=False, resources={"metadata": {"path": scratch}}
                       ).execute(env=env, cleanup_kc=True)
    (output,) = notebook.cells.pop().outputs
    if output.text != sys.executable:
        raise WrongInterpreter(f"{path.name}: the kernel ran {output.text}, not {sys.executable}")
    return json.loads(nbformat.writes(notebook))


def execute(path: pathlib.Path, cache: str | os.PathLike | None = None) -> dict:
    """``path`` executed; with ``cache``, at most once for all who share that folder.
    A failing cell raises nbclient's ``CellExecutionError`` (nothing is kept)."""
    if cache is None:
        return _run(path)
    executed = _shared(path, pathlib.Path(cache), wait=True)
    assert executed is not None
    return executed


def execute_all(paths: list[pathlib.Path], cache: str | os.PathLike | None = None) -> list[dict]:
    """Each of ``paths`` executed, in their order. With ``cache``, the notebooks no other
    process is running are run (or read) first, then those another process is running
    are waited for: two processes sharing the folder (the notebook tests run them last
    to first) split the notebooks between them, and neither waits while one is left."""
    if cache is None:
        return [_run(path) for path in paths]
    folder = pathlib.Path(cache)
    done = {path: _shared(path, folder, wait=False) for path in paths}
    return [done[path] or execute(path, folder) for path in paths]


def _shared(path: pathlib.Path, folder: pathlib.Path, wait: bool) -> dict | None:
    """``path`` executed through the cache ``folder``; None without ``wait`` when
    another process holds its lock (is running it)."""
    folder.mkdir(parents=True, exist_ok=True)
    key = f"{path.stem}-{hashlib.sha256(path.read_bytes()).hexdigest()[:16]}"
    done = folder / f"{key}.ipynb"
    with open(folder / f"{key}.lock", "w") as lock:
        try:  # released when closed, or when the process dies
            fcntl.flock(lock, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None
        if done.exists():
            return json.loads(done.read_text())
        notebook = _run(path)
        part = done.with_suffix(".part")
        part.write_text(json.dumps(notebook))
        os.replace(part, done)
        return notebook
