"""mg.from_torch against PyTorch itself (``make test-torch``: torch, torchvision and
transformers in their own environment, .venv-torch). Each model runs in PyTorch and
in mlaxgraph on the same inputs and weights."""

from __future__ import annotations

import importlib.util
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import mlaxgraph as mg

_spec = importlib.util.spec_from_file_location(
    "torch_fixtures", os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "torch", "make.py"))
fixtures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fixtures)


def _run(module, *args, inference_mode=True, scan_blocks=False, **kw):
    graph, params, state = mg.from_torch(module, args, **kw)
    model = mg.compile(graph, scan_blocks=scan_blocks)
    if scan_blocks:
        params, state = model.stack_weights(params, state)
    out, new_state = model.apply(params, state, *[jnp.asarray(a.numpy()) for a in args],
                                 inference_mode=inference_mode)
    return graph, np.asarray(out[0] if isinstance(out, tuple) else out), new_state


def _close(ours, theirs, tol=1e-4):
    theirs = theirs.detach().numpy()
    scale = max(1.0, float(np.abs(theirs).max()))
    np.testing.assert_allclose(ours, theirs, rtol=tol, atol=tol * scale)


def test_small_cnn_and_its_hierarchy():
    torch.manual_seed(0)
    model = fixtures.SmallCNN().eval()
    x = torch.randn(2, 3, 16, 16)
    graph, out, _ = _run(model, x)
    _close(out, model(x))
    modules = {name for name, _ in model.named_modules() if name}
    paths = {path.replace("/", ".") for path, _ in graph.walk()}
    assert {"stem", "stem.0", "layer1", "layer1.0", "layer1.0.conv1", "head"} <= paths
    assert paths & modules == {m for m in modules if m in paths}


def test_train_mode_is_inference_mode_false():
    torch.manual_seed(0)
    model = fixtures.SmallCNN().train()
    x = torch.randn(4, 3, 16, 16)
    graph, params, state = mg.from_torch(model, (x,))
    assert mg.aten.inference_mode(graph) is False  # the graph says how it computes as the module
    assert mg.aten.inference_mode(mg.from_torch(model.eval(), (x,))[0]) is True
    model.train()
    out, new_state = mg.compile(graph).apply(params, state, jnp.asarray(x.numpy()), inference_mode=False)
    expected = model(x)  # updates the module's running statistics
    _close(np.asarray(out), expected)
    np.testing.assert_allclose(np.asarray(new_state["stem"]["1"]["mean"]),
                               model.stem[1].running_mean.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(new_state["stem"]["1"]["var"]),
                               model.stem[1].running_var.numpy(), rtol=1e-4, atol=1e-5)


def test_dynamic_batch():
    torch.manual_seed(0)
    model = fixtures.TinyTransformer().eval()
    batch = torch.export.Dim("batch", min=1, max=32)
    graph, params, state = mg.from_torch(model, (torch.randint(0, 50, (2, 8)),),
                                         dynamic_shapes=({0: batch},))
    assert str(graph.input_specs[0]) == "i32[batch,8]"
    ids = torch.randint(0, 50, (5, 8))
    out, _ = mg.compile(graph).apply(params, state, jnp.asarray(ids.numpy().astype(np.int32)),
                                     inference_mode=True)
    _close(np.asarray(out), model(ids))


def test_data_dependent_control_flow_is_an_error():
    class Branchy(nn.Module):
        def forward(self, x):
            return x * 2 if x.sum() > 0 else x - 1

    with pytest.raises(mg.GraphError, match="Branchy.*data-dependent control flow must be "
                                            "written with torch.cond"):
        mg.from_torch(Branchy(), (torch.randn(3),))


def test_example_inputs_the_module_cannot_take_are_named_as_such():
    with pytest.raises(mg.GraphError, match=r"could not export Linear .*the module itself fails "
                                            r"on these example inputs \(check their shapes"):
        mg.from_torch(nn.Linear(8, 4), (torch.randn(2, 9),))
    # in training mode: asking PyTorch whether the module runs on them (its BatchNorm
    # moves its running statistics before the Linear fails) leaves the module as it was
    module = nn.Sequential(nn.BatchNorm1d(9), nn.Linear(8, 4)).train()
    before = {k: v.clone() for k, v in module.state_dict().items()}
    with pytest.raises(mg.GraphError, match="the module itself fails on these example inputs"):
        mg.from_torch(module, (torch.randn(4, 9) + 5,))
    for k, v in module.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_dims_that_contradict_the_module():
    class Fixed(nn.Module):
        def forward(self, x):
            return x.reshape(2, 6)

    with pytest.raises(mg.ShapeError, match="Fixed"):
        mg.from_torch(Fixed(), (torch.randn(3, 4),),
                      dynamic_shapes=({0: torch.export.Dim("batch", min=2, max=8)},))


def test_what_from_torch_cannot_take_is_named(tmp_path):
    with pytest.raises(mg.GraphError, match="takes a torch.nn.Module.*got function"):
        mg.from_torch(lambda t: t * 2, (torch.randn(3),))
    with pytest.raises(mg.ShapeError, match=r"names axis 5 of example argument 0, which has 2 axes"):
        mg.from_torch(nn.Linear(8, 4), (torch.randn(2, 8),),
                      dynamic_shapes=({5: torch.export.Dim("batch")},))

    class Out:
        def __init__(self, t):
            self.t = t

    class Cached(nn.Module):  # as transformers' DynamicCache in a model's output
        def forward(self, x):
            return x * 2, Out(x)

    with pytest.raises(mg.GraphError, match=r"output holds an object torch.export cannot "
                                            r"flatten .*Out.*return tensors"):
        mg.from_torch(Cached(), (torch.randn(3),))


def test_integer_and_boolean_buffers_keep_their_values():
    """Buffers were stored in float32: an index past 2**24 came out rounded."""
    class Indexed(nn.Module):
        def __init__(self, big):
            super().__init__()
            self.register_buffer("idx", torch.tensor([16777217, 3, 1]) + big)
            self.register_buffer("keep", torch.tensor([True, False, True]))

        def forward(self, x):
            return torch.where(self.keep, x + self.idx, x)

    x = torch.zeros(3, dtype=torch.int64)
    module = Indexed(0).eval()
    graph, params, state = mg.from_torch(module, (x,))
    assert state["idx"]["value"].dtype == np.int32 and state["keep"]["value"].dtype == np.bool_
    out, _ = mg.compile(graph).apply(params, state, x.numpy().astype(np.int32), inference_mode=True)
    np.testing.assert_array_equal(np.asarray(out), module(x).numpy())
    sd = mg.models.to_state_dict(graph, params, state)
    np.testing.assert_array_equal(sd["idx"], module.idx.numpy())
    with pytest.raises(mg.DTypeError, match=r"buffer 'idx' holds int64 values outside int32's range"):
        mg.from_torch(Indexed(2 ** 40).eval(), (x,))


def test_state_dict_round_trips_without_non_persistent_buffers_and_constants(tmp_path):
    """A buffer registered with persistent=False and a tensor constant torch.export lifts
    are values of the graph, not state: the graph's state dict is the module's
    ``state_dict()``, each way, also through a saved program folder."""
    class Held(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.register_buffer("pos", torch.arange(4.0), persistent=False)
            self.register_buffer("count", torch.tensor([3]))
            self.scale = torch.tensor(2.5)

        def forward(self, x):
            return self.fc(x) * self.scale + self.pos + self.count

    torch.manual_seed(0)
    module, x = Held().eval(), torch.randn(2, 4)
    for source in (module, mg.aten.save_program(module, tmp_path / "held", (x,))):
        graph, params, state = mg.from_torch(source, (x,))
        sd = mg.models.to_state_dict(graph, params, state)
        assert sorted(sd) == sorted(module.state_dict()) == ["count", "fc.bias", "fc.weight"]
        fresh = Held().eval()
        fresh.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in sd.items()})
        loaded = mg.models.load_state_dict(graph, {k: v.numpy() for k, v in module.state_dict().items()})
        out, _ = mg.compile(graph).apply(*loaded, x.numpy(), inference_mode=True)
        _close(out, module(x))
        with torch.no_grad():
            _close(fresh(x).numpy(), module(x))


def test_rms_norm_and_a_slice_assigned_a_number():
    class Normed(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm, self.fc = nn.RMSNorm(8), nn.Linear(8, 8)
            self.bare = nn.RMSNorm(8, eps=1e-3, elementwise_affine=False)

        def forward(self, x):
            y = self.bare(self.fc(self.norm(x))).clone()
            y[:, 0] = 5.0
            return y

    torch.manual_seed(0)
    module, x = Normed().eval(), torch.randn(3, 8)
    with torch.no_grad():
        module.norm.weight.normal_()
    graph, params, state = mg.from_torch(module, (x,))
    out, _ = mg.compile(graph).apply(params, state, x.numpy(), inference_mode=True)
    with torch.no_grad():
        _close(out, module(x))
    assert sorted(mg.models.to_state_dict(graph, params, state)) == sorted(module.state_dict())


def test_unsupported_op_names_it_and_the_module():
    class Odd(nn.Module):
        def forward(self, x):
            return torch.special.bessel_j0(x)

    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = Odd()

        def forward(self, x):
            return self.inner(x) + 1

    with pytest.raises(mg.GraphError, match=r"bessel_j0.*module inner"):
        mg.from_torch(Outer(), (torch.randn(3),))


def test_resnet18():
    import torchvision
    torch.manual_seed(0)
    model = torchvision.models.resnet18().eval()
    x = torch.randn(1, 3, 224, 224)
    graph, out, _ = _run(model, x)
    _close(out, model(x))
    assert graph.select("layer1/*/conv1") == ["layer1/0/conv1", "layer1/1/conv1"]


def test_gpt2_random_config_folds_its_blocks():
    import transformers
    config = transformers.GPT2Config(n_layer=3, n_embd=64, n_head=4, vocab_size=100, n_positions=32,
                                     use_cache=False)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).eval()
    ids = torch.randint(0, 100, (2, 16))
    graph, out, _ = _run(model, ids, scan_blocks="always")
    _close(out, model(ids).logits)
    inner = graph.node("transformer").op.graph
    assert [n.name for n in inner.nodes if n.name.startswith("h.")] == ["h.0", "h.1", "h.2"]
    scanned = mg.compile(graph, scan_blocks="always").graph.node("transformer").op.graph
    assert scanned.node("h.0..h.2").op.op_name == "scan"
    # the state dict's names, the tied head's copy included
    _, params, state = mg.from_torch(model, (ids,))
    ours = mg.models.to_state_dict(graph, params, state)
    theirs = {k: v for k, v in model.state_dict().items() if not k.endswith((".attn.bias", ".masked_bias"))}
    assert set(ours) == set(theirs)


def test_a_transformers_5x_vit_state_dict_in_memory_loads_into_the_zoo_vit():
    """ViTModel().state_dict() of the installed transformers (5.x: ``layers.N``,
    ``attention.q_proj``, ``mlp.fc1``) into mg.models.vit: the same hidden states."""
    transformers = pytest.importorskip("transformers")
    config = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                  image_size=16, patch_size=8, hidden_act="gelu")
    torch.manual_seed(0)
    theirs = transformers.ViTModel(transformers.ViTConfig(**config)).eval()
    sd = {k: v.detach().numpy() for k, v in theirs.state_dict().items()}
    graph = mg.models.vit(config)
    params, state = mg.models.load_state_dict(graph, sd)
    x = np.random.default_rng(0).standard_normal((2, 3, 16, 16)).astype(np.float32)
    (hidden, pooled), _ = mg.compile(graph).apply(params, state, jnp.asarray(x), inference_mode=True)
    with torch.no_grad():
        out = theirs(torch.from_numpy(x))
    _close(np.asarray(hidden), out.last_hidden_state)
    _close(np.asarray(pooled), out.pooler_output)


def test_greedy_generate_makes_the_tokens_transformers_generate_makes():
    """GPT2LMHeadModel.generate (greedy, its KV cache) and mg.generate on the same
    weights: the same new tokens, batch 2."""
    transformers = pytest.importorskip("transformers")
    config = dict(vocab_size=128, n_positions=64, n_embd=32, n_layer=2, n_head=4)
    torch.manual_seed(0)
    theirs = transformers.GPT2LMHeadModel(transformers.GPT2Config(**config)).eval()
    sd = {k: v.detach().numpy() for k, v in theirs.state_dict().items()}
    graph = mg.models.gpt2(config)
    params, state = mg.models.load_state_dict(graph, sd)
    ids = np.random.default_rng(1).integers(0, 128, (2, 7))
    with torch.no_grad():
        want = theirs.generate(torch.from_numpy(ids), attention_mask=torch.ones(2, 7, dtype=torch.long),
                               max_new_tokens=12, min_new_tokens=12, do_sample=False, pad_token_id=0)
    got = mg.generate(mg.compile(graph), params, state, jnp.asarray(ids, jnp.int32), max_new_tokens=12)
    np.testing.assert_array_equal(np.asarray(got), want.numpy())


def test_weights_of_a_one_operation_module_read_by_an_aten_op():
    # nn.Embedding with scale_grad_by_freq stays the ATen operator (the layer's rule
    # takes plain embeddings); the module is one operation, its weight beside it
    class Inner(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(10, 4, scale_grad_by_freq=True)
            self.fc = nn.Linear(4, 3)

        def forward(self, ids):
            return self.fc(self.emb(ids))

    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = Inner()

        def forward(self, ids):
            return self.inner(ids) * 2

    torch.manual_seed(0)
    model = Outer().eval()
    ids = torch.randint(0, 10, (2, 5))
    graph, out, _ = _run(model, ids)
    _close(out, model(ids))
    assert graph.node("inner").op.graph.node("emb").op.op_name == "aten.embedding.default"
    _, params, state = mg.from_torch(model, (ids,))
    assert set(mg.models.to_state_dict(graph, params, state)) == set(model.state_dict())


def test_decoder_on_a_position_wise_module_matches_pytorch():
    # its eval_mode marker is the identity: the decoder takes the graph, and prefill and
    # step give PyTorch's logits
    class Bigram(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.head = nn.Embedding(10, 8), nn.Linear(8, 10)

        def forward(self, ids):
            return self.head(self.emb(ids))

    torch.manual_seed(0)
    module = Bigram().eval()
    dims = {0: torch.export.Dim("batch", max=64), 1: torch.export.Dim("seq", max=64)}
    graph, params, state = mg.from_torch(module, (torch.zeros(2, 4, dtype=torch.long),),
                                         dynamic_shapes=(dims,))
    dec = mg.decoder(graph, max_length=16)
    logits, cache = dec.prefill(params, state, np.array([[1, 2, 3]]))
    step, _ = dec.step(params, state, cache, np.array([4]))
    want = module(torch.tensor([[1, 2, 3, 4]]))
    _close(np.concatenate([np.asarray(logits), np.asarray(step)], axis=1), want)


def test_a_dim_without_bounds_is_symbolic(tmp_path):
    # torch.export.Dim("batch"), PyTorch's usual form: its range has no max (torch's
    # int_oo); the folder records none
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(3, 4)).eval()
    dims = ({0: torch.export.Dim("batch")},)
    graph, params, state = mg.from_torch(module, (torch.zeros(2, 3),), dynamic_shapes=dims)
    assert str(graph.input_specs[0]) == "f32[batch,3]"
    x = torch.randn(5, 3)
    out, _ = mg.compile(graph).apply(params, state, jnp.asarray(x.numpy()), inference_mode=True)
    _close(np.asarray(out), module(x))
    folder = mg.aten.save_program(module, tmp_path / "linear", (torch.zeros(2, 3),), dynamic_shapes=dims)
    with open(os.path.join(folder, "program.json")) as f:
        assert json.load(f)["dims"]["batch"][1] is None


def test_gpt2_with_a_symbolic_sequence_length():
    # the position ids come from aten.arange over the symbolic length: integers, as in
    # torch, so wpe takes them
    import transformers
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=32,
                                     use_cache=False)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).eval()
    dims = {0: torch.export.Dim("batch", max=64), 1: torch.export.Dim("seq", max=32)}
    graph, params, state = mg.from_torch(model, (torch.zeros(2, 8, dtype=torch.long),),
                                         dynamic_shapes=(dims,))
    assert str(graph.input_specs[0]) == "i32[batch,seq]"
    ids = torch.randint(0, 64, (3, 5))
    out, _ = mg.compile(graph).apply(params, state, jnp.asarray(ids.numpy().astype(np.int32)),
                                     inference_mode=True)
    _close(np.asarray(out), model(ids).logits)


def test_right_padded_rows_make_the_tokens_transformers_makes_left_padded():
    """transformers' generate is right for left padding only; mg.generate given the
    same rows padded on the right makes the same new tokens."""
    transformers = pytest.importorskip("transformers")
    config = dict(vocab_size=128, n_positions=64, n_embd=32, n_layer=2, n_head=4)
    torch.manual_seed(0)
    theirs = transformers.GPT2LMHeadModel(transformers.GPT2Config(**config)).eval()
    graph = mg.models.gpt2(config)
    params, state = mg.models.load_state_dict(
        graph, {k: v.detach().numpy() for k, v in theirs.state_dict().items()})
    rows = [[5, 17, 3, 60, 22, 9, 41], [8, 30, 2]]
    left = np.array([rows[0], [0] * 4 + rows[1]])
    left_mask = np.array([[1] * 7, [0] * 4 + [1] * 3])
    with torch.no_grad():
        want = theirs.generate(torch.from_numpy(left), attention_mask=torch.from_numpy(left_mask),
                               max_new_tokens=8, min_new_tokens=8, do_sample=False, pad_token_id=0)
    right = np.array([rows[0], rows[1] + [0] * 4])
    right_mask = np.array([[1] * 7, [1] * 3 + [0] * 4])
    got = mg.generate(mg.compile(graph), params, state, right, attention_mask=right_mask,
                      max_new_tokens=8)
    np.testing.assert_array_equal(np.asarray(got)[:, 7:], want.numpy()[:, 7:])


@pytest.mark.parametrize("kw", [dict(kernel_size=3, stride=2, padding=1, dilation=2, ceil_mode=True),
                                dict(kernel_size=2, stride=2, ceil_mode=True),
                                dict(kernel_size=3, stride=2, padding=1)])
def test_max_pool_dilation_and_ceil_mode_and_its_gradient(kw):
    """MaxPool2d's dilation and ceil_mode as PyTorch pools, and the gradient PyTorch
    gives (the first maximum of each window), ties from the ReLU included."""
    torch.manual_seed(0)
    _pooled_as_torch(nn.Sequential(nn.ReLU(), nn.MaxPool2d(**kw)).eval(), (2, 3, 11, 11),
                     exact=True)


def _pooled_as_torch(module, shape, exact):
    """The imported ``module``'s outputs (equal, or within float32 rounding) and input
    gradient against PyTorch's."""
    x = torch.randn(*shape)
    graph, params, state = mg.from_torch(module, (x,))
    model = mg.compile(graph)
    ours = np.asarray(model.apply(params, state, jnp.asarray(x.numpy()))[0])
    theirs = module(x)
    if exact:
        np.testing.assert_array_equal(ours, theirs.detach().numpy())
    else:
        np.testing.assert_allclose(ours, theirs.detach().numpy(), rtol=1e-6, atol=1e-6)
    g = torch.randn(theirs.shape)
    xt = x.clone().requires_grad_(True)
    (module(xt) * g).sum().backward()
    grad = jax.grad(lambda v: jnp.sum(model.apply(params, state, v)[0] * jnp.asarray(g.numpy())))(
        jnp.asarray(x.numpy()))
    np.testing.assert_allclose(np.asarray(grad), xt.grad.numpy(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("kw", [dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
                                dict(kernel_size=3, stride=2, padding=1, ceil_mode=True,
                                     count_include_pad=False),
                                dict(kernel_size=2, stride=2, ceil_mode=True),
                                dict(kernel_size=3, stride=1, padding=1, count_include_pad=False)])
def test_avg_pool_ceil_mode_and_count_include_pad_and_its_gradient(kw):
    """AvgPool2d's ceil_mode (the room it adds never counts) and count_include_pad as
    PyTorch pools, and the gradient PyTorch gives."""
    torch.manual_seed(0)
    _pooled_as_torch(nn.AvgPool2d(**kw).eval(), (2, 3, 10, 11), exact=False)


def test_logits_processors_make_the_tokens_transformers_generate_makes():
    """repetition_penalty, no_repeat_ngram_size, bad_words_ids and min_new_tokens in
    transformers' generate (greedy, left padding, a stop token) and the same
    mg.sampling processors in mg.generate: the same tokens, padding after the stop."""
    transformers = pytest.importorskip("transformers")
    config = dict(vocab_size=96, n_positions=64, n_embd=32, n_layer=2, n_head=4)
    torch.manual_seed(3)
    theirs = transformers.GPT2LMHeadModel(transformers.GPT2Config(**config)).eval()
    with torch.no_grad():
        for p in theirs.parameters():
            p.mul_(3.0)  # away from near-ties
    graph = mg.models.gpt2(config)
    params, state = mg.models.load_state_dict(
        graph, {k: v.detach().numpy() for k, v in theirs.state_dict().items()})
    ids = np.array([[5, 17, 5, 17, 22, 9, 41], [0, 0, 0, 8, 30, 8, 30]])
    mask = np.array([[1] * 7, [0] * 3 + [1] * 4])
    with torch.no_grad():
        plain = theirs.generate(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                                max_new_tokens=12, do_sample=False, pad_token_id=0).numpy()
    eos = int(plain[0, 8])  # row 0's second new token: min_new_tokens holds it back
    hf = dict(repetition_penalty=1.5, no_repeat_ngram_size=2, bad_words_ids=[[7], [9, 40]],
              min_new_tokens=4)
    with torch.no_grad():
        want = theirs.generate(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                               max_new_tokens=12, do_sample=False, pad_token_id=0,
                               eos_token_id=eos, **hf).numpy()
    sampler = (mg.sampling.RepetitionPenalty(1.5) + mg.sampling.NoRepeatNGram(2)
               + mg.sampling.BadWords([[7], [9, 40]]) + mg.sampling.MinNewTokens(4))
    got = np.asarray(mg.generate(mg.compile(graph), params, state, ids, attention_mask=mask,
                                 max_new_tokens=12, sampler=sampler, eos_token_id=eos,
                                 pad_token_id=0))
    assert not np.array_equal(want, plain[:, :want.shape[1]])  # the processors changed the choices
    np.testing.assert_array_equal(got[:, :want.shape[1]], want)
    assert (got[:, want.shape[1]:] == 0).all()
    # a banned sequence whose prefix is the whole prompt: banned from the first new token
    banned = [ids[0].tolist() + [int(plain[0, 7])]]
    with torch.no_grad():
        want = theirs.generate(torch.from_numpy(ids[:1]), max_new_tokens=4, do_sample=False,
                               pad_token_id=0, bad_words_ids=banned).numpy()
    got = np.asarray(mg.generate(mg.compile(graph), params, state, ids[:1], max_new_tokens=4,
                                 sampler=mg.sampling.BadWords(banned)))
    assert want[0, 7] != plain[0, 7]
    np.testing.assert_array_equal(got, want)
    # left padding whose pad id is the token greedy picks next: transformers 5 does not
    # count the left padding as seen (prompt_ignore_length), so the penalty spares it
    nxt = int(plain[1, 7])
    padded = np.array([[nxt, nxt, nxt, 8, 30, 8, 30]])
    with torch.no_grad():
        want = theirs.generate(torch.from_numpy(padded), attention_mask=torch.from_numpy(mask[1:]),
                               max_new_tokens=4, do_sample=False, pad_token_id=nxt,
                               repetition_penalty=5.0).numpy()
    for stream in (False, True):
        if stream:
            got = np.stack([np.asarray(t) for t in mg.generate_stream(
                mg.compile(graph), params, state, padded, attention_mask=mask[1:],
                max_new_tokens=4, sampler=mg.sampling.RepetitionPenalty(5.0), pad_token_id=nxt)], 1)
            np.testing.assert_array_equal(got, want[:, 7:])
        else:
            got = np.asarray(mg.generate(mg.compile(graph), params, state, padded,
                                         attention_mask=mask[1:], max_new_tokens=4,
                                         sampler=mg.sampling.RepetitionPenalty(5.0),
                                         pad_token_id=nxt))
            np.testing.assert_array_equal(got, want)


def _apply(module, *args, inference_mode=True, rng=None):
    graph, params, state = mg.from_torch(module, args)
    out, new_state = mg.compile(graph).apply(
        params, state, *[jnp.asarray(a.numpy()) for a in args], inference_mode=inference_mode,
        **({"rng": rng} if rng is not None else {}))
    return graph, params, (out if isinstance(out, tuple) else (out,)), new_state


def test_a_frozen_batch_norm_and_dropout_without_training_in_a_train_mode_module():
    torch.manual_seed(0)

    class Frozen(nn.Module):
        def __init__(self):
            super().__init__()
            self.c, self.bn, self.bn2 = nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.BatchNorm2d(4)
            self.head = nn.Linear(4, 2)

        def forward(self, x):
            y = self.bn2(self.bn(self.c(x)))
            return self.head(F.dropout(y, 0.5, training=False).mean((2, 3)))

    model = Frozen()
    with torch.no_grad():
        model.bn.running_mean.uniform_(-1, 1)
        model.bn.running_var.uniform_(0.5, 2)
    model.train()
    model.bn.eval()  # frozen: its running statistics, not updated
    x = torch.randn(4, 3, 8, 8) * 3 + 2
    graph, params, out, new_state = _apply(model, x, inference_mode=False, rng=jax.random.key(0))
    assert mg.aten.inference_mode(graph) is False
    ours = mg.models.to_state_dict(graph, params, new_state)
    with torch.no_grad():
        expected = model(x)
    _close(np.asarray(out[0]), expected)
    for key in ("bn.running_mean", "bn.running_var", "bn2.running_mean", "bn2.running_var"):
        _close(ours[key], model.state_dict()[key], tol=1e-5)


@pytest.mark.parametrize("kw,shape", [
    ({"size": (4, 5), "mode": "bilinear"}, (8, 10)),
    ({"scale_factor": 0.5, "mode": "bilinear"}, (8, 10)),
    ({"scale_factor": 1.5, "mode": "bilinear"}, (5, 7)),
    ({"scale_factor": 0.7, "mode": "bilinear", "align_corners": True}, (8, 10)),
    ({"size": (13, 4), "mode": "bilinear", "align_corners": True}, (8, 10)),
    ({"scale_factor": 1.7, "mode": "nearest"}, (8, 10)),
    ({"scale_factor": 0.6, "mode": "nearest"}, (8, 10)),
    ({"scale_factor": 1.7, "mode": "nearest", "recompute_scale_factor": True}, (8, 10)),
    ({"size": (3, 7), "mode": "nearest"}, (8, 10)),
])
def test_interpolate_as_pytorch(kw, shape):
    class Resize(nn.Module):
        def forward(self, x):
            return F.interpolate(x, **kw)

    x = torch.randn(1, 2, *shape) * 3
    _, _, out, _ = _apply(Resize(), x)
    _close(np.asarray(out[0]), Resize()(x), tol=1e-5)


def test_max_pool_indices_are_pytorch_s():
    class Pool(nn.Module):
        def forward(self, x):
            a, i = F.max_pool2d(x, 3, 2, padding=1, return_indices=True)
            b, j = F.max_pool2d(x, 2, 2, ceil_mode=True, return_indices=True, dilation=1)
            return a, i, b, j

    x = torch.randn(2, 3, 7, 9)
    x[0, 0, :3, :3] = 1.0  # ties: the first maximum, as PyTorch
    _, _, out, _ = _apply(Pool(), x)
    for ours, theirs in zip(out, Pool()(x)):
        np.testing.assert_array_equal(np.asarray(ours), theirs.numpy())


def test_softmax_dtype_and_clamp_of_integers_with_float_bounds():
    class M(nn.Module):
        def forward(self, x, n):
            return (F.softmax(x, -1, dtype=torch.float32), F.log_softmax(x, -1, dtype=torch.float32),
                    n.clamp(-2.5, 2.5), n.clamp(min=0.5))

    x, n = torch.randn(2, 50).half() * 4, torch.arange(-4, 5)
    _, _, out, _ = _apply(M(), x, n)
    for ours, theirs in zip(out, M()(x, n)):
        assert ours.dtype == jnp.dtype(str(theirs.dtype).replace("torch.", ""))
        _close(np.asarray(ours), theirs, tol=1e-6)


@pytest.mark.parametrize("kind", ["Dropout1d", "Dropout2d", "sdpa"])
def test_feature_and_attention_dropout_draw_in_train_mode(kind):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.drop = nn.Dropout1d(0.5) if kind == "Dropout1d" else nn.Dropout2d(0.5)

        def forward(self, x):
            if kind == "sdpa":
                return F.scaled_dot_product_attention(x, x, x, dropout_p=0.5 if self.training else 0.0)
            return self.drop(x.flatten(2) if kind == "Dropout1d" else x)

    x = torch.rand(4, 16, 6, 6) + 1
    model = M().train()
    graph, _, out, _ = _apply(model, x, inference_mode=False, rng=jax.random.key(0))
    assert mg.aten.inference_mode(graph) is False
    ours = np.asarray(out[0])
    if kind == "sdpa":
        # the attention weights dropped and scaled: some rows' sums of weights move off 1
        plain = F.scaled_dot_product_attention(x, x, x).numpy()
        assert not np.allclose(ours, plain)
        ones = torch.ones(4, 16, 6, 6)
        _, _, out1, _ = _apply(model, ones, inference_mode=False, rng=jax.random.key(0))
        kept = np.asarray(out1[0])  # rows of ones: the sum of the kept weights, times 2
        assert set(np.round(np.unique(kept) * 3, 4)) <= set(np.arange(0, 7) / 1.0)
    else:
        # whole channels are zeroed, the rest scaled by 2
        flat = ours.reshape(4, 16, -1)
        x_flat = x.numpy().reshape(4, 16, -1)
        zero = (flat == 0).all(-1)
        assert 0.2 < zero.mean() < 0.8
        np.testing.assert_allclose(flat[~zero], 2 * x_flat[~zero], rtol=1e-6)
    _, _, same, _ = _apply(model, x, inference_mode=True)
    _close(np.asarray(same[0]), M().eval()(x))


@pytest.mark.parametrize("layer,x", [
    (nn.Linear(4, 3), torch.randn(2, 4)), (nn.Conv2d(4, 3, 3), torch.randn(1, 4, 6, 6)),
    (nn.LayerNorm(4), torch.randn(2, 4)), (nn.Embedding(5, 3), torch.tensor([[1, 2]])),
    (nn.BatchNorm2d(4), torch.randn(2, 4, 3, 3))])
def test_a_bare_layer_as_the_module(layer, x):
    torch.manual_seed(0)
    layer = layer.eval()
    graph, params, out, state = _apply(layer, x)
    _close(np.asarray(out[0]), layer(x))
    ours = mg.models.to_state_dict(graph, params, state)
    for key, value in layer.state_dict().items():
        if key != "num_batches_tracked":
            np.testing.assert_array_equal(ours[key], value.numpy())


def test_train_mode_with_in_place_operations_and_batch_norm_options():
    torch.manual_seed(0)

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.c = nn.Conv2d(3, 4, 3, padding="same")
            self.bn = nn.BatchNorm2d(4)
            self.plain = nn.BatchNorm2d(4, affine=False)
            self.batch_only = nn.BatchNorm2d(4, track_running_stats=False)
            self.act = nn.ReLU(inplace=True)
            self.c2 = nn.Conv2d(4, 2, (2, 3), padding="same", dilation=2, bias=False)

        def forward(self, x):
            y = self.act(self.bn(self.c(x)))
            y += 1
            return self.c2(self.batch_only(self.plain(y)))

    model = M().train()
    x = torch.randn(4, 3, 8, 8)
    graph, params, out, new_state = _apply(model, x, inference_mode=False)
    assert mg.aten.inference_mode(graph) is False
    ours = mg.models.to_state_dict(graph, params, new_state)
    with torch.no_grad():
        expected = model(x)
    _close(np.asarray(out[0]), expected)
    for key in ("bn.running_mean", "bn.running_var", "plain.running_mean", "plain.running_var"):
        _close(ours[key], model.state_dict()[key], tol=1e-5)
    model.eval()
    _, _, out, _ = _apply(model, x)
    _close(np.asarray(out[0]), model(x))


def test_torch_cond_computes_the_branch_its_predicate_picks():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.l = nn.Linear(4, 4)

        def forward(self, x):
            return torch.cond(x.sum() > 0, lambda x: self.l(x).relu(), lambda x: x - 1, (x,))

    model = M()
    graph, params, state = mg.from_torch(model, (torch.randn(2, 4),))
    for x in (torch.ones(2, 4), -torch.ones(2, 4)):
        out, _ = mg.compile(graph).apply(params, state, jnp.asarray(x.numpy()), inference_mode=True)
        _close(np.asarray(out), model(x))


def test_inputs_and_modules_from_torch_cannot_take_are_named():
    class Two(nn.Module):
        def forward(self, x, y=None):
            return x if y is None else x + y

    with pytest.raises(mg.GraphError, match=r"input 'y' of the module is None, not a tensor"):
        mg.from_torch(Two(), (torch.randn(2, 4), None))
    with pytest.raises(mg.GraphError, match=r"input 'y' of the module is 2.0, not a tensor"):
        mg.from_torch(Two(), (torch.randn(2, 4), 2.0))
    with torch.device("meta"):
        meta = nn.Linear(4, 3)
    with pytest.raises(mg.GraphError, match=r"tensor 'weight' is on the meta device.*to_empty"):
        mg.from_torch(meta, (torch.randn(2, 4),))

    class Bessel(nn.Module):
        def forward(self, x):
            return torch.special.bessel_j0(x * 2)

    with pytest.raises(mg.GraphError, match=r"in module \(the top module\) \(File .*test_torch_live.py"
                                            r"\", line \d+, in forward\): the ATen operator"):
        mg.from_torch(Bessel(), (torch.randn(2, 4),))
    with pytest.raises(mg.ShapeError, match=r"specialized it to be a constant \(1\).*size 2 or more"):
        mg.from_torch(nn.Sequential(nn.Linear(4, 4)), (torch.randn(1, 4),),
                      dynamic_shapes=({0: torch.export.Dim("batch")},))

    with pytest.raises(mg.GraphError, match=r"aten\.instance_norm\.default with "
                                            r"track_running_stats=True in train mode .* is not supported"):
        mg.from_torch(nn.InstanceNorm2d(2, track_running_stats=True).train(), (torch.randn(2, 2, 4, 4),))


def test_a_module_s_own_buffer_updates_are_its_new_state():
    class Counting(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("count", torch.zeros(()))
            self.register_buffer("ema", torch.zeros(4))

        def forward(self, x):
            self.count += 1
            self.ema.mul_(0.9).add_(0.1 * x.mean(0))
            return x - self.ema

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.Sequential(nn.Linear(4, 4), Counting(), nn.BatchNorm1d(4), Counting())
            self.head = nn.Linear(4, 2)

        def forward(self, x):
            return self.head(self.blocks(x)), x * 2

    torch.manual_seed(0)
    model = Net().train()
    x = torch.randn(3, 4)
    graph, params, state = mg.from_torch(model, (x,))
    compiled = mg.compile(graph)
    for _ in range(2):  # the second call from the first's state, as the module's
        out, state = compiled.apply(params, state, jnp.asarray(x.numpy()), inference_mode=False)
        with torch.no_grad():
            expected = model(x)
        for ours, theirs in zip(out, expected):
            _close(np.asarray(ours), theirs)
    ours = mg.models.to_state_dict(graph, params, state)
    for key, value in model.state_dict().items():
        if not key.endswith("num_batches_tracked"):
            _close(ours[key], value, tol=1e-5)
    assert {"blocks.1.count", "blocks.3.ema", "blocks.2.running_mean"} <= set(ours)
    assert float(ours["blocks.3.count"]) == 2.0
    assert graph.select(op="linear") == ["blocks/0", "head"]

    class Reading(nn.Module):  # a buffer read, and a tensor computed from it written in place
        def __init__(self):
            super().__init__()
            self.register_buffer("scale", torch.full((4,), 2.0))
            self.bn = nn.BatchNorm1d(4)

        def forward(self, x):
            y = self.scale * x
            y.add_(1)
            return self.bn(y)

    model = Reading().train()
    x = torch.randn(3, 4)
    _, _, out, _ = _apply(model, x, inference_mode=False)
    with torch.no_grad():
        _close(np.asarray(out[0]), model(x))


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_a_save_pretrained_folder_of_a_tied_model_loads_into_its_imported_graph(kind, tmp_path):
    import transformers
    torch.manual_seed(0)
    if kind == "gpt2":
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
            vocab_size=100, n_embd=32, n_layer=2, n_head=4, n_positions=32, use_cache=False))
    else:
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
            vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
            num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True, use_cache=False))
    model = model.eval()
    model.save_pretrained(tmp_path)
    ids = torch.randint(0, 100, (2, 8))
    graph, _, _ = mg.from_torch(model, (ids,))
    params, state = mg.models.load_state_dict(graph, tmp_path)  # lm_head.weight is not in it
    out, _ = mg.compile(graph).apply(params, state, jnp.asarray(ids.numpy(), jnp.int32),
                                     inference_mode=True)
    with torch.no_grad():
        _close(np.asarray(out[0] if isinstance(out, tuple) else out), model(ids).logits)


def test_further_activations_and_logsumexp():
    class M(nn.Module):
        def forward(self, x):
            return (F.softplus(x), F.softplus(x, beta=2, threshold=3), F.logsigmoid(x), F.selu(x),
                    F.celu(x, 0.5), F.glu(x, -1), F.hardshrink(x, 0.3), torch.logsumexp(x, -1),
                    torch.logsumexp(x, (0, 1), keepdim=True))

    x = torch.randn(3, 4, 6) * 4
    _, _, out, _ = _apply(M(), x)
    for ours, theirs in zip(out, M()(x), strict=True):
        _close(np.asarray(ours), theirs, tol=1e-5)


def test_dropout_of_probability_one_zeroes_everything_in_train_mode():
    class M(nn.Module):
        def forward(self, x):
            return F.dropout(x, 1.0, training=True) + F.dropout(x, 0.0, training=True)

    x = torch.randn(4, 5)
    graph, _, out, _ = _apply(M(), x, inference_mode=False, rng=jax.random.key(0))
    _close(np.asarray(out[0]), M()(x))
    _, _, same, _ = _apply(M(), x, inference_mode=True)
    np.testing.assert_array_equal(np.asarray(same[0]), 2 * x.numpy())


def test_shuffles_instance_norm_prelu_and_further_tensor_functions():
    torch.manual_seed(0)

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.prelu, self.prelu1 = nn.PReLU(8), nn.PReLU()
            self.inorm = nn.InstanceNorm2d(8, affine=True)
            self.inorm_plain = nn.InstanceNorm2d(8)

        def forward(self, x, y):
            return (F.pixel_shuffle(x, 2), F.pixel_unshuffle(x, 2), self.prelu(x), self.prelu1(x),
                    self.inorm(x), self.inorm_plain(x), F.threshold(x, 0.1, -3.0), torch.frac(x),
                    torch.floor_divide(x, 0.7), torch.cumprod(x, 1), torch.addcmul(x, x, y, value=0.5),
                    torch.addcdiv(x, x, y.abs() + 1, value=2), x.narrow(2, 1, 3),
                    torch.nan_to_num(x / y.round(), posinf=9.0))

    x, y = torch.randn(2, 8, 4, 6), torch.randn(2, 8, 4, 6)
    with torch.no_grad():
        model = M().eval()
        model.prelu.weight.uniform_(0, 1)
        model.inorm.weight.uniform_(0.5, 1.5)
        _, _, out, _ = _apply(model, x, y)
        for ours, theirs in zip(out, model(x, y), strict=True):
            _close(np.asarray(ours), theirs, tol=1e-5)


@pytest.mark.parametrize("kw", [
    {"stride": 2}, {"stride": 2, "padding": 1, "output_padding": 1},
    {"stride": (2, 3), "padding": (0, 2), "dilation": 2, "groups": 2}, {"dims": 1, "stride": 3, "padding": 1}])
def test_transposed_convolution(kw):
    torch.manual_seed(0)
    dims = kw.pop("dims", 2)
    cls = nn.ConvTranspose1d if dims == 1 else nn.ConvTranspose2d
    layer = nn.Sequential(cls(4, 6, 3, **kw)).eval()
    x = torch.randn(2, 4, *((5,) if dims == 1 else (5, 7)))
    graph, _, out, _ = _apply(layer, x)
    _close(np.asarray(out[0]), layer(x), tol=1e-5)
    core = torch.export.export(layer, (x,)).run_decompositions()  # aten.convolution, transposed
    g2, p2, s2 = mg.from_torch(core)
    out2, _ = mg.compile(g2).apply(p2, s2, jnp.asarray(x.numpy()), inference_mode=True)
    _close(np.asarray(out2), layer(x), tol=1e-5)


def test_a_bare_batch_norm_in_train_mode_updates_its_running_statistics():
    torch.manual_seed(0)
    layer = nn.BatchNorm2d(4, momentum=0.3).train()
    x = torch.randn(3, 4, 5, 5) * 2 + 1
    graph, params, out, new_state = _apply(layer, x, inference_mode=False)
    with torch.no_grad():
        expected = layer(x)
    _close(np.asarray(out[0]), expected)
    ours = mg.models.to_state_dict(graph, params, new_state)
    for key in ("running_mean", "running_var", "weight", "bias"):
        _close(ours[key], layer.state_dict()[key], tol=1e-5)
