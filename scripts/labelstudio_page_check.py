"""The human round as an annotator sees it, in a real browser (issue 52, case 7).

Starts a fresh Label Studio 1.23.2 (``PRB_LABEL_STUDIO_VENV``, as the tests do) on a free
loopback port, runs ``prb quickstart`` (HAND-WRITTEN sample data, offline) into a scratch
folder, exports its round 1 to the server with ``prb annotate export``, then drives a
headless Chromium (``scripts/labelstudio_page_check.mjs``: playwright-core and Debian's
``/usr/bin/chromium``) through the labeling page: log in, open the labeling stream, check
that the guidelines (annotation/guidelines.md) open before the first task and that the
page defines "both bad", "general quality differs" and "rubric unclear" beside the
controls, take screenshots, and submit a vote through the page. ``prb annotate import``
then reads that vote back. What it saw goes to ``--out`` (default
docs/audit-screenshots/): the screenshots and ``labelstudio-page-check.json``.

Needs: ``apt-get install chromium`` (about 15 s here) and ``npm install playwright-core``
in ``$PRB_BROWSER_CACHE`` (default ~/.cache/prb-browser; installed on first use, 1 s with a
warm npm cache). Run from the repository root:

    python scripts/labelstudio_page_check.py
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pipeline.annotate.server import LabelStudioServer, free_port  # noqa: E402

CACHE = Path(os.environ.get("PRB_BROWSER_CACHE", Path.home() / ".cache" / "prb-browser"))
VENV = Path(os.environ.get("PRB_LABEL_STUDIO_VENV", ROOT / ".labelstudio" / "venv"))


def _playwright() -> Path:
    modules = CACHE / "node_modules"
    if not (modules / "playwright-core").is_dir():
        CACHE.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund", "--prefix", str(CACHE),
             "playwright-core@1"],
            check=True,
        )  # fmt: skip
    return modules


def _prb(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", *args], env=env, cwd=cwd, capture_output=True,
        text=True,
    )  # fmt: skip
    if res.returncode != 0:
        raise SystemExit(f"prb {' '.join(args)} failed:\n{res.stdout}\n{res.stderr}")
    return res


def _shrink(png: Path) -> None:
    """A screenshot in 64 colours (a third of the bytes, text as legible), when Pillow is
    there; else as Chromium wrote it."""
    try:
        from PIL import Image
    except ImportError:
        return
    with Image.open(png) as im:
        small = im.convert("RGB").quantize(colors=64)
    small.save(png, optimize=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "audit-screenshots")
    ap.add_argument("--chromium", default=os.environ.get("CHROMIUM", "/usr/bin/chromium"))
    args = ap.parse_args()
    if not Path(args.chromium).exists():
        raise SystemExit(f"no Chromium at {args.chromium}: apt-get install chromium")
    if not (VENV / "bin" / "label-studio").exists():
        raise SystemExit(f"no Label Studio venv at {VENV} (PRB_LABEL_STUDIO_VENV)")
    modules = _playwright()
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="prb-page-check-") as tmp_name:
        tmp = Path(tmp_name)
        email = "annotator@prb.local"
        password = secrets.token_urlsafe(12)
        token = secrets.token_hex(20)
        server = LabelStudioServer(
            VENV, tmp / "ls-data", port=free_port(), token=token, password=password,
            username=email, startup_timeout=300,
        )  # fmt: skip
        with server:
            env = {**os.environ, "PYTHONPATH": str(ROOT), "LABEL_STUDIO_API_KEY": token}
            _prb("quickstart", "--out", str(tmp / "outputs"), env=env, cwd=tmp)
            run = tmp / "outputs" / "quickstart"
            url = ["--set", f"annotation.url={server.url}"]
            # the quickstart wrote round 1 as a file; the same round goes to the server
            exported = _prb("annotate", "export", str(run), "--round", "1", *url, env=env, cwd=tmp)
            info = json.loads((run / "annotate" / "round-1" / "export.json").read_text())
            node_env = {**os.environ, "PRB_BROWSER_CACHE": str(modules.parent)}
            page = subprocess.run(
                ["node", str(ROOT / "scripts" / "labelstudio_page_check.mjs"), server.url, email,
                 password, str(info["project_id"]), str(args.out)],
                env={**node_env, "CHROMIUM": args.chromium},
                capture_output=True, text=True, timeout=900,
            )  # fmt: skip
            if page.returncode != 0:
                raise SystemExit(f"the browser check failed:\n{page.stdout}\n{page.stderr}")
            seen = json.loads(page.stdout.strip().splitlines()[-1])
            imported = _prb("annotate", "import", str(run), "--round", "1", *url, env=env, cwd=tmp)
            votes = [
                json.loads(line)
                for line in (run / "annotate" / "round-1" / "annotations.jsonl").open()
            ]
        for shot in seen["screenshots"]:
            _shrink(Path(shot))
        seen["screenshots"] = [os.path.relpath(p, ROOT) for p in seen["screenshots"]]
        record = {
            "what": "a round of the quickstart's HAND-WRITTEN sample pairs, exported to a "
            "fresh Label Studio 1.23.2 and opened in headless Chromium as an annotator",
            "command": "python scripts/labelstudio_page_check.py",
            "date": time.strftime("%Y-%m-%d"),
            "chromium": subprocess.run(
                [args.chromium, "--version"], capture_output=True, text=True
            ).stdout.strip(),
            "export": exported.stdout.strip().splitlines(),
            "seen": seen,
            "import": imported.stdout.strip().splitlines(),
            "votes_imported": [
                {k: v.get(k) for k in ("task_key", "choice", "label", "annotator")} for v in votes
            ],
            "seconds": round(time.monotonic() - started, 1),
        }
    (args.out / "labelstudio-page-check.json").write_text(json.dumps(record, indent=2) + "\n")
    ok = (
        seen.get("instructions_shown_before_the_task")
        and "both bad" in seen.get("instructions_text", "")
        and len(seen.get("definitions_on_the_page", [])) == 5
        and len(votes) == 1
    )
    print(json.dumps(record, indent=2))
    shutil.rmtree(tmp, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
