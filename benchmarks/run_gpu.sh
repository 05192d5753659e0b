#!/usr/bin/env bash
# The benchmarks' GPU figures, on a machine whose python3 has a CUDA jax, optax, Flax and
# Equinox (Haiku and Keras 3 are run where installed), and PyTorch, transformers and
# PEFT for the live PEFT check. Each part has its own time limit; what each writes goes
# to $OUT (default /tmp/mlaxgraph-gpu). Run from the repository root:
#   OUT=/tmp/gpu bash benchmarks/run_gpu.sh
set -u
OUT=${OUT:-/tmp/mlaxgraph-gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
PY=${PY:-python3}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/machine.txt"
$PY - <<'EOF' | tee -a "$OUT/machine.txt"
import importlib, platform, jax
print("python", platform.python_version(), "| devices", jax.devices())
for name in ("jax", "jaxlib", "optax", "flax", "equinox", "haiku", "keras", "torch", "transformers", "peft"):
    try:
        print(name, importlib.import_module(name).__version__)
    except Exception as e:  # a peer that is not installed is left out of the tables
        print(name, "missing:", type(e).__name__)
EOF

# PEFT's own files against mlaxgraph's reader and writer (jax on the CPU: the check is
# of the files and the numbers, not of the device)
JAX_PLATFORMS=cpu timeout 120 $PY -m pytest -q -p no:cacheprovider tests_torch/test_peft_live.py \
  2>&1 | tail -n 15 | tee "$OUT/peft_live.txt"

# training side by side with the peers, and LoRA against full fine-tuning, on the GPU
JAX_PLATFORMS=cuda timeout 260 $PY benchmarks/bench_train.py --quick 2>&1 | tee "$OUT/train.txt" | tail -n 5
JAX_PLATFORMS=cuda timeout 150 $PY benchmarks/bench_lora.py --seq 64 --loss-chunk 16 --rounds 10 \
  --out "$OUT/lora.json" > "$OUT/lora.txt" 2>&1
tail -n 3 "$OUT/lora.txt"

# what the LoRA step's temporaries are (XLA's buffer assignment), and the forms of the
# tied head's vocabulary-wide contraction that might leave out the padded copy of the table
JAX_PLATFORMS=cuda timeout 200 $PY benchmarks/lora_buffers.py --seq 64 --loss-chunk 16 --remat none,full \
  --top 6 > "$OUT/lora_buffers.txt" 2>&1
JAX_PLATFORMS=cuda timeout 120 $PY benchmarks/vocab_contraction.py --rounds 50 > "$OUT/vocab.txt" 2>&1
tail -n 8 "$OUT/vocab.txt"
