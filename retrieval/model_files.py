"""Where a FlagEmbedding model's files are: a local directory, or a hub id's copy in the local cache.

FlagEmbedding and transformers ask the Hugging Face hub about a hub id on every load, even when
its files are cached. Without a network that is five retries (about 23 s) for each file they
check, the tokenizer's and then the model's, before they fall back to the cache, on every start. A hub id
whose files are cached is therefore resolved here to its snapshot directory, which loads without
the network. An id that is not cached is left as it is, so its first load downloads it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


class ModelPathError(ValueError):
    """``model_path`` names a filesystem path that holds no model directory."""


def looks_like_a_path(model_path: str) -> bool:
    """Written as a filesystem path (absolute, ./, ../, ~), so never a hub id."""
    return Path(model_path).is_absolute() or model_path.startswith(("./", "../", "~", ".\\", "..\\"))


def local_model_dir(model_path: str) -> str:
    """The directory to load ``model_path`` from, or the hub id itself when its files are not cached."""
    if not model_path.strip():
        raise ModelPathError("empty model_path")  # Path("") is the working directory
    path = Path(model_path).expanduser()
    if path.is_dir():
        return str(path)
    if path.exists():
        raise ModelPathError("not a directory")
    if looks_like_a_path(model_path):
        raise ModelPathError("no such directory")
    cached = cached_snapshot(model_path)
    return model_path if cached is None else cached


def cached_snapshot(hub_id: str) -> str | None:
    """The hub id's snapshot directory in the local Hugging Face cache, found without the network."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError:  # the extra that brings it is missing: FlagEmbedding's import says so
        return None
    try:
        return str(snapshot_download(hub_id, local_files_only=True))
    except Exception:  # not cached, or not a valid hub id: the load reports it
        return None


def download_hint(model_path: str) -> str:
    """What to do about a hub id that neither the cache nor the hub could give."""
    return (
        f"{model_path!r} is neither a local directory nor in the Hugging Face cache: download it once "
        f"(huggingface-cli download {model_path}) or set model_path to a local directory"
    )


def load_model(load: Callable[[str], T], model_path: str, what: str, error: type[Exception]) -> T:
    """``load`` applied to the model's directory (or uncached hub id); any failure as one ``error``.

    ``what`` names the model in the message: ``cannot load <what> from '<model_path>': <why>``.
    """
    try:
        source = local_model_dir(model_path)
    except ModelPathError as exc:
        raise error(f"cannot load {what} from {model_path!r}: {exc}") from exc
    try:
        return load(source)
    except Exception as exc:  # FlagEmbedding/transformers raise many types for a bad path
        # Only a hub id that the cache did not have can want a download; a directory failed as it is.
        hint = "" if Path(source).is_dir() else f" ({download_hint(model_path)})"
        raise error(f"cannot load {what} from {model_path!r}: {exc}{hint}") from exc
