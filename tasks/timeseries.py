"""Time series in the `.ts` format (sktime / UEA / UCR / Monash archives) and the archive layout
``<data root>/<archive>/<Name>/<Name>_{TRAIN,TEST}.ts`` shared by the UEA classification and the
TSER regression families.

Reading follows sktime's reader (ts_format.py, without importing sktime); preprocessing follows
mvts_transformer (Zerveas et al. 2021): missing values linearly interpolated per channel, channels
standardised with statistics of the training split only, series zero-padded (with a mask) or
truncated to the longest TRAIN length.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import torch

from bench_cli.core.errors import DataNotFoundError, UserError, unknown_choice
from bench_cli.core.files import write_atomically
from bench_cli.core.task import Task, TensorDictDataset
from attnbench.tasks.data import download, fresh_folder, pad_series, unpack, validation_split
from bench_cli.core.fetch import Fetcher


def split_files(directory: Path, name: str) -> tuple[Path, Path]:
    return directory / f"{name}_TRAIN.ts", directory / f"{name}_TEST.ts"


def has_files(directory: Path, name: str) -> bool:
    return all(p.is_file() for p in split_files(directory, name))


def packaged_dir(name: str) -> Path | None:
    """The copy shipped inside sktime, if any (JapaneseVowels, BasicMotions, Covid3Month, Tecator).
    Found without importing sktime (seconds of imports that `ls` and `validate` do not need)."""
    import importlib.util

    spec = importlib.util.find_spec("sktime")
    if spec is None or not spec.submodule_search_locations:
        return None
    d = Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / name
    return d if has_files(d, name) else None


def ts_header(path: Path) -> dict[str, str]:
    """The ``@key value`` lines before ``@data`` (keys lower-cased: problemname, targetlabel...)."""
    header = {}
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.strip()
            if not line.startswith("@"):
                continue
            key, _, value = line[1:].partition(" ")
            if key.lower() == "data":
                break
            header[key.lower()] = value.strip()
    return header


def read_ts(path: Path) -> tuple[list[np.ndarray], np.ndarray]:
    """Series as float arrays of shape (length, channels) with NaN for missing values, and the
    labels (class names as str) or targets (``@targetLabel true``: as float)."""
    from attnbench.tasks.ts_format import read_labelled_ts

    header = ts_header(path)
    if not any(header.get(k, "false").split()[:1] == ["true"] for k in ("classlabel", "targetlabel")):
        raise UserError(f"{path} has no labels (its header says neither @classLabel true nor @targetLabel true): "
                        "every series needs its class or target after the last ':'")
    try:
        series, written = read_labelled_ts(path)
    except ValueError as e:  # the format's rules, a value that is not a number, bytes that are not UTF-8
        raise UserError(f"cannot parse {path}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    labels = np.asarray(written)
    if header.get("targetlabel", "false").lower() == "true":
        try:
            return series, labels.astype(np.float64)
        except ValueError:
            raise UserError(f"{path}: @targetLabel true but a target is not a number") from None
    return series, labels.astype(str)


def read_ts_cached(path: Path, data_root: Path) -> tuple[list[np.ndarray], np.ndarray]:
    """``read_ts`` through the cache under ``<data root>/ts_cache/`` (keyed by the file's path,
    size and mtime): a sweep parses each file once, not once per job. The values round-trip exactly
    (float64). The series are kept as one tensor of every time step with their lengths, not as a
    tensor per series: loading JapaneseVowels' 270 series took 0.11 s that way, three times the
    parse it saves."""
    from attnbench.tasks.data import cached, file_signature

    def build():
        series, labels = read_ts(path)  # at least one series: a file without any is refused
        return {"values": torch.from_numpy(np.concatenate(series)),
                "lengths": torch.tensor([len(s) for s in series], dtype=torch.int64),
                "labels": labels.tolist(), "numeric": labels.dtype.kind == "f"}

    key = {"file": file_signature([path]), "layout": "concatenated"}
    data, _ = cached(Path(data_root).expanduser() / "ts_cache", Path(path).stem, key, build)
    labels = np.asarray(data["labels"], dtype=np.float64 if data["numeric"] else str)
    ends = np.cumsum(data["lengths"].numpy())[:-1]
    return np.split(data["values"].numpy(), ends), labels


def interpolate_missing(x: np.ndarray) -> np.ndarray:
    """Linear interpolation per channel, constant extrapolation at the ends (mvts_transformer's
    ``interpolate_missing``: pandas ``interpolate(limit_direction='both')``); an all-missing channel is 0."""
    out = x.copy()
    t = np.arange(len(x))
    for j in range(x.shape[1]):
        col, bad = out[:, j], np.isnan(out[:, j])
        if bad.all():
            col[:] = 0.0
        elif bad.any():
            col[bad] = np.interp(t[bad], t[~bad], col[~bad])
    return out


def channel_standardiser(series: list[np.ndarray]):
    """x -> (x - mean) / std per channel, statistics over every time step of ``series`` (the
    training split only); constant channels are only centred."""
    stacked = np.concatenate(series)
    mean, std = stacked.mean(0), stacked.std(0)
    std[std < 1e-8] = 1.0
    return lambda s: (s - mean) / std


class TsArchiveFetcher(Fetcher):
    """An archive of `.ts` datasets under ``<data root>/<archive>/<Name>/``: sktime's packaged
    copies are copied, the others downloaded (``url_of``) with their sha256 recorded beside them.
    Folders in that layout under the data root are datasets too (your own sets)."""

    archive: str  # folder under the data root
    known: tuple[str, ...] = ()
    what: str = ""

    def local_dir(self, data_root: Path, name: str) -> Path:
        return Path(data_root).expanduser() / self.archive / name

    def local_datasets(self, data_root: Path) -> list[str]:
        root = Path(data_root).expanduser() / self.archive
        if not root.is_dir():
            return []
        return sorted(d.name for d in root.iterdir() if has_files(d, d.name))

    def datasets(self, data_root: Path | None = None) -> list[str]:
        extra = [d for d in self.local_datasets(data_root) if d not in self.known] if data_root else []
        return list(self.known) + extra

    def status(self, dataset: str, data_root: Path) -> str:
        if has_files(self.local_dir(data_root, dataset), dataset):
            return "local"
        return "package" if packaged_dir(dataset) else "missing"

    def location(self, dataset: str, data_root: Path) -> str:
        """The folder of ``<Name>_TRAIN.ts`` and ``<Name>_TEST.ts``: under the data root, else
        sktime's copy."""
        return f"{self.locate(dataset, data_root) or self.local_dir(data_root, dataset)}/"

    def locate(self, name: str, data_root: Path) -> Path | None:
        d = self.local_dir(data_root, name)
        return d if has_files(d, name) else packaged_dir(name)

    def check_name(self, name: str, data_root: Path | None = None) -> None:
        if name not in self.datasets(data_root):
            raise unknown_choice(f"{self.what} dataset", name, self.datasets(data_root))

    def missing_message(self, name: str, data_root: Path, **options) -> str:
        d = self.local_dir(data_root, name)
        return (f"{self.what} dataset {name} is not available locally: put {name}_TRAIN.ts and {name}_TEST.ts "
                f"in {d}/ or run `attnbench data {self.name} {name}`")

    def require(self, name: str, data_root: Path, **options) -> Path:
        """The folder holding ``name``'s files; a one-line UserError for a name the archive does
        not have, or DataNotFoundError if the files are absent."""
        self.check_name(name, data_root)
        where = self.locate(name, data_root)
        if where is None:
            raise DataNotFoundError(self.missing_message(name, data_root))
        return where

    def urls(self, name: str) -> list[tuple[str, str]]:
        """[(url, kind)]: kind 'zip' (an archive holding both files) or 'TRAIN'/'TEST' (one file)."""
        raise NotImplementedError

    def fetch(self, dataset: str, data_root: Path, force: bool = False, **options) -> Path:
        self.check_options(options)
        self.check_name(dataset)
        target = self.local_dir(data_root, dataset)
        if has_files(target, dataset) and not force:
            return target
        wanted = {p.name for p in split_files(target, dataset)}
        with fresh_folder(target):
            src = packaged_dir(dataset)
            if src is not None:
                for p in split_files(src, dataset):
                    write_atomically(target / p.name, p.read_bytes())
                return target
            with tempfile.TemporaryDirectory() as tmp:
                sums = []
                for url, kind in self.urls(dataset):
                    name = f"{dataset}.zip" if kind == "zip" else f"{dataset}_{kind}.ts"
                    digest = download(url, Path(tmp) / name, what=f"{self.what} {dataset}",
                                      where=f"{target}/{dataset}_TRAIN.ts and _TEST.ts")
                    sums.append(f"{digest}  {name}")
                    if kind == "zip":
                        unpack(Path(tmp) / name, target, lambda m: Path(m).name if Path(m).name in wanted else None)
                    else:
                        write_atomically(target / name, (Path(tmp) / name).read_bytes())  # whole or absent
                write_atomically(target / "SHA256SUMS", "\n".join(sums) + "\n")
            if not has_files(target, dataset):
                raise DataNotFoundError(f"the download of {dataset} did not contain {dataset}_TRAIN.ts and _TEST.ts")
        return target


class TimeSeriesTask(Task):
    """A `.ts` archive task with mvts_transformer's preprocessing and encoder (the UEA classifier,
    the TSER regressor). Subclasses set ``archive_fetcher`` and turn the raw labels into targets
    (``targets``), and choose the head's width (``n_outputs``) and loss/metrics."""

    requires = {"padding_mask": True}
    stratify = False  # holdout: a stratified (classification) or random (regression) split
    synthetic_outputs = ("outputs", 1)  # task.synthetic key (and default) of the head's width for profiling

    def targets(self, train_labels: np.ndarray, test_labels: np.ndarray, test_path: Path):
        """(train targets, test targets) as arrays, and fix ``n_outputs``."""
        raise NotImplementedError

    def target_tensor(self, values: np.ndarray) -> torch.Tensor:
        raise NotImplementedError

    def make_splits(self, protocol: str) -> None:
        name, cfg = self.dataset_name, self.cfg
        self.source = self.located  # the folder the fetcher found (data root or sktime's copy)
        train_path, test_path = split_files(self.source, name)
        train_x, train_labels = read_ts_cached(train_path, self.data_root)
        test_x, test_labels = read_ts_cached(test_path, self.data_root)
        channels = {p: {s.shape[1] for s in xs} for p, xs in ((train_path, train_x), (test_path, test_x))}
        if len(channels[train_path] | channels[test_path]) > 1:
            raise UserError(f"{name}: series have {', '.join(map(str, sorted(channels[train_path])))} channel(s) in "
                            f"{train_path.name} but {', '.join(map(str, sorted(channels[test_path])))} in "
                            f"{test_path.name} (every series of a dataset needs the same channels)")
        train_t, test_t = self.targets(train_labels, test_labels, test_path)
        train_x = [interpolate_missing(s) for s in train_x]
        test_x = [interpolate_missing(s) for s in test_x]

        if protocol == "holdout":
            fit_idx, val_idx = validation_split(cfg, len(train_x), train_t if self.stratify else None)
        else:
            fit_idx, val_idx = np.arange(len(train_x)), np.array([], dtype=int)

        norm = channel_standardiser([train_x[i] for i in fit_idx])  # training split only
        self.max_len = int(cfg.max_len or max(len(s) for s in train_x))
        self.n_channels = train_x[0].shape[1]

        def make(xs, ts, idx):
            x, mask = pad_series([norm(xs[i]) for i in idx], self.max_len)
            return TensorDictDataset(x=x, mask=mask, y=self.target_tensor(ts[idx]))

        self.splits = {"train": make(train_x, train_t, fit_idx), "test": make(test_x, test_t, np.arange(len(test_x)))}
        if len(val_idx):
            self.splits["val"] = make(train_x, train_t, val_idx)

    def setup_synthetic(self, seq_len: int) -> None:
        syn = self.cfg.get("synthetic") or {}
        self.source, self.splits = "synthetic", {}
        self.n_channels = int(syn.get("channels", 12))
        self.n_outputs = int(syn.get(*self.synthetic_outputs))
        self.max_len = int(seq_len)

    def synthetic_targets(self, batch_size: int, g: torch.Generator) -> torch.Tensor:
        raise NotImplementedError

    def synthetic_batch(self, batch_size: int, seq_len: int, device="cpu") -> dict:
        g = torch.Generator().manual_seed(0)
        return {
            "x": torch.randn(batch_size, seq_len, self.n_channels, generator=g).to(device),
            "mask": torch.ones(batch_size, seq_len, dtype=torch.bool, device=device),
            "y": self.synthetic_targets(batch_size, g).to(device),
        }

    def build_model(self, model_cfg):
        from attnbench.models.roles import build_layer_attentions
        from attnbench.models.timeseries import TimeSeriesTransformer

        b = self.cfg.backbone
        attentions = build_layer_attentions(model_cfg, int(b.n_layers), int(b.d_model), int(b.n_heads), self.max_len,
                                            attention_dropout=b.get("attention_dropout"))
        options = {k: v for k, v in b.items() if k not in ("n_layers", "n_heads", "attention_dropout")}
        return TimeSeriesTransformer(self.n_channels, self.n_outputs, self.max_len, attentions, **options)

    def model_inputs(self, batch: dict) -> dict:
        return {"x": batch["x"], "mask": batch["mask"]}

    def describe(self) -> dict:
        return {"source": str(self.source), "channels": self.n_channels, "max_len": self.max_len,
                **{f"n_{k}": len(v) for k, v in self.splits.items()}}
