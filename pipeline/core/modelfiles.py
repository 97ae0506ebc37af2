"""Model weight files, checked before a library loads them: a download cut short is one
line naming the file, not a loader's traceback. Used by every reader of a model folder
(`prb eval`'s reward models, the contriever profile ranker)."""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

from pipeline.core.errors import InputError

_SAFETENSORS_HINT = "the file is damaged or was cut short; download the model again"


def _check_safetensors(file: Path) -> None:
    """The file's header and length, as safetensors lays them out: 8 bytes giving the
    header's length, the JSON header, then the tensors, the last ending at the file's end.
    Cheap (the header only) and before any model loads."""
    import json

    size = file.stat().st_size
    with open(file, "rb") as fh:
        head = fh.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        if n < 2 or 8 + n > size:
            raise InputError(f"not a whole safetensors file: {_SAFETENSORS_HINT}", path=file)
        try:
            header = json.loads(fh.read(n))
            ends = [
                int(v["data_offsets"][1])
                for k, v in header.items()
                if k != "__metadata__" and isinstance(v, dict)
            ]
        except (ValueError, KeyError, TypeError, IndexError, AttributeError):
            raise InputError(
                f"unreadable safetensors header: {_SAFETENSORS_HINT}", path=file
            ) from None
    want = 8 + n + max(ends, default=0)
    if want != size:
        raise InputError(
            f"holds {size} bytes where its header promises {want}: {_SAFETENSORS_HINT}",
            path=file,
        )


def check_weights(path: Path) -> None:
    """Every safetensors file the model folder loads (one file, or the shards its index
    names) is whole, or its ``pytorch_model.bin`` when it has no safetensors, so a cut
    download is one line naming the file, before the run."""
    import json

    files = []
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(
                set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())
            )
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            raise InputError(
                "unreadable shard index (no weight_map); download the model again", path=index
            ) from None
        for name in shards:
            if not (path / name).is_file():
                raise InputError(
                    f"names the shard {name}, which is missing; download the model again",
                    path=index,
                )
            files.append(path / name)
    elif (path / "model.safetensors").is_file():
        files.append(path / "model.safetensors")
    for f in files:
        _check_safetensors(f)
    if not files and (path / "pytorch_model.bin").is_file():
        _check_torch_zip(path / "pytorch_model.bin")


def _check_torch_zip(file: Path) -> None:
    """A ``torch.save`` file in its zip layout must have its central directory (written
    last): a cut one has none. Files in the old pickle layout are left to the loader."""
    import zipfile

    with open(file, "rb") as fh:
        if fh.read(4) != b"PK\x03\x04":
            return
    try:
        with zipfile.ZipFile(file) as zf:
            zf.namelist()
    except (zipfile.BadZipFile, OSError):
        raise InputError(f"not a whole weights file: {_SAFETENSORS_HINT}", path=file) from None


def load_errors() -> tuple[type[BaseException], ...]:
    """What a model load raises for a bad folder: OSError and ValueError, and safetensors'
    own error for a damaged weights file that passed the header check."""
    try:
        from safetensors import SafetensorError
    except ImportError:
        return (OSError, ValueError)
    return (OSError, ValueError, SafetensorError)


@lru_cache(maxsize=1)
def hub_reachable() -> bool:
    """Whether the Hugging Face Hub's host (``HF_ENDPOINT``) takes a connection within 3 s
    (asked once per process). Without a network, asking the Hub costs minutes of retries
    (huggingface_hub backs off five times per file) before the one line that says what to
    do; a proxy is trusted to reach it. Used before a dataset (``input.format: hub``) or
    a model (``profile.contriever_model``) is loaded by name."""
    import socket
    import urllib.parse

    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True
    from huggingface_hub import constants

    url = urllib.parse.urlsplit(constants.ENDPOINT)
    if not url.hostname:
        return True
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname, port), timeout=3):
            return True
    except OSError:
        return False


def hub_offline() -> bool:
    """Whether offline mode is on (``HF_HUB_OFFLINE``)."""
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)
