"""Importers and exporters for other implementations' weights."""

from glassformer.interop.torch_nn import from_torch_nn, to_torch_nn

__all__ = ["from_torch_nn", "to_torch_nn"]
