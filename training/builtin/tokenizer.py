"""Byte-level BPE tokenizer for the built-in model, trained here on offline English plus scene text.

The English side is what any Python install carries: the docstrings of the standard library and the
licence texts under /usr/share/common-licenses, so chat prompts that are not about shapes still
tokenize into sensible pieces. The chat template is LLaVA-1.5's (testing/checkpoint_tools.py) with
two changes. A message typed all in capitals is put in lower case. The generation prompt ends
"ASSISTANT: " (with the space) and answers are tokenized on their own after it, so the first answer
token is a bare word ("Red") and decoded answers carry no leading space. The scene corpus therefore
holds answers as separate texts, which gives the vocabulary whole-word tokens for them at the start of a text.
"""

from __future__ import annotations

import ast
import random
import sys
from pathlib import Path

from transformers import PreTrainedTokenizerFast

from vlserve.builtin import scenes
from vlserve.testing.bpe import train_byte_level_bpe
from vlserve.testing.checkpoint_tools import BOS, EOS, IMAGE_TOKEN, LLAVA_CHAT_TEMPLATE, PAD, llava_tokenizer

IMAGE = IMAGE_TOKEN
SPECIAL_TOKENS = [BOS, EOS, PAD, IMAGE]
GENERATION_PROMPT = "ASSISTANT: "
_LLAVA_GENERATION = "{% if add_generation_prompt %}ASSISTANT:{% endif %}"
assert _LLAVA_GENERATION in LLAVA_CHAT_TEMPLATE, "LLaVA-1.5 template changed: update the built-in one"
# Text typed all in capitals ("WHERE IS THE SQUARE?") is turned to lower case: its byte-level pieces
# share nothing with the lower-case words the model knows. (Sentence case, as before stage 7 shipped,
# left a capitalised first word the generator writes rarely: "Color of the circle?" was answered "A purple
# circle.", "color of the circle?" "Purple."; lower case took the independent set's colour questions from
# 89.7% to 100%.)
_SHOUTED = "{t}.lower() if {t} == {t}.upper() and {t} != {t}.lower() else {t}"
BUILTIN_CHAT_TEMPLATE = LLAVA_CHAT_TEMPLATE.replace(
    _LLAVA_GENERATION, "{% if add_generation_prompt %}" + GENERATION_PROMPT + "{% endif %}")
for _text in ("part['text']", "message['content']"):
    assert "{{ " + _text + " }}" in BUILTIN_CHAT_TEMPLATE, "LLaVA-1.5 template changed: update the built-in one"
    BUILTIN_CHAT_TEMPLATE = BUILTIN_CHAT_TEMPLATE.replace("{{ " + _text + " }}",
                                                          "{{ " + _SHOUTED.format(t=_text) + " }}")


def english_corpus(max_chars: int = 3_000_000) -> list[str]:
    """Docstrings of the standard library and licence texts found on this machine."""
    texts: list[str] = []
    stdlib = Path(sys.base_prefix) / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    for path in sorted(stdlib.glob("**/*.py")):
        if "test" in path.parts or "site-packages" in path.parts or "idlelib" in path.parts:
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8", errors="ignore"))
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc) > 40:
                    texts.append(doc)
    licences = Path("/usr/share/common-licenses")
    if licences.is_dir():
        texts += [p.read_text(errors="ignore") for p in sorted(licences.iterdir()) if p.is_file()]
    out, total = [], 0
    for t in texts:
        if total >= max_chars:
            break
        out.append(t)
        total += len(t)
    return out


def scene_corpus(n: int, seed: int) -> list[str]:
    """Prompts about generated scenes and, as separate texts, their answers (as they are tokenized)."""
    rng = random.Random(seed)
    out = [scenes.CANNOT_TELL]
    for i in range(n):
        scene = scenes.video_scene(rng) if i % 4 == 0 else scenes.image_scene(rng)
        for qa in scene.qas:
            out += [f"USER: {IMAGE}\n{qa.question} {GENERATION_PROMPT}", qa.answer + EOS]
    return out


def train_tokenizer(vocab_size: int = 3000, seed: int = 0) -> PreTrainedTokenizerFast:
    tok = train_byte_level_bpe(english_corpus() + scene_corpus(3000, seed), vocab_size, SPECIAL_TOKENS)
    fast = llava_tokenizer(tok, 2048, unk=False, clean_up_tokenization_spaces=False)
    fast.chat_template = BUILTIN_CHAT_TEMPLATE
    return fast


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Train the built-in model's tokenizer.")
    parser.add_argument("--out", required=True)
    parser.add_argument("--vocab-size", type=int, default=3000)
    args = parser.parse_args()
    train_tokenizer(args.vocab_size).save_pretrained(args.out)
