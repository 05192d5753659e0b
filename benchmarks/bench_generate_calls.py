"""``mg.generate`` and ``mg.generate_stream`` per call on a 4-block GPT-2 (width 256,
batch 2, 32 new tokens, prompts of 5 to 13 tokens: one bucket), this checkout against
another one (a ``git worktree`` of an older commit, given as the argument), each in its
own process, interleaved three times; medians of the per-process medians. Also a
stream of a prompt length not seen before (in the same bucket).

Run: ``PYTHONPATH=. .venv/bin/python benchmarks/bench_generate_calls.py /tmp/wt_old``
"""
import sys, time, subprocess, json, os
code = r'''
import sys, time, json, numpy as np, jax, jax.numpy as jnp
sys.path.insert(0, sys.argv[1])
import mlaxgraph as mg
assert mg.__file__.startswith(sys.argv[1]), mg.__file__
g = mg.models.gpt2({"n_layer": 4, "n_embd": 256, "n_head": 4, "vocab_size": 4096, "n_positions": 512})
model = mg.compile(g)
params, state = model.init(jax.random.key(0))
rng = np.random.default_rng(0)
lengths = [5, 9, 13, 7, 11]
def run_gen(L):
    ids = rng.integers(0, 4096, (2, L))
    t = time.perf_counter(); out = mg.generate(model, params, state, ids, max_new_tokens=32); jax.block_until_ready(out); return time.perf_counter() - t
def run_stream(L):
    ids = rng.integers(0, 4096, (2, L))
    t = time.perf_counter(); toks = list(mg.generate_stream(model, params, state, ids, max_new_tokens=32)); jax.block_until_ready(toks[-1]); return time.perf_counter() - t
for L in lengths: run_gen(L); run_stream(L)   # warm: the old code compiles per length
res = {"gen": [], "stream": []}
for r in range(3):
    for L in lengths:
        res["gen"].append(run_gen(L)); res["stream"].append(run_stream(L))
first = {}
ids = rng.integers(0, 4096, (2, 6))
t = time.perf_counter(); list(mg.generate_stream(model, params, state, ids, max_new_tokens=32)); first["stream_new_length"] = time.perf_counter() - t
print(json.dumps({k: float(np.median(v)) for k, v in res.items()} | first))
'''
results = {"new": [], "old": []}
for i in range(3):
    for name, path in (("new", os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), ("old", sys.argv[1])):
        out = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True)
        if out.returncode: print(out.stderr[-2000:]); sys.exit(1)
        results[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(name, results[name][-1], flush=True)
import statistics as st
for k in results["new"][0]:
    n = st.median(r[k] for r in results["new"]); o = st.median(r[k] for r in results["old"])
    print(f"{k}: new {n*1e3:.1f} ms, old {o*1e3:.1f} ms, new/old {n/o:.3f}")
