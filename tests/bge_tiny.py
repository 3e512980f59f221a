"""Build a tiny, randomly initialised XLM-RoBERTa checkpoint in the BGE-M3 layout (offline).

BGE-M3's real weights cannot be downloaded in tests; this model has the same files
(config, weights, tokenizer, colbert_linear.pt, sparse_linear.pt) at ~150 KB, so
``BGEM3FlagModel(path)`` loads it through exactly the same code path. ``build_tiny_reranker``
does the same for ``FlagReranker``: a cross-encoder (one logit) over the same tokenizer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

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


def _save_tokenizer(path: Path) -> int:
    """The tiny word-level tokenizer in path; returns its vocabulary size."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    path.mkdir(parents=True, exist_ok=True)
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    vocab = {token: i for i, token in enumerate([*specials, *dict.fromkeys(_WORDS)])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.normalizer = normalizers.Lowercase()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Whitespace(), pre_tokenizers.Split(pattern="", behavior="isolated")]
    )
    # XLM-RoBERTa's own framing of one text and of a pair: the cross-encoder reads pairs.
    backend.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>",
        pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", vocab["<s>"]), ("</s>", vocab["</s>"])],
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
        # No token_type_ids: XLM-RoBERTa has a single token type, like the real checkpoints.
        model_input_names=["input_ids", "attention_mask"],
    )
    tokenizer.save_pretrained(path)
    return len(vocab)


def _config(vocab_size: int, **extra: Any) -> Any:
    from transformers import XLMRobertaConfig

    return XLMRobertaConfig(
        vocab_size=vocab_size,
        hidden_size=HIDDEN,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=130,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        **extra,
    )


def build_tiny_bge_m3(path: Path) -> Path:
    import torch
    from transformers import XLMRobertaModel

    vocab_size = _save_tokenizer(path)
    torch.manual_seed(0)
    XLMRobertaModel(_config(vocab_size)).save_pretrained(path)
    torch.save(torch.nn.Linear(HIDDEN, HIDDEN).state_dict(), path / "colbert_linear.pt")
    torch.save(torch.nn.Linear(HIDDEN, 1).state_dict(), path / "sparse_linear.pt")
    return path


def build_tiny_reranker(path: Path) -> Path:
    """A random cross-encoder in the layout FlagReranker loads (AutoModelForSequenceClassification)."""
    import torch
    from transformers import XLMRobertaForSequenceClassification

    vocab_size = _save_tokenizer(path)
    torch.manual_seed(1)
    # A wide initialisation: with the default 0.02 every pair scores about the same.
    model = XLMRobertaForSequenceClassification(_config(vocab_size, num_labels=1, initializer_range=0.5))
    model.save_pretrained(path)
    return path
