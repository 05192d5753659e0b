"""Hugging Face's logits processors as samplers (``RepetitionPenalty``,
``NoRepeatNGram``, ``BadWords``, ``MinNewTokens``, ``MinLength``): each against a NumPy
version of transformers' processor written here from its documented behaviour, alone
and inside ``mg.generate`` against a loop of full forwards that applies them."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mlaxgraph as mg
from mlaxgraph.decode.sampling import History

GPT2 = {"n_layer": 2, "n_embd": 32, "n_head": 2, "vocab_size": 48, "n_positions": 128}


# --- transformers' processors, in NumPy: scores (batch, vocab), input_ids a list of rows ---

def repetition_penalty(scores, input_ids, penalty):
    out = scores.copy()
    for b, row in enumerate(input_ids):
        for t in set(row):
            s = scores[b, t]
            out[b, t] = s * penalty if s < 0 else s / penalty
    return out


def no_repeat_ngram(scores, input_ids, n):
    out = scores.copy()
    for b, row in enumerate(input_ids):
        if len(row) + 1 < n:
            continue
        grams = {}
        for j in range(len(row) - n + 1):
            grams.setdefault(tuple(row[j:j + n - 1]), []).append(row[j + n - 1])
        for t in grams.get(tuple(row[len(row) - n + 1:]), []):
            out[b, t] = -np.inf
    return out


def bad_words(scores, input_ids, sequences, eos):
    out = scores.copy()
    sequences = [s for s in sequences if not (len(s) == 1 and s[0] in eos)]
    for b, row in enumerate(input_ids):
        for s in sequences:
            # transformers skips a sequence only when its prefix is longer than the row
            if len(s) == 1 or (len(s) - 1 <= len(row) and list(row[len(row) - len(s) + 1:]) == s[:-1]):
                out[b, s[-1]] = -np.inf
    return out


def no_stop_before(scores, early, eos):
    out = scores.copy()
    if early:
        out[:, list(eos)] = -np.inf
    return out


def _history(rows, width, start, prompt_end, eos):
    """A History whose sequences are ``rows`` (equal lengths) from column ``start`` of a
    ``width``-column array filled with junk elsewhere (a bucket's padding)."""
    ids = np.full((len(rows), width), 7, np.int32)
    ids[:, start:start + len(rows[0])] = rows
    return History(jnp.asarray(ids), jnp.asarray(start), jnp.asarray(start + len(rows[0])),
                   jnp.asarray(prompt_end), jnp.asarray(eos or [-1], jnp.int32))


def test_each_processor_equals_transformers_on_random_sequences():
    rng = np.random.default_rng(0)
    vocab = 12
    for trial in range(40):
        length = int(rng.integers(1, 9))
        rows = rng.integers(0, vocab, (3, length)).tolist()  # few tokens: many repeats
        scores = rng.normal(size=(3, vocab)).astype(np.float32)
        start = int(rng.integers(0, 4))
        prompt = int(rng.integers(0, length + 1))
        eos = [int(rng.integers(0, vocab))]
        history = _history(rows, 12, start, start + prompt, eos)
        n = int(rng.integers(1, 4))
        seqs = [[int(rng.integers(0, vocab))], rng.integers(0, vocab, 2).tolist(), [eos[0]],
                [rows[0][-1], int(rng.integers(0, vocab))],
                rows[1] + [int(rng.integers(0, vocab))]]  # its prefix the whole row
        cases = [
            (mg.sampling.RepetitionPenalty(1.7), repetition_penalty(scores, rows, 1.7)),
            (mg.sampling.NoRepeatNGram(n), no_repeat_ngram(scores, rows, n)),
            (mg.sampling.BadWords(seqs), bad_words(scores, rows, seqs, eos)),
            (mg.sampling.MinNewTokens(3), no_stop_before(scores, length - prompt < 3, eos)),
            (mg.sampling.MinLength(5), no_stop_before(scores, length < 5, eos)),
        ]
        for processor, want in cases:
            got = np.asarray(processor.process(jnp.asarray(scores), history))
            # XLA divides by a scalar as a product with its reciprocal (as PyTorch on
            # CUDA does): within one unit in the last place of the quotient
            np.testing.assert_allclose(got, want, rtol=1.2e-7, atol=0,
                                       err_msg=f"{processor!r}, trial {trial}")
            assert np.array_equal(np.isinf(got), np.isinf(want))


def test_zero_is_no_effect_as_hugging_faces_default_and_counts_fit_int32():
    scores = jnp.asarray(np.random.default_rng(1).normal(size=(2, 12)), jnp.float32)
    history = _history([[1, 2, 1, 2], [3, 3, 3, 3]], 8, 1, 3, [5])
    for processor in (mg.sampling.NoRepeatNGram(0), mg.sampling.MinNewTokens(0),
                      mg.sampling.MinLength(0)):
        np.testing.assert_array_equal(processor.process(scores, history), scores)
    with pytest.raises(mg.ConfigError, match=r"MinLength: length must be an int >= 0 .* got "
                                              r"1000000000000"):
        mg.sampling.MinLength(10**12)


def test_a_processor_outside_generate_says_what_it_needs():
    with pytest.raises(mg.ConfigError, match=r"RepetitionPenalty\(penalty=1\.2\) reads the tokens "
                                              r"so far: it runs inside mg\.generate"):
        mg.sampling.RepetitionPenalty(1.2).process(jnp.zeros((1, 4)))


@pytest.fixture(scope="module")
def lm():
    model = mg.compile(mg.models.gpt2(GPT2))
    params, state = model.init(jax.random.key(1))
    params = jax.tree.map(lambda w: w * 3.0, params)  # away from near-ties
    return model, params, state


def _reference(model, params, state, row, given, new, processors, eos=()):
    """One row's greedy tokens, the full forward at every step (the row's tokens alone),
    the processors reading the row as transformers' ``input_ids`` hold it: its
    ``given`` columns (padding included), then the new tokens."""
    tokens, seq = list(row), list(given)
    out = []
    for _ in range(new):
        logits, _ = model.apply(params, state, jnp.asarray([tokens]), inference_mode=True)
        scores = np.asarray(logits[:, -1], np.float32)
        for f in processors:
            scores = f(scores, [seq], len(seq), len(given))
        top = np.sort(scores[0][np.isfinite(scores[0])])[-2:]
        assert top[1] - top[0] > 1e-3, "ill-posed: a near-tie between the two top scores"
        token = int(np.argmax(scores[0]))
        out.append(token)
        tokens.append(token)
        seq.append(token)
        if token in eos:
            break
    return out


def test_generate_with_processors_equals_transformers_loop(lm):
    model, params, state = lm
    eos = [5]
    prompts = [[3, 9, 3, 9, 3, 20, 31], [0, 0, 0, 11, 4, 11, 4]]  # row 1: 3 pad columns
    mask = np.array([[1] * 7, [0, 0, 0, 1, 1, 1, 1]], np.int32)
    sampler = (mg.sampling.RepetitionPenalty(1.8) + mg.sampling.NoRepeatNGram(2)
               + mg.sampling.BadWords([[17], [9, 40]]) + mg.sampling.MinNewTokens(3))
    processors = [
        lambda s, ids, length, prompt: repetition_penalty(s, ids, 1.8),
        lambda s, ids, length, prompt: no_repeat_ngram(s, ids, 2),
        lambda s, ids, length, prompt: bad_words(s, ids, [[17], [9, 40]], eos),
        lambda s, ids, length, prompt: no_stop_before(s, length - prompt < 3, eos),
    ]
    out = np.asarray(mg.generate(model, params, state, np.array(prompts), attention_mask=mask,
                                 max_new_tokens=10, sampler=sampler, eos_token_id=eos, pad_token_id=0))
    for r, row in enumerate(prompts):
        tokens = [t for t, m in zip(row, mask[r]) if m]
        want = _reference(model, params, state, tokens, row, 10, processors, eos)
        assert out[r, 7:7 + len(want)].tolist() == want
    plain = np.asarray(mg.generate(model, params, state, np.array(prompts), attention_mask=mask,
                                   max_new_tokens=10, eos_token_id=eos, pad_token_id=0))
    assert not np.array_equal(plain, out)  # the processors changed the choices
    streamed = np.stack(list(mg.generate_stream(
        model, params, state, np.array(prompts), attention_mask=mask, max_new_tokens=10,
        sampler=sampler, eos_token_id=eos, pad_token_id=0)), 1)
    assert streamed.tolist() == out[:, 7:7 + streamed.shape[1]].tolist()


def test_no_bigram_repeats_and_min_length_holds_back_the_stop_token(lm):
    model, params, state = lm
    prompt = np.array([[1, 2, 3, 4]])
    out = np.asarray(mg.generate(model, params, state, prompt, max_new_tokens=24,
                                 sampler=mg.sampling.NoRepeatNGram(2)))[0].tolist()
    bigrams = list(zip(out, out[1:]))
    assert len(bigrams) == len(set(bigrams))
    greedy = np.asarray(mg.generate(model, params, state, prompt, max_new_tokens=6))[0, 4:].tolist()
    stop = greedy[0]  # plain greedy stops at once on it
    held = np.asarray(mg.generate(model, params, state, prompt, max_new_tokens=6, eos_token_id=stop,
                                  sampler=mg.sampling.MinLength(8)))[0, 4:].tolist()
    assert stop not in held[:3]  # the sequence holds 4 + 3 < 8 tokens before the fourth
    processors = [lambda s, ids, length, p: no_stop_before(s, length < 8, [stop])]
    assert held[:len(_reference(model, params, state, [1, 2, 3, 4], [1, 2, 3, 4], 6, processors,
                                [stop]))] == _reference(model, params, state, [1, 2, 3, 4],
                                                        [1, 2, 3, 4], 6, processors, [stop])


def test_processors_with_a_drawing_sampler_are_reproducible(lm):
    model, params, state = lm
    prompt = np.array([[1, 2, 3, 4], [5, 6, 7, 8]])
    sampler = mg.sampling.RepetitionPenalty(1.3) + mg.sampling.TopK(8) + mg.sampling.Temperature(0.7)
    one = mg.generate(model, params, state, prompt, max_new_tokens=8, sampler=sampler,
                      key=jax.random.key(2))
    two = np.stack(list(mg.generate_stream(model, params, state, prompt, max_new_tokens=8,
                                           sampler=sampler, key=jax.random.key(2))), 1)
    assert np.array_equal(np.asarray(one)[:, 4:], two)


def test_greedy_in_a_chain_takes_the_processed_logits_most_likely_token():
    logits = jnp.array([[0.1, 2.0, 1.9, -1.0]])
    for chain in (mg.sampling.Temperature(0.5) + "greedy", [mg.sampling.TopK(3), "greedy"],
                  mg.sampling.Greedy() + mg.sampling.TopK(3)):
        sampler = mg.decode.sampling.as_sampler(chain)
        assert not sampler.draws
        assert int(sampler(logits, jax.random.key(0))[0]) == 1
    assert float(mg.sampling.RepetitionPenalty(jnp.float32(1.5)).penalty) == 1.5
