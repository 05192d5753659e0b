"""Runs the benchmark suite, prints Markdown and writes ``benchmarks/RESULTS.md``.

    make bench                                   # = .venv/bin/python benchmarks/run.py
    .venv/bin/python benchmarks/run.py --quick   # a short run (a few minutes)
    .venv/bin/python benchmarks/run.py --skip-train   # without the training comparison
    .venv/bin/python benchmarks/run.py --sections 8,13   # only these sections; the others
                                                         # are kept from RESULTS.md

Every section of RESULTS.md has its benchmark here (``sections.SECTIONS``): the ones below
run in this process; sections 7 (LoRA), 8 (quantization), 9 (the zoo sharded), 10's
jaxonnxruntime comparison, 11 (PyTorch models, in ``.venv-torch`` where it exists), 13
(ONNX attention) and 15 (BatchNorm folded at inference) run as their scripts, whose
output replaces the generated block of the section (``sections.regenerate``).

Benchmarks:
  bench_train           training side by side: mlaxgraph, hand-written JAX, Flax linen,
                        Flax NNX, Haiku, Equinox and Keras 3 on five models (steady step, per-call
                        overhead, first call, memory, HLO counts, fused multi-step); the
                        peers come from the ``bench`` extra (``pip install -e .[bench]``)
  bench_apply_overhead  per-call time of ``model.apply`` vs a hand-written ``jax.jit``
                        over the same params (paired, interleaved rounds), and the
                        first-call (trace + compile) time of both
  bench_deep            deep models: gradient compile time against depth (scanned, unscanned,
                        hand-written), init, the step and remat's peak memory, the planner
  bench_compile_scale   build + passes + ``mg.compile`` + lowering (trace, StableHLO) time
                        of 1,000 / 10,000 / 50,000 layer graphs, per layer; profiled with
                        cProfile when the time per layer grows with the size
  bench_surgery         ``select`` / ``replace`` / ``insert_after`` on 1,000 / 3,000 / 10,000
                        layer graphs (flat and nested) and on GPT-2 small, ``mg.compile``
                        twice on one graph, and ``apply``'s ``capture`` / ``intervene`` per
                        call on a scanned 12-block GPT-2 against plain ``apply``
  bench_first_call      the first call of the train step split by JAX's AOT API (trace,
                        lower, XLA compile) for mlaxgraph, hand-written JAX and the peers
  bench_scan_rule       the first and the steady train step scanned against unscanned,
                        over run lengths and block sizes: the rule of ``scan_blocks=True``
  bench_onnx            ResNet-50 and GPT-2 small written by ``to_onnx``, read back by
                        ``mg.from_onnx``: import, compile and per-call time against
                        onnxruntime on the same file
  bench_decode          GPT-2 small decoding: the step and a whole ``generate`` against a
                        hand-written JAX KV-cache decoder, and a whole greedy ``generate``
                        against PyTorch's ``transformers`` and keras_hub (JAX backend), each
                        in its own environment (``.venv-torch``, ``.venv-kerashub``) when
                        there; and what Hugging Face's logits processors cost per token
  bench_logits_processors  ``mg.generate`` with ``RepetitionPenalty``, ``NoRepeatNGram``,
                        ``BadWords``, ``MinNewTokens`` against greedy, GPT-2 small
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time

import _common  # noqa: F401  (sys.path and JAX_PLATFORMS)
import bench_apply_overhead
import bench_compile_scale
import bench_decode
import bench_deep
import bench_first_call
import bench_logits_processors
import bench_onnx
import bench_scan_rule
import bench_see_save
import bench_surgery
import bench_train
import sections as S
from _common import fmt_time, md_table

HERE = os.path.dirname(os.path.abspath(__file__))


def machine() -> dict:
    import jax
    import jaxlib
    import numpy

    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:
        affinity = os.cpu_count()
    libs = ", ".join(f"{k} {v}" for k, v in bench_train.versions().items() if k not in ("jax", "jaxlib"))
    return {
        "libs": libs,
        "nproc": affinity, "cpu_count": os.cpu_count(), "cpu": cpu,
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "jax": jax.__version__, "jaxlib": jaxlib.__version__, "numpy": numpy.__version__,
        "os": f"{platform.system()} {platform.release()} {platform.machine()}",
        "devices": ", ".join(str(d) for d in jax.devices()),
    }


def loadavg() -> str:
    try:
        return " ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "n/a"


def _merge_goals(head: str, goals: list[list[str]]) -> str:
    """The Goals table of ``head`` with ``goals``' rows in place of those of the same
    goal (first cell), the new ones after its last row."""
    lines = head.split("\n")
    rows = [i for i, line in enumerate(lines) if line.startswith("| ")]
    for goal in goals:
        row = md_table(["goal", "measured", "status"], [goal]).split("\n")[-1]
        same = [i for i in rows if lines[i].startswith(f"| {goal[0]} |")]
        if same:
            lines[same[0]] = row
        elif rows:
            rows.append(rows[-1] + 1)
            lines.insert(rows[-1], row)
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="mlaxgraph benchmark suite")
    p.add_argument("--quick", action="store_true", help="a short run: fewer rounds, trials and sizes")
    p.add_argument("--skip-train", action="store_true",
                   help="skip the training benchmark (mlaxgraph vs hand-written JAX and the peers)")
    p.add_argument("--train-models", type=lambda v: tuple(v.split(",")),
                   help="comma-separated models of the training benchmark (default: all five)")
    p.add_argument("--skip-apply", action="store_true", help="skip the apply-overhead benchmark")
    p.add_argument("--skip-scale", action="store_true", help="skip the compile-scale benchmark")
    p.add_argument("--skip-views", action="store_true",
                   help="skip the summary/to_dot/to_json scale benchmark")
    p.add_argument("--skip-deep", action="store_true",
                   help="skip the deep-models benchmark (compile time against depth, remat, planner)")
    p.add_argument("--skip-surgery", action="store_true",
                   help="skip the graph surgery and taps benchmark")
    p.add_argument("--skip-onnx", action="store_true",
                   help="skip the ONNX models against onnxruntime (needs onnxruntime, the bench extra)")
    p.add_argument("--skip-decode", action="store_true",
                   help="skip decoding (GPT-2 small against a hand-written decoder and the peers)")
    p.add_argument("--skip-first", action="store_true",
                   help="skip the first-call split and the scan rule's sweep")
    p.add_argument("--sections", type=lambda v: {int(n) for n in v.split(",")},
                   help="comma-separated numbers of the sections of RESULTS.md to regenerate "
                        "(default: all); the others, the header and the other goals are kept "
                        "from the existing file")
    p.add_argument("--skip-commands", action="store_true",
                   help="skip the sections run as commands (7, 8, 9, 11, 13, 15, and 10's "
                        "jaxonnxruntime comparison)")
    p.add_argument("--budget", type=float, default=60.0,
                   help="compile-scale: skip the passes of a size projected to take longer than "
                        "this many seconds (default 60; 'inf' runs all)")
    p.add_argument("--profile", choices=("auto", "always", "never"), default="auto",
                   help="cProfile the compiler when its time per layer grows with the size (auto)")
    p.add_argument("--output", default=os.path.join(HERE, "RESULTS.md"),
                   help="where to write the Markdown report")
    args = p.parse_args(argv)
    if args.sections is not None:
        unknown = args.sections - set(S.SECTIONS)
        if unknown:
            p.error(f"no section {sorted(unknown)} in RESULTS.md (known: {sorted(S.SECTIONS)})")
        for number, section in S.SECTIONS.items():  # a section not asked for is skipped
            if section.in_process and number not in args.sections:
                setattr(args, f"skip_{section.in_process}", True)

    argv_used = sys.argv[1:] if argv is None else list(argv)
    python = os.path.relpath(sys.executable, os.getcwd()) if sys.executable else "python"
    command = " ".join([python, os.path.relpath(os.path.abspath(__file__), os.getcwd())] + argv_used)
    started = datetime.datetime.now(datetime.timezone.utc)
    load_before = loadavg()
    t_start = time.perf_counter()
    info = machine()

    sections: list[str] = []
    goals: list[list[str]] = []
    loads: list[str] = []

    if not args.skip_train:
        print("== training: mlaxgraph vs hand-written JAX and the peers ...", file=sys.stderr, flush=True)
        res = bench_train.run(quick=args.quick, models=args.train_models)
        loads.append(f"after training: {loadavg()}")
        for g in bench_train.summary(res)["goals"]:
            if "measured" in g:  # the goals against the peers: one row per model
                goals.append([g["goal"], g["measured"], "**met**" if g["met"] else
                              f"**MISSED** (worst: {g['where']}, by {g['by']:.3f})"])
                continue
            goals.append([g["goal"], f"{g['value']:.3f} (worst: {g['where']})",
                          "**met**" if g["met"] else f"**MISSED** by {100 * (g['value'] / bench_train.GOALS[g['key']] - 1):.1f}%"])
        sections.append("## 1. Training: mlaxgraph vs hand-written JAX, Flax, Haiku, Equinox and Keras 3\n\n"
                        + bench_train.markdown(res)
                        + "\n\n### Goals of the training benchmark: by how much, why, what would close it\n\n"
                        + bench_train.analysis(res))

    if not args.skip_apply:
        print("== apply overhead ...", file=sys.stderr, flush=True)
        res = bench_apply_overhead.run(quick=args.quick)
        s = bench_apply_overhead.summary(res)
        m, q1, q3 = s["ratio"]
        lo, hi = s["ratio_ci"]
        goals.append([
            "apply per call: mlaxgraph / hand-written `jax.jit` <= 1.05",
            f"{m:.3f} (median of {res['config']['rounds']} per-round ratios; 95% CI of the median "
            f"{lo:.3f} – {hi:.3f}; IQR {q1:.3f} – {q3:.3f}); "
            f"{fmt_time(s['mlaxgraph'][0])} vs {fmt_time(s['hand'][0])} per call",
            "**met**" if s["goal_met"] else "**MISSED**"])
        loads.append(f"after apply overhead: {loadavg()}")
        sections.append("## 2. `model.apply` overhead vs a hand-written `jax.jit`\n\n"
                        + bench_apply_overhead.markdown(res))

    if not args.skip_scale:
        print("== compile scale ...", file=sys.stderr, flush=True)
        res = bench_compile_scale.run(quick=args.quick, budget=args.budget)
        rows = res["rows"]
        text = ("## 3. Build, compile and lowering time of deep graphs\n\n"
                + bench_compile_scale.markdown(res))
        goal_n, goal_s = res["goal"]
        g = [r for r in rows if r["n"] == goal_n and not r["skipped"]]
        if g:
            t = g[0]["build"] + g[0]["passes"]
            goals.append([f"build + passes, {goal_n:,} layers < {goal_s:g} s",
                          f"{fmt_time(t)} wall, {fmt_time(g[0]['build_passes_cpu'])} CPU (build "
                          f"{fmt_time(g[0]['build'])}, passes {fmt_time(g[0]['passes'])}; "
                          f"`mg.compile` {fmt_time(g[0]['compile'])})",
                          "**met**" if t < goal_s else "**MISSED**"])
        for r in rows:
            if r["skipped"]:
                text += (f"\n\n{r['n']:,} layers: the passes were not run, their time projected "
                         f"from the smaller sizes (t = a·N + b·N²) is ≈ {fmt_time(r['projected_passes'])}, "
                         f"over the budget of {args.budget:g} s (`--budget inf` runs them). "
                         f"The build of {r['n']:,} layers was measured: {fmt_time(r['build'])}.")
        low = [r for r in rows if "trace" in r]
        if len(low) >= 2:
            per = [bench_compile_scale.pipeline_seconds(r) / r["n"] for r in (low[0], low[-1])]
            goals.append([f"build + passes + lowering grows linearly, {low[0]['n']:,} to {low[-1]['n']:,} "
                          f"layers (build + `mg.compile` + trace + lower, GC off; time per layer x <= 1.5)",
                          f"{per[0] * 1e6:.0f} µs/layer to {per[1] * 1e6:.0f} µs/layer: x{per[1] / per[0]:.2f}",
                          "**met**" if per[1] / per[0] <= 1.5 else "**MISSED**"])
        measured = [r for r in rows if not r["skipped"]]
        growth = None
        if len(measured) >= 2:
            a, b = measured[0], measured[-1]
            growth = (b["passes"] / b["n"]) / (a["passes"] / a["n"])
            text += (f"\n\nPasses time per layer grows x{growth:.1f} from {a['n']:,} to "
                     f"{b['n']:,} layers (x1.0 would be linear).")
        do_profile = args.profile == "always" or (args.profile == "auto" and growth is not None
                                                   and growth > 1.5)
        if do_profile:
            print("== profiling ...", file=sys.stderr, flush=True)
            n1, n2 = (500, 2_000) if args.quick else (1_000, 4_000)
            small = bench_compile_scale.profile(n1)
            large = bench_compile_scale.profile(n2)
            text += ("\n\n### Profile of the passes\n\n"
                     + bench_compile_scale.profile_markdown(small, large))
            nb = 2_000 if args.quick else 10_000
            build = bench_compile_scale.profile(nb, what="build")
            text += (f"\n\n### Profile of the build ({nb:,} layers, total {build['total']:.2f} s "
                     f"CPU time under the profiler), by cumulative time\n\n"
                     + bench_compile_scale.profile_table(build, top=14))
        loads.append(f"after compile scale: {loadavg()}")
        sections.append(text)

    if not args.skip_views:
        print("== summary / to_dot / to_json scale ...", file=sys.stderr, flush=True)
        res = bench_see_save.run(quick=args.quick)
        goals.append(bench_see_save.goal(res))
        sections.append("## 4. Views of deep graphs: summary, DOT, JSON\n\n"
                        + bench_see_save.markdown(res))

    if not args.skip_deep:
        print("== deep models: compile time against depth, remat, planner ...", file=sys.stderr, flush=True)
        depths = (2, 4, 8, 16, 32) if args.quick else (2, 4, 8, 16, 32, 64)
        res = bench_deep.run(depths, unscanned_max=16 if args.quick else 32, step_depth=16 if args.quick else 32)
        for goal, measured, met in bench_deep.goals(res):
            goals.append([goal, measured, "**met**" if met else "**MISSED**"])
        sections.append("## 5. Deep models: repeated blocks on lax.scan, rematerialization, a memory "
                        "budget\n\nA chain of N pre-norm Transformer blocks (length 64, width 128, 4 heads, "
                        "MLP 512, batch 8; `benchmarks/bench_deep.py`), against the same model written "
                        "by hand.\n\n" + bench_deep.markdown(res))
        loads.append(f"after deep models: {loadavg()}")

    if not args.skip_surgery:
        print("== graph surgery, taps and the memoised compile ...", file=sys.stderr, flush=True)
        res = bench_surgery.run(quick=args.quick)
        goals.extend(res["goals"])
        sections.append("## 6. Graph surgery, taps (capture, intervene) and the memoised compile\n\n"
                        + bench_surgery.markdown(res))
        loads.append(f"after surgery: {loadavg()}")

    if not args.skip_onnx:
        print("== ONNX models against onnxruntime ...", file=sys.stderr, flush=True)
        table = bench_onnx.run(quick=args.quick)
        sections.append("## 10. ONNX models: mlaxgraph against onnxruntime\n\n"
                        + bench_onnx.__doc__.split("\n\n", 1)[1].split("Run alone")[0]
                        + table + "\n")
        loads.append(f"after onnx: {loadavg()}")

    if not args.skip_decode:
        print("== decoding: GPT-2 small against a hand-written decoder and the peers ...",
              file=sys.stderr, flush=True)
        res = bench_decode.run(quick=args.quick)
        goals.extend(bench_decode.goals(res))
        sections.append("## 12. Decoding with the derived key/value cache: GPT-2 small against a "
                        "hand-written JAX decoder, PyTorch and keras_hub\n\n"
                        + bench_decode.__doc__.split("\n\n", 1)[1].split("Run alone")[0]
                        + bench_decode.markdown(res) + "\n\n### Hugging Face's logits processors "
                        "in `generate`\n\n`benchmarks/bench_logits_processors.py`:\n\n"
                        + "\n\n".join(bench_logits_processors.run(3 if args.quick else 9, batch)
                                      for batch in (1, 8)) + "\n")
        loads.append(f"after decoding: {loadavg()}")

    if not args.skip_first:
        print("== first call: trace, lower, compile; the scan rule ...", file=sys.stderr, flush=True)
        first = bench_first_call.run(quick=args.quick)
        goals.extend(bench_first_call.goals(first))
        rule = bench_scan_rule.run(quick=args.quick)
        goals.extend(bench_scan_rule.goals(rule))
        sections.append("## 14. The first call, split; when to scan\n\n"
                        + bench_first_call.__doc__.split("\n\n")[1] + "\n\n"
                        + bench_first_call.markdown(first) + "\n\n"
                        + bench_first_call.FINDINGS + "\n\n### When to scan\n\n"
                        + bench_scan_rule.markdown(rule))
        loads.append(f"after first call and scan rule: {loadavg()}")

    when = started.strftime("%Y-%m-%d %H:%M UTC")
    try:
        with open(args.output, encoding="utf-8") as f:
            old_head, old_sections = S.split(f.read())
    except FileNotFoundError:
        old_head, old_sections = "", {}
    new_sections = {int(S.HEADING.match(text).group(1)): text.rstrip("\n") + "\n\n"
                    for text in sections}
    if not args.skip_commands:
        for number, section in S.SECTIONS.items():
            if section.commands and (args.sections is None or number in args.sections):
                print(f"== section {number}: {section.title} ...", file=sys.stderr, flush=True)
                new_sections[number] = S.regenerate(
                    number, new_sections.get(number, old_sections.get(number)), args.quick, when)
                loads.append(f"after section {number}: {loadavg()}")
    body = "".join(new_sections.get(n, old_sections.get(n, "")).rstrip("\n") + "\n\n"
                   for n in sorted(set(new_sections) | set(old_sections)))

    elapsed = time.perf_counter() - t_start
    if args.sections is not None and old_head:
        # Only some sections: the header and the other goals stay; this run's goals
        # replace the rows of the same goal.
        report = (_merge_goals(old_head, goals).replace(
            "\n## Goals", f"- Section{'s' if len(args.sections) > 1 else ''} "
            f"{', '.join(map(str, sorted(args.sections)))} regenerated on "
            f"{when} (took {elapsed:.0f} s) by `{command}`; load average at start {load_before}, "
            f"at end {loadavg()}.\n\n## Goals", 1) + body).rstrip("\n") + "\n"
        print(report)
        with open(args.output, "w") as f:
            f.write(report)
        print(f"wrote {os.path.relpath(args.output)}", file=sys.stderr)
        return 0
    header = [
        "# mlaxgraph benchmark results", "",
        f"- Date: {started.strftime('%Y-%m-%d %H:%M UTC')} (took {elapsed:.0f} s)",
        f"- Command: `make bench` (runs `.venv/bin/python benchmarks/run.py`); this run: `{command}`",
        f"- Machine: {info['nproc']} CPUs available (nproc; os.cpu_count() = {info['cpu_count']}), "
        f"{info['cpu']}; {info['os']}",
        f"- Software: {info['python']}, jax {info['jax']}, jaxlib {info['jaxlib']}, "
        f"numpy {info['numpy']}, {info['libs']}; devices: {info['devices']}",
        f"- Load average (1, 5, 15 min) at start: {load_before}; "
        + "".join(f"{x}; " for x in loads) + f"at end: {loadavg()}. The machine is "
        f"shared: absolute times are noisy, paired ratios (systems interleaved in the same "
        f"rounds) less so.",
        "",
    ]
    if goals:
        header += ["## Goals", "", md_table(["goal", "measured", "status"], goals), ""]
    report = ("\n".join(header) + "\n" + body).rstrip("\n") + "\n"
    print(report)
    with open(args.output, "w") as f:
        f.write(report)
    print(f"wrote {os.path.relpath(args.output)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
