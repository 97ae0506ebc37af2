"""Scorer specs: ``rm:PATH[,key=value...]`` for a reward model, ``judge:MODEL[,key=value...]``
for an LLM judge. Options are checked here, before any model loads, and every mistake is a
one-line error naming ``--scorer`` and what to write instead.

A judge's ``system_prompt=`` and ``user_prompt=`` files (the reference benchmark's style,
``pipeline.promptfiles``) are read and checked here too, so a missing file or a wrong
placeholder stops the run before the split loads; their hashes name the result folder."""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from pipeline.errors import InputError

KINDS = {"rm": "pointwise", "judge": "pairwise"}

# option -> (type, default, help); "vllm." options pass through to vllm.LLM(...) as they are.
RM_OPTIONS: dict[str, tuple[type, Any, str]] = {
    "engine": (str, "transformers", "transformers or vllm"),
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
JUDGE_OPTIONS: dict[str, tuple[type, Any, str]] = {
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
# The judge's prompt files: the placeholders the user file must hold, and those it may.
PROMPT_FILE_OPTIONS = ("system_prompt", "user_prompt")
USER_PROMPT_NEEDS = ("question", "Response_A", "Response_B")
USER_PROMPT_FILLS = ("profile", "rubric")  # each filled in its own setting, else empty
_CHOICES = {
    "engine": ("transformers", "vllm"),
    "dtype": ("", "bfloat16", "float16", "float32"),
    "template": ("chat", "pair"),
    "format": ("json", "text"),
    "reduce": ("exact", "reference"),
    "parse": ("last", "first"),
    "unparsed": ("fail", "a"),
}
# Judge options that are the config's sampling fields, bounded as those are.
_SAMPLING_FIELDS = ("temperature", "max_tokens")
# Options that change no figure: left out of the result folder's name.
_NOT_IN_SLUG = {"batch_size", "crosscheck", "name", "device", "device_map"}


@dataclass(frozen=True)
class ScorerSpec:
    kind: str  # "pointwise" or "pairwise"
    target: str  # model folder (rm) or model name (judge; "" = the config's model)
    options: dict[str, Any] = field(default_factory=dict)
    vllm_args: dict[str, Any] = field(default_factory=dict)
    text: str = ""
    # the judge's prompt files, read and checked (option name -> promptfiles.PromptFile)
    prompts: dict[str, Any] = field(default_factory=dict)

    def opt(self, name: str) -> Any:
        table = RM_OPTIONS if self.kind == "pointwise" else JUDGE_OPTIONS
        return self.options.get(name, table[name][1])

    @property
    def prefix(self) -> str:
        return "rm" if self.kind == "pointwise" else "judge"

    def display_name(self, judge_model: str = "") -> str:
        if self.opt("name"):
            return str(self.opt("name"))
        if self.kind == "pointwise":
            return Path(self.target).name or self.target
        return self.target or judge_model

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


def _coerce(spec: str, key: str, raw: str, typ: type) -> Any:
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
    choices = _CHOICES.get(key)
    if choices and value not in choices:
        shown = ", ".join(c for c in choices if c)
        raise InputError(
            f"option '{key}' must be one of {shown}, got {raw!r}", path="--scorer", field=key
        )
    if typ is int and value < 0:
        raise InputError(f"option '{key}' must be >= 0, got {raw!r}", path="--scorer", field=key)
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
    """``rm:PATH[,k=v...]`` or ``judge:MODEL[,k=v...]``; raises InputError on any mistake."""
    kind, sep, rest = text.partition(":")
    if not sep or kind not in KINDS:
        raise InputError(
            f"expected rm:MODEL_FOLDER or judge:MODEL_NAME, got {text!r}", path="--scorer"
        )
    target, *opts = rest.split(",")
    target = target.strip()
    if kind == "rm" and not target:
        raise InputError("rm: needs a model folder, e.g. rm:/models/my-rm", path="--scorer")
    table = RM_OPTIONS if kind == "rm" else JUDGE_OPTIONS
    options: dict[str, Any] = {}
    vllm_args: dict[str, Any] = {}
    for opt in opts:
        key, eq, raw = opt.partition("=")
        key = key.strip()
        if not eq or not key:
            raise InputError(
                f"option {opt!r} must be key=value (in {text!r}); known: {', '.join(table)}",
                path="--scorer",
            )
        if kind == "rm" and key.startswith("vllm."):
            vllm_args[key[5:]] = yaml.safe_load(raw) if raw.strip() else ""
            continue
        if key not in table:
            close = difflib.get_close_matches(key, list(table), n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise InputError(
                f"unknown option '{key}' for {kind}:{hint} (known: {', '.join(table)})",
                path="--scorer",
                field=key,
            )
        options[key] = _coerce(text, key, raw.strip(), table[key][0])
    if "parse" in options and options.get("format") != "text":
        raise InputError(
            "option 'parse' reads free-text verdicts: it needs format=text in the same --scorer",
            path="--scorer",
            field="parse",
        )
    if vllm_args and options.get("engine") != "vllm":
        raise InputError("vllm.* options need engine=vllm in the same --scorer", path="--scorer")
    if options.get("device_map"):
        other = ""
        if options.get("device"):
            other = "device"
        elif options.get("engine") == "vllm":
            other = "engine=vllm"
        if other:
            raise InputError(
                f"option 'device_map' places a transformers model itself: leave out {other} "
                "in the same --scorer",
                path="--scorer",
                field="device_map",
            )
    prompts = _read_prompt_files(options) if kind == "judge" else {}
    return ScorerSpec(KINDS[kind], target, options, vllm_args, text, prompts)


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
    from pipeline.promptfiles import read_prompt_file

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
    user = spec.prompts.get("user_prompt")
    if user is None:
        return
    for setting in settings:
        if setting in USER_PROMPT_FILLS and setting not in user.placeholders:
            raise InputError(
                f"has no {{{setting}}} placeholder, so the '{setting}' setting would show the "
                "question alone; evaluate only --setting question with it (the reference "
                f"protocol), or add {{{setting}}} where the {setting} belongs",
                path=user.path,
                field="user_prompt",
            )


def describe_options() -> str:
    """The options of both kinds, for --help."""
    lines = ["rm options:"]
    lines += [f"  {k}={d!r}: {h}" for k, (_, d, h) in RM_OPTIONS.items()]
    lines += ["  vllm.KEY=VALUE: passed to vllm.LLM(...) with engine=vllm", "judge options:"]
    lines += [f"  {k}={d!r}: {h}" for k, (_, d, h) in JUDGE_OPTIONS.items()]
    return "\n".join(lines)
