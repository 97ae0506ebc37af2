"""`prb eval bon` beside the reference's own best-of-N scripts, on the same release and the
same tiny models: do the prompts, scores, picks and per-k means agree?

Given a checkout of the reference repository (github Martin-qyma/Personalized-RewardBench),
this runs its ``BoN/sample.py``, ``BoN/score.py`` and ``BoN/evaluate.py`` unchanged, in a
scratch folder laid out as they expect (``data/<subset>_test.jsonl`` written from the release,
their ``prompts/`` copied from the checkout, their outputs under ``BoN/data/``), and
``prb eval bon`` with the reference's options: its two prompt files (``--sample-prompt``,
``--judge-prompt``), its reward-model input (``--setting profile-reference``,
``special_tokens=true``, ``reduce=reference``), N samples, k = 1, 2, 4.

What they run on (tests/bon_setup.py): the sample release (configs/sample.yaml against the
stand-in server, published; the input is HAND-WRITTEN sample data), three tiny reward models
with random weights built from its words, and a generative scorer. Both sides get the same
answers from the same rules, on the CPU:

- the policy: ``prb eval bon`` asks the stand-in server; the reference's ``sample.py`` asks a
  fake ``vllm`` module (written by this script into a temporary folder) that hands back, for
  the i-th request with a given prompt, the i-th answer ``prb eval bon`` drew for it. So the
  samples are the same and the prompts are compared as sent;
- the reward models: both load the same folders with transformers;
- the generative scorer: the stand-in's rating rule (tests/standin_player.py), asked through
  the server by ``prb eval bon`` and through the fake ``vllm``'s ``LLM.generate`` (the prompt
  the reference renders with the model's chat template read back into messages) by
  ``score.py``, on the project's template ``prompts/gen_score.txt`` on both sides;
- the judge: one function of the prompt's text (tests/bon_setup.py ``fake_verdict``: each
  aspect's coverage, 0/1/2, as a list), behind the stand-in server and behind the fake
  ``vllm``'s ``LLM.chat``.

For every model, subset and k it reports whether the prompts (the policy's, with its
sampling parameters; the judge's for each pick), the scores (to 1e-6), the picks and the
mean judge score (to 1e-6) agree, and names each difference. docs/eval.md lists the
differences that are intended. None of the reference's code is kept: it runs from the
checkout given, and only the figures are written.

    .venv/bin/python benchmarks/bon_fidelity.py PATH/TO/Personalized-RewardBench
        [--n 4] [--out benchmarks/results/bon_fidelity.json]

``--smoke`` without a checkout runs on stand-in scripts written for the project
(tests/bon_reference_standin.py), for CI, which cannot fetch the reference; its figures say
so and say nothing about the reference.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "tests"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "bon_fidelity.json"
SCRIPTS = ("BoN/sample.py", "BoN/score.py", "BoN/evaluate.py")
PROMPTS = ("prompts/sample.txt", "prompts/evaluation.txt")
SHORT = {
    "Art_and_Entertainment": "Art",
    "Lifestyle_and_Personal_Development": "Lifestyle",
    "Society_and_Culture": "Society",
}
TOLERANCE = 1e-6
GEN = "gen"


def ks_of(n: int) -> list[int]:
    """The k values compared: 1, 2, 4, ... up to N (prb eval bon's default)."""
    from pipeline.eval.bonfigures import default_ks

    return default_ks(n)


# The fake vllm the reference's scripts import (written for this project): the policy hands
# back prb eval bon's own samples, the judge and the generative scorer answer by the rules
# both sides share. Every call is logged for the prompt comparison.
FAKE_VLLM = '''\
"""A fake vllm for benchmarks/bon_fidelity.py (written for personalized-rewardbench)."""
import json
import os
import re

from bon_setup import fake_verdict, template_reader
from standin_player import ModelPlayer
from standin_server import generate_from_schema

__version__ = "0.0-fake"
_REPLAY = json.load(open(os.environ["FAKE_VLLM_REPLAY"], encoding="utf-8"))
_SEEN = {}
with open(os.environ["FAKE_JUDGE_TEMPLATE"], encoding="utf-8") as _fh:
    _READER = template_reader(_fh.read().strip())
_PLAYER = ModelPlayer(generate_from_schema)
_TURN = re.compile(r"<\\|(system|user|assistant)\\|> (.*?) <\\|end\\|> ", re.S)


def _log(**row):
    with open(os.environ["FAKE_VLLM_LOG"], "a", encoding="utf-8") as fh:
        fh.write(json.dumps(row) + "\\n")


class SamplingParams:
    def __init__(self, n=1, temperature=1.0, top_p=1.0, max_tokens=16, seed=None, **kw):
        self.n, self.temperature, self.top_p = n, temperature, top_p
        self.max_tokens, self.seed = max_tokens, seed


class _Completion:
    def __init__(self, text):
        self.text, self.finish_reason, self.token_ids = text, "stop", []


class _Output:
    def __init__(self, text):
        self.outputs = [_Completion(text)]


def _params(p):
    return {"temperature": p.temperature, "top_p": p.top_p, "max_tokens": p.max_tokens}


class LLM:
    def __init__(self, **kwargs):
        _log(event="init", model=str(kwargs.get("model")))

    def chat(self, messages, sampling_params=None, use_tqdm=True, **kw):
        params = sampling_params if isinstance(sampling_params, list) else (
            [sampling_params] * len(messages))
        outs = []
        for conv, p in zip(messages, params):
            key = json.dumps([[m["role"], m["content"]] for m in conv])
            if key in _REPLAY:
                i = _SEEN.get(key, 0)
                _SEEN[key] = i + 1
                text = _REPLAY[key][i]
                _log(event="sample", messages=conv, params=_params(p), index=i)
            else:
                user = next(m["content"] for m in conv if m["role"] == "user")
                text = fake_verdict(user, _READER)
                if text is None:
                    raise RuntimeError("fake vllm: a chat prompt it does not know")
                _log(event="judge", messages=conv, params=_params(p), text=text)
            outs.append(_Output(text))
        return outs

    def generate(self, prompts, sampling_params=None, **kw):
        outs = []
        for prompt in prompts:
            conv = [{"role": r, "content": c} for r, c in _TURN.findall(prompt)]
            text = _PLAYER.answer({"model": "fake", "messages": conv}, 0)
            _log(event="generate", messages=conv, params=_params(sampling_params), text=text)
            outs.append(_Output(text))
        return outs
'''


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def checkout_info(ref: Path, standin: bool) -> dict[str, Any]:
    missing = [s for s in (*SCRIPTS, *PROMPTS) if not (ref / s).is_file()]
    if missing:
        raise SystemExit(
            f"{ref}: not a checkout of the reference repository (no {', '.join(missing)}); "
            "git clone https://github.com/Martin-qyma/Personalized-RewardBench"
        )
    commit = None
    if (ref / ".git").exists():
        got = subprocess.run(["git", "-C", str(ref), "rev-parse", "HEAD"], capture_output=True,
                             text=True)  # fmt: skip
        commit = got.stdout.strip() or None
    return {
        "path": str(ref),
        "kind": "stand-in scripts written for the project (tests/bon_reference_standin.py), "
        "not the reference: these figures say nothing about it"
        if standin
        else "a checkout of the reference repository",
        "commit": commit,
        "files": {s: sha256(ref / s) for s in (*SCRIPTS, *PROMPTS)},
    }


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]


def _env(fake: Path, extra: dict[str, str]) -> dict[str, str]:
    paths = [str(fake), str(ROOT / "tests"), str(ROOT), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p), **extra}


def _run(cmd: list[str], cwd: Path, env: dict[str, str]) -> None:
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{res.stderr[-4000:]}")


def our_run(
    release: Path, models: list[Path], ref: Path, base_url: str, out: Path, n: int
) -> dict[str, Any]:
    from bon_setup import backend_args

    from pipeline.cli import main
    from pipeline.core.resources import data_dir

    template = data_dir("prompts") / "gen_score.txt"
    args = ["eval", "bon", str(release)]
    for m in models:
        args += ["--scorer", f"rm:{m},special_tokens=true,reduce=reference"]
    args += ["--scorer", f"gen:standin-model,template={template},name={GEN}"]
    args += ["--setting", "profile-reference", "--n", str(n), "--k", ",".join(map(str, ks_of(n)))]
    args += ["--sample-prompt", str(ref / "prompts/sample.txt")]
    args += ["--judge-prompt", str(ref / "prompts/evaluation.txt"), "--posts", "10"]
    args += ["--out", str(out), "--no-progress", "--bootstrap", "50", *backend_args(base_url)]
    if main(args) != 0:
        raise SystemExit("prb eval bon failed")
    return {"command": "prb " + " ".join(args), "gen_template": str(template)}


def cached_requests(cache: Path) -> dict[str, dict[str, Any]]:
    import sqlite3

    db = sqlite3.connect(f"file:{cache}?mode=ro", uri=True)
    try:
        return {k: json.loads(r) for k, r in db.execute("SELECT key, request FROM responses")}
    finally:
        db.close()


def reference_run(
    ref: Path,
    work: Path,
    release_rows: list[dict[str, Any]],
    ours: Path,
    models: list[Path],
    n: int,
) -> dict[str, Any]:
    """The reference's three scripts in a scratch folder; per model, its outputs."""
    scratch = work / "reference"
    (scratch / "BoN").mkdir(parents=True)
    (scratch / "data").mkdir()
    for s in SCRIPTS:
        shutil.copy2(ref / s, scratch / s)  # run as they are
    shutil.copytree(ref / "prompts", scratch / "prompts")
    subsets = []
    for full in SHORT:
        rows = [r for r in release_rows if r.get("category") == full]
        if not rows:
            continue
        subsets.append(full)
        keep = ("id", "question", "profile", "rubric_aspects", "narrative", "category")
        (scratch / "data" / f"{full}_test.jsonl").write_text(
            "".join(json.dumps({k: r.get(k) for k in keep}) + "\n" for r in rows)
        )
    # the fake policy's answers: prb eval bon's samples, by prompt, in sample order
    reqs = cached_requests(ours / "cache.sqlite")
    replay: dict[str, list[str]] = {}
    for s in sorted(_jsonl(ours / "samples.jsonl"), key=lambda r: (r["question"], r["sample"])):
        msgs = reqs[s["request"]]["messages"]
        replay.setdefault(json.dumps([[m["role"], m["content"]] for m in msgs]), []).append(
            s["text"]
        )
    fake = work / "fake"
    (fake / "vllm").mkdir(parents=True)
    (fake / "vllm" / "__init__.py").write_text(FAKE_VLLM)
    (work / "replay.json").write_text(json.dumps(replay))
    logs = work / "logs"
    logs.mkdir()
    env = {
        "FAKE_VLLM_REPLAY": str(work / "replay.json"),
        "FAKE_JUDGE_TEMPLATE": str(scratch / "prompts/evaluation.txt"),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    py = sys.executable
    ks = [str(k) for k in ks_of(n)]
    e = _env(fake, {**env, "FAKE_VLLM_LOG": str(logs / "sample.jsonl")})
    for full in subsets:
        _run([py, "BoN/sample.py", "--subset", full, "--num-samples", str(n), "--k", "10",
              "--model", "fake-policy"], scratch, e)  # fmt: skip
    out: dict[str, Any] = {"subsets": subsets, "per_model": {}}
    runs = [(m.name, ["--model", str(m), "--model-type", "discriminative"]) for m in models]
    template = work / "gen_score.txt"
    from pipeline.core.resources import data_dir

    shutil.copy2(data_dir("prompts") / "gen_score.txt", template)
    runs.append((GEN, ["--model", str(models[0]), "--model-type", "generative",
                       "--score-template", str(template)]))  # fmt: skip
    for name, margs in runs:
        e = _env(fake, {**env, "FAKE_VLLM_LOG": str(logs / f"{name}.jsonl")})
        _run([py, "BoN/score.py", *margs, "--k-values", *ks], scratch, e)
        _run([py, "BoN/evaluate.py", "--model", "fake-judge", "--k-values", *ks,
              "--tensor-parallel-size", "1"], scratch, e)  # fmt: skip
        kept = work / "outputs" / name
        shutil.copytree(scratch / "BoN" / "data", kept)
        for f in (scratch / "BoN" / "data").glob("*_k*.jsonl"):
            f.unlink()  # the next model's k files are its own
        out["per_model"][name] = kept
    out["logs"] = logs
    return out


def _turns(messages: list[dict[str, Any]]) -> str:
    return json.dumps([[m["role"], m["content"]] for m in messages])


def compare(ours: Path, theirs: dict[str, Any], n: int) -> dict[str, Any]:
    doc = json.loads((ours / "bon.json").read_text())
    reqs = cached_requests(ours / "cache.sqlite")
    samples = {(r["question"], r["sample"]): r for r in _jsonl(ours / "samples.jsonl")}
    picks = _jsonl(ours / "picks.jsonl")
    scores = _jsonl(ours / "scores.jsonl")
    verdicts = {(v["question"], v["sample"]): v for v in _jsonl(ours / "verdicts.jsonl")}
    subset_of = {r["question"]: r["subset"] for r in samples.values()}
    row_id = {r["question"]: r["id"] for r in samples.values()}
    policy = doc["policy"]
    differences: list[dict[str, Any]] = []
    rows = []
    # the policy's prompts and sampling parameters, per subset
    logged = _jsonl(theirs["logs"] / "sample.jsonl")
    sample_events = [x for x in logged if x["event"] == "sample"]
    by_prompt: dict[str, list[dict[str, Any]]] = {}
    for x in sample_events:
        by_prompt.setdefault(_turns(x["messages"]), []).append(x)
    prompts_ok: dict[str, bool] = {}
    for (qk, i), s in sorted(samples.items()):
        req = reqs[s["request"]]
        got = by_prompt.get(_turns(req["messages"])) or []
        sub = subset_of[qk]
        sent = {k: req[k] for k in ("temperature", "top_p", "max_tokens")}
        ok = len(got) == n and all(x["params"] == sent for x in got)
        if not ok:
            differences.append({"what": "sample prompt", "subset": sub, "question": qk,
                                "sample": i, "reference_requests_with_it": len(got)})  # fmt: skip
        prompts_ok[sub] = prompts_ok.get(sub, True) and ok
    names = [b["name"] for b in doc["scorers"]]
    for name in names:
        folder = theirs["per_model"][name]
        judge_log = [x for x in _jsonl(theirs["logs"] / f"{name}.jsonl") if x["event"] == "judge"]
        judge_prompts = {_turns(x["messages"]) for x in judge_log}
        summary = json.loads((folder / "evaluation_summary.json").read_text())
        block = next(b for b in doc["scorers"] if b["name"] == name)
        mine = {(r["question"], r["sample"]): r["score"] for r in scores if r["scorer"] == name}
        for full in theirs["subsets"]:
            short = SHORT[full]
            scored = _jsonl(folder / f"{short}_scored.jsonl")
            key = {(row_id[q], i): v for (q, i), v in mine.items()}
            diffs = [abs(key[(r["id"], r["sample_idx"])] - r["score"]) for r in scored]
            worst = max(diffs) if diffs else None
            if worst is None or worst > TOLERANCE:
                differences.append({"what": "scores", "model": name, "subset": full,
                                    "max_abs_diff": worst})  # fmt: skip
            for k in ks_of(n):
                theirs_k = {r["id"]: r for r in _jsonl(folder / f"{short}_k{k}.jsonl")}
                same = judged_same = 0
                for p in picks:
                    if p["scorer"] != name or p["k"] != k or subset_of[p["question"]] != full:
                        continue
                    text = samples[(p["question"], p["sample"])]["text"]
                    t = theirs_k.get(row_id[p["question"]])
                    if t is not None and t["output"] == text:
                        same += 1
                    else:
                        differences.append({"what": "pick", "model": name, "subset": full,
                                            "k": k, "question": p["question"],
                                            "ours": p["sample"]})  # fmt: skip
                    v = verdicts[(p["question"], p["sample"])]
                    if _turns(reqs[v["request"]]["messages"]) in judge_prompts:
                        judged_same += 1
                    else:
                        differences.append({"what": "judge prompt", "model": name,
                                            "subset": full, "k": k,
                                            "question": p["question"]})  # fmt: skip
                total = len(theirs_k)
                ref_mean = summary[full][str(k)]["mean_score"]
                our_mean = block["curves"]["profile-reference"][full]["k"][str(k)]["mean"]
                mean_ok = our_mean is not None and abs(our_mean - ref_mean) <= TOLERANCE
                if not mean_ok:
                    differences.append({"what": "mean", "model": name, "subset": full, "k": k,
                                        "ours": our_mean, "reference": ref_mean})  # fmt: skip
                rows.append(
                    {
                        "model": name,
                        "subset": full,
                        "k": k,
                        "sample_prompts_agree": prompts_ok.get(full, False),
                        "judge_prompts_agree": judged_same == total,
                        "scores_max_abs_diff": worst,
                        "scores_agree": worst is not None and worst <= TOLERANCE,
                        "picks_equal": same,
                        "questions": total,
                        "mean_ours": our_mean,
                        "mean_reference": ref_mean,
                        "mean_agree": mean_ok,
                    }
                )
    agree = not differences
    keys = ("sample_prompts_agree", "judge_prompts_agree", "scores_agree", "mean_agree")
    agreeing = sum(all(r[k] for k in keys) and r["picks_equal"] == r["questions"] for r in rows)
    return {
        "comparisons": len(rows),
        "comparisons_agreeing": agreeing,
        "scores_max_abs_diff": max((r["scores_max_abs_diff"] or 0.0) for r in rows),
        "policy": {k: policy[k] for k in ("temperature", "top_p", "max_tokens", "system")},
        "rows": rows,
        "differences": differences,
        "all_agree": agree,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("reference", type=Path, nargs="?",
                    help="a checkout of github Martin-qyma/Personalized-RewardBench")  # fmt: skip
    ap.add_argument("--n", type=int, default=4, help="samples per question (default 4)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    from _smoke import add_flag as add_smoke_flag
    from _smoke import apply as apply_smoke

    add_smoke_flag(ap)
    args = ap.parse_args()
    apply_smoke(args, n=2)
    if args.reference is None and not args.smoke:
        ap.error("give the path of a checkout of the reference repository (or --smoke)")
    from bon_setup import build_models, build_release, judge_responder
    from standin_server import StandinServer

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        standin = args.reference is None
        if standin:
            from bon_reference_standin import build_bon_standin

            ref = build_bon_standin(work / "standin-checkout")
        else:
            ref = args.reference.resolve()
        about = checkout_info(ref, standin)
        template = (ref / "prompts/evaluation.txt").read_text(encoding="utf-8").strip()
        with StandinServer(responder=judge_responder(template)) as server:
            release = build_release(work / "run", server.base_url)
            models = build_models(release, work / "models", 1 if args.smoke else 3)
            ours = work / "ours"
            mine = our_run(release, models, ref, server.base_url, ours, args.n)
        import pyarrow.parquet as pq

        from pipeline.publish import DATA_FILE

        rows = pq.read_table(release / "all" / DATA_FILE).to_pylist()
        theirs = reference_run(ref, work, rows, ours, models, args.n)
        result = compare(ours, theirs, args.n)
    result = {
        "smoke": bool(args.smoke),
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": "python benchmarks/bon_fidelity.py " + " ".join(sys.argv[1:]),
        "reference": about,
        "ours": mine,
        "n": args.n,
        "ks": ks_of(args.n),
        "tolerance": TOLERANCE,
        "data": "the sample release (hand-written sample input, the stand-in's rule-based "
        "answers), tiny reward models with random weights: the machinery, not a model",
        "intended_differences": "docs/eval.md, 'Against the reference's scripts'",
        **result,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"reference: {about['kind']} ({about['path']})")
    print(f"{'model':12s} {'subset':36s} {'k':>2s}  prompts  scores   picks     means")
    for r in result["rows"]:
        prompts = "same" if r["sample_prompts_agree"] and r["judge_prompts_agree"] else "DIFF"
        scores = "same" if r["scores_agree"] else f"{r['scores_max_abs_diff']:.1e}"
        means = "same" if r["mean_agree"] else f"{r['mean_ours']} vs {r['mean_reference']}"
        print(f"{r['model'][:12]:12s} {r['subset'][:36]:36s} {r['k']:>2d}  {prompts:7s}  "
              f"{scores:7s}  {r['picks_equal']:>2d}/{r['questions']:<2d}   {means}")  # fmt: skip
    print(f"{len(result['differences'])} differences; all agree: {result['all_agree']}")
    print(f"figures: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
