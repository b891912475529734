"""UEA multivariate time-series classification archive (Bagnall et al. 2018).

Data: ``<data_root>/uea/<Name>/<Name>_TRAIN.ts`` and ``_TEST.ts``, read with sktime's `.ts`
reader. JapaneseVowels and BasicMotions ship inside sktime and are used from there when the
data root lacks them. Preprocessing follows mvts_transformer (Zerveas et al. 2021), the code the
primal-dual paper used for UEA: missing values linearly interpolated per channel, each channel
standardised with statistics of the training split only, series zero-padded (with a mask) or
truncated to the longest TRAIN length.
"""
from __future__ import annotations

import hashlib
import shutil
import tempfile
import urllib.request
import zipfile
from pathlib import Path

import numpy as np
import torch

from bench_cli.errors import DataNotFoundError, UserError, unknown_choice
from tasks.base import Task, TensorDictDataset

UEA_DATASETS = [
    "ArticularyWordRecognition", "AtrialFibrillation", "BasicMotions", "CharacterTrajectories",
    "Cricket", "DuckDuckGeese", "EigenWorms", "Epilepsy", "ERing", "EthanolConcentration",
    "FaceDetection", "FingerMovements", "HandMovementDirection", "Handwriting", "Heartbeat",
    "InsectWingbeat", "JapaneseVowels", "Libras", "LSST", "MotorImagery", "NATOPS", "PEMS-SF",
    "PenDigits", "PhonemeSpectra", "RacketSports", "SelfRegulationSCP1", "SelfRegulationSCP2",
    "SpokenArabicDigits", "StandWalkJump", "UWaveGestureLibrary",
]
# The archive's per-dataset zips (the mirror sktime uses); each holds <Name>_TRAIN.ts and _TEST.ts.
UEA_URL = "https://timeseriesclassification.com/aeon-toolkit/{name}.zip"


def _files(directory: Path, name: str) -> tuple[Path, Path]:
    return directory / f"{name}_TRAIN.ts", directory / f"{name}_TEST.ts"


def local_dir(data_root: Path, name: str) -> Path:
    return Path(data_root).expanduser() / "uea" / name


def packaged_dir(name: str) -> Path | None:
    """The copy shipped inside sktime, if any (JapaneseVowels, BasicMotions). Found without
    importing sktime (seconds of imports that `ls` and `validate` do not need)."""
    import importlib.util

    spec = importlib.util.find_spec("sktime")
    if spec is None or not spec.submodule_search_locations:
        return None
    d = Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / name
    return d if all(p.is_file() for p in _files(d, name)) else None


def locate(name: str, data_root: Path) -> Path | None:
    d = local_dir(data_root, name)
    if all(p.is_file() for p in _files(d, name)):
        return d
    return packaged_dir(name)


def local_datasets(data_root: Path) -> list[str]:
    """Datasets in the UEA `.ts` layout under the data root, archive members or not (your own sets)."""
    root = Path(data_root).expanduser() / "uea"
    if not root.is_dir():
        return []
    return sorted(d.name for d in root.iterdir() if all(p.is_file() for p in _files(d, d.name)))


def check_name(name: str, data_root: Path | None = None) -> None:
    known = set(UEA_DATASETS) | set(local_datasets(data_root) if data_root else [])
    if name not in known:
        raise unknown_choice("UEA dataset", name, known)


def missing_message(name: str, data_root: Path) -> str:
    d = local_dir(data_root, name)
    return (f"UEA dataset {name} is not available locally: put {name}_TRAIN.ts and {name}_TEST.ts "
            f"in {d}/ or run `attnbench data uea {name}`")


def read_ts(path: Path) -> tuple[list[np.ndarray], np.ndarray]:
    """Series as float arrays of shape (length, channels) with NaN for missing values, and labels."""
    from sktime.datasets import load_from_tsfile

    try:
        frame, labels = load_from_tsfile(str(path), return_data_type="nested_univ")
    except Exception as e:  # sktime raises various errors on malformed files
        raise UserError(f"cannot parse {path}: {e}") from None
    series = []
    for row in frame.itertuples(index=False):
        channels = [np.asarray(s, dtype=np.float64) for s in row]
        length = max(len(c) for c in channels)
        arr = np.full((length, len(channels)), np.nan)
        for j, c in enumerate(channels):
            arr[: len(c), j] = c
        series.append(arr)
    return series, np.asarray(labels).astype(str)


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


def stratified_split(labels: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices (fit, val): ``fraction`` of every class (at least one sample of classes with >= 2) to val."""
    rng = np.random.RandomState(seed)
    fit, val = [], []
    for cls in np.unique(labels):
        idx = np.flatnonzero(labels == cls)
        rng.shuffle(idx)
        k = int(round(fraction * len(idx)))
        k = min(max(k, 1), len(idx) - 1) if len(idx) >= 2 else 0
        val += idx[:k].tolist()
        fit += idx[k:].tolist()
    return np.sort(fit), np.sort(val)


def pad(series: list[np.ndarray], max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Zero-pad or truncate to ``max_len``; mask is True on real time steps."""
    n, c = len(series), series[0].shape[1]
    x = np.zeros((n, max_len, c), dtype=np.float32)
    mask = np.zeros((n, max_len), dtype=bool)
    for i, s in enumerate(series):
        k = min(len(s), max_len)
        x[i, :k], mask[i, :k] = s[:k], True
    return torch.from_numpy(x), torch.from_numpy(mask)


class UEAClassification(Task):
    name = "uea"
    requires = {"padding_mask": True}

    @classmethod
    def datasets(cls, data_root: Path | None = None) -> list[str]:
        extra = [d for d in local_datasets(data_root) if d not in UEA_DATASETS] if data_root else []
        return list(UEA_DATASETS) + extra

    @classmethod
    def dataset_status(cls, dataset: str, data_root: Path) -> str:
        if all(p.is_file() for p in _files(local_dir(data_root, dataset), dataset)):
            return "local"
        return "package" if packaged_dir(dataset) else "missing"

    @classmethod
    def fetch(cls, dataset: str, data_root: Path, force: bool = False) -> Path:
        return download(dataset, data_root, force)

    def check_data(self) -> None:
        check_name(self.dataset_name, self.data_root)
        if locate(self.dataset_name, self.data_root) is None:
            raise DataNotFoundError(missing_message(self.dataset_name, self.data_root))

    def setup(self, protocol: str) -> None:
        self.check_data()
        name, cfg = self.dataset_name, self.cfg
        self.source = locate(name, self.data_root)
        train_path, test_path = _files(self.source, name)
        train_x, train_y = read_ts(train_path)
        test_x, test_y = read_ts(test_path)
        self.classes = sorted(set(train_y))
        unseen = sorted(set(test_y) - set(self.classes))
        if unseen:
            raise UserError(f"{test_path} has labels absent from TRAIN: {unseen}")
        to_index = {c: i for i, c in enumerate(self.classes)}
        train_t = np.array([to_index[c] for c in train_y])
        test_t = np.array([to_index[c] for c in test_y])
        train_x = [interpolate_missing(s) for s in train_x]
        test_x = [interpolate_missing(s) for s in test_x]

        if protocol == "holdout":
            fit_idx, val_idx = stratified_split(train_t, float(cfg.val_fraction), int(cfg.split_seed))
        elif protocol == "paper":
            fit_idx, val_idx = np.arange(len(train_x)), np.array([], dtype=int)
        else:
            raise unknown_choice("protocol", protocol, ["holdout", "paper"])

        # Channel statistics of the training split only (all time steps of all its series).
        stacked = np.concatenate([train_x[i] for i in fit_idx])
        mean, std = stacked.mean(0), stacked.std(0)
        std[std < 1e-8] = 1.0
        norm = lambda s: (s - mean) / std  # noqa: E731
        self.max_len = int(cfg.max_len or max(len(s) for s in train_x))
        self.n_channels, self.n_classes = train_x[0].shape[1], len(self.classes)

        def make(xs, ts, idx):
            x, mask = pad([norm(xs[i]) for i in idx], self.max_len)
            return TensorDictDataset(x=x, mask=mask, y=torch.as_tensor(ts[idx], dtype=torch.long))

        self.splits = {"train": make(train_x, train_t, fit_idx), "test": make(test_x, test_t, np.arange(len(test_x)))}
        if len(val_idx):
            self.splits["val"] = make(train_x, train_t, val_idx)

    def setup_synthetic(self, seq_len: int) -> None:
        syn = self.cfg.get("synthetic") or {}
        self.source, self.splits = "synthetic", {}
        self.n_channels, self.n_classes = int(syn.get("channels", 12)), int(syn.get("classes", 9))
        self.max_len = int(seq_len)

    def synthetic_batch(self, batch_size: int, seq_len: int, device="cpu") -> dict:
        g = torch.Generator().manual_seed(0)
        return {
            "x": torch.randn(batch_size, seq_len, self.n_channels, generator=g).to(device),
            "mask": torch.ones(batch_size, seq_len, dtype=torch.bool, device=device),
            "y": torch.randint(0, self.n_classes, (batch_size,), generator=g).to(device),
        }

    def describe(self) -> dict:
        return {
            "source": str(self.source),
            "channels": self.n_channels,
            "classes": self.n_classes,
            "max_len": self.max_len,
            **{f"n_{k}": len(v) for k, v in self.splits.items()},
        }

    def build_model(self, model_cfg):
        from models.backbones import TimeSeriesTransformer, build_layer_attentions

        b = self.cfg.backbone
        attentions = build_layer_attentions(model_cfg, int(b.n_layers), int(b.d_model), int(b.n_heads), self.max_len)
        options = {k: v for k, v in b.items() if k not in ("n_layers", "n_heads")}
        return TimeSeriesTransformer(self.n_channels, self.n_classes, self.max_len, attentions, **options)

    def model_inputs(self, batch: dict) -> dict:
        return {"x": batch["x"], "mask": batch["mask"]}


def download(name: str, data_root: Path, force: bool = False) -> Path:
    """Put ``name`` under the data root: copy sktime's packaged copy, or download the archive's zip
    (verify its CRCs, record its sha256 beside the files, unpack). Returns the dataset directory."""
    check_name(name)
    target = local_dir(data_root, name)
    if all(p.is_file() for p in _files(target, name)) and not force:
        return target
    src = packaged_dir(name)
    target.mkdir(parents=True, exist_ok=True)
    if src is not None:
        for p in _files(src, name):
            shutil.copy2(p, target / p.name)
        return target
    url = UEA_URL.format(name=name)
    with tempfile.TemporaryDirectory() as tmp:
        zpath = Path(tmp) / f"{name}.zip"
        try:
            with urllib.request.urlopen(url, timeout=30) as r, open(zpath, "wb") as f:
                shutil.copyfileobj(r, f)
        except OSError as e:
            raise DataNotFoundError(
                f"cannot download {url} ({getattr(e, 'reason', e)}); fetch it elsewhere and unpack "
                f"{name}_TRAIN.ts and {name}_TEST.ts into {target}/"
            ) from None
        digest = hashlib.sha256(zpath.read_bytes()).hexdigest()
        with zipfile.ZipFile(zpath) as z:
            bad = z.testzip()
            if bad is not None:
                raise DataNotFoundError(f"corrupt download {url}: CRC mismatch in {bad}; retry")
            for member in z.namelist():
                base = Path(member).name
                if base in {p.name for p in _files(target, name)}:
                    (target / base).write_bytes(z.read(member))
        (target / f"{name}.zip.sha256").write_text(f"{digest}  {name}.zip\n")
    if not all(p.is_file() for p in _files(target, name)):
        raise DataNotFoundError(f"{url} did not contain {name}_TRAIN.ts and {name}_TEST.ts")
    return target
