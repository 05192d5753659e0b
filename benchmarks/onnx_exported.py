"""Real models exported by ``torch.onnx.export`` through mg.from_onnx, against
onnxruntime (needs the torch-test extra, which brings onnx and onnxruntime into
.venv-torch):

    nice .venv-torch/bin/python benchmarks/onnx_exported.py [--folder DIR] [--only NAME ...] [--write]

torchvision's ResNet-18, ResNet-50 and MobileNet V3 small (1 x 3 x 224 x 224) and Hugging Face's
GPT-2 and BERT from small random configs (2 x 16 tokens), random weights (seed 0), eval
mode, are written as ONNX files by torch's TorchScript exporter (opset 17; the files are
not committed: ``--folder``, a temporary one by default). Each is read with
``mg.from_onnx``, compiled and run on the input the file was exported with; its outputs
are compared with onnxruntime's (rtol 1e-4, atol 1e-4 times the output's largest magnitude), and
its blocks with the module paths the exporter wrote into the node names
(``/layer1/layer1.0/conv1/Conv``). ``--write`` puts the table into docs/onnx.md between
its markers.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import warnings

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # _common, when imported by a test
from _common import write_between  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import mlaxgraph as mg  # noqa: E402

DOC = os.path.join(os.path.dirname(__file__), "..", "docs", "onnx.md")
BEGIN, END = "<!-- exported models table: begin -->", "<!-- exported models table: end -->"


def _resnet18():
    import torchvision
    return torchvision.models.resnet18(), (torch.randn(1, 3, 224, 224),), ["input"], ["logits"]


def _resnet50():
    import torchvision
    return torchvision.models.resnet50(), (torch.randn(1, 3, 224, 224),), ["input"], ["logits"]


def _mobilenet_v3_small():
    import torchvision
    return torchvision.models.mobilenet_v3_small(), (torch.randn(1, 3, 224, 224),), ["input"], ["logits"]


class _Logits(torch.nn.Module):
    """A Hugging Face model returning its first output as a tensor (the exporter
    writes tensors, not ModelOutput objects)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids):
        # an attention mask of ones: without one, transformers looks for packed
        # sequences in the position ids with aten::diff, which the exporter lacks
        return self.model(input_ids=ids, attention_mask=torch.ones_like(ids))[0]


def _gpt2():
    import transformers
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=500, n_positions=64,
                                     use_cache=False)
    return _Logits(transformers.GPT2LMHeadModel(config)), (torch.randint(0, 500, (2, 16)),), \
        ["input_ids"], ["logits"]


def _bert():
    import transformers
    config = transformers.BertConfig(vocab_size=500, hidden_size=64, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=128,
                                     max_position_embeddings=64)
    return _Logits(transformers.BertModel(config)), (torch.randint(0, 500, (2, 16)),), \
        ["input_ids"], ["last_hidden_state"]


MODELS = {"resnet18": _resnet18, "resnet50": _resnet50, "mobilenet_v3_small": _mobilenet_v3_small, "gpt2": _gpt2,
          "bert": _bert}


def _randomize_norms(module) -> None:
    """Random BatchNorm statistics and affine weights: at their initial values (mean 0,
    variance 1, scale 1, bias 0) MobileNet's output is of the order of 1e-9 and any
    comparison holds."""
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                m.running_mean.normal_(0.0, 0.1)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_(0.0, 0.1)


def export(name: str, folder: str) -> tuple[str, tuple]:
    """Writes model ``name`` as ``<folder>/<name>.onnx``; returns the path and its
    example inputs as NumPy arrays."""
    torch.manual_seed(0)
    module, args, inputs, outputs = MODELS[name]()
    _randomize_norms(module)
    module = module.eval()
    path = os.path.join(folder, f"{name}.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, path, input_names=inputs, output_names=outputs,
                          opset_version=17, dynamo=False)
    return path, tuple(a.numpy() for a in args)


def scope_paths(path: str) -> set[str]:
    """The module paths the exporter wrote into the node names, as block paths
    (``/layer1/layer1.0/conv1/Conv`` gives ``layer1`` and ``layer1/layer1.0``...)."""
    import onnx

    found = set()
    for node in onnx.load(path, load_external_data=False).graph.node:
        parts = [p for p in node.name.split("/") if p][:-1]
        for i in range(1, len(parts) + 1):
            found.add("/".join(parts[:i]))
    return found


def check(name: str, folder: str) -> dict:
    import onnxruntime as ort

    path, args = export(name, folder)
    start = time.perf_counter()
    graph, params, state = mg.from_onnx(path)
    model = mg.compile(graph)
    ours, _ = model.apply(params, state, *[jnp.asarray(a) for a in args], inference_mode=True)
    ours = ours if isinstance(ours, tuple) else (ours,)
    seconds = time.perf_counter() - start
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    theirs = session.run(None, {i.name: a for i, a in zip(session.get_inputs(), args)})
    errors, magnitude = [], max(float(np.abs(b).max()) for b in theirs)
    for a, b in zip(ours, theirs):
        a = np.asarray(a)
        scale = float(np.abs(b).max()) or 1.0
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4 * scale)
        errors.append(float(np.abs(a - b).max()))
    paths = {p for p, _ in graph.walk()}
    blocks = {p for p, node in graph.walk() if hasattr(node.op, "graph")}
    scopes = scope_paths(path)
    return {"model": name, "nodes": len(_onnx_nodes(path)), "blocks": len(blocks),
            "scopes": len(scopes), "shown": len(scopes & paths), "error": max(errors),
            "magnitude": magnitude, "seconds": seconds, "graph": graph, "paths": paths,
            "scope_paths": scopes}


def _onnx_nodes(path: str) -> list:
    import onnx
    return list(onnx.load(path, load_external_data=False).graph.node)


def table(rows: list[dict]) -> str:
    lines = ["| model | ONNX nodes | module scopes | drawn (blocks) | largest output | "
             "max abs error vs onnxruntime | import + compile + run s |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['nodes']} | {r['scopes']} | {r['shown']} ({r['blocks']}) | "
                     f"{r['magnitude']:.2g} | {r['error']:.1e} | {r['seconds']:.1f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", help="where the ONNX files go (a temporary folder by default)")
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--write", action="store_true", help="put the table into docs/onnx.md")
    args = parser.parse_args()
    names = args.only or list(MODELS)
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.folder or tmp
        os.makedirs(folder, exist_ok=True)
        rows = [check(name, folder) for name in names]
    import onnx
    import onnxruntime
    text = (f"{len(rows)} of {len(rows)} models match onnxruntime; torch {torch.__version__}, "
            f"onnx {onnx.__version__}, onnxruntime {onnxruntime.__version__}, command: "
            f"`nice .venv-torch/bin/python benchmarks/onnx_exported.py --write`.\n\n{table(rows)}")
    print(text)
    if args.write:
        write_between(DOC, BEGIN, END, text)


if __name__ == "__main__":
    main()
