"""One verdict per audit: the page's headline, the CLI's summary, audit.json and the
``--fail-on`` gate read the same decision; the page never says "clear" next to a probe
figure over the threshold; no chart is drawn without data; count axes tick in whole
numbers.

The sets are the hand-made ``crafted`` pairs of tests/test_audit.py (made-up words, not
model output)."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest
from test_audit import crafted, write_jsonl

from pipeline.audit import audit
from pipeline.audit.probe import PROBE_FLAG_AUC, PROBE_MIN_PAIRS, strength
from pipeline.audit.report import _axis
from pipeline.cli import main

# ---- helpers ------------------------------------------------------------------------------


def _run_cli(tmp_path: Path, src: Path, capsys, fail_on: str | None = None) -> tuple[int, str, str]:
    args = ["audit", str(src), "--out", str(tmp_path / "out")]
    code = main(args + (["--fail-on", fail_on] if fail_on else []))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _saved(tmp_path: Path) -> tuple[dict, str]:
    out = tmp_path / "out"
    return (
        json.loads((out / "audit.json").read_text(encoding="utf-8")),
        (out / "audit.html").read_text(encoding="utf-8"),
    )


def _headline(page: str) -> tuple[str, str]:
    """(class, text) of the page's one headline."""
    found = re.findall(r'<p class="headline (\w+)">(.*?)</p>', page, re.S)
    assert len(found) == 1, found
    cls, text = found[0]
    return cls, html.unescape(text)


def _figures_over(probe: dict) -> list[str]:
    """Every probe figure over the threshold, computed here from the raw figures."""
    over = [k for k in ("auc", "pooled_auc") if probe[k] > PROBE_FLAG_AUC]
    over += [f for f, a in probe["single_feature_auc"].items() if strength(a) > PROBE_FLAG_AUC]
    return over


def _agree(fig: dict, page: str, out: str) -> None:
    """The page, the JSON and the CLI's lines show the same verdict."""
    v = fig["verdict"]
    cls, text = _headline(page)
    assert text == v["headline"]
    assert cls == {"clear": "ok", "flagged": "flag", "too_small": "warn"}[v["status"]]
    lines = out.splitlines()
    assert v["headline"] in lines  # the CLI prints the headline as it is
    for r in v["reasons"]:
        assert f"  - {r['text']}" in lines
        assert html.escape(r["text"]) in page
    if v["status"] != "clear":
        assert v["reasons"] and not v["headline"].startswith("Clear")


# ---- the verdict and the gate -------------------------------------------------------------


def test_set_too_small_for_the_probe(tmp_path, capsys):
    n = PROBE_MIN_PAIRS - 4
    src = write_jsonl(tmp_path / "small.jsonl", crafted(n, biased=False, seed=3))
    code, out, err = _run_cli(tmp_path, src, capsys)
    assert code == 0  # no gate: the verdict is reported, the exit code stays 0
    fig, page = _saved(tmp_path)
    v = fig["verdict"]
    assert v["status"] == "too_small" and fig["shortcut_probe"]["status"] == "too_small"
    # under the probe's minimum it does not run: that minimum is not a size that clears
    assert v["headline"].startswith(
        f"Too small to clear of shortcuts: {n} pairs; the probe runs from {PROBE_MIN_PAIRS} "
        "pairs and clears a set only where chance stays under 0.6"
    )
    assert "needs" not in v["headline"]
    assert [(r["gate"], r["kind"]) for r in v["reasons"]] == [("shortcut_probe", "cannot_clear")]
    assert v["shortcut"] == {
        **v["shortcut"],
        "ran": False,
        "needs_pairs": None,
        "runs_from": PROBE_MIN_PAIRS,
    }
    _agree(fig, page, out)
    assert "No shortcut" not in page and 'class="headline ok"' not in page

    # the gate: a set that cannot be cleared fails `any` and `shortcut_probe`, with why
    for fail_on in ("any", "shortcut_probe", "empty,shortcut_probe"):
        code, out, err = _run_cli(tmp_path, src, capsys, fail_on)
        assert code == 3, fail_on
        assert f"audit gate failed (--fail-on {fail_on}): too small to clear of shortcuts" in err
        assert f"{n} pairs; the probe runs from {PROBE_MIN_PAIRS} pairs" in err
    # a gate on a check that ran and did not fire passes
    code, out, err = _run_cli(tmp_path, src, capsys, "empty,refusal")
    assert code == 0 and err == ""


def test_the_size_a_set_needs_reads_the_same_below_and_at_the_minimum(tmp_path, capsys):
    """One pair under the probe's minimum, and at it: the audit never says the minimum
    is what the set needs, and once the probe runs it says about how many clear it,
    more than the minimum (the chance level is far over 0.6 at 10 pairs)."""
    said = {}
    for n in (PROBE_MIN_PAIRS - 1, PROBE_MIN_PAIRS):
        src = write_jsonl(tmp_path / f"n{n}.jsonl", crafted(n, biased=False, seed=3))
        _code, out, _err = _run_cli(tmp_path, src, capsys)
        fig, page = _saved(tmp_path)
        _agree(fig, page, out)
        said[n] = fig["verdict"]
    below, at = said[PROBE_MIN_PAIRS - 1], said[PROBE_MIN_PAIRS]
    assert below["status"] == at["status"] == "too_small"
    assert f"the probe runs from {PROBE_MIN_PAIRS} pairs" in below["headline"]
    assert f"needs {PROBE_MIN_PAIRS}" not in below["headline"]
    needs = at["shortcut"]["needs_pairs"]
    assert needs > PROBE_MIN_PAIRS
    assert f"{PROBE_MIN_PAIRS} pairs, the probe needs about {needs:,} to clear it" in at["headline"]


def test_the_issue_case_is_not_cleared(tmp_path, capsys):
    """Ten pairs whose cross-validated AUC is under the threshold while one feature alone
    is over it (the report said "No shortcut flagged" next to such figures)."""
    src = write_jsonl(tmp_path / "ten.jsonl", crafted(10, biased=False, seed=7))
    code, out, err = _run_cli(tmp_path, src, capsys, "any")
    fig, page = _saved(tmp_path)
    probe = fig["shortcut_probe"]
    assert probe["auc"] <= PROBE_FLAG_AUC  # the premise: the old rule cleared this set
    assert _figures_over(probe)  # ...while a figure on the same page is over the threshold
    assert probe["status"] == "too_small" and fig["verdict"]["status"] == "too_small"
    assert {x["value"] > PROBE_FLAG_AUC for x in probe["over_threshold"]} == {True}
    assert fig["verdict"]["headline"].startswith("Too small to clear of shortcuts: 10 pairs")
    _agree(fig, page, out)
    assert code == 3 and "too small to clear of shortcuts: 10 pairs" in err


@pytest.mark.parametrize("n", [10, 12, 20, 40, 150])
@pytest.mark.parametrize("biased", [False, True])
def test_never_clear_next_to_a_figure_over_the_threshold(tmp_path, n, biased):
    for seed in range(3):
        fig = audit(write_jsonl(tmp_path / "p.jsonl", crafted(n, biased, seed)), tmp_path / "o")
        probe = fig["shortcut_probe"]
        over = _figures_over(probe)
        if over:
            assert probe["status"] != "clear" and fig["verdict"]["status"] != "clear"
            assert {x["figure"].split(".")[-1] for x in probe["over_threshold"]} == set(over)
        if probe["status"] == "clear":
            assert probe["chance_highest_p95"] <= PROBE_FLAG_AUC
        page = (tmp_path / "o" / "audit.html").read_text(encoding="utf-8")
        assert (_headline(page)[0] == "ok") == (fig["verdict"]["status"] == "clear")


def test_large_set_the_probe_clears(tmp_path, capsys):
    src = write_jsonl(tmp_path / "balanced.jsonl", crafted(300, biased=False, seed=1))
    code, out, err = _run_cli(tmp_path, src, capsys, "any")
    fig, page = _saved(tmp_path)
    v, probe = fig["verdict"], fig["shortcut_probe"]
    assert code == 0 and err == ""
    assert v["status"] == "clear" and v["reasons"] == [] and probe["status"] == "clear"
    assert _figures_over(probe) == []
    assert probe["highest"]["value"] <= PROBE_FLAG_AUC
    assert probe["chance_highest_p95"] <= PROBE_FLAG_AUC
    assert v["headline"].startswith("Clear: no check fired")
    _agree(fig, page, out)
    assert "shortcut probe (clear)" in out


def test_large_set_the_probe_flags(tmp_path, capsys):
    src = write_jsonl(tmp_path / "biased.jsonl", crafted(300, biased=True, seed=1))
    code, out, err = _run_cli(tmp_path, src, capsys)
    fig, page = _saved(tmp_path)
    v, probe = fig["verdict"], fig["shortcut_probe"]
    assert code == 0  # no gate
    assert v["status"] == "flagged" and probe["status"] == "flagged" and probe["flagged"]
    assert probe["highest"]["value"] > max(PROBE_FLAG_AUC, probe["chance_highest_p95"])
    assert "shortcut probe:" in v["headline"] and v["headline"].startswith("Flagged: ")
    (reason,) = [r for r in v["reasons"] if r["gate"] == "shortcut_probe"]
    assert reason["kind"] == "flagged" and "chosen answers are longer" in reason["text"]
    _agree(fig, page, out)
    code, _, err = _run_cli(tmp_path, src, capsys, "shortcut_probe")
    assert code == 3 and reason["text"] in err
    # a gate on checks alone does not read the probe
    code, _, err = _run_cli(tmp_path, src, capsys, "empty")
    assert code == 0 and err == ""


def test_checks_and_probe_in_one_verdict(tmp_path, capsys):
    rows = crafted(300, biased=False, seed=1)
    rows[4]["rejected"] = "  "
    rows[9]["rejected"] = "I'm sorry, but I can't help with that."
    src = write_jsonl(tmp_path / "p.jsonl", rows)
    code, out, err = _run_cli(tmp_path, src, capsys, "refusal")
    fig, page = _saved(tmp_path)
    v = fig["verdict"]
    assert v["status"] == "flagged" and fig["shortcut_probe"]["status"] == "clear"
    assert [r["gate"] for r in v["reasons"]] == ["empty", "refusal"]
    assert v["checks"]["fired"] == {"empty": 1, "refusal": 1}
    assert "the shortcut probe clears the set" in v["headline"]
    _agree(fig, page, out)
    assert code == 3 and "Refusal (refusal) fired on 1 of 300 pairs" in err
    assert "empty" not in err.split("):", 1)[1]  # only the named check's reason


def test_gate_on_a_check_that_did_not_run(tmp_path, capsys):
    src = write_jsonl(tmp_path / "p.jsonl", crafted(300, biased=False, seed=1))
    code, _, err = _run_cli(tmp_path, src, capsys, "quality_floor")
    assert code == 3
    assert (
        "quality_floor did not run (no quality_chosen or quality_rejected values in this source)"
        in err
    )
    # `any` gates on what the audit decided: the checks that ran, and the probe
    code, _, err = _run_cli(tmp_path, src, capsys, "any")
    assert code == 0 and err == ""


def test_judge_columns_of_nulls_did_not_run(tmp_path, capsys):
    """A release made with the judge off has the judge columns, every value null (the
    reference's construction): its judge checks did not run, in the headline, the JSON and
    the gate (issue 52, case 10)."""
    rows = crafted(60, biased=False, seed=3)
    nulls = dict.fromkeys(("correctness", "relevance", "helpfulness"))
    for r in rows:
        r.update(
            quality_chosen=dict(nulls),
            quality_rejected=dict(nulls),
            coverage_chosen_mean=None,
            coverage_rejected_mean=None,
            pairwise_aware={"AB": None, "BA": None},
            pairwise_blind={"AB": None, "BA": None},
            finish_reasons={"chosen": "stop", "rejected": "stop"},
        )
    src = write_jsonl(tmp_path / "p.jsonl", rows)
    code, _, err = _run_cli(tmp_path, src, capsys, "quality_floor,blind_leak")
    fig, _ = _saved(tmp_path)
    judge = {"quality_floor", "quality_gap", "coverage", "blind_leak", "aware_disagrees"}
    assert set(fig["checks"]["not_run"]) == judge
    assert not judge & set(fig["checks"]["ran"]) and len(fig["checks"]["ran"]) == 11
    assert "11 of 16 checks ran" in fig["verdict"]["headline"]
    assert code == 3
    assert "quality_floor did not run" in err and "blind_leak did not run" in err
    # a row that has a verdict makes its check run
    rows[0]["pairwise_blind"] = {"AB": "chosen", "BA": "tie"}
    src = write_jsonl(tmp_path / "p.jsonl", rows)
    code, _, err = _run_cli(tmp_path, src, capsys, "blind_leak")
    fig, _ = _saved(tmp_path)
    assert "blind_leak" in fig["checks"]["ran"] and code == 0


# ---- charts ---------------------------------------------------------------------------------


def _charts(page: str) -> dict[str, str]:
    return dict(re.findall(r'<svg[^>]*aria-label="([^"]*)"[^>]*>(.*?)</svg>', page, re.S))


def _bars(svg: str) -> list[tuple[float, float]]:
    """(width, height) of every data bar (bars carry a <title>; legend swatches do not)."""
    return [
        (float(w), float(h))
        for w, h in re.findall(r'<rect [^>]*width="([\d.]+)" height="([\d.]+)"[^>]*><title>', svg)
    ]


def test_no_chart_without_data(tmp_path, capsys):
    rows = crafted(12, biased=False, seed=2)
    for r in rows:
        r.pop("category")  # no category column
    a = write_jsonl(tmp_path / "a.jsonl", rows)
    b = write_jsonl(tmp_path / "b.jsonl", crafted(12, biased=False, seed=4))
    code = main(["audit", str(a), "--compare", str(b), "--out", str(tmp_path / "out")])
    assert code == 0
    capsys.readouterr()
    fig, page = _saved(tmp_path)
    assert fig["checks"]["pairs_flagged"] == 0 and fig["compare"]["checks"]["pairs_flagged"] == 0
    charts = _charts(page)
    # no check fired in either source: neither checks chart is drawn, a line says why
    assert "Pairs flagged per check (per 100 pairs)" not in charts
    assert "Checks fired per 100 pairs" not in charts
    assert "No chart: no check fired on any of the 12 pairs." in page
    assert "No chart: no check fired in either source." in page
    # no category column: said so, no table of one "None" row, no chart
    assert "No category column in this source." in page
    assert "Pairs where the chosen is longer, per category" not in charts
    # no judge columns: one line names what is missing instead of empty sections
    assert "Not in this source, so not shown: quality gap" in page
    assert "<h2>Quality gap" not in page and "<h2>Rubric-blind leakage" not in page
    # every chart that is drawn has data: at least one bar of non-zero size
    assert set(charts) >= {"Answer length", "Chosen vs rejected similarity"}
    for title, svg in charts.items():
        assert any(w > 0 and h > 0 for w, h in _bars(svg)), title


def test_one_category_gets_no_chart(tmp_path):
    rows = crafted(12, biased=False, seed=2)
    for r in rows:
        r["category"] = "Alpha"
    audit(write_jsonl(tmp_path / "p.jsonl", rows), tmp_path / "out")
    page = (tmp_path / "out" / "audit.html").read_text(encoding="utf-8")
    assert "Pairs where the chosen is longer, per category" not in _charts(page)
    assert "No chart: one category only" in page


def test_checks_chart_drawn_when_a_check_fired(tmp_path):
    rows = crafted(12, biased=False, seed=2)
    rows[0]["rejected"] = ""
    audit(write_jsonl(tmp_path / "p.jsonl", rows), tmp_path / "out")
    page = (tmp_path / "out" / "audit.html").read_text(encoding="utf-8")
    svg = _charts(page)["Pairs flagged per check (per 100 pairs)"]
    assert any(w > 0 for w, _ in _bars(svg))


def _y_ticks(svg: str) -> list[str]:
    """The y-axis tick labels of an svg_bars chart (right-aligned left of the plot)."""
    return re.findall(
        r'<text x="58" y="[\d.]+" text-anchor="end" font-size="11">([^<]*)</text>', svg
    )


@pytest.mark.parametrize("n", [10, 12, 40, 300])
def test_count_axes_tick_in_whole_numbers(tmp_path, n):
    audit(write_jsonl(tmp_path / "p.jsonl", crafted(n, biased=False, seed=5)), tmp_path / "o")
    page = (tmp_path / "o" / "audit.html").read_text(encoding="utf-8")
    charts = _charts(page)
    for title in ("Answer length", "Chosen vs rejected similarity"):
        ticks = _y_ticks(charts[title])
        assert len(ticks) >= 2, title
        values = [int(t.replace(",", "")) for t in ticks]  # ValueError on "0.5"
        assert values == sorted(set(values)) and values[0] == 0, (title, ticks)
        tallest = max(h for _, h in _bars(charts[title]))
        assert tallest > 0


def test_integer_axis_steps():
    for v in [*range(0, 60), 99, 101, 1234, 0.5, 2.5]:
        top, step = _axis(v, integer=True)
        assert step >= 1 and step == int(step) and top >= v and top == int(top), v
        assert top / step <= 6 or v <= 0, v
