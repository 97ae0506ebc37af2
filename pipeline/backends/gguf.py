"""GGUF files (llama.cpp's model format): the whole header checked before a run, and the
file's own tokenizer for `prb plan`. Below the engines: `llama_cpp` is imported only to
count tokens, and only when asked."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

from pipeline.core.errors import BackendError
from pipeline.kinds.backend import TokenCount
from pipeline.types.chat import ChatRequest

_GGUF_MAGIC = b"GGUF"
# GGUF value types (ggml's gguf.h): fixed sizes; 8 is a string, 9 an array
_GGUF_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_GGUF_STRING, _GGUF_ARRAY = 8, 9
# ggml tensor types whose (elements per block, bytes per block) are fixed and known here;
# a tensor of another type is checked by its offset only
_GGML_BLOCKS = {
    0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
    10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210),
    15: (256, 292), 24: (1, 1), 25: (1, 2), 26: (1, 4), 27: (1, 8), 28: (1, 8), 30: (1, 2),
}  # fmt: skip
# far above any model's: a count past these is a damaged header, not a model
_GGUF_MAX_TENSORS = 1 << 20
_GGUF_MAX_KVS = 1 << 20
_GGUF_MAX_DIMS = 4  # GGML_MAX_DIMS


class _GGUFError(Exception):
    """What is wrong with a GGUF header, said by :func:`check_gguf`."""


class _Reader:
    """Reads a GGUF header field by field; a read past the end is a ``_GGUFError``."""

    def __init__(self, fh: Any, size: int) -> None:
        self.fh, self.size = fh, size

    def take(self, n: int) -> bytes:
        if n < 0 or self.fh.tell() + n > self.size:
            raise _GGUFError("it ends inside its header (a cut or partial download?)")
        return bytes(self.fh.read(n))

    def u32(self) -> int:
        return int(struct.unpack("<I", self.take(4))[0])

    def u64(self) -> int:
        return int(struct.unpack("<Q", self.take(8))[0])

    def string(self) -> bytes:
        return self.take(self.u64())

    def skip_value(self, kind: int, depth: int = 0) -> None:
        if kind in _GGUF_SIZES:
            self.take(_GGUF_SIZES[kind])
        elif kind == _GGUF_STRING:
            self.string()
        elif kind == _GGUF_ARRAY and depth == 0:
            inner, count = self.u32(), self.u64()
            if inner in _GGUF_SIZES:
                self.take(_GGUF_SIZES[inner] * count)
            else:
                for _ in range(count):
                    self.skip_value(inner, depth + 1)
        else:
            raise _GGUFError(f"its metadata holds an unknown value type ({kind})")


def _gguf_header(path: Path) -> None:
    """Walk the whole header of the GGUF at ``path`` (magic, version, counts, every
    metadata entry and tensor description) and check that the tensor data it describes
    lies inside the file; ``_GGUFError`` saying what does not hold."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        r = _Reader(fh, size)
        if fh.read(4) != _GGUF_MAGIC:
            raise _GGUFError("it does not start with 'GGUF'")
        version = r.u32()
        if version not in (2, 3):
            raise _GGUFError(
                f"its GGUF version is {version}; llama.cpp reads versions 2 and 3 "
                "(re-convert it with a current convert_hf_to_gguf.py)"
            )
        tensors, kvs = r.u64(), r.u64()
        if not 0 < tensors <= _GGUF_MAX_TENSORS or kvs > _GGUF_MAX_KVS:
            raise _GGUFError(
                f"its header counts {tensors} tensors and {kvs} metadata entries, which no "
                "model has (a damaged header?)"
            )
        alignment = 32
        for _ in range(kvs):
            key = r.string()
            kind = r.u32()
            if key == b"general.alignment" and kind == 4:
                alignment = r.u32()
                if alignment == 0 or alignment & (alignment - 1):
                    raise _GGUFError(f"its general.alignment is {alignment}, not a power of two")
            else:
                r.skip_value(kind)
        ends: list[int] = []
        for _ in range(tensors):
            r.string()
            n_dims = r.u32()
            if not 0 < n_dims <= _GGUF_MAX_DIMS:
                raise _GGUFError(f"a tensor has {n_dims} dimensions (a damaged header?)")
            elements = 1
            for _ in range(n_dims):
                elements *= r.u64()
            kind = r.u32()
            offset = r.u64()
            block = _GGML_BLOCKS.get(kind)
            ends.append(offset + (elements // block[0] * block[1] if block else 1))
        data = -(-fh.tell() // alignment) * alignment
    if data + max(ends) > size:
        raise _GGUFError(
            f"its tensors need {data + max(ends):,} bytes but the file has {size:,} "
            "(a cut or partial download?)"
        )


def check_gguf(path: Path) -> None:
    """A loadable GGUF file: the whole header is read and checked (magic, version, counts,
    metadata, tensor descriptions, the file long enough for its tensors), so that a
    damaged file is one line naming it before the run, not a failure at its first stage."""
    hint = "give backend.model the path of a .gguf file, or leave it out for the default model"
    if not path.exists():
        raise BackendError(f"backend.model: {path} does not exist; {hint}")
    if not path.is_file():
        raise BackendError(f"backend.model: {path} is a folder, not a GGUF file; {hint}")
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as exc:
        raise BackendError(f"backend.model: cannot read {path} ({exc.strerror or exc})") from None
    if magic != _GGUF_MAGIC:
        raise BackendError(
            f"backend.model: {path} is not a GGUF file (it does not start with 'GGUF'); "
            "llama.cpp loads GGUF models only (convert others with llama.cpp's "
            "convert_hf_to_gguf.py)"
        )
    try:
        _gguf_header(path)
    except _GGUFError as exc:
        raise BackendError(f"backend.model: {path} cannot be loaded by llama.cpp: {exc}") from None
    except OSError as exc:
        raise BackendError(f"backend.model: cannot read {path} ({exc.strerror or exc})") from None


def gguf_token_count(path: Path) -> TokenCount:
    """The GGUF's own tokenizer and chat template, for `prb plan` (only the vocabulary is
    loaded). ImportError without llama-cpp-python."""
    import llama_cpp
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    vocab = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    template = vocab.metadata.get("tokenizer.chat_template")
    formatter = None
    if template:

        def token_text(i: int) -> str:
            return vocab._model.token_get_text(i) if i >= 0 else ""

        formatter = Jinja2ChatFormatter(
            template=template,
            eos_token=token_text(vocab.token_eos()),
            bos_token=token_text(vocab.token_bos()),
        )

    def text(s: str) -> int:
        return len(vocab.tokenize(s.encode("utf-8", "replace"), add_bos=False, special=False))

    def count(req: ChatRequest) -> int:
        if formatter is None:
            return sum(text(c) + 5 for _, c in req.messages)
        msgs: Any = req.message_dicts()
        res = formatter(messages=msgs)
        add_bos = not getattr(res, "added_special", False)
        return len(
            vocab.tokenize(res.prompt.encode("utf-8", "replace"), add_bos=add_bos, special=True)
        )

    how = "with its chat template" if formatter is not None else "contents, +5 tokens a message"
    return TokenCount(count, text, f"the GGUF's tokenizer (llama.cpp, {path.name}; {how})")


def gguf_counter_notes(path: Path) -> tuple[TokenCount | None, list[str]]:
    """:func:`gguf_token_count`, or why not as a note for the plan."""
    try:
        return gguf_token_count(path), []
    except ImportError:
        return None, [
            f"{path.name}: llama-cpp-python is not installed, so its tokenizer cannot count"
        ]
    except Exception as exc:  # a damaged or unsupported file: estimate instead
        return None, [f"{path.name}: its tokenizer could not be loaded ({exc})"]
