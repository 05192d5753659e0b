"""Tests and doctests run with strict dtype promotion, so nothing leans on silent promotion.

Each test, doctests included, leaves the op registry as it found it: an op registered by
one test is not seen by another (error messages list the registered ops, and
docs/errors.md shows one), whatever the order and the worker that runs them.

Each test also writes its scratch files into a folder of its own, removed when it ends.
Tests, doctests, docs examples and notebooks call ``tempfile.mkdtemp()`` the way users
do, and some write large files there (a GPT-2 checkpoint is 475 MB); left in the
machine's temporary folder, every run of the suite would keep them. The folder is
Python's ``tempfile`` default and ``TMPDIR`` (which subprocesses and notebook kernels
read). Fixtures of a wider scope are set up before it and keep the machine's folder.

The suite compiles with ``--xla_backend_optimization_level=0`` (added to ``XLA_FLAGS``
here, so the notebooks, the docs site's build and every subprocess inherit it). The
flag lowers only how hard LLVM optimizes XLA's CPU kernels: the HLO passes, fusions,
buffer assignment and memory analysis are the default's (the optimized HLO is the
same text), while results may differ from the default's in the last bit (LLVM at -O3
reorders some float sums). The suite is bound by XLA's compile time, which this halves;
the benchmarks and users keep XLA's default.

``make test`` runs the suite in two parts. The first, with ``MLAXGRAPH_TEST_EMITTER=
elemental``, also compiles with XLA CPU's elemental emitter
(``--xla_cpu_use_fusion_emitters=false``), which compiles in about 0.6x the time of the
fusion emitters, XLA's default; it leaves out the tests marked ``xla_default``, whose
subject is what XLA's default emitter gives: the optimized HLO a docs page prints, the
copies the train step's options drop bit for bit, ONNX's conformance cases (the
elemental emitter rounds a tiny negative float to float8 e4m3fnuz's NaN, not 0). The
second part runs those under XLA's defaults. Without the variable (``pytest`` run by
hand) every test runs under XLA's default emitter."""

import os
import shutil
import tempfile

import jax
import pytest

_FLAG = "--xla_backend_optimization_level"
_EMITTER = "--xla_cpu_use_fusion_emitters"
ELEMENTAL = os.environ.get("MLAXGRAPH_TEST_EMITTER") == "elemental"
os.environ["XLA_FLAGS"] = " ".join(
    [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith((_FLAG, _EMITTER))]
    + [f"{_FLAG}=0"] + ([f"{_EMITTER}=false"] if ELEMENTAL else []))

jax.config.update("jax_numpy_dtype_promotion", "strict")


def pytest_configure(config):
    config.addinivalue_line("markers", "xla_default: the test's subject is what XLA's default "
                                       "CPU emitter gives (make test runs it under XLA's defaults)")


@pytest.hookimpl(trylast=True)  # after -m has deselected
def pytest_collection_modifyitems(config, items):
    """Under the elemental emitter, a test marked ``xla_default`` would check another
    emitter than its subject: its selection is refused, not skipped."""
    if ELEMENTAL:
        marked = [item.nodeid for item in items if item.get_closest_marker("xla_default")]
        if marked:
            raise pytest.UsageError(
                f"MLAXGRAPH_TEST_EMITTER=elemental compiles with XLA's elemental emitter, and "
                f"{len(marked)} selected tests are marked xla_default (e.g. {marked[0]}): add "
                f"-m 'not xla_default' and run those without the variable, as make test does")


@pytest.fixture(autouse=True)
def _op_registry_restored():
    from mlaxgraph.core import registry

    saved = dict(registry._REGISTRY)
    yield
    registry._REGISTRY.clear()
    registry._REGISTRY.update(saved)


@pytest.fixture(autouse=True)
def _scratch_folder(monkeypatch, tmp_path_factory):
    tmp_path_factory.getbasetemp()  # pytest's own folder (tmp_path), fixed before the change
    folder = tempfile.mkdtemp(prefix="mlaxgraph-test-")
    monkeypatch.setattr(tempfile, "tempdir", folder)
    monkeypatch.setenv("TMPDIR", folder)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def notebook_cache(tmp_path_factory):
    """A folder of this test session, shared by its workers, where ``docs/_ext/notebook_run``
    keeps the notebooks it executed: the notebook tests and the docs site's build then run
    each notebook once. A worker's pytest folder is inside the session's."""
    base = tmp_path_factory.getbasetemp()
    return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "executed-notebooks"
