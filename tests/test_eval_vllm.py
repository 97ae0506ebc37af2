"""The vLLM pooling engine of prb eval against a fake ``vllm`` module (no GPU, no vLLM).

The fake follows vLLM's offline pooling API (``LLM(model, runner="pooling", ...)``,
``LLM.classify(prompts, pooling_params=PoolingParams(use_activation=False))`` returning
outputs whose ``.outputs.probs`` hold the head's values) and computes them by running the
saved model on each prompt's token ids alone, unpadded, as an engine without batching
would. So the test checks our plumbing (same token ids, raw logits, the same reduction)
and that batched, padded transformers scoring agrees with unbatched scoring.
"""

from __future__ import annotations

import json
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from eval_split import all_texts, write_split  # noqa: E402

from pipeline.cli import main  # noqa: E402
from pipeline.eval.tiny import build_tiny_reward_model  # noqa: E402


class FakePoolingParams:
    def __init__(self, use_activation: bool | None = None) -> None:
        self.use_activation = use_activation


@dataclass
class FakeClassificationOutput:
    probs: list[float]


@dataclass
class FakeRequestOutput:
    prompt_token_ids: list[int]
    outputs: FakeClassificationOutput


class FakeLLM:
    instances: list[FakeLLM] = []

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
        self.calls: list[dict[str, Any]] = []
        self.model = transformers.AutoModelForSequenceClassification.from_pretrained(
            kwargs["model"], local_files_only=True
        ).eval()
        type(self).instances.append(self)

    def classify(
        self, prompts: list[dict[str, Any]], *, pooling_params: Any = None, use_tqdm: Any = True
    ) -> list[FakeRequestOutput]:
        self.calls.append({"prompts": prompts, "params": pooling_params, "use_tqdm": use_tqdm})
        outs = []
        for p in prompts:
            ids = p["prompt_token_ids"]
            with torch.no_grad():
                logits = self.model(input_ids=torch.tensor([ids])).logits[0]
            if pooling_params is None or pooling_params.use_activation is not False:
                logits = torch.sigmoid(logits) if len(logits) == 1 else torch.softmax(logits, -1)
            outs.append(FakeRequestOutput(ids, FakeClassificationOutput(logits.tolist())))
        return outs


@pytest.fixture
def fake_vllm(monkeypatch: pytest.MonkeyPatch) -> type[FakeLLM]:
    llm_cls = type("LLM", (FakeLLM,), {"instances": []})
    fake = types.ModuleType("vllm")
    fake.LLM = llm_cls
    fake.PoolingParams = FakePoolingParams
    monkeypatch.setitem(sys.modules, "vllm", fake)
    return llm_cls


@pytest.fixture(scope="module")
def tiny_rm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_reward_model(tmp_path_factory.mktemp("rm") / "tiny-rm", all_texts())


def _scores(root: Path, slug: str) -> dict[tuple[str, str], tuple[float, float]]:
    lines = [x for f in sorted((root / slug).glob("*/scores.jsonl"))
             for x in f.read_text().splitlines()]  # fmt: skip
    return {(s["pair"], s["setting"]): (s["chosen"], s["rejected"]) for s in map(json.loads, lines)}


def test_vllm_engine_agrees_with_transformers(
    fake_vllm: type[FakeLLM], tiny_rm: Path, tmp_path: Path
) -> None:
    split = write_split(tmp_path)
    root = tmp_path / "ev"
    base = ["eval", str(split), "--out", str(root), "--no-progress"]
    spec = f"rm:{tiny_rm},engine=vllm,crosscheck=3,vllm.enforce_eager=true"
    assert main([*base, "--scorer", spec]) == 0
    (llm,) = fake_vllm.instances
    assert llm.kwargs["runner"] == "pooling"
    assert llm.kwargs["model"] == str(tiny_rm)
    assert llm.kwargs["enforce_eager"] is True  # vllm.* options pass through
    assert llm.kwargs["dtype"] == "bfloat16" and llm.kwargs["max_model_len"] == 8192
    (call,) = llm.calls  # one batched call for both settings
    assert call["params"].use_activation is False  # raw logits, reduced as transformers does
    assert len(call["prompts"]) == 2 * 2 * 6

    res = json.loads((root / "rm-tiny-rm-engine=vllm" / "question" / "results.json").read_text())
    check = res["scorer"]["crosscheck"]
    assert check["pairs"] == 3 and check["same_decisions"] == 3
    assert check["max_abs_diff"] < 1e-4

    assert main([*base, "--scorer", f"rm:{tiny_rm},batch_size=4"]) == 0
    via_vllm = _scores(root, "rm-tiny-rm-engine=vllm")
    via_hf = _scores(root, "rm-tiny-rm")
    assert via_vllm.keys() == via_hf.keys()
    for key, (c, r) in via_hf.items():
        assert via_vllm[key] == pytest.approx((c, r), abs=1e-4)


def test_vllm_engine_without_vllm_is_a_one_line_error(
    tiny_rm: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)
    split = write_split(tmp_path)
    assert main(["eval", str(split), "--scorer", f"rm:{tiny_rm},engine=vllm"]) == 1
    err = capsys.readouterr().err.strip()
    assert "engine=vllm needs vLLM" in err and "[vllm]" in err and "\n" not in err


def test_vllm_engine_reference_reduction_in_its_dtype(
    fake_vllm: type[FakeLLM], tmp_path: Path
) -> None:
    from pipeline.eval.pointwise import Encoder, VLLMScorer

    rm3 = build_tiny_reward_model(tmp_path / "rm3", all_texts(), num_labels=3, seed=1)
    enc = Encoder(rm3)
    ids = enc.encode([("How do I sketch hands?", "Sketch them on the train.")] * 2)
    ref = VLLMScorer(enc, reduce="reference")
    exact = VLLMScorer(enc)
    assert ref.info()["reduction"].startswith("reference:") and ref.dtype == "bfloat16"
    got, want_exact = ref.score_ids(ids), exact.score_ids(ids)
    with torch.no_grad():
        logits = fake_vllm.instances[0].model(input_ids=torch.tensor([ids[0]])).logits[0]
    # the engine's logits back in bf16, then the reference's softmax in bf16
    assert got[0] == torch.softmax(logits.bfloat16(), -1)[-1].item()
    assert want_exact[0] == pytest.approx(torch.softmax(logits.double(), -1)[-1].item())
    assert got[0] != want_exact[0]
