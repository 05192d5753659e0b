"""Every section of ``benchmarks/RESULTS.md`` and how ``benchmarks/run.py`` (``make bench``)
regenerates it.

Sections measured in ``run.py``'s own process (``in_process``: the name of its
``--skip-*`` flag) are written whole from their benchmark's ``markdown()``. The others
run as commands, each a script of ``benchmarks/`` with its arguments (``quick``: the
arguments of ``run.py --quick``), in the environment it needs (``venv``: another virtual
environment's ``bin/python``, e.g. PyTorch's ``.venv-torch``; the command is not run and
the section says so where that environment does not exist). Their output replaces what
stands between the section's markers (``BEGIN`` / ``END``, put just under the heading the
first time); the text after the end marker is kept: the analysis of the run it names.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

BEGIN = "<!-- make bench: begin (benchmarks/run.py writes what stands between these markers) -->"
END = "<!-- make bench: end -->"


def _found(relative: str) -> str | None:
    """``relative`` in the checkout or in the one whose environment runs this."""
    for base in (ROOT, os.path.dirname(sys.prefix)):
        path = os.path.join(base, relative)
        if os.path.exists(path):
            return path
    return None


@dataclasses.dataclass(frozen=True)
class Command:
    """One script of ``benchmarks/`` and its arguments."""

    script: str
    args: tuple[str, ...] = ()
    quick: tuple[str, ...] | None = None   # the arguments under --quick (None: ``args``)
    venv: str | None = None                # another environment, e.g. ".venv-torch"
    markdown: bool = True                  # its output is Markdown (else shown as text)
    needs: str | None = None               # another environment its arguments name

    def python(self) -> str | None:
        """The interpreter that runs it: this one, or ``venv``'s where it exists (in the
        checkout, or beside the environment running this); None where it, or what
        ``needs`` names, does not exist."""
        if self.needs is not None and _found(self.needs) is None:
            return None
        return sys.executable if self.venv is None else _found(os.path.join(self.venv, "bin", "python"))

    def missing(self) -> str:
        return f"{self.venv}/bin/python" if self.venv else str(self.needs)

    def argv(self, quick: bool) -> list[str]:
        return [os.path.join("benchmarks", self.script)] + list(
            self.quick if quick and self.quick is not None else self.args)


@dataclasses.dataclass(frozen=True)
class Section:
    title: str
    in_process: str | None = None          # run.py's --skip-<name> flag
    commands: tuple[Command, ...] = ()


#: jaxonnxruntime's own environment (``make bench-jort`` creates it).
JORT = _found(".venv-jort/bin/python") or ".venv-jort/bin/python"

SECTIONS: dict[int, Section] = {
    1: Section("Training: mlaxgraph vs hand-written JAX, Flax, Haiku, Equinox and Keras 3",
               in_process="train"),
    2: Section("`model.apply` overhead vs a hand-written `jax.jit`", in_process="apply"),
    3: Section("Build, compile and lowering time of deep graphs", in_process="scale"),
    4: Section("Views of deep graphs: summary, DOT, JSON", in_process="views"),
    5: Section("Deep models: repeated blocks on lax.scan, rematerialization, a memory budget",
               in_process="deep"),
    6: Section("Graph surgery, taps (capture, intervene) and the memoised compile",
               in_process="surgery"),
    7: Section("LoRA on the scanned 12-block GPT-2 small: memory and step time against full "
               "fine-tuning", commands=(
                   Command("bench_lora.py", ("--batch", "1", "--seq", "64", "--rounds", "5"),
                           ("--batch", "1", "--seq", "8", "--rounds", "1",
                            "--out", os.devnull), markdown=False),
                   Command("analyze_lora_memory.py", markdown=False))),
    8: Section("Quantization: GPT-2 small in int8, int4 and float8", commands=(
        Command("bench_quantize.py", quick=("int8",), markdown=False),
        Command("analyze_int8_error.py", markdown=False),
        Command("bench_quantize_peers.py", ("--rounds", "15"), ("mlp", "cnn", "--rounds", "2")),
        Command("bench_int8_conv.py", ("--rounds", "7"), ("--rounds", "2", "--calls", "2")))),
    9: Section("The zoo sharded: the Megatron layout on 8 virtual devices", commands=(
        Command("bench_zoo_sharding.py", ("--rounds", "15"), ("--rounds", "2")),)),
    10: Section("ONNX models: mlaxgraph against onnxruntime", in_process="onnx", commands=(
        Command("bench_onnx_jort.py", ("--calls", "5", "--jort", JORT), ("--calls", "2", "--jort", JORT),
                needs=".venv-jort/bin/python"),)),
    11: Section("PyTorch models in: import, compile and per call against torch eager", commands=(
        Command("bench_torch.py", ("--repeats", "10"), ("--repeats", "2"), venv=".venv-torch"),)),
    12: Section("Decoding with the derived key/value cache: GPT-2 small against a hand-written "
                "JAX decoder", in_process="decode"),
    13: Section("Attention written by `to_onnx`: primitive operators (opset 21) against "
                "Attention + RotaryEmbedding (opset 23)", commands=(
                    Command("bench_onnx_attention.py", (), ("--quick",)),)),
    14: Section("The first call, split; when to scan", in_process="first"),
    15: Section("BatchNorm folded into convolutions at inference", commands=(
        Command("bench_fold.py", ("--rounds", "15"), ("--quick",)),)),
}


HEADING = re.compile(r"^## (\d+)\. ", re.M)


def split(text: str) -> tuple[str, dict[int, str]]:
    """RESULTS.md as (what precedes section 1, {number: the section's text})."""
    marks = list(HEADING.finditer(text))
    if not marks:
        return text, {}
    head = text[:marks[0].start()]
    body = {int(m.group(1)): text[m.start():(marks[i + 1].start() if i + 1 < len(marks) else len(text))]
            for i, m in enumerate(marks)}
    return head, body


def run_command(cmd: Command, quick: bool) -> str:
    """Runs one command from the repository root; its output as Markdown, with the
    command, the time it took and the load average, or why it did not run."""
    python = cmd.python()
    shown = " ".join(cmd.argv(quick))
    if python is None:
        return (f"`{shown}`: not run, {cmd.missing()} does not exist here (the "
                f"environment it needs; see the Makefile).")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    interpreter = os.path.relpath(python, ROOT) if python.startswith(ROOT) else python
    load = os.getloadavg()[0]
    started = time.perf_counter()
    print(f"   {interpreter} {shown}", file=sys.stderr, flush=True)
    proc = subprocess.run([python] + cmd.argv(quick), cwd=ROOT, env=env, capture_output=True,
                          text=True)
    took = time.perf_counter() - started
    line = (f"`PYTHONPATH=. {interpreter} {shown}` (took {took:.0f} s; load average "
            f"{load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end)")
    out = proc.stdout.strip()
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        return f"{line}: **failed** (exit {proc.returncode}):\n\n```text\n{out[-3000:]}\n{tail}\n```"
    return f"{line}:\n\n" + (out if cmd.markdown else f"```text\n{out}\n```")


def regenerate(number: int, old: str | None, quick: bool, when: str) -> str:
    """Section ``number`` (one run as commands) with the output of its commands between
    its markers; ``old``: the section's text before (None: a heading only)."""
    section = SECTIONS[number]
    parts = [run_command(c, quick) for c in section.commands]
    block = (f"{BEGIN}\n\nRegenerated by `make bench` on {when}"
             + (" (`--quick`: shorter runs than the analysis below)" if quick else "")
             + ":\n\n" + "\n\n".join(parts) + f"\n\n{END}")
    return insert_block(number, old, block)


def insert_block(number: int, old: str | None, block: str) -> str:
    """``old`` with ``block`` in place of its markers' block, or just under its heading."""
    if old is None:
        return f"## {number}. {SECTIONS[number].title}\n\n{block}\n\n"
    if BEGIN in old and END in old:
        head, _, rest = old.partition(BEGIN)
        return head + block + rest.partition(END)[2]
    heading, _, rest = old.partition("\n")
    return f"{heading}\n\n{block}\n\n{rest.lstrip(chr(10))}"
