"""The bottom of the package: errors, tensor specs and dims, the op registry and logical
axis names. Imports nothing else of mlaxgraph."""
