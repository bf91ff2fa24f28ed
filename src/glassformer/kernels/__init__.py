"""The engine: how a model computes fast, kept apart from what it computes (``modules/``).

- ``gguf_blocks``: GGUF's block types (Q4_0 … Q6_K, Q8_0) decoded in PyTorch, for reading;
- ``gguf_kernels``: the C library (``csrc/gguf.c``), built and loaded safely, and the
  decoding step's one-query attention in C, registered with ``modules.sdpa``;
- ``gguf_linear``: linear and embedding layers that compute from a file's own blocks;
- ``gguf_mlp``: the gated MLP with its gate and up products as one layer (GGUF decoding);
- ``quantized``: bf16, int8 and int4 linear layers on PyTorch's kernels;
- ``quantize``: ``model.for_inference(dtype)``, which swaps those layers in;
- ``precision``, ``precision_cache``, ``fidelity``: what ``--dtype auto`` measures (speed of
  each precision on this machine, and whether bf16 keeps the model's answers), cached.

Each layer here stands in for a ``torch.nn.Linear`` (or ``nn.Embedding``, or a module of
``modules/``) and offers what the readable modules use of one: ``weight`` (decoded),
``bias``, ``in_features``/``out_features`` and ``forward_rows`` (a slice of the outputs).
"""
