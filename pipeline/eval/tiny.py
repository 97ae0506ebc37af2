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
