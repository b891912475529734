"""Long Range Arena (Tay et al. 2021) data: where the files are, how they are read and tokenised.

Data come in the official formats, from the data root (``paths.data_root``, below ``DATA``):

- the LRA release (``lra_release.gz``, unpacked to ``DATA/lra_release/``; a doubly nested
  ``DATA/lra_release/lra_release/`` is accepted too):
  ``listops-1000/basic_{train,val,test}.tsv``, ``tsv_data/new_aan_pairs.{train,eval,test}.tsv``,
  ``pathfinder32/curv_contour_length_14/{imgs/*/sample_*.png, metadata/*.npy}``;
  ``attnbench data lra`` downloads and unpacks it;
- ListOps generated offline (``attnbench data lra_listops --generate``, the official generator,
  tasks/lra/listops_generator.py) in the same TSV format under ``DATA/lra_generated/listops-1000/``,
  used as the dataset ``listops_generated`` so records never mistake it for the release;
- IMDB (text) through HF ``datasets`` (``stanfordnlp/imdb``, in the HF cache) or the original
  ``aclImdb_v1.tar.gz`` unpacked to ``DATA/aclImdb/``;
- CIFAR-10 (image) in torchvision's folder format ``DATA/cifar-10-batches-py/``, read with
  torchvision's CIFAR10 (through tasks/vision/torchvision_shim.py).

Preprocessing follows the LRA input pipelines as the PyTorch LRA code (Nystromformer, Transformer-LS:
primal-dual Appendix A.2) ran them: token 0 is padding and the mask is ``ids != 0``; ListOps is
whitespace-tokenised over a fixed 15-token vocabulary (the fixed LRA pipeline: parentheses dropped,
``]`` kept as a token) and truncated to 2000 tokens; Text and Retrieval are bytes + 1 (tfds
ByteTextEncoder) truncated to 4000; Image is CIFAR-10 in grayscale (tf.image.rgb_to_grayscale),
pixel values as tokens; Pathfinder's PNG pixels are tokens. Sequences are padded to 2048 / 4096 /
4096 / 1024 / 1024 as the PyTorch code does. Tokenised splits are cached under ``DATA/lra_cache/``.
For Image and Pathfinder the PyTorch code's mask ``ids != 0`` also hides black pixels; that is the
default (``pixel_mask: nonzero``), ``pixel_mask: none`` is the JAX LRA code (no mask).

There is no offline Pathfinder generator: the official one (drewlinsley/pathfinder, snakes2.py) draws
anti-aliased paddles with OpenCV and resizes with the removed ``scipy.misc.imresize``; a re-drawing
would not be the same distribution, so Pathfinder needs the release.
"""
from __future__ import annotations

import csv
import re
from pathlib import Path

import numpy as np
import torch

from bench_cli.core.errors import UserError, unknown_choice
from attnbench.tasks.data import cached as _cached

IMDB_HF = "stanfordnlp/imdb"

# ListOps vocabulary after the fixed LRA pipeline (']' renamed 'X', parentheses removed, whitespace
# tokens). The release code built the same set from the data in hash order; ids here are fixed.
LISTOPS_TOKENS = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "[MAX", "[MED", "[MIN", "[SM", "]"]
# The first LRA release's pipeline (tfds Tokenizer, alphanumeric only) dropped every bracket.
LISTOPS_TOKENS_ALNUM = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "MAX", "MED", "MIN", "SM"]
LISTOPS_DATASETS = ("listops", "listops_generated")
PATHFINDER_DIFFICULTIES = ("curv_baseline", "curv_contour_length_9", "curv_contour_length_14")  # easy / inter / hard
PATHFINDER_DEFAULT = "curv_contour_length_14"
AAN_SPLITS = {"train": "train", "val": "eval", "test": "test"}  # our split -> the release's file


# --- where the files are ------------------------------------------------------------------------
def release_candidates(data_root: Path) -> list[Path]:
    root = Path(data_root).expanduser()
    return [root / "lra_release", root / "lra_release" / "lra_release"]


def release_file(data_root: Path, relative: str) -> Path | None:
    """``relative`` inside the unpacked release, or None."""
    for base in release_candidates(data_root):
        if (base / relative).exists():
            return base / relative
    return None


def generated_listops_dir(data_root: Path) -> Path:
    return Path(data_root).expanduser() / "lra_generated" / "listops-1000"


def cache_dir(data_root: Path) -> Path:
    return Path(data_root).expanduser() / "lra_cache"


def cached(data_root: Path, name: str, key: dict, build):
    """Tokenised splits cached under ``<data root>/lra_cache/``."""
    return _cached(cache_dir(data_root), name, key, build)


def listops_files(dataset: str, data_root: Path) -> dict[str, Path] | None:
    """basic_{train,val,test}.tsv of the release's ListOps or of the generated set, or None."""
    if dataset == "listops_generated":
        d = generated_listops_dir(data_root)
    else:
        d = release_file(data_root, "listops-1000")
        if d is None:
            return None
    paths = {s: d / f"basic_{s}.tsv" for s in ("train", "val", "test")}
    return paths if all(p.is_file() for p in paths.values()) else None


def aan_files(data_root: Path) -> dict[str, Path] | None:
    """The release's new_aan_pairs.{train,eval,test}.tsv (Retrieval), or None."""
    d = release_file(data_root, "tsv_data")
    if d is None:
        return None
    paths = {s: d / f"new_aan_pairs.{f}.tsv" for s, f in AAN_SPLITS.items()}
    return paths if all(p.is_file() for p in paths.values()) else None


def pathfinder_dir(data_root: Path, difficulty: str = PATHFINDER_DEFAULT) -> Path | None:
    """pathfinder32/<difficulty>/ of the release if it lists examples (metadata/*.npy), or None."""
    d = release_file(data_root, f"pathfinder32/{difficulty}")
    return d if d is not None and any((d / "metadata").glob("*.npy")) else None


def acl_dir(data_root: Path) -> Path | None:
    """aclImdb_v1.tar.gz unpacked under the data root, or None."""
    d = Path(data_root).expanduser() / "aclImdb"
    return d if (d / "train" / "pos").is_dir() and (d / "test" / "neg").is_dir() else None


# --- tokenisation (the LRA input pipelines) ------------------------------------------------------
def listops_vocab(style: str) -> dict[str, int]:
    tokens = {"lra": LISTOPS_TOKENS, "lra_alnum": LISTOPS_TOKENS_ALNUM}.get(style)
    if tokens is None:
        raise unknown_choice("listops tokenizer", style, ["lra", "lra_alnum"])
    return {t: i + 1 for i, t in enumerate(tokens)}  # 0 is padding; len+1 is the OOV bucket


def listops_tokens(source: str, style: str = "lra") -> list[str]:
    """Tokens of a ListOps Source as the LRA pipeline sees them.

    ``lra``: the fixed pipeline (parentheses removed, ']' kept, whitespace split).
    ``lra_alnum``: the first release's pipeline, alphanumeric runs only (all brackets dropped)."""
    if style == "lra":
        return source.replace("(", " ").replace(")", " ").split()
    if style == "lra_alnum":
        return [t for t in re.split(r"\W+", source) if t]
    raise unknown_choice("listops tokenizer", style, ["lra", "lra_alnum"])


def encode_listops(source: str, vocab: dict[str, int], style: str = "lra") -> list[int]:
    oov = len(vocab) + 1
    return [vocab.get(t, oov) for t in listops_tokens(source, style)]


def encode_bytes(text: str | bytes, max_len: int) -> np.ndarray:
    """tfds ByteTextEncoder: UTF-8 bytes + 1 (0 is padding), truncated to ``max_len``."""
    raw = text.encode("utf-8") if isinstance(text, str) else bytes(text)
    return np.frombuffer(raw[:max_len], dtype=np.uint8).astype(np.int16) + 1


def rgb_to_gray(images: np.ndarray) -> np.ndarray:
    """tf.image.rgb_to_grayscale on uint8 (N, H, W, 3): weights (0.2989, 0.5870, 0.1140) on [0, 1]
    floats, converted back with convert_image_dtype (``x * 255.5`` truncated)."""
    f = images.astype(np.float32) / np.float32(255.0)
    gray = f @ np.array([0.2989, 0.5870, 0.1140], dtype=np.float32)
    return np.clip(gray * np.float32(255.5), 0, 255).astype(np.uint8)


def read_listops_tsv(path: Path) -> tuple[list[str], np.ndarray]:
    with open(path, newline="") as f:
        reader = csv.reader(f, delimiter="\t")
        header = next(reader, None)
        if header is None or [h.strip() for h in header[:2]] != ["Source", "Target"]:
            raise UserError(f"{path}: expected a 'Source<TAB>Target' header (LRA ListOps TSV)")
        sources, targets = [], []
        for row in reader:
            if not row:
                continue
            sources.append(row[0])
            targets.append(int(float(row[1])))
    return sources, np.asarray(targets, dtype=np.int64)


def read_aan_tsv(path: Path) -> tuple[list[bytes], list[bytes], np.ndarray]:
    """new_aan_pairs.*.tsv: label, id1, id2, text1, text2; tab-separated, no header, no quoting."""
    t1, t2, labels = [], [], []
    with open(path, "rb") as f:
        for n, line in enumerate(f, 1):
            line = line.rstrip(b"\r\n")
            if not line:
                continue
            parts = line.split(b"\t")
            if len(parts) < 5:
                raise UserError(f"{path}:{n}: expected 5 tab-separated fields (label, id1, id2, text1, text2)")
            labels.append(int(float(parts[0])))
            t1.append(parts[3])
            t2.append(b"\t".join(parts[4:]))
    return t1, t2, np.asarray(labels, dtype=np.int64)


def take(split: dict, idx) -> dict:
    return {k: v[torch.as_tensor(np.asarray(idx), dtype=torch.long)] for k, v in split.items()}


def read_acl(directory: Path) -> dict[str, tuple[list[bytes], np.ndarray]]:
    """aclImdb/{train,test}/{neg,pos}/*.txt: (texts, labels) per split, files in name order."""
    out = {}
    for split in ("train", "test"):
        texts, labels = [], []
        for label, sub in ((0, "neg"), (1, "pos")):
            files = sorted((directory / split / sub).glob("*.txt"), key=lambda p: p.name)
            texts += [p.read_bytes() for p in files]
            labels += [label] * len(files)
        out[split] = (texts, np.asarray(labels, dtype=np.int64))
    return out


def read_pathfinder_examples(d: Path) -> tuple[list[Path], np.ndarray]:
    """Images and labels listed by metadata/*.npy (text lines: subdir, file, index, label, ...)."""
    paths, labels = [], []
    for meta in sorted((d / "metadata").glob("*.npy"), key=lambda p: (len(p.stem), p.stem)):
        for line in meta.read_text().split("\n"):
            fields = line.split(" ")
            if len(fields) < 4:
                continue
            p = d / fields[0] / fields[1]
            if not p.is_file() or p.stat().st_size == 0:  # the LRA pipeline skips empty images
                continue
            paths.append(p)
            labels.append(int(fields[3]))
    return paths, np.asarray(labels, dtype=np.int64)
