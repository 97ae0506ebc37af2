"""Scorer specs: ``rm:PATH[,key=value...]`` for a reward model, ``judge:MODEL[,key=value...]``
for an LLM judge. Options are checked here, before any model loads, and every mistake is a
one-line error naming ``--scorer`` and what to write instead.

A judge's ``system_prompt=`` and ``user_prompt=`` files (the reference benchmark's style,
``pipeline.types.promptfiles``) are read and checked here too, so a missing file or a wrong
placeholder stops the run before the split loads; their hashes name the result folder.

Each kind of scorer is a ``ScorerKind`` class registered in ``SCORERS`` under its prefix: a
new kind is one registered class, and nothing here or in the CLI changes."""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

import yaml

from pipeline.core.errors import InputError
from pipeline.core.modelfiles import load_errors
from pipeline.core.registry import Registry
from pipeline.eval.pointwise import (
    ENGINES,
    Encoder,
    _import_torch_transformers,
    check_device,
    check_device_map,
    check_model_folder,
)

Options = dict[str, tuple[type, Any, str]]

# option -> (type, default, help); "vllm." options pass through to vllm.LLM(...) as they are.
RM_OPTIONS: Options = {
    "engine": (str, "transformers", "the engine that loads and scores the model (below)"),
    "batch_size": (int, 16, "sequences per forward pass (transformers)"),
    "max_length": (int, 0, "tokens kept per input, cut on the right (0: the model's limit)"),
    "device": (str, "", "cuda, cpu, cuda:1... (default: cuda when there is one)"),
    "dtype": (str, "", "bfloat16, float16 or float32 (default: bfloat16 on GPU, float32 on CPU)"),
    "special_tokens": (bool, False, "add the tokenizer's special tokens after the chat template "
                       "(the reference script does; it doubles BOS on Llama 3 templates)"),
    "template": (str, "chat", "chat: the model's chat template; pair: (user turn, answer) as a "
                 "text pair, for cross-encoder reward models without a chat template"),
    "reduce": (str, "exact", "score of a head with several classes: exact (softmax in "
               "float64) or reference (softmax in the model's dtype, as the reference script)"),
    "trust_remote_code": (bool, False, "let transformers run code shipped with the model"),
    "device_map": (str, "", "passed to from_pretrained as device_map (auto: spread a model too "
                   "big for one GPU over every GPU, as the reference script loads models); "
                   "inputs go to the model's first device; needs accelerate (in the eval "
                   "extra); not with device= or engine=vllm"),
    "crosscheck": (int, 0, "engine=vllm: also score this many pairs with transformers and "
                   "record how far the two engines differ"),
    "name": (str, "", "name on the leaderboard (default: the folder name)"),
}  # fmt: skip
JUDGE_OPTIONS: Options = {
    "format": (str, "json", "json: verdict under a JSON schema; text: a free-text 'Result: A' "
               "line, for judges without structured output"),
    "ties": (bool, False, "let the judge answer 'tie' as well as A or B"),
    "max_tokens": (int, 512, "longest judge answer in tokens"),
    "temperature": (float, 0.0, "sampling temperature (greedy by default: reproducible)"),
    "parse": (str, "last", "format=text: read the last 'Result:' of the answer, or the first "
              "(as the reference script does)"),
    "unparsed": (str, "fail", "a verdict that cannot be parsed: fail (a failure, left out of "
                 "every rate) or a (read as 'A', as the reference script does); counted "
                 "either way"),
    "system_prompt": (str, "", "a prompt file sent as the judge's system turn, as written (no "
                      "placeholders); needs user_prompt= and format=text"),
    "user_prompt": (str, "", "a prompt file sent as the user turn with {question}, "
                    "{Response_A} and {Response_B} filled, and {profile} / {rubric} where it "
                    "has them (the profile / rubric settings need them); needs system_prompt= "
                    "and format=text"),
    "name": (str, "", "name on the leaderboard (default: the model name)"),
}  # fmt: skip
GEN_OPTIONS: Options = {
    "template": (str, "", "a prompt file with {question} and {answer}, and {profile} / "
                 "{rubric} where it shows them (default: the project's prompts/gen_score.txt)"),
    "max_tokens": (int, 10, "longest answer in tokens (the reference reads its number from 10)"),
    "temperature": (float, 0.0, "sampling temperature (greedy by default: reproducible)"),
    "name": (str, "", "name on the leaderboard (default: the model name)"),
}  # fmt: skip
# Whole-number options where 0 means nothing (the others take 0: "the model's limit", "none").
_AT_LEAST_ONE = {"batch_size": 1}
# The judge's prompt files: the placeholders the user file must hold, and those it may.
PROMPT_FILE_OPTIONS = ("system_prompt", "user_prompt")
USER_PROMPT_NEEDS = ("question", "Response_A", "Response_B")
USER_PROMPT_FILLS = ("profile", "rubric")  # each filled in its own setting, else empty
# Judge options that are the config's sampling fields, bounded as those are.
_SAMPLING_FIELDS = ("temperature", "max_tokens")
# Options that change no figure: left out of the result folder's name.
_NOT_IN_SLUG = {"batch_size", "crosscheck", "name", "device", "device_map"}


@dataclass(frozen=True)
class ScorerSpec:
    prefix: str  # the scorer kind's name in SCORERS: "rm", "judge"
    target: str  # model folder (rm) or model name (judge; "" = the config's model)
    options: dict[str, Any] = field(default_factory=dict)
    # ENGINE.KEY=VALUE options, passed to the engine as they are (rm: vllm.KEY=VALUE)
    engine_args: dict[str, Any] = field(default_factory=dict)
    text: str = ""
    # the judge's prompt files, read and checked (option name -> promptfiles.PromptFile)
    prompts: dict[str, Any] = field(default_factory=dict)

    @property
    def scorer(self) -> type[ScorerKind]:
        return SCORERS.get(self.prefix)

    @property
    def kind(self) -> str:  # pointwise or pairwise: the scorer's kind in results.json
        return self.scorer.scoring

    def opt(self, name: str) -> Any:
        return self.options.get(name, self.scorer.options[name][1])

    def display_name(self, judge_model: str = "") -> str:
        if self.options.get("name"):
            return str(self.options["name"])
        return self.scorer.display_name(self.target, judge_model)

    def slug(self, judge_model: str = "") -> str:
        """The result folder's name: kind, model and every option that changes a figure (a
        prompt file by the first 12 hex digits of its SHA-256, not its path: an edited file
        gets a folder, and a cache, of its own)."""
        parts = [self.prefix, self.display_name(judge_model).replace("/", "--")]
        for k in sorted(self.options):
            if k in self.prompts:
                parts.append(f"{k}={self.prompts[k].sha256[:12]}")
            elif k not in _NOT_IN_SLUG:
                parts.append(f"{k}={self.options[k]}")
        slug = "-".join(parts).lower()
        return re.sub(r"[^a-z0-9._=+-]+", "-", slug).strip("-.") or self.prefix


class ScorerKind:
    """A kind of scorer, registered in ``SCORERS`` under its spec's prefix (``rm``, ``judge``):
    parse_spec, ``--scorer-help`` and prb eval find it there, and nowhere else."""

    name: ClassVar[str] = ""
    scoring: ClassVar[str] = ""  # pointwise or pairwise: the scorer's kind in results.json
    usage: ClassVar[str] = ""  # what --scorer takes, e.g. rm:MODEL_FOLDER
    options: ClassVar[Options] = {}
    choices: ClassVar[dict[str, Collection[Any]]] = {}  # option -> the values it may take
    # "module:function" scoring a split with it (as evaluate.score_rm), imported when it runs
    evaluator: ClassVar[str] = ""
    # "module:function" scoring single answers for prb eval bon (pipeline.eval.bonscore):
    # (spec, answers, context) -> scores; "" for a kind that compares two answers
    answer_scorer: ClassVar[str] = ""
    # the prompt file (in ScorerSpec.prompts) whose {profile} / {rubric} placeholders show
    # those settings: a file without one cannot show its setting ("" for none)
    settings_file: ClassVar[str] = ""
    # whether it asks a model through the configured backend (its requests are cached)
    asks_backend: ClassVar[bool] = False

    @classmethod
    def passes(cls, key: str) -> bool:
        """Whether ``key``, not one of its options, goes to its engine as it is (``vllm.*``)."""
        return False

    @classmethod
    def check(cls, spec: ScorerSpec) -> ScorerSpec:
        """Refuse options that cannot go together; the spec to keep (its files read)."""
        return spec

    @classmethod
    def preflight(cls, spec: ScorerSpec) -> None:
        """What prb eval checks before the split loads (a model folder, an extra)."""

    @classmethod
    def load_check(cls, spec: ScorerSpec) -> None:
        """A cheap load of what the scorer needs (a tokenizer, a config), for a command that
        would otherwise find it broken only after hours of work (prb eval bon's samples)."""

    @classmethod
    def display_name(cls, target: str, judge_model: str = "") -> str:
        return target or judge_model

    @classmethod
    def help(cls) -> list[str]:
        rows = [f"  {k}={d!r}: {h}" for k, (_, d, h) in cls.options.items()]
        return [f"{cls.name} options:", *rows]


SCORERS: Registry[type[ScorerKind]] = Registry("scorer", ScorerKind, field="--scorer")


@SCORERS.register("rm")
class RewardModel(ScorerKind):
    """``rm:PATH``: a reward model scores each answer alone (``pipeline.eval.pointwise``)."""

    name, scoring, usage, options = "rm", "pointwise", "rm:MODEL_FOLDER", RM_OPTIONS
    choices = {
        "engine": ENGINES,
        "dtype": ("", "bfloat16", "float16", "float32"),
        "template": ("chat", "pair"),
        "reduce": ("exact", "reference"),
    }
    evaluator = "pipeline.eval.evaluate:score_rm"
    answer_scorer = "pipeline.eval.bonscore:rm_scores"

    @classmethod
    def passes(cls, key: str) -> bool:
        engine, dot, _ = key.partition(".")
        return bool(dot) and engine in ENGINES and bool(ENGINES.get(engine).args)

    @classmethod
    def check(cls, spec: ScorerSpec) -> ScorerSpec:
        if not spec.target:
            raise InputError("rm: needs a model folder, e.g. rm:/models/my-rm", path="--scorer")
        engine = ENGINES.get(spec.opt("engine"))
        for own in sorted({k.partition(".")[0] for k in spec.engine_args} - {engine.name}):
            raise InputError(
                f"{own}.* options need engine={own} in the same --scorer", path="--scorer"
            )
        if spec.opt("crosscheck") and not engine.crosschecks:
            raise InputError(
                "option 'crosscheck' scores pairs again with transformers to compare them with "
                f"engine=vllm; engine={engine.name} is transformers already: leave it out",
                path="--scorer",
                field="crosscheck",
            )
        other = "" if "device_map" in engine.takes else f"engine={engine.name}"
        other = "device" if spec.opt("device") else other
        if spec.opt("device_map") and other:
            raise InputError(
                f"option 'device_map' places a transformers model itself: leave out {other} "
                "in the same --scorer",
                path="--scorer",
                field="device_map",
            )
        args = {k.partition(".")[2]: v for k, v in spec.engine_args.items()}
        return replace(spec, engine_args=args)

    @classmethod
    def preflight(cls, spec: ScorerSpec) -> None:
        check_model_folder(Path(spec.target).expanduser())
        check_device_map(spec.opt("device_map"))
        check_device(spec.opt("device"), "device")
        check_device(spec.opt("device_map"), "device_map")

    @classmethod
    def load_check(cls, spec: ScorerSpec) -> None:
        """The tokenizer (and its chat template) and the model's config load: one line
        naming the folder when they do not."""
        path = Path(spec.target).expanduser()
        try:
            Encoder(
                path,
                max_length=spec.opt("max_length"),
                special_tokens=spec.opt("special_tokens"),
                template=spec.opt("template"),
                trust_remote_code=spec.opt("trust_remote_code"),
            )
            _, transformers = _import_torch_transformers()
            transformers.AutoConfig.from_pretrained(
                str(path), local_files_only=True, trust_remote_code=spec.opt("trust_remote_code")
            )
        except load_errors() as exc:
            first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else repr(exc)
            raise InputError(
                f"cannot load the model's tokenizer and config: {first}",
                path=path,
                field="--scorer rm",
            ) from None

    @classmethod
    def display_name(cls, target: str, judge_model: str = "") -> str:
        return Path(target).name or target

    @classmethod
    def help(cls) -> list[str]:
        lines = [*super().help(), *(f"  engine={n}: {e.about}" for n, e in ENGINES.items())]
        args = [(n, e.args) for n, e in ENGINES.items() if e.args]
        return lines + [f"  {n}.KEY=VALUE: passed to {a} with engine={n}" for n, a in args]


@SCORERS.register("judge")
class LLMJudge(ScorerKind):
    """``judge:MODEL``: an LLM judge through the configured backend, each pair asked in both
    orders (``pipeline.eval.pairwise``)."""

    name, scoring, usage, options = "judge", "pairwise", "judge:MODEL_NAME", JUDGE_OPTIONS
    choices = {"format": ("json", "text"), "parse": ("last", "first"), "unparsed": ("fail", "a")}
    evaluator = "pipeline.eval.evaluate:score_judge"
    settings_file = "user_prompt"
    asks_backend = True

    @classmethod
    def check(cls, spec: ScorerSpec) -> ScorerSpec:
        if "parse" in spec.options and spec.options.get("format") != "text":
            raise InputError(
                "option 'parse' reads free-text verdicts: it needs format=text in the same "
                "--scorer",
                path="--scorer",
                field="parse",
            )
        return replace(spec, prompts=_read_prompt_files(spec.options))

    @classmethod
    def preflight(cls, spec: ScorerSpec) -> None:
        if spec.opt("format") == "json":  # room for a verdict in max_tokens?
            from pipeline.eval.pairwise import verdict_schema

            verdict_schema(spec.opt("max_tokens"), spec.opt("ties"))


@SCORERS.register("gen")
class GenerativeRewardModel(ScorerKind):
    """``gen:MODEL``: an LLM rates each answer alone with a number in [0, 1], from a
    template, through the configured backend (``pipeline.eval.generative``)."""

    name, scoring, usage, options = "gen", "pointwise", "gen:MODEL_NAME", GEN_OPTIONS
    evaluator = "pipeline.eval.evaluate:score_gen"
    answer_scorer = "pipeline.eval.bonscore:gen_scores"
    settings_file = "template"
    asks_backend = True

    @classmethod
    def check(cls, spec: ScorerSpec) -> ScorerSpec:
        from pipeline.eval.generative import read_template

        template = read_template(spec.opt("template"))
        return replace(spec, prompts={"template": template})


def _coerce(kind: type[ScorerKind], spec: str, key: str, raw: str) -> Any:
    typ = kind.options[key][0]
    if typ is str:
        value: Any = raw
    else:
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError:
            value = None
        if typ is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, typ) or (typ is int and isinstance(value, bool)):
            raise InputError(
                f"option '{key}' expects {typ.__name__}, got {raw!r} (in {spec!r})",
                path="--scorer",
                field=key,
            )
    allowed = kind.choices.get(key, ())
    choices = [c for c in allowed if c]
    if choices and value not in allowed:
        close = difflib.get_close_matches(str(value), choices, n=1)
        hint = f". Did you mean '{close[0]}'?" if close else ""
        raise InputError(
            f"option '{key}' must be one of {', '.join(choices)}, got {raw!r}{hint}",
            path="--scorer",
            field=key,
        )
    least = _AT_LEAST_ONE.get(key, 0)
    if typ is int and value < least:
        raise InputError(
            f"option '{key}' must be >= {least}, got {raw!r}", path="--scorer", field=key
        )
    if key in _SAMPLING_FIELDS:
        _check_sampling(key, raw, value)
    return value


def _check_sampling(key: str, raw: str, value: Any) -> None:
    """A judge's sampling option within the bounds of the config's own field
    (``pipeline.config.SamplingSection``: the same validators, not a copy of them), so
    ``temperature=.nan`` or ``max_tokens=1e23`` is refused here, not by every request."""
    from pydantic import ValidationError

    from pipeline.config import SamplingSection

    try:
        SamplingSection.model_validate({key: value})
    except ValidationError as exc:
        why = exc.errors()[0]["msg"].replace("Input should be", "must be")
        raise InputError(
            f"option '{key}' {why}, got {raw!r} (bounded as the config's sampling.{key})",
            path="--scorer",
            field=key,
        ) from None


def parse_spec(text: str) -> ScorerSpec:
    """``PREFIX:TARGET[,k=v...]`` of a kind in SCORERS (``rm:PATH``, ``judge:MODEL``);
    raises InputError on any mistake."""
    prefix, sep, rest = text.partition(":")
    if not sep or prefix not in SCORERS:
        usages = " or ".join(k.usage or f"{k.name}:TARGET" for k in SCORERS.values())
        hint = f"; {SCORERS.unknown(prefix)}" if sep else ""
        raise InputError(f"expected {usages}, got {text!r}{hint}", path="--scorer")
    kind = SCORERS.get(prefix)
    target, *opts = rest.split(",")
    table = kind.options
    options: dict[str, Any] = {}
    engine_args: dict[str, Any] = {}
    for opt in opts:
        key, eq, raw = opt.partition("=")
        key = key.strip()
        if not eq or not key:
            raise InputError(
                f"option {opt!r} must be key=value (in {text!r}); known: {', '.join(table)}",
                path="--scorer",
            )
        if kind.passes(key):
            engine_args[key] = yaml.safe_load(raw) if raw.strip() else ""
            continue
        if key not in table:
            close = difflib.get_close_matches(key, list(table), n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise InputError(
                f"unknown option '{key}' for {prefix}:{hint} (known: {', '.join(table)})",
                path="--scorer",
                field=key,
            )
        if key in PROMPT_FILE_OPTIONS and not raw.strip():
            raise InputError(
                f"option '{key}' needs the prompt file's path (in {text!r})",
                path="--scorer",
                field=key,
            )
        if key in options:
            raise InputError(
                f"option '{key}' is given twice (in {text!r}); keep one",
                path="--scorer",
                field=key,
            )
        options[key] = _coerce(kind, text, key, raw.strip())
    return kind.check(ScorerSpec(prefix, target.strip(), options, engine_args, text))


def _read_prompt_files(options: dict[str, Any]) -> dict[str, Any]:
    """A judge's system_prompt= and user_prompt= files, read and checked (both or
    neither, with format=text: the files ask for a free-text verdict line)."""
    given = [k for k in PROMPT_FILE_OPTIONS if options.get(k)]
    if not given:
        return {}
    if len(given) == 1:
        missing = next(k for k in PROMPT_FILE_OPTIONS if k not in given)
        raise InputError(
            f"option '{given[0]}' needs '{missing}' in the same --scorer: the judge is sent "
            "the system file's text, then the user file filled",
            path="--scorer",
            field=missing,
        )
    if options.get("format") != "text":
        raise InputError(
            "prompt files ask for a free-text verdict ('Result: A'): add format=text to the "
            "same --scorer (format=json sends the project's own prompt and schema)",
            path="--scorer",
            field="format",
        )
    from pipeline.types.promptfiles import read_prompt_file

    return {
        "system_prompt": read_prompt_file(
            options["system_prompt"],
            needs=(),
            what="the judge's system prompt (sent as written)",
        ),
        "user_prompt": read_prompt_file(
            options["user_prompt"],
            needs=USER_PROMPT_NEEDS,
            fills=USER_PROMPT_FILLS,
            what="the judge's user prompt",
        ),
    }


def check_prompt_settings(spec: ScorerSpec, settings: list[str]) -> None:
    """A judge with a user prompt file evaluates the profile setting only when the file
    has a ``{profile}`` placeholder, and the rubric control only with ``{rubric}``: a file
    without a place for them (the reference's) would silently show the question alone."""
    user = spec.prompts.get(spec.scorer.settings_file)
    if user is None:
        return
    for setting in settings:
        if setting in USER_PROMPT_FILLS and setting not in user.placeholders:
            raise InputError(
                f"has no {{{setting}}} placeholder, so the '{setting}' setting would show the "
                "question alone; evaluate only --setting question with it (the reference "
                f"protocol), or add {{{setting}}} where the {setting} belongs",
                path=user.path,
                field=spec.scorer.settings_file,
            )


def describe_options() -> str:
    """Every scorer kind's options, for prb eval --scorer-help."""
    return "\n".join(line for kind in SCORERS.values() for line in kind.help())


def check_unique_names(
    specs: Sequence[ScorerSpec], judge_model: Callable[[ScorerSpec], str] | str = ""
) -> None:
    """No two scorers given twice, with one results folder or one name: a scorer's files
    sit in its folder (``slug``) and its rows (a leaderboard's, a correlate table's) carry
    its name, so the second would replace or shadow the first. ``judge_model``: the model a
    judge spec without one runs (a callable of the spec, or one name). One line, before
    anything loads."""
    model_of = judge_model if callable(judge_model) else (lambda _spec: str(judge_model))
    folders: dict[str, ScorerSpec] = {}
    names: dict[str, ScorerSpec] = {}
    for spec in specs:
        model = model_of(spec)
        slug, name = spec.slug(model), spec.display_name(model)
        first = folders.setdefault(slug, spec)
        if first is not spec:
            raise InputError(
                (
                    f"'{spec.text}' is given twice"
                    if first.text == spec.text
                    else f"'{first.text}' and '{spec.text}' would share one results folder "
                    f"({slug}/), and the second would replace the first's results"
                )
                + "; give each scorer once, with a name= of its own",
                path="--scorer",
            )
        if name in names:
            raise InputError(
                f"two scorers are named {name!r} ({names[name].text!r} and {spec.text!r}); "
                "give one of them another name with name=..., e.g. "
                f"{spec.text},name={name}-2",
                path="--scorer",
            )
        names[name] = spec
