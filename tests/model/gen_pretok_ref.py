#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# Writes tests/data/pretok_ref.txt: how each byte-level BPE pre-tokenizer of examples/llama/pretok.h
# splits held-out texts, by an independent engine: the published patterns of the models'
# tokenizer.json files run by the `regex` module (Unicode properties, backtracking as the
# originals). Test-generation time only:
#   pip install regex
#   python3 tests/model/gen_pretok_ref.py > tests/data/pretok_ref.txt
# Output: '#' comment lines, then one line per (pre-tokenizer, text):
#   <name> <text as UTF-8 hex, '-' when empty> <UTF-8 byte length of each piece, comma-separated>
import os
import random
import sys

import regex

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_tok_ref import TEXTS  # noqa: E402  (the SmolLM2 tokenizer's held-out texts)

GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
          r"\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")


def smollm(text):
    # Digits(individual_digits): every \p{N} alone, then the GPT-2 pattern on what lies between.
    pieces = []
    for part in regex.split(r"(\p{N})", text):
        if regex.fullmatch(r"\p{N}", part):
            pieces.append(part)
        elif part:
            pieces += regex.findall(GPT2, part)
    return pieces


SPLITTERS = {
    "smollm": smollm,
    "gpt-2": lambda t: regex.findall(GPT2, t),
    "llama-bpe": lambda t: regex.findall(LLAMA3, t),
    "qwen2": lambda t: regex.findall(QWEN2, t),
}

# Characters from long-assigned blocks only: the C side's categories are Unicode 14's.
POOL = (list("abcxyzSTDMLVER") + ["'s", "'T", "'re", "'VE", "'m", "'Ll", "'d", "'x"]
        + list("0123456789") + ["\u0663", "\u00b2", "\u2167", "\u00bd", "\uff11"]
        + [" ", " ", " ", "  ", "\t", "\n", "\n", "\r\n", "\r", "\x0b", "\x0c", "\x85", "\xa0", "\u2028", "\u3000"]
        + list(".,!?()-_#@\"`~;:/\\[]{}<>|") + ["\u20ac", "\U0001f999", "\U0001f600", "\u2713", "\u200d",
                                                  "\u0301", "\ufe0f", "\u00ab", "\u2014"]
        + ["\u00e9", "\u00df", "\u0416", "\u4e2d", "\u30a2", "\ud55c", "\u0639", "\u03a9", "\u0928\u094d"])


def random_texts(n, seed):
    rnd = random.Random(seed)
    return ["".join(rnd.choice(POOL) for _ in range(rnd.randint(1, 24))) for _ in range(n)]


def main():
    texts = TEXTS + random_texts(160, 20261203)
    print("# pre-tokenizer splits: tests/model/gen_pretok_ref.py, regex " + regex.__version__)
    for name, split in SPLITTERS.items():
        for text in texts:
            pieces = split(text)
            assert "".join(pieces) == text, (name, text, pieces)
            lens = ",".join(str(len(p.encode("utf-8"))) for p in pieces) or "-"
            print(name, text.encode("utf-8").hex() or "-", lens)


if __name__ == "__main__":
    main()
