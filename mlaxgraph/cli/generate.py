"""``mlaxgraph generate``: text from a causal language model of the zoo, through the
decoder the compiler derives from its graph (``mg.generate``)."""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import jax
import numpy as np

from .. import models
from ..compiler.compile import compile
from ..core.errors import ConfigError
from ..decode import generate, sampling
from ..decode.sampling import as_sampler
from .commands import UsageError
from .generation_config import file_count, read_generation_config, read_json, refuse_unsupported

__all__ = ["add_generate", "run_generate", "GENERATE_MODELS"]

#: The zoo's causal language models.
GENERATE_MODELS = ("gpt2", "llama", "qwen2")
#: Without --config or a config.json: GPT-2 small, a small Llama (random weights).
SMALL_LLAMA = {"vocab_size": 32000, "hidden_size": 512, "intermediate_size": 1376,
               "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 4}
#: New tokens without --max-new-tokens or a length in generation_config.json.
DEFAULT_NEW_TOKENS = 32


def add_generate(commands) -> None:
    """Adds ``generate`` to an ``add_subparsers`` object."""
    p = commands.add_parser(
        "generate", help="generate text with a causal language model of the zoo",
        description="Builds the model (gpt2, llama or qwen2) from its Hugging Face config, loads "
                    "its weights (random without --weights), and generates new tokens after "
                    "the prompt with the decoder derived from its graph. --prompt needs the "
                    "folder's tokenizer.json and the `tokenizers` package (pip install "
                    "'mlaxgraph[text]'); --prompt-ids takes token ids.")
    p.add_argument("--model", required=True, choices=GENERATE_MODELS, help="the zoo's builder")
    p.add_argument("--weights", metavar="DIR", help="a checkpoint folder (or .safetensors file) "
                   "in the original names; its config.json and tokenizer.json are read")
    p.add_argument("--config", metavar="PATH", help="the config.json (default: the one beside "
                   "--weights, else the builder's defaults; a small Llama)")
    prompt = p.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", help="the prompt text (tokenized by tokenizer.json)")
    prompt.add_argument("--prompt-ids", metavar="IDS", help="the prompt as token ids: 1,2,3")
    p.add_argument("--max-new-tokens", type=_number(int, 0),
                   help=f"new tokens (default: generation_config.json's max_new_tokens, or its "
                        f"max_length less the prompt's tokens, else {DEFAULT_NEW_TOKENS})")
    p.add_argument("--repetition-penalty", type=_number(float, 0, open_low=True), metavar="P",
                   help="divide the positive logits of the tokens so far by P, multiply the "
                        "negative ones (Hugging Face's repetition_penalty)")
    p.add_argument("--no-repeat-ngram-size", type=_number(int, 0), metavar="N",
                   help="no n-gram of N tokens twice (Hugging Face's no_repeat_ngram_size)")
    p.add_argument("--temperature", type=_number(float, 0, open_low=True),
                   help="draw at this temperature (default: greedy)")
    p.add_argument("--top-k", type=_number(int, 1), help="draw among the k most likely tokens")
    p.add_argument("--top-p", type=_number(float, 0, 1, open_low=True),
                   help="draw among the tokens of this probability mass, in (0, 1]")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights and the draws")
    p.add_argument("--eos-token-id", type=_token_ids, metavar="ID[,ID...]",
                   help="stop after any of them (default: generation_config.json's beside "
                        "--weights, else the config's)")
    p.set_defaults(run=run_generate)


def _number(kind: type, low: float, high: float | None = None, *, open_low: bool = False):
    """An argparse type: an int or float from ``low`` (excluded with ``open_low``) to
    ``high``, refused as a wrong argument (exit 2) naming the flag."""
    def convert(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not {'an int' if kind is int else 'a number'}: "
                                             f"{text!r}") from None
        if value < low or (open_low and value == low) or (high is not None and value > high):
            bound = (f"> {low}" if open_low else f">= {low}") + (f" and <= {high}" if high else "")
            raise argparse.ArgumentTypeError(f"must be {bound}, got {text}")
        return value
    return convert


def _folder(args) -> str | None:
    if not args.weights:
        return None
    return args.weights if os.path.isdir(args.weights) else os.path.dirname(args.weights)


def _config(args) -> Any:
    path = args.config
    folder = _folder(args)
    if path is None and folder is not None and os.path.exists(os.path.join(folder, "config.json")):
        path = os.path.join(folder, "config.json")
    if path is None:
        return SMALL_LLAMA if args.model in ("llama", "qwen2") else None
    return read_json(path, "--config" if args.config is not None else "config")


def _token_ids(text: str) -> list[int]:
    try:
        ids = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        ids = []
    if not ids or any(i < 0 for i in ids):
        raise argparse.ArgumentTypeError(f"give token ids as ints, comma-separated, got {text!r}")
    return ids


def _generation_config(args) -> tuple[str, dict]:
    """The path of generation_config.json beside the weights and its fields ("" and {}:
    none there)."""
    folder = _folder(args)
    path = os.path.join(folder, "generation_config.json") if folder else ""
    if not path or not os.path.exists(path):
        return "", {}
    return path, read_generation_config(path)


def _new_tokens(args, path: str, generation: dict, prompt: int) -> int:
    """--max-new-tokens, else the file's max_new_tokens, else its max_length (the prompt
    and the new tokens, as Hugging Face counts it) less the prompt, else the default."""
    if args.max_new_tokens is not None:
        return args.max_new_tokens
    new = file_count(path, generation, "max_new_tokens")  # Hugging Face's precedence
    if new is not None:
        return new
    length = file_count(path, generation, "max_length")
    if length is None:
        return DEFAULT_NEW_TOKENS
    if length <= prompt:
        raise ConfigError(f"{path}: max_length={length} counts the prompt's {prompt} tokens and "
                          f"the new ones, so nothing is left to generate; give --max-new-tokens")
    return length - prompt


def _stop_tokens(args, config: Any, path: str, generation: dict) -> list[int] | None:
    """--eos-token-id, else the stop tokens of generation_config.json where the folder has
    one (where Llama 3 and Qwen2's instruct models keep theirs; as Hugging Face's generate,
    the config's are then not read), else the config's: an id or a list of them."""
    if args.eos_token_id is not None:
        return args.eos_token_id
    source, where = (generation, path) if path else (config, "config.json")
    value = source.get("eos_token_id") if isinstance(source, dict) else None
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool)
                                                 for v in value):
        return value
    raise ConfigError(f"{where}: field 'eos_token_id' must be a token id or a list of them, got "
                      f"{value!r}")


def _tokenizer(args):
    folder = _folder(args)
    path = os.path.join(folder, "tokenizer.json") if folder else None
    if path is None or not os.path.exists(path):
        raise UsageError("--prompt needs a tokenizer.json beside --weights; give --prompt-ids "
                         "instead")
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise UsageError("--prompt needs the `tokenizers` package: pip install 'mlaxgraph[text]' "
                         "(or give --prompt-ids)") from None
    return Tokenizer.from_file(path)


def _sampler(args, path: str, generation: dict):
    """The flags' sampler; where they set nothing, generation_config.json's settings as
    Hugging Face's generate reads them: its logits processors (repetition_penalty,
    no_repeat_ngram_size, bad_words_ids, min_length, min_new_tokens, the latter taking
    precedence as Hugging Face's), and with ``do_sample: true`` its draw, Hugging Face's
    defaults (temperature 1, top_k 50) where the file leaves them unset. A setting that
    mg.generate does not have is refused by name."""
    temperature, top_k, top_p = args.temperature, args.top_k, args.top_p
    drawn = (temperature, top_k, top_p) == (None, None, None) and bool(generation.get("do_sample"))
    refuse_unsupported(path, generation, draws=drawn)
    penalty = args.repetition_penalty
    if penalty is None and generation.get("repetition_penalty") not in (None, 1.0):
        penalty = generation["repetition_penalty"]
    ngram = args.no_repeat_ngram_size
    if ngram is None:
        ngram = generation.get("no_repeat_ngram_size")
    if drawn:
        temperature = 1.0 if generation.get("temperature") is None else generation["temperature"]
        top_k = 50 if generation.get("top_k") is None else generation["top_k"]
        top_p = generation.get("top_p")
    min_new, min_length = generation.get("min_new_tokens"), generation.get("min_length")
    try:  # Hugging Face's order: its logits processors, then its warpers
        parts: list = []
        if penalty is not None:
            parts.append(sampling.RepetitionPenalty(penalty))
        if ngram:
            parts.append(sampling.NoRepeatNGram(ngram))
        if generation.get("bad_words_ids") is not None:
            parts.append(sampling.BadWords(generation["bad_words_ids"]))
        if min_new is not None:  # min_length is then min_new_tokens + the prompt's, as Hugging Face's
            if min_new:
                parts.append(sampling.MinNewTokens(min_new))
        elif min_length:
            parts.append(sampling.MinLength(min_length))
        if temperature is not None:
            parts.append(sampling.Temperature(temperature))
        if top_k:  # 0: no top-k, as Hugging Face's
            parts.append(sampling.TopK(top_k))
        if top_p is not None and top_p != 1.0:
            parts.append(sampling.TopP(top_p))
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
    return parts or "greedy"


def run_generate(args: argparse.Namespace) -> int:
    if args.weights and not os.path.exists(args.weights):
        raise UsageError(f"--weights {args.weights}: no such file or folder")
    config = _config(args)
    path, generation = _generation_config(args)  # its errors before any work
    graph = getattr(models, args.model)(config)
    tokenizer = None
    if args.prompt is not None:
        tokenizer = _tokenizer(args)
        ids = tokenizer.encode(args.prompt).ids
    else:
        try:
            ids = [int(t) for t in args.prompt_ids.split(",") if t.strip()]
        except ValueError:
            raise UsageError(f"--prompt-ids takes comma-separated ints, got {args.prompt_ids!r}") from None
    if not ids:
        raise UsageError("the prompt is empty")
    new_tokens = _new_tokens(args, path, generation, len(ids))
    sampler = _sampler(args, path, generation)
    eos = _stop_tokens(args, config, path, generation)
    start = time.perf_counter()
    if args.weights:
        params, state = models.load_state_dict(graph, args.weights)
    else:
        params, state = compile(graph).init(jax.random.key(args.seed))
    loaded = time.perf_counter() - start
    start = time.perf_counter()
    out = generate(compile(graph), params, state, np.array([ids], np.int32),
                   max_new_tokens=new_tokens, sampler=sampler,
                   key=jax.random.key(args.seed) if as_sampler(sampler).draws else None,
                   eos_token_id=eos)
    new = [int(t) for t in np.asarray(out)[0, len(ids):]]
    stops = [i for i, t in enumerate(new) if eos is not None and t in eos]
    if stops:
        new = new[:stops[0] + 1]
    took = time.perf_counter() - start
    print(f"ids: {','.join(str(t) for t in ids + new)}")
    if tokenizer is not None:
        print(f"text: {tokenizer.decode(ids + new)}")
    weights = args.weights or f"random (seed {args.seed})"
    print(f"{len(new)} new token{'' if len(new) == 1 else 's'} in {took:.1f} s with compiling; "
          f"weights: {weights} ({loaded:.1f} s); sampler: {sampler}")
    return 0
