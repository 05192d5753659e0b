"""The core ATen operator set (the overloads torch tags ``core``: what
``ExportedProgram.run_decompositions()`` leaves) against what the ``aten`` family and
from_torch's module layers read; needs torch:

    .venv-torch/bin/python benchmarks/torch_coverage.py [--write]

``--write`` puts the table into docs/torch.md between its markers.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from _common import write_between  # noqa: E402
import mlaxgraph as mg  # noqa: E402

DOC = os.path.join(os.path.dirname(__file__), "..", "docs", "torch.md")
BEGIN, END = "<!-- core aten table: begin -->", "<!-- core aten table: end -->"


def core_ops() -> list[str]:
    found = set()
    for name in dir(torch.ops.aten):
        try:
            packet = getattr(torch.ops.aten, name)
            overloads = packet.overloads()
        except (AttributeError, RuntimeError):
            continue
        for overload in overloads:
            op = getattr(packet, overload)
            if torch.Tag.core in getattr(op, "tags", ()):
                found.add(f"aten.{name}.{overload}")
    return sorted(found)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    ours = set(mg.aten.supported_ops())
    ops = core_ops()
    have = [op for op in ops if op in ours]
    lines = [f"{len(have)} of {len(ops)} core ATen overloads are supported "
             f"({100 * len(have) / len(ops):.0f}%; torch {torch.__version__}); "
             f"{len(ours)} operators in all (`mg.aten.supported_ops()`). Command: "
             f"`.venv-torch/bin/python benchmarks/torch_coverage.py --write`.", "",
             "| core ATen overload | supported |", "|---|---|"]
    lines += [f"| `{op}` | {'yes' if op in ours else 'no'} |" for op in ops]
    text = "\n".join(lines)
    print(lines[0])
    if args.write:
        write_between(DOC, BEGIN, END, text)


if __name__ == "__main__":
    main()
