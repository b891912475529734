"""Text classification of papers/002 (Sec. 4.2, Appendix B.4, Tables 2, 4, 8, 9): `task=textcls`.

Datasets (``task.dataset``), in their official formats under the data root (``DATA``):

- ``imdb``: Maas et al. 2011, 25,000 train / 25,000 test reviews, 2 classes. HF ``datasets``
  ``stanfordnlp/imdb`` (the HF cache; ``attnbench data textcls imdb`` fills it), or the same
  parquet files (columns ``text``, ``label``) in ``DATA/imdb/`` (``train-*.parquet``,
  ``test-*.parquet``, e.g. the repository's ``plain_text/`` folder copied there);
- ``amazon``: Zhang et al. 2015's Amazon Review Full, 3,000,000 train / 650,000 test, 5 classes:
  ``DATA/amazon_review_full_csv/{train,test}.csv`` (no header; class 1-5, title, text), which
  ``attnbench data textcls amazon`` downloads (fast.ai mirror of the original archive, md5 checked).

Tokenisation is keras.datasets.imdb's (tasks/text/tokenize.py): ``num_words`` ids (0 pad, 1 start,
2 OOV, words from 3), pre-padding and pre-truncation to ``max_len``. Which words get the ids is
``task.vocabulary``:

- ``keras`` (what the reproduction configs use, conf/experiment/pay_better_attention/_textcls.yaml):
  as ``keras.datasets.imdb.load_data(num_words=...)``, whose prepared arrays index words "by overall
  frequency in the dataset" -- ranked over TRAIN and TEST together -- and which maps every id >=
  num_words to 2 in both splits. The test reviews take part in choosing the vocabulary (a leak,
  small but real: it changes which of a review's last ``max_len`` words survive as themselves);
- ``train`` (the default, leak-free): ranked on the training split only (its fitting part under
  ``protocol=holdout``); a test word never seen in training becomes 2.

Amazon (no keras loader) is tokenised the same way under either option. Amazon's title and text
are joined by a space (Zhang et al.'s CSV escapes newlines as ``\\n``, turned into spaces).
Tokenised splits are cached under ``DATA/text_cache/``.
"""
from __future__ import annotations

import csv
import sys
from itertools import chain
from pathlib import Path

import numpy as np
import torch

from bench_cli.core.errors import DataNotFoundError, UserError, unknown_choice
from attnbench.tasks import register_task
from bench_cli.core.task import PROTOCOLS, Task, TensorDictDataset
from attnbench.tasks.data import (cache_path, cached, download, file_signature, fresh_folder, hf_cache_copy, hf_cache_folders,
                        load_hf_dataset, unpack, validation_split)
from bench_cli.core.fetch import Fetcher, register_fetcher
from attnbench.tasks.text.tokenize import WordIndex, pad_sequences, rank_words, text_to_word_sequence

IMDB_HF = "stanfordnlp/imdb"
AMAZON_URL = "https://s3.amazonaws.com/fast-ai-nlp/amazon_review_full_csv.tgz"
AMAZON_MD5 = "289723722b64d337a40f809edd29d0f0"  # torchtext's AmazonReviewFull checksum
DATASETS = ("imdb", "amazon")
N_CLASSES = {"imdb": 2, "amazon": 5}
# task.vocabulary -> which reviews rank the words (keras.datasets.imdb ranks the whole dataset)
VOCABULARIES = ("train", "keras")


def cache_dir(data_root: Path) -> Path:
    return Path(data_root).expanduser() / "text_cache"


# --- where the files are ----------------------------------------------------------------------------
def imdb_parquet(data_root: Path) -> dict[str, list[Path]] | None:
    """{'train': [...], 'test': [...]} parquet files under DATA/imdb/ (any depth), or None."""
    root = Path(data_root).expanduser() / "imdb"
    if not root.is_dir():
        return None
    files = {s: sorted(root.rglob(f"{s}-*.parquet")) for s in ("train", "test")}
    return files if all(files.values()) else None


def amazon_csv(data_root: Path) -> dict[str, Path] | None:
    root = Path(data_root).expanduser() / "amazon_review_full_csv"
    files = {s: root / f"{s}.csv" for s in ("train", "test")}
    return files if all(p.is_file() for p in files.values()) else None


def read_parquet(paths: list[Path]) -> tuple[list[str], np.ndarray]:
    import pandas as pd

    frame = pd.concat([pd.read_parquet(p, columns=["text", "label"]) for p in paths], ignore_index=True)
    return frame["text"].astype(str).tolist(), frame["label"].to_numpy(dtype=np.int64)


def read_zhang_csv(path: Path) -> tuple[list[str], np.ndarray]:
    """Zhang et al. 2015 CSV (class, title, text; quoted, no header): 'title text' and class - 1."""
    csv.field_size_limit(sys.maxsize)
    texts, labels = [], []
    with open(path, newline="", encoding="utf-8") as f:
        for n, row in enumerate(csv.reader(f), 1):
            if not row:
                continue
            if len(row) < 2:
                raise UserError(f"{path}:{n}: expected class, title, text (Zhang et al.'s CSV)")
            labels.append(int(row[0]) - 1)
            texts.append(" ".join(row[1:]).replace("\\n", " "))
    return texts, np.asarray(labels, dtype=np.int64)


def missing_message(dataset: str, data_root: Path) -> str:
    root = Path(data_root).expanduser()
    if dataset == "imdb":
        return (f"IMDB for textcls is not available: run `attnbench data textcls imdb` with network access "
                f"(HF datasets {IMDB_HF} into the HF cache) or put its train-*.parquet and test-*.parquet "
                f"in {root}/imdb/")
    return (f"Amazon Review Full not found: put train.csv and test.csv in {root}/amazon_review_full_csv/ "
            f"or run `attnbench data textcls amazon` ({AMAZON_URL})")


# --- the task ---------------------------------------------------------------------------------------
@register_task
class TextClassification(Task):
    """Sentiment of a review from its first ``max_len`` words (keras-io transformer classifier)."""

    name = "textcls"
    fetcher = "textcls"
    DATASETS = DATASETS

    def __init__(self, cfg, data_root):
        super().__init__(cfg, data_root)
        self.requires = {"padding_mask": bool(cfg.get("padding_mask", False))}
        self.source, self.facts = None, {}
        self.max_len = self.vocab_size = self.n_classes = 0

    def data_options(self) -> dict:
        """A tokenised copy for either protocol spares the source (the HF hub is not asked)."""
        if self.dataset_name == "amazon":
            return {}
        return {"cached": [self._cache_path(p) for p in PROTOCOLS]}

    # --- shapes from the config (no data) ------------------------------------------------------
    def _shapes(self) -> None:
        if self.dataset_name not in DATASETS:
            raise unknown_choice("textcls dataset", self.dataset_name, DATASETS)
        if self.vocabulary not in VOCABULARIES:
            raise unknown_choice("task.vocabulary", self.vocabulary, VOCABULARIES)
        self.max_len, self.vocab_size = int(self.cfg.max_len), int(self.cfg.num_words)
        self.n_classes = N_CLASSES[self.dataset_name]

    @property
    def vocabulary(self) -> str:
        return str(self.cfg.get("vocabulary") or "train")

    # --- data ------------------------------------------------------------------------------------
    def _raw_source(self) -> tuple[str, list[Path]]:
        if self.dataset_name == "amazon":
            files = amazon_csv(self.data_root)
            return str(files["train"].parent), list(files.values())
        files = imdb_parquet(self.data_root)
        return (str(files["train"][0].parent), files["train"] + files["test"]) if files else (f"HF {IMDB_HF}", [])

    def _cache_key(self, protocol: str = "holdout") -> dict:
        source, files = self._raw_source()
        fit = ({"val_fraction": float(self.cfg.val_fraction), "split_seed": int(self.cfg.split_seed)}
               if protocol == "holdout" else "all of train")
        key = {"dataset": self.dataset_name, "source": source, "files": file_signature(files),
               "num_words": int(self.cfg.num_words), "max_len": int(self.cfg.max_len), "vocabulary_from": fit}
        if self.vocabulary == "keras":  # ranked on every review; the split still decides the splits
            key["vocabulary"] = "keras: train and test"
        return key

    def _cache_path(self, protocol: str = "holdout") -> Path:
        return cache_path(cache_dir(self.data_root), f"textcls-{self.dataset_name}", self._cache_key(protocol))

    def read_raw(self) -> dict[str, tuple[list[str], np.ndarray]]:
        """{'train': (texts, labels), 'test': ...} from the official files."""
        if self.dataset_name == "amazon":
            return {s: read_zhang_csv(p) for s, p in amazon_csv(self.data_root).items()}
        files = imdb_parquet(self.data_root)
        if files:
            return {s: read_parquet(p) for s, p in files.items()}
        hf = self.located or load_hf_dataset(IMDB_HF, missing=missing_message("imdb", self.data_root))
        return {s: (list(hf[s]["text"]), np.asarray(hf[s]["label"], dtype=np.int64)) for s in ("train", "test")}

    def tokenise(self, protocol: str) -> dict:
        """Tokenised splits (train, val under holdout, test) and facts about the vocabulary. Words
        are ranked on the fitting part of TRAIN (``vocabulary: train``) or on all of TRAIN then
        TEST (``keras``); texts are tokenised twice (count, encode) rather than kept as word lists
        (Amazon has 3.65M reviews)."""
        raw = self.read_raw()
        texts, labels = raw["train"]
        if protocol == "holdout":
            fit, val = validation_split(self.cfg, len(labels), labels)
        else:
            fit, val = np.arange(len(labels)), None
        if self.vocabulary == "keras":  # the whole prepared dataset, as keras' imdb.npz indexes it
            ranking_texts = chain(texts, raw["test"][0])
        else:
            ranking_texts = (texts[i] for i in fit)
        ranked = rank_words(text_to_word_sequence(t) for t in ranking_texts)
        index = WordIndex(ranked, int(self.cfg.num_words))
        max_len = int(self.cfg.max_len)

        def encode(split_texts, y):
            ids = pad_sequences((index.encode(text_to_word_sequence(t)) for t in split_texts), max_len)
            return {"x": torch.from_numpy(ids), "y": torch.from_numpy(np.array(y, dtype=np.int64))}

        out = {"train": encode((texts[i] for i in fit), labels[fit])}
        if val is not None:
            out["val"] = encode((texts[i] for i in val), labels[val])
        out["test"] = encode(*raw["test"])
        distinct = "distinct_training_words" if self.vocabulary == "train" else "distinct_train_test_words"
        out["facts"] = {"vocabulary_words": len(index), distinct: len(ranked)}
        return out

    def make_splits(self, protocol: str) -> None:
        self._shapes()
        self.source = self._raw_source()[0]
        key = self._cache_key(protocol)
        data, _ = cached(cache_dir(self.data_root), f"textcls-{self.dataset_name}", key, lambda: self.tokenise(protocol))
        data = dict(data)
        self.facts = data.pop("facts")
        bad = {s: (int(d["y"].min()), int(d["y"].max())) for s, d in data.items()
               if len(d["y"]) and (int(d["y"].min()) < 0 or int(d["y"].max()) >= self.n_classes)}
        if bad:
            raise UserError(f"textcls/{self.dataset_name}: labels outside 0..{self.n_classes - 1}: {bad}")
        subset = self.cfg.get("subset") or {}
        for s in list(data):
            if subset.get(s):
                data[s] = {k: v[: int(subset[s])] for k, v in data[s].items()}
        self.splits = {s: TensorDictDataset(**d) for s, d in data.items()}

    def setup_synthetic(self, seq_len: int) -> None:
        self._shapes()
        self.source, self.splits, self.max_len = "synthetic", {}, int(seq_len)

    def synthetic_batch(self, batch_size: int, seq_len: int, device="cpu") -> dict:
        g = torch.Generator().manual_seed(0)
        x = torch.randint(3, self.vocab_size, (batch_size, seq_len), generator=g)
        y = torch.randint(0, self.n_classes, (batch_size,), generator=g)
        return {"x": x.to(device), "y": y.to(device)}

    # --- model -------------------------------------------------------------------------------------
    def build_model(self, model_cfg):
        from attnbench.models.text import build_text_classifier

        if not self.max_len:
            raise UserError("textcls: call setup() or setup_synthetic() before build_model()")
        return build_text_classifier(model_cfg, self.cfg.backbone, self.vocab_size, self.max_len, self.n_classes)

    def model_inputs(self, batch: dict) -> dict:
        x = batch["x"]
        return {"x": x, "mask": (x != 0) if self.requires["padding_mask"] else None}

    def describe(self) -> dict:
        out = {"source": str(self.source), "max_len": self.max_len, "num_words": self.vocab_size,
               "classes": self.n_classes, "padding": "pre", "truncating": "pre", "vocabulary": self.vocabulary,
               "padding_mask": self.requires["padding_mask"], **self.facts}
        out.update({f"n_{k}": len(v) for k, v in self.splits.items()})
        return out


# --- `attnbench data textcls NAME` -----------------------------------------------------------------
@register_fetcher
class TextClassificationFetcher(Fetcher):
    name = "textcls"
    summary = f"IMDB (HF {IMDB_HF}) and Amazon Review Full (Zhang et al. CSV, ~640 MB)"

    def datasets(self, data_root=None) -> list[str]:
        return list(DATASETS)

    def status(self, dataset: str, data_root: Path) -> str:
        if dataset == "amazon":
            return "local" if amazon_csv(data_root) else "missing"
        if imdb_parquet(data_root) or any(p.is_dir() for p in hf_cache_folders(IMDB_HF)):
            return "local"
        return "local" if any(cache_dir(data_root).glob("textcls-imdb-*.pt")) else "missing"

    def location(self, dataset: str, data_root: Path) -> str:
        """Amazon's CSV files; IMDB's parquet files, else its copy in the HF cache, else the copy
        tokenised from it (text_cache/)."""
        root = Path(data_root).expanduser()
        if dataset == "amazon":
            return f"{root / 'amazon_review_full_csv'}/{{train,test}}.csv"
        files, hf = imdb_parquet(root), hf_cache_copy(IMDB_HF)
        tokenised = sorted(cache_dir(root).glob("textcls-imdb-*.pt"))
        if files is None and (hf or tokenised):
            return f"{hf}/" if hf else str(tokenised[0])
        return f"{files['train'][0].parent if files else root / 'imdb'}/{{train,test}}-*.parquet"

    def missing_message(self, dataset: str, data_root: Path, **options) -> str:
        return missing_message(dataset, data_root)

    def require(self, dataset: str, data_root: Path, *, cached=(), **options):
        """Amazon: the CSV files; IMDB: nothing to load when the parquet files or a tokenised copy
        are there, else the HF dataset (from the HF cache; one line at once when offline)."""
        if dataset == "amazon":
            if amazon_csv(data_root) is None:
                raise DataNotFoundError(missing_message("amazon", data_root))
            return None
        if imdb_parquet(data_root) is not None or any(Path(p).is_file() for p in cached):
            return None
        return load_hf_dataset(IMDB_HF, missing=missing_message("imdb", data_root))

    def fetch(self, dataset: str, data_root: Path, force: bool = False, **options) -> Path:
        self.check_options(options)
        root = Path(data_root).expanduser()
        if dataset == "imdb":
            files = imdb_parquet(root)
            if files:
                return files["train"][0].parent
            ds = load_hf_dataset(IMDB_HF, missing=missing_message("imdb", root))
            return Path(ds["train"].cache_files[0]["filename"]).parent if ds["train"].cache_files else Path(IMDB_HF)
        if amazon_csv(root) and not force:
            return root / "amazon_review_full_csv"
        archive = root / "amazon_review_full_csv.tgz"
        if force or not archive.is_file():
            print(f"downloading {AMAZON_URL} (~640 MB) to {archive} ...", file=sys.stderr)
            download(AMAZON_URL, archive, what="Amazon Review Full (Zhang et al. 2015)",
                     where=f"{root}/amazon_review_full_csv/train.csv", md5=AMAZON_MD5)
        with fresh_folder(root / "amazon_review_full_csv"):
            unpack(archive, root)
        if amazon_csv(root) is None:
            raise DataNotFoundError(f"{archive} did not unpack to {root}/amazon_review_full_csv/; unpack it there by hand")
        return root / "amazon_review_full_csv"
