"""A Hugging Face folder (config, tokenizer, chat template) made from a GGUF's own metadata,
for loading the GGUF in vLLM (``LLM(model=FILE.gguf, tokenizer=FOLDER, hf_config_path=FOLDER)``)
without converting its weights; and a check that the tokenizer it writes tokenizes as
llama.cpp's own reading of the same GGUF does.

Only the GGUF's header is read: the metadata alone (architecture, sizes, vocabulary,
merges, special tokens, chat template) sits in its first few megabytes, so the first piece
of a GGUF split for travel is enough. The header is copied without its tensor list into
``FOLDER/header.gguf`` (a valid GGUF with no tensors), which transformers' GGUF reader turns
into a config and a fast tokenizer, and which llama.cpp loads vocabulary-only for the check.

usage:
  python scripts/gguf_hf_folder.py GGUF OUT_DIR [--check] [--report FILE.json]

--check compares, text by text, the token ids of the written tokenizer with llama.cpp's
(``Llama(vocab_only=True)``, special tokens parsed) on the project's own prompts and on
hard cases (reasoning tags, whitespace runs, non-Latin scripts, emoji, code), and the chat
template's rendering of a conversation by transformers and by llama-cpp-python's Jinja
formatter; it exits 1 on any difference. Needs transformers, tokenizers, gguf and (for the
check) llama-cpp-python.
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
import time
from pathlib import Path
from typing import Any

_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_FMT = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


class _Head:
    """A GGUF header read field by field: its metadata and where the metadata ends."""

    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise SystemExit("gguf_hf_folder: the file ends inside its metadata")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def u32(self) -> int:
        return int(struct.unpack("<I", self.take(4))[0])

    def u64(self) -> int:
        return int(struct.unpack("<Q", self.take(8))[0])

    def value(self, kind: int) -> Any:
        if kind == 8:
            return self.take(self.u64()).decode("utf-8", "replace")
        if kind == 9:
            inner, n = self.u32(), self.u64()
            if inner in _SIZES:  # a numeric array (token types, scores): read at once
                raw = self.take(_SIZES[inner] * n)
                return list(struct.unpack(f"<{n}{_FMT[inner]}", raw))
            return [self.value(inner) for _ in range(n)]
        return struct.unpack("<" + _FMT[kind], self.take(_SIZES[kind]))[0]


def read_metadata(path: Path, limit: int = 64 << 20) -> tuple[dict[str, Any], bytes]:
    """(the metadata, the header's bytes up to the end of the metadata) of a GGUF; reads at
    most ``limit`` bytes (a vocabulary of 150,000 tokens takes about 6 MB)."""
    with open(path, "rb") as fh:
        data = fh.read(limit)
    h = _Head(data)
    if h.take(4) != b"GGUF":
        raise SystemExit(f"gguf_hf_folder: {path} is not a GGUF file")
    version = h.u32()
    h.u64()  # tensors
    n_kv = h.u64()
    meta: dict[str, Any] = {"_version": version}
    for _ in range(n_kv):
        key = h.take(h.u64()).decode("utf-8")
        meta[key] = h.value(h.u32())
    return meta, data[: h.pos]


def tensor_names(path: Path) -> list[str]:
    """The names of a GGUF's tensors, from its header (the tensor list follows the
    metadata)."""
    _, head = read_metadata(path)
    with open(path, "rb") as fh:
        data = fh.read(len(head) + (16 << 20))
    h = _Head(data)
    h.pos = len(head)
    count = struct.unpack("<Q", data[8:16])[0]
    names = []
    for _ in range(count):
        names.append(h.take(h.u64()).decode("utf-8"))
        dims = h.u32()
        h.take(8 * dims + 4 + 8)  # the dimensions, the type, the offset
    return names


def write_header_only(src: Path, dest: Path) -> dict[str, Any]:
    """``dest``: ``src``'s header with every metadata field and no tensor (its tensor
    count set to 0, padded to the alignment): a GGUF any reader opens without the weights."""
    meta, head = read_metadata(src)
    align = int(meta.get("general.alignment", 32))
    body = head[:8] + struct.pack("<Q", 0) + head[16:]
    body += b"\0" * (-len(body) % align)
    dest.write_bytes(body)
    return meta


def _fix_added_tokens(path: Path, tokens: list[str], types: list[int]) -> int:
    """Make tokenizer.json read llama.cpp's special tokens as llama.cpp does: every CONTROL
    token (type 3: <｜User｜>, <｜begin▁of▁sentence｜>...) and USER_DEFINED one (type 4:
    <think>, </think>) an added token at its own id, under its own text. transformers'
    GGUF converter byte-encodes some of them (fullwidth bars become 'ï½ľ') and adds others
    past the vocabulary, so a prompt's <｜User｜> was split into six pieces. Returns how
    many added tokens the file now has."""
    data = json.loads(path.read_text(encoding="utf-8"))
    # the vocabulary holds each such token under its own text at its id: an added token
    # whose text the vocabulary lacks is given a new id past it, whatever the file says
    vocab = data["model"]["vocab"]
    by_id = {i: t for t, i in vocab.items()}
    for tid, kind in enumerate(types):
        if kind in (3, 4) and by_id.get(tid) not in (None, tokens[tid]):
            del vocab[by_id[tid]]
            vocab[tokens[tid]] = tid
    keep = {
        t["id"]: t
        for t in data.get("added_tokens") or []
        if t["id"] < len(tokens) and t["content"] == tokens[t["id"]]
    }
    for tid, kind in enumerate(types):
        if kind in (3, 4) and tid not in keep:
            keep[tid] = {
                "id": tid, "content": tokens[tid], "single_word": False, "lstrip": False,
                "rstrip": False, "normalized": False, "special": kind == 3,
            }  # fmt: skip
    data["added_tokens"] = [keep[k] for k in sorted(keep)]
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    return len(keep)


def make_folder(gguf: Path, out: Path) -> dict[str, Any]:
    """Write config.json, generation_config.json, the tokenizer files (with the chat
    template) and header.gguf into ``out``; returns what was written."""
    from transformers import AutoConfig, AutoTokenizer

    out.mkdir(parents=True, exist_ok=True)
    header = out / "header.gguf"
    t0 = time.perf_counter()
    meta = write_header_only(gguf, header)
    config = AutoConfig.from_pretrained(str(out), gguf_file=header.name)
    tok = AutoTokenizer.from_pretrained(str(out), gguf_file=header.name)
    template = meta.get("tokenizer.chat_template") or tok.chat_template
    tokens = meta.get("tokenizer.ggml.tokens") or []
    types = meta.get("tokenizer.ggml.token_type") or []

    def named(key: str) -> str | None:
        tid = meta.get(f"tokenizer.ggml.{key}_token_id")
        return tokens[tid] if isinstance(tid, int) and 0 <= tid < len(tokens) else None

    tok.save_pretrained(out)
    added = _fix_added_tokens(out / "tokenizer.json", tokens, types)
    from transformers import PreTrainedTokenizerFast

    for name in ("tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"):
        (out / name).unlink(missing_ok=True)
    tok = PreTrainedTokenizerFast(
        tokenizer_file=str(out / "tokenizer.json"),
        bos_token=named("bos"),
        eos_token=named("eos"),
        pad_token=named("padding"),
        chat_template=template,
        clean_up_tokenization_spaces=False,
    )
    config.eos_token_id = meta.get("tokenizer.ggml.eos_token_id", config.eos_token_id)
    config.bos_token_id = meta.get("tokenizer.ggml.bos_token_id", config.bos_token_id)
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the folder holds no weights
    if not config.architectures:  # what vLLM picks its model class by
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

        arch = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(config.model_type)
        config.architectures = [arch] if arch else None
    # transformers' GGUF reader ties the output layer to the embeddings; a GGUF with its own
    # output.weight (DeepSeek-R1-Distill-Qwen-7B has one) is not tied
    config.tie_word_embeddings = "output.weight" not in tensor_names(gguf)
    config.save_pretrained(out)
    saved = json.loads((out / "config.json").read_text())
    # the weights' dtype as the model was trained (GGUF dequantizes to it): both spellings,
    # for the transformers version that reads it on the GPU machine
    saved["torch_dtype"] = saved["dtype"] = "bfloat16"
    (out / "config.json").write_text(json.dumps(saved, indent=2) + "\n")
    tok.save_pretrained(out)
    gen = {k: meta.get(f"tokenizer.ggml.{k}") for k in ("bos_token_id", "eos_token_id")}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=1) + "\n")
    return {
        "gguf": str(gguf),
        "name": meta.get("general.name"),
        "architecture": meta.get("general.architecture"),
        "file_type": meta.get("general.file_type"),
        "vocab": len(tokens),
        "tokenizer_size": len(tok),
        "added_tokens": added,
        "model_type": config.model_type,
        "architectures": config.architectures,
        "hidden_size": getattr(config, "hidden_size", None),
        "num_hidden_layers": getattr(config, "num_hidden_layers", None),
        "tie_word_embeddings": config.tie_word_embeddings,
        "chat_template": bool(tok.chat_template),
        "special": {"bos": tok.bos_token, "eos": tok.eos_token, "pad": tok.pad_token},
        "seconds": round(time.perf_counter() - t0, 2),
        "files": sorted(p.name for p in out.iterdir()),
    }


HARD_CASES = [
    '<think>\nThe user likes hiking; weigh both answers.\n</think>\n\n{"winner": "A"}',
    "  two  spaces,\ttabs\t\tand\n\n\nnewlines  ",
    "Café, naïve, façade — “quotes” and ‘apostrophes’ … 100% ½",
    "机器学习是人工智能的一个分支。 日本語のテキスト。 한국어 문장.",
    "Emoji 🙂🚀👩‍💻 and symbols ∑∫√ ≤≥ ±",
    "def f(x):\n    return {'a': [1, 2, 3]}  # code\n",
    "URL https://example.org/a?b=c&d=e#f and 1234567890.12345",
]


def _prompts() -> list[str]:
    """Texts like the project's own requests: the prompt templates (prompts/*.j2) and the
    hand-written sample's questions and posts (examples/sample_lamp.jsonl)."""
    root = Path(__file__).resolve().parents[1]
    out = [p.read_text(encoding="utf-8") for p in sorted((root / "prompts").glob("*.j2"))[:6]]
    sample = root / "examples" / "sample_lamp.jsonl"
    if sample.is_file():
        for line in sample.read_text(encoding="utf-8").splitlines()[:3]:
            row = json.loads(line)
            posts = " ".join(str(p.get("text", "")) for p in (row.get("profile") or [])[:4])
            out.append(f"Question: {row.get('question')}\nPosts: {posts}")
    return out


def check(out: Path, gguf: Path) -> dict[str, Any]:
    """Token ids of the folder's tokenizer against llama.cpp's, and the chat template's
    rendering by both."""
    import llama_cpp
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(out))
    llm = llama_cpp.Llama(model_path=str(out / "header.gguf"), vocab_only=True, verbose=False)
    texts = HARD_CASES + _prompts()
    diffs = []
    tokens = 0
    for text in texts:
        ours = tok.encode(text, add_special_tokens=False)
        theirs = llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)
        tokens += len(theirs)
        if list(ours) != list(theirs):
            diffs.append({"text": text[:80], "hf": ours[:20], "llama.cpp": theirs[:20]})
    conversation = [
        {"role": "system", "content": "You judge answers."},
        {"role": "user", "content": "Which answer is better, A or B?"},
        {"role": "assistant", "content": '<think>\nweighing\n</think>\n\n{"winner": "A"}'},
        {"role": "user", "content": "Reply again with only the JSON object."},
    ]
    hf_prompt = tok.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    meta, _ = read_metadata(gguf)
    tokens_list = meta.get("tokenizer.ggml.tokens") or []
    fmt = Jinja2ChatFormatter(
        template=meta["tokenizer.chat_template"],
        eos_token=tokens_list[int(meta["tokenizer.ggml.eos_token_id"])],
        bos_token=tokens_list[int(meta["tokenizer.ggml.bos_token_id"])],
    )
    cpp_prompt = fmt(messages=conversation).prompt
    template_same = hf_prompt == cpp_prompt
    ids_same = tok.encode(hf_prompt, add_special_tokens=False) == llm.tokenize(
        cpp_prompt.encode("utf-8"), add_bos=False, special=True
    )
    end_ids = tok.encode("</think>", add_special_tokens=False)
    return {
        "texts": len(texts),
        "tokens": tokens,
        "differing_texts": len(diffs),
        "differences": diffs[:20],
        "chat_template_same_text": template_same,
        "chat_template_same_ids": ids_same,
        "chat_prompt_tail": hf_prompt[-60:],
        "end_tag_ids": end_ids,
        "ok": not diffs and template_same and ids_same,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("gguf", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--check", action="store_true", help="compare with llama.cpp's tokenizer")
    ap.add_argument("--report", type=Path, help="write what was made (and checked) here")
    a = ap.parse_args(argv)
    if not a.gguf.is_file():
        print(f"gguf_hf_folder: {a.gguf} does not exist", file=sys.stderr)
        return 2
    made = make_folder(a.gguf, a.out)
    print(json.dumps(made, indent=1))
    result: dict[str, Any] = {"made": made}
    if a.check:
        result["check"] = check(a.out, a.gguf)
        print(json.dumps(result["check"], indent=1, ensure_ascii=False))
    if a.report:
        a.report.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    return 0 if not a.check or result["check"]["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
