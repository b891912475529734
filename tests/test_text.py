"""Text tasks of papers/002: keras tokenisation rules against hand-computed sequences, vocabularies
from the training split only, the paper's parameter counts, causal and cross-attention masks of
the decoder for every decoder variant, greedy decoding, BLEU, loaders on fixtures in the real
formats (IMDB parquet, Zhang et al.'s Amazon CSV, spa.txt, Europarl parquet), tiny end-to-end
runs and the one-line errors of missing data."""
from __future__ import annotations

import csv
import json
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from bench_cli.commands.cli import main
from bench_cli.config.compose import compose, load_option
from bench_cli.core.errors import DataNotFoundError, UserError
from bench_cli.engine.counting import attention_parameters, count_parameters
from bench_cli.core.metrics import BLEU, accumulate
from bench_cli.results.csv_store import read_records
from bench_cli.config.taskfit import build_task, check_model_fits_task
from attnbench.models.attention import attention_spec, available_attentions
from attnbench.tasks import task_class
from attnbench.tasks.text import translation
from attnbench.tasks.text.tokenize import (SPANISH_STRIP, ENGLISH_STRIP, Vocabulary, WordIndex, pad_sequences, rank_words,
                                 standardize, text_to_word_sequence)

pytestmark = pytest.mark.usefixtures("single_thread")


# --- fixtures in the official formats -------------------------------------------------------------
def write_imdb(root: Path, train: list[tuple[str, int]], test: list[tuple[str, int]]) -> None:
    """The HF repository's parquet files (columns text, label) under DATA/imdb/plain_text/."""
    import pandas as pd

    d = root / "imdb" / "plain_text"
    d.mkdir(parents=True, exist_ok=True)
    for split, rows in (("train", train), ("test", test)):
        pd.DataFrame({"text": [t for t, _ in rows], "label": [y for _, y in rows]}).to_parquet(
            d / f"{split}-00000-of-00001.parquet")


def imdb_rows(n: int, seed: int) -> list[tuple[str, int]]:
    rng = np.random.RandomState(seed)
    rows = []
    for i in range(n):
        y = i % 2
        word = "wonderful" if y else "dreadful"
        rows.append((f"The film was {word}.<br /><br />I {'loved' if y else 'hated'} it, {word}! {rng.randint(50)}", y))
    return rows


def write_amazon(root: Path, n_train: int = 40, n_test: int = 15) -> None:
    """Zhang et al. 2015: train.csv / test.csv, quoted class (1-5), title, text; no header."""
    d = root / "amazon_review_full_csv"
    d.mkdir(parents=True, exist_ok=True)
    words = ["awful", "poor", "okay", "good", "great"]
    for split, n in (("train", n_train), ("test", n_test)):
        with open(d / f"{split}.csv", "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f, quoting=csv.QUOTE_ALL)
            for i in range(n):
                c = i % 5
                w.writerow([c + 1, f"{words[c].title()} product", f"It was {words[c]}.\\nReally {words[c]}, \"{i}\"."])


ANKI = [("Go.", "Ve."), ("Hi.", "Hola."), ("Run!", "¡Corre!"), ("Who?", "¿Quién?"), ("I see.", "Ya veo."),
        ("He is tall.", "Él es alto."), ("She sings.", "Ella canta."), ("We eat bread.", "Comemos pan."),
        ("Thanks!", "¡Gracias!"), ("I am Tom.", "Soy Tom."),
        # sentences of 4+ words: corpus BLEU of sentences without 4-grams is 0 whatever the model does
        ("Tom is reading a book.", "Tom está leyendo un libro."), ("My brother lives in Madrid.", "Mi hermano vive en Madrid.")]


def write_spa(root: Path, n: int = 60) -> Path:
    """spa.txt of the keras example's archive: 'English<TAB>Spanish' lines."""
    path = root / "spa-eng" / "spa.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{ANKI[i % len(ANKI)][0]}\t{ANKI[i % len(ANKI)][1]}\n" for i in range(n)), encoding="utf-8")
    return path


def write_europarl(root: Path, n: int = 30) -> None:
    """The HF repository's en-es parquet files: a 'translation' column of {en, es}."""
    import pandas as pd

    d = root / "europarl" / "en-es"
    d.mkdir(parents=True, exist_ok=True)
    rows = [{"en": f"The session is resumed {i}.", "es": f"Se reanuda la sesión {i}."} for i in range(n)]
    pd.DataFrame({"translation": rows}).to_parquet(d / "train-00000-of-00001.parquet")


@pytest.fixture
def data(workdir):
    return workdir / "data"


RUN = ["trainer.max_epochs=2", "trainer.progress=false", "measure.flops=false", "measure.memory=false",
       "results.path=res.csv", "trainer.num_threads=1"]
NMT_TINY = ["task=nmt", "task.backbone.d_model=16", "task.backbone.d_ff=32", "task.backbone.n_heads=2",
            "task.val_fraction=0.1", "task.test_fraction=0.1", "trainer.batch_size=8"]


def run(*args: str) -> dict:
    keys = {a.split("=", 1)[0] for a in args}
    main(["run", *args, *[t for t in RUN if t.split("=", 1)[0] not in keys]])
    return read_records("res.csv")[-1]


# --- keras tokenisation -----------------------------------------------------------------------------
def test_keras_words_ranks_and_imdb_ids():
    assert text_to_word_sequence("This movie was GREAT!<br /> Don't\tgo.") == \
        ["this", "movie", "was", "great", "br", "don't", "go"]  # apostrophes are not in keras' filters
    ranked = rank_words([["b", "a", "c"], ["a", "b", "d"], ["c"]])
    assert ranked == ["b", "a", "c", "d"]  # counts 2, 2, 2, 1: ties in order of first appearance
    index = WordIndex(ranked, num_words=7)  # ids: b=4, a=5, c=6; d would be 7 >= num_words
    assert index.encode(["a", "c", "d", "zebra", "b"]) == [1, 5, 6, 2, 2, 4]  # start 1, OOV 2


def test_pad_sequences_pre_padding_and_pre_truncation():
    seqs = [[1, 4, 5], [1, 4, 5, 6, 7, 8, 9], []]
    got = pad_sequences(seqs, maxlen=5)
    assert got.tolist() == [[0, 0, 1, 4, 5], [5, 6, 7, 8, 9], [0, 0, 0, 0, 0]]  # a long review keeps its end
    assert pad_sequences(seqs, maxlen=5, padding="post", truncating="post").tolist() == \
        [[1, 4, 5, 0, 0], [1, 4, 5, 6, 7], [0, 0, 0, 0, 0]]
    assert pad_sequences(iter(seqs), maxlen=4, chunk=2).tolist() == [[0, 1, 4, 5], [6, 7, 8, 9], [0, 0, 0, 0]]
    assert pad_sequences(seqs).shape == (3, 7)


def test_text_vectorization_standardisation_and_vocabulary():
    assert standardize("[start] ¿Quién es ÉL? ¡Ya! [end]", SPANISH_STRIP) == "[start] quién es Él ¡ya [end]"
    assert standardize("[start] ¿Quién?", SPANISH_STRIP, "unicode") == "[start] quién"
    assert standardize("Don't stop, [Tom]!", ENGLISH_STRIP) == "dont stop tom"
    vocab = Vocabulary.adapt(["b a a", "c b", "d"], max_tokens=5)
    assert vocab.tokens == ["", "[UNK]", "b", "a", "d"]  # counts 2, 2, 1, 1: ties by descending bytes
    assert vocab.encode("a c z b", length=3) == [3, 1, 1] and vocab.decode([2, 3]) == ["b", "a"]
    assert vocab.encode("a\u00a0b  b\tz") == [1, 2, 1]  # ASCII whitespace splits; a no-break space does not


# --- text classification ------------------------------------------------------------------------
def test_imdb_loader_tokenises_train_vocabulary_only_and_caches(data, monkeypatch):
    train = [("good good movie", 1), ("bad movie", 0)] * 10
    test = [("good zebra " + "bad " * 40 + "movie", 1), ("movie", 0)]
    write_imdb(data, train, test)
    cfg = compose(["task=textcls", "task.dataset=imdb", "task.protocol=paper", "task.setups.imdb.max_len=6"])
    task = task_class("textcls")(cfg.task, data)
    task.setup("paper")
    # training counts: good 20, movie 20 (good first seen), bad 10 -> good 4, movie 5, bad 6;
    # 'zebra' appears only in the test split
    assert task.splits["train"][0]["x"].tolist() == [0, 0, 1, 4, 4, 5]
    x = task.splits["test"][0]["x"].tolist()
    assert x == [6, 6, 6, 6, 6, 5]  # pre-truncation keeps the last 6 ids: the start id and 'zebra' are cut
    short = task_class("textcls")(compose(["task=textcls", "task.protocol=paper", "task.setups.imdb.max_len=60"]).task, data)
    short.setup("paper")
    assert short.splits["test"][0]["x"][-44:-41].tolist() == [1, 4, 2]  # start, good, zebra -> OOV
    assert task.describe()["vocabulary_words"] == 3 and task.describe()["n_train"] == 20
    # the second setup reads the cache, not the files
    monkeypatch.setattr(type(task), "read_raw", lambda self: pytest.fail("the cache was not used"))
    again = task_class("textcls")(cfg.task, data)
    again.setup("paper")
    assert torch.equal(again.splits["test"].tensors["x"], task.splits["test"].tensors["x"])


def keras_imdb_load_data(train: list[tuple[str, int]], test: list[tuple[str, int]], num_words: int, maxlen: int):
    """keras.datasets.imdb as the keras example reads it, transcribed: imdb.npz holds every review
    as the 1-based ranks of its words "by overall frequency in the dataset" (train and test; ties
    here by first appearance), load_data(num_words) prepends start_char 1, adds index_from 3 and
    maps every id outside [skip_top 0, num_words) to oov_char 2; keras.utils.pad_sequences pads and
    truncates at the front. (load_data's seed-113 shuffle only reorders the reviews.)"""
    words = [w for text, _ in train + test for w in text.split()]
    distinct, first, counts = np.unique(words, return_index=True, return_counts=True)
    order = np.lexsort((first, -counts))  # count descending, then first appearance
    rank = {distinct[i]: r for r, i in enumerate(order, start=1)}
    def ids(text):
        x = [1] + [rank[w] + 3 for w in text.split()]
        x = [w if 0 <= w < num_words else 2 for w in x]
        x = x[-maxlen:]
        return [0] * (maxlen - len(x)) + x
    return [ids(t) for t, _ in train], [ids(t) for t, _ in test]


def test_keras_vocabulary_ranks_train_and_test_as_keras_datasets_imdb(data):
    """task.vocabulary=keras (the reproduction configs') equals load_data's ids; train (the
    default) ranks on TRAIN only, which keeps other words: here 'movie' instead of 'zebra'."""
    train = [("good movie good", 1), ("movie good film", 0), ("good movie", 1)]
    test = [("zebra zebra film", 0), ("zebra good zebra zebra zebra", 1)]
    # counts: train good 4, movie 3, film 1; with test zebra 6, good 5, film 2, movie 3
    write_imdb(data, train, test)
    setup = ["task=textcls", "task.setups.imdb.num_words=6", "task.setups.imdb.max_len=5", "task.protocol=paper"]
    keras_task = task_class("textcls")(compose([*setup, "task.vocabulary=keras"]).task, data)
    keras_task.setup("paper")
    x_train, x_test = keras_imdb_load_data(train, test, num_words=6, maxlen=5)
    assert keras_task.splits["train"].tensors["x"].tolist() == x_train
    assert keras_task.splits["test"].tensors["x"].tolist() == x_test
    assert x_test[1] == [4, 5, 4, 4, 4]  # zebra (rank 1) and good (rank 2) are the 2 words kept

    train_task = task_class("textcls")(compose(setup).task, data)
    train_task.setup("paper")
    assert compose(setup).task.vocabulary == "train"  # the task's default: leak-free
    # ranked on TRAIN: good 4, movie 5; zebra never seen, film cut: both 2
    assert train_task.splits["test"].tensors["x"].tolist() == [[0, 1, 2, 2, 2], [2, 4, 2, 2, 2]]
    assert train_task.splits["train"].tensors["x"][0].tolist() == [0, 1, 4, 5, 4]
    assert keras_task.splits["train"].tensors["x"][0].tolist() == [0, 1, 5, 2, 5]  # movie is out under keras
    assert keras_task.describe()["vocabulary"] == "keras" and keras_task.describe()["distinct_train_test_words"] == 4
    # holdout carves the validation reviews after keras' ranking: the vocabulary is the same
    holdout = task_class("textcls")(compose([*setup[:-1], "task.vocabulary=keras", "task.val_fraction=0.34"]).task, data)
    holdout.setup("holdout")
    assert len(holdout.splits["val"]) == 1 and len(holdout.splits["train"]) == 2  # its own cache, not paper's
    assert holdout.splits["test"].tensors["x"].tolist() == x_test
    with pytest.raises(UserError, match="task.vocabulary"):
        task_class("textcls")(compose([*setup, "task.vocabulary=test"]).task, data).setup("paper")


def test_holdout_vocabulary_excludes_the_validation_reviews(data):
    train = [(f"common word{i}", i % 2) for i in range(20)]
    write_imdb(data, train, [("common", 0), ("common", 1)])
    task = task_class("textcls")(compose(["task=textcls", "task.val_fraction=0.5"]).task, data)
    task.setup("holdout")
    assert len(task.splits["val"]) == 10 and len(task.splits["train"]) == 10
    assert task.describe()["distinct_training_words"] == 11  # 'common' + the 10 fitting reviews' own words
    val_ids = task.splits["val"].tensors["x"]
    assert (val_ids[:, -1] == 2).all()  # every validation review's own word is out of vocabulary


def test_amazon_loader_reads_zhang_csv(data):
    write_amazon(data)
    task = task_class("textcls")(compose(["task=textcls", "task.dataset=amazon", "task.protocol=paper"]).task, data)
    task.setup("paper")
    assert task.n_classes == 5 and task.max_len == 64 and task.vocab_size == 40000
    assert sorted(set(task.splits["train"].tensors["y"].tolist())) == [0, 1, 2, 3, 4]
    first = task.splits["train"][0]["x"].tolist()
    # 'Awful product It was awful.\nReally awful, "0".' -> awful product it was awful really awful 0
    words = [w for w in first if w]
    assert words[0] == 1 and len(words) == 9 and words[1] == words[5] == words[7]


def test_imdb_from_hf_datasets(data, monkeypatch):
    from attnbench.tasks.text import classification

    fake = {s: {"text": [t for t, _ in imdb_rows(8, i)], "label": [y for _, y in imdb_rows(8, i)]}
            for i, s in enumerate(("train", "test"))}
    calls = []
    monkeypatch.setattr(classification, "load_hf_dataset", lambda repo, config=None, missing="": calls.append(repo) or fake)
    task = task_class("textcls")(compose(["task=textcls", "task.protocol=paper"]).task, data)
    task.setup("paper")
    assert calls[0] == "stanfordnlp/imdb" and len(task.splits["train"]) == 8 and task.source == "HF stanfordnlp/imdb"


def test_paper_parameter_counts_of_the_classifiers():
    """IMDB: (20,000 + 32) x 32 embeddings + attention + FFN 2 x (32 x 32 + 32) + 2 LayerNorms (128)
    + Dense(20) 660 + Dense(2) 42 = 648,190 with standard attention (the paper's "650K");
    Amazon: (40,000 + 64) x 64 + 3 x (attention + 8,320 + 256) + 1,300 + 105 = 2,641,149 ("2.6M")."""
    expected = {("imdb", "standard"): (648_190, 4224), ("imdb", "optimised"): (647_134, 3168),
                ("imdb", "efficient"): (646_078, 2112), ("imdb", "super"): (647_134, 3168),
                ("amazon", "standard"): (2_641_149, 16_640), ("amazon", "optimised"): (2_628_669, 12_480),
                ("amazon", "efficient"): (2_616_189, 8320), ("amazon", "super"): (2_628_669, 12_480)}
    for dataset in ("imdb", "amazon"):
        cfg = compose(["task=textcls", f"task.dataset={dataset}"])
        task = build_task(cfg)
        task.setup_synthetic(int(cfg.task.max_len))
        for model in ("standard", "optimised", "efficient", "super"):
            with torch.device("meta"):
                net = task.build_model(load_option("model", model))
            total, per_layer = expected[(dataset, model)]
            assert (count_parameters(net), attention_parameters(net)["attn_params_per_layer"]) == (total, per_layer)
            if model == "super":  # Super's l is the padded length
                assert net.layers[0].attention.align.weight.shape == (cfg.task.max_len,) * 2


def test_paper_per_layer_counts_of_the_translation_model():
    """Table 10: 4,198,400 / 3,148,800 / 2,099,200 parameters per attention layer (d_model 1024),
    the same for the encoder self-, decoder self- and cross-attentions; Super is refused in one line."""
    for model, per_layer in (("standard", 4_198_400), ("optimised", 3_148_800), ("efficient", 2_099_200)):
        cfg = compose(["task=nmt", f"model={model}"])
        task = build_task(cfg)
        check_model_fits_task(task, cfg)
        task.setup_synthetic(20)
        with torch.device("meta"):
            net = task.build_model(cfg.model)
        counts = attention_parameters(net)
        assert counts["attn_layers"] == 5 and counts["attn_params"] == 5 * per_layer
        assert {sum(p.numel() for p in m.parameters()) for m in
                (net.encoder[0].attention, net.decoder[1].attention, net.decoder[1].cross_attention)} == {per_layer}
    cfg = compose(["task=nmt", "model=super"])
    with pytest.raises(UserError) as e:
        check_model_fits_task(build_task(cfg), cfg)
    assert str(e.value) == ("model 'super' cannot run task 'nmt': super cannot be the cross-attention "
                            "(layers 1-2 of 2): it lacks cross")


def test_classifier_padding_mask_option(data):
    write_imdb(data, imdb_rows(12, 0), imdb_rows(6, 1))
    cfg = compose(["task=textcls", "task.padding_mask=true", "task.protocol=paper", "task.backbone.dropout=0.0",
                   "task.backbone.head_dropout=0.0"])
    task = build_task(cfg)
    task.setup("paper")
    net = task.build_model(cfg.model).eval()
    x = task.splits["test"].tensors["x"][:2].long()
    more_padding = torch.cat([torch.zeros(2, 4, dtype=torch.long), x[:, :-4]], 1)
    pad = x[0] == 0
    assert pad.any()
    changed = x.clone()
    changed[0, pad] = 0
    inputs = task.model_inputs({"x": x})
    assert inputs["mask"] is not None and torch.equal(inputs["mask"], x != 0)
    assert torch.allclose(net(**inputs), net(**task.model_inputs({"x": changed})))
    assert not torch.allclose(net(**inputs), net(**task.model_inputs({"x": more_padding})))


# --- translation model: masks and decoding -------------------------------------------------------------
DECODER_VARIANTS = [n for n in available_attentions()
                    if attention_spec(n).capabilities.causal and attention_spec(n).capabilities.cross]
# Known leaks, reported to the attention registry's owners; strict, so a fix shows up here.
def tiny_translation_model(variant: str):
    from attnbench.models.text import build_translation_model

    backbone = {"d_model": 16, "n_heads": 2, "d_ff": 32, "dropout": 0.0, "output_dropout": 0.0,
                "activation": "relu", "norm_eps": 1e-3, "init": "keras"}
    model_cfg = compose([f"model={variant}"]).model
    torch.manual_seed(0)
    return build_translation_model(model_cfg, backbone, 30, 40, 20, 20, {"encoder": 1, "decoder": 2, "cross": 2}).eval()


@pytest.mark.parametrize("variant", DECODER_VARIANTS)
def test_decoder_is_causal_and_cross_attends_to_real_source_tokens(variant, float64_single_thread):
    assert {"standard", "optimised", "efficient"} <= set(DECODER_VARIANTS)
    net = tiny_translation_model(variant).double()
    g = torch.Generator().manual_seed(1)
    src = torch.randint(3, 30, (2, 7), generator=g)
    src[1, 5:] = 0  # padded source
    tgt = torch.randint(3, 40, (2, 9), generator=g)
    src_mask, tgt_mask = src != 0, tgt != 0
    out = net(src, tgt, src_mask, tgt_mask)
    for k in (3, 8):
        later = tgt.clone()
        later[:, k] = (later[:, k] + 5) % 40  # a different later target token
        changed = net(src, later, src_mask, tgt_mask)
        assert torch.allclose(changed[:, :k], out[:, :k], atol=1e-10), f"{variant}: position < {k} saw the future"
        assert not torch.allclose(changed[:, k:], out[:, k:])
    padded = src.clone()
    padded[1, 5:] = 7  # different ids under the padding mask
    assert torch.allclose(net(padded, tgt, src_mask, tgt_mask), out, atol=1e-10), f"{variant}: padding leaked"
    real = src.clone()
    real[1, 2] = (real[1, 2] + 3) % 30 or 3
    assert not torch.allclose(net(real, tgt, src_mask, tgt_mask)[1], out[1]), f"{variant}: the source is not read"


class ScriptedDecoder(torch.nn.Module):
    """Decodes a fixed script per sentence: the next token is script[row][step]."""

    def __init__(self, scripts, vocab=12):
        super().__init__()
        self.scripts, self.vocab, self.calls = scripts, vocab, 0

    def encode(self, src, src_mask):
        return torch.zeros(src.shape[0], src.shape[1], 4)

    def decode(self, tgt, memory, src_mask, tgt_mask=None):
        self.calls += 1
        logits = torch.zeros(tgt.shape[0], tgt.shape[1], self.vocab)
        for row, script in enumerate(self.scripts):
            logits[row, -1, script[min(tgt.shape[1] - 1, len(script) - 1)]] = 1.0
        return logits


def test_greedy_decoding_stops_at_end():
    from attnbench.models.text import greedy_decode

    start, end = 2, 3
    model = ScriptedDecoder([[5, 6, end, 7, 7, 7], [5, end, 9, 9, 9, 9]])
    src = torch.ones(2, 4, dtype=torch.long)
    assert greedy_decode(model, src, src != 0, start, end, max_len=6) == [[5, 6], [5]]
    assert model.calls == 3  # stopped when every sentence had produced [end]
    never = ScriptedDecoder([[5, 6, 7, 8]])
    assert greedy_decode(never, src[:1], None, start, end, max_len=4) == [[5, 6, 7, 8]] and never.calls == 4


def test_translate_returns_standardised_words():
    task = build_task(compose(["task=nmt", "task.vocab_size=12"]))
    task.setup_synthetic(4)
    end = task.tgt_vocab.index["[end]"]
    model = ScriptedDecoder([[6, 1, 0, 5, end]], vocab=12)
    assert task.translate(model, torch.ones(1, 3, dtype=torch.long)) == ["w2 [UNK] w1"]  # padding ids dropped


def test_bleu_is_sacrebleus_corpus_bleu():
    import sacrebleu

    metric = BLEU()
    one = metric.update(None, {"hypotheses": ["the cat sat on the mat"], "references": ["the cat sat on a mat"]})
    # n-gram precisions 5/6, 3/5, 2/4, 1/3, no brevity penalty
    assert metric.compute(one) == pytest.approx(100 * (5 / 6 * 3 / 5 * 2 / 4 * 1 / 3) ** 0.25)
    hyps = ["the cat sat on the mat", "a dog runs", "hello there my friend", "ok"]
    refs = ["the cat sat on a mat", "the dog runs fast", "hello my friend", "okay then"]
    stats: dict = {}
    for i in range(0, 4, 3):  # batches of 3 and 1: the statistics add up to the corpus score
        accumulate(stats, metric.update(None, {"hypotheses": hyps[i:i + 3], "references": refs[i:i + 3]}))
    assert metric.compute(stats) == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score)
    assert "tok:13a" in metric.signature()


# --- translation data -----------------------------------------------------------------------------
def test_anki_pairs_split_vocabulary_from_train_only_and_keras_positions(data, monkeypatch):
    write_spa(data, 60)
    cfg = compose(["task=nmt", "task.dataset=anki", "task.val_fraction=0.1", "task.test_fraction=0.1",
                   "task.vocab_size=12"])
    task = task_class("nmt")(cfg.task, data)
    task.setup("holdout")
    assert {k: len(v) for k, v in task.splits.items()} == {"train": 48, "val": 6, "test": 6}
    assert task.src_vocab.tokens[:2] == ["", "[UNK]"] and len(task.tgt_vocab) == 12
    assert task.tgt_vocab.tokens[2:4] == ["[start]", "[end]"]  # in every Spanish sentence
    pairs = translation.read_anki(data / "spa-eng" / "spa.txt")
    split = translation.split_pairs(60, 0.1, 0.1, 0)
    train_words = {w for i in split["train"] for w in standardize(pairs[i][1], SPANISH_STRIP).split()}
    assert set(task.tgt_vocab.tokens[4:]) <= train_words  # built from the training pairs only
    item = task.splits["test"][0]
    i = int(split["test"][0])
    spanish = standardize(f"[start] {pairs[i][1]} [end]", SPANISH_STRIP)
    ids = task.tgt_vocab.encode(spanish)
    assert item["tgt_in"].tolist() == ids[:-1] + [ids[-1]] and item["tgt_out"].tolist() == ids[1:] + [0]
    assert item["src"].tolist() == task.src_vocab.encode(standardize(pairs[i][0], ENGLISH_STRIP))
    assert item["ref"] == " ".join(spanish.split()[1:-1])
    batch = task.collate("test")([task.splits["test"][j] for j in range(3)])
    real = batch["tgt_in"] != 0
    assert torch.equal(batch["y"] != -100, real)  # keras: every real decoder input is scored
    assert ((batch["y"] == 0) == (real & (batch["tgt_out"] == 0))).all()
    assert (batch["y"][real] == batch["tgt_out"][real]).all()
    monkeypatch.setattr(type(task), "read_pairs", lambda self: pytest.fail("the cache was not used"))
    task2 = task_class("nmt")(compose(["task=nmt", "task.dataset=anki", "task.val_fraction=0.1",
                                       "task.test_fraction=0.1", "task.vocab_size=12", "task.loss_positions=targets"]).task, data)
    task2.setup("paper")
    assert "val" not in task2.splits
    assert task2.splits["test"][0]["tgt_out"].tolist() == ids[1:]  # only the real target tokens


def test_translation_evaluator_sums_its_statistics_through_the_context(data):
    """A distributed run's processes each evaluate a shard; ctx.reduce sums their statistics."""
    from bench_cli.engine.trainer import Trainer
    from bench_cli.core.task import EvalContext

    write_spa(data, 60)
    cfg = compose([*NMT_TINY, "task.dataset=anki", "task.vocab_size=12", "model=softmax"])
    task = task_class("nmt")(cfg.task, data)
    task.setup("holdout")
    torch.manual_seed(0)
    model = task.build_model(cfg.model).eval()
    trainer = Trainer(cfg.trainer.copy(), task, model, torch.device("cpu"), seed=0)
    reduced = []
    result = task.evaluate(model, "test", EvalContext(loader=lambda s: trainer.loader(s, train=False), device=torch.device("cpu"),
                                                      reduce=lambda stats: reduced.append(dict(stats)) or stats))
    assert len(reduced) == 1 and any(k.startswith("bleu.") for k in reduced[0])
    assert {"accuracy", "loss", "bleu"} <= set(result)
    # BLEU alone (the training split when its accuracy and loss come from the training batches):
    # no teacher-forced pass, and only the batches holding the sentences BLEU decodes are read
    task.cfg.bleu.max_samples.train = 8
    batches = []

    def loader(split):
        for b in trainer.loader(split, train=False):
            batches.append(b)
            yield b

    only = task.evaluate(model, "train", EvalContext(loader=loader, device=torch.device("cpu"), metrics=["bleu"]))
    assert set(only) == {"bleu"} and len(batches) == 1  # batch 8 holds the 8 sentences


def test_europarl_and_anki_together(data):
    write_spa(data, 20)
    write_europarl(data, 30)
    task = task_class("nmt")(compose(["task=nmt", "task.dataset=europarl_anki", "task.val_fraction=0.1",
                                      "task.test_fraction=0.1"]).task, data)
    task.setup("holdout")
    assert sum(len(v) for v in task.splits.values()) == 50
    assert "sesión" in task.tgt_vocab.index and "hola" in task.tgt_vocab.index
    assert task.source.endswith("spa.txt") and "europarl" in task.source


def test_anki_fetcher_unpacks_and_checks_the_pair_count(data, monkeypatch):
    lines = write_spa(data / "src", 25).read_bytes()
    archive = data / "staging.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("spa-eng/_about.txt", "about")
        z.writestr("spa-eng/spa.txt", lines)

    def fake_download(url, target, **kw):
        assert url == translation.ANKI_URL
        Path(target).write_bytes(archive.read_bytes())

    monkeypatch.setattr(translation, "download", fake_download)
    with pytest.raises(DataNotFoundError, match="holds 25 pairs, not the 118964"):
        translation.fetch_anki(data)
    assert not (data / "spa-eng").exists()  # nothing half-made is left to look like data
    monkeypatch.setattr(translation, "ANKI_PAIRS", 25)
    main(["data", "nmt", "anki"])
    assert (data / "spa-eng" / "spa.txt").read_bytes() == lines


# --- missing data ---------------------------------------------------------------------------------
def test_missing_datasets_are_one_line_errors_at_once_offline(data, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty_hf_home"))  # no cached copy anywhere
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setitem(sys.modules, "datasets", None)  # the offline answer must not need the library
    for overrides, words in ((["task=textcls"], ["stanfordnlp/imdb", "attnbench data textcls imdb", "offline"]),
                             (["task=textcls", "task.dataset=amazon"], ["amazon_review_full_csv", "attnbench data textcls amazon"]),
                             (["task=nmt", "task.dataset=anki"], ["spa-eng", "attnbench data nmt anki"]),
                             (["task=nmt"], ["Helsinki-NLP/europarl", "attnbench data nmt europarl", "offline"])):
        task = build_task(compose(overrides))
        t0 = time.perf_counter()
        with pytest.raises(DataNotFoundError) as e:
            task.check_data()
        assert time.perf_counter() - t0 < 1.0
        message = str(e.value)
        assert "\n" not in message and all(w in message for w in words), message
    with pytest.raises(UserError, match="unknown textcls dataset 'imbd' \\(did you mean 'imdb'\\?\\)"):
        build_task(compose(["task=textcls", "task.dataset=imbd"])).check_data()


def test_cli_reports_a_missing_dataset_in_one_line(workdir, monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty_hf_home"))
    with pytest.raises(SystemExit) as e:
        main(["run", "task=nmt", "model=efficient"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Helsinki-NLP/europarl" in err


# --- end to end ---------------------------------------------------------------------------------------
@pytest.mark.slow
def test_textcls_runs_end_to_end_with_train_metrics_and_inference_time(data):
    write_imdb(data, imdb_rows(40, 0), imdb_rows(20, 1))
    r = run("task=textcls", "model=super", "measure.inference_samples=15", "trainer.eval_batch_size=4",
            "trainer.max_epochs=4", "trainer.batch_size=4", "trainer.optimizer.lr=5e-3", "task.backbone.dropout=0",
            "task.backbone.head_dropout=0", "seed=0")
    assert r["status"] == "ok" and r["metric"] == "accuracy" and r["higher_is_better"] == "True"
    # the fixture's label is the word 'wonderful' / 'dreadful': a model that learns is far above
    # chance (50 %) on the test reviews, and its training loss falls
    assert float(r["test_accuracy"]) >= 90.0, r["test_accuracy"]
    losses = [h["train_loss"] for h in json.loads(r["metrics_json"])["history"]]
    assert len(losses) == 4 and losses[-1] < 0.5 * losses[0], losses
    for key in ("test_loss", "train_accuracy", "train_loss", "val_accuracy"):
        assert 0 <= float(r[key]) <= 100, key
    assert int(r["params"]) == 647_134 and int(r["infer_samples"]) == 15 and int(r["infer_batch_size"]) == 4
    assert 0 < float(r["infer_time_per_batch_s"]) <= float(r["infer_time_s"])  # the median batch of 4 batches
    # train accuracy / loss as the keras example's fit logs them: running means over the training
    # batches of the selected epoch (the history row), not a re-evaluation of the training split
    chosen = [h for h in json.loads(r["metrics_json"])["history"] if h["epoch"] == int(r["best_epoch"])][-1]
    assert float(r["train_accuracy"]) == pytest.approx(chosen["train_accuracy"])
    assert float(r["train_loss"]) == pytest.approx(chosen["train_loss"])
    reevaluated = run("task=textcls", "model=super", "trainer.train_metrics=evaluation")
    assert reevaluated["train_accuracy"] != "" and "train_accuracy" not in json.loads(reevaluated["metrics_json"])["history"][0]
    write_amazon(data)
    r = run("task=textcls", "task.dataset=amazon", "model=efficient", "task.protocol=paper")
    assert r["status"] == "ok" and r["dataset"] == "amazon" and r["train_accuracy"] != ""


def majority_token_accuracy(n_pairs: int) -> float:
    """Token accuracy (%) of always predicting the most frequent target on the TEST pairs of
    write_spa(n_pairs) split as NMT_TINY: a sentence's scored targets are its standardised Spanish
    words, [end] and, under keras' mask, the one padding id after it."""
    from collections import Counter

    spanish = [ANKI[i % len(ANKI)][1] for i in translation.split_pairs(n_pairs, 0.1, 0.1, 0)["test"]]
    targets = Counter(t for s in spanish for t in [*standardize(s, SPANISH_STRIP).split(), "[end]", ""])
    return 100.0 * max(targets.values()) / sum(targets.values())


@pytest.mark.slow
def test_nmt_runs_end_to_end_and_records_bleu(data):
    write_spa(data, 60)
    r = run(*NMT_TINY, "task.dataset=anki", "model=efficient", "task.bleu.max_samples.train=8", "trainer.max_epochs=6",
            "trainer.optimizer.lr=3e-3", "task.backbone.output_dropout=0", "seed=0")
    assert r["status"] == "ok" and r["metric"] == "bleu" and r["higher_is_better"] == "True"
    # the test pairs repeat training pairs: a model that learns predicts their tokens far better than
    # the most frequent target does, and translates the 5-word sentence among them (BLEU > 0 needs a
    # matching 4-gram); its training loss falls
    history = json.loads(r["metrics_json"])["history"]
    assert float(r["test_accuracy"]) >= majority_token_accuracy(60) + 40.0, r["test_accuracy"]
    assert float(r["test_bleu"]) >= 50.0, r["test_bleu"]
    losses = [h["train_loss"] for h in history]
    assert len(losses) == 6 and losses[-1] < 0.5 * losses[0], losses
    for key in ("test_bleu", "val_bleu", "train_bleu", "test_accuracy", "test_loss", "train_accuracy", "train_loss"):
        assert r[key] != "", key
    assert r["test_score"] == r["test_bleu"] and int(r["attn_layers"]) == 5
    chosen = [h for h in history if h["epoch"] == int(r["best_epoch"])][-1]  # keras' running means
    assert float(r["train_accuracy"]) == pytest.approx(chosen["train_accuracy"]) and "train_bleu" not in chosen
    facts = json.loads(r["metrics_json"])["data"]
    assert facts["bleu"].startswith("nrefs:1|case:mixed|eff:no|tok:13a") and facts["bleu_max_samples"]["train"] == 8


# --- reports against the paper's tables --------------------------------------------------------------
def test_table8_report_matches_the_papers_rows_by_heads_and_split(workdir):
    from bench_cli.results.csv_store import append_record

    exp = "pay_better_attention/table8"
    for model, per_layer in (("standard", 4224), ("efficient", 2112)):
        for heads in (1, 4):
            for seed, acc in enumerate((78.0, 78.2)):
                append_record(workdir / "runs.csv", {
                    "experiment": exp, "task": "textcls", "dataset": "imdb", "model": model, "seed": seed,
                    "status": "ok", "protocol": "holdout", "variant_key": f"{model}{heads}", "time": f"2026-01-01T00:0{seed}",
                    "test_accuracy": acc, "test_loss": 0.47, "train_accuracy": 96.0, "train_loss": 0.08,
                    "attn_params_per_layer": per_layer, "params": 648190, "time_per_epoch_s": 1.0,
                    "overrides": f"experiment={exp} model={model} task.backbone.n_heads={heads} seed={seed}"})
    main(["report", exp, "--records", str(workdir / "runs.csv"), "--out", str(workdir / "rep")])
    md = (workdir / "rep" / "pay_better_attention" / "table8.md").read_text()
    # Table 8, IMDB: standard h=1 test 78.09, h=4 77.62; efficient h=4 77.77 (the test split's rows)
    assert "| imdb | standard (n_heads=1) | 2 | 78.10 ± 0.14 | 78.09 [T8] | +0.01 | within |" in md
    assert "| imdb | standard (n_heads=4) | 2 | 78.10 ± 0.14 | 77.62 [T8] |" in md
    assert "| imdb | efficient (n_heads=4) | 2 | 78.10 ± 0.14 | 77.77 [T8] |" in md
    train = md[md.index("## train_accuracy"):]
    assert "| imdb | standard (n_heads=1) | 2 | 96.00 ± 0.00 | 96.09 [T8] |" in train  # the train split's row
    params = md[md.index("## attn_params_per_layer"):]
    assert "| imdb | efficient (n_heads=1) | 2 | 2112.00 ± 0.00 | 2112.00 [T8] | +0.00 | within |" in params
    with open(workdir / "rep" / "pay_better_attention" / "table8.test_loss.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows[0]["model"] == "standard (n_heads=1)" and rows[0]["paper_mean"] == "0.4610"
