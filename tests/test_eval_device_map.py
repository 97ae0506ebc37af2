"""rm:...,device_map=...: the value goes to from_pretrained, the model stays where
transformers placed it, and inputs go to its first device. A tiny local model on the CPU
(pipeline/eval/tiny.py); nothing is downloaded."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from eval_split import all_texts, write_split  # noqa: E402

from pipeline.cli import main  # noqa: E402
from pipeline.core.errors import InputError  # noqa: E402
from pipeline.eval import pointwise  # noqa: E402
from pipeline.eval.pointwise import Encoder, TransformersScorer  # noqa: E402
from pipeline.eval.spec import parse_spec  # noqa: E402
from pipeline.eval.tiny import build_tiny_reward_model  # noqa: E402

CONVS = [
    ("How can I practise drawing hands on my commute?", "Sketch hands quickly on the train."),
    ("How do I keep a sketchbook habit going?", "Keep a small sketchbook in your bag."),
    ("What should I do on a long train commute?", "Catch up on email and spreadsheets."),
]


@pytest.fixture(scope="module")
def tiny_rm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_reward_model(tmp_path_factory.mktemp("rm") / "tiny-rm", all_texts())


def test_device_map_goes_to_from_pretrained_and_inputs_to_the_first_device(
    tiny_rm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without accelerate the load itself is stood in for: the value must reach
    from_pretrained as given, the placed model must not be moved, and the inputs must go
    to the device of its input embeddings."""
    auto = transformers.AutoModelForSequenceClassification
    original = auto.from_pretrained
    calls: list[dict[str, Any]] = []

    def from_pretrained(path: str, **kw: Any) -> Any:
        calls.append(dict(kw))
        placed = kw.pop("device_map", None)
        model = original(path, **kw)
        if placed is not None:
            model.hf_device_map = {"model": "cpu", "score": "cpu"}

            def no_move(*a: Any, **k: Any) -> Any:
                raise AssertionError("a model placed by device_map was moved")

            model.to = no_move
        return model

    monkeypatch.setattr(auto, "from_pretrained", from_pretrained)
    monkeypatch.setattr(pointwise, "check_device_map", lambda value: None)
    enc = Encoder(tiny_rm)
    ids = enc.encode(CONVS)
    placed = TransformersScorer(enc, device_map="auto", progress=False)
    assert calls[-1]["device_map"] == "auto"
    assert str(placed.input_device) == "cpu"
    got = placed.score_ids(ids)
    info = placed.info()
    assert info["device_map"] == "auto" and info["devices"] == ["cpu"]
    assert info["input_device"] == "cpu" and info["dtype"] == "float32"  # no GPU here
    plain = TransformersScorer(enc, device="cpu", progress=False)
    assert "device_map" not in calls[-1]  # not passed at all without the option
    assert got == plain.score_ids(ids)
    assert "device_map" not in plain.info()


def test_device_map_without_accelerate_is_one_line(
    tiny_rm: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    split = write_split(tmp_path)
    monkeypatch.setitem(sys.modules, "accelerate", None)  # as if not installed
    spec = f"rm:{tiny_rm},device_map=auto"
    assert main(["eval", str(split), "--scorer", spec, "--no-progress"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err
    assert "device_map=auto needs accelerate" in err
    assert "pip install 'personalized-rewardbench[eval]'" in err
    assert not (tmp_path / "split-eval").exists()  # refused before the split loads


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("rm:/m,device_map=auto,device=cuda:1", "leave out device"),
        ("rm:/m,device_map=auto,engine=vllm", "leave out engine=vllm"),
    ],
)
def test_device_map_with_device_or_vllm_is_refused(spec: str, expected: str) -> None:
    with pytest.raises(InputError, match=expected) as exc:
        parse_spec(spec)
    assert "\n" not in str(exc.value) and "device_map" in str(exc.value)


def test_device_map_changes_no_slug() -> None:
    assert parse_spec("rm:/m/x,device_map=auto").slug() == parse_spec("rm:/m/x").slug()


def test_device_map_cpu_loads_through_accelerate(
    tiny_rm: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The real path (needs accelerate, in the eval extra): device_map=cpu scores as the
    plain CPU load does."""
    pytest.importorskip("accelerate")
    split = write_split(tmp_path)
    figures = {}
    for name, spec in (
        ("plain", f"rm:{tiny_rm},device=cpu"),
        ("mapped", f"rm:{tiny_rm},device_map=cpu"),
    ):
        out = tmp_path / name
        args = ["eval", str(split), "--scorer", spec, "--setting", "question", "--out", str(out)]
        assert main([*args, "--no-progress", "--bootstrap", "10"]) == 0
        doc = json.loads((out / "rm-tiny-rm" / "question" / "results.json").read_text())
        scores = [json.loads(x) for x in (out / "rm-tiny-rm" / "question" / "scores.jsonl").open()]
        figures[name] = (doc, [(s["chosen"], s["rejected"]) for s in scores])
    capsys.readouterr()
    assert figures["mapped"][0]["scorer"]["device_map"] == "cpu"
    assert figures["mapped"][0]["scorer"]["input_device"] == "cpu"
    assert figures["mapped"][1] == figures["plain"][1]


@pytest.mark.parametrize(
    ("option", "expected"),
    [
        ("device=banana", "option 'device=banana' is not a device torch knows"),
        ("device_map=banana", "option 'device_map=banana' is not a device torch knows"),
        ("device=cuda:99", "cuda:99"),
        ("device_map=cuda:99", "cuda:99"),
        # a command copied from a Mac: torch's "not linked with support for mps devices"
        # came as a traceback after the model loaded (issue 52)
        ("device=mps", "cannot use a 'mps' device on this machine; use device=cpu"),
        ("device_map=mps", "cannot use a 'mps' device"),
        ("device=xpu", "cannot use a 'xpu' device"),
    ],
)
def test_a_device_torch_cannot_use_is_one_line_before_anything_loads(
    option: str,
    expected: str,
    tiny_rm: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # cuda:99: no CUDA device on a CPU machine, too high an index on a GPU one
    split = write_split(tmp_path)
    assert main(["eval", str(split), "--scorer", f"rm:{tiny_rm},{option}", "--no-progress"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err
    assert expected in err
    assert not (tmp_path / "split-eval").exists()  # refused before the split loads


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("rm:/m,batch_size=0", "option 'batch_size' must be >= 1, got '0'"),
        ("rm:/m,dtype=float16,dtype=float32", "option 'dtype' is given twice"),
        ("judge:m,unparsed=a,unparsed=fail", "option 'unparsed' is given twice"),
        ("judge:m,format=text,system_prompt=,user_prompt=", "'system_prompt' needs the prompt"),
        ("rm:/m,crosscheck=5", "option 'crosscheck' scores pairs again with transformers"),
    ],
)
def test_a_zero_batch_an_option_given_twice_or_one_that_does_nothing_is_refused(
    spec: str, expected: str
) -> None:
    with pytest.raises(InputError, match=expected):
        parse_spec(spec)
