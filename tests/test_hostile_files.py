"""Malformed and hostile files: each must raise an mg.*Error (no raw Python or JAX
exception), run no code, create no file and not crash the interpreter.

The corpus is built by ``build_corpus`` below: graph JSON texts for
``mg.Graph.from_json`` and model files for ``mg.load``. Several payloads would create
a sentinel file if anything in them were executed, imported or unpickled. The corpus
runs in this process (one test per case) and, all of it, in a fresh interpreter whose
exit code is checked (a crash would show there as a signal).
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import pickle
import struct
import subprocess
import sys

import numpy as np
import pytest

import mlaxgraph as mg
from mlaxgraph import examples, ops

SENTINEL_NAME = "PWNED"
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _valid_graph() -> dict:
    return json.loads(examples.mlp(4, (3,), 2).to_json())


def _valid_cnn() -> dict:
    return json.loads(examples.residual_cnn(size=4, channels=2, classes=2).to_json())


def _node(data, name):
    (node,) = [n for n in data["graph"]["nodes"] if n["name"] == name]
    return node


def _edit(edit):
    """A graph JSON text: the valid MLP with ``edit(data)`` applied."""
    data = _valid_graph()
    edit(data)
    return json.dumps(data)


def _blake2b(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def _safetensors(header: dict, data: bytes, pad: bool = True) -> bytes:
    """The file of ``header`` and ``data``. A header with checksums is signed again, as
    a forger would (digests of the arrays it lists, then of the header with its own
    digest zeroed), so that the cases reach the checks behind the checksums."""
    meta = header.get("__metadata__")
    signed = isinstance(meta, dict) and "mlaxgraph.header_checksum" in meta
    if signed:
        sums = {name: _blake2b(data[v["data_offsets"][0]:v["data_offsets"][1]])
                for name, v in header.items() if name != "__metadata__"}
        meta["mlaxgraph.checksums"] = json.dumps(sums, sort_keys=True, separators=(",", ":"))
        meta["mlaxgraph.header_checksum"] = "0" * 32
        text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    else:
        text = json.dumps(header).encode()
    if pad:
        text += b" " * (-len(text) % 8)
    if signed:
        zeroed = b'"mlaxgraph.header_checksum":"' + b"0" * 32 + b'"'
        text = text.replace(zeroed, zeroed.replace(b"0" * 32, _blake2b(text).encode()))
    return struct.pack("<Q", len(text)) + text + data


def _split(blob: bytes):
    (n,) = struct.unpack("<Q", blob[:8])
    return json.loads(blob[8:8 + n]), blob[8 + n:]


class _Exploit:
    """An object whose unpickling would create the sentinel file."""

    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


def build_corpus(directory: str) -> list[tuple[str, str, object]]:
    """(name, "json" or "file", text or path) for every hostile input; model files are
    written into ``directory``."""
    sentinel = os.path.join(directory, SENTINEL_NAME)
    touch = f"touch {sentinel}"
    code = f"__import__('os').system('{touch}')"
    valid_text = examples.mlp(4, (3,), 2).to_json()
    cases: list[tuple[str, str, object]] = []

    def text(name, value):
        cases.append((name, "json", value))

    # --- not JSON, or not the envelope ------------------------------------------------
    text("empty text", "")
    text("truncated JSON", valid_text[: len(valid_text) // 2])
    text("random bytes", bytes(np.random.default_rng(1).integers(0, 256, 500, dtype=np.uint8)))
    text("invalid UTF-8", b'{"format": "\xff\xfe"}')
    text("JSON array", "[1, 2, 3]")
    text("JSON null", "null")
    text("NaN literal", valid_text.replace('"features":3', '"features":NaN'))
    text("deep nesting", "[" * 100_000 + "]" * 100_000)
    text("pickle payload", pickle.dumps(_Exploit(touch)))
    text("wrong format", _edit(lambda d: d.update(format="keras.model")))
    text("future version", _edit(lambda d: d.update(version=2)))
    text("version as string", _edit(lambda d: d.update(version="1")))
    text("version zero", _edit(lambda d: d.update(version=0)))
    text("missing graph", _edit(lambda d: d.pop("graph")))
    text("extra top-level field", _edit(lambda d: d.update(exec=code)))
    text("duplicate JSON keys", valid_text.replace('{"format":', '{"version":1,"format":', 1))

    # --- ops and functions by name only -----------------------------------------------
    text("unknown op", _edit(lambda d: _node(d, "dense").update(op="no_such_op")))
    text("op os.system", _edit(lambda d: _node(d, "dense").update(op="os.system")))
    text("op as code", _edit(lambda d: _node(d, "dense").update(op=code)))
    text("op as import path",
         _edit(lambda d: _node(d, "dense").update(op="mlaxgraph.ops.linear.Linear")))
    text("function os.system",
         _edit(lambda d: _node(d, "dense")["attrs"].update(kernel_init={"$function": "os.system"})))
    text("function as code",
         _edit(lambda d: _node(d, "dense")["attrs"].update(kernel_init={"$function": code})))
    text("unregistered function",
         _edit(lambda d: _node(d, "dense")["attrs"].update(
             kernel_init={"$function": "my_project.not_registered"})))
    text("unknown tag $pickle",
         _edit(lambda d: _node(d, "dense")["attrs"].update(
             kernel_init={"$pickle": pickle.dumps(_Exploit(touch)).hex()})))
    text("dim as code", _edit(lambda d: _node(d, "x")["outputs"][0].update(shape=[code, 4])))
    text("dtype object", _edit(lambda d: _node(d, "x")["outputs"][0].update(dtype="object")))
    text("dtype as code", _edit(lambda d: _node(d, "x")["attrs"].update(dtype={"$dtype": code})))

    # --- structure ----------------------------------------------------------------------
    def cycle(d):
        _node(d, "dense")["inputs"] = [["logits", 0]]
    text("cycle", _edit(cycle))
    text("dangling reference", _edit(lambda d: _node(d, "relu").update(inputs=[["ghost", 0]])))
    text("output index out of range", _edit(lambda d: d["graph"].update(outputs=[["logits", 5]])))
    text("graph output is not a node", _edit(lambda d: d["graph"].update(outputs=[["nowhere", 0]])))
    text("no outputs", _edit(lambda d: d["graph"].update(outputs=[])))
    text("duplicate node names", _edit(lambda d: _node(d, "relu").update(name="dense")))
    text("input listed twice", _edit(lambda d: d["graph"].update(inputs=["x", "x"])))
    text("input that is not an input op", _edit(lambda d: d["graph"].update(inputs=["x", "relu"])))
    text("missing node field", _edit(lambda d: _node(d, "dense").pop("layer")))
    text("unknown node field", _edit(lambda d: _node(d, "dense").update(pickle="x")))
    text("missing required attribute", _edit(lambda d: _node(d, "dense")["attrs"].pop("features")))
    text("unknown attribute", _edit(lambda d: _node(d, "dense")["attrs"].update(__class__="x")))
    text("shared layer with another op",
         _edit(lambda d: _node(d, "logits").update(layer="dense")))

    # --- types ----------------------------------------------------------------------------
    text("features as string", _edit(lambda d: _node(d, "dense")["attrs"].update(features="3")))
    text("features as float", _edit(lambda d: _node(d, "dense")["attrs"].update(features=3.5)))
    text("features as bool", _edit(lambda d: _node(d, "dense")["attrs"].update(features=True)))
    text("features negative", _edit(lambda d: _node(d, "dense")["attrs"].update(features=-3)))
    text("attrs as array", _edit(lambda d: _node(d, "dense").update(attrs=[1, 2])))
    text("inputs as string", _edit(lambda d: _node(d, "relu").update(inputs="dense")))
    text("input reference of three", _edit(lambda d: _node(d, "relu").update(inputs=[["dense", 0, 0]])))
    text("output spec missing dtype", _edit(lambda d: _node(d, "relu")["outputs"][0].pop("dtype")))
    text("node name as int", _edit(lambda d: _node(d, "relu").update(name=7)))
    text("empty node name", _edit(lambda d: _node(d, "relu").update(name="")))
    text("control characters in a name", _edit(lambda d: _node(d, "relu").update(name="re\x00lu")))
    text("source line as string", _edit(lambda d: _node(d, "relu").update(
        source={"file": "/etc/passwd", "line": "1", "function": "f"})))
    text("non-canonical attribute", _edit(lambda d: _node(d, "dense")["attrs"].update(precision="HIGHEST")))

    # --- sizes ----------------------------------------------------------------------------
    text("absurd dim 10**18", _edit(lambda d: _node(d, "x")["outputs"][0].update(shape=["batch", 10**18])))
    text("negative dim", _edit(lambda d: _node(d, "x")["outputs"][0].update(shape=["batch", -4])))
    text("huge int attribute", _edit(lambda d: _node(d, "dense")["attrs"].update(features=10**30)))
    text("huge weights", _edit(lambda d: [  # consistent shapes, but a 2**41-element kernel
        _node(d, "dense")["attrs"].update(features=2**39),
        _node(d, "dense")["outputs"][0].update(shape=["batch", 2**39]),
        _node(d, "relu")["outputs"][0].update(shape=["batch", 2**39])]))
    text("absurd rank", _edit(lambda d: _node(d, "x")["outputs"][0].update(shape=[1] * 1000)))
    text("huge name", _edit(lambda d: d["graph"].update(name="g" * 1_000_000)))
    text("huge symbolic dim", _edit(lambda d: _node(d, "x")["outputs"][0].update(
        shape=["b" * 100_000, 4])))
    text("deep attribute nesting", _edit(lambda d: _node(d, "dense")["attrs"].update(
        kernel_axes=json.loads("[" * 200 + "]" * 200))))
    text("claimed output shape its op does not produce",
         _edit(lambda d: _node(d, "dense")["outputs"][0].update(shape=["batch", 99])))
    text("claimed output dtype its op does not produce",
         _edit(lambda d: _node(d, "dense")["outputs"][0].update(dtype="bfloat16")))

    # --- nested blocks -------------------------------------------------------------------
    def edit_block(edit):
        data = _valid_cnn()
        edit(_node(data, "res1")["attrs"]["graph"]["$graph"])
        return json.dumps(data)

    text("block with unknown op", edit_block(lambda g: g["nodes"][1].update(op="os.system")))
    text("block with wrong shapes",
         edit_block(lambda g: g["nodes"][1]["outputs"][0].update(shape=["batch", 1, 1, 1])))
    text("block graph not a graph", json.dumps(
        (lambda d: (_node(d, "res1")["attrs"].update(graph="res1"), d)[1])(_valid_cnn())))
    text("block with a cycle", edit_block(lambda g: g["nodes"][1].update(inputs=[["relu_1", 0]])))

    def deep_blocks():
        data = _valid_cnn()
        inner = _node(data, "res1")["attrs"]["graph"]
        for _ in range(40):
            inner = {"$graph": {"name": "b", "inputs": ["x"], "outputs": [["blk", 0]],
                                "nodes": [inner["$graph"]["nodes"][0],
                                          {"name": "blk", "op": "block", "attrs": {"graph": inner},
                                           "inputs": [["x", 0]], "layer": "blk", "source": None,
                                           "outputs": inner["$graph"]["nodes"][0]["outputs"]}]}}
        _node(data, "res1")["attrs"]["graph"] = inner
        return json.dumps(data)

    text("blocks nested 40 deep", deep_blocks())

    # --- model files for mg.load ------------------------------------------------------
    graph = examples.mlp(4, (3,), 2)
    rng = np.random.default_rng(0)
    params = {"dense": {"kernel": rng.standard_normal((4, 3)).astype(np.float32),
                        "bias": np.zeros(3, np.float32)},
              "logits": {"kernel": rng.standard_normal((3, 2)).astype(np.float32),
                         "bias": np.zeros(2, np.float32)}}
    good = os.path.join(directory, "good.mlg")
    mg.save(good, graph, params)
    with open(good, "rb") as f:
        blob = f.read()
    header, data = _split(blob)
    kernel = "params/dense/kernel"

    def file(name, content: bytes):
        path = os.path.join(directory, name.replace(" ", "_") + ".mlg")
        with open(path, "wb") as f:
            f.write(content)
        cases.append((name, "file", path))

    def with_header(edit):
        h = copy.deepcopy(header)
        edit(h)
        return _safetensors(h, data)

    def with_graph(text_value):
        return with_header(lambda h: h["__metadata__"].update({"mlaxgraph.graph": text_value}))

    file("empty file", b"")
    file("seven bytes", b"\x01" * 7)
    file("random file bytes", bytes(np.random.default_rng(2).integers(0, 256, 4096, dtype=np.uint8)))
    file("truncated file", blob[:-10])
    file("trailing bytes", blob + b"\x00" * 16)
    file("header length beyond the file", struct.pack("<Q", len(blob)) + blob[8:])
    file("header length 2**63", struct.pack("<Q", 2**63) + blob[8:])
    file("header offsets beyond the data",
         with_header(lambda h: h[kernel].update(data_offsets=[0, 10**9])))
    file("header offsets overlapping", with_header(
        lambda h: h["params/dense/bias"].update(data_offsets=h[kernel]["data_offsets"][:])))
    file("header shape lies about size", with_header(lambda h: h[kernel].update(shape=[400, 300])))
    file("header shape overflows", with_header(lambda h: h[kernel].update(shape=[2**40] * 3)))
    file("header not JSON", struct.pack("<Q", 16) + b"{not json}      " + data)
    file("wrong shape, same size", with_header(lambda h: h[kernel].update(shape=[3, 4])))
    file("wrong dtype, same size", with_header(lambda h: h[kernel].update(dtype="I32")))
    file("unsigned dtype, same size", with_header(lambda h: h[kernel].update(dtype="U32")))

    def drop(name):
        def edit(h):
            begin, end = h[name]["data_offsets"]
            del h[name]
            for v in h.values():
                if "data_offsets" in v and v["data_offsets"][0] >= end:
                    v["data_offsets"] = [o - (end - begin) for o in v["data_offsets"]]
        return edit

    h = copy.deepcopy(header)
    begin, end = h[kernel]["data_offsets"]
    drop(kernel)(h)
    file("missing array", _safetensors(h, data[:begin] + data[end:]))
    h = copy.deepcopy(header)
    h["params/ghost/w"] = {"dtype": "F32", "shape": [2], "data_offsets": [len(data), len(data) + 8]}
    file("extra array", _safetensors(h, data + b"\x00" * 8))
    file("metadata without graph", with_header(lambda h: h["__metadata__"].pop("mlaxgraph.graph")))
    file("no metadata", with_header(lambda h: h.pop("__metadata__")))
    file("metadata wrong format", with_header(
        lambda h: h["__metadata__"].update({"mlaxgraph.format": "pt"})))
    file("metadata future version", with_header(
        lambda h: h["__metadata__"].update({"mlaxgraph.version": "99"})))
    file("metadata version as code", with_header(
        lambda h: h["__metadata__"].update({"mlaxgraph.version": code})))
    file("metadata param dtype object", with_header(
        lambda h: h["__metadata__"].update({"mlaxgraph.param_dtype": "object"})))
    file("metadata unknown mlaxgraph key", with_header(
        lambda h: h["__metadata__"].update({"mlaxgraph.loader": code})))
    file("graph with op os.system", with_graph(
        _edit(lambda d: _node(d, "dense").update(op="os.system"))))
    file("graph with function as code", with_graph(
        _edit(lambda d: _node(d, "dense")["attrs"].update(kernel_init={"$function": code}))))
    file("graph not JSON", with_graph("{'graph': 1}"))
    file("graph of another model", with_graph(examples.mlp(4, (5,), 2).to_json()))
    file("pickle file", pickle.dumps(_Exploit(touch)))
    file("JSON instead of safetensors", valid_text.encode())
    return cases


def load_case(kind: str, payload):
    """Loads one case as a user would."""
    return mg.Graph.from_json(payload) if kind == "json" else mg.load(payload)


def run_case(kind: str, payload) -> str:
    """Runs one case; returns the mg error class name, or raises what it raised."""
    try:
        load_case(kind, payload)
    except mg.MlaxGraphError as e:
        return type(e).__name__
    raise AssertionError("loaded without an error")


# The corpus is built once per session in its own directory.
@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("hostile"))
    return directory, {name: (kind, payload) for name, kind, payload in build_corpus(directory)}


def _names() -> list[str]:
    import tempfile

    with tempfile.TemporaryDirectory() as directory:
        return [name for name, _, _ in build_corpus(directory)]


CASE_NAMES = _names()


def test_the_corpus_is_large_and_has_unique_names():
    assert len(CASE_NAMES) >= 30 and len(set(CASE_NAMES)) == len(CASE_NAMES)
    assert sum(1 for n in CASE_NAMES if "os.system" in n or "code" in n or "pickle" in n) >= 8


@pytest.mark.parametrize("name", CASE_NAMES)
def test_hostile_input_raises_an_mlaxgraph_error(name, corpus, tmp_path, monkeypatch):
    directory, cases = corpus
    kind, payload = cases[name]
    monkeypatch.chdir(tmp_path)
    before = sorted(os.listdir(directory))
    with pytest.raises(mg.MlaxGraphError) as info:
        load_case(kind, payload)
    # Files and texts are errors of the file: SerializationError, with the cause kept.
    assert isinstance(info.value, mg.SerializationError), type(info.value)
    assert str(info.value)
    assert not os.path.exists(os.path.join(directory, SENTINEL_NAME))
    assert sorted(os.listdir(directory)) == before and os.listdir(tmp_path) == []


def test_messages_name_what_is_wrong(corpus):
    _, cases = corpus

    def message(name):
        kind, payload = cases[name]
        with pytest.raises(mg.SerializationError) as info:
            load_case(kind, payload)
        return str(info.value)

    assert "unknown op 'os.system'" in message("op os.system")
    assert "graph.nodes[1] (node 'dense').op" in message("op os.system")
    assert "'os.system' is not registered" in message("function os.system")
    assert "cycle" in message("cycle")
    assert "reads %ghost, which is not a node" in message("dangling reference")
    assert "two nodes have this name" in message("duplicate node names")
    assert "missing the field layer" in message("missing node field")
    assert "upgrade mlaxgraph" in message("future version")
    assert "10000000000" in message("absurd dim 10**18") or "1099511627776" in message("absurd dim 10**18")
    assert "does not produce" in message("claimed output shape its op does not produce")
    assert "missing array 'params/dense/kernel'" in message("missing array")
    assert "extra array 'params/ghost/w'" in message("extra array")
    assert "'params/dense/kernel' has shape [3, 4]" in message("wrong shape, same size")
    assert "'params/dense/kernel' has dtype int32" in message("wrong dtype, same size")
    assert "canonical" in message("non-canonical attribute")
    assert "nested deeper" in message("blocks nested 40 deep")
    assert "weight 'kernel' of shape (4, 549755813888)" in message("huge weights")
    assert "kernel_init.$function: the function" in message("function as code")


def test_graph_from_json_rejects_non_text():
    for value in (None, 3, ["{}"], {"format": "mlaxgraph.graph"}):
        with pytest.raises(mg.SerializationError):
            mg.Graph.from_json(value)


SUBPROCESS = r"""
import os, sys, tempfile
import jax
jax.config.update("jax_numpy_dtype_promotion", "strict")
sys.path.insert(0, sys.argv[1])
import test_hostile_files as corpus_module

with tempfile.TemporaryDirectory() as directory:
    os.chdir(directory)
    cases = corpus_module.build_corpus(directory)
    before = sorted(os.listdir(directory))
    failures = 0
    for name, kind, payload in cases:
        try:
            result = corpus_module.run_case(kind, payload)
        except BaseException as e:  # a raw exception: report it, keep going
            result = "RAW " + type(e).__name__
            failures += 1
        print(f"{name}\t{result}", flush=True)
    if os.path.exists(os.path.join(directory, corpus_module.SENTINEL_NAME)):
        print("SENTINEL CREATED", flush=True)
        failures += 1
    if sorted(os.listdir(directory)) != before:
        print("FILES CREATED", flush=True)
        failures += 1
    os.chdir("/")
sys.exit(1 if failures else 0)
"""


def test_corpus_in_a_fresh_interpreter():
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "JAX_PLATFORMS": "cpu"}
    result = subprocess.run([sys.executable, "-c", SUBPROCESS, HERE], capture_output=True,
                            text=True, env=env, timeout=120)
    lines = result.stdout.splitlines()
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert [line.split("\t")[0] for line in lines] == CASE_NAMES
    assert all(line.split("\t")[1] == "SerializationError" for line in lines), lines


# --- mutations of valid files --------------------------------------------------------

_VALUES = [None, True, 0, -1, 3, 2**40 + 1, 10**30, 0.5, "", "batch", "2*batch", "SAME",
           "float32", [], [1, 1], [[1, 1]], ["batch"], {}, {"$dtype": "float32"},
           {"$dim": "batch"}, {"$float": "nan"}, {"$list": []}, {"$graph": {}},
           {"$function": "mlaxgraph.initializers.zeros"}, ["x", 0], [["x", 0]],
           {"shape": [], "dtype": "float32"}, "relu", "block", "input"]


def _mutations(data, rng, count):
    """``count`` copies of ``data``, each with one to three fields replaced, deleted or
    added at random places."""
    def places(obj, path=()):
        yield path
        children = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
        for key, value in children:
            yield from places(value, path + (key,))

    for _ in range(count):
        mutated = copy.deepcopy(data)
        for _ in range(rng.integers(1, 4)):
            all_places = list(places(mutated))[1:]
            path = all_places[rng.integers(len(all_places))]
            parent = mutated
            for key in path[:-1]:
                parent = parent[key]
            choice = rng.random()
            if choice < 0.6:
                parent[path[-1]] = copy.deepcopy(_VALUES[rng.integers(len(_VALUES))])
            elif choice < 0.85:
                del parent[path[-1]]
            elif isinstance(parent, dict):
                parent["extra"] = 1
            else:
                parent.insert(path[-1], copy.deepcopy(_VALUES[rng.integers(len(_VALUES))]))
        yield json.dumps(mutated)


def test_random_mutations_of_valid_graphs_raise_only_mlaxgraph_errors():
    rng = np.random.default_rng(20240611)
    bases = [_valid_graph(), _valid_cnn(),
             json.loads(examples.transformer_block(4, 8, 2, 8, causal=True, dropout=0.1).to_json()),
             json.loads(examples.lstm_classifier(10, 3, 4, 4, 2).to_json())]
    outcomes = {"loaded": 0, "rejected": 0}
    for base in bases:
        for text in _mutations(base, rng, 60):
            try:
                graph = mg.Graph.from_json(text)
            except mg.MlaxGraphError as e:
                assert isinstance(e, mg.SerializationError)
                outcomes["rejected"] += 1
            else:  # a mutation that is still a valid graph writes back canonically
                assert mg.Graph.from_json(graph.to_json()).to_json() == graph.to_json()
                outcomes["loaded"] += 1
    assert outcomes["rejected"] > 180, outcomes
