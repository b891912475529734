"""Per-sample transforms (run in the DataLoader workers) and batch collation of the vision tasks.

Samples are dicts: ``{"image": uint8 tensor (C, H, W) or a PIL image, "y": label}`` in, ``{"x":
float tensor (C, S, S), "y": label}`` out. Classes rather than closures, so DataLoader workers can
pickle them under any start method.

- :class:`KerasViTTransform`: the keras-io ViT example's ``data_augmentation``: Normalization
  (mean / std per channel adapted on the training split), Resizing to the model's image size
  (bilinear), and on the training split RandomFlip("horizontal"), RandomRotation(0.02) and
  RandomZoom(0.2) -- here one affine resampling (rotation +-0.02 turns, isotropic scale 1 +- zoom,
  zero fill of the normalised image; keras zooms height and width independently and fills by
  reflection).
- :func:`deit_transform`: DeiT's ``build_transform`` with timm's ``create_transform``
  (RandomResizedCrop 224 bicubic, flip, RandAugment rand-m9-mstd0.5-inc1, random erasing 0.25
  'pixel'; evaluation: resize 256 bicubic, centre crop 224), ImageNet mean / std.
- :class:`MixupCollate`: timm's Mixup / CutMix on each training batch (DeiT: mixup 0.8, cutmix 1.0,
  switch probability 0.5, label smoothing 0.1 folded into the soft targets).
"""
from __future__ import annotations

import math

import numpy as np
import torch

from attnbench.tasks.vision.torchvision_shim import import_timm

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def channel_stats(images: torch.Tensor) -> tuple[list[float], list[float]]:
    """Mean and standard deviation per channel of uint8 images (N, C, H, W), on the 0-255 scale
    (keras Normalization.adapt on the raw pixels)."""
    x = images.double()
    mean = x.mean(dim=(0, 2, 3))
    std = x.std(dim=(0, 2, 3), unbiased=False).clamp(min=1e-6)
    return mean.tolist(), std.tolist()


class KerasViTTransform:
    """The keras ViT example's preprocessing (see the module docstring). Resizing, flip, rotation
    and zoom are one bilinear resampling (``affine_grid`` + ``grid_sample``, zero fill) from the
    stored image to the model's image size: the same sampling positions as Resizing followed by
    the random layers, at a tenth of the cost of applying them one by one."""

    def __init__(self, image_size: int, mean, std, train: bool, flip: bool = True, rotation: float = 0.02,
                 zoom: float = 0.2):
        self.image_size, self.train = int(image_size), bool(train)
        self.mean = torch.tensor(mean, dtype=torch.float32).view(-1, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(-1, 1, 1)
        self.flip, self.rotation, self.zoom = bool(flip), float(rotation), float(zoom)

    def __call__(self, sample: dict) -> dict:
        import torch.nn.functional as F

        image = sample["image"]
        if not torch.is_tensor(image):  # PIL (ImageNet): to a uint8 tensor (C, H, W)
            image = torch.from_numpy(np.asarray(image.convert("RGB"), dtype=np.uint8).copy()).permute(2, 0, 1)
        x = ((image.float() - self.mean) / self.std)[None]
        size = (1, x.shape[1], self.image_size, self.image_size)
        if not self.train:  # Resizing only (bilinear, no antialiasing: keras' default)
            return {"x": F.interpolate(x, size=size[2:], mode="bilinear", align_corners=False)[0], "y": sample["y"]}
        # output -> input coordinates: scale (zoom) and rotate about the centre, mirror for the flip
        angle = math.radians(float(torch.empty(()).uniform_(-360 * self.rotation, 360 * self.rotation)))
        scale = float(torch.empty(()).uniform_(1 - self.zoom, 1 + self.zoom))
        mirror = -1.0 if self.flip and bool(torch.rand(()) < 0.5) else 1.0
        c, s = math.cos(angle) / scale, math.sin(angle) / scale
        theta = torch.tensor([[[c * mirror, -s, 0.0], [s * mirror, c, 0.0]]], dtype=torch.float32)
        grid = F.affine_grid(theta, list(size), align_corners=False)
        x = F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
        return {"x": x[0], "y": sample["y"]}


class TimmTransform:
    """A timm/torchvision transform of a PIL image, as a sample transform."""

    def __init__(self, transform):
        self.transform = transform

    def __call__(self, sample: dict) -> dict:
        return {"x": self.transform(sample["image"]), "y": sample["y"]}


def deit_transform(train: bool, augment, image_size: int) -> TimmTransform:
    """DeiT's build_transform (facebookresearch/deit datasets.py) through timm's create_transform."""
    timm = import_timm()
    if train:
        t = timm.data.create_transform(
            input_size=image_size, is_training=True, color_jitter=float(augment.color_jitter),
            auto_augment=str(augment.auto_augment) if augment.auto_augment else None,
            interpolation=str(augment.interpolation), re_prob=float(augment.re_prob), re_mode=str(augment.re_mode),
            re_count=int(augment.re_count), mean=IMAGENET_MEAN, std=IMAGENET_STD)
    else:
        t = timm.data.create_transform(input_size=image_size, is_training=False, interpolation="bicubic",
                                       crop_pct=float(augment.eval_crop_ratio), mean=IMAGENET_MEAN, std=IMAGENET_STD)
    return TimmTransform(t)


class MixupCollate:
    """Stack the samples, then timm's Mixup/CutMix: mixed images and soft (smoothed) targets."""

    def __init__(self, n_classes: int, augment):
        timm = import_timm()
        self.mixup = timm.data.Mixup(
            mixup_alpha=float(augment.mixup), cutmix_alpha=float(augment.cutmix), prob=float(augment.mixup_prob),
            switch_prob=float(augment.switch_prob), mode=str(augment.mixup_mode),
            label_smoothing=float(augment.label_smoothing), num_classes=int(n_classes))

    def __call__(self, items: list[dict]) -> dict:
        from torch.utils.data import default_collate

        batch = default_collate(items)
        x, y = self.mixup(batch["x"], batch["y"])
        return {"x": x, "y": y}
