"""Seeing a graph: DOT text (no dependency), Graphviz rendering, networkx export/import.

The ``Graph`` methods ``to_dot``, ``render``, ``to_networkx``, ``from_networkx``,
``_repr_svg_`` and ``_repr_html_`` delegate to the modules of this package; see
docs/rendering.md.
"""
