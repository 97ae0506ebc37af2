"""prb eval correlate TABLE.csv: Spearman's rank correlation between benchmark accuracy and
downstream scores, per subset and overall, with a percentile bootstrap interval over models.

The tables here are HAND-WRITTEN test data (made-up models and scores)."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import numpy as np
import pytest

from pipeline.cli import main
from pipeline.eval.correlate import average_ranks, bootstrap_spearman, spearman

# hand-written test data: made-up reward models, accuracies and downstream scores
TABLE = """\
model,subset,accuracy,bon,ppo
rm-a,Art,0.71,7.9,6.2
rm-b,Art,0.64,7.1,6.0
rm-c,Art,0.58,7.3,
rm-d,Art,0.55,6.2,5.1
rm-e,Art,0.64,6.8,5.5
rm-a,Life,0.66,7.0,6.6
rm-b,Life,0.69,7.4,6.1
rm-c,Life,0.52,6.1,5.2
rm-d,Life,0.60,6.1,5.9
rm-e,Life,0.61,6.5,5.3
"""


def _ranks(values: list[float]) -> list[float]:
    """Average ranks by sorting (independent of the module's counting formula)."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def _rho(x: list[float], y: list[float]) -> float | None:
    """Spearman's rho the textbook way: Pearson's r of the average ranks; None if constant."""
    try:
        return statistics.correlation(_ranks(x), _ranks(y))
    except statistics.StatisticsError:
        return None


def _loop_interval(x: list[float], y: list[float], n_boot: int, seed: int) -> list[float]:
    """The interval by an explicit loop over the documented draw."""
    n = len(x)
    idx = np.random.default_rng(seed).integers(0, n, size=(n_boot, n))
    rhos = []
    for row in idx:
        r = _rho([x[i] for i in row], [y[i] for i in row])
        if r is not None:
            rhos.append(r)
    lo, hi = np.quantile(rhos, [0.025, 0.975])
    return [round(float(lo), 4), round(float(hi), 4)]


def test_spearman_by_hand_with_ties() -> None:
    # ranks x: 1, 2.5, 2.5, 4; y: 1, 3, 2, 4; r = 4.5 / sqrt(4.5 * 5)
    assert spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(4.5 / math.sqrt(22.5))
    assert spearman([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 1, 1], [1, 2, 3]) is None  # constant: undefined
    assert average_ranks(np.array([3.0, 1.0, 3.0, 2.0])).tolist() == [3.5, 1.0, 3.5, 2.0]


@pytest.mark.filterwarnings("ignore:An input array is constant")
def test_spearman_equals_scipy() -> None:
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(7)
    for n in (3, 5, 8, 13):
        for _ in range(20):
            x = rng.integers(0, 4, n).astype(float)  # many ties
            y = rng.normal(size=n).round(1)
            ours = spearman(list(x), list(y))
            theirs = stats.spearmanr(x, y).statistic
            if math.isnan(theirs):
                assert ours is None
            else:
                assert ours == pytest.approx(theirs, abs=1e-12)
            assert average_ranks(x).tolist() == stats.rankdata(x).tolist()


def test_bootstrap_interval_equals_an_explicit_loop() -> None:
    x = [0.71, 0.64, 0.58, 0.55, 0.64, 0.61]
    y = [7.9, 7.1, 7.3, 6.2, 6.8, 6.8]
    for seed in (0, 3):
        ci, undefined = bootstrap_spearman(x, y, 500, seed)
        assert ci == _loop_interval(x, y, 500, seed)
        assert undefined == sum(  # resamples where one side is constant
            len({x[i] for i in row}) == 1 or len({y[i] for i in row}) == 1
            for row in np.random.default_rng(seed).integers(0, 6, size=(500, 6))
        )
    # a 3-model table: few distinct resamples, many undefined; still the same contract
    ci3, undefined3 = bootstrap_spearman([1, 2, 3], [1, 3, 2], 200, 1)
    assert ci3 == _loop_interval([1, 2, 3], [1, 3, 2], 200, 1)
    assert 0 < undefined3 < 200


def test_cli_per_subset_and_overall(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    table = tmp_path / "downstream.csv"
    table.write_text(TABLE, encoding="utf-8")
    out = tmp_path / "rho.json"
    args = ["eval", "correlate", str(table), "--bootstrap", "300", "--seed", "5"]
    assert main([*args, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    res = json.loads(out.read_text())
    assert res["subsets"] == ["Art", "Life"] and res["downstream"] == ["bon", "ppo"]
    assert res["bootstrap"]["resamples"] == 300 and res["bootstrap"]["seed"] == 5
    got = {(r["subset"], r["downstream"]): r for r in res["correlations"]}
    assert set(got) == {(s, d) for s in ("Art", "Life", "overall") for d in ("bon", "ppo")}

    rows = [line.split(",") for line in TABLE.splitlines()[1:]]
    by: dict[str, dict[str, tuple[float, str, str]]] = {}
    for model, subset, acc, bon, ppo in rows:
        by.setdefault(subset, {})[model] = (float(acc), bon, ppo)
    overall = {}
    for m in by["Art"]:
        accs = [by[s][m][0] for s in by]
        bons = [float(by[s][m][1]) for s in by]
        ppos = [by[s][m][2] for s in by]
        mean_ppo = None if "" in ppos else sum(map(float, ppos)) / len(ppos)
        overall[m] = (sum(accs) / len(accs), sum(bons) / len(bons), mean_ppo)
    for (subset, column), r in got.items():
        if subset == "overall":
            pts = [(a, b if column == "bon" else p) for a, b, p in overall.values()]
        else:
            k = 1 if column == "bon" else 2
            pts = [(v[0], v[k]) for v in by[subset].values()]
        pts = [(a, float(b)) for a, b in pts if b not in ("", None)]  # an empty cell: no score
        x, y = [a for a, _ in pts], [b for _, b in pts]
        assert r["models"] == len(pts)
        assert r["spearman"] == round(_rho(x, y), 4), (subset, column)
        assert r["ci95"] == _loop_interval(x, y, 300, 5), (subset, column)
    assert got[("Art", "ppo")]["models"] == 4  # rm-c has no ppo score on Art
    assert got[("overall", "ppo")]["models"] == 4  # so it has no overall ppo either
    assert "overall" in printed and f"results: {out}" in printed
    art_bon = got[("Art", "bon")]
    assert f"{art_bon['spearman']:+.3f}" in printed


def test_cli_against_scipy_on_a_flat_table(tmp_path: Path) -> None:
    stats = pytest.importorskip("scipy.stats")
    table = tmp_path / "flat.csv"
    models = [("m1", 0.61, 3.0), ("m2", 0.70, 4.5), ("m3", 0.55, 3.0), ("m4", 0.66, 5.0)]
    table.write_text("model,accuracy,bon\n" + "".join(f"{m},{a},{b}\n" for m, a, b in models))
    assert main(["eval", "correlate", str(table), "--bootstrap", "50"]) == 0
    res = json.loads((tmp_path / "flat-correlate.json").read_text())  # beside the table
    (r,) = res["correlations"]
    assert r["subset"] == "all" and res["subsets"] == []
    expected = stats.spearmanr([a for _, a, _ in models], [b for *_, b in models]).statistic
    assert r["spearman"] == round(float(expected), 4)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("model,subset,bon\na,X,1\n", "line 1, field 'accuracy': has no 'accuracy' column"),
        ("model,accuracy\na,0.5\n", "line 1: has no downstream score column"),
        ("model,accuracy,bon\na,0.5,1\nb,0.6,high\nc,0.7,3\n",
         "line 3, field 'bon': 'high' is not a finite number"),
        ("model,accuracy,bon\na,0.5,1\nb,,2\nc,0.7,3\n", "line 3, field 'accuracy': is empty"),
        ("model,accuracy,bon\na,0.5,1\nb,nan,2\nc,0.7,3\n",
         "line 3, field 'accuracy': 'nan' is not a finite number"),
        ("model,accuracy,bon\na,0.5,1\nb,0.6,2\na,0.7,3\n",
         "line 4, field 'model': model 'a' is already on line 2"),
        ("model,subset,accuracy,bon\na,X,0.5,1\nb,X,0.6,2\nc,X,0.7,3\nb,Y,0.1,1\nb,Y,0.2,2\n",
         "line 6, field 'model': model 'b' in subset 'Y' is already on line 5"),
        ("model,accuracy,bon\na,0.5,1\nb,0.6,2\n",
         "line 2, field 'model': the table has 2 model(s) (from this line); a rank correlation "
         "needs at least 3"),
        ("model,subset,accuracy,bon\na,X,0.5,1\nb,X,0.6,2\nc,X,0.7,3\nd,Y,0.1,1\n",
         "line 5, field 'subset': subset 'Y' has 1 model(s)"),
        ("model,accuracy,bon\na,0.5,1\nb,0.6\nc,0.7,3\n",
         "line 3: has 2 cells where the header has 3 columns"),
        ("model,subset,accuracy,bon\na,overall,0.5,1\n",
         "line 2, field 'subset': 'overall' is the mean over the subsets"),
        ("model,accuracy,bon,bon\na,0.5,1,1\n", "line 1, field 'bon': is a repeated column name"),
        ("", "line 1: is empty"),
    ],
)  # fmt: skip
def test_bad_tables_are_one_line_naming_file_line_and_column(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, expected: str
) -> None:
    table = tmp_path / "t.csv"
    table.write_text(text, encoding="utf-8")
    assert main(["eval", "correlate", str(table)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {table}, ") and "\n" not in err and "Traceback" not in err
    assert expected in err
    assert not (tmp_path / "t-correlate.json").exists()


def test_correlate_word_and_a_split_named_correlate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    table = tmp_path / "t.csv"
    table.write_text(TABLE, encoding="utf-8")
    # options of the split evaluation are refused with correlate
    assert main(["eval", "correlate", str(table), "--scorer", "rm:/m"]) == 1
    assert "error: --scorer: is not an option of prb eval correlate" in capsys.readouterr().err
    assert main(["eval", "correlate", str(table), "--set", "profile.top_k=2"]) == 1
    assert "error: --set: is not an option" in capsys.readouterr().err
    # a second path follows only the word correlate
    assert main(["eval", str(table), str(table), "--scorer", "rm:/m"]) == 1
    assert "a second path only follows the word correlate" in capsys.readouterr().err
    # the word alone, with no such folder: what to write
    monkeypatch.chdir(tmp_path)
    assert main(["eval", "correlate"]) == 1
    assert "prb eval correlate TABLE.csv" in capsys.readouterr().err
    # counts out of range are argparse's usage line (exit 2), before anything is read
    for flag, value, said in (
        ("--bootstrap", "0", "argument --bootstrap: must be from 1 to 100,000, got 0"),
        ("--bootstrap", "100000000000", "must be from 1 to 100,000, got 100,000,000,000"),
        ("--seed", "-1", "argument --seed: must be 0 or more, got -1"),
    ):
        with pytest.raises(SystemExit) as stop:
            main(["eval", "correlate", "t.csv", flag, value])
        assert stop.value.code == 2
        err = capsys.readouterr().err
        assert said in err and "Traceback" not in err
    # the table itself as --out: refused, the table left as it was
    assert main(["eval", "correlate", "t.csv", "--out", "t.csv"]) == 1
    assert "t.csv, field '--out': is the table being read" in capsys.readouterr().err
    assert table.read_text(encoding="utf-8") == TABLE
    # a split folder literally named correlate, without a table after it, is a split
    (tmp_path / "correlate").mkdir()
    seen = []

    def fake_evaluate(path: Path, *a: object, **kw: object) -> list:
        seen.append(Path(path))
        raise SystemExit(0)

    monkeypatch.setattr("pipeline.eval.evaluate.evaluate", fake_evaluate)
    with pytest.raises(SystemExit):
        main(["eval", "correlate", "--scorer", "judge:m", "--no-progress"])
    assert seen == [Path("correlate")]


# ---- the rank metrics the reference reports beside rho, each from its definition --------


def _orders(values: list[float]) -> list[tuple[int, ...]]:
    """Every ranking of the indices by value, highest first: one per order of each tie."""
    import itertools

    n = len(values)
    return [
        perm
        for perm in itertools.permutations(range(n))
        if all(values[perm[i]] >= values[perm[i + 1]] for i in range(n - 1))
    ]


def _rbo_ext(s: tuple[int, ...], t: tuple[int, ...], p: float) -> float:
    """Webber et al.'s extrapolated RBO of two complete rankings (their eq. 32)."""
    n = len(s)
    agree = [len(set(s[:d]) & set(t[:d])) / d for d in range(1, n + 1)]
    return agree[-1] * p**n + (1 - p) * sum(agree[d - 1] * p ** (d - 1) for d in range(1, n + 1))


def _rbo(x: list[float], y: list[float], p: float) -> float:
    """The mean RBO over every way of breaking the ties of each ranking."""
    return statistics.fmean(_rbo_ext(s, t, p) for s in _orders(x) for t in _orders(y))


def _ndcg(x: list[float], y: list[float]) -> float:
    """DCG of the benchmark's order (averaged over the orders of its ties) over the ideal
    DCG; a model's gain is its downstream average rank minus 1."""
    gains = [r - 1 for r in _ranks(y)]
    dcg = statistics.fmean(
        sum(gains[i] / math.log2(pos + 2) for pos, i in enumerate(order)) for order in _orders(x)
    )
    ideal = sum(g / math.log2(pos + 2) for pos, g in enumerate(sorted(gains, reverse=True)))
    return dcg / ideal


def test_weighted_tau_ndcg_and_rbo_equal_their_definitions() -> None:
    from pipeline.eval.rankmetrics import value

    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(7)
    checked = {"kendall_tau_weighted": 0, "ndcg": 0, "rbo": 0}
    for _ in range(150):
        n = int(rng.integers(3, 7))
        # few distinct values: ties on both sides, and joint ties, are common
        x = [float(v) for v in rng.integers(0, 3, n)]
        y = (
            [float(v) for v in rng.integers(0, 4, n)]
            if rng.random() < 0.7
            else list(rng.normal(size=n))
        )
        if len(set(x)) == 1 or len(set(y)) == 1:  # no ranking on one side: undefined
            assert all(value(m, x, y) is None for m in checked), (x, y)
            continue
        want = stats.weightedtau(x, y).statistic
        assert value("kendall_tau_weighted", x, y) == pytest.approx(want, abs=1e-9)
        assert value("ndcg", x, y) == pytest.approx(_ndcg(x, y), abs=1e-9)
        for p in (0.5, 0.9):
            assert value("rbo", x, y, p) == pytest.approx(_rbo(x, y, p), abs=1e-9)
        for m in checked:
            checked[m] += 1
    assert min(checked.values()) > 60, checked
    # identical rankings: every metric is 1; reversed: rho and tau are -1
    up = [1.0, 2.0, 3.0, 4.0]
    assert [value(m, up, up) for m in ("kendall_tau_weighted", "ndcg", "rbo")] == pytest.approx(
        [1.0, 1.0, 1.0]
    )
    assert value("kendall_tau_weighted", up, up[::-1]) == pytest.approx(-1.0)
    assert value("ndcg", up, [5.0] * 4) is None  # no downstream gain to order


def test_cli_reports_every_metric_and_a_baseline_difference(tmp_path: Path) -> None:
    from pipeline.eval.rankmetrics import value

    # hand-written test data: a benchmark column, a baseline benchmark and one score
    models = [("m1", 0.61, 0.70, 3.0), ("m2", 0.70, 0.52, 4.5), ("m3", 0.55, 0.66, 3.1),
              ("m4", 0.66, 0.61, 5.0), ("m5", 0.58, 0.58, 2.2)]  # fmt: skip
    table = tmp_path / "t.csv"
    table.write_text(
        "model,accuracy,rewardbench,bon\n" + "".join(f"{m},{a},{r},{b}\n" for m, a, r, b in models)
    )
    out = tmp_path / "t.json"
    args = ["eval", "correlate", str(table), "--baseline", "rewardbench", "--rbo-p", "0.8"]
    assert main([*args, "--bootstrap", "200", "--seed", "3", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["downstream"] == ["bon"] and res["baseline"] == "rewardbench"
    assert res["rbo_persistence"] == 0.8
    (r,) = res["correlations"]
    acc = [a for _, a, _, _ in models]
    base = [b for _, _, b, _ in models]
    bon = [s for *_, s in models]
    idx = np.random.default_rng(3).integers(0, 5, size=(200, 5))
    for metric in ("spearman", "kendall_tau_weighted", "ndcg", "rbo"):
        ours, theirs = value(metric, acc, bon, 0.8), value(metric, base, bon, 0.8)
        assert r["metrics"][metric]["value"] == pytest.approx(ours, abs=1e-9)
        got = r["baseline"]["metrics"][metric]
        assert got["value"] == pytest.approx(theirs, abs=1e-9)
        diff = r["baseline"]["difference"][metric]
        assert diff["value"] == pytest.approx(ours - theirs, abs=1e-9)
        # the paired bootstrap by an explicit loop over the documented draw
        diffs = []
        for row in idx:
            a = value(metric, [acc[i] for i in row], [bon[i] for i in row], 0.8)
            b = value(metric, [base[i] for i in row], [bon[i] for i in row], 0.8)
            if a is not None and b is not None:
                diffs.append(a - b)
        lo, hi = np.quantile(diffs, [0.025, 0.975])
        assert diff["ci95"] == [round(float(lo), 4), round(float(hi), 4)], metric
        assert diff["undefined_resamples"] == 200 - len(diffs)
    assert r["spearman"] == round(value("spearman", acc, bon), 4)  # the figure as before


def test_bad_correlate_options_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    table = tmp_path / "t.csv"
    table.write_text(TABLE, encoding="utf-8")
    for extra, said in (
        (["--rbo-p", "1"], "error: --rbo-p: must be between 0 and 1 (exclusive), got 1.0"),
        (["--rbo-p", "nan"], "error: --rbo-p: must be between 0 and 1"),
        (["--baseline", "rewardbench"], "field 'rewardbench': has no 'rewardbench' column"),
        (["--baseline", "accuracy"], "names another benchmark's accuracy column"),
    ):
        assert main(["eval", "correlate", str(table), *extra]) == 1
        err = capsys.readouterr().err.strip()
        assert said in err and "\n" not in err, err
    assert not (tmp_path / "t-correlate.json").exists()
    assert main(["eval", str(table), "--scorer", "judge:m", "--rbo-p", "0.5"]) == 1
    assert "--rbo-p: is an option of prb eval correlate" in capsys.readouterr().err
