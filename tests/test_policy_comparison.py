"""One graph's HLO under two policies: the counts against the texts, counted here with
plain string searches of the test's own."""

import re

import pytest

import mlaxgraph as mg
from mlaxgraph.examples import mlp, residual_cnn
from mlaxgraph.analysis.policy_comparison import count_optimized_hlo, count_stablehlo


def stablehlo_count(text, op):
    return len(re.findall(rf"= \"?stablehlo\.{op}\b", text))


def optimized_count(text, opcode):
    # `%name = <type> opcode(`: the opcode right after the result type, in any computation.
    return sum(1 for line in text.splitlines()
               if re.match(r"\s+(ROOT )?%\S+ = ", line) and re.search(rf"\S {opcode}\(", line))


@pytest.fixture(scope="module")
def comparison():
    return mg.compare_policies(residual_cnn(), ["float32", "bfloat16"], batch=8,
                               inference_mode=True)


def test_counts_are_those_of_the_texts(comparison):
    for label in comparison.labels:
        stablehlo, optimized = comparison.stablehlo[label], comparison.optimized[label]
        counts = comparison.counts[label]
        assert counts["stablehlo"] == {op: stablehlo_count(stablehlo, op)
                                       for op in ("convert", "dot_general", "convolution")}
        assert counts["optimized"] == {op: optimized_count(optimized, op)
                                       for op in ("convert", "dot", "convolution", "fusion")}


def test_bfloat16_adds_converts_and_keeps_the_dots(comparison):
    f32, bf16 = comparison.counts["float32"], comparison.counts["bfloat16"]
    assert f32["stablehlo"]["convert"] == 0
    # The policy's casts (input, around each BatchNorm) and each layer's weight casts.
    casts = [n for _, n in mg.compile(residual_cnn(), mg.Policy.named("bfloat16")).graph.walk()
             if n.op.op_name == "cast"]
    weights = 2 + 1 + 1 + 2  # stem kernel+bias, conv_a, conv_b kernels, logits kernel+bias
    assert bf16["stablehlo"]["convert"] == len(casts) + weights
    for stage in ("stablehlo", "optimized"):
        for op in ("dot_general", "convolution") if stage == "stablehlo" else ("dot", "convolution"):
            assert f32[stage][op] == bf16[stage][op]
    assert f32["stablehlo"]["convolution"] == 3 and f32["stablehlo"]["dot_general"] == 1


def test_table_prints_side_by_side(comparison):
    text = str(comparison)
    lines = text.splitlines()
    assert lines[0] == 'HLO of "residual_cnn" at batch=8 under 2 policies'
    assert lines[1].split() == ["float32", "bfloat16"]
    row = next(line for line in lines if line.startswith("StableHLO"))
    assert row.split() == ["StableHLO", "convert", "0",
                           str(comparison.counts["bfloat16"]["stablehlo"]["convert"])]
    fusion = next(line for line in lines if line.split()[:1] == ["fusion"])
    assert fusion.split()[1:] == [str(comparison.counts[label]["optimized"]["fusion"])
                                  for label in comparison.labels]


def test_policies_given_as_objects_or_labelled():
    graph = mlp(16, (32,), 4)
    policy = mg.Policy(compute_dtype="bfloat16", output_dtype="float32")
    labelled = mg.compare_policies(graph, {"fp32": mg.Policy(), "mixed": policy}, batch=2)
    assert labelled.labels == ("fp32", "mixed")
    unlabelled = mg.compare_policies(graph, [mg.Policy(), policy], batch=2)
    assert unlabelled.labels == ("float32", "bfloat16->float32")
    assert unlabelled.counts["bfloat16->float32"] == labelled.counts["mixed"]
    with pytest.raises(mg.DTypeError, match="label"):
        mg.compare_policies(graph, ["bfloat16", "bfloat16"], batch=2)
    with pytest.raises(mg.ShapeError, match="batch=..."):
        mg.compare_policies(graph, ["float32", "bfloat16"])


def test_counters_read_tuples_and_generic_forms():
    hlo = ("  %f = (f32[2]{0}, /*index=1*/bf16[2]{0}) fusion(%a), kind=kLoop, calls=%c\n"
           "  ROOT %c.1 = bf16[2]{0} convert(%b)\n  %d = f32[2,2]{1,0} dot(%x, %y)\n")
    assert count_optimized_hlo(hlo) == {"convert": 1, "dot": 1, "convolution": 0, "fusion": 1}
    stable = ('%0 = stablehlo.convert %a : (tensor<2xf32>) -> tensor<2xbf16>\n'
              '%1 = "stablehlo.convolution"(%x, %k) <{...}> : ...\n'
              '%2 = stablehlo.dot_general %x, %y\n')
    assert count_stablehlo(stable) == {"convert": 1, "dot_general": 1, "convolution": 1}
