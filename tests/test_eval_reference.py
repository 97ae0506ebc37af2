"""`prb eval` against the reference's own evaluation scripts (Martin-qyma/Personalized-
RewardBench, evaluation/pointwise.py and pairwise.py), on an 80-pair release `prb`
published, the same tiny reward models and the same fake judge (tests/eval_reference.py).

The reference's figures were produced once by running its scripts, unchanged, as a client
(tests/data/reference_eval_figures.json says how); only those figures are kept here. These
tests rebuild the same release and models and check that `prb eval` gives the same wins,
ties and reference-order accuracy per subset, and that the options named for it matter.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from eval_reference import build_models, build_release, judge_responder, release_fingerprint
from standin_server import StandinServer

from pipeline.cli import main
from pipeline.publish import REFERENCE_SUBSETS

FIGURES = json.loads(
    (Path(__file__).parent / "data" / "reference_eval_figures.json").read_text(encoding="utf-8")
)
# what the reference's pointwise script does: bf16, special tokens added to the templated
# text, softmax in the model's dtype
REFERENCE_RM = "dtype=bfloat16,special_tokens=true,reduce=reference"


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("refcmp")
    release = build_release(tmp / "run")
    return {"release": release, "models": build_models(release, tmp / "models"), "tmp": tmp}


def _eval(setup: dict[str, Any], spec: str, *extra: str) -> dict[str, Any]:
    """`prb eval` of one scorer on the question setting; its results."""
    out = setup["tmp"] / f"eval-{len(list(setup['tmp'].glob('eval-*')))}"  # one per call
    args = ["eval", str(setup["release"]), "--scorer", spec, "--setting", "question"]
    assert main([*args, "--out", str(out), "--no-progress", "--bootstrap", "10", *extra]) == 0
    (folder,) = [p for p in out.iterdir() if p.is_dir()]
    return json.loads((folder / "question" / "results.json").read_text(encoding="utf-8"))


def test_the_release_is_the_one_the_figures_came_from(setup: dict[str, Any]) -> None:
    counts = {s: f["pairs"] for s, f in FIGURES["pairwise"].items()}
    assert sorted(counts) == sorted(REFERENCE_SUBSETS)
    assert sum(counts.values()) >= 75
    assert release_fingerprint(setup["release"]) == FIGURES["release_fingerprint"], (
        "the test release changed (tests/eval_reference.py, the sample input, the stand-in "
        "responder or the pipeline): regenerate tests/data/reference_eval_figures.json as its "
        "_note says"
    )
    rel = json.loads((setup["release"] / "release.json").read_text(encoding="utf-8"))
    assert {c: v["pairs"] for c, v in rel["per_category"].items()} == counts


@pytest.mark.parametrize("model", ["tiny-rm1", "tiny-rm2", "tiny-rm2n"])
def test_pointwise_wins_and_ties_per_subset_equal_the_reference(
    setup: dict[str, Any], model: str
) -> None:
    path = setup["models"][model]
    res = _eval(setup, f"rm:{path},{REFERENCE_RM},batch_size=1")
    m = res["settings"]["question"]["metrics"]
    assert res["scorer"]["reduction"].startswith("reference:")
    for batch, ref in FIGURES["pointwise"][model].items():
        for subset, f in ref.items():
            got = m["by"]["category"][subset]
            losses = got["scored"] - got["wins"] - got["ties"]
            assert (got["pairs"], got["wins"], losses, got["ties"]) == (
                f["pairs"],
                f["chosen_wins"],
                f["rejected_wins"],
                f["ties"],
            ), f"{model} {subset} against the reference's --batch-size {batch}"


def test_the_exact_reduction_breaks_the_reference_bf16_ties(setup: dict[str, Any]) -> None:
    ref_ties = sum(f["ties"] for f in FIGURES["pointwise"]["tiny-rm2n"]["batch_size=1"].values())
    assert ref_ties > 0  # what the bf16 softmax makes of a narrow two-class head
    res = _eval(setup, f"rm:{setup['models']['tiny-rm2n']},dtype=bfloat16,special_tokens=true")
    m = res["settings"]["question"]["metrics"]
    assert res["scorer"]["reduction"].startswith("exact:")
    assert m["ties"] < ref_ties  # float64 tells apart what bf16 rounded together


def test_pairwise_reference_order_per_subset_equals_the_reference(
    setup: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    with StandinServer(responder=judge_responder) as server:
        res = _eval(
            setup,
            "judge:standin-model,format=text,parse=first",
            "--set",
            f"backend.openai.base_url={server.base_url}",
            "--set",
            "backend.openai.max_concurrency=4",
        )
    m = res["settings"]["question"]["metrics"]
    assert res["scorer"]["parse"] == "first 'Result:' line"
    pooled_ref = sum(f["correct"] for f in FIGURES["pairwise"].values())
    total_ref = sum(f["pairs"] for f in FIGURES["pairwise"].values())
    assert f"reference order {pooled_ref / total_ref:.3f} ({pooled_ref}/{total_ref})" in (
        capsys.readouterr().out
    )
    correct = scored = 0
    for subset, f in FIGURES["pairwise"].items():
        pos = m["by"]["category"][subset]["position"]
        # the reference reads an answer without a verdict as "A"; none was drawn here
        assert f["failed_parses"] == 0
        assert (pos["reference_order_scored"], pos["reference_order_correct"]) == (
            f["pairs"],
            f["correct"],
        ), subset
        assert pos["accuracy_reference_order"] == round(f["correct"] / f["pairs"], 4)
        assert pos["reference_order_seeded_per"] == "split"  # one subset: its own draw
        correct += f["correct"]
        scored += f["pairs"]
    pooled = m["position"]
    assert pooled["reference_order_seeded_per"] == "category"
    assert (pooled["reference_order_correct"], pooled["reference_order_scored"]) == (
        correct,
        scored,
    )
    # the fake judge sometimes states a second, opposite verdict: reading the last one
    # (the default) moves the figure
    with StandinServer(responder=judge_responder) as server:
        last = _eval(
            setup,
            "judge:standin-model,format=text",
            "--set",
            f"backend.openai.base_url={server.base_url}",
        )
    assert last["settings"]["question"]["metrics"]["position"]["reference_order_correct"] != (
        correct
    )
