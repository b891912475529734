"""Image classification: pay-better-attention's ViTs (``task=vit``) and DeiT (``task=deit``).

Only this package (and models/vision.py) uses torchvision, timm and mlxtend, always imported inside
functions through torchvision_shim.py, so importing the package at startup costs nothing.
"""
from attnbench.tasks.vision import tasks  # noqa: F401  (registers the tasks and the `vision` fetcher)
