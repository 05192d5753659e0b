"""The inspection subcommands of the command line (summary, render, hlo, export, cost,
compare): through ``main(argv)``, and as the installed ``mlaxgraph`` script and
``python -m mlaxgraph`` in subprocesses. Exit status 0 done, 1 an error in the model, 2
a wrong argument or a missing file, each error one line."""

import json
import pathlib
import re
import shlex
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

import mlaxgraph as mg
from mlaxgraph.cli.main import main
from mlaxgraph.examples import residual_cnn

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCRIPT = pathlib.Path(sys.executable).with_name("mlaxgraph")

BROKEN = '''
import mlaxgraph as mg
from mlaxgraph import ops

def build():
    x = mg.Input(("batch", 3), name="x")
    return mg.Graph(x, ops.add(x, ops.cast(x, "bfloat16")))

def not_a_graph():
    return 42

def fails():
    raise RuntimeError("the weights server is down\\nsecond line")

def cnn_bfloat16():
    from mlaxgraph.examples import residual_cnn
    return mg.compile(residual_cnn(), mg.Policy(compute_dtype="bfloat16"))
'''


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A folder with the CNN saved as .mlg (with weights) and .json, and a module of
    graph builders."""
    folder = tmp_path_factory.mktemp("cli")
    graph = residual_cnn()
    params, state = mg.compile(graph).init(jax.random.key(0))
    mg.save(folder / "cnn.mlg", graph, params, state)
    (folder / "cnn.json").write_text(graph.to_json())
    (folder / "builders.py").write_text(BROKEN)
    (folder / "notes.txt").write_text("not a model")
    return folder


@pytest.fixture
def run(workdir, monkeypatch, capsys):
    """``main(argv)`` in the work folder: (exit status, stdout, stderr)."""
    monkeypatch.chdir(workdir)

    def call(*argv):
        status = main(list(argv))
        out, err = capsys.readouterr()
        return status, out, err

    return call


# --- each subcommand through main(argv) --------------------------------------------------


def test_summary(run):
    status, out, err = run("summary", "cnn.mlg")
    assert status == 0, err
    assert 'graph "residual_cnn"' in out and "trainable params: 7,434" in out
    status, out, _ = run("summary", "mlaxgraph.examples:residual_cnn", "--policy", "bfloat16",
                         "--batch", "4")
    assert status == 0
    assert "image_bf16" in out and "compute_dtype=bfloat16" in out
    table = mg.compile(residual_cnn(), mg.Policy.named("bfloat16")).cost_table(batch=4, xla=False)
    assert f"at batch=4: forward {table.flops:,} FLOPs" in out


def test_summary_to_a_file_and_of_a_json_graph(run, workdir):
    status, out, _ = run("summary", "cnn.json", "--out", "summary.txt")
    assert status == 0 and out.strip() == "wrote summary.txt"
    assert (workdir / "summary.txt").read_text().startswith('graph "residual_cnn"')


def test_render(run, workdir):
    status, out, _ = run("render", "cnn.mlg", "--out", "cnn.dot")
    assert status == 0 and out.strip() == "wrote cnn.dot"
    assert (workdir / "cnn.dot").read_text().startswith("digraph")
    if shutil.which("dot"):
        status, _, err = run("render", "cnn.json", "--out", "cnn.svg", "--policy", "bfloat16")
        assert status == 0, err
        assert "<svg" in (workdir / "cnn.svg").read_text()


def test_hlo(run, workdir):
    status, out, _ = run("hlo", "cnn.mlg", "--batch", "8")
    assert status == 0
    model = mg.compile(residual_cnn())
    expected = model.hlo(batch=8)

    def operations(text):  # location numbers depend on the code that built the graph
        return [re.sub(r"#loc\d*", "#loc", line) for line in text.splitlines()
                if not line.startswith("#loc")]

    assert operations(out.rstrip("\n")) == operations(expected)
    assert 'loc("jit(apply)/res1/conv_a/conv_general_dilated"' in out
    status, out, _ = run("hlo", "cnn.mlg", "--batch", "8", "--optimized", "--inference-mode",
                         "--out", "cnn.hlo")
    assert status == 0
    assert (workdir / "cnn.hlo").read_text().startswith("HloModule")
    status, out, _ = run("hlo", "cnn.mlg", "--batch", "2", "--by-layer", "--optimized")
    assert status == 0
    assert out.startswith("optimized HLO by layer\nstem:")
    assert "flatten: 1 operation" in out
    # the convolution, and its kernel's layout change XLA leaves unnamed
    assert "res1/conv_a: 2 operations" in out and "matched by the weights it reads" in out


def test_export_then_load(run, workdir):
    status, out, _ = run("export", "cnn.mlg", "--batch", "8", "--out", "cnn-export")
    assert status == 0
    assert "wrote cnn-export/exported.jax" in out and "wrote cnn-export/weights.safetensors" in out
    manifest = json.loads((workdir / "cnn-export" / "manifest.json").read_text())
    assert manifest["dims"] == {"batch": 8} and manifest["graph"] == "residual_cnn"
    _, params, state = mg.load(workdir / "cnn.mlg")
    x = np.ones((3, 8, 8, 1), np.float32)
    out_loaded, _ = mg.load_exported(workdir / "cnn-export")(x)
    expected, _ = mg.compile(residual_cnn()).apply(params, state, x, inference_mode=True)
    np.testing.assert_allclose(out_loaded, expected, rtol=1e-5, atol=1e-6)
    # From a module: no weights to write, and it says so.
    status, out, _ = run("export", "mlaxgraph.examples:mlp", "--out", "mlp-export")
    assert status == 0 and "no weights" in out
    assert not (workdir / "mlp-export" / "weights.safetensors").exists()


def test_export_into_an_earlier_export_removes_the_files_it_does_not_rewrite(run, workdir):
    folder = workdir / "again-export"
    assert run("export", "cnn.mlg", "--batch", "2", "--out", str(folder))[0] == 0
    first = set(json.loads((folder / "manifest.json").read_text())["files"].values())
    assert {"stablehlo.mlir", "optimized_hlo.txt"} <= first
    (folder / "notes.txt").write_text("the user's")
    status, out, _ = run("export", "cnn.json", "--training", "--out", str(folder))
    assert status == 0
    second = set(json.loads((folder / "manifest.json").read_text())["files"].values())
    assert {p.name for p in folder.iterdir()} == second | {"manifest.json", "notes.txt"}
    for name in sorted(first - second):
        assert f"removed {folder / name}" in out
    assert mg.load_exported(folder) is not None  # the checksums hold


def test_export_to_a_folder_that_cannot_be_made_exits_2(run, workdir):
    (workdir / "plain_file").write_text("x")
    status, _, err = run("export", "cnn.mlg", "--out", str(workdir / "plain_file" / "sub"))
    assert status == 2 and err.count("\n") == 1
    assert f"--out {workdir / 'plain_file' / 'sub'}: cannot make the folder" in err


@pytest.mark.parametrize("flag,message", [("--weights", "--weights {}: no such file or folder"),
                                          ("--config", "--config {}: no such file")])
def test_demo_with_a_missing_file_exits_2_before_any_work(run, workdir, flag, message):
    missing, out = workdir / "nofile.safetensors", workdir / "demo-missing"
    status, printed, err = run("demo", "--model", "gpt2", flag, str(missing), "--out", str(out))
    assert status == 2 and printed == "" and err.count("\n") == 1
    assert message.format(missing) in err
    assert not out.exists()


def test_cost(run):
    status, out, _ = run("cost", "cnn.mlg", "--batch", "8", "--inference-mode")
    assert status == 0
    table = mg.compile(residual_cnn()).cost_table(batch=8, inference_mode=True)
    assert out.rstrip("\n") == str(table)
    status, out, _ = run("cost", "mlaxgraph.examples:mlp", "--batch", "4", "--no-xla",
                         "--policy", "bfloat16")
    assert status == 0 and "200832*batch+100480" in out


def test_compare(run):
    status, out, _ = run("compare", "cnn.json", "--batch", "4", "--inference-mode")
    assert status == 0
    comparison = mg.compare_policies(residual_cnn(), ["float32", "bfloat16"], batch=4,
                                     inference_mode=True)
    assert out.rstrip("\n") == str(comparison)
    status, _, err = run("compare", "cnn.json", "--batch", "4", "--policy", "float32")
    assert status == 2 and "two or more" in err
    # the names --policy takes everywhere (mixed_bfloat16 was an invalid choice here)
    status, out, _ = run("compare", "cnn.json", "--batch", "4", "--inference-mode",
                         "--policy", "float32", "--policy", "mixed_bfloat16")
    assert status == 0 and "mixed_bfloat16" in out


def test_a_builder_returning_a_compiled_model_keeps_its_policy(run):
    model = mg.compile(residual_cnn(), mg.Policy(compute_dtype="bfloat16"))
    status, out, err = run("summary", "builders:cnn_bfloat16")
    assert status == 0, err
    assert out == model.summary() + "\n"
    assert sum(n.op.op_name == "cast" for n in model.graph.nodes) > 0
    status, out, _ = run("summary", "builders:cnn_bfloat16", "--policy", "float32")
    assert status == 0 and out == mg.compile(residual_cnn(), mg.Policy.named("float32")).summary() + "\n"


def test_a_builder_in_a_python_file(run):
    status, out, err = run("summary", "builders.py:build")
    assert status == 1
    assert err.count("\n") == 1  # one line, no traceback
    assert err.startswith("mlaxgraph summary: error: layer 'add' (op add): inputs have "
                          "different dtypes")
    assert err.rstrip().endswith("(--verbose for details)")


# --- errors: exit status and one line ------------------------------------------------------


@pytest.mark.parametrize("argv,message", [
    (["summary", "missing.mlg"], "no such file: missing.mlg"),
    (["summary", "notes.txt"], "cannot tell what notes.txt is"),
    (["summary", "."], ". is a folder"),
    (["summary", "no_such_module:build"], "no module named 'no_such_module'"),
    (["summary", "builders:nothing"], "builders has no attribute 'nothing'"),
    (["summary", "builders:not_a_graph"], "builders:not_a_graph returned int, not an mg.Graph"),
    (["summary", "missing.py:build"], "no such file: missing.py"),
    (["hlo", "cnn.mlg"], "has symbolic dims; give --batch N"),
    (["hlo", "cnn.mlg", "--batch", "0"], "argument --batch: must be at least 1, got 0"),
    (["hlo", "cnn.mlg", "--batch", "two"], "argument --batch: not an integer: 'two'"),
    (["hlo", "cnn.mlg", "--batch", "2", "--dim", "length=3"], "has no symbolic dim 'length'"),
    (["cost", "cnn.mlg", "--batch", "2", "--policy", "int8"], "unknown policy 'int8'"),
    (["cost", "cnn.mlg", "--batch", "2", "--policy", "bf16"],
     "unknown policy 'bf16' (did you mean 'bfloat16'?)"),
    (["cost"], "the following arguments are required: MODEL"),
    (["cost", "cnn.mlg", "--batch", "2", "--frobnicate"], "unrecognized arguments: --frobnicate"),
    (["summary", "cnn.mlg", "--out", "no/such/folder/x.txt"], "no such folder"),
    (["export", "cnn.mlg", "--out", "cnn.json"], "exists and is not a folder"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
    (["summry", "cnn.mlg"], "invalid choice: 'summry' (choose from 'demo', 'summary', 'render', "
                            "'view', 'hlo', 'export', 'cost', 'compare', 'generate'); did you mean "
                            "'summary'?"),
    (["hlo", "cnn.mlg", "--batch", "2", "--optimised"],  # the command's parser reports it
     "mlaxgraph hlo: error: unrecognized arguments: --optimised; did you mean '--optimized'? "
     "(see `mlaxgraph hlo --help`)"),
    (["generate", "--model", "gtp2", "--prompt-ids", "1"], "did you mean 'gpt2'?"),
    # a misspelt dim is named before the dims still missing (it said "give --batch N")
    (["cost", "cnn.mlg", "--dim", "bacth=3"], "no symbolic dim 'bacth' (its dims: batch); did "
                                              "you mean 'batch'?"),
    (["export", "cnn.mlg", "--dim", "bacth=3"], "no symbolic dim 'bacth'"),
    (["view", "cnn.mlg", "--dim", "bacth=3"], "no symbolic dim 'bacth'"),
    (["summary", "cnn.mlg", "--batch", "2", "--dim", "batch=3"], "give the batch twice"),
    (["cost", "cnn.mlg", "--dim", "batch=3", "--dim", "batch=4"],
     "--dim batch=3 and --dim batch=4 give batch twice: give one"),
    (["summary", "builders:biuld"], "builders has no attribute 'biuld' (did you mean 'build'?)"),
    (["summary", "mlaxgraph.models:gpt"], "has no attribute 'gpt' (did you mean 'gpt2'?)"),
    (["compare", "cnn.mlg", "--batch", "2", "--policy", "float32", "--policy", "float32"],
     "two or more different --policy names"),
    (["compare", "cnn.mlg", "--batch", "2", "--policy", "bf16"], "did you mean 'bfloat16'?"),
    (["render", "cnn.mlg", "--out", "r.html"], "the explorer page (.html) is `mlaxgraph view"),
    (["view", "cnn.mlg", "--out", "v.svg"], "a drawing (.svg, .png, .pdf) is `mlaxgraph render"),
])
def test_bad_arguments_and_missing_files_exit_2_with_one_line(run, argv, message):
    status, out, err = run(*argv)
    assert status == 2, err
    assert err.count("\n") == 1, err
    assert message in err
    assert err.startswith("mlaxgraph")


@pytest.mark.parametrize("argv,message", [
    (["summary", "builders:fails"], "builders:fails raised RuntimeError: the weights server is down"),
    (["summary", "bad.mlg"], "bad.mlg: not a weights file"),
    (["summary", "bad.json"], "bad.json: the graph text is not valid JSON"),  # the file named
])
def test_errors_in_the_model_exit_1_with_one_line(run, workdir, argv, message):
    (workdir / "bad.mlg").write_bytes(b"garbage")
    (workdir / "bad.json").write_text("{not json")
    status, out, err = run(*argv)
    assert status == 1
    assert err.count("\n") == 1 and message in err


def test_verbose_prints_the_whole_error(run):
    status, _, err = run("summary", "builders.py:build", "--verbose")
    assert status == 1
    assert "Traceback" in err and "got:" in err and "created at" in err


def test_help_lists_the_commands_with_examples(run):
    status, out, _ = run("--help")
    assert status == 0
    for command in ("demo", "summary", "render", "hlo", "export", "cost", "compare"):
        assert re.search(rf"^    {command}\s", out, re.MULTILINE), command
    assert "mlaxgraph cost cnn.mlg --batch 8" in out and "Exit status: 0 done" in out
    for command in ("summary", "render", "hlo", "export", "cost", "compare"):
        status, out, _ = run(command, "--help")
        assert status == 0 and "examples:\n  mlaxgraph " + command in out


# --- the installed entry points, in subprocesses ------------------------------------------


@pytest.mark.parametrize("launcher", ["script", "module"])
def test_entry_points_run_the_commands(workdir, launcher):
    command = [str(SCRIPT)] if launcher == "script" else [sys.executable, "-m", "mlaxgraph"]
    if launcher == "script":
        assert SCRIPT.exists(), "the console script is not installed (pip install -e .)"

    def run(*argv):
        return subprocess.run(command + list(argv), capture_output=True, text=True,
                              timeout=300, cwd=workdir)

    commands = [["summary", "cnn.mlg"], ["render", "cnn.json", "--out", "sub.dot"],
                ["hlo", "cnn.mlg", "--batch", "2", "--optimized"],
                ["export", "cnn.mlg", "--batch", "2", "--out", f"{launcher}-export"],
                ["cost", "cnn.mlg", "--batch", "2"]]
    # both launchers call one main(): the script runs every command, the module one
    # (each process imports jax afresh, a few seconds each)
    for argv in commands if launcher == "script" else commands[:1]:
        result = run(*argv)
        assert result.returncode == 0, (argv, result.stderr)
        assert result.stdout
    missing = run("summary", "missing.mlg")
    assert missing.returncode == 2
    assert missing.stderr == "mlaxgraph summary: error: no such file: missing.mlg (give a .mlg, " \
                             ".json or .onnx file, or module:function)\n"
    broken = run("summary", "builders.py:build")
    assert broken.returncode == 1 and broken.stderr.count("\n") == 1
    assert "Traceback" not in broken.stderr


# --- the commands of docs/cli.md run -----------------------------------------------------


def doc_commands():
    text = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    blocks = re.findall(r"^```bash\n(.*?)^```", text, re.MULTILINE | re.DOTALL)
    return [line for block in blocks for line in block.splitlines()
            if line.startswith("mlaxgraph ")]


def test_docs_commands_run(run, workdir):
    commands = doc_commands()
    assert len(commands) >= 6
    for line in commands:
        command, _, comment = line.partition("#")
        status, out, err = run(*shlex.split(command)[1:])
        expected = re.search(r"exit status (\d)", comment)
        assert status == (int(expected.group(1)) if expected else 0), (line, err)
