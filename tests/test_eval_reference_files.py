"""The reference's pairwise protocol reproduced with prompt files and its parse-failure rule
(system_prompt=, user_prompt=, unparsed=a), on the 80-pair release and fake judge of
tests/eval_reference.py, against the figures its own script printed there
(tests/data/reference_eval_figures.json).

The prompt files are HAND-WRITTEN test data in the reference's placeholder style, laid out
so the fake judge finds the question and the two responses; they are not its files.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from eval_reference import build_release, judge_responder
from standin_server import StandinServer

from pipeline.cli import main

FIGURES = json.loads(
    (Path(__file__).parent / "data" / "reference_eval_figures.json").read_text(encoding="utf-8")
)
# hand-written test data, not the reference's prompt text
SYSTEM = "You judge two responses for prb's tests. End with **Result:** <A or B>.\n"
USER = """\
The asker's question:
```
{question}
```

Response A:
```
{Response_A}
```

Response B:
```
{Response_B}
```
"""


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_release(tmp_path_factory.mktemp("reffiles") / "run")


def test_prompt_files_and_unparsed_a_give_the_reference_figures_per_subset(
    release: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "system.txt").write_text(SYSTEM, encoding="utf-8")
    (tmp_path / "user.txt").write_text(USER, encoding="utf-8")
    spec = (
        "judge:standin-model,format=text,parse=first,unparsed=a,"
        f"system_prompt={tmp_path / 'system.txt'},user_prompt={tmp_path / 'user.txt'}"
    )
    out = tmp_path / "ev"
    with StandinServer(responder=judge_responder) as server:
        args = ["eval", str(release), "--scorer", spec, "--setting", "question", "--out", str(out)]
        args += ["--no-progress", "--bootstrap", "10"]
        args += ["--set", f"backend.openai.base_url={server.base_url}"]
        assert main([*args, "--set", "backend.openai.max_concurrency=4"]) == 0
        bodies = [r["body"] for r in server.requests]
    printed = capsys.readouterr().out
    assert all(b["messages"][0] == {"role": "system", "content": SYSTEM.strip()} for b in bodies)
    assert all(b["messages"][1]["content"].startswith("The asker's question:") for b in bodies)
    (folder,) = [p for p in out.iterdir() if p.is_dir()]
    res: dict[str, Any] = json.loads((folder / "question" / "results.json").read_text())
    m = res["settings"]["question"]["metrics"]
    assert res["scorer"]["unparsed_verdicts_read_as"] == "A"
    assert m["failed"] == 0  # every verdict, parsed or read as "A", counts
    assert m["unparsed_verdicts"] > 0  # the fake judge's answers without a verdict
    rates = []
    for subset, f in FIGURES["pairwise"].items():
        pos = m["by"]["category"][subset]["position"]
        # the reference's total counts every pair (an unparsed verdict is its "A"): so do we
        assert (pos["reference_order_scored"], pos["reference_order_correct"]) == (
            f["pairs"],
            f["correct"],
        ), subset
        rates.append(f["correct"] / f["pairs"])
    # the mean of the subsets' figures, as the reference reports one per subset
    pooled = m["position"]
    assert pooled["accuracy_reference_order_mean_of_categories"] == round(sum(rates) / 3, 4)
    assert f"by cat {sum(rates) / 3:.3f}" in printed
    by_cat = [m["by"]["category"][s] for s in FIGURES["pairwise"]]
    assert m["accuracy_mean_of_categories"] == round(
        sum(b["wins"] / b["scored"] for b in by_cat) / 3, 4
    )
