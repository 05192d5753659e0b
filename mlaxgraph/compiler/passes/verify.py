"""verify: the IR's structural checks (``mlaxgraph.ir.verify``), run by the pipeline
before and after each pass."""

from ...ir.verify import find_cycle, verify

__all__ = ["verify", "find_cycle"]
