"""Training a byte-level BPE tokenizer with the `tokenizers` library (tiny, built-in and test models)."""

from typing import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers


def train_byte_level_bpe(corpus: Iterable[str], vocab_size: int, special_tokens: list[str]) -> Tokenizer:
    """GPT-2-style byte-level BPE; special tokens take the first ids, in the order given."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special_tokens,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus, trainer=trainer)
    return tok
