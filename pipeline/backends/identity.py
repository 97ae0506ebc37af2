"""What answers a run's requests: the backend's identity, part of every request's key.

A model's name is not what served its answers: the same name can sit on the project's
stand-in, on a vLLM server, or on a hosted API. So every request carries the id of the
backend that answers it (``ChatRequest.served_by``), the request cache is keyed by it, the
stages' fingerprints hold the whole identity, and every row records it: an answer from one
backend is never served as another's, and a change of backend re-does the stages it
affects, saying why.

An identity is a small dict, computed without building an engine:

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
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pipeline.errors import BackendError
from pipeline.ids import content_hash

# keys describing where an identity came from, not what served: left out of its id
NOT_KEYED = ("replayed_from", "assumed", "asked")
STANDIN_OWNER = "prb-stand-in"


def identity_id(identity: dict[str, Any]) -> str:
    """The short id requests carry (``ChatRequest.served_by``)."""
    return content_hash({k: v for k, v in identity.items() if k not in NOT_KEYED}, length=16)


def describe(identity: dict[str, Any]) -> str:
    """One line for people: what served the answers."""
    kind = identity.get("kind")
    if kind == "stand-in":
        what = identity.get("responder") or "rule-based"
        text = f"the project's stand-in server ({what} answers, not a model)"
    elif kind in ("openai", "ray-http"):
        models = identity.get("models") or {}
        shown = ", ".join(
            f"{name} (reported as {(m or {}).get('id') or 'nothing'})" for name, m in models.items()
        )
        text = f"the server at {identity.get('url')}: {shown or 'no model reported'}"
    elif kind in ("vllm", "ray-vllm"):
        digest = identity.get("files_sha256")
        text = f"vLLM {identity.get('version') or '?'} in-process, model {identity.get('model')}"
        text += f" (files sha256 {digest[:12]})" if digest else " (not a local folder: no hash)"
    elif kind == "llamacpp":
        text = (
            f"llama.cpp {identity.get('version') or '?'} in-process, model "
            f"{identity.get('file')} (sha256 {str(identity.get('sha256'))[:12]})"
        )
    else:
        text = str(kind)
    if identity.get("replayed_from"):
        text += f", replayed from {identity['replayed_from']}"
    if identity.get("assumed"):
        text += f" ({identity['assumed']})"
    return text


def plain_url(url: str) -> str:
    """A server URL as an identity holds it: no user:password@, no query (either may hold
    a credential), no trailing slash."""
    from urllib.parse import urlsplit, urlunsplit

    from pipeline.redact import strip_userinfo

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
        from pipeline.io import write_json_atomic

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


def _version(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


# ---- per kind ------------------------------------------------------------------------------


def _server(cfg: Any, models: Sequence[str], kind: str) -> dict[str, Any]:
    from pipeline.backends.openai_backend import list_models

    listed = list_models(cfg)
    by_id = {m.get("id"): m for m in listed if isinstance(m, dict)}
    if any(m.get("owned_by") == STANDIN_OWNER for m in by_id.values()):
        entry = next(m for m in by_id.values() if m.get("owned_by") == STANDIN_OWNER)
        return {
            "kind": "stand-in",
            "responder": entry.get("prb_responder") or "rule-based",
            "model_output": False,
        }
    reported = {}
    for name in sorted(set(models)):
        m = by_id.get(name)
        reported[name] = (
            {k: m.get(k) for k in ("id", "root", "owned_by")} if isinstance(m, dict) else None
        )
    return {
        "kind": kind,
        "url": plain_url(str(cfg.base_url)),
        "models": reported,
        "model_output": True,
    }


def _vllm(cfg: Any, kind: str) -> dict[str, Any]:
    model = str(cfg.model)
    local = Path(model).expanduser()
    return {
        "kind": kind,
        "version": _version("vllm"),
        "model": model,
        "files_sha256": folder_sha256(local) if local.is_dir() else None,
        "model_output": True,
    }


def identify(
    cfg: Any,
    models: Sequence[str],
    *,
    resolve: Callable[[Path | None], Path | None] | None = None,
    cache_path: Path | None = None,
) -> dict[str, Any]:
    """The identity of the backend ``cfg`` (the config's ``backend`` section) for a run
    that asks for ``models``. Raises BackendError when it cannot be known (a server that
    cannot be reached, a replay source without provenance)."""
    name = cfg.name
    if name == "openai":
        return _server(cfg, models, "openai")
    if name == "ray":
        if cfg.ray.engine == "http":
            return _server(cfg, models, "ray-http")
        return _vllm(cfg, "ray-vllm")
    if name == "vllm":
        return _vllm(cfg, "vllm")
    if name == "llamacpp":
        from pipeline.backends.llamacpp_backend import gguf_identity

        return gguf_identity(cfg, resolve)
    if name == "replay":
        from pipeline.backends.replay import recorded_identity

        source = resolve(cfg.replay_cache) if resolve and cfg.replay_cache else cfg.replay_cache
        return recorded_identity(Path(source) if source else cache_path)
    raise BackendError(f"backend.name {name!r} has no identity; this is a bug")  # pragma: no cover
