"""Writers of small image datasets in their official file formats, for the vision and LRA tests:
MNIST's idx files, CIFAR's pickled batches (as the real files: Python 2 pickles whose keys and
array bytes are byte strings), ImageFolder trees of PNGs. Pixel content comes from real images
shipped with scikit-learn (the UCI digits) so the readers see real statistics."""
from __future__ import annotations

import functools
import importlib.util
import pickle
import struct
from pathlib import Path

import numpy as np


@functools.cache
def uci_digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's copy of the UCI digits, read as ``sklearn.datasets.load_digits`` reads it
    (sklearn/datasets/_base.py: 64 pixels then the label per row of data/digits.csv.gz) without
    importing scikit-learn (2 s of CPU in each test process that drew digits)."""
    package = Path(importlib.util.find_spec("sklearn").origin).parent
    rows = np.loadtxt(package / "datasets" / "data" / "digits.csv.gz", delimiter=",")
    return rows[:, :-1].reshape(-1, 8, 8), rows[:, -1].astype(np.int64)


def digits(n: int, size: int = 28, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``n`` of scikit-learn's 1,797 UCI digits (8 x 8, 0-16) upscaled to ``size`` x ``size`` uint8."""
    images, targets = uci_digits()
    idx = np.random.RandomState(seed).choice(len(targets), n, replace=n > len(targets))
    img = (images[idx] * (255 / 16)).astype(np.uint8)
    reps = -(-size // 8)
    img = np.kron(img, np.ones((1, reps, reps), dtype=np.uint8))[:, :size, :size]
    return np.ascontiguousarray(img), targets[idx]


# --- MNIST ------------------------------------------------------------------------------------------
def write_idx(path: Path, array: np.ndarray) -> None:
    """The idx format (LeCun): magic 0x0000 0x08 (ubyte) ndim, big-endian int32 sizes, raw bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    header = struct.pack(">HBB", 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}i", *array.shape)
    path.write_bytes(header + array.astype(np.uint8).tobytes())


def write_mnist(data_root: Path, n_train: int = 60, n_test: int = 20) -> dict:
    """torchvision's MNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte under ``data_root``."""
    raw = Path(data_root) / "MNIST" / "raw"
    out = {}
    for prefix, n, seed in (("train", n_train, 0), ("t10k", n_test, 1)):
        x, y = digits(n, 28, seed)
        write_idx(raw / f"{prefix}-images-idx3-ubyte", x)
        write_idx(raw / f"{prefix}-labels-idx1-ubyte", y.astype(np.uint8))
        out[prefix] = (x, y)
    return out


# --- CIFAR (Python 2 pickles) -----------------------------------------------------------------------
class _Py2Pickler(pickle._Pickler):
    """Writes ``bytes`` as Python 2 ``str`` (SHORT_BINSTRING / BINSTRING opcodes), as the CIFAR files
    were written: readers decode them with ``encoding='latin1'`` (torchvision) or ``'bytes'``."""

    dispatch = dict(pickle._Pickler.dispatch)

    def save_py2_str(self, obj: bytes) -> None:
        n = len(obj)
        self.write((pickle.SHORT_BINSTRING + bytes([n]) if n < 256 else pickle.BINSTRING + struct.pack("<i", n)) + obj)
        self.memoize(obj)

    dispatch[bytes] = save_py2_str


def dump_py2(obj, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        _Py2Pickler(f, protocol=2).dump(obj)


def cifar_images(n: int, seed: int) -> np.ndarray:
    """(n, 3072) uint8 rows, channel-major 32 x 32 planes (the CIFAR row layout), from real digits."""
    x, _ = digits(n, 32, seed)
    rgb = np.stack([x, 255 - x, (x // 2 + 64).astype(np.uint8)], axis=1)  # (n, 3, 32, 32)
    return rgb.reshape(n, 3072)


def write_cifar10(directory: Path, per_batch: int = 10) -> dict:
    """cifar-10-batches-py: data_batch_1..5, test_batch ({b'data', b'labels', b'batch_label',
    b'filenames'}) and batches.meta ({b'label_names', ...})."""
    rng = np.random.RandomState(0)
    out = {}
    for i, name in enumerate([f"data_batch_{k}" for k in range(1, 6)] + ["test_batch"]):
        data = cifar_images(per_batch, i)
        labels = [int(v) for v in rng.randint(0, 10, per_batch)]
        dump_py2({b"batch_label": f"batch {i + 1}".encode(), b"labels": labels, b"data": data,
                  b"filenames": [f"img_{i}_{j}.png".encode() for j in range(per_batch)]}, directory / name)
        out[name] = (data, labels)
    names = [b"airplane", b"automobile", b"bird", b"cat", b"deer", b"dog", b"frog", b"horse", b"ship", b"truck"]
    dump_py2({b"label_names": names, b"num_cases_per_batch": per_batch, b"num_vis": 3072}, directory / "batches.meta")
    return out


def write_cifar100(directory: Path, n_train: int = 40, n_test: int = 20) -> dict:
    """cifar-100-python: train, test ({b'data', b'fine_labels', b'coarse_labels', ...}) and meta."""
    rng = np.random.RandomState(0)
    out = {}
    for i, (name, n) in enumerate((("train", n_train), ("test", n_test))):
        data = cifar_images(n, 10 + i)
        fine = [int(v) for v in np.arange(n) % 100]
        rng.shuffle(fine)
        dump_py2({b"filenames": [f"{name}_{j}.png".encode() for j in range(n)], b"batch_label": name.encode(),
                  b"fine_labels": fine, b"coarse_labels": [f // 5 for f in fine], b"data": data}, directory / name)
        out[name] = (data, fine)
    dump_py2({b"fine_label_names": [f"class{k}".encode() for k in range(100)],
              b"coarse_label_names": [f"super{k}".encode() for k in range(20)]}, directory / "meta")
    return out


# --- ImageFolder ------------------------------------------------------------------------------------
def write_image_folder(root: Path, classes: list[str], per_class: int, size: int = 32, seed: int = 0) -> None:
    """``root/<class>/<i>.png``: RGB PNGs made from real digits (a different digit per class)."""
    from PIL import Image

    x, _ = digits(len(classes) * per_class, size, seed)
    k = 0
    for c in classes:
        (root / c).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            g = x[k]
            Image.fromarray(np.stack([g, g[::-1], 255 - g], axis=-1)).save(root / c / f"{c}_{i}.png")
            k += 1
