"""Paths of layers and weights, and the globs over them: ``*`` and ``?`` within one
name, ``**`` across ``/``; a layer named after a module path (``mlp.act``) also read
with ``/`` for its dots (``module_view``)."""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Sequence

__all__ = ["path_matcher", "is_pattern", "module_view", "near_names", "is_adapter"]

_GLOB = re.compile(r"\*\*|\*|\?|\[[^\]]+\]|\[|[^*?\[]+")


def module_view(path: str) -> str:
    """``path`` with the dots of its last name read as ``/``: a layer named after a
    module path (GPT-2's ``mlp.act`` in block ``h.3``, as in Hugging Face's
    ``h.3.mlp.act``) is also ``h.3/mlp/act``. Block names keep their dots (``h.3``,
    ``model.layers.0``), so ``*/mlp/*`` names every block's MLP layers."""
    head, sep, last = path.rpartition("/")
    return head + sep + last.replace(".", "/")


def path_matcher(pattern: str) -> Callable[[str], bool]:
    """A test of paths for a glob: ``*`` and ``?`` stay within one name, ``**`` also
    crosses ``/`` (``**/`` stands for no name too: ``**/fc`` matches ``fc``); ``[...]``
    as in fnmatch (``[!0]`` negates; a ``[`` that no ``]`` closes is itself). A path
    matches as written or as its ``module_view``."""
    parts = []
    tokens = _GLOB.findall(pattern)
    for i, token in enumerate(tokens):
        if token == "**" and i + 1 < len(tokens) and tokens[i + 1].startswith("/"):
            parts.append("(?:.*/)?")
            tokens[i + 1] = tokens[i + 1][1:]
        elif token == "**":
            parts.append(".*")
        elif token == "*":
            parts.append("[^/]*")
        elif token == "?":
            parts.append("[^/]")
        elif token.startswith("[") and len(token) > 1:  # a set, as fnmatch reads it:
            body = token[1:-1].replace("\\", "\\\\")    # ! negates, ^ is itself
            body = "^" + body[1:] if body.startswith("!") else "\\" + body if body.startswith("^") else body
            parts.append("[" + body + "]")
        else:
            parts.append(re.escape(token))
    regex = re.compile("".join(parts) + r"\Z")

    def matches(path: str) -> bool:
        if regex.match(path) is not None:
            return True
        view = module_view(path)
        return view != path and regex.match(view) is not None

    return matches


def is_pattern(text: str) -> bool:
    return any(c in text for c in "*?[")


def near_names(name: str, known: Sequence[str]) -> str:
    """The hint of an error about a path or pattern ``name`` that names none of
    ``known``: for a module whose layers are named after it (Llama's ``mlp``, whose
    layers are ``mlp.gate_proj`` ...), its layers and the pattern that selects them;
    else the names closest to it; ``""`` when there are none."""
    if not name.endswith(("*", "/")):
        matches = path_matcher(name + ".*")
        inside = [path for path in known if matches(path)]
        if inside:
            names = list(dict.fromkeys(path.rpartition("/")[2] for path in inside))
            more = f" and {len(names) - 4} more" if len(names) > 4 else ""
            return (f"; {name!r} is a module, not a layer: its layers are "
                    f"{', '.join(names[:4])}{more}, named {name + '.<name>'!r}; select them "
                    f"with {name + '.*'!r}, or name one")
    plain = name.replace("*", "").replace("?", "")
    close = difflib.get_close_matches(plain, known, n=4, cutoff=0.5)
    if close:
        return f"; near names: {', '.join(close)}"
    if not known:
        return ""
    # nothing spelt near: the layers there are (a pattern written for another model)
    top = list(dict.fromkeys(path.split("/")[0] for path in known))
    return f"; its layers: {', '.join(top[:6])}{f' and {len(top) - 6} more' if len(top) > 6 else ''}"


def is_adapter(key: str) -> bool:
    """Whether ``key`` names a LoRA adapter's layer (``<target>.lora_A`` or ``.lora_B``,
    the names ``mg.lora`` gives them)."""
    return key.endswith(".lora_A") or key.endswith(".lora_B")
