"""Where a finished release goes besides its folder: the Hugging Face Hub."""

from __future__ import annotations

import os
from pathlib import Path

from pipeline.core.errors import PipelineError
from pipeline.core.redact import redact


def hub_token() -> str:
    """HF_TOKEN, checked before any work: a missing token costs nothing and uploads
    nothing."""
    token = os.environ.get("HF_TOKEN")
    if not token:
        raise PipelineError(
            "--push-to-hub needs a Hugging Face token in the environment variable HF_TOKEN "
            "(it is read from there only and never written); nothing was built or uploaded"
        )
    return token


def push_to_hub(out: Path, repo: str, token: str) -> str:
    """Upload the release folder to a dataset repository (created private when new);
    returns its URL."""
    try:
        from huggingface_hub import HfApi
    except ImportError as exc:  # pragma: no cover - a dependency of datasets
        raise PipelineError("--push-to-hub needs huggingface_hub (pip install datasets)") from exc
    api = HfApi(token=token)
    try:
        # a new repository starts private: a release goes public by a deliberate step
        url = api.create_repo(repo, repo_type="dataset", private=True, exist_ok=True)
        api.upload_folder(
            repo_id=repo,
            folder_path=str(out),
            repo_type="dataset",
            commit_message="prb publish",
        )
    except Exception as exc:  # requests/httpx connection errors, HfHubHTTPError, bad repo id
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        reason = redact(f"{type(exc).__name__}: {first}" if first else type(exc).__name__)
        raise PipelineError(
            f"--push-to-hub {repo}: upload failed ({reason}); check the network connection to "
            f"{api.endpoint}, that the repo id is owner/name and that HF_TOKEN may write to it; "
            f"the release itself is complete in {out}, run the same command to retry the upload"
        ) from None
    return str(url)
