"""What the `prb eval bon` tests, its overhead benchmark and the reference-fidelity script
run on: the sample release (configs/sample.yaml against the stand-in server, published),
three tiny reward models built from its words, and the command line that evaluates them.

The sample input is HAND-WRITTEN (examples/sample_lamp.jsonl), the stand-in answers by
rule (tests/standin_player.py), and the reward models have random weights: the figures
measure the machinery, never a model's quality.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
N_MODELS = 3


def build_release(tmp: Path, base_url: str) -> Path:
    """`prb run configs/sample.yaml` against the stand-in at ``base_url``, published into
    ``tmp/sample/publish``; returns the release folder."""
    from pipeline.cli import main
    from pipeline.config import load_config
    from pipeline.orchestration.orchestrate import run_pipeline

    overrides = [
        f"backend.openai.base_url={base_url}",
        f"run.output_dir={tmp}",
        "backend.openai.max_concurrency=8",
        "backend.openai.timeout_s=120",
    ]
    cfg = load_config(ROOT / "configs" / "sample.yaml", overrides)
    run_pipeline(cfg, progress=False, echo=lambda _m: None)
    assert main(["publish", str(tmp / "sample")]) == 0
    return tmp / "sample" / "publish"


def build_models(release: Path, folder: Path, n: int = N_MODELS) -> list[Path]:
    """Tiny reward models (random weights, one seed each) over the release's words, as
    ``python -m pipeline.eval.tiny`` builds them."""
    from pipeline.eval.tiny import build_tiny_reward_model, split_texts

    texts = split_texts(release)
    return [build_tiny_reward_model(folder / f"tiny-rm-{i}", texts, seed=i) for i in range(n)]


def backend_args(base_url: str, concurrency: int = 4) -> list[str]:
    return [
        "--set",
        f"backend.openai.base_url={base_url}",
        "--set",
        "backend.model=standin-model",
        "--set",
        f"backend.openai.max_concurrency={concurrency}",
        "--set",
        "backend.openai.timeout_s=120",
        "--set",
        "backend.backoff_initial_s=0.01",
    ]


def bon_args(
    release: Path, models: list[Path], base_url: str, out: Path, *extra: str, gen: bool = True
) -> list[str]:
    """``prb eval bon`` over the tiny models (and the stand-in as a generative scorer),
    N = 4, the stand-in as policy and judge."""
    args = ["eval", "bon", str(release)]
    for m in models:
        args += ["--scorer", f"rm:{m}"]
    if gen:
        args += ["--scorer", "gen:standin-model,name=standin-gen"]
    return [
        *args,
        "--n",
        "4",
        "--out",
        str(out),
        "--no-progress",
        "--bootstrap",
        "200",
        *backend_args(base_url),
        *extra,
    ]


def curves(out: Path) -> list[Any]:
    """What must not change between two runs of one command: every scorer's curves."""
    doc = json.loads((out / "bon.json").read_text(encoding="utf-8"))
    return [(b["name"], b["curves"]) for b in doc["scorers"]]


# ---- a judge both sides of the fidelity comparison ask alike ---------------------------


def template_reader(template: str) -> Any:
    """A reader of prompts filled from ``template`` (a prompt file's text, stripped): the
    regular expression that gives back each placeholder's value from a filled prompt."""
    import re

    parts = re.split(r"\{(question|profile|answer|aspects|aspect_list)\}", template)
    pattern = ""
    seen: set[str] = set()
    for i, part in enumerate(parts):
        if i % 2 == 0:
            pattern += re.escape(part)
        elif part in seen:
            pattern += f"(?P={part})"
        else:
            seen.add(part)
            pattern += f"(?P<{part}>.*?)"
    return re.compile(pattern + r"\Z", re.S)


def fake_verdict(prompt: str, reader: Any) -> str | None:
    """The fidelity judge's answer to a prompt filled from the judge template (None for any
    other prompt): each aspect's coverage by the answer (0, 1 or 2, the stand-in player's
    rule), as a list in square brackets. It reads only the prompt's text, so the same
    prompt gets the same verdict from the stand-in server (prb eval bon's judge) and from
    the fake vllm (the reference's evaluate.py)."""
    from standin_player import coverage_score

    found = reader.match(prompt)
    if found is None:
        return None
    values = found.groupdict()
    if values.get("aspect_list") is not None:
        aspects = [a[2:] for a in values["aspect_list"].splitlines() if a.startswith("- ")]
    else:
        aspects = [a for a in (values.get("aspects") or "").split(", ") if a]
    answer, question = values.get("answer") or "", values.get("question") or ""
    return "[" + ", ".join(str(coverage_score(answer, a, question)[0]) for a in aspects) + "]"


def policy_answer(body: dict[str, Any]) -> str | None:
    """The fidelity policy's answer to a best-of-N sample prompt (None for any other): two
    or three of the profile posts the prompt shows (its ``Post i (Category: c):`` lines),
    drawn with the request's seed, so answers differ from sample to sample and cover a
    question's aspects more or less."""
    import random
    import re

    from pipeline.eval.bon import SAMPLE_SYSTEM

    turns = {m["role"]: m["content"] for m in body["messages"]}
    if turns.get("system") != SAMPLE_SYSTEM:
        return None
    posts = re.findall(r"^Post \d+ \(Category: [^)]*\):\n(.+)$", turns.get("user", ""), re.M)
    if not posts:
        return None
    rng = random.Random(json.dumps([body.get("seed"), body["messages"]], sort_keys=True))
    picked = rng.sample(posts, min(len(posts), rng.randint(1, 3)))
    return " ".join(picked)


def judge_responder(template: str) -> Any:
    """The stand-in server's responder playing the fidelity judge (``fake_verdict``) and
    policy (``policy_answer``); the player answers everything else (generative scores)."""
    reader = template_reader(template)

    def respond(body: dict[str, Any], _: int) -> str | None:
        user = next((m["content"] for m in body["messages"] if m["role"] == "user"), "")
        return fake_verdict(user, reader) or policy_answer(body)

    return respond
