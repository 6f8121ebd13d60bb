"""Build a tiny random Llama and a word-level tokenizer on disk, for a real vLLM engine on CPU.

No model hub is reachable, and a test needs no trained weights: it needs an engine that loads
a model, schedules steps and writes profiler traces. head_dim 64 because vLLM's CPU attention
backend refuses smaller heads.
"""

from __future__ import annotations

from pathlib import Path

WORDS = 250


def build(folder: Path) -> Path:
    """Write the model and tokenizer into ``folder`` (made if missing) and return it."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    specials = ["<unk>", "<s>", "</s>", "<pad>"]
    vocab = {tok: i for i, tok in enumerate(specials + [f"w{i}" for i in range(WORDS)])}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>", pad_token="<pad>")
    fast.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    fast.save_pretrained(folder)
    config = LlamaConfig(vocab_size=len(vocab), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, head_dim=64, max_position_embeddings=256,
                         bos_token_id=1, eos_token_id=2, pad_token_id=3, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(folder, safe_serialization=True)
    return folder


def prompt(n: int = 8) -> str:
    """Return a prompt of ``n`` known words."""
    return " ".join(f"w{i % WORDS}" for i in range(n))
