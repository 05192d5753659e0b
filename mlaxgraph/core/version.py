"""The package's version, in one place: ``mlaxgraph.__version__``, the packaging
metadata (``setup.cfg`` reads it without importing the package) and the manifests
mlaxgraph writes."""

__version__ = "0.1.0"
