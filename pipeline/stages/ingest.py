"""ingest: read the configured input into the ``examples`` contract, all or nothing.

Each example also gets its ``profile_view``: the indices of its ``profile.top_k`` most
relevant past posts under the configured ranker, most relevant first. It is computed here,
once, and every later step (rubric generation, the answers' prompts, the pair record, the
annotation tasks) reads it instead of ranking again."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path
from typing import Any

from pipeline.core.errors import InputError
from pipeline.inputs.ingest import expected_examples, iter_examples, reader
from pipeline.run import StageDir
from pipeline.stages.base import Context, Stage
from pipeline.types.profile import rank_profile

EXAMPLE_FIELDS = frozenset(
    {
        "example_id",
        "source_id",
        "user_id",
        "question",
        "category",
        "profile",
        "profile_view",
        "narrative",
        "rubric_aspects",
    }
)


def _file_digest(path: Path) -> str:
    """Hash of an input file or folder, so editing the input re-runs ingest."""
    h = hashlib.sha256()
    paths = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for p in paths:
        h.update(str(p.relative_to(path) if path.is_dir() else p.name).encode())
        with open(p, "rb") as fh:
            for block in iter(functools.partial(fh.read, 1 << 20), b""):
                h.update(block)
    return h.hexdigest()


class IngestStage(Stage):
    name = "ingest"
    writes = EXAMPLE_FIELDS

    def _inputs(self, ctx: Context) -> list[Path]:
        """The files or folders the configured format reads (none for a Hub dataset: its
        name, configs, split and revision are in the settings)."""
        return reader(ctx.config.input, ctx.config.resolve_input).sources()

    def shard_size(self, ctx: Context) -> int:
        return ctx.config.input.chunk_size

    def settings(self, ctx: Context) -> dict[str, Any]:
        digests = {str(p): _file_digest(p) for p in self._inputs(ctx) if p.exists()}
        # The Hub and contriever settings came later: left at their defaults they stay out,
        # so a run made before them keeps its fingerprint. Where the datasets cache lives
        # and the encoder's batch size decide no row.
        inp = ctx.config.input.model_dump(mode="json", exclude={"cache_dir"})
        for key in ("dataset", "configs", "revision"):
            if not inp[key]:
                del inp[key]
        prof = ctx.config.profile.model_dump(mode="json", exclude={"batch_size"})
        if prof["ranker"] != "contriever":
            del prof["contriever_model"]
        return {"input": inp, "input_digests": digests, "profile": prof}

    @staticmethod
    def profile_view(ctx: Context, example: dict[str, Any]) -> dict[str, Any]:
        """The configured ranker's top posts of one example (indices into its profile)."""
        p = ctx.config.profile
        order = rank_profile(
            example["question"], example["profile"], p.top_k, p.ranker, p.model, p.batch_size
        )
        return {"ranker": p.ranker, "top_k": p.top_k, "order": order}

    def expected(self, ctx: Context) -> int:
        """The examples the input holds as its format counts them (a JSONL file's non-blank
        lines, a dataset's rows: cheap, nothing is validated; the run validates), capped at
        input.limit."""
        return expected_examples(ctx.config.input, ctx.config.resolve_input)

    def run(self, ctx: Context, out: StageDir) -> dict[str, Any]:
        # resumable like every stage: examples already in a shard are not written again
        done = out.done_examples()
        chunk = self.shard_size(ctx)
        buffer: list[dict] = []
        cats: dict[str, int] = {}
        users: set[str] = set()
        n = with_rubric = 0
        try:
            for r in iter_examples(ctx.config.input, ctx.config.resolve_input):
                n += 1
                users.add(r["user_id"])
                with_rubric += bool(r.get("rubric_aspects"))
                cats[str(r.get("category"))] = cats.get(str(r.get("category")), 0) + 1
                if r["example_id"] in done:
                    continue
                r["profile_view"] = self.profile_view(ctx, r)
                buffer.append(r)
                if len(buffer) >= chunk:
                    out.write_shard(buffer)
                    buffer = []
        except InputError:
            # the input is streamed: a bad line late in the file comes after shards were
            # written; bad input leaves nothing half-written
            out.clear()
            raise
        if buffer:
            out.write_shard(buffer)
        return {
            "examples": n,
            "users": len(users),
            "with_rubric": with_rubric,
            "per_category": cats,
            "resumed_examples": len(done),
        }
