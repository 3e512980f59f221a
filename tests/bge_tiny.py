"""Build a tiny, randomly initialised XLM-RoBERTa checkpoint in the BGE-M3 layout (offline).

BGE-M3's real weights cannot be downloaded in tests; this model has the same files
(config, weights, tokenizer, colbert_linear.pt, sparse_linear.pt) at ~150 KB, so
``BGEM3FlagModel(path)`` loads it through exactly the same code path.
"""

from __future__ import annotations

from pathlib import Path

HIDDEN = 32
_WORDS = [
    "err_timeout",
    "timeout",
    "pool",
    "connection",
    "hikaricp",
    "rate",
    "limit",
    "api",
    "key",
    "redis",
    "cache",
    "error",
    "code",
    "数",
    "据",
    "库",
    "连",
    "接",
    "池",
    "超",
    "时",
    "错",
    "误",
    "配",
    "置",
    "是",
    "什",
    "么",
    "how",
    "to",
    "configure",
    "what",
    "is",
    "the",
    "a",
    "of",
]


def build_tiny_bge_m3(path: Path) -> Path:
    import torch
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, XLMRobertaConfig, XLMRobertaModel

    path.mkdir(parents=True, exist_ok=True)
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    vocab = {token: i for i, token in enumerate([*specials, *dict.fromkeys(_WORDS)])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.normalizer = normalizers.Lowercase()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Whitespace(), pre_tokenizers.Split(pattern="", behavior="isolated")]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        sep_token="</s>",
        pad_token="<pad>",
        cls_token="<s>",
        mask_token="<mask>",
        model_max_length=128,
    )
    tokenizer.save_pretrained(path)

    torch.manual_seed(0)
    config = XLMRobertaConfig(
        vocab_size=len(vocab),
        hidden_size=HIDDEN,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=130,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
    )
    XLMRobertaModel(config).save_pretrained(path)
    torch.save(torch.nn.Linear(HIDDEN, HIDDEN).state_dict(), path / "colbert_linear.pt")
    torch.save(torch.nn.Linear(HIDDEN, 1).state_dict(), path / "sparse_linear.pt")
    return path
