"""Models by their Hugging Face Hub id: ``GPT.from_pretrained("HuggingFaceTB/SmolLM2-135M")``.

A name that is an existing file or folder is always that (a local path wins). Otherwise a
name shaped ``org/name`` is a Hub id, resolved through ``huggingface_hub`` (the extra
``hub``) and its cache, laid out as it lays it out (``models--org--name/snapshots/<rev>/``
with ``refs/<branch>``), under ``HF_HUB_CACHE`` or ``HF_HOME``/hub (read at each call):

- online, a snapshot missing from the cache is downloaded: the config, tokenizer files and
  the safetensors weights (``pytorch_model.bin`` only where a repository has no
  safetensors; it is read with ``weights_only=True``);
- offline (``HF_HUB_OFFLINE=1``), a snapshot in the cache is used as it is, and one that is
  not there is one error saying how to get it.

Everything else (a name with no slash, a path that does not exist) is left for the loaders
to report as before.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from glassformer.errors import CheckpointError, MissingDependencyError, one_line

# org/name as the Hub spells repository ids (no leading dot or dash, no "..")
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}")
# what a model folder needs: the configs, the tokenizer's files, the weights
_FILES = ["*.json", "*.txt", "*.model", "*.tiktoken", "*.jinja"]
_SAFETENSORS = ["*.safetensors", "*.safetensors.index.json"]
_BIN = ["pytorch_model*.bin", "pytorch_model.bin.index.json"]


def is_hub_id(name: str | Path) -> bool:
    """Whether ``name`` is a string shaped like a Hub id and is not a local path: neither it
    nor its folder exists here (``runs/lm2`` beside a ``runs`` folder is a mistyped path)."""
    if isinstance(name, Path):  # a Path is a path, whatever its spelling
        return False
    text = str(name)
    local = Path(text).exists() or Path(text).parent.exists()
    return bool(_HUB_ID.fullmatch(text)) and ".." not in text and not local


def resolve(name: str | Path, revision: str | None = None) -> Path | str:
    """The local folder of the Hub id ``name`` (fetched into the cache when online and
    missing), or ``name`` unchanged when it is a local path or not a Hub id.

    Raises:
        CheckpointError: offline, and the id (at that revision) is not in the cache; or the
            Hub cannot be reached, or has no such repository.
        MissingDependencyError: a Hub id, and ``huggingface_hub`` is not installed.
    """
    if not is_hub_id(name):
        if revision is not None:
            raise ValueError(f"revision={revision!r} applies to a Hub id (org/name), not {name!r}")
        return name
    hub, errors = _require_hub()
    repo, cache, offline = str(name), cache_dir(), _offline()
    try:  # the same files asked for online and offline: what a download here keeps
        folder = _snapshot(hub, repo, revision, cache, local=offline, patterns=_SAFETENSORS)
        if not any(Path(folder).glob("*.safetensors")):  # an older repository: .bin weights
            folder = _snapshot(hub, repo, revision, cache, local=offline, patterns=_BIN)
        return Path(folder)
    except errors.LocalEntryNotFoundError:
        at = "" if revision is None else f" at revision {revision!r}"
        why = "HF_HUB_OFFLINE is set" if offline else "the Hub could not be reached"
        raise CheckpointError(
            f"{repo!r}{at} is not in the Hugging Face cache ({cache}) and {why}: fetch it "
            f"once online (huggingface-cli download {repo})"
            + (", or unset HF_HUB_OFFLINE" if offline else "")
        ) from None
    except (errors.HfHubHTTPError, errors.HFValidationError, OSError, ValueError) as e:
        raise CheckpointError(
            f"{repo!r} is neither a file or folder here nor a model the Hugging Face Hub "
            f"gave: {one_line(e, 300)}"
        ) from None


def cache_dir() -> Path:
    """Where ``huggingface_hub`` keeps models: ``HF_HUB_CACHE``, else ``HF_HOME``/hub, else
    ~/.cache/huggingface/hub (the environment read now, not at import)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or Path("~/.cache/huggingface")
    return Path(home).expanduser() / "hub"


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _snapshot(
    hub: Any,
    repo: str,
    revision: str | None,
    cache: Path,
    *,
    local: bool,
    patterns: tuple[str, ...] | list[str] = (),
) -> str:
    return str(
        hub.snapshot_download(
            repo,
            revision=revision,
            cache_dir=cache,
            local_files_only=local,
            allow_patterns=[*_FILES, *patterns],
        )
    )


def _require_hub() -> tuple[Any, Any]:
    try:
        import huggingface_hub
        import huggingface_hub.errors
    except ImportError:
        raise MissingDependencyError(
            "a model by its Hub id (org/name) needs huggingface_hub: pip install 'glassformer[hub]'"
        ) from None
    return huggingface_hub, huggingface_hub.errors
