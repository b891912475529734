"""Word-level language modelling on WikiText-103 (`task=lm`, perplexity, lower is better), as the
Primal-Attention WikiText-103 experiment ran it with fairseq (PrimalAttention_NLP README: fairseq-train
--task language_modeling --arch transformer_lm ...; evaluation with fairseq-eval-lm).

Data: ``<data root>/wikitext/wikitext-103/wiki.{train,valid,test}.tokens`` (the wikitext-103-v1.zip
release, unpacked by ``attnbench data wikitext``), or HF ``Salesforce/wikitext`` config
``wikitext-103-v1`` from the HF cache (the same lines). Any other folder
``<data root>/wikitext/<name>/`` with the three files is the dataset ``<name>``. Tokenised streams
are cached under ``<data root>/lm_cache/``. For ``wikitext103`` the dictionary size and the number
of test tokens are checked against fairseq's published 267,744 and 245,569.

Training: contiguous blocks of ``tokens_per_sample`` (512) tokens, inputs shifted by one
(--sample-break-mode none). Evaluation (a task-owned evaluator): every token of the split scored
exactly once with up to ``context_window`` (400) tokens of context, windows advancing by 512 - 400
= 112 (fairseq-eval-lm --context-window 400 --tokens-per-sample 512); perplexity = exp(mean NLL)
over all tokens including ``</s>``. The validation split is scored like fairseq-train's validation
(``val_context_window`` 0: blocks of 512) and selects the checkpoint (checkpoint_best.pt).
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from bench_cli.core.metrics import accumulate, compute_all, CrossEntropy, Perplexity
from bench_cli.core.errors import DataNotFoundError, UserError
from bench_cli.core.extras import require
from attnbench.tasks import register_task
from bench_cli.core.task import Task, loss_precision
from attnbench.tasks.data import cached, collate_padded, download, file_signature, fresh_folder, unpack
from bench_cli.core.fetch import Fetcher, register_fetcher
from attnbench.tasks.lm.wikitext import (EOS, FACTS, IGNORE, PAD, SPLIT_FILES, TokenBlocks, build_dictionary,  # noqa: F401
                               read_lines, tokenize_line)

HF_NAME, HF_CONFIG = "Salesforce/wikitext", "wikitext-103-v1"
HF_SPLITS = {"train": "train", "valid": "validation", "test": "test"}
# fairseq's examples/language_model/prepare-wikitext-103.sh URL, then the current host of the same zip.
WIKITEXT_URLS = ("https://s3.amazonaws.com/research.metamind.io/wikitext/wikitext-103-v1.zip",
                 "https://wikitext.smerity.com/wikitext-103-v1.zip")
FOLDERS = {"wikitext103": "wikitext-103"}
SCORE_CHUNK = 1024  # positions per output projection at evaluation (the vocabulary is 267,744 wide)


def wikitext_root(data_root: Path) -> Path:
    return Path(data_root).expanduser() / "wikitext"


def dataset_folder(dataset: str, data_root: Path) -> Path:
    return wikitext_root(data_root) / FOLDERS.get(dataset, dataset)


def has_files(folder: Path) -> bool:
    return all((folder / f).is_file() for f in SPLIT_FILES.values())


def missing_message(dataset: str, data_root: Path) -> str:
    folder = dataset_folder(dataset, data_root)
    return (f"WikiText '{dataset}' not found: put wiki.train.tokens, wiki.valid.tokens and "
            f"wiki.test.tokens in {folder}/ (`attnbench data wikitext` downloads wikitext-103-v1.zip"
            + (f", or HF {HF_NAME} {HF_CONFIG} in the HF cache" if dataset in FOLDERS else "") + ")")


def load_hf(why_missing: str):
    """HF ``Salesforce/wikitext`` (wikitext-103-v1) from the HF cache, or a one-line DataNotFoundError."""
    datasets = require("datasets", "text", f"{HF_NAME} from the HF hub")
    try:
        return datasets.load_dataset(HF_NAME, HF_CONFIG)
    except Exception as e:  # noqa: BLE001 - offline, not cached, hub errors
        first = str(e).strip().splitlines()[0][:120] if str(e).strip() else type(e).__name__
        raise DataNotFoundError(f"{why_missing} ({first})") from None


@register_task
class LanguageModelling(Task):
    name = "lm"
    fetcher = "wikitext"
    metrics = (Perplexity(ignore_index=IGNORE), CrossEntropy(ignore_index=IGNORE))
    selection = "perplexity"

    def __init__(self, cfg, data_root):
        super().__init__(cfg, data_root)
        self.vocab_size: int | None = None
        self.source = None
        self.facts: dict = {}

    # --- data -------------------------------------------------------------------------------
    def load_streams(self) -> dict:
        """{'symbols': dictionary, 'train'|'valid'|'test': int32 token streams} (cached)."""
        folder = dataset_folder(self.dataset_name, self.data_root)
        if has_files(folder):
            paths = {s: folder / f for s, f in SPLIT_FILES.items()}
            self.source = folder
            key = {"files": file_signature(paths.values())}
            name = f"wikitext-{self.dataset_name}-files"

            def lines(split):
                return read_lines(paths[split])
        else:
            self.source = f"HF {HF_NAME} {HF_CONFIG}"
            key = {"hf": [HF_NAME, HF_CONFIG]}
            name = f"wikitext-{self.dataset_name}-hf"
            hf = self.located  # the HF copy the fetcher loaded, if it had to

            def lines(split):
                nonlocal hf
                hf = hf or load_hf(missing_message(self.dataset_name, self.data_root))
                return hf[HF_SPLITS[split]]["text"]

        def build():
            print(f"tokenising {self.dataset_name} (fairseq-preprocess --only-source) ...", file=sys.stderr)
            dictionary = build_dictionary(lines("train"))
            out = {"symbols": dictionary.symbols}
            for split in SPLIT_FILES:
                out[split] = torch.from_numpy(dictionary.encode(lines(split)))
            return out

        data, _ = cached(Path(self.data_root) / "lm_cache", name, key, build)
        return data

    def check_facts(self, data: dict) -> None:
        """fairseq's published dictionary size and test token count, for the real WikiText-103."""
        facts = FACTS.get(self.dataset_name)
        self.facts = {"dictionary": len(data["symbols"]), "test_tokens": len(data["test"])}
        if facts and self.facts != facts:
            raise UserError(f"{self.source}: dictionary of {self.facts['dictionary']:,} entries and "
                            f"{self.facts['test_tokens']:,} test tokens, but fairseq's WikiText-103 has "
                            f"{facts['dictionary']:,} and {facts['test_tokens']:,}: not the wikitext-103-v1 files")

    def make_splits(self, protocol: str) -> None:
        data = self.load_streams()
        self.check_facts(data)
        self.vocab_size = len(data["symbols"])
        subset = self.cfg.get("subset") or {}
        streams = {s: data[s][: int(subset[s])] if subset.get(s) else data[s] for s in SPLIT_FILES}
        n = int(self.cfg.tokens_per_sample)
        windows = {"val": int(self.cfg.val_context_window), "test": int(self.cfg.context_window)}
        if max(windows.values()) >= n:
            raise UserError(f"lm: context windows {windows} must be shorter than tokens_per_sample={n}")
        self.splits = {"train": TokenBlocks(streams["train"], n)}
        if protocol == "holdout":
            self.splits["val"] = TokenBlocks(streams["valid"], n - windows["val"], windows["val"])
        self.splits["test"] = TokenBlocks(streams["test"], n - windows["test"], windows["test"])

    def collate(self, split: str):
        return lambda items: collate_padded(items, {"x": PAD, "y": IGNORE})

    # --- shapes without data ----------------------------------------------------------------------
    def setup_synthetic(self, seq_len: int) -> None:
        self.vocab_size, self.splits, self.source = int(self.cfg.synthetic.vocab_size), {}, "synthetic"

    def synthetic_batch(self, batch_size: int, seq_len: int, device="cpu") -> dict:
        g = torch.Generator().manual_seed(0)
        x = torch.randint(4, self.vocab_size, (batch_size, seq_len + 1), generator=g)
        return {"x": x[:, :-1].to(device), "y": x[:, 1:].to(device)}

    # --- model --------------------------------------------------------------------------------------
    def build_model(self, model_cfg):
        from attnbench.models.lm import build_lm

        if not self.vocab_size:
            raise UserError("lm: call setup() or setup_synthetic() before build_model()")
        return build_lm(model_cfg, self.cfg.backbone, self.vocab_size, PAD, int(self.cfg.tokens_per_sample))

    def attention_stacks(self) -> dict[str, int]:
        return {"decoder": int(self.cfg.backbone.n_layers)}

    def model_inputs(self, batch: dict) -> dict:
        return {"x": batch["x"]}

    def loss(self, output, batch):
        return F.cross_entropy(loss_precision(output.reshape(-1, output.shape[-1])), batch["y"].reshape(-1),
                               ignore_index=IGNORE)

    @torch.no_grad()
    def evaluate(self, model, split, ctx):
        """Sum of the NLL over the scored targets (context positions are not scored); the output
        projection runs only on scored positions, in chunks (a 267,744-wide vocabulary)."""
        from bench_cli.core.task import to_device

        model.eval()
        stats: dict[str, float] = {}
        for batch in ctx.loader(split):
            batch = to_device(batch, ctx.device)
            scored = batch["y"] != IGNORE
            h, y = model.features(batch["x"])[scored], batch["y"][scored]
            for hc, yc in zip(h.split(SCORE_CHUNK), y.split(SCORE_CHUNK)):
                accumulate(stats, self.batch_stats(model.logits(hc), {"y": yc}))
            ctx.advance()
        return compute_all(self.metrics, ctx.reduce(stats))  # every process scored its shard

    def describe(self) -> dict:
        out = {"source": str(self.source), "vocab_size": self.vocab_size,
               "tokens_per_sample": int(self.cfg.tokens_per_sample)}
        for split, blocks in self.splits.items():
            out[f"{split}_tokens"] = len(blocks.stream)
            out[f"{split}_items"] = len(blocks)
            if blocks.context:
                out[f"{split}_context_window"] = blocks.context
        if self.facts:
            out["fairseq_facts"] = self.facts
        return out


@register_fetcher
class WikiTextFetcher(Fetcher):
    """WikiText-103 v1 (tokenised, the release zip fairseq's prepare-wikitext-103.sh downloads)."""

    name = "wikitext"
    summary = "WikiText-103 v1 (wiki.{train,valid,test}.tokens), or HF Salesforce/wikitext into the HF cache"

    def datasets(self, data_root: Path | None = None) -> list[str]:
        """wikitext103, and every other folder under <data root>/wikitext/ holding the three files."""
        names = list(FOLDERS)
        root = wikitext_root(data_root) if data_root else None
        if root and root.is_dir():
            known = set(FOLDERS.values())
            names += sorted(p.name for p in root.iterdir() if p.name not in known and has_files(p))
        return names

    def status(self, dataset: str, data_root: Path) -> str:
        if has_files(dataset_folder(dataset, data_root)):
            return "local"
        cache = Path(data_root).expanduser() / "lm_cache"
        return "local" if dataset in FOLDERS and any(cache.glob(f"wikitext-{dataset}-hf-*.pt")) else "missing"

    def location(self, dataset: str, data_root: Path) -> str:
        """Its folder's three files, else the copy tokenised from the HF cache's (lm_cache/)."""
        folder = dataset_folder(dataset, data_root)
        tokenised = sorted((Path(data_root).expanduser() / "lm_cache").glob(f"wikitext-{dataset}-hf-*.pt"))
        if not has_files(folder) and dataset in FOLDERS and tokenised:
            return str(tokenised[0])
        return f"{folder}/wiki.{{train,valid,test}}.tokens"

    def missing_message(self, dataset: str, data_root: Path, **options) -> str:
        return missing_message(dataset, data_root)

    def require(self, dataset: str, data_root: Path, *, cached=(), **options):
        """Any name is a folder under <data root>/wikitext/; wikitext103 may also come from the HF
        cache (returned loaded when neither its files nor its tokenised copy are there)."""
        if has_files(dataset_folder(dataset, data_root)):
            return None
        if dataset not in FOLDERS:
            raise DataNotFoundError(missing_message(dataset, data_root))
        if self.status(dataset, data_root) == "local":
            return None
        return load_hf(missing_message(dataset, data_root))

    def fetch(self, dataset: str, data_root: Path, force: bool = False, **options) -> Path:
        self.check_options(options)
        folder = dataset_folder(dataset, data_root)
        if has_files(folder) and not force:
            return folder
        if dataset not in FOLDERS:
            raise UserError(f"{dataset} is a local folder; nothing to download")
        root = wikitext_root(data_root)
        archive = root / "wikitext-103-v1.zip"
        errors = []
        for url in WIKITEXT_URLS:
            try:
                if force or not archive.is_file():
                    print(f"downloading {url} (190 MB) ...", file=sys.stderr)
                    download(url, archive, what="WikiText-103 v1", where=str(folder / "wiki.train.tokens"))
                with fresh_folder(folder):
                    unpack(archive, root)
                if has_files(folder):
                    return folder
            except DataNotFoundError as e:
                errors.append(str(e))
        load_hf(errors[-1] if errors else f"{archive} did not unpack to {folder}/")  # the HF copy instead
        return Path(f"HF cache ({HF_NAME} {HF_CONFIG})")
