"""A tiny, randomly initialised reward model built and saved locally (no download).

For tests and the CPU benchmark: a 2-layer Llama sequence-classification model and a
word-level tokenizer whose vocabulary is built from the given texts (so every word of them,
rubric and narrative included, has its own token and would show in a tokenised input), with
a chat template. Saved with ``save_pretrained`` and loaded back through the real
``from_pretrained`` path like any downloaded model. Its scores are noise: it measures the
machinery, never a model's quality.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} "
    "<|end|> {% endfor %}"
)
SPECIALS = ["[PAD]", "[UNK]", "<s>", "</s>", "<|user|>", "<|assistant|>", "<|system|>", "<|end|>"]
_WORD = re.compile(r"\w+|[^\w\s]+")


def build_tiny_reward_model(
    folder: str | Path,
    texts: Iterable[str],
    *,
    num_labels: int = 1,
    hidden_size: int = 32,
    layers: int = 2,
    seed: int = 0,
    max_positions: int = 8192,
    head_std: float = 1.0,
) -> Path:
    """Write a tiny LlamaForSequenceClassification and its tokenizer to ``folder``."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForSequenceClassification, PreTrainedTokenizerFast

    folder = Path(folder)
    vocab: dict[str, int] = {t: i for i, t in enumerate(SPECIALS)}
    for text in texts:
        for w in _WORD.findall(text):
            vocab.setdefault(w, len(vocab))
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tk.add_special_tokens(SPECIALS)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk,
        pad_token="[PAD]",
        unk_token="[UNK]",
        bos_token="<s>",
        eos_token="</s>",
        model_max_length=max_positions,
    )
    tok.chat_template = CHAT_TEMPLATE
    config = LlamaConfig(  # type: ignore[call-arg]
        vocab_size=len(vocab),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        num_labels=num_labels,
        pad_token_id=vocab["[PAD]"],
        bos_token_id=vocab["<s>"],
        eos_token_id=vocab["</s>"],
    )
    torch.manual_seed(seed)
    model = LlamaForSequenceClassification(config)
    # Random init gives near-equal scores: widen the head so scores spread and ties are rare
    # (head_std=0.02, the init's own, keeps them close: bf16 rounds them into ties).
    with torch.no_grad():
        model.score.weight.normal_(0.0, head_std)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def split_texts(path: str | Path) -> list[str]:
    """Every question, answer and profile post of a split (a release, a run, a pairs file:
    what ``prb eval`` reads), for a tiny model's vocabulary."""
    from pipeline.audit import load_pairs

    rows, _ = load_pairs(Path(path))
    texts: list[str] = []
    for r in rows:
        texts += [str(r.get(c) or "") for c in ("question", "chosen", "rejected")]
        texts += [str(p.get("text") or "") for p in r.get("profile") or [] if isinstance(p, dict)]
    return texts


def main(argv: list[str] | None = None) -> int:
    """``python -m pipeline.eval.tiny SPLIT OUT_DIR [--models 3]``: write tiny reward models
    (random weights: they measure the machinery, never a model's quality) whose vocabulary
    is the split's words, as ``OUT_DIR/tiny-rm-0`` ..., one seed each."""
    import argparse

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("split", type=Path, help="a release folder, run directory or pairs file")
    ap.add_argument("out", type=Path, help="the folder to write the models into")
    ap.add_argument("--models", type=int, default=3, help="how many (default 3)")
    args = ap.parse_args(argv)
    texts = split_texts(args.split)
    for i in range(args.models):
        folder = build_tiny_reward_model(args.out / f"tiny-rm-{i}", texts, seed=i)
        print(f"wrote {folder} (random weights, seed {i}; not a trained model)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
