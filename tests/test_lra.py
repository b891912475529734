"""Long Range Arena: the ListOps generator, tokenisation, loaders on fixtures written in the exact
release formats, tiny end-to-end runs of every task, the retrieval dual encoder, and the
step-based trainer options the LRA protocol needs."""
from __future__ import annotations

import csv
import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from bench_cli.commands.cli import main
from bench_cli.config.compose import compose
from bench_cli.core.errors import DataNotFoundError, UserError
from bench_cli.results.csv_store import read_records
from bench_cli.results.job_keys import semantic_config
from attnbench.tasks import task_class
from attnbench.tasks.fetch import fetcher
from image_data import write_cifar10
from attnbench.tasks.lra import listops_generator
from attnbench.tasks.lra import (LISTOPS_TOKENS, encode_bytes, encode_listops, listops_tokens, listops_vocab, read_aan_tsv,
                       rgb_to_gray)

SMALL_GEN = dict(min_length=10, max_length=60, max_depth=10, max_args=10)


# --- fixtures in the release formats ----------------------------------------------------------------
def write_listops(directory: Path, seed: int = 0, n=(40, 10, 10), workers: int | None = None) -> None:
    """``workers``: the generator's processes (the files are the same for any; 1 starts none)."""
    listops_generator.write_dataset(directory, num_train=n[0], num_val=n[1], num_test=n[2], seed=seed, workers=workers, **SMALL_GEN)


def write_aan(directory: Path) -> None:
    """new_aan_pairs.{train,eval,test}.tsv: label (float), id1, id2, text1, text2; no header."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    for split, n in (("train", 16), ("eval", 6), ("test", 6)):
        lines = []
        for i in range(n):
            label = i % 2
            t1 = ("citing paper about attention " * rng.randint(1, 4)).strip()
            t2 = (("attention cited " if label else "unrelated topic ") * rng.randint(1, 4)).strip()
            lines.append(f"{float(label)}\tP{i}a\tP{i}b\t{t1}\t{t2}")
        (directory / f"new_aan_pairs.{split}.tsv").write_text("\n".join(lines) + "\n")


def write_cifar(directory: Path, per_batch: int = 10) -> np.ndarray:
    """torchvision's cifar-10-batches-py in the real (Python 2 pickle) format; the first batch's rows."""
    return write_cifar10(directory, per_batch)["data_batch_1"][0]


def write_pathfinder(directory: Path, n: int = 20) -> None:
    """pathfinder32/<difficulty>/imgs/<k>/sample_<i>.png + metadata/<k>.npy (text lines)."""
    rng = np.random.RandomState(0)
    lines = []
    (directory / "imgs" / "0").mkdir(parents=True, exist_ok=True)
    (directory / "metadata").mkdir(parents=True, exist_ok=True)
    for i in range(n):
        label = i % 2
        img = np.zeros((32, 32), dtype=np.uint8)
        img[rng.randint(0, 32, 30), rng.randint(0, 32, 30)] = 255 if label else 128
        Image.fromarray(img, mode="L").save(directory / "imgs" / "0" / f"sample_{i}.png")
        lines.append(f"imgs/0 sample_{i}.png {i} {label} 1.0 14 4 2 0.5 1 1")
    (directory / "imgs" / "0" / "sample_empty.png").write_bytes(b"")  # the release has a few empty images
    lines.append("imgs/0 sample_empty.png 99 1 1.0 14 4 2 0.5 1 1")
    (directory / "metadata" / "0.npy").write_text("\n".join(lines) + "\n")


def write_acl_imdb(directory: Path) -> None:
    for split in ("train", "test"):
        for label, sub in ((0, "neg"), (1, "pos")):
            d = directory / split / sub
            d.mkdir(parents=True, exist_ok=True)
            for i in range(6):
                word = "great" if label else "awful"
                (d / f"{i}_{7 if label else 2}.txt").write_text(f"This film was {word}.<br /> {word} {i} é")


@pytest.fixture
def lra_root(workdir):
    return workdir / "data"


pytestmark = pytest.mark.usefixtures("single_thread")


TINY = ["task.backbone.d_model=16", "task.backbone.d_ff=32", "trainer.max_steps=4", "trainer.eval_every_steps=2",
        "trainer.batch_size=8", "trainer.micro_batch_size=4", "trainer.eval_batch_size=16", "trainer.progress=false",
        "trainer.optimizer.name=adamw", "trainer.scheduler.name=onecycle", "trainer.scheduler.warmup_steps=1",
        "measure.flops=false", "measure.memory=false", "results.path=res.csv", "trainer.num_threads=1"]


def run(*args: str) -> dict:
    keys = {a.split("=", 1)[0] for a in args}
    main(["run", *args, *[t for t in TINY if t.split("=", 1)[0] not in keys]])
    return read_records("res.csv")[-1]


# --- the generator ----------------------------------------------------------------------------------
# Two ListOps evaluators written here from the official definition (lra_benchmarks/data/listops.py,
# ``to_value``): MIN, MAX, MED = int(np.median(args)), SM = np.sum(args) % 10; the references the
# generator's labels are checked against (tasks.lra.listops_generator has its own evaluator).
def official_value(tree):
    """``to_value`` of the official generator, on its tuple trees: ((op, a0), a1) ... , END)."""
    if not isinstance(tree, tuple):
        return tree
    left, right = official_value(tree[0]), official_value(tree[1])
    if left in listops_generator.OPERATORS:  # an unsaturated function
        return (left, [right])
    if right == listops_generator.END:  # the function is saturated
        op, args = left
        return {"[MIN": min, "[MAX": max, "[MED": lambda a: int(np.median(a)),
                "[SM": lambda a: int(np.sum(a)) % 10}[op](args)
    return (left[0], left[1] + [right])  # one more argument


def stack_value(source: str) -> int:
    """The value of a Source string, read left to right with a stack of open operators."""
    frames = [("top", [])]
    for token in source.split():
        if token in "()":
            continue  # the parentheses only group the official tuples
        if token.startswith("["):
            frames.append((token, []))
        elif token == "]":
            op, args = frames.pop()
            value = {"[MIN": min(args), "[MAX": max(args), "[MED": int(np.median(args)),
                     "[SM": sum(args) % 10}[op]
            frames[-1][1].append(value)
        else:
            frames[-1][1].append(int(token))
    (value,) = frames[0][1]
    return value


HAND_CHECKED = {
    "( ( ( [MAX 2 ) 9 ) ] )": 9,
    "( ( ( ( [MED 1 ) 2 ) 7 ) ] )": 2,
    "( ( ( [MED 1 ) 4 ) ] )": 2,  # int(np.median([1, 4])) = int(2.5)
    "( ( ( [SM 7 ) 8 ) ] )": 5,
    "( ( ( [MIN ( ( ( [MAX 3 ) 8 ) ] ) ) 5 ) ] )": 5,
    "( ( ( ( ( [MED 9 ) 0 ) 3 ) 8 ) ] )": 5,  # int(np.median([9, 0, 3, 8])) = int(5.5)
    "( ( ( ( [SM ( ( ( [SM 9 ) 9 ) ] ) ) 9 ) 4 ) ] )": 1,  # (18 % 10 + 9 + 4) % 10
}


def test_evaluators_on_hand_checked_expressions():
    for source, value in HAND_CHECKED.items():
        assert stack_value(source) == value, source
        assert listops_generator.evaluate_source(source) == value, source


def test_generator_labels_equal_independent_evaluations_on_many_trees():
    rng, ops, with_median = random.Random(1), set(), 0
    for i in range(1500):
        depth, args = (3, 5) if i % 2 else (6, 4)
        source, value, _ = listops_generator.sample_tree(rng, depth, args)
        assert value == stack_value(source) == listops_generator.evaluate_source(source), source
        ops |= {t for t in source.split() if t.startswith("[")}
        with_median += "[MED" in source
    assert ops == set(listops_generator.OPERATORS) and with_median > 100  # every operator met, MED in many trees


def test_generated_listops_parses_and_labels_are_the_evaluated_values(tmp_path):
    write_listops(tmp_path, seed=3, n=(60, 10, 10))
    meta = json.loads((tmp_path / "generator.json").read_text())
    assert meta["num_train"] == 60 and meta["seed"] == 3
    raw = (tmp_path / "basic_train.tsv").read_bytes()
    assert raw.startswith(b"Source\tTarget\r\n")  # csv.writer with a tab delimiter, as the release
    seen = set()
    for split, n in (("train", 60), ("val", 10), ("test", 10)):
        with open(tmp_path / f"basic_{split}.tsv", newline="") as f:
            rows = list(csv.reader(f, delimiter="\t"))
        assert rows[0] == ["Source", "Target"] and len(rows) == n + 1
        for source, target in rows[1:]:
            tokens = source.split()
            assert set(tokens) <= {"(", ")", "]", "[MIN", "[MAX", "[MED", "[SM", *map(str, range(10))}
            length = sum(t not in "()" for t in tokens)  # values + operators + closing brackets
            assert SMALL_GEN["min_length"] < length < SMALL_GEN["max_length"]
            assert tokens.count("(") == tokens.count(")")
            assert int(target) == stack_value(source)
            seen.add(source)
    assert len(seen) == 80  # de-duplicated across splits


def test_generator_trees_depth_arity_and_value():
    rng = random.Random(0)
    checked = 0
    while checked < 200:
        source, value, length = listops_generator.sample_tree(rng, 4, 5)
        assert value == stack_value(source)
        depth, best, n_ops = 0, 0, 0
        for t in source.split():
            if t.startswith("["):
                depth, n_ops = depth + 1, n_ops + 1
                best = max(best, depth)
            elif t == "]":
                depth -= 1
        assert best <= 4 and length == sum(t not in "()" for t in source.split())
        checked += 1


def test_generator_is_seeded_and_uses_the_official_defaults(tmp_path):
    assert listops_generator.DEFAULTS["num_train"] == 96000 and listops_generator.DEFAULTS["max_length"] == 2000 and listops_generator.DEFAULTS["min_length"] == 500
    assert listops_generator.OPERATORS == ["[MIN", "[MAX", "[MED", "[SM"] and listops_generator.VALUE_P == 0.25
    a = listops_generator.generate(num_train=5, num_val=1, num_test=1, seed=7, **SMALL_GEN)
    b = listops_generator.generate(num_train=5, num_val=1, num_test=1, seed=7, **SMALL_GEN)
    assert a == b


# The official generator (lra_benchmarks/data/listops.py: generate_tree, to_string, to_value and the
# main loop over a set of trees), transcribed with a seeded RNG and an insertion-ordered set: the
# reference the streamed, parallel generator must reproduce draw for draw and byte for byte.
def official_tree(rng, depth, max_depth, max_args):
    r = rng.random() if depth < max_depth else 1
    if r > listops_generator.VALUE_P:
        return rng.choice(listops_generator.VALUES), 1
    length, args = 2, []
    for _ in range(rng.randint(2, max_args)):
        sub, sub_len = official_tree(rng, depth + 1, max_depth, max_args)
        args.append(sub)
        length += sub_len
    tree = (rng.choice(listops_generator.OPERATORS), args[0])
    for a in args[1:]:
        tree = (tree, a)
    return (tree, listops_generator.END), length


def official_string(t):
    return str(t) if not isinstance(t, tuple) else "( " + official_string(t[0]) + " " + official_string(t[1]) + " )"


def official_rows(n, seed, max_depth, max_args, min_length, max_length):
    rng, trees = random.Random(seed), {}
    while len(trees) < n:
        tree, length = official_tree(rng, 1, max_depth, max_args)
        if min_length < length < max_length and tree not in trees:
            trees[tree] = None
    return [(official_string(t), official_value(t)) for t in trees]


@pytest.mark.parametrize("max_depth, max_args", [(6, 7), (2, 3), (1, 10), (10, 10)])
def test_generator_draws_as_the_official_one(max_depth, max_args):
    ours, official = random.Random(11), random.Random(11)
    words = 0
    for _ in range(300):
        out = []
        length, value, used = listops_generator._tree(ours.random, ours.getrandbits, max_depth, max_args, out)
        tree, official_length = official_tree(official, 1, max_depth, max_args)
        source = " ".join(out)
        assert (source, length) == (official_string(tree), official_length) and value == official_value(tree)
        words += used
    assert ours.getstate() == official.getstate()  # the same draws
    counted = random.Random(11)
    listops_generator._skip(counted, words)
    assert counted.getstate() == ours.getstate()  # and the words counted are the words drawn


def test_generator_deduplicates_in_generation_order():
    small = dict(max_depth=3, max_args=3, min_length=3, max_length=5)  # length 4: 400 distinct trees
    rows = listops_generator.generate(num_train=150, num_val=25, num_test=25, seed=2, **small)
    flat = rows["train"] + rows["val"] + rows["test"]
    assert flat == official_rows(200, 2, **small)
    assert len({s for s, _ in flat}) == 200  # distinct, although the stream repeats trees
    stream = listops_generator.candidates(2, small)
    first = [next(stream)[1] for _ in range(250)]
    assert len(set(first)) < 250


def read_bytes(directory: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def test_generated_files_are_the_same_for_any_run_and_worker_count(tmp_path, monkeypatch):
    params = dict(num_train=40, num_val=8, num_test=8, seed=4, max_depth=6, max_args=6, min_length=20, max_length=80)
    listops_generator.write_dataset(tmp_path / "a", workers=1, **params)
    once = read_bytes(tmp_path / "a")
    listops_generator.write_dataset(tmp_path / "b", workers=1, **params)
    assert read_bytes(tmp_path / "b") == once
    expected = official_rows(56, 4, **{k: params[k] for k in ("max_depth", "max_args", "min_length", "max_length")})
    with open(tmp_path / "a" / "basic_val.tsv", newline="") as f:
        assert [(s, int(t)) for s, t in list(csv.reader(f, delimiter="\t"))[1:]] == expected[40:48]
    # Many small segments, workers starting right at their segment (no burn-in): most chains have
    # not met the true one there, so the main process re-reads those; the bytes do not change.
    monkeypatch.setattr(listops_generator, "FIRST_SEGMENT", 256)
    monkeypatch.setattr(listops_generator, "MAX_SEGMENT", 1024)
    for workers, burn_in in ((2, 0), (3, 4096)):
        monkeypatch.setattr(listops_generator, "BURN_IN", burn_in)
        stats = {}
        listops_generator.write_dataset(tmp_path / f"w{workers}", workers=workers, stats=stats, **params)
        assert read_bytes(tmp_path / f"w{workers}") == once, workers
        assert stats["segments"] > 10 and (stats["reread"] > 0) == (burn_in == 0), stats
    assert not list(tmp_path.glob("*/*.part"))


# --- tokenisation -----------------------------------------------------------------------------------
def test_listops_tokenisation_as_the_lra_pipelines():
    src = "( ( ( [MAX 2 ) 9 ) ] )"
    assert listops_tokens(src, "lra") == ["[MAX", "2", "9", "]"]
    assert listops_tokens(src, "lra_alnum") == ["MAX", "2", "9"]  # the first release dropped brackets
    vocab = listops_vocab("lra")
    assert len(vocab) == len(LISTOPS_TOKENS) == 15 and min(vocab.values()) == 1
    ids = encode_listops(src, vocab)
    assert ids == [vocab["[MAX"], vocab["2"], vocab["9"], vocab["]"]] and 0 not in ids
    assert encode_listops("[FIRST 1 ]", vocab)[0] == 16  # out of vocabulary -> the OOV bucket


def test_byte_level_tokenisation():
    ids = encode_bytes("hé!", 10)
    assert ids.tolist() == [ord("h") + 1, 0xC3 + 1, 0xA9 + 1, ord("!") + 1]  # UTF-8 bytes + 1, 0 = padding
    assert encode_bytes(b"abcdef", 4).tolist() == [98, 99, 100, 101]


def test_rgb_to_grayscale_matches_tensorflow_formula():
    img = np.array([[[[255, 255, 255], [0, 0, 0], [255, 0, 0], [10, 200, 30]]]], dtype=np.uint8)
    gray = rgb_to_gray(img)[0, 0]
    expected = [int(min((0.2989 * r + 0.587 * g + 0.114 * b) / 255 * 255.5, 255)) for r, g, b in img[0, 0].tolist()]
    assert gray.tolist() == expected and gray.dtype == np.uint8


# --- loaders ------------------------------------------------------------------------------------
def lra_cfg(task: str, **overrides):
    cfg = compose([f"task={task}", *[f"task.{k}={v}" for k, v in overrides.items()]])
    return cfg


def test_listops_release_loader_pads_masks_and_caches(lra_root, monkeypatch):
    write_listops(lra_root / "lra_release" / "listops-1000")
    cfg = lra_cfg("lra_listops", max_len=64, seq_len=64)
    task = task_class("lra_listops")(cfg.task, lra_root)
    task.setup("holdout")
    tr = task.splits["train"].tensors
    assert set(task.splits) == {"train", "val", "test"} and len(task.splits["val"]) == 10
    assert tr["x"].shape == (40, 64) and tr["y"].dtype == torch.long
    with open(lra_root / "lra_release" / "listops-1000" / "basic_train.tsv", newline="") as f:
        first = list(csv.reader(f, delimiter="\t"))[1]
    ids = encode_listops(first[0], listops_vocab("lra"))
    assert tr["x"][0, : len(ids)].tolist() == ids and (tr["x"][0, len(ids):] == 0).all()
    assert int(tr["y"][0]) == int(first[1])
    inputs = task.model_inputs({"x": tr["x"][:2]})
    assert torch.equal(inputs["mask"], tr["x"][:2] != 0)
    assert list((lra_root / "lra_cache").glob("listops-listops-*.pt"))
    # the second setup reads the cache, not the TSVs
    monkeypatch.setattr("attnbench.tasks.lra.tasks.read_listops_tsv", lambda p: (_ for _ in ()).throw(AssertionError("re-read")))
    again = task_class("lra_listops")(cfg.task, lra_root)
    again.setup("paper")
    assert set(again.splits) == {"train", "test"}
    assert torch.equal(again.splits["train"].tensors["x"], tr["x"])


def test_retrieval_loader_reads_the_release_tsv(lra_root):
    write_aan(lra_root / "lra_release" / "lra_release" / "tsv_data")  # the doubly nested layout works too
    t1, t2, y = read_aan_tsv(lra_root / "lra_release" / "lra_release" / "tsv_data" / "new_aan_pairs.train.tsv")
    assert len(t1) == 16 and y.tolist()[:2] == [0, 1]
    cfg = lra_cfg("lra_retrieval", max_len=32, seq_len=48)
    task = task_class("lra_retrieval")(cfg.task, lra_root)
    task.setup("holdout")
    tr = task.splits["train"].tensors
    assert tr["x"].shape == (16, 48) and tr["x2"].shape == (16, 48)
    assert tr["x"][0, :32].tolist() == encode_bytes(t1[0], 32).tolist() and (tr["x"][0, 32:] == 0).all()
    assert len(task.splits["val"]) == 6 and len(task.splits["test"]) == 6


def test_image_loader_grayscale_and_lra_split(lra_root):
    first = write_cifar(lra_root / "cifar-10-batches-py")
    cfg = lra_cfg("lra_image")
    task = task_class("lra_image")(cfg.task, lra_root)
    task.setup("holdout")
    assert len(task.splits["train"]) == 45 and len(task.splits["val"]) == 5 and len(task.splits["test"]) == 10
    x = task.splits["train"].tensors["x"]
    assert x.shape == (45, 1024) and x.dtype == torch.uint8
    rgb = first[0].reshape(3, 32, 32).transpose(1, 2, 0)[None]
    assert x[0].tolist() == rgb_to_gray(rgb).reshape(-1).tolist()
    none = task_class("lra_image")(lra_cfg("lra_image", pixel_mask="none").task, lra_root)
    assert none.requires == {"padding_mask": False} and none.model_inputs({"x": x[:1]})["mask"] is None


def test_pathfinder_loader_reads_metadata_and_skips_empty_images(lra_root):
    write_pathfinder(lra_root / "lra_release" / "pathfinder32" / "curv_contour_length_14")
    task = task_class("lra_pathfinder")(lra_cfg("lra_pathfinder").task, lra_root)
    task.setup("holdout")
    sizes = {k: len(v) for k, v in task.splits.items()}
    assert sizes == {"train": 16, "val": 2, "test": 2}  # 20 images (the empty one skipped), 80/10/10
    x = torch.cat([v.tensors["x"] for v in task.splits.values()])
    y = torch.cat([v.tensors["y"] for v in task.splits.values()])
    assert x.shape == (20, 1024) and set(x.unique().tolist()) <= {0, 128, 255}
    assert ((x == 255).any(1) == (y == 1)).all()  # label from metadata field 3 matches the drawing


def test_text_loader_from_acl_imdb_is_byte_level(lra_root):
    write_acl_imdb(lra_root / "aclImdb")
    task = task_class("lra_text")(lra_cfg("lra_text", max_len=20, seq_len=24, val_fraction=0.25).task, lra_root)
    task.setup("holdout")
    assert {k: len(v) for k, v in task.splits.items()} == {"train": 9, "val": 3, "test": 12}
    test = task.splits["test"].tensors
    text = (lra_root / "aclImdb" / "test" / "neg" / "0_2.txt").read_bytes()
    assert test["x"][0, :20].tolist() == [b + 1 for b in text[:20]] and (test["x"][0, 20:] == 0).all()
    assert "test set" in task.describe()["val_split"]


def test_missing_data_errors_are_one_line_with_where_and_how(lra_root):
    for name, needle in (("lra_listops", "attnbench data lra_listops --generate"), ("lra_retrieval", "attnbench data lra"),
                         ("lra_image", "attnbench data lra_image cifar10"), ("lra_pathfinder", "attnbench data lra"),
                         ("lra_text", "attnbench data lra_text imdb")):
        task = task_class(name)(lra_cfg(name).task, lra_root)
        with pytest.raises(DataNotFoundError) as e:
            task.check_data()
        msg = str(e.value)
        assert len(msg.splitlines()) == 1 and needle in msg and str(lra_root) in msg, msg


def test_data_command_generates_listops_offline(workdir, capsys):
    main(["data", "lra_listops", "--generate", "--num-train=12", "--num-val=3", "--num-test=3", "--min-length=10",
          "--max-length=40", "--seed=5", "--workers=2"])
    d = workdir / "data" / "lra_generated" / "listops-1000"
    out, err = capsys.readouterr()
    assert "listops_generated" in out
    # stderr is not a terminal here: one plain progress line per 10%, not a bar
    progress = [line for line in err.splitlines() if line.startswith("generating ListOps: ")]
    assert progress[0].startswith("generating ListOps: 0% (1/18") and progress[-1].startswith("generating ListOps: 100% (18/18")
    assert len(progress) == 11 and "\r" not in err and "\x1b" not in err
    assert len((d / "basic_train.tsv").read_text().splitlines()) == 13
    assert fetcher("lra_listops").status("listops_generated", workdir / "data") == "local"
    with pytest.raises(SystemExit):
        main(["data", "lra_listops", "--generate", "--num-train=abc"])


# --- models -------------------------------------------------------------------------------------------
def test_retrieval_dual_encoder_shares_weights():
    from attnbench.models.lra import LRAClassifier, LRADualEncoder, LRAEncoder

    cfg = lra_cfg("lra_retrieval")
    task = task_class("lra_retrieval")(cfg.task, "/nonexistent")
    task.setup_synthetic(64)
    model = task.build_model(cfg.model)
    assert isinstance(model, LRADualEncoder)
    assert sum(isinstance(m, LRAEncoder) for m in model.modules()) == 1
    calls = []
    model.encoder.register_forward_hook(lambda m, i, o: calls.append(o.detach()))
    model.eval()
    batch = task.synthetic_batch(3, 64)
    out = model(**task.model_inputs(batch))
    assert out.shape == (3, 2) and len(calls) == 2  # the same encoder encodes both documents
    u, v = calls
    expected = model.head(torch.cat([u, v, u * v, u - v], -1))
    torch.testing.assert_close(out, expected)
    single = LRAClassifier(model.encoder, 64, 128, 2)
    n_head_extra = 3 * 64 * 128  # the dual head's first layer is 4x wider; nothing else differs
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in single.parameters()) + n_head_extra


def test_lra_architecture_of_the_papers():
    cfg = lra_cfg("lra_listops")
    task = task_class("lra_listops")(cfg.task, "/nonexistent")
    task.setup_synthetic(2048)
    model = task.build_model(cfg.model)
    enc = model.encoder
    assert len(enc.layers) == 2 and enc.layers[0].norm_first and enc.layers[0].attention.n_heads == 2
    assert enc.layers[0].attention.d_head == 32 and enc.layers[0].ff1.out_features == 128
    assert enc.embed.positions.weight.shape == (2048, 64) and enc.embed.tokens.weight.shape == (32, 64)
    # mean pooling over all positions with padding zeroed (the LRA code), not over the real tokens only
    model.eval()
    x = torch.zeros(1, 2048, dtype=torch.long)
    x[0, :10] = 3
    normed = []
    enc.norm.register_forward_hook(lambda m, i, o: normed.append(o))
    pooled = enc(x, x != 0)
    torch.testing.assert_close(pooled, normed[0][:, :10].sum(1) / 2048)
    primal_plus = compose(["task=lra_listops", "model=primal_plus"])
    m = task.build_model(primal_plus.model)
    names = [type(layer.attention).__name__ for layer in m.encoder.layers]
    assert names[0] != names[1]  # Primal.+: softmax then Primal (Table 5: LRA 1+[1])


def test_retrieval_training_step_at_4096_on_cpu():
    cfg = lra_cfg("lra_retrieval", **{"backbone.attention_dropout": 0.0, "backbone.dropout": 0.0})
    task = task_class("lra_retrieval")(cfg.task, "/nonexistent")
    task.setup_synthetic(4096)
    model = task.build_model(cfg.model)
    batch = task.synthetic_batch(1, 4096)
    assert batch["x"].shape == (1, 4096) and batch["x2"].shape == (1, 4096) and (batch["x"] != 0).all()
    loss = task.loss(model(**task.model_inputs(batch)), batch)
    loss.backward()
    assert torch.isfinite(loss) and model.encoder.embed.positions.weight.grad.abs().sum() > 0


# --- end to end ----------------------------------------------------------------------------------------
SHORT = ["task.max_len=64", "task.seq_len=64"]
QUICK_STEPS = ["trainer.max_steps=2", "trainer.eval_every_steps=1", "task.subset.train=8"]


@pytest.mark.slow
def test_listops_trains_on_fixtures_and_evaluates_every_2_steps(lra_root, workdir):
    write_listops(lra_root / "lra_generated" / "listops-1000")
    row = run("task=lra_listops", "task.dataset=listops_generated", "model=attention_bn_sh", "model.attention.beta=0.2",
              *SHORT)
    assert row["status"] == "ok" and row["dataset"] == "listops_generated" and row["attention"] == "attention_bn_sh"
    assert int(row["steps_run"]) == 4 and int(row["best_step"]) in (2, 4)
    history = json.loads(row["metrics_json"])["history"]
    assert [h["step"] for h in history] == [2, 4]  # evaluated every 2 optimiser steps


# each LRA task of the release, on a fixture in its official format (one test each: they spread
# over the test workers)
LRA_FIXTURES = {
    "lra_retrieval": (lambda root: write_aan(root / "lra_release" / "tsv_data"), SHORT),
    "lra_text": (lambda root: write_acl_imdb(root / "aclImdb"), SHORT),
    "lra_image": (lambda root: write_cifar(root / "cifar-10-batches-py", per_batch=4), []),
    "lra_pathfinder": (lambda root: write_pathfinder(root / "lra_release" / "pathfinder32" / "curv_contour_length_14"),
                       ["task.pixel_mask=none"]),
}


@pytest.mark.slow
@pytest.mark.parametrize("task", list(LRA_FIXTURES))
def test_every_lra_task_trains_on_fixtures(lra_root, workdir, task):
    write, extra = LRA_FIXTURES[task]
    write(lra_root)
    row = run(f"task={task}", *extra, *QUICK_STEPS, "model=softmax")
    assert row["status"] == "ok", row.get("error")
    assert int(row["steps_run"]) == 2 and np.isfinite(float(row["test_loss"])), task


def write_learnable_listops(directory: Path, n=(200, 50, 50)) -> None:
    """ListOps in the release's format whose answers are readable from the tokens: MIN, MAX or MED of
    2-4 copies of one digit d, so the value is d; the ten digits equally often in every split
    (a model that has not learned is right about one time in ten)."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    for split, count in zip(("train", "val", "test"), n):
        rows = []
        for i in range(count):
            digit, op, k = i % 10, rng.choice(["[MIN", "[MAX", "[MED"]), rng.randint(2, 4)
            source = "( " * (k + 1) + f"{op} " + " ) ".join([str(digit)] * k) + " ) ] )"
            assert stack_value(source) == digit
            rows.append((source, digit))
        rng.shuffle(rows)
        with open(directory / f"basic_{split}.tsv", "w", newline="") as f:
            writer = csv.writer(f, delimiter="\t")
            writer.writerow(["Source", "Target"])
            writer.writerows(rows)


def test_lra_training_learns_a_planted_answer(lra_root, workdir):
    """The whole `attnbench run` path (loader, trainer, optimiser, scheduler, selection, test) must
    learn: training loss falls and test accuracy ends far above chance (10%). Fails when the
    optimiser steps do nothing."""
    write_learnable_listops(lra_root / "lra_release" / "listops-1000")
    row = run("task=lra_listops", "model=softmax", "task.max_len=16", "task.seq_len=16", "trainer.max_steps=60",
              "trainer.eval_every_steps=10", "trainer.batch_size=16", "trainer.micro_batch_size=16",
              "trainer.optimizer.lr=0.01", "trainer.scheduler.warmup_steps=5", "seed=0")
    assert row["status"] == "ok", row.get("error")
    losses = [h["train_loss"] for h in json.loads(row["metrics_json"])["history"]]
    assert len(losses) == 6 and losses[-1] < 0.5 * losses[0], losses
    assert float(row["test_accuracy"]) >= 60.0, row["test_accuracy"]


def test_step_based_trainer_with_micro_batches(lra_root, workdir):
    """max_steps cycles the loader; micro-batches accumulate to the effective batch size."""
    from bench_cli.engine.trainer import Trainer

    write_listops(lra_root / "lra_generated" / "listops-1000", n=(10, 4, 4))
    cfg = compose(["task=lra_listops", "task.dataset=listops_generated", "task.max_len=64", "task.seq_len=64",
                   "trainer.max_steps=5", "trainer.eval_every_steps=3", "trainer.batch_size=4",
                   "trainer.micro_batch_size=2", "trainer.optimizer.name=adamw", "trainer.scheduler.name=onecycle",
                   "trainer.scheduler.warmup_steps=2", "trainer.progress=false"])
    task = task_class("lra_listops")(cfg.task, lra_root)
    task.setup("holdout")
    model = task.build_model(cfg.model)
    calls = []
    orig = task.loss
    task.loss = lambda out, batch: (calls.append(len(batch["y"])), orig(out, batch))[1]
    result = Trainer(cfg.trainer, task, model, torch.device("cpu"), seed=0).fit("holdout")
    assert result.steps_run == 5 and result.epochs_run == 2  # 10 samples / batch 4 = 3 steps per epoch
    assert [h["step"] for h in result.history] == [3, 5]
    assert max(calls) == 2 and sum(calls) == 10 + 8  # micro-batches of 2; the 2nd epoch stops after 2 steps


def test_release_download_unpacks_and_the_task_finds_it(workdir, tmp_path, monkeypatch):
    """`attnbench data lra` on a (file://) copy of the release archive: lra_release/... unpacked."""
    import tarfile

    src = tmp_path / "src"
    write_listops(src / "lra_release" / "listops-1000", n=(6, 2, 2))
    archive = tmp_path / "lra_release.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(src / "lra_release", arcname="lra_release")
    monkeypatch.setattr("attnbench.tasks.lra.fetchers.LRA_URL", archive.as_uri())
    main(["data", "lra"])
    root = workdir / "data"
    assert fetcher("lra").status("lra_release", root) == "local"
    assert fetcher("lra_listops").status("listops", root) == "local"
    task = task_class("lra_listops")(lra_cfg("lra_listops").task, root)
    task.check_data()


def test_generated_set_is_not_silently_replaced(workdir):
    main(["data", "lra_listops", "--generate", "--num-train=4", "--num-val=2", "--num-test=2", "--min-length=10",
          "--max-length=40"])
    with pytest.raises(SystemExit) as e:  # other parameters: refuse without --force
        main(["data", "lra_listops", "--generate", "--num-train=5", "--num-val=2", "--num-test=2", "--min-length=10",
              "--max-length=40"])
    assert e.value.code == 2
    main(["data", "lra_listops", "--generate", "--force", "--num-train=5", "--num-val=2", "--num-test=2",
          "--min-length=10", "--max-length=40"])
    d = workdir / "data" / "lra_generated" / "listops-1000"
    assert json.loads((d / "generator.json").read_text())["num_train"] == 5


def test_a_run_that_expects_a_generated_listops_set_names_the_command_and_refuses_another(workdir, lra_root, capsys):
    """task.generator: the generated set a run expects. Missing: the one command that writes it
    where the run looks (options and data root). Made with other options: refused in one line, not
    read (a 2K-token set cut to 256 tokens would train on truncated expressions). `attnbench data`
    with the run's config writes exactly that set."""
    want = {"num_train": 6, "num_val": 2, "num_test": 2, "min_length": 10, "max_length": 40}
    gen = [f"+task.generator.{k}={v}" for k, v in want.items()]
    cfg = compose(["task=lra_listops", "task.dataset=listops_generated", *gen])
    task = task_class("lra_listops")(cfg.task, lra_root)
    with pytest.raises(DataNotFoundError) as e:
        task.check_data()
    command = ("attnbench data lra_listops --generate --num-train=6 --num-val=2 --num-test=2 --min-length=10 "
               f"--max-length=40 paths.data_root={lra_root}")
    assert len(str(e.value).splitlines()) == 1 and f"run `{command}`" in str(e.value)
    main(["data", "lra_listops", "--generate", "--num-train=6", "--num-val=2", "--num-test=2", "--min-length=10",
          "--max-length=30"])  # another set: refused
    with pytest.raises(DataNotFoundError) as e:
        task.check_data()
    msg = str(e.value)
    assert len(msg.splitlines()) == 1 and "made with max_length=30, this run expects max_length=40" in msg
    assert msg.endswith(f"`{command} --force`")
    main(["data", "lra_listops", "--generate", "--force", "task=lra_listops", *gen])
    made = json.loads((lra_root / "lra_generated" / "listops-1000" / "generator.json").read_text())
    assert {k: made[k] for k in want} == want
    task.check_data()  # the expected set: accepted
    assert "generator" not in semantic_config(cfg)["task"]  # a check of the data: job keys do not change
    typo = compose(["task=lra_listops", "task.dataset=listops_generated", "+task.generator.max_lenght=40"])
    with pytest.raises(UserError, match="unknown task.generator option 'max_lenght' .did you mean 'max_length'"):
        task_class("lra_listops")(typo.task, lra_root).check_data()
    for bad in ("abc", "2.5", "true"):  # not a whole number: one line naming the option, no traceback,
        cfg_bad = compose(["task=lra_listops", "task.dataset=listops_generated", *gen[:-1],
                           f"+task.generator.max_length={bad}"])
        for root in (lra_root, workdir / "empty"):  # with the set there or missing (no command with "abc")
            with pytest.raises(UserError) as e:
                task_class("lra_listops")(cfg_bad.task, root).check_data()
            assert str(e.value).startswith("task.generator max_length must be an integer, got ")
    with pytest.raises(SystemExit) as e:
        main(["data", "lra_listops", "--generate", "--force", "--max-length=abc"])
    assert e.value.code == 2 and "max_length must be an integer, got 'abc'" in capsys.readouterr().err


def test_text_loader_through_hf_datasets(lra_root, monkeypatch):
    """The HF `datasets` path (stanfordnlp/imdb), with the hub replaced by an in-memory copy."""
    fake = {"train": {"text": ["good movie", "bad movie", "great", "awful"] * 3, "label": [1, 0, 1, 0] * 3},
            "test": {"text": ["fine", "poor"], "label": [1, 0]}}
    calls = []
    monkeypatch.setattr("attnbench.tasks.lra.fetchers.load_imdb", lambda root: calls.append(root) or fake)
    task = task_class("lra_text")(lra_cfg("lra_text", max_len=8, seq_len=16).task, lra_root)
    task.setup("paper")  # LRA's own practice for IMDB: no validation split, selection on test
    assert set(task.splits) == {"train", "test"} and len(task.splits["train"]) == 12
    assert task.splits["test"].tensors["x"][1, :4].tolist() == [b + 1 for b in b"poor"]
    assert "HF" in task.describe()["source"] and calls
    calls.clear()
    again = task_class("lra_text")(lra_cfg("lra_text", max_len=8, seq_len=16).task, lra_root)
    again.setup("holdout")  # cached: the hub is not asked again
    assert not calls and len(again.splits["val"]) == 1 and len(again.splits["train"]) == 11


def test_conv2d_sees_the_pixel_grid_on_image_tasks_and_a_row_on_sequences():
    from bench_cli.config.compose import compose
    from bench_cli.config.taskfit import build_task

    grids = {}
    for task in ("lra_image", "lra_pathfinder", "lra_listops"):
        cfg = compose([f"task={task}", "model=conv2d"])
        t = build_task(cfg)
        t.setup_synthetic(64)
        net = t.build_model(cfg.model)
        grids[task] = {m.grid for m in net.modules() if type(m).__name__ == "Conv2dAttention"}
    assert grids == {"lra_image": {(8, 8)}, "lra_pathfinder": {(8, 8)}, "lra_listops": {(1, 64)}}


def test_a_small_generated_set_starts_no_worker_processes_and_a_large_one_does(monkeypatch):
    """By default the generator runs in the calling process below WORDS_FOR_WORKERS (its workers'
    forkserver costs more than it saves there), with worker processes above; the files are the same
    for any number (test_generated_files_are_the_same_for_any_run_and_worker_count)."""
    official = {"min_length": 500, "max_length": 2000}
    assert listops_generator.workers_for(200, official) == 1
    monkeypatch.setattr(listops_generator, "default_workers", lambda: 4)
    assert listops_generator.workers_for(100_000, official) == 4
    assert listops_generator.workers_for(1599, official) == 1 and listops_generator.workers_for(1600, official) == 4
