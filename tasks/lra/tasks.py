"""Long Range Arena (Tay et al. 2021): the tasks ListOps, Text, Retrieval, Image, Pathfinder.

Data, readers and tokenisation are in tasks/lra/data.py (the official formats and the LRA input
pipelines), the downloads and the presence of each dataset in tasks/lra/fetchers.py. Every task
pads its tokens to ``seq_len`` (2048 / 4096 / 4096 / 1024 / 1024, as the PyTorch LRA code) and uses
the LRA encoder (models/lra.py; Retrieval a dual encoder). Under ``protocol=holdout`` the official
validation split selects; IMDB has none, so ``val_fraction`` of train is held out
(tasks.data.validation_split); Image's is train[90%:] and Pathfinder's 10% of the examples, as LRA.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from bench_cli.core.errors import UserError
from attnbench.tasks import register_task
from bench_cli.core.task import Task, TensorDictDataset
from attnbench.tasks.data import cache_path, file_signature as _signature, pad_rows, validation_split
from attnbench.tasks.lra import fetchers
from attnbench.tasks.lra.data import (  # noqa: F401  (rgb_to_gray, read_listops_tsv: also used through this module)
    IMDB_HF, LISTOPS_DATASETS, PATHFINDER_DEFAULT, acl_dir, cache_dir, cached, encode_bytes, encode_listops,
    listops_vocab, read_aan_tsv, read_acl, read_listops_tsv, read_pathfinder_examples, rgb_to_gray, take,
)


class LRATask(Task):
    """Shared LRA machinery: cached tokenised splits, the validation split, synthetic shapes, the model."""

    fetcher = "lra"
    n_classes: int = 2
    dual: bool = False
    pixel_task: bool = False  # Image, Pathfinder: pixels as tokens
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
    def load(self) -> dict[str, dict[str, torch.Tensor]]:
        """Tokenised official splits {'train', 'val'?, 'test'}: dicts of tensors (cached)."""
        raise NotImplementedError

    def make_splits(self, protocol: str) -> None:
        self.seq_len = int(self.cfg.seq_len)
        data = self.load()
        if "val" not in data and protocol == "holdout":  # no official validation split: carve one from train
            fit, val = validation_split(self.cfg, len(data["train"]["y"]))
            data = {"train": take(data["train"], fit), "val": take(data["train"], val), "test": data["test"]}
            self.val_source = (f"{self.cfg.get('val_fraction', 0.1)} of train (split_seed {self.cfg.get('split_seed', 0)})"
                               + self.VAL_NOTE)
        subset = self.cfg.get("subset") or {}
        for split in list(data):
            limit = subset.get(split)
            if limit:
                data[split] = take(data[split], np.arange(min(int(limit), len(data[split]["y"]))))
        for d in data.values():
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
        from attnbench.models.lra import build_lra_model

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
    DATASETS = LISTOPS_DATASETS

    def data_options(self) -> dict:
        return {"generator": dict(self.cfg.get("generator") or {})}

    def load(self):
        style = str(self.cfg.get("tokenizer", "lra"))
        vocab = listops_vocab(style)
        max_len = int(self.cfg.max_len)
        paths = self.located  # the split files the fetcher found
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
        if self.dataset_name == "listops_generated":  # say how the data were made
            from attnbench.tasks.lra.fetchers import generator_meta

            made = generator_meta(self.data_root)
            if made is not None:
                out["generator"] = made
        return out


@register_task
class LRAText(LRATask):
    """Byte-level IMDB sentiment (Maas et al. 2011), 2 classes, 4K bytes."""

    name = "lra_text"
    fetcher = "lra_text"
    n_classes = 2
    DATASETS = ("imdb",)
    VAL_NOTE = "; LRA itself validates on the test set, i.e. protocol=paper"

    def _cache_key(self) -> dict:
        acl = acl_dir(self.data_root)
        return {"source": str(acl) if acl else IMDB_HF, "max_len": int(self.cfg.max_len)}

    def data_options(self) -> dict:
        return {"cached": [cache_path(cache_dir(self.data_root), "text-imdb", self._cache_key())]}

    def load(self):
        max_len = int(self.cfg.max_len)
        key = self._cache_key()
        acl = acl_dir(self.data_root)
        self.source = acl or f"HF {IMDB_HF}"

        def build():
            if acl:
                raw = read_acl(acl)
            else:
                hf = self.located or fetchers.load_imdb(self.data_root)
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

    def load(self):
        max_len = int(self.cfg.max_len)
        paths = self.located  # the split files the fetcher found
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

    def load(self):
        from attnbench.tasks.vision.datasets import cifar_dir, read_cifar

        d = cifar_dir("cifar10", self.data_root)
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

    def data_options(self) -> dict:
        return {"difficulty": str(self.cfg.get("difficulty", PATHFINDER_DEFAULT))}

    def load(self):
        try:
            from PIL import Image
        except ImportError:
            raise UserError("lra_pathfinder needs Pillow to read the PNGs: pip install pillow") from None
        d = self.located  # the difficulty's folder the fetcher found
        self.source = d
        metas = sorted((d / "metadata").glob("*.npy"))
        seed = int(self.cfg.get("split_seed", 0))

        def build():
            paths, labels = read_pathfinder_examples(d)
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


