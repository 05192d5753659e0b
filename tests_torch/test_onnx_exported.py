"""Models exported by ``torch.onnx.export`` (torchvision's ResNet-18, ResNet-50 and
MobileNet V3 small, Hugging Face's GPT-2 and BERT from random configs) through mg.from_onnx,
against onnxruntime, and their module hierarchy as blocks. The models and the
comparison are benchmarks/onnx_exported.py's, which writes the table in docs/onnx.md."""

from __future__ import annotations

import importlib.util
import os

import pytest

_spec = importlib.util.spec_from_file_location(
    "onnx_exported", os.path.join(os.path.dirname(__file__), "..", "benchmarks", "onnx_exported.py"))
exported = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(exported)


@pytest.mark.parametrize("name", sorted(exported.MODELS))
def test_exported_model_matches_onnxruntime_and_shows_its_modules(name, tmp_path):
    row = exported.check(name, str(tmp_path))  # asserts the outputs match onnxruntime's
    assert row["magnitude"] > 1e-3  # a comparison of something
    walked = dict(row["graph"].walk())
    assert row["scope_paths"] <= set(walked), row["scope_paths"] - set(walked)  # every module
    assert row["blocks"] >= 12
    ops = {node.op.op_name for _, node in walked.items()}
    assert "onnx.Identity" not in ops  # the exporter's Identity of a weight is that weight
    if name in ("gpt2", "bert"):  # MatMul / Gemm + Add of weights are Linear layers
        assert "linear" in ops and "onnx.Gemm" not in ops and "onnx.LayerNormalization" not in ops
