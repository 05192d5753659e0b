"""Text generation derived from the graph: the decoding rewrite (a key/value cache the
compiler writes), ``mg.decoder``, ``mg.generate``, ``mg.generate_stream`` and the
samplers (``mg.sampling``)."""

from . import sampling
from .decoder import Cache, Decoder, decoder
from .derive import decode_graph
from .generate import generate, generate_stream

__all__ = ["Cache", "Decoder", "decoder", "decode_graph", "generate", "generate_stream", "sampling"]
