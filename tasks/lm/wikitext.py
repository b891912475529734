"""WikiText (Merity et al. 2016) as fairseq reads it: files, tokenisation, dictionary, token blocks.

Tokenisation is ``fairseq-preprocess --only-source`` (fairseq/tokenizer.py ``tokenize_line``,
data/dictionary.py): each line -- blank lines too -- is whitespace-split (``\\s+`` normalised to
one space, stripped) and ends with ``</s>``. The dictionary is built from the training file only:
the specials ``<s> <pad> </s> <unk>`` (ids 0-3) first, then every training word by decreasing
count, ties in code-point order (``Counter(sorted(...)).most_common``), padded with
``madeupword0000``... to a multiple of 8 (--padding-factor 8). ``<unk>`` in the text is the
special, words absent from train become ``<unk>``.

Streams: the split's token ids concatenated; the model's input is the stream shifted right by one
with ``</s>`` first (fairseq TokenBlockDataset with targets: the first block's source starts with
eos). Blocks (``--sample-break-mode none``): contiguous slices that ignore line boundaries.
"""
from __future__ import annotations

import re
from array import array
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Iterable

import numpy as np
import torch
from torch.utils.data import Dataset

from bench_cli.core.errors import UserError

SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")
BOS, PAD, EOS, UNK = range(4)
PADDING_FACTOR = 8
IGNORE = -100  # target of positions that are not scored (context, padding)
SPLIT_FILES = {"train": "wiki.train.tokens", "valid": "wiki.valid.tokens", "test": "wiki.test.tokens"}
# fairseq's published facts about WikiText-103 v1 (examples/language_model: `fairseq-eval-lm ...
# | Evaluated 245569 tokens`; the binarised dictionary of the pretrained wiki103 models).
FACTS = {"wikitext103": {"dictionary": 267_744, "test_tokens": 245_569}}

_SPACE = re.compile(r"\s+")


def tokenize_line(line: str) -> list[str]:
    """fairseq.tokenizer.tokenize_line."""
    return _SPACE.sub(" ", line).strip().split()


@dataclass
class Dictionary:
    symbols: list[str]

    def __post_init__(self):
        self.index = {s: i for i, s in enumerate(self.symbols)}

    def __len__(self) -> int:
        return len(self.symbols)

    def encode(self, lines: Iterable[str]) -> np.ndarray:
        """Token ids of ``lines``: each line's words (unknown ones -> <unk>), then </s>."""
        index, out = self.index, array("i")  # C ints: WikiText-103's train split is 103M tokens
        for line in lines:
            out.extend([index.get(w, UNK) for w in tokenize_line(line)])
            out.append(EOS)
        return np.frombuffer(out, dtype=np.int32).copy()


def build_dictionary(lines: Iterable[str], padding_factor: int = PADDING_FACTOR) -> Dictionary:
    """fairseq Dictionary: add_file_to_dictionary, then finalize(threshold=-1, nwords=-1, padding_factor)."""
    counts: Counter = Counter()
    for line in lines:
        counts.update(tokenize_line(line))
    for special in SPECIALS:  # counted into the specials, which keep ids 0-3
        counts.pop(special, None)
    words = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    symbols = list(SPECIALS) + [w for w, _ in words]
    i = 0
    while len(symbols) % padding_factor:
        symbols.append(f"madeupword{i:04d}")
        i += 1
    return Dictionary(symbols)


def read_lines(path: Path) -> list[str]:
    """Lines as fairseq reads them (text mode, universal newlines, UTF-8). An empty file, or one
    that is not UTF-8 text, is a one-line error naming it."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.readlines()
    except UnicodeDecodeError as e:
        raise UserError(f"{path} is not UTF-8 text ({e.reason} at byte {e.start}); fetch it again with "
                        f"`attnbench data wikitext`") from None
    if not any(line.strip() for line in lines):
        raise UserError(f"{path} is empty: a WikiText split holds one article line per line; fetch it again "
                        f"with `attnbench data wikitext`")
    return lines


class TokenBlocks(Dataset):
    """Scored blocks of a token stream, each with up to ``context`` tokens of preceding context.

    Item k scores targets ``stream[s:e]`` (s = k * block, e = min(s + block, N)); its input is the
    shifted stream ``[</s>] + stream[:-1]`` from ``max(0, s - context)`` to ``e``, and the targets of
    the context positions are IGNORE. ``context = 0`` gives the training blocks (--tokens-per-sample
    512 --sample-break-mode none); ``block = 512 - 400, context = 400`` is ``fairseq-eval-lm
    --context-window 400 --tokens-per-sample 512`` (LMContextWindowDataset): every token is scored
    exactly once, with up to 400 tokens of context, windows advancing by 112."""

    def __init__(self, stream: torch.Tensor, block: int, context: int = 0):
        if block < 1 or context < 0:
            raise ValueError(f"bad token blocks: block {block}, context {context}")
        self.stream, self.block, self.context = stream, int(block), int(context)

    def __len__(self) -> int:
        return -(-len(self.stream) // self.block)

    def span(self, k: int) -> tuple[int, int, int]:
        """(input start, first scored position, end) of item k in stream coordinates."""
        s = k * self.block
        return max(0, s - self.context), s, min(s + self.block, len(self.stream))

    def __getitem__(self, k: int) -> dict:
        if not 0 <= k < len(self):
            raise IndexError(k)
        a, s, e = self.span(k)
        if a == 0:
            x = torch.cat([self.stream.new_tensor([EOS]), self.stream[: e - 1]])
        else:
            x = self.stream[a - 1: e - 1]
        y = self.stream[a:e].long().clone()
        y[: s - a] = IGNORE
        return {"x": x.long(), "y": y}
