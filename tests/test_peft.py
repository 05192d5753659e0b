"""PEFT adapter folders: fixtures written here from PEFT's documented format
(``adapter_config.json``, ``adapter_model.safetensors`` under ``base_model.model.``),
read into adapted graphs and checked against the base model with the adapters merged
into its weights in NumPy, as PEFT merges them; written back; bad folders refused."""

import json
import re
import warnings

import jax
import numpy as np
import pytest
from _torch_file import write_torch_file
from safetensors.numpy import load_file, save_file

import mlaxgraph as mg
from mlaxgraph.ir.scan import unfold_scans
from mlaxgraph.ir.surgery import layer_paths

GPT2 = {"n_layer": 2, "n_embd": 16, "n_head": 2, "vocab_size": 40, "n_positions": 8}
LLAMA = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 40,
         "tie_word_embeddings": False}


def _folder(tmp_path, config, weights, name="adapter"):
    folder = tmp_path / name
    folder.mkdir()
    fields = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": "x",
              "bias": "none", "fan_in_fan_out": False, "lora_dropout": 0.0,
              "modules_to_save": None, "use_dora": False, "init_lora_weights": True, **config}
    (folder / "adapter_config.json").write_text(json.dumps(fields))
    save_file({k: np.ascontiguousarray(v, np.float32) for k, v in weights.items()},
              str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})
    return folder


def _base(graph, seed=0):
    params, state = mg.compile(graph).init(jax.random.key(seed))
    return mg.models.to_state_dict(graph, params, state)


def _zeros(graph):
    """Params of ``graph``'s shapes, zeros (nothing drawn or compiled)."""
    shapes = jax.eval_shape(mg.compile(graph).init, jax.random.key(0))[0]
    return jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), shapes)


def _apply(graph, params, state, ids):
    out, _ = mg.compile(graph).apply(params, state, ids, inference_mode=True)
    return np.asarray(out)


@pytest.fixture(scope="module")
def gpt2_adapter(tmp_path_factory):
    """GPT-2 with PEFT's adapters on c_attn (the fused Conv1D) and mlp.c_fc and the
    embedding wte, and the base state dict with them merged as PEFT merges."""
    tmp = tmp_path_factory.mktemp("gpt2")
    g = mg.models.gpt2(GPT2)
    base = _base(g)
    rng = np.random.default_rng(0)
    d, r, alpha = 16, 4, 12
    weights, merged = {}, dict(base)
    for i in range(2):
        for module, out in ((f"h.{i}.attn.c_attn", 3 * d), (f"h.{i}.mlp.c_fc", 4 * d)):
            a, b = rng.normal(size=(r, d)) * 0.3, rng.normal(size=(out, r)) * 0.3
            weights[f"base_model.model.transformer.{module}.lora_A.weight"] = a
            weights[f"base_model.model.transformer.{module}.lora_B.weight"] = b
            # Conv1D stores (in, out): PEFT's fan_in_fan_out merge adds (B @ A).T
            merged[f"{module}.weight"] = base[f"{module}.weight"] + (alpha / r) * (b @ a).T
    a, b = rng.normal(size=(r, 40)) * 0.3, rng.normal(size=(d, r)) * 0.3
    weights["base_model.model.transformer.wte.lora_embedding_A"] = a
    weights["base_model.model.transformer.wte.lora_embedding_B"] = b
    folder = _folder(tmp, {"r": r, "lora_alpha": alpha, "fan_in_fan_out": True,
                           "target_modules": ["c_attn", "c_fc", "wte"]}, weights)
    return g, base, merged, weights, folder


def test_gpt2_adapter_equals_the_merged_base(gpt2_adapter):
    g, base, merged, _, folder = gpt2_adapter
    adapted = mg.lora_from_peft(g, folder)
    assert dict(adapted.walk())["h.1/attn"].op.adapters == ("qkv",)
    params, state = mg.models.load_state_dict(adapted, base, adapter=folder)
    ids = np.random.default_rng(1).integers(0, 40, (2, 8)).astype(np.int32)
    out = _apply(adapted, params, state, ids)
    # The embedding's adapter changes the input side only (wte read as a table): the
    # tied head keeps the base table, so the reference merges the table for lookups
    # by adding the adapter's rows to the embedded input instead.
    m_params, m_state = mg.models.load_state_dict(g, {**merged, "wte.weight": base["wte.weight"]})
    wte_delta = (12 / 4) * (np.asarray(gpt2_adapter[3]["base_model.model.transformer.wte.lora_embedding_B"])
                            @ np.asarray(gpt2_adapter[3]["base_model.model.transformer.wte.lora_embedding_A"])).T
    probe = mg.compile(g).apply(m_params, m_state, ids, inference_mode=True,
                                intervene={"wte": lambda v: v + wte_delta[ids]})[0]
    np.testing.assert_allclose(out, np.asarray(probe), rtol=2e-4, atol=2e-4)


def test_an_embedding_targets_base_layer_saved_with_the_adapter_is_loaded_over_the_base(
        gpt2_adapter, tmp_path):
    # PEFT's save_embedding_layers writes the target's table as <module>.base_layer.weight
    # (by default when an embedding is targeted): it was an unexpected name, strict or not
    g, base, _, weights, _ = gpt2_adapter
    config = {"r": 4, "lora_alpha": 12, "fan_in_fan_out": True,
              "target_modules": ["c_attn", "c_fc", "wte"]}
    first = _folder(tmp_path, config, weights, "a")
    adapted = mg.lora_from_peft(g, first)
    plain, _ = mg.models.load_state_dict(adapted, base, adapter=first)
    table = base["wte.weight"] + 0.5  # PEFT loads the saved table over the base model's
    copy = {**weights, "base_model.model.transformer.wte.base_layer.weight": table}
    params, state = mg.models.load_state_dict(adapted, base, adapter=_folder(tmp_path, config, copy, "b"))
    np.testing.assert_array_equal(params["wte"]["embedding"], table)
    for block in ("h.0", "h.1"):  # the adapters as without the copy
        jax.tree.map(np.testing.assert_array_equal, params[block], plain[block])


def test_saved_adapter_is_the_same_folder_back(gpt2_adapter, tmp_path):
    g, base, _, weights, folder = gpt2_adapter
    adapted = mg.lora_from_peft(g, folder)
    params, state = mg.models.load_state_dict(adapted, base, adapter=folder)
    mg.models.save_adapter(adapted, params, tmp_path / "out", base_model_name_or_path="gpt2")
    written = load_file(str(tmp_path / "out" / "adapter_model.safetensors"))
    assert sorted(written) == sorted(weights)
    for name, value in weights.items():
        np.testing.assert_allclose(written[name], value, rtol=1e-6)
    config = json.loads((tmp_path / "out" / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["fan_in_fan_out"]) == (4, 12.0, True)
    assert "transformer.h.0.attn.c_attn" in config["target_modules"]
    again = mg.lora_from_peft(g, tmp_path / "out")
    assert again == adapted
    p2, _ = mg.models.load_state_dict(again, base, adapter=tmp_path / "out")
    sd = mg.models.to_state_dict(again, p2, adapter_only=True)
    assert sorted(sd) == sorted(weights)


def test_llama_patterns_rslora_and_modules_to_save(tmp_path):
    g = mg.models.llama(LLAMA)
    base = _base(g)
    rng = np.random.default_rng(2)
    weights, merged = {}, dict(base)
    ranks = {"q_proj": 4, "v_proj": 2, "o_proj": 4}
    widths = {"q_proj": (16, 16), "v_proj": (16, 8), "o_proj": (16, 16)}   # (in, out); 2 kv heads of 4
    alpha = {"q_proj": 8.0, "v_proj": 8.0, "o_proj": 2.0}
    for i in range(2):
        for proj, r in ranks.items():
            module = f"model.layers.{i}.self_attn.{proj}"
            d_in, d_out = widths[proj]
            a, b = rng.normal(size=(r, d_in)) * 0.3, rng.normal(size=(d_out, r)) * 0.3
            weights[f"base_model.model.{module}.lora_A.weight"] = a
            weights[f"base_model.model.{module}.lora_B.weight"] = b
            merged[f"{module}.weight"] = base[f"{module}.weight"] + alpha[proj] / np.sqrt(r) * (b @ a)
    # PEFT's modules_to_save matches the end of a name, at a dot or not: "norm" saves
    # the final norm and each block's two norms
    norms = ["model.norm"] + [f"model.layers.{i}.{n}" for i in range(2)
                              for n in ("input_layernorm", "post_attention_layernorm")]
    for module in norms:
        weights[f"base_model.model.{module}.weight"] = merged[f"{module}.weight"] = \
            rng.normal(size=(16,))
    norm = weights["base_model.model.model.norm.weight"]
    folder = _folder(tmp_path, {
        "r": 4, "lora_alpha": 8, "use_rslora": True, "target_modules": ["q_proj", "v_proj", "o_proj"],
        "rank_pattern": {"v_proj": 2}, "alpha_pattern": {"o_proj": 2}, "modules_to_save": ["norm"]},
        weights)
    adapted = mg.lora_from_peft(g, folder)
    assert dict(adapted.walk())["model.layers.0/self_attn"].op.adapters == ("query", "value", "out")
    params, state = mg.models.load_state_dict(adapted, base, adapter=folder)
    np.testing.assert_array_equal(np.asarray(params["model.norm"]["scale"]), norm.astype(np.float32))
    ids = np.random.default_rng(3).integers(0, 40, (2, 6)).astype(np.int32)
    want = _apply(g, *mg.models.load_state_dict(g, merged), ids)
    np.testing.assert_allclose(_apply(adapted, params, state, ids), want, rtol=2e-4, atol=2e-4)
    # written back like the folder read: its modules_to_save's weights, its descriptive fields
    out = tmp_path / "out"
    mg.models.save_adapter(adapted, params, out, like=folder)
    written = json.loads((out / "adapter_config.json").read_text())
    assert (written["modules_to_save"], written["task_type"], written["base_model_name_or_path"]) == (
        ["norm"], "CAUSAL_LM", "x")
    from safetensors.numpy import load_file
    files = load_file(str(out / "adapter_model.safetensors"))
    assert sorted(files) == sorted(weights)
    for name, value in weights.items():
        np.testing.assert_allclose(files[name], value, rtol=1e-6, atol=1e-7)
    again = mg.models.load_state_dict(mg.lora_from_peft(g, out), base, adapter=out)
    np.testing.assert_allclose(_apply(adapted, *again, ids), want, rtol=2e-4, atol=2e-4)
    # without like=, modules_to_save= names them; the descriptive fields given
    mg.models.save_adapter(adapted, params, tmp_path / "named", modules_to_save=["model.norm"],
                           task_type="CAUSAL_LM")
    named = load_file(str(tmp_path / "named" / "adapter_model.safetensors"))
    assert "base_model.model.model.norm.weight" in named
    assert "base_model.model.model.layers.0.input_layernorm.weight" not in named
    with pytest.raises(mg.ConfigError, match=r"modules_to_save names 'model.nrom', which is no "
                                             r"module of graph 'llama'; near names: model.norm"):
        mg.models.save_adapter(adapted, params, tmp_path / "typo", modules_to_save=["model.nrom"])
    regex = _folder(tmp_path, {"r": 4, "lora_alpha": 8, "target_modules": r".*layers\.1\.self_attn\.(q|v)_proj"},
                    {}, name="regex")
    assert [p for p in mg.lora_from_peft(g, regex).select("**/*.lora_A")] == [
        "model.layers.1/self_attn.query.lora_A", "model.layers.1/self_attn.value.lora_A"]


@pytest.mark.parametrize("field, value, words", [
    ("use_dora", True, "'use_dora' = True: asks for DoRA"),
    ("bias", "all", "'bias' = 'all': asks for training biases"),
    ("layers_to_transform", [0], "'layers_to_transform'"),
    ("frobnicate", 3, "'frobnicate' = 3: not a field"),
    ("target_modules", ["ln_1"], "selects 'h.0.ln_1'.*op layer_norm"),
    ("modules_to_save", ["score"], "modules_to_save names 'score'"),
    ("modules_to_save", ["wte"], r"modules_to_save names 'wte', whose weights graph 'gpt2' calls "
     r"twice \('wte' is the embedding and the tied output head\)"),
    ("modules_to_save", ["lm_head"], r"names 'lm_head', which is no module of graph 'gpt2' \(its "
     r"output head is tied to 'wte.weight'"),
    ("rank_pattern", {"c_attn(": 2}, "key 'c_attn\\(' is not a regular expression"),
    # a module holding others (GPT2MLP, GPT2Block): PEFT refuses its type
    ("target_modules", ["c_attn", "mlp"], r"target_modules names 'mlp', a module holding others "
     r"\('transformer.h.0.mlp.c_fc' ...\), which PEFT refuses"),
    ("target_modules", ["c_attn", "h.1"], r"names 'h.1', a module holding others"),
    # PEFT adapts the tied head as a Linear of its own; here it is wte's second call
    ("target_modules", ["c_attn", "lm_head"], r"target_modules \('c_attn', 'lm_head'\) names "
     r"'lm_head', the output head tied to 'wte.weight', which PEFT adapts as a Linear"),
    ("target_modules", r".*\.c_attn|lm_head", r"names 'lm_head', the output head tied to"),
    ("modules_to_save", ["attn"], r"modules_to_save \['attn'\] removes all 2 modules that "
     r"target_modules \('c_attn',\) selects"),
    ("exclude_modules", ["c_attn"], r"exclude_modules \('c_attn',\) removes all 2 modules that "
     r"target_modules \('c_attn',\) selects \(h.0.attn.c_attn, h.1.attn.c_attn\)"),
    ("init_lora_weights", "pissa", "'init_lora_weights' = 'pissa': asks for an "
     "initialization mlaxgraph does not draw \\(PiSSA, OLoRA, LoftQ, EVA and CorDA also "
     "change the base model's weights"),
    ("init_lora_weights", 1, "'init_lora_weights' = 1"),
    ("r", 0, "'r' = 0: must be an int"),
    ("lora_dropout", 1.5, "'lora_dropout' = 1.5"),
    ("peft_type", "IA3", "only LoRA"),
    ("lora_aplha", 3, r"'lora_aplha' = 3: not a field mlaxgraph knows \(did you mean 'lora_alpha'\?\)"),
])
def test_fields_it_cannot_honour_are_named(tmp_path, field, value, words):
    folder = _folder(tmp_path, {"r": 2, "lora_alpha": 4, "target_modules": ["c_attn"], field: value}, {})
    with pytest.raises(mg.ConfigError, match=words):
        mg.lora_from_peft(mg.models.gpt2(GPT2), folder)


@pytest.mark.parametrize("field, value, words", [
    ("target_modules", ["c_attn", "c_atn"], r"target_modules names 'c_atn' \(near names: c_attn"),
    ("target_modules", ["c_attn", "attn.c_atn"], r"names 'attn.c_atn' \(near names: attn.c_attn"),
    ("target_modules", ["c_attn", "q_proj", "v_proj"], r"names 'q_proj' \(near names: c_proj\); 'v_proj'"),
    ("rank_pattern", {"c_atn": 2}, r"rank_pattern key 'c_atn' \(near names: .*c_attn.*\): matches "
     "none of the adapted modules"),
    ("alpha_pattern", {"h.0.attn.c_attn": 2, "h.7.attn.c_attn": 2},
     "alpha_pattern key 'h.7.attn.c_attn'.*matches none"),
    ("exclude_modules", ["c_atn"], "exclude_modules names 'c_atn'.*which is no module"),
])
def test_names_that_match_nothing_are_ignored_as_peft_ignores_them_with_a_warning(
        tmp_path, field, value, words):
    fields = {"r": 2, "lora_alpha": 4, "target_modules": ["c_attn"], field: value}
    g = mg.models.gpt2(GPT2)
    with pytest.warns(mg.AdapterWarning, match=words):
        adapted = mg.lora_from_peft(g, _folder(tmp_path, fields, {}))
    plain = {k: v for k, v in fields.items() if k != field}
    plain["target_modules"] = ["c_attn"]
    if field == "alpha_pattern":
        plain["alpha_pattern"] = {"h.0.attn.c_attn": 2}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert adapted == mg.lora_from_peft(g, plain)


def test_peft_rules_modules_to_save_holders_legacy_fields_and_the_case_of_all_linear(tmp_path):
    g = mg.models.gpt2(GPT2)
    # a module in modules_to_save gets no adapter (PEFT's check_target_module_exists)
    adapted = mg.lora_from_peft(g, {"r": 2, "target_modules": ["c_attn", "c_fc"],
                                    "modules_to_save": ["h.1.mlp"]})
    paths = [p for p, _ in layer_paths(unfold_scans(adapted)) if p.endswith(".lora_A")]
    assert "h.1/mlp.c_fc.lora_A" not in paths and "h.0/mlp.c_fc.lora_A" in paths
    assert "h.1/attn.qkv.lora_A" in paths
    # peft <= 0.2's merge_weights and a null flag read as PEFT reads them
    legacy = {"r": 2, "target_modules": ["c_attn"], "merge_weights": True, "use_rslora": None,
              "fan_in_fan_out": None}
    assert mg.lora_from_peft(g, legacy) == mg.lora_from_peft(g, {"r": 2, "target_modules": ["c_attn"]})
    assert mg.lora_from_peft(g, {"r": 2, "target_modules": "All-Linear"}) == \
        mg.lora_from_peft(g, {"r": 2, "target_modules": "all-linear"})


def test_a_config_dict_is_read_as_its_file(gpt2_adapter):
    """A dict of the fields (json.load of the file; PEFT's LoraConfig.to_dict() holds
    target_modules as a set) gives the graph the folder gives."""
    g, _, _, _, folder = gpt2_adapter
    fields = json.loads((folder / "adapter_config.json").read_text())
    assert mg.lora_from_peft(g, fields) == mg.lora_from_peft(g, folder)
    as_set = {**fields, "target_modules": set(fields["target_modules"]), "rank_pattern": {"wte": 2}}
    adapted = mg.lora_from_peft(g, as_set)
    assert adapted.node("wte.lora_A").op.features == 2
    assert adapted.node("h.0").op.subgraph().node("mlp.c_fc.lora_A").op.features == 4
    with pytest.raises(mg.ConfigError, match="adapter config .dict.: field 'r' = 0"):
        mg.lora_from_peft(g, {**fields, "r": 0})
    # null for a flag (use_dora: null, as some configs hold it) is its default: no DoRA
    assert mg.lora_from_peft(g, {**fields, "use_dora": None}) == mg.lora_from_peft(g, fields)
    with pytest.raises(mg.ConfigError, match="a folder, its adapter_config.json, a dict"):
        mg.lora_from_peft(g, 3)
    with pytest.raises(mg.SerializationError, match="from a PEFT adapter folder"):
        mg.models.load_state_dict(adapted, {}, adapter=fields)


def test_bad_folders_are_errors(gpt2_adapter, tmp_path):
    g, base, _, weights, folder = gpt2_adapter
    adapted = mg.lora_from_peft(g, folder)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "adapter_config.json").write_text('{"r": 4,\n "target_modules": [c_attn]}')
    with pytest.raises(mg.ConfigError, match="adapter_config.json, line 2"):
        mg.lora_from_peft(g, broken)
    name = "base_model.model.transformer.h.1.mlp.c_fc.lora_B.weight"
    config = json.loads((folder / "adapter_config.json").read_text())
    short = _folder(tmp_path, config, {k: v for k, v in weights.items() if k != name}, "short")
    with pytest.raises(mg.SerializationError, match="(?s)missing 1 weight.*h.1.mlp.c_fc.lora_B"):
        mg.models.load_state_dict(adapted, base, adapter=short)
    extra = _folder(tmp_path, config, {**weights, "base_model.model.transformer.h.0.attn.c_proj.lora_A.weight":
                                       np.zeros((4, 16))}, "extra")
    with pytest.raises(mg.SerializationError, match=r"(?s)does not hold .*\(strict=False ignores "
                                                    r"the unexpected ones\).*c_proj.lora_A"):
        mg.models.load_state_dict(adapted, base, adapter=extra)
    loose = mg.models.load_state_dict(adapted, base, adapter=extra, strict=False)   # as it says
    for a, b in zip(jax.tree.leaves(loose), jax.tree.leaves(mg.models.load_state_dict(adapted, base, adapter=folder))):
        np.testing.assert_array_equal(a, b)
    empty = _folder(tmp_path, config, {}, "empty")
    (empty / "adapter_model.safetensors").unlink()
    with pytest.raises(mg.SerializationError, match=r"adapter_model\.safetensors: no such file "
                                                    r"\(nor adapter_model\.bin\)"):
        mg.models.load_state_dict(adapted, base, adapter=empty)
    (empty / "adapter_model.bin").write_bytes(b"\x80\x04")  # a bare pickle: never unpickled
    with pytest.raises(mg.SerializationError, match="adapter_model.bin"):
        mg.models.load_state_dict(adapted, base, adapter=empty)


def test_an_adapter_model_bin_of_peft_before_safetensors_loads_without_torch(gpt2_adapter, tmp_path):
    import sys

    g, base, _, weights, folder = gpt2_adapter
    adapted = mg.lora_from_peft(g, folder)
    config = json.loads((folder / "adapter_config.json").read_text())
    legacy = _folder(tmp_path, config, {}, "legacy")
    (legacy / "adapter_model.safetensors").unlink()
    write_torch_file(legacy / "adapter_model.bin", weights)
    expected, _ = mg.models.load_state_dict(adapted, base, adapter=folder)
    got, _ = mg.models.load_state_dict(adapted, base, adapter=legacy)
    assert jax.tree.structure(got) == jax.tree.structure(expected)
    jax.tree.map(np.testing.assert_array_equal, got, expected)
    assert "torch" not in sys.modules
    with pytest.raises(mg.SerializationError, match="has no adapters"):
        mg.models.load_state_dict(g, base, adapter=folder)
    # the folder given first (save_adapter takes graph, params, folder)
    with pytest.raises(mg.GraphError, match=r"save_adapter\(graph, params, folder\) takes the "
                                            r"adapted Graph and its params \(a dict\), got PosixPath"):
        mg.models.save_adapter(tmp_path / "out", adapted, {})


def test_adapters_with_different_dropouts_are_not_saved_as_one(tmp_path):
    """PEFT's config has one lora_dropout: different ones are named, not silently
    written as one; lora_dropout= chooses; an Embedding's adapter has none to count."""
    g = mg.models.gpt2(GPT2)
    mixed = mg.lora(mg.lora(g, "h.*/mlp.c_fc", rank=2, dropout=0.1), "h.*/attn/qkv", rank=2,
                    dropout=0.3)
    params = _zeros(mixed)
    with pytest.raises(mg.SerializationError, match=r"different dropouts \(0.1 on transformer"
                       r".h.0.mlp.c_fc, .*0.3 on transformer.h.0.attn.c_attn.*one lora_dropout"):
        mg.models.save_adapter(mixed, params, tmp_path / "mixed")
    assert not (tmp_path / "mixed").exists()
    mg.models.save_adapter(mixed, params, tmp_path / "chosen", lora_dropout=0.3)
    config = json.loads((tmp_path / "chosen" / "adapter_config.json").read_text())
    assert config["lora_dropout"] == 0.3
    assert mg.lora_from_peft(g, tmp_path / "chosen") == mg.lora(
        g, ["h.*/mlp.c_fc", "h.*/attn/qkv"], rank=2, dropout=0.3)
    with pytest.raises(mg.SerializationError, match="lora_dropout must be a number in"):
        mg.models.save_adapter(mixed, params, tmp_path / "bad", lora_dropout=1.0)
    one = mg.lora(g, ["wte", "h.*/mlp.c_fc"], rank=2, dropout=0.2)   # wte's adapter: no dropout
    mg.models.save_adapter(one, _zeros(one), tmp_path / "one")
    assert json.loads((tmp_path / "one" / "adapter_config.json").read_text())["lora_dropout"] == 0.2
    assert mg.lora_from_peft(g, tmp_path / "one") == one


def test_an_adapter_the_checkpoints_layout_has_no_module_for_names_what_to_adapt(tmp_path):
    """GPT-2's checkpoint fuses query, key and value into c_attn: an adapter of the query
    alone has no PEFT form; the error names the projections that have one."""
    g = mg.models.gpt2(GPT2)
    adapted = mg.lora(g, "h.*/attn", rank=2)   # the attention's default: query and value
    with pytest.raises(mg.SerializationError, match=(
            r"layer 'h.0/attn.query.lora_A': .* names the attention projections qkv, out, "
            r"not 'query'.*\(h.0/attn/qkv as c_attn, h.0/attn/out as c_proj\), "
            r"e.g. mg.lora\(graph, 'h.0/attn/qkv', rank=...\)")):
        mg.models.save_adapter(adapted, _zeros(adapted), tmp_path / "query")
    with pytest.raises(mg.SerializationError, match=r"not .query.: .*mg.lora\(graph, .h.0/attn/qkv."):
        mg.models.to_state_dict(adapted, _zeros(adapted), {}, adapter_only=True)
    assert not (tmp_path / "query").exists()


def test_qlora_reads_the_float_base_and_its_peft_adapter(gpt2_adapter, tmp_path):
    """A quantized graph reads a float state dict (and a PEFT folder): the float weights,
    quantized by absmax as NumPy computes it here; its adapters save under the float
    model's names. Writing the quantized weights as a PyTorch state dict is refused."""
    g, base, _, weights, folder = gpt2_adapter
    qlora = mg.lora_from_peft(mg.quantize(g, "int8"), folder)
    params, state = mg.models.load_state_dict(qlora, base, adapter=folder)
    w = np.asarray(base["h.1.mlp.c_fc.weight"], np.float32)   # Conv1D: (in, out), as ours
    scale = np.abs(w).max(axis=0) / 127
    np.testing.assert_array_equal(np.asarray(params["h.1"]["mlp.c_fc"]["kernel"]),
                                  np.round(w / scale).astype(np.int8))
    np.testing.assert_allclose(np.asarray(params["h.1"]["mlp.c_fc"]["kernel_scale"]), scale,
                               rtol=1e-6)
    a = weights["base_model.model.transformer.h.0.attn.c_attn.lora_A.weight"]
    np.testing.assert_allclose(np.asarray(params["h.0"]["attn.qkv.lora_A"]["kernel"]), a.T,
                               rtol=1e-6)
    mg.models.save_adapter(qlora, params, tmp_path / "again")
    written = load_file(str(tmp_path / "again" / "adapter_model.safetensors"))
    assert sorted(written) == sorted(weights)
    np.testing.assert_allclose(written["base_model.model.transformer.wte.lora_embedding_A"],
                               weights["base_model.model.transformer.wte.lora_embedding_A"],
                               rtol=1e-6)
    with pytest.raises(mg.SerializationError, match=r"to_state_dict: layer '.*' \(quantize.*"
                       r"is quantized.*the graph before mg.quantize"):
        mg.models.to_state_dict(qlora, params, state)
    # without an adapter: what the float route gives (load float, then quantize_weights)
    qg = mg.quantize(g, "int8")
    got = mg.models.load_state_dict(qg, base)
    jax.tree.map(np.testing.assert_array_equal, got,
                 mg.quantize_weights(qg, *mg.models.load_state_dict(g, base)))


@pytest.mark.parametrize("init", [True, False, "gaussian"])
def test_init_lora_weights_draws_the_adapters_as_peft_and_is_written_back(tmp_path, init):
    """PEFT's init_lora_weights: True, A uniform in +-1/sqrt(fan_in) and B zero;
    "gaussian", A normal of std 1/r and B zero; False, B drawn as PyTorch draws a new
    Linear (uniform in +-1/sqrt(r)) and an Embedding's A standard normal."""
    g = mg.models.gpt2({**GPT2, "n_embd": 64, "vocab_size": 400})
    folder = _folder(tmp_path, {"r": 8, "lora_alpha": 8, "target_modules": ["c_fc", "wte"],
                                "init_lora_weights": init}, {})
    adapted = mg.lora_from_peft(g, folder)
    params, _ = mg.compile(adapted).init(jax.random.key(0))
    a = np.asarray(params["h.0"]["mlp.c_fc.lora_A"]["kernel"])      # (64, 8)
    b = np.asarray(params["h.0"]["mlp.c_fc.lora_B"]["kernel"])      # (8, 256)
    table = np.asarray(params["wte.lora_A"]["embedding"])           # (400, 8)
    if init == "gaussian":
        assert abs(a.std() - 1 / 8) < 0.02 and np.abs(a).max() > 1 / 8
    else:
        assert np.abs(a).max() <= 1 / 8 and abs(a.std() - (1 / 8) / np.sqrt(3)) < 0.01
    if init is False:
        assert np.abs(b).max() <= 1 / np.sqrt(8) and abs(b.std() - 1 / np.sqrt(24)) < 0.02
        assert abs(table.std() - 1) < 0.05
    else:
        assert not b.any() and not table.any()
    mg.models.save_adapter(adapted, params, tmp_path / "back")
    written = json.loads((tmp_path / "back" / "adapter_config.json").read_text())
    assert written["init_lora_weights"] == init and type(written["init_lora_weights"]) is type(init)
    assert mg.lora_from_peft(g, tmp_path / "back") == adapted
    with pytest.raises(mg.ConfigError, match="init_weights must be one of"):
        mg.lora(g, "h.0/mlp.c_fc", rank=2, init_weights="pissa")


def _peft_targets(config, module):
    """PEFT's check_target_module_exists for target_modules (a regular expression
    matching the whole name, or names matching at the end, at a dot)."""
    spec = config["target_modules"]
    if isinstance(spec, str):
        return re.fullmatch(spec, module) is not None
    return any(module == name or module.endswith("." + name) for name in spec)


def _peft_pattern(patterns, module, default):
    """PEFT's get_pattern_key: the first key matching the end of the name at a dot."""
    return next((v for k, v in patterns.items() if re.match(rf"(.*\.)?({k})$", module)), default)


def test_save_adapter_names_a_top_level_module_so_peft_adapts_it_alone(tmp_path):
    """ResNet's top-level conv1 ends the name of every block's conv1: a list would have
    PEFT adapt all nine."""
    g = mg.models.resnet18(10, image_size=32)
    adapted = mg.lora(mg.lora(g, "conv1", rank=3, alpha=5), "layer1.0/conv2", rank=2, alpha=2)
    params, state = mg.compile(adapted).init(jax.random.key(0))
    mg.models.save_adapter(adapted, params, tmp_path / "out")
    config = json.loads((tmp_path / "out" / "adapter_config.json").read_text())
    modules = list(mg.models.peft.peft_modules(g))
    assert [m for m in modules if _peft_targets(config, m)] == ["conv1", "layer1.0.conv2"]
    ranks = {m: _peft_pattern(config["rank_pattern"], m, config["r"]) for m in ["conv1", "layer1.0.conv2"]}
    assert sorted(ranks.values()) == [2, 3] and ranks["conv1"] == 3
    assert _peft_pattern(config["rank_pattern"], "layer2.0.conv1", None) is None
    again = mg.lora_from_peft(g, tmp_path / "out")
    assert again == adapted or sorted(p for p, _ in layer_paths(unfold_scans(again))) == sorted(
        p for p, _ in layer_paths(unfold_scans(adapted)))
    base = mg.models.to_state_dict(g, *mg.compile(g).init(jax.random.key(1)))
    loaded, _ = mg.models.load_state_dict(again, base, adapter=tmp_path / "out")
    np.testing.assert_array_equal(loaded["conv1.lora_A"]["kernel"], params["conv1.lora_A"]["kernel"])


def test_an_adapter_folder_whose_scale_differs_from_the_graphs_is_refused(gpt2_adapter, tmp_path):
    g, base, _, _, folder = gpt2_adapter
    fields = json.loads((folder / "adapter_config.json").read_text())
    adapted = mg.lora_from_peft(g, folder)
    other = tmp_path / "other"
    other.mkdir()
    (other / "adapter_config.json").write_text(json.dumps({**fields, "lora_alpha": 32, "use_rslora": True}))
    (other / "adapter_model.safetensors").write_bytes((folder / "adapter_model.safetensors").read_bytes())
    with pytest.raises(mg.ConfigError, match=r"the adapter of '.*' is r=\d+, lora_alpha=32, use_rslora .* "
                                             r"but graph 'gpt2' adapts it with rank \d+ and scale"):
        mg.models.load_state_dict(adapted, base, adapter=other)
    mg.models.load_state_dict(mg.lora_from_peft(g, other), base, adapter=other)  # its own graph


def test_vit_folders_in_transformers_5_names_and_in_the_files_names_read_alike(tmp_path):
    """PEFT under transformers 5.x names ViT's modules as the model holds them in memory
    (layers.0.attention.q_proj, mlp.fc1), and save_adapter writes them so; a folder of
    transformers 4.x's names (the files', encoder.layer.0.attention.attention.query)
    reads the same."""
    config = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
              "intermediate_size": 48, "image_size": 16, "patch_size": 4}
    g = mg.models.vit(config)
    adapted = mg.lora(g, ["encoder.layer.*/attention/query", "encoder.layer.*/attention/value",
                          "encoder.layer.*/intermediate.dense"], rank=2, alpha=4, init_weights=False)
    params, _ = mg.compile(adapted).init(jax.random.key(0))
    mg.models.save_adapter(adapted, params, tmp_path / "memory")
    fields = json.loads((tmp_path / "memory" / "adapter_config.json").read_text())
    assert fields["target_modules"][:3] == ["layers.0.attention.q_proj", "layers.0.attention.v_proj",
                                           "layers.0.mlp.fc1"]
    renamed = {}
    for name, value in load_file(str(tmp_path / "memory" / "adapter_model.safetensors")).items():
        layer, part = re.fullmatch(r"base_model\.model\.layers\.(\d+)\.(.*)", name).groups()
        part = (part.replace("attention.q_proj", "attention.attention.query")
                .replace("attention.v_proj", "attention.attention.value")
                .replace("mlp.fc1", "intermediate.dense"))
        renamed[f"base_model.model.encoder.layer.{layer}.{part}"] = value
    files = _folder(tmp_path, {**fields, "target_modules": ["query", "value", "intermediate.dense"],
                               "rank_pattern": {"encoder.layer.1.intermediate.dense": 2}}, renamed,
                    name="files")
    for folder in (tmp_path / "memory", files):
        again = mg.lora_from_peft(g, folder)
        assert again == adapted
        loaded, _ = mg.models.load_state_dict(again, _base(g, 1), adapter=folder)
        for want, got in zip(jax.tree.leaves(mg.lora_params(params)),
                             jax.tree.leaves(mg.lora_params(loaded))):
            np.testing.assert_array_equal(want, got)


def test_a_quantized_module_to_save_says_how_to_write_the_adapters_alone(tmp_path):
    g = mg.quantize(mg.models.llama(LLAMA), "int8_weight_only")
    adapted = mg.lora_from_peft(g, {"r": 2, "target_modules": ["q_proj"], "modules_to_save": ["lm_head"]})
    params = _zeros(adapted)
    with pytest.raises(mg.SerializationError, match=r"modules_to_save names 'lm_head', which is "
                                                    r"quantized \(int8_weight_only\).*modules_to_save=\[\]"):
        mg.models.save_adapter(adapted, params, tmp_path / "out", modules_to_save=["lm_head"])
    mg.models.save_adapter(adapted, params, tmp_path / "alone", modules_to_save=[])
    assert json.loads((tmp_path / "alone" / "adapter_config.json").read_text())["modules_to_save"] is None


def test_the_adapter_argument_and_peft_config_objects_as_users_pass_them(gpt2_adapter, tmp_path):
    g, base, _, _, folder = gpt2_adapter
    adapted = mg.lora_from_peft(g, folder)
    with pytest.raises(mg.SerializationError, match="missing .* an adapter's weights come from its "
                                                    "PEFT folder: adapter=folder"):
        mg.models.load_state_dict(adapted, base)
    with pytest.raises(mg.ConfigError, match="an adapter's weights file; give its folder"):
        mg.models.load_state_dict(adapted, base, adapter=folder / "adapter_model.safetensors")

    class LoraConfig:  # PEFT's config object: its to_dict() holds target_modules as a set
        def to_dict(self):
            fields = json.loads((folder / "adapter_config.json").read_text())
            return {**fields, "target_modules": set(fields["target_modules"])}

    assert mg.lora_from_peft(g, LoraConfig()) == adapted


def test_modules_to_save_naming_a_holder_round_trips_and_a_projection_alone_is_named(tmp_path):
    g = mg.models.llama(LLAMA)
    adapted = mg.lora(g, "model.layers.*/mlp.gate_proj", rank=2)
    params, state = mg.compile(adapted).init(jax.random.key(0))
    mg.models.save_adapter(adapted, params, tmp_path / "out", modules_to_save=["model.layers.1.self_attn"])
    fields = json.loads((tmp_path / "out" / "adapter_config.json").read_text())
    saved = load_file(str(tmp_path / "out" / "adapter_model.safetensors"))
    assert "base_model.model.model.layers.1.self_attn.q_proj.weight" in saved
    again = mg.lora_from_peft(g, tmp_path / "out")
    assert again == adapted and fields["modules_to_save"] == ["model.layers.1.self_attn"]
    loaded, _ = mg.models.load_state_dict(again, _base(g, 1), adapter=tmp_path / "out")
    for want, got in zip(jax.tree.leaves(params["model.layers.1"]["self_attn"]),
                         jax.tree.leaves(loaded["model.layers.1"]["self_attn"])):
        np.testing.assert_array_equal(want, got)
    with pytest.raises(mg.ConfigError, match="modules_to_save names 'q_proj', a projection of the "
                                             "attention 'model.layers.0/self_attn'"):
        mg.lora_from_peft(g, {**fields, "modules_to_save": ["q_proj"]})


def _adapted(graph):
    return sorted(p[: -len(".lora_A")] for p, _ in layer_paths(unfold_scans(graph)) if p.endswith(".lora_A"))


def test_all_linear_leaves_out_the_output_embeddings_alone_as_peft():
    """PEFT's "all-linear" leaves out a Hugging Face model's output embeddings (Llama's
    lm_head) and, for task_type SEQ_CLS without them, its score or classifier head; the
    last Linear of any other model (torchvision's ResNet fc, a hand-built MLP) is
    adapted, as PEFT adapts it."""
    llama = _adapted(mg.lora_from_peft(mg.models.llama(LLAMA), {"target_modules": "all-linear"}))
    assert "lm_head" not in llama and "model.layers.0/mlp.down_proj" in llama
    resnet = mg.models.resnet18(10, image_size=32, width=8)
    assert _adapted(mg.lora_from_peft(resnet, {"target_modules": "all-linear"})) == ["fc"]
    x = mg.Input(("batch", 8), name="x")
    mlp = mg.Graph(x, mg.ops.Linear(3, name="classifier")(
        mg.ops.relu(mg.ops.Linear(16, name="fc")(x))))
    assert _adapted(mg.lora_from_peft(mlp, {"target_modules": "all-linear"})) == ["classifier", "fc"]
    assert _adapted(mg.lora_from_peft(mlp, {"target_modules": "all-linear",
                                            "task_type": "SEQ_CLS"})) == ["fc"]


def test_save_adapter_takes_a_scanned_models_graph(tmp_path):
    """model.graph of a model compiled with scan_blocks holds the adapters inside its
    scan: save_adapter writes the folder the graph before scanning writes."""
    adapted = mg.lora(mg.models.gpt2(GPT2), ["h.*/attn/qkv", "h.*/mlp.c_fc"], rank=2, alpha=4)
    scanned = mg.compile(adapted, scan_blocks="always")
    assert any(node.op.op_name == "scan" for node in scanned.graph.nodes)
    stacked, stacked_state = scanned.init(jax.random.key(0))
    params, _ = scanned.unstack_weights(stacked, stacked_state)
    mg.models.save_adapter(adapted, params, tmp_path / "plain")
    mg.models.save_adapter(scanned.graph, params, tmp_path / "scanned")
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        assert (tmp_path / "plain" / name).read_bytes() == (tmp_path / "scanned" / name).read_bytes()
    with pytest.raises(mg.SerializationError, match="scanned model's stacked weights"):
        mg.models.save_adapter(scanned.graph, stacked, tmp_path / "stacked")


def test_a_pattern_key_of_a_name_that_ends_other_adapted_names_is_anchored(tmp_path):
    """ResNet's top-level conv1 adapted with another rank and alpha than every block's
    conv1 (all adapted): PEFT matches a rank_pattern key at the end of each name, so
    "conv1" would give the blocks' conv1 its rank too; the key is "^conv1"."""
    graph = mg.models.resnet18(10, image_size=32, width=8)
    adapted = mg.lora(mg.lora(graph, "conv1", rank=3, alpha=5), "layer*/conv1", rank=2, alpha=2)
    params, _ = mg.compile(adapted).init(jax.random.key(0))
    mg.models.save_adapter(adapted, params, tmp_path)
    fields = json.loads((tmp_path / "adapter_config.json").read_text())
    assert (fields["r"], fields["rank_pattern"], fields["alpha_pattern"]) == (2, {"^conv1": 3}, {"^conv1": 5})
    for name in ("conv1", "layer3.1.conv1"):   # PEFT's rule, (.*\.)?(key)$, by hand
        assert bool(re.match(r"(.*\.)?(^conv1)$", name)) == (name == "conv1")
    assert mg.lora_from_peft(graph, tmp_path) == adapted


def test_a_sequence_classification_folder_names_classifier_and_score_as_peft_writes_it(tmp_path):
    """PEFT's SEQ_CLS model puts both "classifier" and "score" in modules_to_save,
    whichever the model has: the one naming no module is ignored, as PEFT ignores it;
    the classifier's weights load from the folder and are written back."""
    x = mg.Input(("batch", 8), name="x")
    g = mg.Graph(x, mg.ops.Linear(3, name="classifier")(mg.ops.relu(mg.ops.Linear(16, name="fc")(x))))
    base = _base(g)
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(2, 8)), rng.normal(size=(16, 2))
    w, c = rng.normal(size=(3, 16)), rng.normal(size=(3,))
    folder = _folder(tmp_path, {"r": 2, "lora_alpha": 4, "target_modules": ["fc"], "task_type": "SEQ_CLS",
                                "modules_to_save": ["classifier", "score"]},
                     {"base_model.model.fc.lora_A.weight": a, "base_model.model.fc.lora_B.weight": b,
                      "base_model.model.classifier.weight": w, "base_model.model.classifier.bias": c})
    adapted = mg.lora_from_peft(g, folder)
    params, state = mg.models.load_state_dict(adapted, base, adapter=folder)
    xs = rng.normal(size=(4, 8)).astype(np.float32)
    hidden = np.maximum(xs @ (base["fc.weight"] + 2.0 * (b @ a)).T + base["fc.bias"], 0)
    np.testing.assert_allclose(_apply(adapted, params, state, xs), hidden @ w.T + c, rtol=1e-5, atol=1e-5)
    mg.models.save_adapter(adapted, params, tmp_path / "back", like=folder)
    fields = json.loads((tmp_path / "back" / "adapter_config.json").read_text())
    assert fields["modules_to_save"] == ["classifier", "score"] and fields["task_type"] == "SEQ_CLS"
    np.testing.assert_allclose(load_file(str(tmp_path / "back" / "adapter_model.safetensors"))[
        "base_model.model.classifier.weight"], w, rtol=1e-6)
    with pytest.raises(mg.ConfigError, match="modules_to_save names 'scor', which is no module"):
        mg.lora_from_peft(g, {"target_modules": ["fc"], "modules_to_save": ["classifier", "scor"]})


def test_a_dilated_convs_adapter_is_not_exchanged_with_peft(tmp_path):
    """PEFT draws a Conv's lora_A without the conv's dilation (mg.lora's A has it, which
    merging needs): such an adapter would compute another function there, so neither
    direction takes it."""
    x = mg.Input(("batch", 9, 9, 4), name="x")
    g = mg.Graph(x, mg.ops.Conv(6, 3, padding="SAME", dilation=2, name="c")(
        mg.ops.Conv(4, 3, padding="SAME", name="plain")(x)))
    adapted = mg.lora(g, ["c", "plain"], rank=2)
    params, _ = mg.compile(adapted).init(jax.random.key(0))
    with pytest.raises(mg.SerializationError, match="layer 'c' is a Conv with dilation 2.*without "
                                                    "the dilation"):
        mg.models.save_adapter(adapted, params, tmp_path)
    with pytest.raises(mg.ConfigError, match="target_modules selects 'c': layer 'c' is a Conv with "
                                             "dilation"):
        mg.lora_from_peft(g, {"target_modules": ["c", "plain"]})
    assert mg.lora_from_peft(g, {"target_modules": ["plain"], "r": 2, "lora_alpha": 2}) == \
        mg.lora(g, "plain", rank=2)
