"""prb eval's two registries, SCORERS (the spec prefixes: rm, judge) and ENGINES (the
reward-model engines: transformers, vllm): each refuses what the project's one registry
class refuses, an unknown name is one line naming --scorer with the closest one, and a
kind or an engine a test registers is parsed, listed by --scorer-help and run by prb eval
without any other module knowing its name (the extension issue 43 asks for)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from eval_split import all_texts, write_split

from pipeline.cli import main
from pipeline.core.errors import InputError
from pipeline.core.registry import Registry
from pipeline.eval import metrics
from pipeline.eval.evaluate import Job, Scored, setting_block
from pipeline.eval.pointwise import ENGINES, Encoder, RMEngine, VLLMScorer
from pipeline.eval.spec import SCORERS, RewardModel, ScorerKind, describe_options, parse_spec

REGISTRIES = [
    (SCORERS, ScorerKind, "rm", RewardModel, "scorer"),
    (ENGINES, RMEngine, "vllm", VLLMScorer, "reward-model engine"),
]
IDS = ["scorers", "engines"]


@pytest.mark.parametrize(("registry", "base", "name", "entry", "kind"), REGISTRIES, ids=IDS)
def test_a_taken_name_is_refused(
    registry: Registry[Any], base: type, name: str, entry: type, kind: str
) -> None:
    assert registry.kind == kind and registry.field == "--scorer"
    assert registry.base is base and registry.get(name) is entry
    other = type("Other", (base,), {"name": name})
    with pytest.raises(ValueError, match=f"{kind} '{name}' is already registered"):
        registry.register(name, other)
    assert registry.get(name) is entry


@pytest.mark.parametrize(("registry", "base", "name", "entry", "kind"), REGISTRIES, ids=IDS)
def test_a_non_class_and_a_wrong_base_are_refused(
    registry: Registry[Any], base: type, name: str, entry: type, kind: str
) -> None:
    with pytest.raises(TypeError, match="is not a class"):
        registry.register("an-instance", object())
    with pytest.raises(TypeError, match="is not a subclass of"):
        registry.register("a-dict", dict)
    assert "an-instance" not in registry and "a-dict" not in registry


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("rmx:/models/rm", "unknown scorer 'rmx'. Did you mean 'rm'?"),
        ("judg:m", "unknown scorer 'judg'. Did you mean 'judge'?"),
        ("rm:/models/rm,engine=vlm", "one of transformers, vllm, got 'vlm'. Did you mean 'vllm'?"),
    ],
)  # fmt: skip
def test_an_unknown_prefix_or_engine_is_one_line_naming_scorer(
    spec: str, expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["eval", str(tmp_path / "split.jsonl"), "--scorer", spec]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --scorer") and "\n" not in err and "Traceback" not in err
    assert expected in err
    with pytest.raises(InputError, match="Did you mean"):
        parse_spec(spec)


# ---- a scorer kind registered here: parsed, listed and evaluated ---------------------------


def score_longer(job: Job) -> Scored:
    """The toy kind's evaluator: the longer answer wins (the shorter with prefer=short)."""
    sign = -1 if job.spec.opt("prefer") == "short" else 1
    got = Scored({}, {}, [], {"prefer": job.spec.opt("prefer")}, {"template": "none"})
    for s in job.settings:
        lengths = [(sign * len(p.chosen), sign * len(p.rejected)) for p in job.pairs]
        got.outcomes[s] = [metrics.pointwise_outcome(c, r) for c, r in lengths]
        got.blocks[s] = setting_block(s, got.outcomes[s], job.pairs, job.n_boot, job.seed)
        got.scores += [
            {"pair": p.key, "setting": s, "outcome": o}
            for p, o in zip(job.pairs, got.outcomes[s], strict=True)
        ]
    return got


class Longer(ScorerKind):
    name = "longer"
    scoring = "pointwise"
    usage = "longer:LABEL"
    options = {
        "prefer": (str, "long", "long or short: which answer wins"),
        "name": (str, "", "name on the leaderboard"),
    }
    choices = {"prefer": ("long", "short")}
    evaluator = f"{__name__}:score_longer"


@pytest.fixture
def longer() -> Iterator[type[ScorerKind]]:
    SCORERS.register("longer", Longer)
    try:
        yield Longer
    finally:
        SCORERS.unregister("longer")
    assert "longer" not in SCORERS


def test_a_scorer_kind_registered_elsewhere_is_parsed_listed_and_evaluated(
    longer: type[ScorerKind], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = parse_spec("longer:length,prefer=short")
    assert spec.scorer is Longer and spec.kind == "pointwise"
    assert spec.opt("prefer") == "short" and spec.slug() == "longer-length-prefer=short"
    with pytest.raises(InputError, match="did you mean 'prefer'"):
        parse_spec("longer:x,prefr=long")
    with pytest.raises(InputError, match=r"must be one of long, short, got 'shrt'\. Did you"):
        parse_spec("longer:x,prefer=shrt")
    with pytest.raises(InputError, match=r"or longer:LABEL, got 'longr:x'.*Did you mean"):
        parse_spec("longr:x")
    assert "longer options:\n  prefer='long': long or short" in describe_options()

    split, root = write_split(tmp_path), tmp_path / "eval"
    args = ["eval", str(split), "--scorer", "longer:length,prefer=short", "--out", str(root)]
    assert main([*args, "--setting", "question", "--no-progress"]) == 0
    assert "longer-length-prefer=short" in capsys.readouterr().out
    res = json.loads((root / "longer-length-prefer=short/question/results.json").read_text())
    assert res["scorer"]["kind"] == "pointwise" and res["scorer"]["prefer"] == "short"
    assert res["settings"]["question"]["metrics"]["pairs"] > 0
    assert res["template"] == {"template": "none"}


# ---- a reward-model engine registered here -----------------------------------------------


class Lengths(RMEngine):
    """Scores each input by its number of tokens, times ``lengths.scale``."""

    name = "lengths"
    about = "the number of tokens"
    args = "Lengths(...)"

    def __init__(self, encoder: Encoder, scale: float) -> None:
        self.encoder, self.scale = encoder, scale

    @classmethod
    def load(cls, encoder: Encoder, spec: Any, *, progress: bool = True) -> Lengths:
        return cls(encoder, float(spec.engine_args.get("scale", 1.0)))

    def score_ids(self, ids: Sequence[Sequence[int]]) -> list[float]:
        return [self.scale * len(x) for x in ids]

    def info(self) -> dict[str, Any]:
        return {"engine": self.name, "scale": self.scale}


@pytest.fixture
def lengths() -> Iterator[type[RMEngine]]:
    ENGINES.register("lengths", Lengths)
    try:
        yield Lengths
    finally:
        ENGINES.unregister("lengths")
    assert "lengths" not in ENGINES


def test_an_engine_registered_elsewhere_is_an_allowed_engine(lengths: type[RMEngine]) -> None:
    spec = parse_spec("rm:/m/rm,engine=lengths,lengths.scale=2")
    assert spec.opt("engine") == "lengths" and spec.engine_args == {"scale": 2}
    assert spec.slug() == "rm-rm-engine=lengths"
    with pytest.raises(InputError, match=r"lengths\.\* options need engine=lengths"):
        parse_spec("rm:/m/rm,lengths.scale=2")
    with pytest.raises(InputError, match=r"vllm\.\* options need engine=vllm"):
        parse_spec("rm:/m/rm,engine=lengths,vllm.enforce_eager=true")
    with pytest.raises(InputError, match="leave out engine=lengths"):
        parse_spec("rm:/m/rm,engine=lengths,device_map=auto")
    with pytest.raises(InputError, match="one of transformers, vllm, lengths, got 'x'"):
        parse_spec("rm:/m/rm,engine=x")
    help_text = describe_options()
    assert "  engine=lengths: the number of tokens" in help_text
    assert "  lengths.KEY=VALUE: passed to Lengths(...) with engine=lengths" in help_text


def test_prb_eval_scores_with_an_engine_registered_elsewhere(
    lengths: type[RMEngine], tmp_path: Path
) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from pipeline.eval.tiny import build_tiny_reward_model

    rm = build_tiny_reward_model(tmp_path / "tiny-rm", all_texts())
    split, root = write_split(tmp_path), tmp_path / "eval"
    spec = f"rm:{rm},engine=lengths,lengths.scale=0.5"
    args = ["eval", str(split), "--scorer", spec, "--out", str(root), "--setting", "question"]
    assert main([*args, "--no-progress"]) == 0
    res = json.loads((root / "rm-tiny-rm-engine=lengths/question/results.json").read_text())
    assert res["scorer"]["engine"] == "lengths" and res["scorer"]["scale"] == 0.5
    assert "engine_args" not in res["scorer"] and "crosscheck" not in res["scorer"]
    scores = [json.loads(x) for x in (root / "rm-tiny-rm-engine=lengths/question/scores.jsonl")
              .read_text().splitlines()]  # fmt: skip
    assert scores and all(s["chosen"] * 2 == int(s["chosen"] * 2) for s in scores)
