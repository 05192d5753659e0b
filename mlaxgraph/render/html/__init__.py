"""The interactive graph explorer: one self-contained HTML page (scripts, styles and
data inline; nothing loaded from the network) drawing a graph level by level, nested
blocks expanded on demand, with search, overlays, a details panel and graph diffs.

``payload`` turns a graph into the page's JSON data, ``page`` assembles the HTML,
``diff`` compares two graphs, ``model_explorer`` writes Google Model Explorer's JSON
graph format. See docs/explorer.md.
"""

from .diff import diff_html
from .page import show, to_html

__all__ = ["show", "to_html", "diff_html"]
