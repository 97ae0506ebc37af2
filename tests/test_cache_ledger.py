"""The request cache's ledger: totals kept as answers are stored, equal at every step to the
scan of every stored row that defines them (pipeline/run/cache.py, _LEDGER_SCAN); a cache
whose totals are behind (written by an older version) is recomputed, or scanned when it is
opened read-only; a repaired cache has the totals of what was saved."""

from __future__ import annotations

import random
import sqlite3

from pipeline.run.cache import _LEDGER_COLUMNS, _LEDGER_SCAN, RequestCache, repair_cache
from pipeline.types.chat import ChatRequest, ChatResult, Choice


def _scan(path) -> list[dict]:
    """The definition: every stored row read again."""
    db = sqlite3.connect(path)
    try:
        rows = db.execute(_LEDGER_SCAN.format(where="")).fetchall()
    finally:
        db.close()
    return [dict(zip(_LEDGER_COLUMNS, r, strict=True)) for r in rows]


def _items(rng: random.Random, start: int, count: int) -> list[tuple]:
    """Answers of two stages and three backends ("" included), some re-asked (an assistant
    turn, or a re-ask count), some with two choices, some keys repeated."""
    out = []
    for i in range(start, start + count):
        k = rng.randrange(start, start + count)  # repeats: the first stored row counts
        messages: tuple = (("user", f"question {k}"),)
        if k % 7 == 0:
            messages += (("assistant", "not JSON"), ("user", "answer in JSON"))
        req = ChatRequest(
            messages=messages,
            model="m",
            n=1 + k % 2,
            served_by=("", "b1", "b2")[k % 3],
        )
        res = ChatResult(
            choices=[Choice(f"answer {k}.{j}", "stop") for j in range(req.n)],
            prompt_tokens=10 + k,
            completion_tokens=3 * k,
        )
        stage = ("responses", "judge")[i % 2]
        out.append((req, res, stage, 1 if k % 11 == 0 else 0))
    return out


def _same(kept: list[dict], scanned: list[dict]) -> None:
    drop_times = [{k: v for k, v in r.items() if k not in ("first", "last")} for r in kept]
    assert drop_times == [
        {k: v for k, v in r.items() if k not in ("first", "last")} for r in scanned
    ]
    for a, b in zip(kept, scanned, strict=True):
        assert (a["first"], a["last"]) == (b["first"], b["last"])


def test_kept_totals_equal_the_scan_after_every_commit(tmp_path):
    path = tmp_path / "cache.sqlite"
    rng = random.Random(0)
    with RequestCache(path) as cache:
        assert cache.ledger() == []
        for batch in range(6):
            cache.put_many(_items(rng, batch * 20, 30))  # overlaps the previous batch
            scanned = _scan(path)
            assert sum(r["answers"] for r in scanned) == cache.count()
            assert any(r["reasks"] for r in scanned) and any(r["served_by"] == "" for r in scanned)
            _same(cache.ledger(), scanned)
            _same(cache.ledger("judge"), [r for r in scanned if r["stage"] == "judge"])
        # nothing new: the same totals
        cache.put_many(_items(random.Random(0), 0, 30))
        _same(cache.ledger(), _scan(path))


def _older_writer(path, start: int) -> None:
    """Rows stored the way a version without the kept totals stored them."""
    db = sqlite3.connect(path, isolation_level=None)
    for req, _res, stage, _ in _items(random.Random(start), start, 10):
        db.execute(
            "INSERT OR IGNORE INTO responses(key, stage, request, response, created) "
            "VALUES (?,?,?,?,?)",
            (req.key, stage, '{"served_by":"old"}', '{"choices":[1],"prompt_tokens":5}', 1.0),
        )
    db.close()


def test_totals_left_behind_are_recomputed_or_scanned(tmp_path):
    path = tmp_path / "cache.sqlite"
    with RequestCache(path) as cache:
        cache.put_many(_items(random.Random(1), 0, 20))
    _older_writer(path, 100)  # the kept totals no longer count every row
    with RequestCache(path, readonly=True) as ro:
        _same(ro.ledger(), _scan(path))  # read-only: the scan is the answer
    with RequestCache(path) as cache:
        _same(cache.ledger(), _scan(path))  # recomputed, then kept
        cache.put_many(_items(random.Random(2), 200, 20))
        _same(cache.ledger(), _scan(path))
    # a cache from before the totals were kept at all
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("DROP TABLE ledger")
    db.execute("DROP TABLE ledger_state")
    db.close()
    with RequestCache(path, readonly=True) as ro:
        _same(ro.ledger(), _scan(path))
    with RequestCache(path) as cache:
        cache.put_many(_items(random.Random(3), 300, 20))  # behind: not added to
        _same(cache.ledger(), _scan(path))
        assert any(r["served_by"] == "old" for r in cache.ledger())


def test_a_repaired_cache_has_the_totals_of_what_was_saved(tmp_path):
    path = tmp_path / "cache.sqlite"
    with RequestCache(path) as cache:
        cache.put_many(_items(random.Random(4), 0, 50))
        before = cache.ledger()
    res = repair_cache(path)
    assert res["saved"]["responses"] == sum(r["answers"] for r in before)
    with RequestCache(path, readonly=True) as ro:
        assert [
            {k: v for k, v in r.items() if k not in ("first", "last")} for r in ro.ledger()
        ] == [{k: v for k, v in r.items() if k not in ("first", "last")} for r in before]
        _same(ro.ledger(), _scan(path))
