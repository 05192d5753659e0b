"""A mkdocs hook: the documentation's rendered graph (SVG, with Graphviz's `dot`) and its
explorer pages, made from the library at build time and added to the site as files, so
they always show what the code draws. Nothing is written into docs/."""

from __future__ import annotations

from mkdocs.structure.files import File

FOLDER = "assets/explorer"


def _pages() -> dict[str, str | bytes]:
    import mlaxgraph as mg
    from mlaxgraph import examples, ops
    from mlaxgraph.render.graphviz import render_bytes

    cnn = examples.residual_cnn()
    policy = mg.Policy(compute_dtype="bfloat16", output_dtype="float32")
    bf16 = mg.compile(cnn, policy)
    block = examples.transformer_block(length=128, width=256, heads=4, mlp=1024, causal=True)
    tokens = mg.Input(("batch", 128, 256), name="x")
    h = tokens
    for i in range(6):
        h = block.as_block(f"block{i}")(h)
    gpt = mg.Graph(tokens, ops.Linear(1000, name="head")(ops.LayerNorm(name="ln_f")(h)),
                   name="gpt")
    return {
        "residual_cnn.svg": render_bytes(bf16.to_dot(expand_nested=True, show_legend=True), "svg"),
        "residual_cnn_bf16.html": bf16.to_html(hlo=True, batch=8),
        "gpt.html": gpt.to_html(overlay="flops", batch=8),
        "policy_diff.html": mg.diff_html(mg.compile(cnn), bf16),
    }


def on_files(files, config):
    for name, content in _pages().items():
        files.append(File.generated(config, f"{FOLDER}/{name}", content=content))
    return files
