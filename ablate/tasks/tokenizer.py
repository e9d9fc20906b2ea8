"""A word-level tokenizer built in code (no download): a real `transformers.PreTrainedTokenizerFast`, so everything
that takes a tokenizer (our generators, TRL, vLLM via save_pretrained) takes it.

Text is split into known words and single letters (each with or without one leading space), single digits and
single other characters; any other word falls back to its characters. Decoding concatenates the pieces, so decode(encode(s)) == s for
every string made of known characters.
"""

from __future__ import annotations

import string
from functools import cache

SPECIAL = ("<pad>", "<unk>", "<bos>", "<eos>", "<think>", "</think>")
# Words of the interruption phrase (schema.Interruption.phrase) and of the synthetic task's prompts.
WORDS = ("Okay", "time", "is", "up", "Let", "me", "stop", "thinking", "and", "formulate", "a", "final", "answer",
         "now", "reverse", "sort", "sum")


@cache
def build_tokenizer(extra_words: tuple[str, ...] = ()):
    """The tokenizer: special tokens, then characters, then whole words (WORDS + extra_words)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = list(string.ascii_letters + string.digits + string.punctuation + " \n")
    words = [w for w in dict.fromkeys(WORDS + tuple(extra_words)) if len(w) > 1]
    spaced = [f" {w}" for w in words] + [f" {c}" for c in string.ascii_letters]
    vocab = {piece: i for i, piece in enumerate(dict.fromkeys([*SPECIAL, *chars, *words, *spaced]))}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    # A word not in the vocabulary is split into its characters first: "Hello" -> H e l l o when unknown.
    known = "|".join(sorted((w for w in words), key=len, reverse=True))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(rf"</?think>| ?(?:{known})(?![A-Za-z])| ?[A-Za-z](?![A-Za-z])|[^\d]|\d"),
                                              behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", unk_token="<unk>", bos_token="<bos>",
                                   eos_token="<eos>", additional_special_tokens=["<think>", "</think>"])
