"""ONNX's conformance suite (``onnx.backend.test``) through ``MlaxGraphBackend``, run
by ``onnx.backend.test.runner.Runner``: the fixed sample ``make test`` runs, and the
whole suite ``make soak`` runs, writing the per-operator table of docs/onnx.md.

    python tests/_onnx_suite.py [--write]   # all node cases; --write updates the files
"""

from __future__ import annotations

import collections
import pathlib
import random
import sys
import time
import unittest
import warnings

ROOT = pathlib.Path(__file__).resolve().parent.parent
FAILURES = ROOT / "tests" / "data" / "onnx_failures.txt"
DOCS = ROOT / "docs" / "onnx.md"
SAMPLE_SIZE = 320
_BEGIN, _END = "<!-- conformance table: begin -->", "<!-- conformance table: end -->"


def _runner():
    from onnx.backend.test.runner import Runner

    from mlaxgraph.onnx.backend import MlaxGraphBackend

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the case generators' own numpy warnings
        return Runner(MlaxGraphBackend, __name__)


def node_cases() -> dict[str, object]:
    """Node case name -> its model (generated in memory by the installed onnx)."""
    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {c.name: c.model for c in load_model_tests(kind="node")}


def sample(names) -> list[str]:
    """The fixed sample: SAMPLE_SIZE node cases drawn with a fixed seed."""
    return sorted(random.Random(26).sample(sorted(names), SAMPLE_SIZE))


def known_failures() -> dict[str, str]:
    if not FAILURES.exists():
        return {}
    out = {}
    for line in FAILURES.read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, reason = line.partition("\t")
            out[name] = reason
    return out


class Cases:
    """The runner's node test case class: ``run(name) -> None or the failure text``."""

    def __init__(self):
        self.runner = _runner()
        self.cls = self.runner.test_cases["OnnxBackendNodeModelTest"]

    def run(self, name: str) -> str | None:
        result = unittest.TestResult()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.cls(f"{name}_cpu").run(result)
        problems = result.errors + result.failures
        if problems:
            return problems[0][1]
        if result.skipped:
            return "skipped: " + result.skipped[0][1]
        return None


#: why a case fails where its error alone does not say (the docs table's words)
EXPLAINED = {
    "test_training_dropout": "random masks: the reference's own draws",
    "test_dft_inverse": "float32 rounding (2e-6 of 54) where the reference is float64 0",
    "test_loop16_seq_none": "the runner cannot compare a sequence holding a 0-d tensor",
}


def reason(trace: str) -> str:
    """One line naming the error class and its first line."""
    if "Unable to compare expected type" in trace and "len() of unsized object" in trace:
        # onnx's assert_similar_outputs calls len() on each element of a sequence output,
        # which fails on a 0-d element whatever the backend returned
        return "runner: onnx's Runner cannot compare a sequence output holding a 0-d tensor"
    lines = [line for line in trace.strip().splitlines() if line and not line.startswith(" ")]
    last = lines[-1] if lines else trace.strip()[-200:]
    for line in lines:
        if "Error:" in line and "Traceback" not in line:
            last = line
            break
    return last[:240]


def family(name: str, model) -> str:
    ops = sorted({n.op_type for n in model.graph.node})
    base = name[len("test_"):]
    for op in ops:
        if base.lower().startswith(op.lower()):
            return op
    return ops[0] if len(ops) == 1 else (name.split("_")[1] if "_" in name else name)


def main(write: bool) -> int:
    models = node_cases()
    cases = Cases()
    results: dict[str, str | None] = {}
    start = time.perf_counter()
    for name in sorted(models):
        results[name] = cases.run(name)
    seconds = time.perf_counter() - start
    passed = sum(r is None for r in results.values())
    print(f"{passed} of {len(results)} node cases pass ({100 * passed / len(results):.1f}%) "
          f"in {seconds:.0f} s")
    shipped = model_cases(cases.runner)
    for kind, (ok, total, why) in shipped.items():
        print(f"{kind}: {ok} of {total}", "; ".join(f"{w} ({n})" for w, n in why.most_common(3)))
    if not write:
        return 0
    FAILURES.write_text("# node cases that fail (written by tests/_onnx_suite.py --write)\n" + "".join(
        f"{n}\t{reason(r)}\n" for n, r in sorted(results.items()) if r is not None))
    per_op: dict[str, list] = collections.defaultdict(lambda: [0, 0, collections.Counter()])
    for name, r in results.items():
        row = per_op[family(name, models[name])]
        row[1] += 1
        if r is None:
            row[0] += 1
        else:
            why = next((w for prefix, w in EXPLAINED.items() if name.startswith(prefix)), None)
            row[2][why or _short(reason(r))] += 1
    lines = [_BEGIN, "",
             f"{passed} of {len(results)} node cases pass ({100 * passed / len(results):.1f}%), "
             f"onnx {_onnx_version()}, in {seconds:.0f} s on 2 CPU cores.", "",
             "The model cases shipped in the package (read from its data folder, no "
             "network): " + "; ".join(
                 f"{kind} {ok} of {total}" + (f" (the others: {', '.join(w for w, _ in why.most_common(3))})"
                                              if ok < total else "")
                 for kind, (ok, total, why) in shipped.items()) + ".", "",
             "| operator | passed / cases | why the others fail |", "|---|---|---|"]
    for op, (ok, total, why) in sorted(per_op.items()):
        text = "; ".join(f"{w} ({n})" for w, n in why.most_common(2)).replace("|", "\\|")
        lines.append(f"| {op} | {ok} / {total} | {text} |")
    lines += ["", _END]
    doc = DOCS.read_text()
    head, _, rest = doc.partition(_BEGIN)
    _, _, tail = rest.partition(_END)
    DOCS.write_text(head + "\n".join(lines) + tail)
    return 0


_MODEL_KINDS = {"simple": "OnnxBackendSimpleModelTest",
                "pytorch-converted": "OnnxBackendPyTorchConvertedModelTest",
                "pytorch-operator": "OnnxBackendPyTorchOperatorModelTest"}


def model_cases(runner) -> dict[str, tuple[int, int, collections.Counter]]:
    """kind -> (passed, cases, reasons of the failures) for the model cases the onnx
    package ships with their data (the "real" models need the network: not run)."""
    out = {}
    for kind, category in _MODEL_KINDS.items():
        cls = runner.test_cases[category]
        names = sorted(m for m in dir(cls) if m.startswith("test_") and m.endswith("_cpu"))
        ok, why = 0, collections.Counter()
        for name in names:
            result = unittest.TestResult()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                cls(name).run(result)
            problems = result.errors + result.failures
            if problems:
                why[_short(reason(problems[0][1]))] += 1
            else:
                ok += 1
        out[kind] = (ok, len(names), why)
    return out


def _short(text: str) -> str:
    text = text.replace("mlaxgraph.core.errors.", "")
    if "not supported" in text and "operator" in text:
        return "operator not implemented"
    if "must be known when the graph is built" in text:
        return "a shape computed at run time"
    if "(string) has no JAX dtype" in text:
        return "strings (no JAX dtype)"
    if text.startswith("AssertionError"):
        return "numbers or dtype differ"
    return text.split(":")[0][:60]


def _onnx_version() -> str:
    import onnx

    return onnx.__version__


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main("--write" in sys.argv))
