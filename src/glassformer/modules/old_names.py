"""The names a block's parts had before blocks took parts: ``nn.TransformerEncoderLayer``'s
and ``nn.TransformerDecoderLayer``'s (``self_attn``, ``feed_forward``, ``norm1``, ...). They
still read, and a state dict saved under them still loads (``rename_old_keys``)."""

from __future__ import annotations

from typing import Any

from torch import nn


class TorchLayerNames:
    """A ``Block``'s parts under the torch layers' names, read-only."""

    cross_attn: nn.Module | None

    def old_names(self) -> dict[str, str]:
        """Each old name and the part it is now."""
        if self.cross_attn is None:
            return {"self_attn": "attn", "feed_forward": "mlp", "norm1": "ln1", "norm2": "ln2"}
        return {"self_attn": "attn", "feed_forward": "mlp", "norm1": "ln1",
                "norm2": "ln_cross", "norm3": "ln2"}  # fmt: skip

    self_attn = property(lambda self: self.attn)
    feed_forward = property(lambda self: self.mlp)
    norm1 = property(lambda self: self.ln1)
    norm2 = property(lambda self: self.ln_cross if self.cross_attn is not None else self.ln2)
    norm3 = property(lambda self: self.ln2 if self.cross_attn is not None else None)


def rename_old_keys(module: nn.Module, state: dict, prefix: str, *_: Any) -> None:
    """A load_state_dict pre-hook: keys under ``module``'s old part names get today's."""
    for old, new in module.old_names().items():  # type: ignore[operator]
        for key in [k for k in state if k.startswith(f"{prefix}{old}.")]:
            state[f"{prefix}{new}.{key[len(prefix) + len(old) + 1 :]}"] = state.pop(key)
