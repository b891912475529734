"""Long Range Arena (Tay et al. 2021): ListOps, Text, Retrieval, Image, Pathfinder.

Data come in the official formats, from the data root (``paths.data_root``, below ``DATA``):

- the LRA release (``lra_release.gz``, unpacked to ``DATA/lra_release/``; a doubly nested
  ``DATA/lra_release/lra_release/`` is accepted too):
  ``listops-1000/basic_{train,val,test}.tsv``, ``tsv_data/new_aan_pairs.{train,eval,test}.tsv``,
  ``pathfinder32/curv_contour_length_14/{imgs/*/sample_*.png, metadata/*.npy}``;
  ``attnbench data lra`` downloads and unpacks it;
- ListOps generated offline (``attnbench data lra_listops --generate``, the official generator,
  tasks/listops_generator.py) in the same TSV format under ``DATA/lra_generated/listops-1000/``,
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

import math

import csv
import json
import os
import re
import shutil
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path

import numpy as np
import torch

from bench_cli.errors import DataNotFoundError, UserError, unknown_choice
from tasks import register_task
from tasks.base import Task, TensorDictDataset
from tasks.data import (CACHE_VERSION, cache_path, cached as _cached, download, file_signature as _signature,
                        load_hf_dataset, pad_rows, random_split, unpack)
from tasks.fetch import Fetcher, register_fetcher

LRA_URL = "https://storage.googleapis.com/long-range-arena/lra_release.gz"
CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
CIFAR10_MD5 = "c58f30108f718f92721af3b95e74349a"
IMDB_HF = "stanfordnlp/imdb"

# ListOps vocabulary after the fixed LRA pipeline (']' renamed 'X', parentheses removed, whitespace
# tokens). The release code built the same set from the data in hash order; ids here are fixed.
LISTOPS_TOKENS = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "[MAX", "[MED", "[MIN", "[SM", "]"]
# The first LRA release's pipeline (tfds Tokenizer, alphanumeric only) dropped every bracket.
LISTOPS_TOKENS_ALNUM = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "MAX", "MED", "MIN", "SM"]


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


# --- downloads ------------------------------------------------------------------------------------
def fetch_release(data_root: Path, force: bool = False) -> Path:
    """Download ``lra_release.gz`` and unpack it under the data root; returns the release folder."""
    root = Path(data_root).expanduser()
    if not force:
        for base in release_candidates(root):
            if (base / "listops-1000").is_dir() or (base / "tsv_data").is_dir():
                return base
    archive = root / "lra_release.gz"
    if force or not archive.is_file():
        print(f"downloading {LRA_URL} (several GB) to {archive} ...", file=sys.stderr)
        download(LRA_URL, archive, what="the LRA release", where=f"{root}/lra_release/listops-1000")
    unpack(archive, root)
    for base in release_candidates(root):
        if base.is_dir():
            return base
    raise DataNotFoundError(f"{archive} did not unpack to {root}/lra_release/; unpack it there by hand")


def fetch_cifar10(data_root: Path, force: bool = False) -> Path:
    root = Path(data_root).expanduser()
    target = root / "cifar-10-batches-py"
    if target.is_dir() and not force:
        return target
    archive = root / "cifar-10-python.tar.gz"
    download(CIFAR10_URL, archive, what="CIFAR-10 python version", where=str(target), md5=CIFAR10_MD5)
    unpack(archive, root)
    return target


# --- the tasks ------------------------------------------------------------------------------------
PATHFINDER_DIFFICULTIES = ("curv_baseline", "curv_contour_length_9", "curv_contour_length_14")  # easy / inter / hard


def _flag(option: str) -> str:
    return "--" + option.replace("_", "-")


class LRATask(Task):
    """Shared LRA machinery: cached tokenised splits, protocols, synthetic shapes, the model."""

    fetcher = "lra"
    n_classes: int = 2
    dual: bool = False
    pixel_task: bool = False  # Image, Pathfinder: pixels as tokens
    DATASETS: tuple[str, ...] = ()
    VAL_NOTE = ""  # appended to the description of a validation split carved from train

    def __init__(self, cfg, data_root):
        super().__init__(cfg, data_root)
        # Padding masks are needed for padded text-like data and for the code's 'nonzero' pixel mask.
        self.requires = {"padding_mask": self.uses_mask}
        self.source = None
        self.seq_len = int(cfg.get("seq_len") or 0)

    @property
    def uses_mask(self) -> bool:
        if self.pixel_task:
            return str(self.cfg.get("pixel_mask", "nonzero")) == "nonzero"
        return True

    # --- data -------------------------------------------------------------------------------
    @classmethod
    def datasets(cls, data_root: Path | None = None) -> list[str]:
        return list(cls.DATASETS)

    def check_name(self) -> None:
        if self.dataset_name not in self.DATASETS:
            raise unknown_choice(f"{self.name} dataset", self.dataset_name, self.DATASETS)

    def load(self) -> dict[str, dict[str, torch.Tensor]]:
        """Tokenised official splits {'train', 'val'?, 'test'}: dicts of tensors (cached)."""
        raise NotImplementedError

    def setup(self, protocol: str) -> None:
        self.check_data()
        if protocol not in ("holdout", "paper"):
            raise unknown_choice("protocol", protocol, ["holdout", "paper"])
        self.seq_len = int(self.cfg.seq_len)
        data = self.load()
        if "val" not in data and protocol == "holdout":  # no official validation split: carve one from train
            fit, val = random_split(len(data["train"]["y"]), float(self.cfg.get("val_fraction", 0.1)),
                                     int(self.cfg.get("split_seed", 0)))
            data = {"train": take(data["train"], fit), "val": take(data["train"], val), "test": data["test"]}
            self.val_source = (f"{self.cfg.get('val_fraction', 0.1)} of train (split_seed {self.cfg.get('split_seed', 0)})"
                               + self.VAL_NOTE)
        subset = self.cfg.get("subset") or {}
        for split in list(data):
            limit = subset.get(split)
            if limit:
                data[split] = take(data[split], np.arange(min(int(limit), len(data[split]["y"]))))
        if protocol == "paper":
            data.pop("val", None)
        for split, d in data.items():
            for k, v in d.items():
                if k.startswith("x") and v.shape[1] > self.seq_len:
                    raise UserError(f"{self.name}: sequences of length {v.shape[1]} exceed task.seq_len={self.seq_len}")
                if k.startswith("x") and v.shape[1] < self.seq_len:  # pad max_len -> seq_len, as the PyTorch code
                    d[k] = torch.nn.functional.pad(v, (0, self.seq_len - v.shape[1]))
        self.splits = {k: TensorDictDataset(**v) for k, v in data.items()}

    # --- shapes without data ----------------------------------------------------------------------
    def setup_synthetic(self, seq_len: int) -> None:
        self.source, self.splits, self.seq_len = "synthetic", {}, int(seq_len)

    def token_range(self) -> tuple[int, int]:
        """[low, high) of the ids a real sample may contain (synthetic batches draw from it)."""
        return 1, int(self.cfg.vocab_size)

    def synthetic_batch(self, batch_size: int, seq_len: int, device="cpu") -> dict:
        g = torch.Generator().manual_seed(0)
        lo, hi = self.token_range()
        batch = {"x": torch.randint(lo, hi, (batch_size, seq_len), generator=g)}
        if self.dual:
            batch["x2"] = torch.randint(lo, hi, (batch_size, seq_len), generator=g)
        batch["y"] = torch.randint(0, self.n_classes, (batch_size,), generator=g)
        return {k: v.to(device) for k, v in batch.items()}

    # --- model --------------------------------------------------------------------------------------
    def build_model(self, model_cfg):
        from models.lra import build_lra_model

        if not self.seq_len:
            raise UserError(f"{self.name}: call setup() or setup_synthetic() before build_model()")
        return build_lra_model(model_cfg, self.cfg.backbone, int(self.cfg.vocab_size), self.seq_len,
                               self.n_classes, dual=self.dual, grid=self.token_grid())

    def token_grid(self) -> tuple[int, int] | None:
        """The 2D layout of the tokens (images: pixel rows x columns), for Conv2D attention."""
        side = math.isqrt(self.seq_len)
        return (side, side) if self.pixel_task and side * side == self.seq_len else None

    def _mask(self, x: torch.Tensor):
        return (x != 0) if self.uses_mask else None

    def model_inputs(self, batch: dict) -> dict:
        if self.dual:
            return {"x1": batch["x"], "x2": batch["x2"], "mask1": self._mask(batch["x"]), "mask2": self._mask(batch["x2"])}
        return {"x": batch["x"], "mask": self._mask(batch["x"])}

    def describe(self) -> dict:
        out = {"source": str(self.source), "seq_len": self.seq_len, "classes": self.n_classes,
               "vocab_size": int(self.cfg.vocab_size)}
        if getattr(self, "val_source", None) and "val" in self.splits:
            out["val_split"] = self.val_source
        out.update({f"n_{k}": len(v) for k, v in self.splits.items()})
        return out


@register_task
class LRAListOps(LRATask):
    """ListOps (Nangia & Bowman 2018) at LRA scale: nested MAX/MIN/MED/SUM_MOD, 10 classes, 2K."""

    name = "lra_listops"
    fetcher = "lra_listops"
    n_classes = 10
    DATASETS = ("listops", "listops_generated")

    @classmethod
    def files(cls, dataset: str, data_root: Path) -> dict[str, Path] | None:
        if dataset == "listops_generated":
            d = generated_listops_dir(data_root)
        else:
            d = release_file(data_root, "listops-1000")
            if d is None:
                return None
        paths = {s: d / f"basic_{s}.tsv" for s in ("train", "val", "test")}
        return paths if all(p.is_file() for p in paths.values()) else None

    @classmethod
    def dataset_status(cls, dataset: str, data_root: Path) -> str:
        return "local" if cls.files(dataset, data_root) else "missing"

    def check_data(self) -> None:
        self.check_name()
        if self.files(self.dataset_name, self.data_root) is None:
            root = self.data_root
            if self.dataset_name == "listops_generated":
                raise DataNotFoundError(
                    f"generated ListOps not found in {generated_listops_dir(root)}/: "
                    f"run `attnbench data lra_listops --generate`")
            raise DataNotFoundError(
                f"LRA ListOps not found: put basic_{{train,val,test}}.tsv in {root}/lra_release/listops-1000/ "
                f"(`attnbench data lra` downloads the release) or generate it offline with "
                f"`attnbench data lra_listops --generate` and use task.dataset=listops_generated")

    def load(self):
        style = str(self.cfg.get("tokenizer", "lra"))
        vocab = listops_vocab(style)
        max_len = int(self.cfg.max_len)
        paths = self.files(self.dataset_name, self.data_root)
        self.source = paths["train"].parent
        if len(vocab) + 2 > int(self.cfg.vocab_size):
            raise UserError(f"lra_listops: vocab_size={self.cfg.vocab_size} < {len(vocab) + 2} token ids")

        def build():
            out = {}
            for split, p in paths.items():
                sources, targets = read_listops_tsv(p)
                ids = [encode_listops(s, vocab, style)[:max_len] for s in sources]
                out[split] = {"x": pad_rows(ids, max_len, torch.uint8), "y": torch.from_numpy(targets)}
            return out

        data, _ = cached(self.data_root, f"listops-{self.dataset_name}",
                         {"files": _signature(paths.values()), "tokenizer": style, "max_len": max_len}, build)
        bad = {s: int(d["y"].max()) for s, d in data.items() if int(d["y"].max()) >= self.n_classes or int(d["y"].min()) < 0}
        if bad:
            raise UserError(f"lra_listops: labels outside 0..9 in {bad}")
        return data

    def token_range(self):
        return 1, len(listops_vocab(str(self.cfg.get("tokenizer", "lra")))) + 1

    def describe(self) -> dict:
        out = super().describe()
        meta = Path(str(self.source)) / "generator.json"
        if self.dataset_name == "listops_generated" and meta.is_file():  # say how the data were made
            out["generator"] = json.loads(meta.read_text())
        return out


@register_task
class LRAText(LRATask):
    """Byte-level IMDB sentiment (Maas et al. 2011), 2 classes, 4K bytes."""

    name = "lra_text"
    fetcher = "lra_text"
    n_classes = 2
    DATASETS = ("imdb",)
    VAL_NOTE = "; LRA itself validates on the test set, i.e. protocol=paper"

    @classmethod
    def acl_dir(cls, data_root: Path) -> Path | None:
        d = Path(data_root).expanduser() / "aclImdb"
        return d if (d / "train" / "pos").is_dir() and (d / "test" / "neg").is_dir() else None

    @classmethod
    def _cache_key(cls, cfg_max_len: int, data_root: Path) -> dict:
        acl = cls.acl_dir(data_root)
        return {"source": str(acl) if acl else IMDB_HF, "max_len": cfg_max_len}

    @classmethod
    def dataset_status(cls, dataset: str, data_root: Path) -> str:
        if cls.acl_dir(data_root) or any(cache_dir(data_root).glob("text-imdb-*.pt")):
            return "local"
        return "missing"

    @staticmethod
    def missing_message(data_root: Path, why: str = "") -> str:
        return (f"IMDB for lra_text is not available{why}: run `attnbench data lra_text imdb` with network access "
                f"(HF datasets {IMDB_HF} into the HF cache) or unpack aclImdb_v1.tar.gz to "
                f"{Path(data_root).expanduser()}/aclImdb/")

    @classmethod
    def load_hf(cls, data_root: Path):
        return load_hf_dataset(IMDB_HF, missing=cls.missing_message(data_root))

    def check_data(self) -> None:
        self.check_name()
        self._hf = None
        if self.acl_dir(self.data_root):
            return
        key = self._cache_key(int(self.cfg.max_len), self.data_root)
        if self._cache_path(key).is_file():
            return
        self._hf = self.load_hf(self.data_root)

    def _cache_path(self, key: dict) -> Path:
        return cache_path(cache_dir(self.data_root), "text-imdb", key)

    @staticmethod
    def read_acl(directory: Path) -> dict[str, tuple[list[bytes], np.ndarray]]:
        out = {}
        for split in ("train", "test"):
            texts, labels = [], []
            for label, sub in ((0, "neg"), (1, "pos")):
                files = sorted((directory / split / sub).glob("*.txt"), key=lambda p: p.name)
                texts += [p.read_bytes() for p in files]
                labels += [label] * len(files)
            out[split] = (texts, np.asarray(labels, dtype=np.int64))
        return out

    def load(self):
        max_len = int(self.cfg.max_len)
        key = self._cache_key(max_len, self.data_root)
        acl = self.acl_dir(self.data_root)
        self.source = acl or f"HF {IMDB_HF}"

        def build():
            if acl:
                raw = self.read_acl(acl)
            else:
                hf = self._hf or self.load_hf(self.data_root)
                raw = {s: (list(hf[s]["text"]), np.asarray(hf[s]["label"], dtype=np.int64)) for s in ("train", "test")}
            return {s: {"x": pad_rows([encode_bytes(t, max_len) for t in texts], max_len), "y": torch.from_numpy(y)}
                    for s, (texts, y) in raw.items()}

        data, _ = cached(self.data_root, "text-imdb", key, build)
        return dict(data)

    def token_range(self):
        return 1, 257


@register_task
class LRARetrieval(LRATask):
    """Byte-level AAN citation matching (Radev et al. 2013): two 4K documents, 2 classes."""

    name = "lra_retrieval"
    n_classes = 2
    dual = True
    DATASETS = ("aan",)
    SPLITS = {"train": "train", "val": "eval", "test": "test"}

    @classmethod
    def files(cls, data_root: Path) -> dict[str, Path] | None:
        d = release_file(data_root, "tsv_data")
        if d is None:
            return None
        paths = {s: d / f"new_aan_pairs.{f}.tsv" for s, f in cls.SPLITS.items()}
        return paths if all(p.is_file() for p in paths.values()) else None

    @classmethod
    def dataset_status(cls, dataset: str, data_root: Path) -> str:
        return "local" if cls.files(data_root) else "missing"

    def check_data(self) -> None:
        self.check_name()
        if self.files(self.data_root) is None:
            raise DataNotFoundError(
                f"LRA retrieval (AAN) not found: put new_aan_pairs.{{train,eval,test}}.tsv in "
                f"{self.data_root}/lra_release/tsv_data/ (`attnbench data lra` downloads the release)")

    def load(self):
        max_len = int(self.cfg.max_len)
        paths = self.files(self.data_root)
        self.source = paths["train"].parent

        def build():
            out = {}
            for split, p in paths.items():
                t1, t2, y = read_aan_tsv(p)
                # The LRA pipeline encodes the first 10000 bytes, then keeps max_len tokens.
                out[split] = {"x": pad_rows([encode_bytes(t[:10000], max_len) for t in t1], max_len),
                              "x2": pad_rows([encode_bytes(t[:10000], max_len) for t in t2], max_len),
                              "y": torch.from_numpy(y)}
            return out

        data, _ = cached(self.data_root, "retrieval-aan", {"files": _signature(paths.values()), "max_len": max_len}, build)
        return data

    def token_range(self):
        return 1, 257


@register_task
class LRAImage(LRATask):
    """CIFAR-10 in grayscale, 1024 pixels as tokens, 10 classes (LRA 'Image')."""

    name = "lra_image"
    fetcher = "lra_image"
    n_classes = 10
    pixel_task = True
    DATASETS = ("cifar10",)

    @classmethod
    def batches_dir(cls, data_root: Path) -> Path | None:
        from tasks.vision.datasets import cifar_dir

        return cifar_dir("cifar10", data_root)

    @classmethod
    def dataset_status(cls, dataset: str, data_root: Path) -> str:
        return "local" if cls.batches_dir(data_root) else "missing"

    def check_data(self) -> None:
        self.check_name()
        if self.batches_dir(self.data_root) is None:
            raise DataNotFoundError(
                f"CIFAR-10 not found: put the python version (data_batch_1..5, test_batch, batches.meta) in "
                f"{self.data_root}/cifar-10-batches-py/ or run `attnbench data lra_image cifar10`")

    def load(self):
        from tasks.vision.datasets import read_cifar

        d = self.batches_dir(self.data_root)
        self.source = d
        files = [d / f"data_batch_{i}" for i in range(1, 6)]

        def build():
            x, y = read_cifar("cifar10", self.data_root, train=True)  # (N, 32, 32, 3), batches 1-5 in order
            x = rgb_to_gray(x).reshape(-1, 1024)
            tx, ty = read_cifar("cifar10", self.data_root, train=False)
            tx = rgb_to_gray(tx).reshape(-1, 1024)
            n_fit = int(len(x) * 0.9)  # LRA: train[:90%] / train[90%:] in file order
            to = lambda a: torch.from_numpy(np.ascontiguousarray(a))  # noqa: E731
            return {"train": {"x": to(x[:n_fit]), "y": to(y[:n_fit])}, "val": {"x": to(x[n_fit:]), "y": to(y[n_fit:])},
                    "test": {"x": to(tx), "y": to(ty)}}

        data, _ = cached(self.data_root, "image-cifar10", {"files": _signature(files + [d / "test_batch"])}, build)
        return data

    def token_range(self):
        return 1, 256


@register_task
class LRAPathfinder(LRATask):
    """Pathfinder (Linsley et al. 2018), 32x32 pixels as tokens, 2 classes."""

    name = "lra_pathfinder"
    n_classes = 2
    pixel_task = True
    DATASETS = ("pathfinder32",)

    def difficulty_dir(self) -> Path | None:
        return release_file(self.data_root, f"pathfinder32/{self.cfg.get('difficulty', 'curv_contour_length_14')}")

    @classmethod
    def dataset_status(cls, dataset: str, data_root: Path) -> str:
        d = release_file(data_root, "pathfinder32/curv_contour_length_14/metadata")
        return "local" if d is not None and any(d.glob("*.npy")) else "missing"

    def check_data(self) -> None:
        self.check_name()
        diff = str(self.cfg.get("difficulty", "curv_contour_length_14"))
        if diff not in PATHFINDER_DIFFICULTIES:
            raise unknown_choice("pathfinder difficulty", diff, PATHFINDER_DIFFICULTIES)
        d = self.difficulty_dir()
        if d is None or not any((d / "metadata").glob("*.npy")):
            raise DataNotFoundError(
                f"LRA Pathfinder not found: put pathfinder32/{diff}/ (imgs/, metadata/*.npy) in "
                f"{self.data_root}/lra_release/ (`attnbench data lra` downloads the release)")

    @staticmethod
    def read_examples(d: Path) -> tuple[list[Path], np.ndarray]:
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

    def load(self):
        try:
            from PIL import Image
        except ImportError:
            raise UserError("lra_pathfinder needs Pillow to read the PNGs: pip install pillow") from None
        d = self.difficulty_dir()
        self.source = d
        metas = sorted((d / "metadata").glob("*.npy"))
        seed = int(self.cfg.get("split_seed", 0))

        def build():
            paths, labels = self.read_examples(d)
            x = np.stack([np.asarray(Image.open(p).convert("L"), dtype=np.uint8).reshape(-1) for p in paths])
            # LRA: 80% / 10% / 10% of the examples (the PyTorch code shuffles first; seeded here).
            perm = np.random.RandomState(seed).permutation(len(x))
            a, b = int(len(x) * 0.8), int(len(x) * 0.9)
            to = lambda i: {"x": torch.from_numpy(x[i]), "y": torch.from_numpy(labels[i])}  # noqa: E731
            return {"train": to(perm[:a]), "val": to(perm[a:b]), "test": to(perm[b:])}

        data, _ = cached(self.data_root, f"pathfinder32-{d.name}", {"meta": _signature(metas), "seed": seed}, build)
        return data

    def token_range(self):
        return 1, 256


# --- fetchers (`attnbench data NAME`) --------------------------------------------------------------
@register_fetcher
class LRAReleaseFetcher(Fetcher):
    """The LRA release (``lra_release.gz``): ListOps, Retrieval (AAN) and Pathfinder."""

    name = "lra"
    summary = "the LRA release: ListOps, Retrieval (AAN), Pathfinder (several GB)"

    def datasets(self, data_root=None) -> list[str]:
        return ["lra_release"]

    def status(self, dataset: str, data_root: Path) -> str:
        return "local" if any((b / "listops-1000").is_dir() for b in release_candidates(data_root)) else "missing"

    def fetch(self, dataset: str, data_root: Path, force: bool = False, **options) -> Path:
        self.check_options(options)
        return fetch_release(data_root, force)


GENERATOR_OPTIONS = ("num_train", "num_val", "num_test", "max_depth", "max_args", "min_length", "max_length", "seed")


@register_fetcher
class ListOpsFetcher(Fetcher):
    """ListOps: the release's files, or `--generate` with the official generator (offline)."""

    name = "lra_listops"
    summary = "ListOps from the LRA release, or --generate (the official generator, offline)"
    options = {"generate": "write listops_generated with the official generator",
               **{o: "generator parameter (integer)" for o in GENERATOR_OPTIONS},
               "workers": "generator processes (default: the CPUs, at most 8); the files are the same for any number"}

    def datasets(self, data_root=None) -> list[str]:
        return list(LRAListOps.DATASETS)

    def status(self, dataset: str, data_root: Path) -> str:
        return "local" if LRAListOps.files(dataset, data_root) else "missing"

    def default_dataset(self, data_root: Path, generate: bool = False, **options) -> str:
        return "listops_generated" if generate else "listops"

    def fetch(self, dataset: str, data_root: Path, force: bool = False, generate: bool = False, **options) -> Path:
        """``generate`` (``--generate``): write ``listops_generated`` with the official generator
        (options ``--num-train=96000 --num-val=2000 --num-test=2000 --seed=0 ...``, ``--workers=N``
        processes); otherwise download the LRA release."""
        from bench_cli.ui import count_progress
        from tasks.lra.listops_generator import write_dataset

        unknown = set(options) - set(GENERATOR_OPTIONS) - {"workers"}
        if unknown or (options and not generate):
            raise UserError(f"unknown options for `attnbench data lra_listops`: {', '.join(sorted(unknown or options))} "
                            f"(generator options, with --generate: {', '.join(_flag(o) for o in (*GENERATOR_OPTIONS, 'workers'))})")
        if generate or dataset == "listops_generated":
            from tasks.lra.listops_generator import DEFAULTS

            target = generated_listops_dir(data_root)
            try:
                params = {k: int(v) for k, v in options.items()}
            except ValueError as e:
                raise UserError(f"generator options must be integers: {e}") from None
            workers = params.pop("workers", None)
            if workers is not None and workers < 1:
                raise UserError(f"--workers must be a positive integer, got {workers}")
            if LRAListOps.files("listops_generated", data_root) and not force:
                meta_path = target / "generator.json"
                meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
                wanted = {**DEFAULTS, **params}
                differ = {k: meta.get(k) for k in wanted if k != "task" and meta.get(k) != wanted[k]}
                if not differ:
                    return target
                raise UserError(f"{target} already holds a generated ListOps set with other parameters "
                                f"({', '.join(f'{k}={v}' for k, v in differ.items())}); add --force to replace it")
            total = sum(params.get(k, DEFAULTS[k]) for k in ("num_train", "num_val", "num_test"))
            print(f"generating {total} ListOps samples into {target} ...", file=sys.stderr)
            try:
                with count_progress("generating ListOps", total) as progress:
                    return write_dataset(target, progress=progress, workers=workers, **params)
            except ValueError as e:  # parameters no tree can satisfy
                raise UserError(f"ListOps generator: {e}") from None
        base = fetch_release(data_root, force)
        return base / "listops-1000"



@register_fetcher
class IMDBFetcher(Fetcher):
    """IMDB reviews for the byte-level LRA Text task (HF datasets, or aclImdb unpacked)."""

    name = "lra_text"
    summary = f"IMDB for LRA Text (HF {IMDB_HF} into the HF cache)"

    def datasets(self, data_root=None) -> list[str]:
        return list(LRAText.DATASETS)

    def status(self, dataset: str, data_root: Path) -> str:
        return LRAText.dataset_status(dataset, data_root)

    def fetch(self, dataset: str, data_root: Path, force: bool = False, **options) -> Path:
        self.check_options(options)
        if LRAText.acl_dir(data_root):
            return LRAText.acl_dir(data_root)
        ds = LRAText.load_hf(data_root)
        return Path(ds["train"].cache_files[0]["filename"]).parent if ds["train"].cache_files else Path(IMDB_HF)


@register_fetcher
class CIFAR10Fetcher(Fetcher):
    """CIFAR-10, python version (torchvision's folder format), for LRA Image."""

    name = "lra_image"
    summary = "CIFAR-10 (python version) for LRA Image"

    def datasets(self, data_root=None) -> list[str]:
        return list(LRAImage.DATASETS)

    def status(self, dataset: str, data_root: Path) -> str:
        return LRAImage.dataset_status(dataset, data_root)

    def fetch(self, dataset: str, data_root: Path, force: bool = False, **options) -> Path:
        self.check_options(options)
        return fetch_cifar10(data_root, force)
