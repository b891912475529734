"""Word tokenisation and vocabularies as keras made them for the keras-io examples papers/002 ran
(Sec. 4: "implemented in Keras ... using the examples available at keras.io/examples").

Classification (text_classification_with_transformer.py reads ``keras.datasets.imdb``):

- words: ``keras.preprocessing.text.text_to_word_sequence`` -- lowercase, every character of
  ``KERAS_FILTERS`` replaced by a space, split on spaces;
- ids: ``keras.datasets.imdb.load_data`` -- word ranks by descending training frequency (1 = the most
  frequent, ties in order of first appearance as ``Tokenizer.fit_on_texts``), id = rank + ``index_from``
  (3), ``start_char`` 1 prepended, ids >= ``num_words`` (and words never seen in training) become
  ``oov_char`` 2, 0 is padding;
- length: ``keras.utils.pad_sequences`` -- **pre**-padding and **pre**-truncation (a long review keeps
  its last ``maxlen`` ids).

Translation (neural_machine_translation_with_transformer.py, ``TextVectorization``):

- standardisation: lowercase as ``tf.strings.lower`` does (ASCII letters only), then the strip
  characters removed (English: ``string.punctuation``; Spanish: that plus "¿", minus "[" and "]" so
  that ``[start]``/``[end]`` survive); split on ASCII whitespace (``tf.strings.split``: a no-break
  space stays inside its token);
- vocabulary (``IndexLookup.adapt``): '' (padding, 0) and '[UNK]' (1) first, then the training
  tokens by descending count, ties by descending UTF-8 byte order, up to ``max_tokens`` in all;
- ids truncated (at the end) to the output sequence length.
"""
from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable

import numpy as np

# keras.preprocessing.text.text_to_word_sequence's default filters
KERAS_FILTERS = '!"#$%&()*+,-./:;<=>?@[\\]^_`{|}~\t\n'
# keras.datasets.imdb.load_data defaults
PAD, START_CHAR, OOV_CHAR, INDEX_FROM = 0, 1, 2, 3

# TextVectorization: DEFAULT_STRIP_REGEX is the 32 characters of string.punctuation
ENGLISH_STRIP = string.punctuation
# the keras NMT example's custom_standardization for Spanish
SPANISH_STRIP = (string.punctuation + "¿").replace("[", "").replace("]", "")
MASK_TOKEN, OOV_TOKEN = "", "[UNK]"
START_TOKEN, END_TOKEN = "[start]", "[end]"

_FILTER_TABLE = str.maketrans({c: " " for c in KERAS_FILTERS})
_ASCII_SPACE = re.compile(r"[ \t\n\r\f\v]+")
_ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)


# --- classification (keras.datasets.imdb) -----------------------------------------------------------
def text_to_word_sequence(text: str) -> list[str]:
    """keras' text_to_word_sequence with its defaults (lower=True, split=' ')."""
    return text.lower().translate(_FILTER_TABLE).split()


def rank_words(documents: Iterable[list[str]]) -> list[str]:
    """Distinct words by descending count; ties keep the order of first appearance (keras
    Tokenizer.fit_on_texts sorts its insertion-ordered counts with a stable sort). Rank = index + 1."""
    counts: Counter = Counter()
    for words in documents:
        counts.update(words)
    return sorted(counts, key=counts.__getitem__, reverse=True)  # sorted() stays stable with reverse


class WordIndex:
    """Word -> id of ``keras.datasets.imdb.load_data(num_words=...)`` for a vocabulary ranked on the
    training texts: id = rank + index_from, kept when id < num_words, else ``oov_char``."""

    def __init__(self, ranked_words: list[str], num_words: int, index_from: int = INDEX_FROM,
                 start_char: int = START_CHAR, oov_char: int = OOV_CHAR):
        if num_words <= index_from + 1:
            raise ValueError(f"num_words={num_words} leaves no word ids (ids start at {index_from + 1})")
        self.num_words, self.start_char, self.oov_char = num_words, start_char, oov_char
        kept = ranked_words[: num_words - index_from - 1]  # rank r (1-based) -> id r + index_from < num_words
        self.ids = {w: r + index_from for r, w in enumerate(kept, start=1)}

    def __len__(self) -> int:
        return len(self.ids)

    def encode(self, words: list[str]) -> list[int]:
        oov = self.oov_char
        return [self.start_char] + [self.ids.get(w, oov) for w in words]


def pad_sequences(sequences, maxlen: int | None = None, padding: str = "pre", truncating: str = "pre",
                  value: int = 0, dtype=np.int32, chunk: int = 1 << 16) -> np.ndarray:
    """keras.utils.pad_sequences: an (n, maxlen) array; 'pre' truncation keeps the last ids,
    'pre' padding puts the padding first. maxlen None = the longest sequence. ``sequences`` may be
    a generator: rows are written ``chunk`` at a time, so millions of reviews never exist as
    Python lists at once."""
    if padding not in ("pre", "post") or truncating not in ("pre", "post"):
        raise ValueError("padding and truncating are 'pre' or 'post'")
    if maxlen is None:
        sequences = list(sequences)
        maxlen = max((len(s) for s in sequences), default=0)
    blocks, block, i = [], None, 0
    for s in sequences:
        if block is None or i == len(block):
            block, i = np.full((chunk, maxlen), value, dtype=dtype), 0
            blocks.append(block)
        kept = (s[-maxlen:] if truncating == "pre" else s[:maxlen]) if maxlen else []
        if len(kept):
            if padding == "pre":
                block[i, maxlen - len(kept):] = kept
            else:
                block[i, : len(kept)] = kept
        i += 1
    if not blocks:
        return np.full((0, maxlen), value, dtype=dtype)
    blocks[-1] = blocks[-1][:i]
    return np.concatenate(blocks) if len(blocks) > 1 else blocks[0]


# --- translation (TextVectorization) -----------------------------------------------------------------
def standardize(text: str, strip: str, lowercase: str = "ascii") -> str:
    """TextVectorization's lower-and-strip: ``lowercase='ascii'`` is tf.strings.lower (the keras
    example: 'É' stays 'É'), ``'unicode'`` is str.lower."""
    if lowercase == "ascii":
        text = text.translate(_ASCII_LOWER)
    elif lowercase == "unicode":
        text = text.lower()
    else:
        raise ValueError(f"lowercase is 'ascii' or 'unicode', not {lowercase!r}")
    return text.translate({ord(c): None for c in strip}) if strip else text


def whitespace_split(text: str) -> list[str]:
    """TextVectorization's split='whitespace' (tf.strings.split): runs of ASCII whitespace."""
    return [t for t in _ASCII_SPACE.split(text) if t]


class Vocabulary:
    """A TextVectorization vocabulary: '' (0), '[UNK]' (1), then the adapted tokens."""

    def __init__(self, tokens: list[str]):
        if tokens[:2] != [MASK_TOKEN, OOV_TOKEN]:
            raise ValueError("a vocabulary starts with '' and '[UNK]'")
        self.tokens = list(tokens)
        self.index = {t: i for i, t in enumerate(self.tokens)}

    @classmethod
    def adapt(cls, texts: Iterable[str], max_tokens: int) -> Vocabulary:
        """IndexLookup.adapt on standardised texts: count whitespace tokens, sort by count and
        break ties by the tokens' bytes (np.lexsort((tokens, counts))[::-1]), keep max_tokens - 2."""
        counts: Counter = Counter()
        for t in texts:
            counts.update(whitespace_split(t))
        counts.pop(MASK_TOKEN, None)
        counts.pop(OOV_TOKEN, None)
        ranked = sorted(counts, key=lambda w: (counts[w], w.encode("utf-8")), reverse=True)
        return cls([MASK_TOKEN, OOV_TOKEN] + ranked[: max(0, max_tokens - 2)])

    def __len__(self) -> int:
        return len(self.tokens)

    def encode(self, text: str, length: int | None = None) -> list[int]:
        ids = [self.index.get(t, 1) for t in whitespace_split(text)]
        return ids[:length] if length is not None else ids

    def decode(self, ids) -> list[str]:
        return [self.tokens[i] for i in ids]
