"""English-to-Spanish translation of papers/002 (Sec. 4.2, Appendix B.4.2, Tables 3, 10): `task=nmt`.

Datasets (``task.dataset``), in their official formats under the data root (``DATA``):

- ``anki``: the Anki/Tatoeba pairs of the keras example's archive (``spa-eng.zip``; 118,964
  tab-separated English/Spanish lines) at ``DATA/spa-eng/spa.txt``; ``attnbench data nmt anki``
  downloads and checks it;
- ``europarl``: Europarl v7 en-es (Koehn 2005; 2,009,073 pairs), HF ``datasets``
  ``Helsinki-NLP/europarl`` config ``en-es`` (``attnbench data nmt europarl`` fills the HF cache), or
  its parquet files (a ``translation`` column of {en, es}) in ``DATA/europarl/en-es/``;
- ``europarl_anki``: both, the paper's corpus.

The pairs are shuffled (``split_seed``) and split 99.8 / 0.1 / 0.1 (train / val / test) as B.4.2
says. Text standardisation and vocabularies are the keras example's (tasks/text/tokenize.py):
15,000 tokens per language built from the training split only, [start]/[end] around the Spanish
side, 20 English ids and 21 Spanish ids (decoder input and target: 20 each). Tokenised splits are
cached under ``DATA/text_cache/``.

Evaluation (``evaluate``): teacher-forced token accuracy and cross-entropy, and corpus BLEU
(sacrebleu, tokeniser ``bleu.tokenize``) of greedy decoding against the standardised Spanish
reference (lowercased, punctuation stripped: the text the model learns to produce, [start]/[end]
removed). ``loss_positions: keras`` counts the positions the example's keras mask counts: every
real decoder input, so after [end] one padding target is scored too; ``targets`` scores only the
real target tokens. The selection metric is BLEU.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from bench_cli.core.metrics import accumulate, Accuracy, BLEU, compute_all, CrossEntropy
from bench_cli.core.errors import DataNotFoundError, UserError, unknown_choice
from attnbench.tasks import register_task
from bench_cli.core.task import EvalContext, Task
from attnbench.tasks.data import (cache_path, cached, collate_padded, download, file_signature, fresh_folder, hf_cache_copy,
                        hf_cache_folders, load_hf_dataset, unpack)
from bench_cli.core.fetch import Fetcher, register_fetcher
from attnbench.tasks.text.classification import cache_dir
from attnbench.tasks.text.tokenize import (END_TOKEN, ENGLISH_STRIP, SPANISH_STRIP, START_TOKEN, Vocabulary, standardize,
                                 whitespace_split)

ANKI_URL = "http://storage.googleapis.com/download.tensorflow.org/data/spa-eng.zip"
ANKI_PAIRS = 118_964  # lines of the archive's spa.txt (no checksum is published: the count is checked)
EUROPARL_HF, EUROPARL_CONFIG = "Helsinki-NLP/europarl", "en-es"
DATASETS = ("anki", "europarl", "europarl_anki")
SOURCES = {"anki": ("anki",), "europarl": ("europarl",), "europarl_anki": ("europarl", "anki")}
IGNORE = -100


# --- where the files are ----------------------------------------------------------------------------
def anki_file(data_root: Path) -> Path | None:
    p = Path(data_root).expanduser() / "spa-eng" / "spa.txt"
    return p if p.is_file() else None


def europarl_parquet(data_root: Path) -> list[Path] | None:
    d = Path(data_root).expanduser() / "europarl" / EUROPARL_CONFIG
    files = sorted(d.glob("*.parquet")) if d.is_dir() else []
    return files or None


def missing_message(source: str, data_root: Path) -> str:
    root = Path(data_root).expanduser()
    if source == "anki":
        return (f"Anki spa-eng not found: put spa.txt in {root}/spa-eng/ or run `attnbench data nmt anki` "
                f"({ANKI_URL})")
    return (f"Europarl en-es is not available: run `attnbench data nmt europarl` with network access "
            f"(HF datasets {EUROPARL_HF} {EUROPARL_CONFIG} into the HF cache) or put its parquet files in "
            f"{root}/europarl/{EUROPARL_CONFIG}/")


def read_anki(path: Path) -> list[tuple[str, str]]:
    """spa.txt: 'English<TAB>Spanish' per line (later releases add an attribution column)."""
    pairs = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f.read().split("\n")[:-1], 1):  # as the example reads it
            fields = line.split("\t")
            if len(fields) < 2:
                raise UserError(f"{path}:{n}: expected 'English<TAB>Spanish'")
            pairs.append((fields[0], fields[1]))
    return pairs


def read_europarl(data_root: Path, hf=None) -> tuple[list[tuple[str, str]], str]:
    """Europarl pairs from the parquet folder, else from ``hf`` (a loaded HF DatasetDict) or the hub."""
    files = europarl_parquet(data_root)
    if files:
        import pandas as pd

        column = pd.concat([pd.read_parquet(p, columns=["translation"]) for p in files], ignore_index=True)["translation"]
        return [(t["en"], t["es"]) for t in column], str(files[0].parent)
    ds = hf or load_hf_dataset(EUROPARL_HF, EUROPARL_CONFIG, missing=missing_message("europarl", data_root))
    return [(t["en"], t["es"]) for t in ds["train"]["translation"]], f"HF {EUROPARL_HF} {EUROPARL_CONFIG}"


def split_pairs(n: int, val_fraction: float, test_fraction: float, seed: int) -> dict[str, np.ndarray]:
    """Shuffle 0..n-1 and cut train / val / test (val and test: int(fraction * n) each)."""
    perm = np.random.RandomState(seed).permutation(n)
    n_val, n_test = int(val_fraction * n), int(test_fraction * n)
    return {"train": perm[: n - n_val - n_test], "val": perm[n - n_val - n_test: n - n_test], "test": perm[n - n_test:]}


def ragged(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Concatenated ids (int16: vocabularies stay below 32,768) and row offsets."""
    lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.fromiter((i for r in rows for i in r), dtype=np.int16, count=int(offsets[-1]))
    return torch.from_numpy(flat), torch.from_numpy(offsets)


class PairDataset(Dataset):
    """Tokenised pairs: ``src`` (English ids), ``tgt_in``/``tgt_out`` (Spanish ids without the
    last / the first token) and ``ref`` (the standardised Spanish reference)."""

    def __init__(self, split: dict, keras_positions: bool, tgt_len: int):
        self.src, self.src_offsets = split["src"], split["src_offsets"]
        self.tgt, self.tgt_offsets = split["tgt"], split["tgt_offsets"]
        self.refs = split["refs"].split("\n") if split["refs"] else []
        self.keras_positions, self.tgt_len = keras_positions, tgt_len

    def __len__(self) -> int:
        return len(self.src_offsets) - 1

    def __getitem__(self, i):
        src = self.src[self.src_offsets[i]: self.src_offsets[i + 1]].long()
        tgt = self.tgt[self.tgt_offsets[i]: self.tgt_offsets[i + 1]].long()
        if not len(src):  # a sentence of punctuation only: one padding id (masked everywhere)
            src = torch.zeros(1, dtype=torch.long)
        if self.keras_positions and len(tgt) < self.tgt_len + 1:  # the padded step after [end] (keras' mask)
            tgt = torch.cat([tgt, tgt.new_zeros(1)])
        return {"src": src, "tgt_in": tgt[:-1], "tgt_out": tgt[1:], "ref": self.refs[i]}


def collate_pairs(items: list[dict]) -> dict:
    """Pad to the batch's longest sentence; ``y`` is the target with IGNORE where no decoder input is."""
    batch = collate_padded(items)
    batch["y"] = batch["tgt_out"].masked_fill(batch["tgt_in"] == 0, IGNORE)
    return batch


# --- the task ---------------------------------------------------------------------------------------
@register_task
class Translation(Task):
    """English -> Spanish with the keras-io seq2seq transformer (1 encoder, 2 decoder blocks)."""

    name = "nmt"
    fetcher = "nmt"
    DATASETS = DATASETS
    requires = {"padding_mask": True}
    # token accuracy and cross-entropy (teacher forcing, padding ignored), corpus BLEU (selects)
    metrics = (Accuracy(ignore_index=IGNORE), CrossEntropy(ignore_index=IGNORE), BLEU())
    selection = "bleu"
    train_split_metrics = ("bleu",)  # train BLEU (Tables 3, 10): greedy decoding of task.bleu.max_samples.train pairs

    def __init__(self, cfg, data_root):
        super().__init__(cfg, data_root)
        self.token_accuracy, self.token_loss = self.metrics[0], self.metrics[1]
        self.bleu = BLEU(tokenize=str((cfg.get("bleu") or {}).get("tokenize", "13a")))
        self.metrics = (self.token_accuracy, self.token_loss, self.bleu)
        self.src_vocab = self.tgt_vocab = None
        self.source, self.facts = None, {}
        self.seq_len = int(cfg.get("seq_len") or 20)

    def data_options(self) -> dict:
        """A tokenised copy spares the sources (the HF hub is not asked)."""
        return {"cached": [self._cache_path()]}

    # --- data ------------------------------------------------------------------------------------
    def _cache_key(self) -> dict:
        key = {"dataset": self.dataset_name, "val_fraction": float(self.cfg.val_fraction),
               "test_fraction": float(self.cfg.test_fraction), "split_seed": int(self.cfg.split_seed),
               "vocab_size": int(self.cfg.vocab_size), "seq_len": int(self.cfg.seq_len),
               "lowercase": str(self.cfg.lowercase)}
        if "anki" in SOURCES[self.dataset_name]:
            key["anki"] = file_signature([anki_file(self.data_root)]) if anki_file(self.data_root) else None
        if "europarl" in SOURCES[self.dataset_name]:
            files = europarl_parquet(self.data_root)
            key["europarl"] = file_signature(files) if files else f"HF {EUROPARL_HF} {EUROPARL_CONFIG}"
        return key

    def _cache_path(self) -> Path:
        return cache_path(cache_dir(self.data_root), f"nmt-{self.dataset_name}", self._cache_key())

    def read_pairs(self) -> tuple[list[tuple[str, str]], list[str]]:
        """(pairs, sources) in the order of SOURCES (Europarl first, then Anki)."""
        pairs, where = [], []
        for source in SOURCES[self.dataset_name]:
            if source == "anki":
                path = anki_file(self.data_root)
                if path is None:
                    raise DataNotFoundError(missing_message("anki", self.data_root))
                pairs += read_anki(path)
                where.append(str(path))
            else:
                europarl, origin = read_europarl(self.data_root, self.located)
                pairs += europarl
                where.append(origin)
        return pairs, where

    def tokenise(self) -> dict:
        """Standardise, split, build both vocabularies on the training pairs, encode every split."""
        pairs, where = self.read_pairs()
        lowercase, seq_len = str(self.cfg.lowercase), int(self.cfg.seq_len)
        eng = [standardize(e, ENGLISH_STRIP, lowercase) for e, _ in pairs]
        spa = [standardize(f"{START_TOKEN} {s} {END_TOKEN}", SPANISH_STRIP, lowercase) for _, s in pairs]
        del pairs
        splits = split_pairs(len(eng), float(self.cfg.val_fraction), float(self.cfg.test_fraction),
                             int(self.cfg.split_seed))
        size = int(self.cfg.vocab_size)
        src_vocab = Vocabulary.adapt((eng[i] for i in splits["train"]), size)
        tgt_vocab = Vocabulary.adapt((spa[i] for i in splits["train"]), size)
        out = {"src_vocab": src_vocab.tokens, "tgt_vocab": tgt_vocab.tokens, "sources": where}
        for name, idx in splits.items():
            src, src_off = ragged([src_vocab.encode(eng[i], seq_len) for i in idx])
            tgt, tgt_off = ragged([tgt_vocab.encode(spa[i], seq_len + 1) for i in idx])
            # the reference: the standardised Spanish without the markers, whitespace normalised
            refs = "\n".join(" ".join(whitespace_split(spa[i])[1:-1]) for i in idx)
            out[name] = {"src": src, "src_offsets": src_off, "tgt": tgt, "tgt_offsets": tgt_off, "refs": refs}
        return out

    def make_splits(self, protocol: str) -> None:
        self._check_options()
        data, _ = cached(cache_dir(self.data_root), f"nmt-{self.dataset_name}", self._cache_key(), self.tokenise)
        self.src_vocab, self.tgt_vocab = Vocabulary(data["src_vocab"]), Vocabulary(data["tgt_vocab"])
        self.source = " + ".join(data["sources"])
        keras_positions = str(self.cfg.loss_positions) == "keras"
        splits = {s: PairDataset(data[s], keras_positions, self.seq_len) for s in ("train", "val", "test")}
        subset = self.cfg.get("subset") or {}
        for s, d in splits.items():
            if subset.get(s):
                splits[s] = torch.utils.data.Subset(d, range(min(int(subset[s]), len(d))))
        self.splits = splits
        self.facts = {"src_vocabulary": len(self.src_vocab), "tgt_vocabulary": len(self.tgt_vocab)}

    def _check_options(self) -> None:
        if str(self.cfg.loss_positions) not in ("keras", "targets"):
            raise unknown_choice("task.loss_positions", self.cfg.loss_positions, ("keras", "targets"))
        if str(self.cfg.lowercase) not in ("ascii", "unicode"):
            raise unknown_choice("task.lowercase", self.cfg.lowercase, ("ascii", "unicode"))
        for split in ("train", "val", "test"):
            limit = self.bleu_limit(split)
            if limit is not None and limit < 1:
                raise UserError(f"task.bleu.max_samples.{split} must be null (all) or at least 1, got {limit}")

    def collate(self, split: str):
        return collate_pairs

    def setup_synthetic(self, seq_len: int) -> None:
        if self.dataset_name not in DATASETS:
            raise unknown_choice("nmt dataset", self.dataset_name, DATASETS)
        size = int(self.cfg.vocab_size)
        tokens = ["", "[UNK]", START_TOKEN, END_TOKEN] + [f"w{i}" for i in range(size - 4)]
        self.src_vocab = self.tgt_vocab = Vocabulary(tokens)
        self.source, self.splits, self.seq_len = "synthetic", {}, int(seq_len)

    def synthetic_batch(self, batch_size: int, seq_len: int, device="cpu") -> dict:
        g = torch.Generator().manual_seed(0)
        src = torch.randint(2, len(self.src_vocab), (batch_size, seq_len), generator=g)
        tgt = torch.randint(2, len(self.tgt_vocab), (batch_size, seq_len + 1), generator=g)
        batch = {"src": src, "tgt_in": tgt[:, :-1], "tgt_out": tgt[:, 1:], "y": tgt[:, 1:]}
        return {k: v.to(device) for k, v in batch.items()}

    # --- model -------------------------------------------------------------------------------------
    def attention_stacks(self) -> dict[str, int]:
        b = self.cfg.backbone
        return {"encoder": int(b.n_encoder_layers), "decoder": int(b.n_decoder_layers),
                "cross": int(b.n_decoder_layers)}

    def build_model(self, model_cfg):
        from attnbench.models.text import build_translation_model

        if self.src_vocab is None:
            raise UserError("nmt: call setup() or setup_synthetic() before build_model()")
        return build_translation_model(model_cfg, self.cfg.backbone, len(self.src_vocab), len(self.tgt_vocab),
                                       self.seq_len, self.seq_len, self.attention_stacks())

    def model_inputs(self, batch: dict) -> dict:
        src, tgt = batch["src"], batch["tgt_in"]
        return {"src": src, "tgt": tgt, "src_mask": src != 0, "tgt_mask": tgt != 0}

    def loss(self, output: torch.Tensor, batch: dict) -> torch.Tensor:
        return F.cross_entropy(output.reshape(-1, output.shape[-1]), batch["y"].reshape(-1), ignore_index=IGNORE)

    # --- evaluation -------------------------------------------------------------------------------
    def bleu_limit(self, split: str) -> int | None:
        """Sentences of ``split`` greedily decoded for BLEU (None: all)."""
        limits = (self.cfg.get("bleu") or {}).get("max_samples") or {}
        value = limits.get(split)
        return int(value) if value is not None else None

    def translate(self, model, src: torch.Tensor) -> list[str]:
        """Greedy translations of a batch of English ids, as standardised Spanish text."""
        from attnbench.models.text import greedy_decode

        start, end = self.tgt_vocab.index[START_TOKEN], self.tgt_vocab.index[END_TOKEN]
        ids = greedy_decode(model, src, src != 0, start, end, self.seq_len)
        return [" ".join(self.tgt_vocab.tokens[i] for i in row if i != 0) for row in ids]

    @torch.no_grad()
    def evaluate(self, model, split: str, ctx: EvalContext) -> dict[str, float]:
        """Teacher-forced token accuracy and loss over the split (unless ``ctx.metrics`` leaves them
        out: then only the sentences BLEU needs are read); corpus BLEU of greedy decoding over its
        first ``bleu.max_samples[split]`` sentences (all by default)."""
        from bench_cli.core.task import to_device

        model.eval()
        stats: dict[str, float] = {}
        limit, decoded = self.bleu_limit(split), 0
        tokens = [m for m in (self.token_accuracy, self.token_loss) if ctx.wants(m)]
        for batch in ctx.loader(split):
            if not tokens and limit is not None and decoded >= limit:
                break  # only BLEU is wanted, and its sentences are decoded
            batch = to_device(batch, ctx.device)
            if tokens:
                output = model(**self.model_inputs(batch))
                for m in tokens:
                    accumulate(stats, m.update(output, batch))
            k = len(batch["ref"]) if limit is None else min(len(batch["ref"]), limit - decoded)
            if k > 0:
                hyps = self.translate(model, batch["src"][:k])
                accumulate(stats, self.bleu.update(None, {"hypotheses": hyps, "references": batch["ref"][:k]}))
                decoded += k
            ctx.advance()
        return compute_all(self.metrics, ctx.reduce(stats))  # every process evaluated its shard

    def describe(self) -> dict:
        out = {"source": str(self.source), "seq_len": self.seq_len, "bleu": self.bleu.signature(),
               "bleu_references": "standardised Spanish (lowercased, punctuation stripped)",
               "bleu_max_samples": {s: self.bleu_limit(s) for s in self.splits},
               "loss_positions": str(self.cfg.get("loss_positions")), **self.facts}
        out.update({f"n_{k}": len(v) for k, v in self.splits.items()})
        return out


# --- `attnbench data nmt NAME` ---------------------------------------------------------------------
def fetch_anki(data_root: Path, force: bool = False) -> Path:
    """Download the keras example's spa-eng.zip, unpack spa-eng/spa.txt and check its 118,964 pairs
    (no checksum is published; the zip's CRCs and the pair count are checked, and the sha256 of the
    download is written beside the archive)."""
    root = Path(data_root).expanduser()
    target = root / "spa-eng" / "spa.txt"
    if target.is_file() and not force:
        return target.parent
    archive = root / "spa-eng.zip"
    if force or not archive.is_file():
        print(f"downloading {ANKI_URL} to {archive} ...", file=sys.stderr)
        download(ANKI_URL, archive, what="the Anki spa-eng pairs", where=str(target))
    with fresh_folder(target.parent):
        unpack(archive, root, members=lambda name: "spa-eng/spa.txt" if name.endswith("spa.txt") else None)
        n = len(read_anki(target))
        if n != ANKI_PAIRS:
            target.unlink(missing_ok=True)
            raise DataNotFoundError(f"{archive} holds {n} pairs, not the {ANKI_PAIRS} of the keras example's "
                                    f"archive; delete it and download again")
    return target.parent


@register_fetcher
class TranslationFetcher(Fetcher):
    name = "nmt"
    summary = f"Anki spa-eng (keras example's archive) and Europarl en-es (HF {EUROPARL_HF})"

    def datasets(self, data_root=None) -> list[str]:
        return list(DATASETS)

    @staticmethod
    def present(data_root: Path) -> dict[str, bool]:
        """Whether each source is there (Europarl: its parquet files or a copy in the HF cache)."""
        return {"anki": anki_file(data_root) is not None,
                "europarl": bool(europarl_parquet(data_root)) or any(p.is_dir() for p in hf_cache_folders(EUROPARL_HF))}

    def status(self, dataset: str, data_root: Path) -> str:
        present = self.present(data_root)
        return "local" if all(present[s] for s in SOURCES.get(dataset, ())) else "missing"

    def location(self, dataset: str, data_root: Path) -> str:
        """spa.txt, and Europarl's parquet files (else its copy in the HF cache); both for europarl_anki."""
        root = Path(data_root).expanduser()
        hf = hf_cache_copy(EUROPARL_HF)
        europarl = f"{hf}/" if hf and not europarl_parquet(root) else f"{root / 'europarl' / EUROPARL_CONFIG}/*.parquet"
        return " + ".join({"anki": str(root / "spa-eng" / "spa.txt"), "europarl": europarl}[s] for s in SOURCES[dataset])

    def missing_message(self, dataset: str, data_root: Path, **options) -> str:
        present = self.present(data_root)
        return missing_message(next((s for s in SOURCES[dataset] if not present[s]), SOURCES[dataset][0]), data_root)

    def require(self, dataset: str, data_root: Path, *, cached=(), **options):
        """None when a tokenised copy is there or every source is in files, else the HF Europarl
        (from the HF cache; one line at once when offline); a missing Anki file is one line."""
        if any(Path(p).is_file() for p in cached):
            return None
        hf = None
        for source in SOURCES[dataset]:
            if source == "anki" and anki_file(data_root) is None:
                raise DataNotFoundError(missing_message("anki", data_root))
            if source == "europarl" and not europarl_parquet(data_root):
                hf = load_hf_dataset(EUROPARL_HF, EUROPARL_CONFIG, missing=missing_message("europarl", data_root))
        return hf

    def fetch(self, dataset: str, data_root: Path, force: bool = False, **options) -> Path:
        self.check_options(options)
        root = Path(data_root).expanduser()
        where = root
        if "europarl" in SOURCES[dataset] and not europarl_parquet(root):
            load_hf_dataset(EUROPARL_HF, EUROPARL_CONFIG, missing=missing_message("europarl", root))
        if "anki" in SOURCES[dataset]:
            where = fetch_anki(root, force)
        return where
