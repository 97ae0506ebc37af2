"""A stand-in checkout of the reference repository's best-of-N scripts, for CI's smoke run of
benchmarks/bon_fidelity.py, where the real checkout (github Martin-qyma/Personalized-
RewardBench) cannot be fetched.

EVERYTHING HERE IS WRITTEN FOR THE PROJECT: it is not the reference's code or prompts. The
scripts follow the interface the reference's ``BoN/README.md`` documents (the same command
lines, the same file names under ``data/`` and ``BoN/data/``, the same JSON fields) with this
project's own code and prompt wording, so the fidelity script's whole path runs. The figures
a run on it reports are about these stand-ins, never about the reference; the script says
which it ran on. A real comparison needs the real checkout (docs/eval.md).
"""

from __future__ import annotations

from pathlib import Path

MARK = "# WRITTEN FOR personalized-rewardbench (tests/bon_reference_standin.py): a stand-in\n"

SAMPLE_PY = (
    MARK
    + '''\
"""Stand-in for the reference's BoN/sample.py: N answers per question through vllm."""
import argparse
import json
import os

from vllm import LLM, SamplingParams

SHORT = {"Art_and_Entertainment": "Art", "Lifestyle_and_Personal_Development": "Lifestyle",
         "Society_and_Culture": "Society"}
SYSTEM = ("You are a helpful assistant designed to generate personalized responses to user "
          "questions.")


def posts_text(profile, k):
    lines = []
    for number, post in enumerate(profile[:k], start=1):
        lines.append("Post %d (Category: %s):\\n%s" % (number, post["category"], post["text"]))
    return "\\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--subset", default="Lifestyle_and_Personal_Development")
    ap.add_argument("--split", default="test")
    ap.add_argument("--num-samples", type=int, default=16)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--tensor-parallel-size", type=int, default=1)
    ap.add_argument("--pipeline-parallel-size", type=int, default=1)
    ap.add_argument("--gen-template", default="prompts/sample.txt")
    ap.add_argument("--model", default="policy")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--gpus", default=None)
    a = ap.parse_args()
    with open(a.gen_template, encoding="utf-8") as fh:
        template = fh.read().strip()
    with open("data/%s_%s.jsonl" % (a.subset, a.split), encoding="utf-8") as fh:
        rows = [json.loads(x) for x in fh if x.strip()]
    todo = []
    for row in rows:
        profile = posts_text(row["profile"], a.k)
        text = template.replace("{question}", row["question"]).replace("{profile}", profile)
        aspects = ", ".join(x["aspect"] for x in row["rubric_aspects"])
        for i in range(a.num_samples):
            todo.append((row, profile, text, aspects, i))
    llm = LLM(model=a.model)
    params = SamplingParams(temperature=a.temperature, top_p=0.9, max_tokens=512)
    out = []
    for start in range(0, len(todo), a.batch_size):
        part = todo[start:start + a.batch_size]
        convs = [[{"role": "system", "content": SYSTEM}, {"role": "user", "content": t[2]}]
                 for t in part]
        for t, got in zip(part, llm.chat(messages=convs, sampling_params=params)):
            row, profile, _, aspects, i = t
            out.append({"id": row["id"], "query": row["question"], "profile": profile,
                        "sample_idx": i, "aspects": aspects,
                        "generated_response": got.outputs[0].text})
    os.makedirs("BoN/data", exist_ok=True)
    with open("BoN/data/%s_samples.jsonl" % SHORT[a.subset], "w", encoding="utf-8") as fh:
        fh.writelines(json.dumps(r) + "\\n" for r in out)


if __name__ == "__main__":
    main()
'''
)

SCORE_PY = (
    MARK
    + '''\
"""Stand-in for the reference's BoN/score.py: score samples, keep the best of the first k."""
import argparse
import json
import os
import re

SHORT = {"Lifestyle_and_Personal_Development": "Lifestyle", "Art_and_Entertainment": "Art",
         "Society_and_Culture": "Society"}


def discriminative(samples, model, batch_size):
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    net = AutoModelForSequenceClassification.from_pretrained(model).eval()
    scores = []
    for start in range(0, len(samples), batch_size):
        part = samples[start:start + batch_size]
        texts = [tok.apply_chat_template(
            [{"role": "user", "content": s["query"] + s["profile"]},
             {"role": "assistant", "content": s["generated_response"]}], tokenize=False)
            for s in part]
        enc = tok(texts, return_tensors="pt", padding=True, truncation=True, max_length=8192)
        with torch.no_grad():
            logits = net(**enc).logits
        if logits.shape[-1] == 1:
            scores += logits[:, 0].tolist()
        else:
            scores += torch.softmax(logits, dim=-1)[:, -1].tolist()
    return scores


def number(text):
    text = text.strip()
    try:
        return max(0.0, min(1.0, float(text)))
    except ValueError:
        found = re.findall(r"0?\\.\\d+|[01]\\.?\\d*", text)
        return max(0.0, min(1.0, float(found[0]))) if found else 0.5


def generative(samples, model, template, batch_size):
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams

    tok = AutoTokenizer.from_pretrained(model)
    llm = LLM(model=model)
    params = SamplingParams(max_tokens=10, temperature=0.0, top_p=1.0)
    scores = []
    for start in range(0, len(samples), batch_size):
        prompts = []
        for s in samples[start:start + batch_size]:
            text = template.replace("{question}", s["query"]).replace("{profile}", s["profile"])
            text = text.replace("{answer}", s["generated_response"])
            msgs = [{"role": "system", "content": "You are a fair and insightful judge."},
                    {"role": "user", "content": text}]
            prompts.append(tok.apply_chat_template(msgs, tokenize=False,
                                                   add_generation_prompt=True))
        scores += [number(o.outputs[0].text) for o in llm.generate(prompts, params)]
    return scores


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--model-type", required=True, choices=["discriminative", "generative"])
    ap.add_argument("--subset", default=None, choices=list(SHORT))
    ap.add_argument("--score-template", default="prompts/evaluation.txt")
    ap.add_argument("--k-values", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64, 128])
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--tensor-parallel-size", type=int, default=1)
    ap.add_argument("--gpus", default=None)
    a = ap.parse_args()
    for subset in [a.subset] if a.subset else list(SHORT):
        short = SHORT[subset]
        path = "BoN/data/%s_samples.jsonl" % short
        if not os.path.exists(path):
            continue
        with open(path, encoding="utf-8") as fh:
            samples = [json.loads(x) for x in fh if x.strip()]
        if a.model_type == "discriminative":
            scores = discriminative(samples, a.model, a.batch_size)
        else:
            with open(a.score_template, encoding="utf-8") as fh:
                template = fh.read().strip()
            scores = generative(samples, a.model, template, a.batch_size)
        with open("BoN/data/%s_scored.jsonl" % short, "w", encoding="utf-8") as fh:
            for s, v in zip(samples, scores):
                fh.write(json.dumps({**s, "score": v}) + "\\n")
        by_id = {}
        for s, v in zip(samples, scores):
            by_id.setdefault(s["id"], []).append((v, s))
        for k in sorted(a.k_values):
            with open("BoN/data/%s_k%d.jsonl" % (short, k), "w", encoding="utf-8") as fh:
                for item, scored in by_id.items():
                    best_v, best = scored[0]
                    for v, s in scored[1:k]:
                        if v > best_v:
                            best_v, best = v, s
                    fh.write(json.dumps({"id": item, "query": best["query"],
                                         "output": best["generated_response"],
                                         "aspects": best["aspects"], "score": best_v}) + "\\n")


if __name__ == "__main__":
    main()
'''
)

EVALUATE_PY = (
    MARK
    + '''\
"""Stand-in for the reference's BoN/evaluate.py: a judge scores each best-of-k answer."""
import argparse
import json
import os
import re
import statistics

from vllm import LLM, SamplingParams

SHORT = {"Lifestyle_and_Personal_Development": "Lifestyle", "Art_and_Entertainment": "Art",
         "Society_and_Culture": "Society"}


def read(text):
    text = text.strip()
    bracket = re.search(r"\\[([^\\]]+)\\]", text)
    inside = bracket.group(1) if bracket else text
    values = [float(x) for x in re.findall(r"-?\\d+\\.?\\d*", inside)]
    return values, (sum(values) / len(values) if values else 0.0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="judge")
    ap.add_argument("--subset", default=None, choices=list(SHORT))
    ap.add_argument("--k-values", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64, 128])
    ap.add_argument("--data-dir", default="BoN/data")
    ap.add_argument("--template", default="prompts/evaluation.txt")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--tensor-parallel-size", type=int, default=4)
    ap.add_argument("--pipeline-parallel-size", type=int, default=1)
    a = ap.parse_args()
    with open(a.template, encoding="utf-8") as fh:
        template = fh.read().strip()
    llm = LLM(model=a.model)
    params = SamplingParams(temperature=0.0, max_tokens=32)
    summary = {}
    for subset in [a.subset] if a.subset else list(SHORT):
        short, per_k = SHORT[subset], {}
        for k in sorted(a.k_values):
            path = os.path.join(a.data_dir, "%s_k%d.jsonl" % (short, k))
            if not os.path.exists(path):
                continue
            with open(path, encoding="utf-8") as fh:
                rows = [json.loads(x) for x in fh if x.strip()]
            results = []
            for start in range(0, len(rows), a.batch_size):
                part = rows[start:start + a.batch_size]
                convs = []
                for r in part:
                    text = template.replace("{question}", r["query"])
                    text = text.replace("{answer}", r["output"])
                    text = text.replace("{aspects}", r.get("aspects", ""))
                    system = "You are a fair and insightful judge."
                    convs.append([{"role": "system", "content": system},
                                  {"role": "user", "content": text}])
                for r, got in zip(part, llm.chat(messages=convs, sampling_params=params)):
                    values, mean = read(got.outputs[0].text)
                    results.append({"id": r["id"], "query": r["query"], "answer": r["output"],
                                    "aspects": r.get("aspects", ""), "scores": values,
                                    "average_score": mean})
            means = [r["average_score"] for r in results]
            per_k[k] = {"k": k, "num_examples": len(results),
                        "mean_score": statistics.fmean(means),
                        "std_score": statistics.pstdev(means),
                        "min_score": min(means), "max_score": max(means)}
            with open(os.path.join(a.data_dir, "%s_eval_k%d.jsonl" % (short, k)), "w",
                      encoding="utf-8") as fh:
                fh.writelines(json.dumps(r) + "\\n" for r in results)
        summary[subset] = per_k
    with open(os.path.join(a.data_dir, "evaluation_summary.json"), "w", encoding="utf-8") as fh:
        json.dump(summary, fh, indent=2)


if __name__ == "__main__":
    main()
'''
)

# The stand-in prompts: the project's own wording, with the placeholders the reference's
# prompt files take ({question}, {profile}; {question}, {answer}, {aspects}).
SAMPLE_TXT = """\
(Written for personalized-rewardbench's CI; a stand-in, not the reference's prompt.)
Answer the user's current question for them, in at most 100 words.
- The user's current question:
{question}
- Their past posts:
{profile}
Write the answer only."""

EVALUATION_TXT = """\
(Written for personalized-rewardbench's CI; a stand-in, not the reference's prompt.)
Score how well the answer covers each aspect: 0 not at all, 1 somewhat, 2 very well.
- The user's current question:
{question}
- The answer to be evaluated:
{answer}
- Aspects to refer:
{aspects}
Reply with the list of scores only."""


def build_bon_standin(folder: Path) -> Path:
    """Write the stand-in checkout (BoN/ and prompts/) under ``folder``; returns it."""
    (folder / "BoN").mkdir(parents=True, exist_ok=True)
    (folder / "prompts").mkdir(exist_ok=True)
    for name, text in (("sample.py", SAMPLE_PY), ("score.py", SCORE_PY),
                       ("evaluate.py", EVALUATE_PY)):  # fmt: skip
        (folder / "BoN" / name).write_text(text, encoding="utf-8")
    (folder / "prompts" / "sample.txt").write_text(SAMPLE_TXT, encoding="utf-8")
    (folder / "prompts" / "evaluation.txt").write_text(EVALUATION_TXT, encoding="utf-8")
    (folder / "STANDIN.md").write_text(
        "A stand-in written for personalized-rewardbench (tests/bon_reference_standin.py); "
        "not the reference repository.\n",
        encoding="utf-8",
    )
    return folder
