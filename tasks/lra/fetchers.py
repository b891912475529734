"""`attnbench data lra|lra_listops|lra_text|lra_image`: the downloads of the LRA data and the one
answer to whether each LRA dataset is present (tasks/lra/data.py says where the files are).

- ``lra``: the LRA release (``lra_release.gz``, several GB) holding ListOps, Retrieval (``aan``) and
  Pathfinder (``pathfinder32``);
- ``lra_listops``: ListOps from the release, or ``--generate`` with the official generator (offline,
  tasks/lra/listops_generator.py), the dataset ``listops_generated``;
- ``lra_text``: IMDB through HF ``datasets`` (into the HF cache), or ``aclImdb/`` unpacked by hand;
- ``lra_image``: CIFAR-10's python version (torchvision's folder format).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from bench_cli.core.errors import DataNotFoundError, UserError, unknown_choice
from attnbench.tasks.data import download, hf_cache_copy, load_hf_dataset, unpack
from bench_cli.core.fetch import Fetcher, register_fetcher
from attnbench.tasks.lra.data import (IMDB_HF, LISTOPS_DATASETS, PATHFINDER_DEFAULT, PATHFINDER_DIFFICULTIES, aan_files, acl_dir,
                            cache_dir, generated_listops_dir, listops_files, pathfinder_dir, release_candidates)

LRA_URL = "https://storage.googleapis.com/long-range-arena/lra_release.gz"
CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
CIFAR10_MD5 = "c58f30108f718f92721af3b95e74349a"
GENERATOR_OPTIONS = ("num_train", "num_val", "num_test", "max_depth", "max_args", "min_length", "max_length", "seed")


# --- downloads ------------------------------------------------------------------------------------
def fetch_release(data_root: Path, force: bool = False) -> Path:
    """Download ``lra_release.gz`` and unpack it under the data root; returns the release folder."""
    root = Path(data_root).expanduser()
    if not force:
        for base in release_candidates(root):
            if (base / "listops-1000").is_dir() or (base / "tsv_data").is_dir():
                return base
    archive = root / "lra_release.gz"
    if force or not archive.is_file():
        print(f"downloading {LRA_URL} (several GB) to {archive} ...", file=sys.stderr)
        download(LRA_URL, archive, what="the LRA release", where=f"{root}/lra_release/listops-1000")
    unpack(archive, root)
    for base in release_candidates(root):
        if base.is_dir():
            return base
    raise DataNotFoundError(f"{archive} did not unpack to {root}/lra_release/; unpack it there by hand")


def fetch_cifar10(data_root: Path, force: bool = False) -> Path:
    root = Path(data_root).expanduser()
    target = root / "cifar-10-batches-py"
    if target.is_dir() and not force:
        return target
    archive = root / "cifar-10-python.tar.gz"
    download(CIFAR10_URL, archive, what="CIFAR-10 python version", where=str(target), md5=CIFAR10_MD5)
    unpack(archive, root)
    return target


def imdb_missing_message(data_root: Path) -> str:
    return (f"IMDB for lra_text is not available: run `attnbench data lra_text imdb` with network access "
            f"(HF datasets {IMDB_HF} into the HF cache) or unpack aclImdb_v1.tar.gz to "
            f"{Path(data_root).expanduser()}/aclImdb/")


def load_imdb(data_root: Path):
    """HF ``stanfordnlp/imdb`` from the HF cache or the hub, or a one-line DataNotFoundError."""
    return load_hf_dataset(IMDB_HF, missing=imdb_missing_message(data_root))


def _flag(option: str) -> str:
    return "--" + option.replace("_", "-")


# --- fetchers (`attnbench data NAME`) --------------------------------------------------------------
@register_fetcher
class LRAReleaseFetcher(Fetcher):
    """The LRA release (``lra_release.gz``): ListOps, Retrieval (AAN) and Pathfinder. Fetched as a
    whole (``lra_release``); the presence of its parts ``aan`` and ``pathfinder32`` is answered too."""

    name = "lra"
    summary = "the LRA release: ListOps, Retrieval (AAN), Pathfinder (several GB)"

    def datasets(self, data_root=None) -> list[str]:
        return ["lra_release"]

    def status(self, dataset: str, data_root: Path) -> str:
        if dataset == "aan":
            present = aan_files(data_root) is not None
        elif dataset == "pathfinder32":
            present = pathfinder_dir(data_root) is not None
        else:
            present = any((b / "listops-1000").is_dir() for b in release_candidates(data_root))
        return "local" if present else "missing"

    def location(self, dataset: str, data_root: Path) -> str:
        """Retrieval's split files, Pathfinder's folder (LRA's difficulty), the release's folder."""
        release = next((b for b in release_candidates(data_root) if b.is_dir()), release_candidates(data_root)[0])
        if dataset == "aan":
            files = aan_files(data_root)
            return f"{files['train'].parent if files else release / 'tsv_data'}/new_aan_pairs.{{train,eval,test}}.tsv"
        if dataset == "pathfinder32":
            return f"{pathfinder_dir(data_root) or release / 'pathfinder32' / PATHFINDER_DEFAULT}/"
        return f"{release}/"

    def missing_message(self, dataset: str, data_root: Path, difficulty: str = PATHFINDER_DEFAULT, **options) -> str:
        root = Path(data_root).expanduser()
        if dataset == "aan":
            return (f"LRA retrieval (AAN) not found: put new_aan_pairs.{{train,eval,test}}.tsv in "
                    f"{root}/lra_release/tsv_data/ (`attnbench data lra` downloads the release)")
        if dataset == "pathfinder32":
            return (f"LRA Pathfinder not found: put pathfinder32/{difficulty}/ (imgs/, metadata/*.npy) in "
                    f"{root}/lra_release/ (`attnbench data lra` downloads the release)")
        return f"the LRA release not found in {root}/lra_release/: run `attnbench data lra`"

    def require(self, dataset: str, data_root: Path, *, cached=(), difficulty: str = PATHFINDER_DEFAULT, **options):
        """Retrieval: the split files; Pathfinder: the folder of ``difficulty``."""
        if dataset == "pathfinder32":
            if difficulty not in PATHFINDER_DIFFICULTIES:
                raise unknown_choice("pathfinder difficulty", difficulty, PATHFINDER_DIFFICULTIES)
            found = pathfinder_dir(data_root, difficulty)
        elif dataset == "aan":
            found = aan_files(data_root)
        else:
            return super().require(dataset, data_root, cached=cached)
        if found is None:
            raise DataNotFoundError(self.missing_message(dataset, data_root, difficulty))
        return found

    def fetch(self, dataset: str, data_root: Path, force: bool = False, **options) -> Path:
        self.check_options(options)
        return fetch_release(data_root, force)


def generator_integers(options: dict, source: str) -> dict[str, int]:
    """The generator options as integers (``--max-length=250``, ``task.generator.max_length``);
    a value that is not a whole number ("abc", 2.5, true) is a one-line error naming it and ``source``."""
    params = {}
    for k, v in options.items():
        text = str(v).strip()
        if isinstance(v, bool) or not text.lstrip("+-").isdigit():
            raise UserError(f"{source} {k} must be an integer, got {v!r}")
        params[k] = int(text)
        low = GENERATOR_MINIMUM.get(k, 1)
        if params[k] < low or (k == "seed" and params[k] > 2**32 - 1):
            bounds = "0 to 2**32 - 1" if k == "seed" else f"at least {low}"
            raise UserError(f"{source} {k} must be an integer {bounds}, got {params[k]}")
    return params


GENERATOR_MINIMUM = {"seed": 0, "max_args": 2}  # every other option (sizes, lengths, depth): at least 1


def check_generated_size(target: Path, params: dict) -> None:
    """Refuse, in one line, a set that would not fit on the disk that holds ``target`` (about two
    bytes per token, an expression of the average of min_length and max_length tokens)."""
    import shutil

    from attnbench.tasks.lra.listops_generator import DEFAULTS

    p = {**DEFAULTS, **params}
    if p["min_length"] > p["max_length"]:
        raise UserError(f"--min-length={p['min_length']} is above --max-length={p['max_length']}")
    needed = 2 * (p["num_train"] + p["num_val"] + p["num_test"]) * (p["min_length"] + p["max_length"]) // 2
    folder = target
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    free = shutil.disk_usage(folder).free
    if needed > free:
        raise UserError(f"a generated ListOps set of these sizes needs about {needed / 2**30:,.1f} GiB in {target}, "
                        f"{free / 2**30:,.1f} GiB is free: give smaller --num-train/--num-val/--num-test or lengths")


def generator_differences(data_root: Path, wanted: dict[str, int]) -> dict:
    """{option: the value the generated ListOps set was made with (its generator.json)} for each
    option in ``wanted`` (integers: generator_integers) it was not made with; {} when the set is
    the one wanted."""
    made = generator_meta(data_root) or {}
    return {k: made.get(k) for k, v in wanted.items() if made.get(k) != v}


def generator_meta(data_root: Path) -> dict | None:
    """What the generated ListOps set was made with (its generator.json; None without one). A file
    that is not a JSON object (cut short, edited) is one line naming it: what the set holds is
    then unknown, so it is made again."""
    meta_path = generated_listops_dir(data_root) / "generator.json"
    problem = generator_meta_problem(meta_path)
    if problem:
        raise DataNotFoundError(f"{meta_path} is damaged ({problem}): make the set again with "
                                f"`{generate_command(data_root)} --force`")
    return json.loads(meta_path.read_text()) if meta_path.is_file() else None


def generator_meta_problem(meta_path: Path) -> str | None:
    """Why ``meta_path`` (a generator.json) cannot be read as one; None when it can or is absent."""
    if not meta_path.is_file():
        return None
    try:
        made = json.loads(meta_path.read_text())
    except (OSError, ValueError) as e:  # UnicodeDecodeError is a ValueError
        return f"not JSON: {str(e).splitlines()[0]}"
    return None if isinstance(made, dict) else f"a JSON {type(made).__name__}, not an object"


def generate_command(data_root: Path, generator=None) -> str:
    """The command that writes the generated ListOps a run expects, where the run looks for it."""
    flags = "".join(f" --{k.replace('_', '-')}={v}" for k, v in (generator or {}).items())
    return f"attnbench data lra_listops --generate{flags} paths.data_root={Path(data_root).expanduser()}"


@register_fetcher
class ListOpsFetcher(Fetcher):
    """ListOps: the release's files, or `--generate` with the official generator (offline)."""

    name = "lra_listops"
    summary = "ListOps from the LRA release, or --generate (the official generator, offline)"
    options = {"generate": "write listops_generated with the official generator",
               **{o: "generator parameter (integer)" for o in GENERATOR_OPTIONS},
               "workers": "generator processes (default: the CPUs, at most 8); the files are the same for any number"}

    def datasets(self, data_root=None) -> list[str]:
        return list(LISTOPS_DATASETS)

    def status(self, dataset: str, data_root: Path) -> str:
        if not listops_files(dataset, data_root):
            return "missing"
        damaged = dataset == "listops_generated" and generator_meta_problem(
            generated_listops_dir(data_root) / "generator.json")
        return "damaged" if damaged else "local"

    def location(self, dataset: str, data_root: Path) -> str:
        files = listops_files(dataset, data_root)
        folder = (files["train"].parent if files else generated_listops_dir(data_root) if dataset == "listops_generated"
                  else release_candidates(data_root)[0] / "listops-1000")
        return f"{folder}/basic_{{train,val,test}}.tsv"

    def missing_message(self, dataset: str, data_root: Path, generator=None, **options) -> str:
        root = Path(data_root).expanduser()
        if dataset == "listops_generated":
            return (f"generated ListOps not found in {generated_listops_dir(root)}/: "
                    f"run `{generate_command(root, generator)}`")
        return (f"LRA ListOps not found: put basic_{{train,val,test}}.tsv in {root}/lra_release/listops-1000/ "
                f"(`attnbench data lra` downloads the release) or generate it offline with "
                f"`attnbench data lra_listops --generate` and use task.dataset=listops_generated")

    def require(self, dataset: str, data_root: Path, *, cached=(), generator=None, **options) -> dict[str, Path]:
        """The split files {'train', 'val', 'test'}. ``generator`` (``task.generator``): the
        generator options a run expects of ``listops_generated``; a set made with others is
        refused in one line that says how to write the expected one (a set of 500-2,000 tokens cut
        to a 256-token run would train on truncated expressions, silently)."""
        if generator:  # checked first: a missing set's message repeats these options as a command
            unknown = sorted(set(generator) - set(GENERATOR_OPTIONS))
            if unknown:
                raise unknown_choice("task.generator option", unknown[0], GENERATOR_OPTIONS)
            wanted = generator_integers(generator, "task.generator")
        files = listops_files(dataset, data_root)
        if files is None:
            raise DataNotFoundError(self.missing_message(dataset, data_root, generator))
        if dataset == "listops_generated":
            generator_meta(data_root)  # a damaged generator.json: one line now, not after training
        if dataset == "listops_generated" and generator:
            differ = generator_differences(data_root, wanted)
            if differ:
                raise DataNotFoundError(
                    f"the generated ListOps in {generated_listops_dir(data_root)}/ was made with "
                    f"{', '.join(f'{k}={v}' for k, v in differ.items())}, this run expects "
                    f"{', '.join(f'{k}={generator[k]}' for k in differ)} (task.generator): run "
                    f"`{generate_command(data_root, generator)} --force`")
        return files

    def options_from_config(self, task_cfg, options: dict) -> dict:
        """`attnbench data lra_listops --generate` with a config that sets ``task.generator``
        (experiment=...): those generator options, under any given on the command line."""
        if not options.get("generate") or str(task_cfg.get("name")) != "lra_listops":
            return options
        return {**{k: str(v) for k, v in (task_cfg.get("generator") or {}).items()}, **options}

    def default_dataset(self, data_root: Path, generate: bool = False, **options) -> str:
        return "listops_generated" if generate else "listops"

    def fetch(self, dataset: str, data_root: Path, force: bool = False, generate: bool = False, **options) -> Path:
        """``generate`` (``--generate``): write ``listops_generated`` with the official generator
        (options ``--num-train=96000 --num-val=2000 --num-test=2000 --seed=0 ...``, ``--workers=N``
        processes); otherwise download the LRA release."""
        unknown = set(options) - set(GENERATOR_OPTIONS) - {"workers"}
        if unknown or (options and not generate):
            raise UserError(f"unknown options for `attnbench data lra_listops`: {', '.join(sorted(unknown or options))} "
                            f"(generator options, with --generate: {', '.join(_flag(o) for o in (*GENERATOR_OPTIONS, 'workers'))})")
        if generate or dataset == "listops_generated":
            return self.generate(data_root, force, options)
        base = fetch_release(data_root, force)
        return base / "listops-1000"

    @staticmethod
    def generate(data_root: Path, force: bool, options: dict) -> Path:
        from bench_cli.core.progress import count_progress
        from attnbench.tasks.lra.listops_generator import DEFAULTS, write_dataset

        target = generated_listops_dir(data_root)
        params = generator_integers(options, "`attnbench data lra_listops --generate` option")
        workers = params.pop("workers", None)
        if workers is not None and workers < 1:
            raise UserError(f"--workers must be a positive integer, got {workers}")
        check_generated_size(target, params)
        if listops_files("listops_generated", data_root) and not force:
            differ = generator_differences(data_root, {k: v for k, v in {**DEFAULTS, **params}.items() if k != "task"})
            if not differ:
                return target
            raise UserError(f"{target} already holds a generated ListOps set with other parameters "
                            f"({', '.join(f'{k}={v}' for k, v in differ.items())}); add --force to replace it")
        total = sum(params.get(k, DEFAULTS[k]) for k in ("num_train", "num_val", "num_test"))
        print(f"generating {total} ListOps samples into {target} ...", file=sys.stderr)
        try:
            with count_progress("generating ListOps", total) as progress:
                return write_dataset(target, progress=progress, workers=workers, **params)
        except ValueError as e:  # parameters no tree can satisfy
            raise UserError(f"ListOps generator: {e}") from None


@register_fetcher
class IMDBFetcher(Fetcher):
    """IMDB reviews for the byte-level LRA Text task (HF datasets, or aclImdb unpacked)."""

    name = "lra_text"
    summary = f"IMDB for LRA Text (HF {IMDB_HF} into the HF cache)"

    def datasets(self, data_root=None) -> list[str]:
        return ["imdb"]

    def status(self, dataset: str, data_root: Path) -> str:
        if acl_dir(data_root) or any(cache_dir(data_root).glob("text-imdb-*.pt")):
            return "local"
        return "missing"

    def location(self, dataset: str, data_root: Path) -> str:
        """aclImdb/ unpacked, else the copy tokenised from the HF cache's (lra_cache/), else the HF
        cache's copy."""
        tokenised, hf = sorted(cache_dir(data_root).glob("text-imdb-*.pt")), hf_cache_copy(IMDB_HF)
        if acl_dir(data_root) is None and (tokenised or hf):
            return str(tokenised[0]) if tokenised else f"{hf}/"
        return f"{Path(data_root).expanduser() / 'aclImdb'}/{{train,test}}/{{pos,neg}}/*.txt"

    def missing_message(self, dataset: str, data_root: Path, **options) -> str:
        return imdb_missing_message(data_root)

    def require(self, dataset: str, data_root: Path, *, cached=(), **options):
        """None when aclImdb/ or the task's tokenised copy is there, else the HF dataset (loaded
        from the HF cache, or a one-line DataNotFoundError at once when offline)."""
        if acl_dir(data_root) or any(Path(p).is_file() for p in cached):
            return None
        return load_imdb(data_root)

    def fetch(self, dataset: str, data_root: Path, force: bool = False, **options) -> Path:
        self.check_options(options)
        if acl_dir(data_root):
            return acl_dir(data_root)
        ds = load_imdb(data_root)
        return Path(ds["train"].cache_files[0]["filename"]).parent if ds["train"].cache_files else Path(IMDB_HF)


@register_fetcher
class CIFAR10Fetcher(Fetcher):
    """CIFAR-10, python version (torchvision's folder format), for LRA Image."""

    name = "lra_image"
    summary = "CIFAR-10 (python version) for LRA Image"

    def datasets(self, data_root=None) -> list[str]:
        return ["cifar10"]

    def status(self, dataset: str, data_root: Path) -> str:
        from attnbench.tasks.vision.datasets import cifar_dir

        return "local" if cifar_dir("cifar10", data_root) else "missing"

    def location(self, dataset: str, data_root: Path) -> str:
        from attnbench.tasks.vision.datasets import cifar_dir

        return f"{cifar_dir('cifar10', data_root) or Path(data_root).expanduser() / 'cifar-10-batches-py'}/"

    def missing_message(self, dataset: str, data_root: Path, **options) -> str:
        return (f"CIFAR-10 not found: put the python version (data_batch_1..5, test_batch, batches.meta) in "
                f"{Path(data_root).expanduser()}/cifar-10-batches-py/ or run `attnbench data lra_image cifar10`")

    def fetch(self, dataset: str, data_root: Path, force: bool = False, **options) -> Path:
        self.check_options(options)
        return fetch_cifar10(data_root, force)
