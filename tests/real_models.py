"""Folders shaped like a Hugging Face download of a Qwen3 or Llama-3 model, made without a download: the family's
real tokenizer (its vocabulary from a registry package: quicktok-v1's data files, read here, never imported as a
tokenizer), its special tokens at their real ids, a chat template that renders the family's documented format, a
generation_config.json with the family's eos ids, and a config.json of the family's real shape but for its depth and
width (random weights). Tests point model.path at them as a user points it at a download.

The vocabularies, the split patterns and the known ids they are checked against: ecosystem-facts in the team's
notes; docs/testing.md#real-tokenizers.
"""

from __future__ import annotations

import base64
import functools
import json
import struct
from dataclasses import dataclass
from pathlib import Path

# the pre-tokenizer's split pattern of each family: Llama-3 groups digits in threes, Qwen splits each digit
QWEN_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
                r"\s+(?!\S)|\s+")
LLAMA_PATTERN = QWEN_PATTERN.replace(r"|\p{N}|", r"|\p{N}{1,3}|")

CHATML = ("{%- for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n' }}{%- endfor %}{%- if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
          "{%- endif %}")
# Qwen3's: with enable_thinking=false its template opens the assistant's turn with an empty thinking block
QWEN3_CHAT = CHATML.replace("{%- endif %}", "{%- if enable_thinking is defined and enable_thinking is false %}"
                            "{{ '<think>\n\n</think>\n\n' }}{%- endif %}{%- endif %}")
LLAMA3_CHAT = ("{{- bos_token }}{%- for message in messages %}{{ '<|start_header_id|>' + message['role'] + "
               "'<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}{%- endfor %}"
               "{%- if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{%- endif %}")


@dataclass(frozen=True)
class Family:
    """A released model's tokenizer and generation settings, as its download has them."""

    vocab: str  # quicktok's data file
    pattern: str
    bos: str | None
    eos: str  # the tokenizer's eos_token
    pad: str | None  # None: the download has no pad token (Llama-3's)
    generation_eos: tuple[int, ...]  # generation_config.json's eos_token_id
    chat_template: str
    config: dict  # config.json, less its size (tests choose the depth and width)


QWEN3_CONFIG = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936,
                "max_position_embeddings": 40960, "rope_theta": 1000000.0, "tie_word_embeddings": True,
                "bos_token_id": 151643, "eos_token_id": 151645}
LLAMA3_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256,
                 "max_position_embeddings": 131072, "rope_theta": 500000.0, "tie_word_embeddings": False,
                 "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                  "original_max_position_embeddings": 8192, "rope_type": "llama3"},
                 "bos_token_id": 128000, "eos_token_id": 128001}

FAMILIES = {
    # Qwen3-1.7B (post-trained): its tokenizer's eos is <|im_end|>, its generation config ends at both
    "qwen3": Family("qwen3", QWEN_PATTERN, None, "<|im_end|>", "<|endoftext|>", (151645, 151643), QWEN3_CHAT,
                    QWEN3_CONFIG),
    # a Qwen base model (Qwen3-8B-Base, Qwen2.5-Math-1.5B): eos <|endoftext|>; its chat template ends a turn at
    # <|im_end|>, which neither the tokenizer's eos nor the generation config names
    "qwen3-base": Family("qwen3", QWEN_PATTERN, None, "<|endoftext|>", "<|endoftext|>", (151643,), CHATML,
                         QWEN3_CONFIG),
    # Llama-3.1-8B-Instruct: eos <|eot_id|>; its generation config lists three
    "llama3": Family("llama3", LLAMA_PATTERN, "<|begin_of_text|>", "<|eot_id|>", None, (128001, 128008, 128009),
                     LLAMA3_CHAT, LLAMA3_CONFIG),
}


def _data(name: str) -> bytes:
    import quicktok

    return (Path(quicktok.__file__).parent / "data" / name).read_bytes()


def _ranks(vocab: str) -> list[tuple[bytes, int]]:
    """quicktok's .vocab: u32 count, then a token each: u16 length, its bytes, u32 rank (little-endian)."""
    data, tokens = _data(vocab + ".vocab"), []
    (count,), offset = struct.unpack_from("<I", data), 4
    for _ in range(count):
        (length,) = struct.unpack_from("<H", data, offset)
        token = data[offset + 2: offset + 2 + length]
        (rank,) = struct.unpack_from("<I", data, offset + 2 + length)
        tokens.append((token, rank))
        offset += 6 + length
    return tokens


def _specials(vocab: str) -> list[tuple[int, str]]:
    """quicktok's .special: u32 count, then a token each: u32 id, u16 length, its UTF-8 bytes."""
    data, specials = _data(vocab + ".special"), []
    (count,), offset = struct.unpack_from("<I", data), 4
    for _ in range(count):
        token_id, length = struct.unpack_from("<IH", data, offset)
        specials.append((token_id, data[offset + 6: offset + 6 + length].decode()))
        offset += 6 + length
    return sorted(specials)


@functools.cache
def _backend(vocab: str, pattern: str) -> str:
    """The fast tokenizer's backend, as JSON, from the tiktoken-format ranks (~3 s; once per family and process)."""
    import tempfile

    from transformers.convert_slow_tokenizer import TikTokenConverter

    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / f"{vocab}.tiktoken"
        path.write_text("".join(f"{base64.b64encode(t).decode()} {r}\n"
                                for t, r in sorted(_ranks(vocab), key=lambda x: x[1])))
        specials = [name for _, name in _specials(vocab)]
        return TikTokenConverter(vocab_file=str(path), pattern=pattern,
                                 extra_special_tokens=specials).converted().to_str()


def save_tokenizer(family: str, folder: Path) -> None:
    """The family's tokenizer, saved with save_pretrained into `folder` (tokenizer.json, tokenizer_config.json)."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    fam = FAMILIES[family]
    folder.mkdir(parents=True, exist_ok=True)
    backend = Tokenizer.from_str(_backend(fam.vocab, fam.pattern))
    if fam.bos:  # Llama-3's tokenizer.json puts <|begin_of_text|> before every text it encodes
        from tokenizers import processors

        bos = dict((name, i) for i, name in _specials(fam.vocab))[fam.bos]
        backend.post_processor = processors.Sequence([
            backend.post_processor, processors.TemplateProcessing(
                single=f"{fam.bos} $A", pair=f"{fam.bos} $A {fam.bos} $B", special_tokens=[(fam.bos, bos)])])
    specials = [name for _, name in _specials(fam.vocab)]
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=fam.bos, eos_token=fam.eos,
                                        pad_token=fam.pad, additional_special_tokens=specials,
                                        chat_template=fam.chat_template)
    tokenizer.save_pretrained(folder)


def save_model(family: str, folder: Path, *, layers: int = 2, hidden: int = 64, heads: int = 4,
               kv_heads: int = 2, seed: int = 0, weights: bool = True) -> Path:
    """A download-shaped folder: the tokenizer, generation_config.json, config.json at this depth and width (the
    family's vocabulary, positions, rope and tying), and random weights (model.safetensors) unless weights=False."""
    import torch
    import transformers

    fam = FAMILIES[family]
    save_tokenizer(family, folder)
    config = transformers.AutoConfig.for_model(**{
        **fam.config, "hidden_size": hidden, "intermediate_size": 2 * hidden, "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": hidden // heads})
    config.save_pretrained(folder)
    if weights:
        torch.manual_seed(seed)
        transformers.AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    generation = {"bos_token_id": fam.config["bos_token_id"], "do_sample": True,  # after the model's own
                  "eos_token_id": list(fam.generation_eos) if len(fam.generation_eos) > 1 else fam.generation_eos[0]}
    (folder / "generation_config.json").write_text(json.dumps(generation, indent=2))
    return folder
