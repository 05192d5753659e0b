"""Text generation derived from the graph: the decoding rewrite (a key/value cache the
compiler writes), ``mg.decoder``, ``mg.generate``, ``mg.generate_stream``, the
samplers (``mg.sampling``) and the exported prefill and step (``export_prefill``,
``export_step``)."""

from . import sampling
from .decoder import Cache, Decoder, decoder
from .derive import decode_graph
from .export import cache_arrays, cache_from_arrays, export_prefill, export_step
from .generate import generate, generate_stream

__all__ = ["Cache", "Decoder", "decoder", "decode_graph", "generate", "generate_stream", "sampling",
           "export_prefill", "export_step", "cache_arrays", "cache_from_arrays"]
