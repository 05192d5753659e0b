"""HLO by layer: every operation of the StableHLO and of XLA's optimized HLO traced back
to its layer through the named scopes.

The texts are read here with regular expressions of the test's own, independent of the
parser in mlaxgraph/hlo_layers.py.

One layer of the residual CNN has no name of its own in the optimized HLO: ``flatten``.
XLA turns its reshape of the pooled (batch, 4, 4, 16) into a free bitcast to
(batch, 256) and gives that bitcast a neighbouring layer's name (the pooling's, or
in training the dropout's, after moving the bitcast past the dropout's scaling).
``hlo_by_layer`` finds it by shape and says so; the test checks that bitcast in the
text.
"""

import re

import pytest

import mlaxgraph as mg
from mlaxgraph import examples
from mlaxgraph.examples import mlp, residual_cnn
from mlaxgraph.analysis.hlo.by_layer import _optimized_operations
from mlaxgraph.analysis.hlo.text import parse_optimized_hlo

SCOPE = re.compile(r'op_name="jit\(apply\)/([^"]*)"')


@pytest.fixture(scope="module")
def cnn():
    return mg.compile(residual_cnn())


def scoped_layers(text, paths):
    """The layers named in the optimized HLO's metadata: the longest layer path that
    prefixes each op_name."""
    found = set()
    for name in SCOPE.findall(text):
        parts = name.split("/")
        for end in range(len(parts), 0, -1):
            if "/".join(parts[:end]) in paths:
                found.add("/".join(parts[:end]))
                break
    return found


@pytest.mark.parametrize("inference_mode", [False, True])
def test_every_cnn_layer_is_in_the_optimized_metadata_and_in_hlo_by_layer(cnn, inference_mode):
    paths = [step.path for step in cnn.program.steps]
    assert paths == ["stem", "stem_bn", "relu", "res1/conv_a", "res1/bn_a", "res1/relu",
                     "res1/conv_b", "res1/bn_b", "res1/add", "res1/relu_1", "max_pool",
                     "flatten", "dropout", "logits"]
    by_layer = cnn.hlo_by_layer(batch=8, optimized=True, inference_mode=inference_mode)
    text = by_layer.text
    named = scoped_layers(text, set(paths))
    # Dropout is the identity in inference: no operation at all.
    identity = {"dropout"} if inference_mode else set()
    assert named == set(paths) - {"flatten"} - identity
    # flatten: a bitcast from the pooled shape to (8, 256), with a neighbour's name.
    bitcasts = re.findall(r"%(\S+) = f32\[8,256\]\{1,0\} bitcast\(%(\S+)\).*?"
                          r'op_name="jit\(apply\)/(max_pool|dropout)/', text)
    assert bitcasts, "no bitcast to f32[8,256] named after max_pool or dropout"
    for layer in paths:
        operations = by_layer[layer]
        if layer in identity:
            assert operations == ()
            continue
        assert operations, f"{layer} has no operations in hlo_by_layer"
        for op in operations:
            assert layer in op.layers or op.inferred, (layer, op)
    (flatten,) = by_layer["flatten"]
    assert "bitcast f32[8,4,4,16] -> f32[8,256]" in flatten.inferred


def test_stablehlo_by_layer_follows_the_locations(cnn):
    by_layer = cnn.hlo_by_layer(batch=4, optimized=False)
    text = by_layer.text
    # The test's own reading: which #loc names which layer, and which location each
    # top-level operation of main has (on its line, or for an operation with regions on
    # the line closing them; both at main's indentation).
    names = dict(re.findall(r'^#(loc\d+) = loc\("jit\(apply\)/([^"]*)"', text, re.MULTILINE))
    main = text[text.index("func.func public @main"):text.index("func.func private")]
    expected: dict[str, int] = {}
    for ref in re.findall(r"^    [%}]\S*.*loc\(#(loc\d+)\)$", main, re.MULTILINE):
        scope = names.get(ref, "")
        for layer in sorted(by_layer, key=len, reverse=True):
            if scope == layer or scope.startswith(layer + "/"):
                expected[layer] = expected.get(layer, 0) + 1
                break
    assert {layer: len(ops) for layer, ops in by_layer.items() if ops} == expected
    for layer in by_layer:  # training: every layer computes something, flatten a reshape
        assert by_layer[layer], layer
    assert [op.opcode for op in by_layer["flatten"]] == ["stablehlo.reshape"]
    assert "stablehlo.convolution" in [op.opcode for op in by_layer["res1/conv_a"]]
    relu = by_layer["relu"][0]  # a call of a private function: its body is listed
    assert relu.opcode == "call @relu" and "stablehlo.maximum" in relu.fused


def test_optimized_layers_show_what_xla_made_of_them(cnn):
    by_layer = cnn.hlo_by_layer(batch=8, optimized=True, inference_mode=True)
    conv = by_layer["res1/conv_a"]  # its convolution, and the kernel's layout change
    assert [op.opcode for op in conv if not op.inferred] == ["convolution"]
    assert all(op.inferred == "the weights it reads: res1/conv_a's" for op in conv if op.inferred)
    assert any("dot" in op.fused or op.opcode == "dot" for op in by_layer["logits"])
    # BatchNorm in inference is fused with its neighbours: a fusion lists them all.
    fused = [op for op in by_layer["res1/bn_a"] if op.opcode == "fusion" and len(op.layers) > 1]
    assert fused and "res1/bn_a" in fused[0].layers
    assert str(by_layer).startswith("optimized HLO by layer\nstem:")
    assert "(with " in str(by_layer)


@pytest.mark.parametrize("optimized", [False, True])
def test_each_call_of_a_shared_layer_keeps_its_own_operations(optimized):
    # XLA cuts an optimized op_name at "@": the second call's scope is written "shared#1".
    x = mg.Input(("batch", 4), name="x")
    shared = mg.ops.Linear(4, name="shared")
    graph = mg.Graph(x, shared(mg.ops.relu(shared(x))), name="twice")
    by_layer = mg.compile(graph).hlo_by_layer(batch=2, optimized=optimized)
    assert list(by_layer) == ["shared", "relu", "shared@1"]
    dots = {layer: [op for op in ops if "dot" in op.opcode or any("dot" in f for f in op.fused)]
            for layer, ops in by_layer.layers.items()}
    assert len(dots["shared"]) == 1 and len(dots["shared@1"]) == 1, by_layer
    assert dots["shared"][0].name != dots["shared@1"][0].name


def test_policy_casts_are_layers_too():
    model = mg.compile(mlp(16, (8,), 4), mg.Policy(compute_dtype="bfloat16"))
    by_layer = model.hlo_by_layer(batch=2, optimized=False)
    assert [op.opcode for op in by_layer["x_bf16"]] == ["stablehlo.convert"]
    # The layer casts its float32 weights to bfloat16 in its own scope.
    assert "stablehlo.convert" in [op.opcode for op in by_layer["dense"]]


def test_parser_reads_tuples_roots_and_nested_fusions():
    text = """HloModule m, entry_computation_layout={()->f32[2]{0}}

%inner (p: f32[2]) -> f32[2] {
  %p = f32[2]{0} parameter(0)
  ROOT %n = f32[2]{0} negate(%p), metadata={op_name="jit(apply)/b/neg"}
}

%outer (q: f32[2]) -> (f32[2], f32[2]) {
  %q = f32[2]{0} parameter(0)
  %f = f32[2]{0} fusion(%q), kind=kLoop, calls=%inner
  %a = f32[2]{0} add(%f, %q), metadata={op_name="jit(apply)/a/add"}
  ROOT %t = (f32[2]{0}, /*index=1*/f32[2]{0}) tuple(%a, %f)
}

ENTRY %main (x: f32[2]) -> f32[2] {
  %x = f32[2]{0} parameter(0), metadata={op_name="inputs[0]"}
  %fusion = (f32[2]{0}, f32[2]{0}) fusion(%x), kind=kLoop, calls=%outer, metadata={op_name="jit(apply)/a/add"}
  ROOT %g = f32[2]{0} get-tuple-element(%fusion), index=0
}
"""
    computations = parse_optimized_hlo(text)
    assert [i.name for i in computations[""]] == ["x", "fusion", "g"]
    fusion = computations[""][1]
    assert fusion.type == "(f32[2]{0}, f32[2]{0})" and fusion.opcode == "fusion"
    assert fusion.called == [("calls", "outer")]
    assert computations["inner"][1].op_name == "jit(apply)/b/neg"

    operations, _ = _optimized_operations(text, frozenset({"a", "b"}))
    by_name = {op.name: op for op in operations}
    assert by_name["%fusion"].layers == ("a", "b")  # the nested fusion's negate is b's
    assert by_name["%fusion"].fused == ("fusion", "negate", "add", "tuple")
    assert by_name["%x"].layers == ()


def test_operations_merged_across_equal_blocks_are_marked_shared():
    # XLA merges the equal causal masks of a chain of blocks into block0's; the fusions
    # of blocks 1 to 3 that read it are listed under block0's layers, marked as
    # belonging to their own block.
    block = examples.transformer_block(length=8, width=16, heads=2, mlp=32, causal=True)
    x = mg.Input(("batch", 8, 16), name="x")
    h = x
    for i in range(4):
        h = block.as_block(f"block{i}")(h)
    by_layer = mg.compile(mg.Graph(x, h, name="chain")).hlo_by_layer(batch=2)
    own = [len(by_layer.own(f"block{i}/attention")) for i in range(4)]
    assert own[0] > 0 and len(set(own)) == 1, own  # every block owns as many operations
    for op in by_layer.shared("block0/attention"):
        assert op.owner != "block0/attention" and "block0/attention" in op.layers
    owners = {op.owner for op in by_layer.shared("block0/attention")}
    assert {"block1/attention", "block2/attention", "block3/attention"} <= owners, owners
    text = str(by_layer)
    assert "[shared: block1/attention's]" in text
