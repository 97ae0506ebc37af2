"""ingest: read the configured input into the ``examples`` contract, all or nothing."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from pipeline.rundir import StageDir
from pipeline.stages.base import Context, Stage

EXAMPLE_FIELDS = {
    "example_id",
    "source_id",
    "user_id",
    "question",
    "category",
    "profile",
    "narrative",
    "rubric_aspects",
}


def _file_digest(path: Path) -> str:
    """Hash of an input file or folder, so editing the input re-runs ingest."""
    h = hashlib.sha256()
    paths = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for p in paths:
        h.update(str(p.relative_to(path) if path.is_dir() else p.name).encode())
        with open(p, "rb") as fh:
            for block in iter(lambda fh=fh: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


class IngestStage(Stage):
    name = "ingest"
    writes = EXAMPLE_FIELDS

    def __init__(self) -> None:
        self._examples: list[dict] | None = None

    def _inputs(self, ctx: Context) -> list[Path]:
        c = ctx.config.input
        return [
            p
            for p in (ctx.config.resolve_input(x) for x in (c.path, c.users_path, c.questions_path))
            if p is not None
        ]

    def settings(self, ctx: Context) -> dict[str, Any]:
        digests = {str(p): _file_digest(p) for p in self._inputs(ctx) if p.exists()}
        return {"input": ctx.config.input.model_dump(mode="json"), "input_digests": digests}

    def load(self, ctx: Context) -> list[dict]:
        if self._examples is None:
            from pipeline.ingest import load_examples

            self._examples = load_examples(ctx.config.input, ctx.config.resolve_input)
        return self._examples

    def expected(self, ctx: Context) -> int:
        return len(self.load(ctx))

    def run(self, ctx: Context, out: StageDir) -> dict[str, Any]:
        rows = self.load(ctx)
        out.write_shard(rows)
        cats: dict[str, int] = {}
        for r in rows:
            cats[str(r.get("category"))] = cats.get(str(r.get("category")), 0) + 1
        return {
            "examples": len(rows),
            "users": len({r["user_id"] for r in rows}),
            "with_rubric": sum(1 for r in rows if r.get("rubric_aspects")),
            "per_category": cats,
        }
