"""Shared fixtures: the stand-in OpenAI server and small run configs."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
# the scripts that generate docs, which tests hold the docs to
sys.path.append(str(ROOT / "scripts"))

from standin_server import StandinServer  # noqa: E402

from pipeline.kinds.settings import flat_key_target  # noqa: E402

SAMPLE = ROOT / "examples" / "sample_lamp.jsonl"

# Under CI every test must run: a skip there is a failure, except these, which depend on
# the machine's kernel rather than on what .ci/run installs.
CI_ALLOWED_SKIPS = (
    "needs unprivileged user and mount namespaces",
    "running as root without user namespaces",
)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if not (os.environ.get("CI") and report.skipped) or hasattr(report, "wasxfail"):
        return
    reason = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else ""
    if not any(allowed in reason for allowed in CI_ALLOWED_SKIPS):
        report.outcome = "failed"
        report.longrepr = f"skipped under CI, where every test must run: {reason}"


@pytest.fixture
def server():
    with StandinServer() as s:
        yield s


def write_config(tmp_path: Path, server: StandinServer | None = None, **sections) -> Path:
    """A config file in tmp_path over the sample input; ``sections`` override defaults."""
    cfg = {
        "run": {"name": "t", "output_dir": str(tmp_path / "outputs"), "seed": 0},
        "input": {"format": "lamp", "path": str(SAMPLE)},
        "backend": {
            "name": "openai",
            "model": "standin-model",
            "backoff_initial_s": 0.01,
            "backoff_max_s": 0.2,
            "openai": {
                "base_url": server.base_url if server else "http://127.0.0.1:9/v1",
                "max_concurrency": 8,
                # generous: the stand-in answers in milliseconds, but on a busy 2-core machine
                # (load 3-12) a 10 s limit timed requests out and the run stopped with "the
                # server looks down". Tests about timeouts set their own.
                "timeout_s": 120,
            },
        },
        "responses": {"n": 2, "strategies": ["avoid_all", "violate_one", "other_user"]},
    }
    for name, values in sections.items():
        if name == "backend":
            # a test may name a backend key flat (base_url=...): it goes to its section,
            # as the config loader would read it, without the loader's deprecation line
            for key, value in values.items():
                target = flat_key_target(key)
                if target is None and isinstance(value, dict):
                    cfg["backend"].setdefault(key, {}).update(value)
                elif target is None:
                    cfg["backend"][key] = value
                else:
                    section, field = target.split(".")
                    cfg["backend"].setdefault(section, {})[field] = value
            continue
        cfg.setdefault(name, {}).update(values)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def disk_state(root: Path) -> dict[str, tuple[str, int, str]]:
    """Every entry under ``root``: relative path -> (kind, size, sha256 of a file's bytes).

    Compared before and after a refused command to show it created, changed and deleted
    nothing. Named pipes and devices are listed by kind, never opened."""
    import hashlib
    import stat

    state = {}
    for p in sorted(root.rglob("*")):
        mode = p.lstat().st_mode
        if stat.S_ISREG(mode):
            digest = hashlib.sha256(p.read_bytes()).hexdigest()
            state[str(p.relative_to(root))] = ("file", p.lstat().st_size, digest)
        else:
            kind = "dir" if stat.S_ISDIR(mode) else f"special:{stat.S_IFMT(mode):o}"
            state[str(p.relative_to(root))] = (kind, 0, "")
    return state
