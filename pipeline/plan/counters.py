"""Counting a prompt's tokens for ``prb plan``: the backend's own tokenizer, a local
Hugging Face tokenizer, the stand-in server's word count, or characters at a measured or
typical ratio; ``choose_counter`` picks the best one available here."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from pipeline.backends.identity import is_standin
from pipeline.config import Config
from pipeline.kinds.backend import BACKENDS
from pipeline.run.cache import RequestCache
from pipeline.types.chat import ChatRequest

DEFAULT_CHARS_PER_TOKEN = 4.0  # English text with the current BPE tokenizers
# a slow tokenizer counts this many prompts of a stage exactly; the rest are counted by
# their characters at the ratio measured on those
EXACT_PROMPTS = 2000
# cached answers a characters-per-token estimate is calibrated on, and the fewest it needs
CALIBRATION_ANSWERS = 500
MIN_CALIBRATION = 20


class TokenCounter:
    """Prompt tokens of a request; ``method`` says how they are counted."""

    method: str = ""
    exact: bool = False

    def count(self, req: ChatRequest) -> int:
        raise NotImplementedError

    def text(self, text: str) -> int:
        raise NotImplementedError

    def fresh(self) -> TokenCounter:
        """A counter for the next stage (a sampled counter measures each stage anew)."""
        return self


class WordCounter(TokenCounter):
    """The stand-in server's own count: the words of each message (tests/standin_server.py)."""

    method = "the stand-in server's own count (words of each message)"
    exact = True

    def count(self, req: ChatRequest) -> int:
        return sum(len(c.split()) for _, c in req.messages)

    def text(self, text: str) -> int:
        return len(text.split())


class CharCounter(TokenCounter):
    def __init__(self, chars_per_token: float, method: str) -> None:
        self.chars_per_token = chars_per_token
        self.method = method

    def count(self, req: ChatRequest) -> int:
        return math.ceil(sum(len(c) for _, c in req.messages) / self.chars_per_token)

    def text(self, text: str) -> int:
        return math.ceil(len(text) / self.chars_per_token)


class SampledCounter(TokenCounter):
    """A real tokenizer (``exact_count``) on the first EXACT_PROMPTS prompts of a stage,
    then characters at the ratio measured on them: a tokenizer with a chat template takes
    about a millisecond a prompt, and a run has hundreds of thousands."""

    exact = True

    def __init__(self, exact_count: Any, exact_text: Any, method: str) -> None:
        self._exact, self._text, self.base = exact_count, exact_text, method
        self.counted = self.scaled = 0
        self._tokens = self._chars = 0

    @property
    def method(self) -> str:  # type: ignore[override]
        if not self.scaled:
            return self.base
        return (
            f"{self.base}; {self.counted:,} prompts counted, {self.scaled:,} more by "
            "their characters at the ratio measured on those"
        )

    def fresh(self) -> SampledCounter:
        return SampledCounter(self._exact, self._text, self.base)

    def count(self, req: ChatRequest) -> int:
        chars = sum(len(c) for _, c in req.messages)
        if self.counted < EXACT_PROMPTS:
            n = int(self._exact(req))
            self.counted += 1
            self._tokens += n
            self._chars += chars
            return n
        self.scaled += 1
        return round(chars * self._tokens / max(self._chars, 1))

    def text(self, text: str) -> int:
        return int(self._text(text))


def hf_counter(name: str, local_files_only: bool = True) -> SampledCounter:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(name, local_files_only=local_files_only)
    templated = bool(getattr(tok, "chat_template", None))

    def count(req: ChatRequest) -> int:
        msgs = req.message_dicts()
        if templated:
            out: Any = tok.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True)
            # a list of ids, or (newer releases) a BatchEncoding holding them
            return len(out["input_ids"] if hasattr(out, "keys") else out)
        return sum(len(tok.encode(m["content"], add_special_tokens=False)) + 4 for m in msgs)

    def text(s: str) -> int:
        return len(tok.encode(s, add_special_tokens=False))

    how = "with its chat template" if templated else "contents, +4 tokens a message"
    return SampledCounter(count, text, f"the model's tokenizer (transformers, {name}; {how})")


def _hf_local(model: str) -> tuple[str, bool] | None:
    """(what to load, local files only) for a model whose tokenizer is on this machine: a
    model folder, or a name in the Hugging Face cache."""
    import os

    folder = Path(model).expanduser()
    if folder.is_dir():
        return str(folder), True
    if "/" not in model or model.startswith((".", "/")):
        return None
    hub = os.environ.get("HF_HUB_CACHE") or os.path.join(
        os.environ.get("HF_HOME") or str(Path.home() / ".cache" / "huggingface"), "hub"
    )
    if (Path(hub) / f"models--{model.replace('/', '--')}").is_dir():
        return model, True
    return None


def choose_counter(
    config: Config, identity: dict[str, Any], model: str, cache: RequestCache, served_by: str
) -> tuple[TokenCounter, list[str]]:
    """The best token count available here for ``model``, and notes on what was not."""
    notes: list[str] = []
    if is_standin(identity):
        return WordCounter(), notes
    own, more = BACKENDS.get(config.backend.name).token_counter(
        config.backend, model, config.resolve_input
    )
    if own is not None:
        return SampledCounter(own.prompt, own.text, own.method), notes
    notes += more
    local = _hf_local(model)
    if local is not None:
        try:
            return hf_counter(*local), notes
        except ImportError:
            notes.append(
                f"{model}: transformers is not installed, so its tokenizer cannot "
                "count (pip install transformers)"
            )
        except Exception as exc:  # no tokenizer files in the folder, an unknown format
            notes.append(f"{model}: no tokenizer could be loaded from it ({str(exc)[:120]})")
    sample = cache.prompt_sample(served_by, CALIBRATION_ANSWERS) if served_by else []
    chars = tokens = 0
    for request, n in sample:
        try:
            msgs = json.loads(request).get("messages") or []
        except ValueError:
            continue
        chars += sum(len(str(m.get("content") or "")) for m in msgs)
        tokens += n
    if len(sample) >= MIN_CALIBRATION and tokens > 0:
        cpt = chars / tokens
        return CharCounter(
            cpt,
            f"estimate: {cpt:.2f} characters per token, measured on "
            f"{len(sample)} answers of this backend in the run's cache",
        ), notes
    return CharCounter(
        DEFAULT_CHARS_PER_TOKEN,
        f"estimate: {DEFAULT_CHARS_PER_TOKEN:g} characters per token (typical of English "
        f"text); no tokenizer for '{model}' on this machine",
    ), notes
