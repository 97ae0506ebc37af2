"""input.format: hub, through the real datasets.load_dataset code path on a local dataset
repository laid out like alireza7/LaMP-QA (tests/lamp_repo.py): no network."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from lamp_repo import CONFIGS, build_lamp_repo, sample_rows

from pipeline.config import InputSection
from pipeline.core.errors import InputError
from pipeline.inputs.ingest import expected_examples, load_examples

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "examples" / "sample_lamp.jsonl"


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    return build_lamp_repo(tmp_path_factory.mktemp("lamp-qa") / "LaMP-QA")


def _hub(repo: Path, cache: Path, **over) -> InputSection:
    kw = {
        "format": "hub",
        "dataset": str(repo),
        "configs": list(CONFIGS),
        "split": "test",
        "cache_dir": cache,
    }
    return InputSection(**(kw | over))


def test_hub_reads_each_config_as_the_jsonl_it_came_from(repo, tmp_path):
    rows = load_examples(_hub(repo, tmp_path / "cache"))
    # the repository holds the sample's rows without their category column: read from the
    # Hub layout they are the same examples, same ids, with the config as the category
    from_jsonl = load_examples(InputSection(format="lamp", path=SAMPLE))
    by_id = {r["example_id"]: r for r in from_jsonl}
    assert len(rows) == 12 and {r["example_id"] for r in rows} == set(by_id)
    for r in rows:
        assert r == by_id[r["example_id"]]
    # in config order, each config's rows in file order
    assert [r["category"] for r in rows] == [c for c in CONFIGS for _ in range(4)]
    assert expected_examples(_hub(repo, tmp_path / "cache")) == 12


def test_one_config_a_split_and_a_limit(repo, tmp_path):
    cache = tmp_path / "cache"
    one = load_examples(_hub(repo, cache, configs=["Society_and_Culture"]))
    assert Counter(r["category"] for r in one) == {"Society_and_Culture": 4}
    val = load_examples(_hub(repo, cache, split="validation"))
    assert len(val) == 6 and all(r["question"].startswith("(validation) ") for r in val)
    # the limit runs across configs: the first 5 are Art's 4 and Lifestyle's first
    limited = load_examples(_hub(repo, cache, limit=5))
    assert [r["category"] for r in limited] == [CONFIGS[0]] * 4 + [CONFIGS[1]]
    assert expected_examples(_hub(repo, cache, limit=5)) == 5


def test_rows_with_a_category_keep_it_and_columns_map(tmp_path):
    rows = [dict(r, query=r["question"]) for r in sample_rows()[:2]]
    repo = build_lamp_repo(
        tmp_path / "repo",
        rows_by_config={c: rows for c in CONFIGS},
        columns=("id", "query", "profile", "category"),
    )
    got = load_examples(
        _hub(
            repo,
            tmp_path / "cache",
            configs=["Society_and_Culture"],
            columns={"question": "query"},
        )
    )
    assert [r["question"] for r in got] == [r["question"] for r in rows]
    # the rows carry a category: the config's name does not replace it
    assert [r["category"] for r in got] == [r["category"] for r in rows]
    assert got[0]["rubric_aspects"] is None and got[0]["narrative"] is None


def test_errors_name_the_config_the_row_and_the_field(tmp_path):
    good = [r for r in sample_rows() if r["category"] == CONFIGS[1]]
    bad = [good[0], dict(good[1], question="   ")]
    repo = build_lamp_repo(tmp_path / "repo", rows_by_config={CONFIGS[1]: bad})
    with pytest.raises(InputError) as info:
        load_examples(_hub(repo, tmp_path / "cache"))
    assert str(info.value) == (
        f"{repo} [{CONFIGS[1]}/test], line 2, field 'question': row 2: must be a non-empty "
        "string, got only whitespace"
    )


@pytest.mark.parametrize(
    "over, field, words",
    [
        ({"configs": ["Art"]}, "configs", "config 'Art' not found"),
        ({"split": "tset"}, "split", "Unknown split"),
        ({"columns": {"question": "query"}}, "query", "column 'query' (mapped from field"),
    ],
)
def test_a_wrong_config_split_or_column_is_one_line(repo, tmp_path, over, field, words):
    with pytest.raises(InputError) as info:
        load_examples(_hub(repo, tmp_path / "cache", **over))
    assert info.value.field == field and words in str(info.value)
    assert "\n" not in str(info.value)


def test_input_dataset_is_required(tmp_path):
    with pytest.raises(InputError, match=r"must be set for input\.format 'hub'") as exc:
        load_examples(InputSection(format="hub", split="test"))
    assert exc.value.field == "input.dataset"


def test_offline_and_not_cached_says_what_to_download(tmp_path):
    """A Hub name that is not in the cache, offline: one line naming the download."""
    code = (
        "from pipeline.config import InputSection\n"
        "from pipeline.core.errors import InputError\n"
        "from pipeline.inputs.ingest import load_examples\n"
        "try:\n"
        "    load_examples(InputSection(format='hub', dataset='alireza7/LaMP-QA',\n"
        "        configs=['Art_and_Entertainment', 'Society_and_Culture'], split='test'))\n"
        "except InputError as exc:\n"
        "    print(exc)\n"
    )
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        HF_HOME=str(tmp_path / "hf"),
        HF_DATASETS_CACHE=str(tmp_path / "hf" / "datasets"),
        PYTHONPATH=str(ROOT),
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    line = out.stdout.strip()
    assert "\n" not in line
    assert line.startswith(
        "alireza7/LaMP-QA [Art_and_Entertainment/test]: the dataset is not in the local datasets "
        f"cache ({tmp_path / 'hf' / 'datasets'}) and offline mode is on"
    )
    assert (
        "datasets.load_dataset('alireza7/LaMP-QA', c, split='test') for c in "
        "('Art_and_Entertainment', 'Society_and_Culture',)" in line
    )


def test_an_id_in_two_configs_names_both(tmp_path):
    rows = sample_rows()
    art = [r for r in rows if r["category"] == CONFIGS[0]]
    repeat = [dict(r, id=art[1]["id"]) if i == 2 else r for i, r in enumerate(
        [r for r in rows if r["category"] == CONFIGS[2]])]  # fmt: skip
    repo = build_lamp_repo(tmp_path / "repo", rows_by_config={CONFIGS[2]: repeat})
    with pytest.raises(InputError) as info:
        load_examples(_hub(repo, tmp_path / "cache"))
    assert str(info.value) == (
        f"{repo} [{CONFIGS[2]}/test], line 3, field 'id': row 3: duplicate id "
        f"{art[1]['id']!r} (first seen in {repo} [{CONFIGS[0]}/test], row 2)"
    )


def test_a_named_pipe_in_a_local_repository_is_refused_at_load(tmp_path):
    from conftest import write_config

    from pipeline.config import load_config
    from pipeline.core.errors import ConfigError

    repo = build_lamp_repo(tmp_path / "repo")
    os.mkfifo(repo / CONFIGS[0] / "extra.parquet")
    cfg = write_config(
        tmp_path, input={"format": "hub", "dataset": str(repo), "configs": [CONFIGS[0]]}
    )
    with pytest.raises(ConfigError) as info:
        load_config(cfg)  # returns at once: nothing opened the pipe
    assert info.value.field == "input.dataset"
    assert "extra.parquet in the dataset folder is a named pipe, not a file" in str(info.value)
    # a Hub name is not a path: nothing is checked until it is loaded
    ok = write_config(tmp_path, input={"format": "hub", "dataset": "alireza7/LaMP-QA"})
    assert load_config(ok).input.dataset == "alireza7/LaMP-QA"


def test_two_local_folders_of_one_name_never_share_rows(tmp_path):
    """datasets keys a local folder's cache entry by its name and layout: a second folder
    called LaMP-QA (or the same folder with new rows) read the first one's rows, silently.
    Each folder now reads its own rows, before and after a change, through one cache."""
    rows = sample_rows()

    def tagged(tag: str, n: int) -> dict[str, list[dict]]:
        return {c: [dict(r, id=f"{tag}-{c[:3]}-{r['id']}", question=f"({tag}) {r['question']}")
                    for r in rows[:n]] for c in CONFIGS}  # fmt: skip

    a = build_lamp_repo(tmp_path / "a" / "LaMP-QA")
    b = build_lamp_repo(tmp_path / "b" / "LaMP-QA", tagged("b", 2))
    cache = tmp_path / "cache"  # one datasets cache for all three reads
    got_a = load_examples(_hub(a, cache))
    got_b = load_examples(_hub(b, cache))
    assert len(got_a) == 12 and not any(r["question"].startswith("(b)") for r in got_a)
    assert len(got_b) == 6 and all(r["question"].startswith("(b) ") for r in got_b)
    # the first folder's rows change: the next read has them
    build_lamp_repo(a, tagged("a2", 1))
    again = load_examples(_hub(a, cache))
    assert len(again) == 3 and all(r["question"].startswith("(a2) ") for r in again)


def test_an_unreachable_hub_is_one_line_at_once(tmp_path, monkeypatch):
    """With no network, asking the Hub retried for about 25 s (11 lines of huggingface_hub's
    backoff) before the one line that says what to do. When the Hub's host takes no
    connection, the load runs in offline mode: the cached copy, or that line, at once."""
    import time

    import datasets
    from huggingface_hub import constants

    import pipeline.inputs.tables as tables

    monkeypatch.setattr(tables, "_hub_reachable", lambda: False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)  # as if online
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    section = InputSection(format="hub", dataset="nobody/no-such-dataset-prb", split="test",
                           cache_dir=tmp_path / "cache")  # fmt: skip
    t0 = time.monotonic()
    with pytest.raises(InputError) as info:
        load_examples(section)
    assert time.monotonic() - t0 < 10  # no retries (a busy machine still answers in 10 s)
    msg = str(info.value)
    assert "the Hub cannot be reached" in msg and "\n" not in msg
    assert not datasets.config.HF_HUB_OFFLINE and not constants.HF_HUB_OFFLINE  # restored
