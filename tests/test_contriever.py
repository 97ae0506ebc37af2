"""profile.ranker: contriever, on a tiny BERT built here: its ranking is the one a hand
computation of mean pooling over the attention mask and the dot product gives."""

from __future__ import annotations

import importlib.util
import itertools
import os

import pytest

from pipeline.core.errors import BackendError

_missing = [m for m in ("transformers", "torch") if importlib.util.find_spec(m) is None]
if _missing and not os.environ.get("CI"):
    pytest.skip("the contriever extra is not installed", allow_module_level=True)

QUESTION = "how do i stop my watercolor paint getting mud colors"
POSTS = [
    {"id": "a", "text": "i bake sourdough bread every morning"},
    {"id": "b", "text": "watercolor"},
    {"id": "c", "text": "my bike to work is scary and the train is better"},
    {"id": "d", "text": "paper to stop pigment mud"},
    {"id": "e", "text": "draw hands"},
    {"id": "f", "text": "how to paint colors of the morning train every day and get better"},
]


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    from tests.tiny_encoder import build_tiny_encoder

    return str(build_tiny_encoder(tmp_path_factory.mktemp("tiny-bert")))


def _by_hand(model_dir: str, texts: list[str]) -> list[list[float]]:
    """Each text alone (no padding at all): hidden states averaged over its tokens."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir).eval()
    out = []
    with torch.inference_mode():
        for t in texts:
            ids = tok(t, return_tensors="pt")
            hidden = model(**ids).last_hidden_state[0].tolist()  # tokens x hidden
            width = len(hidden[0])
            out.append([sum(row[j] for row in hidden) / len(hidden) for j in range(width)])
    return out


def test_ranking_equals_mean_pooling_and_dot_product_by_hand(encoder):
    from pipeline.types.profile import contriever_scores, rank_profile

    q, *docs = _by_hand(encoder, [QUESTION] + [p["text"] for p in POSTS])
    expected = [sum(a * b for a, b in zip(d, q, strict=True)) for d in docs]
    want = sorted(range(len(POSTS)), key=lambda i: -expected[i])
    gaps = sorted(expected)
    # the test means something only if no two scores are near a tie
    assert min(b - a for a, b in itertools.pairwise(gaps)) > 1e-4

    # batch size 4: the posts are padded to the longest of their batch, and two batches
    got = rank_profile(QUESTION, POSTS, k=6, ranker="contriever", model=encoder, batch_size=4)
    assert got == want
    scores = contriever_scores(QUESTION, POSTS, encoder, batch_size=4)
    assert [round(float(s), 4) for s in scores] == [round(s, 4) for s in expected]
    # top k is the head of the same order
    assert rank_profile(QUESTION, POSTS, k=2, ranker="contriever", model=encoder) == want[:2]


def test_ingest_records_the_contriever_view(encoder, tmp_path):
    import json
    from types import SimpleNamespace

    from pipeline.config import load_config
    from pipeline.stages.ingest import IngestStage

    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"id": "1", "question": QUESTION, "profile": POSTS}) + "\n")
    cfg_path = tmp_path / "c.yaml"
    cfg_path.write_text(
        f"input: {{path: {src}}}\nprofile: {{ranker: contriever, top_k: 3, "
        f"contriever_model: {encoder}}}\n"
    )
    cfg = load_config(cfg_path)
    example = {"question": QUESTION, "profile": POSTS}
    view = IngestStage.profile_view(SimpleNamespace(config=cfg), example)  # type: ignore[arg-type]
    from pipeline.types.profile import rank_contriever

    assert view == {
        "ranker": "contriever",
        "top_k": 3,
        "order": rank_contriever(QUESTION, POSTS, encoder)[:3],
    }


def test_a_model_that_is_not_there_is_one_line(tmp_path, monkeypatch):
    from pipeline.types.profile import rank_profile

    missing = str(tmp_path / "no-such-model")
    with pytest.raises(BackendError) as info:
        rank_profile(QUESTION, POSTS, k=2, ranker="contriever", model=missing)
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith(f"profile.contriever_model {missing!r} cannot be loaded")
    assert "AutoModel.from_pretrained" in msg and "profile.contriever_model" in msg


def test_a_model_cut_short_is_one_line_naming_the_file(encoder, tmp_path):
    """A contriever folder whose model.safetensors was cut short was a traceback from the
    loader; it is read through the same check as `prb eval`'s models."""
    import shutil

    from pipeline.core.errors import PipelineError
    from pipeline.types.profile import rank_profile

    cut = tmp_path / "cut-encoder"
    shutil.copytree(encoder, cut)
    weights = cut / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    with pytest.raises(PipelineError) as info:
        rank_profile(QUESTION, POSTS, k=2, ranker="contriever", model=str(cut))
    msg = str(info.value)
    assert "\n" not in msg and "model.safetensors" in msg and "download the model again" in msg


def test_a_hub_model_with_no_network_is_one_line_at_once(tmp_path):
    """`prb plan` of a contriever config with no network printed 22 lines of Hub retry
    warnings (2 x 5 retries for the model's config) and took 223 s before its one error
    line; only HF_HUB_OFFLINE=1 made it quick (issue 52). Played here: HF_HUB_OFFLINE
    unset, the Hub's endpoint a closed port on loopback, an empty Hugging Face cache. The
    model is neither cached nor reachable: one line, naming the cache and what to do,
    with no retry (the bound below is far under the 25 s one file's retries cost)."""
    import socket
    import subprocess
    import sys
    import time
    from pathlib import Path

    from conftest import write_config

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = write_config(
        tmp_path,
        None,
        input={"limit": 2},
        profile={"ranker": "contriever", "contriever_model": "facebook/contriever-msmarco"},
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE"))}
    env.update(
        HF_ENDPOINT=f"http://127.0.0.1:{port}",
        HF_HOME=str(tmp_path / "hf-home"),
        PYTHONPATH=str(Path(__file__).resolve().parent.parent),
    )
    for proxy in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        env.pop(proxy, None)
    start = time.monotonic()
    res = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "plan", str(cfg)],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    took = time.monotonic() - start
    err = res.stderr.strip().splitlines()
    assert res.returncode == 1, res.stdout + res.stderr
    assert len(err) == 1 and "Traceback" not in res.stderr, res.stderr
    assert "profile.contriever_model 'facebook/contriever-msmarco' cannot be loaded" in err[0]
    assert "not in the Hugging Face cache" in err[0] and "the Hub cannot be reached" in err[0]
    assert str(tmp_path / "hf-home") in err[0]
    assert took < 120, took  # minutes of retries before; seconds of start-up now
