"""What answers a run's requests: the backend's identity, part of every request's key.

A model's name is not what served its answers: the same name can sit on the project's
stand-in, on a vLLM server, or on a hosted API. So every request carries the id of the
backend that answers it (``ChatRequest.served_by``), the request cache is keyed by it, the
stages' fingerprints hold the whole identity, and every row records it: an answer from one
backend is never served as another's, and a change of backend re-does the stages it
affects, saying why.

An identity is a small dict, computed without building an engine, by the backend's class
(``Backend.identify``; ``describe`` finds that class again from the ``kind``):

- ``openai`` / ``ray`` (http engine): the server's URL (without credentials) and, for each
  model the run asks for, the entry the server reports at ``/models`` (id, root, owner);
- ``stand-in``: a server that reports itself as the project's stand-in (tests/standin_server.py):
  not a model, whatever model name it is asked for;
- ``vllm`` / ``ray`` (vllm engine): the engine, its version, and the model folder's content
  hash (every file's sha256, cached by path, size and modification time);
- ``llamacpp``: the engine, its version and the GGUF file's sha256;
- ``replay``: the identity the replayed answers were recorded with (the replay only reads
  them back; ``replayed_from`` says from where, and is not part of the key).

``model_output`` says whether the answers come from a model at all (False for the stand-in
and for hand-written answers); the dataset card says so plainly.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.core.ids import content_hash
from pipeline.core.redact import strip_userinfo

if TYPE_CHECKING:
    from pipeline.kinds.backend import Backend, BackendSection, Resolve

# keys describing where an identity came from, not what served: left out of its id
NOT_KEYED = ("replayed_from", "assumed", "asked")
STANDIN_OWNER = "prb-stand-in"


def identity_id(identity: dict[str, Any]) -> str:
    """The short id requests carry (``ChatRequest.served_by``)."""
    return content_hash({k: v for k, v in identity.items() if k not in NOT_KEYED}, length=16)


def owner(identity: dict[str, Any]) -> type[Backend] | None:
    """The backend class that made ``identity``: its ``kind`` is the backend's name, or
    the name and a dash (``ray-http``). None for the stand-in and unknown kinds."""
    from pipeline.kinds.backend import BACKENDS

    kind = str(identity.get("kind"))
    for name in (kind, kind.split("-", 1)[0]):
        if name in BACKENDS:
            return BACKENDS.get(name)
    return None


def describe(identity: dict[str, Any]) -> str:
    """One line for people: what served the answers."""
    kind = identity.get("kind")
    cls = owner(identity)
    if kind == "stand-in":
        what = identity.get("responder") or "rule-based"
        text = f"the project's stand-in server ({what} answers, not a model)"
    elif cls is not None:
        text = cls.describe(identity)
    else:
        text = str(kind)
    if identity.get("replayed_from"):
        text += f", replayed from {identity['replayed_from']}"
    if identity.get("assumed"):
        text += f" ({identity['assumed']})"
    return text


def standin_identity(entry: dict[str, Any]) -> dict[str, Any]:
    """The identity of a server that reports itself as the project's stand-in
    (tests/standin_server.py): not a model, whatever model name it is asked for."""
    return {
        "kind": "stand-in",
        "responder": entry.get("prb_responder") or "rule-based",
        "model_output": False,
    }


def is_standin(identity: dict[str, Any]) -> bool:
    """Whether ``identity`` is the project's stand-in server's (``standin_identity``)."""
    return identity.get("kind") == "stand-in"


def plain_url(url: str) -> str:
    """A server URL as an identity holds it: no user:password@, no query (either may hold
    a credential), no trailing slash."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(strip_userinfo(url))
    return urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))


# ---- file content hashes, cached -----------------------------------------------------------


def _hash_cache_path() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "personalized-rewardbench" / "file-sha256.json"


def file_sha256(path: Path) -> str:
    """sha256 of a file, remembered by (path, size, modification time): model files are
    gigabytes and do not change under a run."""
    path = Path(path).resolve()
    st = path.stat()
    key = f"{path}|{st.st_size}|{st.st_mtime_ns}"
    store = _hash_cache_path()
    known: dict[str, str] = {}
    try:
        known = json.loads(store.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        known = {}
    if isinstance(known, dict) and isinstance(known.get(key), str):
        return known[key]
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            h.update(block)
    digest = h.hexdigest()
    try:
        from pipeline.core.io import write_json_atomic

        write_json_atomic(store, {**(known if isinstance(known, dict) else {}), key: digest})
    except OSError:
        pass  # a read-only home: hash again next time
    return digest


def folder_sha256(folder: Path) -> str:
    """One hash over every file of a model folder (names and contents)."""
    h = hashlib.sha256()
    for p in sorted(q for q in Path(folder).rglob("*") if q.is_file()):
        h.update(str(p.relative_to(folder)).encode())
        h.update(file_sha256(p).encode())
    return h.hexdigest()


def version(dist: str) -> str | None:
    """An installed distribution's version (from its metadata: nothing is imported)."""
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def identify(
    cfg: BackendSection,
    models: Sequence[str],
    *,
    resolve: Resolve | None = None,
    cache_path: Path | None = None,
) -> dict[str, Any]:
    """The identity of the backend ``cfg`` (the config's ``backend`` section) for a run
    that asks for ``models`` (:meth:`Backend.identify`). Raises BackendError when it
    cannot be known (a server that cannot be reached, a replay source without
    provenance)."""
    from pipeline.kinds.backend import BACKENDS

    return BACKENDS.get(cfg.name).identify(cfg, models, resolve=resolve, cache_path=cache_path)
