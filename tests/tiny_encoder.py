"""A tiny BERT encoder and WordPiece vocabulary written to a folder, so the contriever
ranker runs its real transformers code path without a download (tests only)."""

from __future__ import annotations

from pathlib import Path

WORDS = (
    "how do i draw hands paint watercolor mud colors bread bake sourdough bike cycle work "
    "scary paper stop pigment the a my to of and is get better every morning train"
).split()


def build_tiny_encoder(folder: Path, seed: int = 0) -> Path:
    """Save a 2-layer, 16-wide BERT with random weights (seeded) and its tokenizer."""
    import torch
    from transformers import BertConfig, BertModel, BertTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, "##s", "##ing"]
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    tokenizer = BertTokenizerFast(vocab_file=str(folder / "vocab.txt"), model_max_length=64)
    tokenizer.save_pretrained(folder)
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=len(vocab),
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=64,
    )
    BertModel(config).eval().save_pretrained(folder)
    return folder
