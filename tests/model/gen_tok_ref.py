#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# Writes tests/data/smollm2_tok_ref.txt: held-out texts and the token ids an independent tokenizer
# (Hugging Face `tokenizers`, built from the GGUF's own vocabulary and merges with SmolLM2's
# pre-tokenizer: Digits(individual_digits) then ByteLevel) gives them. Test-generation time only:
#   pip install tokenizers gguf
#   python3 tests/model/gen_tok_ref.py ~/.cache/pagedkv/models/SmolLM2-135M-Instruct.Q4_1.gguf \
#       > tests/data/smollm2_tok_ref.txt
# Output: '#' comment lines (the text, escaped, for a reader), then one line per text:
#   <text as UTF-8 hex> <id> <id> ...
import sys

TEXTS = [
    # prose and punctuation
    "The quick brown fox jumps over the lazy dog.",
    "It's a test; we'll see what they've done, isn't it? I'm sure you'd agree.",
    "  Leading spaces and trailing spaces   ",
    "Hello,world!How's\teverything?",
    "QUOTES: \"double\" and 'single' and `back`",
    # numbers and whitespace runs before digits
    "Steps:\n\n1. Open the file.\n2. Read it.\n\n3. Close it.",
    "Total:  5",
    "Total: 5",
    "In 2024, 3.14159 and 1,000,000 and 0x1F and 1e-9.",
    "Fractions: \u00bd cup, \u00be hour, \u2153 of it; superscript x\u00b2 and subscript H\u2082O.",
    "Roman \u2167 and circled \u2460 and Arabic-Indic \u0661\u0662\u0663 and fullwidth \uff11\uff12.",
    "a\t\t1\n\t 2\r\n  3   4",
    "line one\nline two\n\n\nline five\n",
    "tabs\tand\t\tmore\t\t\ttabs",
    # code with aligned columns
    "int main(void)\n{\n\tint    x   = 1;\n\tdouble yy  = 2.0;\n\treturn x  + (int)yy;\n}\n",
    "| name   | value | unit |\n|--------|------:|------|\n| alpha  |    12 | ms   |\n| beta   |  3456 | KiB  |\n",
    "def f(a, b):\n    if a  >  b:\n        return a   # larger\n    return b\n",
    "    x = [1,  2,   3]\n    y = {'k':    'v'}\n",
    "#define PKV_MAX   64\n#define PKV_MIN    1\n",
    "SELECT id,   name\n  FROM users\n WHERE age >= 18;",
    # non-Latin scripts
    "\u4eca\u5929\u5929\u6c14\u5f88\u597d\uff0c\u6211\u4eec\u53bb\u516c\u56ed\u5427\u3002",
    "\u6771\u4eac\u306f\u65e5\u672c\u306e\u9996\u90fd\u3067\u3059\u3002\u30ab\u30bf\u30ab\u30ca\u3082\u3002",
    "\ud55c\uad6d\uc5b4 \ubb38\uc7a5\uc785\ub2c8\ub2e4.",
    "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440! \u041a\u0430\u043a \u0434\u0435\u043b\u0430? 42 \u0440\u0443\u0431\u043b\u044f.",
    "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645\u060c \u0643\u064a\u0641 \u062d\u0627\u0644\u0643\u061f",
    "\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd",
    "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e \u0967\u0968\u0969",
    "\u0393\u03b5\u03b9\u03ac \u03c3\u03bf\u03c5 \u03ba\u03cc\u03c3\u03bc\u03b5",
    "Caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u00fcber \u00c5ngstr\u00f6m",
    "e\u0301 (combining acute) and \u00e9 (precomposed)",
    # emoji and symbols
    "I \u2764\ufe0f pizza \U0001f355\U0001f355 and \U0001f468\u200d\U0001f469\u200d\U0001f467 families \U0001f44d\U0001f3fd",
    "Arrows \u2192 \u21d2 and math \u2211 \u221e \u2264 \u2260; currency \u20ac5 \u00a310 \u00a5100",
    "\u00a0non-breaking\u00a0spaces\u2003em\u2003space\u3000ideographic",
    # ChatML
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\n  indented  question 10?<|im_end|>\n",
    # edge cases
    "",
    " ",
    "\n",
    "  \n\n  ",
    "9",
    " 9",
    "\n\n9",
    "'s's'S'll'LL",
    "a'b'c",
    "\u00e9\u00e8\u00ea123\u00e0\u00e7",
]


def field_strs(reader, name):
    f = reader.fields[name]
    return [bytes(f.parts[i]).decode("utf-8") for i in f.data]


def field_ints(reader, name):
    f = reader.fields[name]
    return [int(f.parts[i][0]) for i in f.data]


def main():
    import gguf
    import tokenizers
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    reader = gguf.GGUFReader(sys.argv[1])
    tokens = field_strs(reader, "tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in field_strs(reader, "tokenizer.ggml.merges")]
    types = field_ints(reader, "tokenizer.ggml.token_type")
    vocab = {t: i for i, t in reversed(list(enumerate(tokens)))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(tokens, types) if ty in (3, 4)])
    print("# SmolLM2-135M-Instruct tokenizer references: tests/model/gen_tok_ref.py, tokenizers "
          + tokenizers.__version__)
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=False).ids
        assert tok.decode(ids, skip_special_tokens=False) == text, text
        print("# " + text.encode("unicode_escape").decode("ascii"))
        print(" ".join([text.encode("utf-8").hex() or "-"] + [str(i) for i in ids]))


if __name__ == "__main__":
    main()
