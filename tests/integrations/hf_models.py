"""A tiny random Llama and a word-level tokenizer built in memory (nothing is downloaded)."""

from __future__ import annotations

from typing import Any

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

WORDS = ["the", "a", "cat", "dog", "sat", "ran", "on", "mat", "sun", "fast", "slow", "big", "red", "blue"]


def tokenizer() -> PreTrainedTokenizerFast:
    """A word-level tokenizer over :data:`WORDS` plus ``<pad> <eos> <bos> <unk>`` and 80 filler words."""
    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3}
    for word in [*WORDS, *(f"w{i}" for i in range(80))]:
        vocab[word] = len(vocab)
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>",
                                  bos_token="<bos>", unk_token="<unk>")
    tok.padding_side = "left"
    return tok


def model(vocab_size: int, seed: int = 0) -> LlamaForCausalLM:
    """A 1-layer Llama with hidden size 16, the same weights for the same seed."""
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                         pad_token_id=0, eos_token_id=1, bos_token_id=2)
    return LlamaForCausalLM(config)


def lm_rows(n: int, length: int = 8, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` rows of random token ids with labels, for the plain ``Trainer``."""
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n):
        ids = torch.randint(4, 90, (length,), generator=gen)
        rows.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()})
    return rows
