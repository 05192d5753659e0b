"""The peers of ``bench_decode.py``, each run by the interpreter that has it and
driven line by line from ``bench_decode.py`` so that its rounds alternate with
mlaxgraph's:

  torch      Hugging Face ``transformers``' ``GPT2LMHeadModel.generate`` (``.venv-torch``):
             ``GPT2LMHeadModel(GPT2Config())``, seed 0, ``eval()``, greedy, its KV cache
             on (the default), under ``torch.inference_mode()``.
  keras_hub  keras_hub's ``GPT2CausalLM.generate`` on the JAX backend
             (``.venv-kerashub``): a ``GPT2Backbone`` of GPT-2 small's config (12
             layers, 768 wide, 12 heads, MLP 3072, vocabulary 50257, 1024 positions)
             with random weights (no download), ``compile(sampler="greedy")``, no
             preprocessor (token ids in), ``stop_token_ids=None``.

Both make exactly ``new`` tokens after the prompt (random weights may draw the end
token: transformers gets ``min_new_tokens=new``, keras_hub no stop token).

Protocol (one JSON object per line on stdin and stdout; the libraries' own prints go
to stderr):

  {"op": "setup", "folder": DIR or "", "threads": N}
      builds the model; torch writes its weights to DIR with ``save_pretrained``
      (safetensors: the benchmark loads the same weights into mlaxgraph, without
      torch, and compares the tokens). Answers the versions.
  {"op": "generate", "ids": [[...], ...], "new": N}
      one timed call; answers ``{"seconds", "cpu", "tokens"}``: wall-clock seconds,
      the process's CPU seconds (all threads) and the prompt with the new tokens.
  {"op": "quit"}

Run alone (a smoke check, one call per batch):
``.venv-torch/bin/python benchmarks/bench_decode_peers.py torch --alone`` or
``.venv-kerashub/bin/python benchmarks/bench_decode_peers.py keras_hub --alone``.
"""

from __future__ import annotations

import json
import os
import sys
import time


class TorchPeer:
    def __init__(self, folder: str, threads: int):
        import torch
        import transformers
        from transformers import GPT2Config, GPT2LMHeadModel

        torch.set_num_threads(threads)
        torch.manual_seed(0)
        self.torch = torch
        self.model = GPT2LMHeadModel(GPT2Config()).eval()
        self.model.generation_config.pad_token_id = self.model.config.eos_token_id
        if folder:
            self.model.save_pretrained(folder, safe_serialization=True)
        self.versions = {"torch": torch.__version__, "transformers": transformers.__version__,
                         "threads": torch.get_num_threads()}

    def generate(self, ids: list, new: int) -> tuple[float, list]:
        torch = self.torch
        ids_t = torch.tensor(ids, dtype=torch.long)
        with torch.inference_mode():
            t0 = time.perf_counter()
            out = self.model.generate(ids_t, attention_mask=torch.ones_like(ids_t), max_new_tokens=new,
                                      min_new_tokens=new, do_sample=False)
            seconds = time.perf_counter() - t0
        return seconds, out.tolist()


class KerasHubPeer:
    def __init__(self, folder: str, threads: int):
        os.environ.setdefault("KERAS_BACKEND", "jax")
        import keras
        import keras_hub
        import numpy as np

        if keras.backend.backend() != "jax":
            raise RuntimeError(f"keras runs on {keras.backend.backend()}, not jax")
        import jax

        keras.utils.set_random_seed(0)
        backbone = keras_hub.models.GPT2Backbone(
            vocabulary_size=50257, num_layers=12, num_heads=12, hidden_dim=768,
            intermediate_dim=3072, max_sequence_length=1024, dropout=0.0)
        self.model = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
        self.model.compile(sampler="greedy")
        self.np = np
        self.versions = {"keras": keras.__version__, "keras_hub": keras_hub.__version__,
                         "jax": jax.__version__, "backend": keras.backend.backend()}

    def generate(self, ids: list, new: int) -> tuple[float, list]:
        np = self.np
        prompt = np.asarray(ids, np.int32)
        batch, seq = prompt.shape
        tokens = np.zeros((batch, seq + new), np.int32)
        tokens[:, :seq] = prompt
        mask = np.zeros((batch, seq + new), bool)
        mask[:, :seq] = True
        t0 = time.perf_counter()
        out = self.model.generate({"token_ids": tokens, "padding_mask": mask}, stop_token_ids=None)
        seconds = time.perf_counter() - t0
        return seconds, np.asarray(out["token_ids"]).tolist()


PEERS = {"torch": TorchPeer, "keras_hub": KerasHubPeer}


def serve(name: str) -> None:
    channel = sys.stdout
    sys.stdout = sys.stderr  # the libraries' prints stay off the protocol's channel
    peer = None
    for line in sys.stdin:
        msg = json.loads(line)
        op = msg["op"]
        if op == "quit":
            break
        try:
            if op == "setup":
                peer = PEERS[name](msg.get("folder", ""), int(msg.get("threads", 2)))
                reply = dict(peer.versions)
            elif op == "generate":
                c0 = time.process_time()
                seconds, tokens = peer.generate(msg["ids"], int(msg["new"]))
                reply = {"seconds": seconds, "cpu": time.process_time() - c0, "tokens": tokens}
            else:
                reply = {"error": f"unknown op {op!r}"}
        except Exception as e:  # reported to the driver, which says why the peer has no row
            reply = {"error": f"{type(e).__name__}: {e}"}
        channel.write(json.dumps(reply) + "\n")
        channel.flush()


class Peer:
    """The driver's side: a peer process answering one request at a time."""

    def __init__(self, python: str, name: str):
        import subprocess

        self.name = name
        self.process = subprocess.Popen([python, os.path.abspath(__file__), name],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.DEVNULL, text=True)

    def ask(self, **msg) -> dict:
        self.process.stdin.write(json.dumps(msg) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the {self.name} peer exited (status {self.process.wait()})")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"the {self.name} peer: {reply['error']}")
        return reply

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.write(json.dumps({"op": "quit"}) + "\n")
            self.process.stdin.close()
            self.process.wait()


def _alone(name: str) -> None:
    import tempfile

    import numpy as np

    with tempfile.TemporaryDirectory() as folder:
        peer = Peer(sys.executable, name)
        print(peer.ask(op="setup", folder=folder, threads=2))
        for batch in (1, 8):
            ids = np.random.default_rng(0).integers(0, 50257, (batch, 16)).tolist()
            peer.ask(op="generate", ids=ids, new=64)  # warm
            r = peer.ask(op="generate", ids=ids, new=64)
            print(f"batch {batch}: {r['seconds']:.2f} s, {batch * 64 / r['seconds']:.1f} tokens/s")
        peer.close()


if __name__ == "__main__":
    if "--alone" in sys.argv:
        _alone(sys.argv[1])
    else:
        serve(sys.argv[1])
