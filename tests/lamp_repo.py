"""A local dataset repository laid out like alireza7/LaMP-QA on the Hub (tests only): one
config per category (Art_and_Entertainment, Lifestyle_and_Personal_Development,
Society_and_Culture), each with train, validation and test parquet files, declared in
README.md's YAML ``configs:`` block, so ``datasets.load_dataset(folder, CONFIG,
split="test")`` runs the real Hub loading code with no network.

The test split holds the hand-written sample's examples of that category
(examples/sample_lamp.jsonl, 4 each) in LaMP-QA's columns: ``id``, ``question``,
``narrative``, ``rubric_aspects`` and ``profile``, and no ``category`` (the config is the
category)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "examples" / "sample_lamp.jsonl"
CONFIGS = ("Art_and_Entertainment", "Lifestyle_and_Personal_Development", "Society_and_Culture")
SPLITS = ("train", "validation", "test")
COLUMNS = ("id", "question", "narrative", "rubric_aspects", "profile")


def sample_rows() -> list[dict[str, Any]]:
    return [json.loads(line) for line in SAMPLE.read_text(encoding="utf-8").splitlines() if line]


def _other_split(rows: list[dict], split: str) -> list[dict]:
    """Rows for train / validation: other ids and questions, so a wrong split shows."""
    return [
        {**r, "id": f"{split}-{r['id']}", "question": f"({split}) {r['question']}"} for r in rows
    ]


def build_lamp_repo(
    folder: Path,
    rows_by_config: dict[str, list[dict]] | None = None,
    columns: tuple[str, ...] = COLUMNS,
) -> Path:
    """Write the repository; ``rows_by_config`` replaces a config's test rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    sample = sample_rows()
    card = ["---", "configs:"]
    for config in CONFIGS:
        test = [r for r in sample if r["category"] == config]
        if rows_by_config and config in rows_by_config:
            test = rows_by_config[config]
        card += [f"- config_name: {config}", "  data_files:"]
        for split in SPLITS:
            rows = test if split == "test" else _other_split(test[:2], split)
            table = pa.Table.from_pylist([{k: r.get(k) for k in columns} for r in rows])
            rel = f"{config}/{split}-00000-of-00001.parquet"
            (folder / config).mkdir(exist_ok=True)
            pq.write_table(table, folder / rel)
            card += [f"  - split: {split}", f"    path: {rel}"]
    card += ["---", "", "A local stand-in of alireza7/LaMP-QA's layout (tests only).", ""]
    (folder / "README.md").write_text("\n".join(card), encoding="utf-8")
    return folder


def cache_as_hub(cache_dir: Path, work: Path, name: str = "alireza7/LaMP-QA") -> Path:
    """Fill a datasets cache as loading ``name`` from the Hub would, for every config:
    prepared from a local repository named like the Hub one, then moved under the Hub
    name's cache folder, where offline ``load_dataset(name, CONFIG)`` finds it."""
    import shutil

    import datasets

    owner, repo_name = name.split("/")
    repo = build_lamp_repo(work / repo_name)
    for config in CONFIGS:
        datasets.load_dataset(str(repo), config, split="test", cache_dir=str(cache_dir))
    local = cache_dir / datasets.naming.camelcase_to_snakecase(repo_name)
    shutil.move(local, cache_dir / f"{owner}___{local.name}")
    return cache_dir
