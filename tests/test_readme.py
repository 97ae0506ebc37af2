"""The README, walked from top to bottom in a scratch copy of the project, and every command
line quoted in the README and the docs run there (those that need no GPU, real server,
Label Studio or network; each one left out says why).

The install is set aside: the scratch folder gets a fresh virtual environment at `.venv`
(no pip, no network) that sees this interpreter's packages, with its own `prb` script,
so `.venv/bin/prb`, `source .venv/bin/activate` and the bare `prb`/`python` after it
behave as they do after the README's main command. The stand-in server runs on a free
port instead of 8000 (another test may hold 8000), and the scratch copy's
configs/sample.yaml points at it; every other command runs verbatim.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
# the README first (its walk builds outputs/sample and outputs/quickstart), then the docs
DOCS = [
    README,
    ROOT / "annotation" / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    ROOT / "benchmarks" / "README.md",
    ROOT / "examples" / "README.md",
]
COPY = [
    *(".ci", "annotation", "benchmarks", "configs", "docs", "examples", "pipeline", "prompts"),
    *("rubrics", "scripts", "tests", "Makefile", "README.md", "pyproject.toml"),
]

MAIN = "python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/prb quickstart"
ACTIVATE = "source .venv/bin/activate"
STANDIN = re.compile(r"^python tests/standin_server\.py --port 8000 &$")

# Commands that are not run here, each with the reason; the first match wins. A quoted
# command that is neither run nor listed here fails test_every_quoted_command_is_accounted.
NOT_RUN: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"^bash \.ci/run$"), "the whole CI run; this suite is part of it"),
    (re.compile(r"^kill %1$"), "job control in the reader's shell; the test stops its stand-in"),
    (re.compile(r"\bpip install\b"), "installs packages from the network"),
    (re.compile(r"keep-torch\.txt"), "part of the vLLM install on a GPU machine"),
    (re.compile(r"^vllm serve\b|backend\.name=vllm|engine=vllm"), "needs a GPU and vLLM"),
    (re.compile(r"^ray start\b|backend\.name=ray"), "needs the ray extra and a cluster"),
    (
        re.compile(r"backend\.name=llamacpp"),
        "needs the local extra (compiled) and minutes of CPU; tests/test_e2e_local_model.py "
        "runs the pipeline on it",
    ),
    (re.compile(r"scripts/gpu_(e2e|check)\.sh|^source \.gpu/"), "needs a GPU"),
    (re.compile(r"^OPENAI_API_KEY="), "needs a real server"),
    (
        re.compile(r"vllm\.entrypoints\.openai\.run_batch"),
        "vLLM's batch runner on a GPU cluster; tests/test_batch_files.py answers the files",
    ),
    (
        re.compile(r"^prb batch import\b|^prb run .*backend\.name=batchfile"),
        "needs results.jsonl from the cluster's batch job; tests/test_batch_files.py imports them",
    ),
    (re.compile(r"prb annotate (serve|import)\b"), "needs a Label Studio server"),
    (re.compile(r"prb annotate export (?!.*--file-only)"), "needs a Label Studio server"),
    (re.compile(r"^export LABEL_STUDIO_API_KEY="), "a Label Studio token"),
    (re.compile(r"--policy verified"), "needs the votes of a Label Studio round"),
    (re.compile(r"--push-to-hub"), "uploads to the Hugging Face Hub"),
    (
        re.compile(r"configs/reference(-construction)?\.yaml|outputs/reference\b"),
        "downloads LaMP-QA and Contriever from the Hub; tests/test_reference.py and "
        "tests/test_reference_construction.py run them on a local stand-in of LaMP-QA's layout",
    ),
    (re.compile(r"scorer rm:/"), "needs a reward model folder"),
    (re.compile(r"\bbenchmarks/\w+\.py\b"), "a benchmark: minutes to hours each"),
    (re.compile(r"\bpairs\.jsonl\b"), "a pairs file of the reader's own"),
    (
        re.compile(r"\b(RUN|RELEASE|CONFIG|MODEL|MODEL_DIR|JUDGE_MODEL|SPLIT)\b|<\w+>|\.\.\."),
        "a placeholder for the reader's own value",
    ),
]
# exit codes a command may end with besides 0 (the audit gate's 3 is documented)
ALLOWED_RC = [(re.compile(r"--fail-on"), {0, 3})]
MIN_RUN = 20  # the walk and the docs run at least this many commands


def quoted_commands(doc: Path) -> list[str]:
    """Command lines of a Markdown file's bash code blocks: comments dropped, continued
    lines joined."""
    commands, in_block, lang, pending = [], False, "", ""
    for line in doc.read_text().splitlines():
        if line.startswith("```"):
            in_block, lang = not in_block, line[3:].strip()
            continue
        if not in_block or lang not in ("bash", "sh", "shell", "console"):
            continue
        text = _strip_comment(line).rstrip()
        if text.endswith("\\"):
            pending += text[:-1].rstrip() + " "
            continue
        text = (pending + text.strip()).strip()
        pending = ""
        if text:
            commands.append(text)
    return commands


def _strip_comment(line: str) -> str:
    """The line without a trailing `# comment` (a # inside quotes stays)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def why_not_run(command: str) -> str | None:
    if command in (MAIN, ACTIVATE) or STANDIN.match(command):
        return None
    for pattern, reason in NOT_RUN:
        if pattern.search(command):
            return reason
    return None


# -- the scratch copy ---------------------------------------------------------------------


@dataclass
class Walk:
    root: Path
    env: dict[str, str]
    results: dict[str, subprocess.CompletedProcess[str]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    standin: subprocess.Popen[bytes] | None = None
    standin_log: Path | None = None

    def run(self, command: str, doc: Path) -> subprocess.CompletedProcess[str]:
        res = subprocess.run(
            ["bash", "-c", command],
            cwd=self.root,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        self.results[command] = res
        ok = {0}
        for pattern, codes in ALLOWED_RC:
            if pattern.search(command):
                ok = codes
        assert res.returncode in ok, (
            f"{doc.relative_to(ROOT)}: `{command}` exited {res.returncode}\n"
            f"stdout: {res.stdout[-2000:]}\nstderr: {res.stderr[-3000:]}"
        )
        return res


def _make_venv(root: Path) -> Path:
    """A fresh venv at root/.venv that sees this interpreter's packages (no pip, no network)."""
    venv = root / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # addsitedir also reads that folder's .pth files, so the editable install resolves
    ours = sysconfig.get_paths()["purelib"]
    Path(purelib, "_prb_test_parent.pth").write_text(f"import site; site.addsitedir({ours!r})\n")
    prb = venv / "bin" / "prb"
    prb.write_text(f"#!{py}\nimport sys\nfrom pipeline.cli import main\nsys.exit(main())\n")
    prb.chmod(0o755)
    return venv


def _base_env(root: Path) -> dict[str, str]:
    """The environment of a shell that has not activated any venv."""
    ours = str(Path(sys.executable).parent)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != ours)
    env.update(
        HF_HOME=str(root / ".hf"),
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TERM="dumb",
    )
    return env


def _start_standin(walk: Walk) -> int:
    """The README's stand-in command on a free port; the scratch sample config points at it."""
    log = walk.root / "standin.log"
    port_file = walk.root / "standin.port"
    walk.standin_log = log
    with open(log, "wb") as fh:
        walk.standin = subprocess.Popen(
            ["python", "tests/standin_server.py", "--port", "0", "--port-file", str(port_file)],
            cwd=walk.root,
            env=walk.env,
            stdout=fh,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 240  # generous: a busy machine starts Python slowly
    while not port_file.exists():
        assert walk.standin.poll() is None, log.read_text()
        assert time.monotonic() < deadline, "the stand-in did not start in 240 s"
        time.sleep(0.1)
    port = int(port_file.read_text())
    # the one line it prints once it listens (after the port file is written)
    while "listening" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    sample = walk.root / "configs" / "sample.yaml"
    text = sample.read_text()
    assert "base_url: http://127.0.0.1:8000/v1" in text
    sample.write_text(text.replace("127.0.0.1:8000", f"127.0.0.1:{port}"))
    return port


@pytest.fixture(scope="module")
def walk(tmp_path_factory):
    root = tmp_path_factory.mktemp("readme") / "personalized-rewardbench"
    root.mkdir()
    for name in COPY:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, root / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, root / name)
    w = Walk(root=root, env=_base_env(root))
    try:
        for command in quoted_commands(README):
            reason = why_not_run(command)
            if reason:
                w.skipped[command] = reason
            elif command == MAIN:
                # the install is set aside: a fresh venv stands in for `pip install -e .`
                _make_venv(root)
                w.run(".venv/bin/prb quickstart", README)
                w.results[MAIN] = w.results.pop(".venv/bin/prb quickstart")
            elif command == ACTIVATE:
                res = w.run(f"{ACTIVATE} && command -v prb && command -v python", README)
                assert res.stdout.split() == [
                    str(root / ".venv" / "bin" / "prb"),
                    str(root / ".venv" / "bin" / "python"),
                ]
                venv = root / ".venv"
                w.env["PATH"] = f"{venv / 'bin'}{os.pathsep}{w.env['PATH']}"
                w.env["VIRTUAL_ENV"] = str(venv)
            elif STANDIN.match(command):
                _start_standin(w)
            else:
                if command.startswith("prb publish"):
                    # issue 12 item 4: a run that is not published yet audits its kept pairs
                    w.run("prb audit outputs/sample --out audit-before-publish", README)
                w.run(command, README)
        yield w
    finally:
        if w.standin is not None:
            w.standin.terminate()
            w.standin.wait(timeout=30)


def _result(walk: Walk, prefix: str) -> subprocess.CompletedProcess[str]:
    found = [c for c in walk.results if c.startswith(prefix)]
    assert found, f"the README no longer runs a command starting with {prefix!r}"
    return walk.results[found[0]]


REQUESTS = re.compile(
    r"\[(\w+)\] done: .*requests (\d+)(?: \+ \d+ re-asks)? "
    r"\((?:sent|replayed) (\d+), cached (\d+), failed (\d+)\)"
)


def _request_counts(stderr: str) -> dict[str, tuple[int, int, int, int]]:
    return {m[0]: tuple(int(x) for x in m[1:]) for m in REQUESTS.findall(stderr)}


# -- the walk -------------------------------------------------------------------------------


@pytest.mark.timeout(1200)
def test_setup_commands_come_first_and_the_main_command_ends_with_next_steps(walk):
    commands = quoted_commands(README)
    assert commands[:2] == [MAIN, "bash .ci/run"], "the two setup commands must come first"
    first_block = README.read_text().split("```")[1]
    assert "main command" in first_block and "tests:" in first_block

    res = walk.results[MAIN]
    out = res.stdout
    assert "Next steps" in out
    # the venv is not active after the main command: next steps name .venv/bin/prb
    assert ".venv/bin/prb inspect outputs/quickstart" in out
    assert "source .venv/bin/activate" in out
    assert "report/audit.html" in out and "file://" in out
    assert 'datasets.load_dataset("outputs/quickstart/publish", "all", split="test")' in out
    assert "3 pairs and no gold attention check (every kept pair is in the round" in out
    assert re.search(r"\.venv/bin/python3? tests/standin_server\.py --port 8000 &", out)
    assert ".venv/bin/prb run configs/sample.yaml" in out
    counts = _request_counts(res.stderr)
    assert set(counts) == {"responses", "judge"}
    assert all(c[3] == 0 for c in counts.values())  # failed

    # the next steps work as printed, from the same un-activated shell
    line = next(x for x in out.splitlines() if "prb inspect outputs/quickstart" in x)
    inspect = subprocess.run(
        ["bash", "-c", line.split(": ", 1)[1]],
        cwd=walk.root,
        env=_base_env(walk.root),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert inspect.returncode == 0, inspect.stderr
    assert "sample-soc-02" in inspect.stdout  # the source row id of the dropped example
    snippet = "; ".join(
        x.strip()
        for x in out.splitlines()
        if x.strip().startswith(("import datasets", "files = ", "ds = "))
    )
    loaded = subprocess.run(
        [".venv/bin/python", "-c", snippet + "; print(len(ds))"],
        cwd=walk.root,
        env=_base_env(walk.root),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.split()[-1] == "3"


@pytest.mark.timeout(1200)
def test_offline_run_against_the_standin_counts_requests(walk):
    assert walk.standin is not None and walk.standin_log is not None
    assert "listening on http://127.0.0.1:" in walk.standin_log.read_text()

    run = walk.results["prb run configs/sample.yaml"]
    counts = _request_counts(run.stderr)
    assert set(counts) == {"responses", "judge"}
    for requests, sent, cached, failed in counts.values():
        assert requests == sent > 0 and cached == 0 and failed == 0
    kept = int(re.search(r"= kept\s+(\d+)", run.stderr)[1])
    assert kept >= 6
    said = re.search(r"keeps (\d+) of the 12 sample examples", README.read_text())
    assert said and int(said[1]) == kept, "the README's figure for the stand-in run"
    assert "\r" not in run.stderr  # no progress bar when stderr is not a terminal
    # printed as its absolute path: the same wherever prb is started
    assert run.stdout.strip() == f"run directory: {walk.root / 'outputs' / 'sample'}"

    status = walk.results["prb status outputs/sample"].stdout
    for stage in ("ingest", "rubrics", "responses", "judge", "pairs"):
        assert re.search(rf"{stage}\s+done \(12 examples\)", status), status
    for stage, (requests, *_rest) in counts.items():
        assert re.search(rf"{stage}\s+done \(12 examples\); {requests} answers cached", status)
    assert "requests failed" not in status
    assert re.search(r"cache: \d+ answers, 0 failures recorded", status)

    summary = json.loads((walk.root / "summary.json").read_text())
    assert summary["ok"] is True and summary["error"] is None
    assert summary["stages_run"] == ["responses", "judge", "pairs"]
    assert summary["requests"]["sent"] == 0
    assert summary["requests"]["failed"] == 0
    assert summary["requests"]["cached"] == sum(c[0] for c in counts.values())
    assert summary["pairs_kept"] == kept
    assert summary["stages"]["judge"]["requests"]["cached"] == counts["judge"][0]
    redo = _request_counts(walk.results[next(c for c in walk.results if "--redo" in c)].stderr)
    assert all(sent == 0 and cached == requests for requests, sent, cached, _ in redo.values())


@pytest.mark.timeout(1200)
def test_inspect_names_source_rows_and_questions(walk):
    out = walk.results["prb inspect outputs/sample"].stdout
    ingest = {}
    for f in sorted((walk.root / "outputs/sample/ingest").glob("data-*.jsonl")):
        for line in f.read_text().splitlines():
            row = json.loads(line)
            ingest[row["example_id"]] = row
    rejects = [
        json.loads(line)
        for f in sorted((walk.root / "outputs/sample/pairs").glob("rejects-*.jsonl"))
        for line in f.read_text().splitlines()
    ]
    assert rejects, "the stand-in run is expected to drop some examples"
    assert out.startswith(f"pairs: {len(rejects)} of 12 examples dropped; by reason: ")
    for r in rejects:
        row = ingest[r["example_id"]]
        assert f"- {row['source_id']} (example {r['example_id']}) [{r['reason']}]" in out
        assert f"question: {row['question'][:40]}" in out
    assert not re.search(r"\b(\w+) \1\b", out.replace("examples", ""))  # no "length length"


@pytest.mark.timeout(1200)
def test_annotate_publish_audit_and_eval_of_the_sample_run(walk):
    tasks = json.loads((walk.root / "outputs/sample/annotate/round-1/tasks.json").read_text())
    # the sample's 10 kept pairs are all in round 1 (annotation.sample_size 200): no pair is
    # left outside it for a gold task, and the export says so in one line (issue 52)
    assert tasks and not any(t["data"].get("gold") for t in tasks)
    exported = _result(walk, "prb annotate export outputs/sample --round 1 --file-only").stdout
    assert "note: no gold attention check in this round" in exported

    before = walk.results["prb audit outputs/sample --out audit-before-publish"].stdout
    assert "no release" in before and "kept pairs" in before
    n_before = int(re.search(r"audited (\d+) pairs", before)[1])

    published = walk.results["prb publish outputs/sample"].stdout
    n = int(re.search(r"published (\d+) pairs", published)[1])
    assert n >= 6 and n == n_before
    loaded = _result(walk, 'python -c "import datasets').stdout
    assert f"num_rows: {n}" in loaded

    audit = walk.results["prb audit outputs/sample"].stdout
    assert f"audited {n} pairs from outputs/sample/publish" in audit
    for name in ("audit.html", "audit.json", "flags.jsonl"):
        assert (walk.root / "outputs/sample/report" / name).exists()

    ev = _result(walk, "prb eval outputs/sample").stdout
    assert f"evaluated {n} pairs" in ev
    results = json.loads(
        (walk.root / "outputs/sample/eval/judge-stand-in/question/results.json").read_text()
    )
    assert results  # the stand-in's judge: every pair a tie, all on position
    assert (walk.root / "outputs/sample/eval/leaderboard.md").exists()

    card = (walk.root / "outputs/quickstart/publish/README.md").read_text()
    body = card.split("---", 2)[2]
    first_paragraph = body.strip().split("\n\n")[1]
    assert "hand" in first_paragraph.lower() and "written" in first_paragraph.lower()
    # issue 12 item 9: thresholds and library versions as tables, not JSON lines
    assert "| setting | value |" in card and "| library |" in card
    shown = _result(walk, "prb config show configs/sample.yaml").stdout
    assert "n: 4" in shown and "quality_floor: 3" in shown


def test_the_batch_file_loop_runs_after_the_sample_in_a_run_of_its_own(walk):
    """The README's batch-file loop, run in the README's order, failed on its first command
    ("would re-do stage 'responses' of outputs/sample, which is finished"): the sample was
    run above it under the same name (issue 52). It has a run of its own now."""
    first = _result(walk, "prb batch export configs/sample.yaml")
    assert "of stage 'responses' to requests.jsonl" in first.stdout, first.stdout + first.stderr
    assert (walk.root / "outputs" / "sample-batch" / "batch").is_dir()
    lines = (walk.root / "requests.jsonl").read_text().splitlines()
    assert lines and all(json.loads(x)["body"]["model"] for x in lines)
    # the stand-in's sample run is the README's, untouched by the loop
    assert not (walk.root / "outputs" / "sample" / "batch").exists()


@pytest.mark.timeout(1200)
def test_every_command_in_the_docs_runs(walk):
    """After the README's walk, the other docs' commands in the same scratch folder."""
    ran = 0
    for doc in DOCS[1:]:
        for command in quoted_commands(doc):
            if why_not_run(command) is None:
                walk.run(command, doc)
                ran += 1
    assert ran >= 5
    assert len([c for c in walk.results if c not in walk.skipped]) >= MIN_RUN


def test_every_quoted_command_is_accounted_for():
    """Each command line is either run by the tests above or left out with a reason."""
    run, left_out = [], {}
    for doc in DOCS:
        for command in quoted_commands(doc):
            reason = why_not_run(command)
            if reason:
                left_out[command] = reason
            else:
                run.append(command)
                assert (
                    command in (MAIN, ACTIVATE)
                    or STANDIN.match(command)
                    or (command.split()[0] in ("prb", "python") and not command.endswith("&"))
                ), f"{doc.relative_to(ROOT)}: `{command}` is neither run nor explained"
    assert len(run) >= MIN_RUN, run
    assert "bash .ci/run" in left_out


# -- the docs stay true without running anything --------------------------------------------

PATH_RE = re.compile(
    r"`((?:pipeline|docs|tests|benchmarks|scripts|configs|examples|annotation|prompts|rubrics)"
    r"/[\w./-]*)`"
)


def test_paths_the_docs_name_exist():
    for doc in DOCS:
        for path in PATH_RE.findall(doc.read_text()):
            if path.startswith("benchmarks/results/") and path.endswith(".json"):
                continue  # a results file a benchmark writes when it runs
            assert (ROOT / path.rstrip("/")).exists(), f"{doc.relative_to(ROOT)} names {path}"
    assert "configs/run.yaml" not in (ROOT / "annotation" / "README.md").read_text()
    assert "to come" not in README.read_text()


def _subparsers(parser):
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices
    return {}


def test_the_flags_the_docs_show_exist():
    """Every `--flag` of a quoted or inline `prb ...` command is an option of that command."""
    from pipeline.cli.prb import build_parser

    root = build_parser()
    spans = re.compile(r"`(prb [^`]+)`")
    checked = 0
    for doc in DOCS:
        text = doc.read_text()
        lines = [c for c in quoted_commands(doc) if c.startswith("prb ")]
        lines += [s.replace("\\|", "|") for s in spans.findall(text)]
        for line in lines:
            parser, words = root, line.split()[1:]
            while words and words[0] in _subparsers(parser):
                parser, words = _subparsers(parser)[words[0]], words[1:]
            options = {s for a in parser._actions for s in a.option_strings}
            options |= {"--debug", "--version"}
            for word in words:
                flag = re.match(r"\[?(--[\w-]+)", word)
                if flag:
                    assert flag[1] in options, f"{doc.relative_to(ROOT)}: `{line}`: {flag[1]}"
                    checked += 1
    assert checked >= 30


def test_the_base_install_brings_what_the_standin_needs():
    """The README runs the stand-in right after `pip install -e .`: aiohttp must come with
    the base install (through openai's aiohttp extra), not only with the dev extra."""
    base = [r for r in metadata.requires("personalized-rewardbench") or [] if "extra ==" not in r]
    assert any(r.replace(" ", "").startswith("openai[aiohttp]") for r in base), base
    assert any(
        r.startswith("aiohttp") and "extra == 'aiohttp'" in r
        for r in metadata.requires("openai") or []
    )
    imports = re.findall(
        r"^(?:from|import) (\w+)",
        (ROOT / "tests/standin_server.py").read_text()
        + (ROOT / "tests/standin_player.py").read_text(),
        re.M,
    )
    third_party = {m for m in imports if m not in sys.stdlib_module_names}
    # and the project itself (the schema-instance generator it shares with the replay
    # tools: pipeline/backends/instance.py, standard library only)
    assert third_party <= {"aiohttp", "standin_player", "__future__", "pipeline"}, third_party


def _numbers(data: object) -> list[float]:
    if isinstance(data, dict):
        return [x for v in data.values() for x in _numbers(v)]
    if isinstance(data, list):
        return [x for v in data for x in _numbers(v)]
    if isinstance(data, (int, float)) and not isinstance(data, bool):
        return [float(data)]
    return []


def test_benchmark_figures_in_the_readme_come_from_the_results():
    """Each figure of the README's benchmark table is in its script's results file."""
    section = README.read_text().split("## Benchmarks", 1)[1].split("\n## ", 1)[0]
    rows = [r for r in section.splitlines() if r.startswith("| `")]
    assert len(rows) >= 7
    for row in rows:
        script, _what, figure = (c.strip() for c in row.strip("|").split("|"))
        name = script.strip("`").removesuffix(".py")
        assert (ROOT / "benchmarks" / f"{name}.py").exists(), script
        values = _numbers(json.loads((ROOT / "benchmarks/results" / f"{name}.json").read_text()))
        for token in re.findall(r"\d[\d,]*(?:\.\d+)?", figure):
            number = float(token.replace(",", ""))
            places = len(token.split(".")[1]) if "." in token else 0
            assert any(abs(v - number) <= 0.5 * 10**-places + 1e-9 for v in values), (
                f"{script}: {token} is not in benchmarks/results/{name}.json"
            )
