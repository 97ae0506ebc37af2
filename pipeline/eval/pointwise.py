"""Pointwise reward models: a sequence-classification model scores each answer on its own.

The input is a two-turn conversation (the user turn from ``data.user_turn``, then the answer
as the assistant turn) rendered with the model's own chat template and tokenised once, here,
for every engine: the transformers engine and the optional vLLM pooling engine score the very
same token ids. The score is the single logit, or the last class's softmax probability when
the head has several classes (as the reference script reads it): in float64 by default
(``reduce=exact``), or in the model's dtype as the reference computes it
(``reduce=reference``; in bf16 close probabilities round into ties).

transformers runs bf16 on a GPU and float32 on the CPU, in batches of inputs sorted by
length (so a batch pads to lengths close to its own), right-padded with the attention mask.
With ``device_map=`` (``auto``, as the reference script loads models too big for one GPU)
transformers places the model itself through accelerate, and inputs go to the device of its
input embeddings (its first).

Each engine is an ``RMEngine`` in ``ENGINES`` (``engine=NAME``): what it takes is in its class.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from pipeline.core.errors import BackendError, InputError
from pipeline.core.modelfiles import check_weights, load_errors
from pipeline.core.registry import Registry

EXTRA_HINT = "pip install 'personalized-rewardbench[eval]'"
VLLM_HINT = "pip install 'personalized-rewardbench[vllm]' (needs a CUDA GPU)"
ACCELERATE_HINT = "pip install 'personalized-rewardbench[eval]' (or pip install accelerate)"
DEFAULT_MAX_LENGTH = 8192  # the reference script's cut, used when the model states no limit

Conversation = tuple[str, str]  # (user turn, answer)


def _import_torch_transformers() -> tuple[Any, Any]:
    try:
        import torch
        import transformers
    except ImportError as exc:
        raise BackendError(
            f"--scorer rm: needs torch and transformers ({exc.name} is missing): {EXTRA_HINT}"
        ) from None
    return torch, transformers


def check_model_folder(path: Path) -> None:
    if not path.is_dir():
        raise InputError(
            "no such model folder; pass a local folder holding config.json and the weights "
            "(download it first, e.g. `hf download ORG/NAME --local-dir DIR`)",
            path=path,
            field="--scorer rm",
        )
    if not (path / "config.json").exists():
        raise InputError(
            "not a model folder (no config.json); pass the folder save_pretrained wrote",
            path=path,
            field="--scorer rm",
        )
    check_weights(path)


def check_device_map(device_map: str) -> None:
    """``device_map=`` loads through accelerate (transformers refuses it without): one line
    naming what to install, before anything loads."""
    if not device_map:
        return
    import importlib.util

    if importlib.util.find_spec("accelerate") is None:
        raise BackendError(
            f"--scorer rm:...,device_map={device_map} needs accelerate, which transformers "
            f"uses to place the model: {ACCELERATE_HINT}"
        )


# device_map values that name a placement strategy rather than one device (accelerate's)
PLACEMENTS = ("auto", "balanced", "balanced_low_0", "sequential")


def check_device(value: str, option: str) -> None:
    """``device=`` (or a ``device_map=`` naming one device) that torch can use on this
    machine: one line before anything loads, where torch's own refusal is a traceback."""
    if not value or (option == "device_map" and value in PLACEMENTS):
        return
    try:
        import torch
    except ImportError:
        return  # the engine's own import check names the extra to install
    try:
        device = torch.device(value)
    except (RuntimeError, ValueError):
        raise InputError(
            f"option '{option}={value}' is not a device torch knows (cpu, cuda, cuda:1, mps...)",
            path="--scorer",
            field=option,
        ) from None
    if device.type not in ("cpu", "cuda") and not _available(torch, device.type):
        # mps on a machine (or a torch build) without it, xpu, meta...: torch would refuse
        # only after the model loaded, with a traceback
        raise InputError(
            f"option '{option}={value}': torch {torch.__version__} cannot use a "
            f"'{device.type}' device on this machine; use {option}=cpu"
            + (", a cuda device" if torch.cuda.is_available() else "")
            + " or leave the option out",
            path="--scorer",
            field=option,
        )
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise InputError(
                f"option '{option}={value}': torch {torch.__version__} sees no CUDA device on "
                f"this machine; use {option}=cpu or leave the option out",
                path="--scorer",
                field=option,
            )
        if device.index is not None and device.index >= count:
            raise InputError(
                f"option '{option}={value}': this machine has {count} CUDA device(s), "
                f"cuda:0 to cuda:{count - 1}",
                path="--scorer",
                field=option,
            )


def _available(torch: Any, kind: str) -> bool:
    """Whether this torch can place tensors on a device of ``kind`` (mps, xpu...) here."""
    if kind == "mps":
        backend = getattr(torch.backends, "mps", None)
        return bool(backend is not None and backend.is_available())
    probe = getattr(getattr(torch, kind, None), "is_available", None)
    try:
        return bool(callable(probe) and probe())
    except (RuntimeError, AssertionError):
        return False


def _first_device(model: Any) -> Any:
    """Where a placed model takes its inputs: its input embeddings' device (the first
    device of a model spread over several), else its first parameter's."""
    try:
        return model.get_input_embeddings().weight.device
    except (AttributeError, NotImplementedError):
        return next(model.parameters()).device


REDUCTIONS = ("exact", "reference")
REDUCTION_LABELS = {
    "exact": "exact: single logit, or softmax(logits)[-1] in float64",
    "reference": "reference: single logit, or softmax(logits)[-1] in the model's dtype, as "
    "the reference script computes it",
}


def reduce_logits(row: Sequence[float]) -> float:
    """One score from a classification head's logits (the ``exact`` reduction): the logit
    itself for a single output, else the last class's softmax probability in float64."""
    if len(row) == 1:
        return float(row[0])
    top = max(row)
    import math

    exps = [math.exp(x - top) for x in row]
    return exps[-1] / sum(exps)


def reduce_reference(torch: Any, logits: Any) -> list[float]:
    """The reference script's reduction of a batch of logits in the model's dtype: the
    logit for a single output, else ``torch.softmax(row, -1)[-1].item()`` computed in that
    dtype. In bf16 the probability keeps 8 bits of mantissa, so close answers tie."""
    if logits.shape[-1] == 1:
        return [float(x) for x in logits[:, 0].float().tolist()]
    return [float(torch.softmax(row, dim=-1)[-1].item()) for row in logits]


class Encoder:
    """The model's tokenizer and the one way conversations become token ids."""

    def __init__(
        self,
        path: Path,
        *,
        max_length: int = 0,
        special_tokens: bool = False,
        template: str = "chat",
        trust_remote_code: bool = False,
    ) -> None:
        check_model_folder(path)
        _, transformers = _import_torch_transformers()
        self.path = path
        tok = transformers.AutoTokenizer.from_pretrained(
            str(path), local_files_only=True, trust_remote_code=trust_remote_code
        )
        if template == "chat" and not getattr(tok, "chat_template", None):
            raise InputError(
                "the tokenizer has no chat template; add one to tokenizer_config.json, or "
                "score (user turn, answer) as a text pair with template=pair",
                path=path,
                field="--scorer rm",
            )
        if tok.pad_token_id is None:
            if tok.eos_token_id is None:
                raise InputError(
                    "the tokenizer has neither a pad nor an eos token; set pad_token in "
                    "tokenizer_config.json",
                    path=path,
                    field="--scorer rm",
                )
            tok.pad_token = tok.eos_token  # what the reference scripts do too
        tok.padding_side = "right"
        self.tok = tok
        self.template = template
        self.special_tokens = special_tokens
        limit = getattr(tok, "model_max_length", 0) or 0
        self.max_length = max_length or (limit if 0 < limit <= 1_000_000 else DEFAULT_MAX_LENGTH)
        self.truncated = 0

    def texts(self, convs: Sequence[Conversation]) -> list[str]:
        """The chat-templated text of each conversation (template=chat)."""
        return [
            self.tok.apply_chat_template(
                [{"role": "user", "content": u}, {"role": "assistant", "content": a}],
                tokenize=False,
            )
            for u, a in convs
        ]

    def encode(self, convs: Sequence[Conversation]) -> list[list[int]]:
        """Token ids of each conversation, cut on the right at ``max_length`` (counted in
        ``truncated``), exactly as the model will see them."""
        if self.template == "pair":
            enc = self.tok([u for u, _ in convs], [a for _, a in convs], truncation=False)
        else:
            enc = self.tok(self.texts(convs), add_special_tokens=self.special_tokens)
        ids = [list(x) for x in enc["input_ids"]]
        over = [i for i, x in enumerate(ids) if len(x) > self.max_length]
        self.truncated += len(over)
        for i in over:
            ids[i] = ids[i][: self.max_length]
        return ids


class RMEngine:
    """A reward-model engine: loads the model and scores the ``Encoder``'s token ids.
    Subclass it and register it in ``ENGINES``; what it takes is in its attributes."""

    name: ClassVar[str] = ""
    about: ClassVar[str] = ""  # one line for prb eval --scorer-help
    takes: ClassVar[tuple[str, ...]] = ()  # the rm: options it is built with
    args: ClassVar[str] = ""  # what NAME.KEY=VALUE options pass to ("": none taken)
    crosschecks: ClassVar[bool] = False  # crosscheck=N scores N pairs again with transformers
    engine_args: dict[str, Any] | None = None  # what it was built with, for results.json
    num_labels: int | None = None

    def __init__(self, encoder: Encoder, **options: Any) -> None:
        raise NotImplementedError

    @classmethod
    def load(cls, encoder: Encoder, spec: Any, *, progress: bool = True) -> RMEngine:
        """The engine built with the spec's options it takes (and its NAME.KEY options)."""
        options = {k: spec.opt(k) for k in cls.takes}
        if cls.args:
            options["engine_args"] = spec.engine_args
        return cls(encoder, progress=progress, **options)

    def score_ids(self, ids: Sequence[Sequence[int]]) -> list[float]:
        raise NotImplementedError  # scores of token id lists, in input order

    def info(self) -> dict[str, Any]:
        raise NotImplementedError  # the engine's details, for results.json

    def close(self) -> None:
        """Let the model go."""


ENGINES: Registry[type[RMEngine]] = Registry("reward-model engine", RMEngine, field="--scorer")


@ENGINES.register("transformers")
class TransformersScorer(RMEngine):
    """AutoModelForSequenceClassification on one device, length-sorted batches."""

    name = "transformers"
    about = "AutoModelForSequenceClassification, in length-sorted batches"
    takes = ("batch_size", "device", "dtype", "trust_remote_code", "reduce", "device_map")

    def __init__(
        self,
        encoder: Encoder,
        *,
        batch_size: int = 16,
        device: str = "",
        dtype: str = "",
        trust_remote_code: bool = False,
        progress: bool = True,
        reduce: str = "exact",
        device_map: str = "",
    ) -> None:
        torch, transformers = _import_torch_transformers()
        check_device_map(device_map)
        self.torch = torch
        self.encoder = encoder
        self.reduce = reduce
        self.device_map = device_map
        if device_map:  # where the model goes is transformers' choice; the dtype is ours
            on_gpu = torch.cuda.is_available() and device_map != "cpu"
            self.device = device_map
        else:
            self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
            on_gpu = self.device.startswith("cuda")
        self.dtype = dtype or ("bfloat16" if on_gpu else "float32")
        self.batch_size = max(1, batch_size)
        self.progress = progress
        if not progress:
            transformers.utils.logging.disable_progress_bar()
        placement = {"device_map": device_map} if device_map else {}
        try:
            model = transformers.AutoModelForSequenceClassification.from_pretrained(
                str(encoder.path),
                dtype=getattr(torch, self.dtype),
                local_files_only=True,
                trust_remote_code=trust_remote_code,
                **placement,
            )
        except load_errors() as exc:
            first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else repr(exc)
            raise InputError(
                f"cannot load a sequence-classification model: {first}",
                path=encoder.path,
                field="--scorer rm",
            ) from None
        if model.config.pad_token_id is None:
            model.config.pad_token_id = encoder.tok.pad_token_id
        if device_map:
            self.model = model.eval()
            self.input_device = _first_device(model)
            placed = getattr(model, "hf_device_map", None) or {}
            self.devices = sorted({str(d) for d in placed.values()}) or [str(self.input_device)]
        else:
            self.model = model.to(self.device).eval()
            self.input_device = self.device
            self.devices = [self.device]
        self.num_labels = int(model.config.num_labels)

    def score_ids(self, ids: Sequence[Sequence[int]]) -> list[float]:
        """Scores for token id lists, batched longest first; returned in input order."""
        torch = self.torch
        pad = self.encoder.tok.pad_token_id
        order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
        out: list[float] = [0.0] * len(ids)
        from tqdm.auto import tqdm

        bar = tqdm(
            total=len(ids), desc="score", unit="seq", disable=not self.progress, file=sys.stderr
        )
        with torch.inference_mode():
            for start in range(0, len(order), self.batch_size):
                chunk = order[start : start + self.batch_size]
                width = max(len(ids[i]) for i in chunk)
                input_ids = torch.full((len(chunk), width), pad, dtype=torch.long)
                mask = torch.zeros((len(chunk), width), dtype=torch.long)
                for row, i in enumerate(chunk):
                    input_ids[row, : len(ids[i])] = torch.tensor(ids[i], dtype=torch.long)
                    mask[row, : len(ids[i])] = 1
                logits = self.model(
                    input_ids=input_ids.to(self.input_device),
                    attention_mask=mask.to(self.input_device),
                ).logits
                if self.reduce == "reference":
                    got = reduce_reference(torch, logits)
                else:
                    got = [reduce_logits(r) for r in logits.float().tolist()]
                for row, i in enumerate(chunk):
                    out[i] = got[row]
                bar.update(len(chunk))
        bar.close()
        return out

    def info(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "engine": self.name,
            "device": self.device,
            "dtype": self.dtype,
            "reduction": REDUCTION_LABELS[self.reduce],
        }
        if self.device_map:
            out["device_map"] = self.device_map
            out["devices"] = self.devices  # where transformers placed the model's parts
            out["input_device"] = str(self.input_device)
        return out

    def close(self) -> None:
        self.model = None


@ENGINES.register("vllm")
class VLLMScorer(RMEngine):
    """vLLM's pooling runner on the same token ids: ``LLM(..., runner="pooling")`` and
    ``LLM.classify`` with the activation off, so it returns the head's raw logits and the
    score is reduced exactly as the transformers engine reduces it."""

    name = "vllm"
    about = "vLLM's pooling runner on the same token ids (a CUDA GPU)"
    takes = ("dtype", "trust_remote_code", "reduce")
    args = "vllm.LLM(...)"
    crosschecks = True

    def __init__(
        self,
        encoder: Encoder,
        *,
        dtype: str = "",
        trust_remote_code: bool = False,
        engine_args: dict[str, Any] | None = None,
        progress: bool = True,
        reduce: str = "exact",
    ) -> None:
        self.reduce = reduce
        try:
            import vllm
        except ImportError:
            raise BackendError(f"--scorer rm:...,engine=vllm needs vLLM: {VLLM_HINT}") from None
        self.vllm = vllm
        self.encoder = encoder
        self.dtype = dtype or "bfloat16"  # what the transformers engine uses on a GPU
        self.progress = progress
        kwargs = {
            "model": str(encoder.path),
            "runner": "pooling",
            "dtype": self.dtype,
            "max_model_len": encoder.max_length,
            "trust_remote_code": trust_remote_code,
            **(engine_args or {}),
        }
        self.llm = vllm.LLM(**kwargs)
        self.engine_args = {k: v for k, v in kwargs.items() if k != "model"}

    def score_ids(self, ids: Sequence[Sequence[int]]) -> list[float]:
        prompts = [{"prompt_token_ids": list(x)} for x in ids]
        params = self.vllm.PoolingParams(use_activation=False)
        outs = self.llm.classify(prompts, pooling_params=params, use_tqdm=self.progress)
        rows = [list(o.outputs.probs) for o in outs]
        if self.reduce == "reference" and rows and len(rows[0]) > 1:
            # the logits back in the engine's dtype, then the reference's softmax in it
            import torch

            logits = torch.tensor(rows, dtype=getattr(torch, self.dtype, torch.bfloat16))
            return reduce_reference(torch, logits)
        return [reduce_logits(r) for r in rows]

    def info(self) -> dict[str, Any]:
        return {
            "engine": self.name,
            "device": "cuda",
            "dtype": self.dtype,
            "reduction": REDUCTION_LABELS[self.reduce],
        }

    def close(self) -> None:
        self.llm = None


def load_scorer(spec: Any, *, progress: bool = True) -> tuple[Encoder, RMEngine]:
    """The encoder and engine a ``rm:`` spec asks for."""
    path = Path(spec.target).expanduser()
    encoder = Encoder(
        path,
        max_length=spec.opt("max_length"),
        special_tokens=spec.opt("special_tokens"),
        template=spec.opt("template"),
        trust_remote_code=spec.opt("trust_remote_code"),
    )
    return encoder, ENGINES.get(spec.opt("engine")).load(encoder, spec, progress=progress)


def crosscheck(
    encoder: Encoder,
    ids: Sequence[Sequence[int]],
    scores: Sequence[float],
    spec: Any,
    make: type[TransformersScorer] = TransformersScorer,
) -> dict[str, Any]:
    """Score ``ids`` again with transformers and compare with ``scores`` (from vLLM): the
    largest absolute difference, and on how many (chosen, rejected) pairs, laid out as
    consecutive ids, the two engines pick the same answer."""
    ref = make.load(encoder, spec, progress=False)
    try:
        again = ref.score_ids(ids)
    finally:
        ref.close()
    from pipeline.eval.metrics import pointwise_outcome

    n = len(ids) // 2
    same = sum(
        pointwise_outcome(scores[2 * i], scores[2 * i + 1])
        == pointwise_outcome(again[2 * i], again[2 * i + 1])
        for i in range(n)
    )
    diff = max((abs(a - b) for a, b in zip(scores, again, strict=True)), default=0.0)
    return {
        "pairs": n,
        "max_abs_diff": round(diff, 6),
        "same_decisions": same,
        "transformers": ref.info(),
    }
