"""Language modelling (task=lm): fairseq-preprocess tokenisation on a fixture in the wiki.*.tokens
conventions, token blocks and their shifted inputs, the fairseq-eval-lm sliding window (every token
scored once; equal to scoring each token on its own context), causality of every causal variant,
fairseq's inverse-sqrt schedule, the published-facts check, a tiny run that learns a predictable
corpus and the refusal of non-causal variants."""
from __future__ import annotations

import json
import math

import pytest
import torch

from bench_cli.commands.cli import main
from bench_cli.config.compose import compose
from bench_cli.core.errors import UserError
from bench_cli.results.csv_store import read_records
from conftest import causal_config, causal_models
from attnbench.tasks import task_class
from bench_cli.core.task import EvalContext
from attnbench.tasks.lm.wikitext import EOS, IGNORE, UNK, TokenBlocks, build_dictionary, read_lines, tokenize_line

pytestmark = pytest.mark.usefixtures("single_thread")

# The real files' conventions: a space before every line, blank lines " ", headings " = T = " and
# " = = S = = ", @-@ / @,@ / @.@ joined tokens, <unk> for rare words.
TRAIN = (" \n"
         " = Valkyria Chronicles = \n"
         " \n"
         " The game is a role @-@ playing game . \n"
         " \n"
         " = = Gameplay = = \n"
         " \n"
         " The <unk> sold 3 @,@ 000 copies in 1 @.@ 5 years . \n")
VALID = " \n = Plot = \n \n The game is <unk> . \n"
TEST = " \n The sequel sold 3 @,@ 000 . \n \n"
SPLITS = {"train": TRAIN, "valid": VALID, "test": TEST}


def write_wikitext(folder, texts=SPLITS):
    folder.mkdir(parents=True, exist_ok=True)
    for split, text in texts.items():
        (folder / f"wiki.{split}.tokens").write_text(text, encoding="utf-8")
    return folder


def test_tokenisation_and_dictionary_as_fairseq_preprocess(tmp_path):
    folder = write_wikitext(tmp_path / "wt")
    lines = read_lines(folder / "wiki.train.tokens")
    assert len(lines) == 8 and tokenize_line(lines[0]) == [] and tokenize_line(lines[3])[4:7] == ["role", "@-@", "playing"]
    d = build_dictionary(lines)
    # counted by hand: The 2, game 2, = 6, . 2, @-@ 1, @,@ 1, @.@ 1, ... (<unk> is the special)
    words_by_count = ["=", ".", "The", "game", "000", "1", "3", "5", "@,@", "@-@", "@.@", "Chronicles", "Gameplay",
                      "Valkyria", "a", "copies", "in", "is", "playing", "role", "sold", "years"]
    assert d.symbols[:4] == ["<s>", "<pad>", "</s>", "<unk>"]
    assert d.symbols[4:4 + len(words_by_count)] == words_by_count  # count desc, ties in code-point order
    assert len(d) == 32 and d.symbols[-6:] == [f"madeupword{i:04d}" for i in range(6)]  # 26 -> multiple of 8
    test = d.encode(read_lines(folder / "wiki.test.tokens"))
    # 3 lines (2 blank) -> 3 </s>; 7 words; 'sequel' is not in train -> <unk>
    assert len(test) == 10 and list(test[:3]) == [EOS, d.index["The"], UNK] and test[-1] == EOS
    assert list(d.encode(read_lines(folder / "wiki.valid.tokens"))).count(UNK) == 2  # 'Plot' and '<unk>'
    train = d.encode(lines)
    assert len(train) == 31 + 8 and int((train == EOS).sum()) == 8  # 31 words, 8 lines


def test_blocks_shift_inputs_by_one_with_eos_first():
    stream = torch.arange(10, 20, dtype=torch.int32)
    blocks = TokenBlocks(stream, 4)
    assert len(blocks) == 3
    first, second, last = blocks[0], blocks[1], blocks[2]
    assert first["x"].tolist() == [EOS, 10, 11, 12] and first["y"].tolist() == [10, 11, 12, 13]
    assert second["x"].tolist() == [13, 14, 15, 16] and second["y"].tolist() == [14, 15, 16, 17]
    assert last["x"].tolist() == [17, 18] and last["y"].tolist() == [18, 19]  # the short last block


def test_sliding_window_scores_every_token_once_with_fairseq_context():
    n, block, context = 23, 3, 5
    stream = torch.arange(100, 100 + n, dtype=torch.int32)
    windows = TokenBlocks(stream, block, context)
    scored = []
    for k in range(len(windows)):
        item = windows[k]
        y, x = item["y"], item["x"]
        keep = (y != IGNORE).nonzero().flatten()
        assert len(x) == len(y) <= block + context
        for j in keep.tolist():
            i = int(y[j]) - 100  # stream position of the scored target
            scored.append(i)
            assert j == min(i, context + i % block)  # context of the token: up to 5 + its offset in the block
            assert x[j].item() == (EOS if i == 0 else 100 + i - 1)  # input = the previous token
    assert sorted(scored) == list(range(n))  # each token exactly once


def tiny_lm_task(tmp_path, extra=()):
    write_wikitext(tmp_path / "data" / "wikitext" / "fixture")
    cfg = compose(["task=lm", "task.dataset=fixture", "task.backbone.d_model=16", "task.backbone.d_ff=32",
                   "task.backbone.n_layers=2", "task.backbone.n_heads=2", "task.tokens_per_sample=8",
                   "task.context_window=5", *extra])
    task = task_class("lm")(cfg.task, tmp_path / "data")
    task.setup("holdout")
    return cfg, task


def test_evaluator_matches_scoring_each_token_on_its_own_context(tmp_path):
    from bench_cli.engine.trainer import Trainer

    cfg, task = tiny_lm_task(tmp_path)
    torch.manual_seed(0)
    model = task.build_model(cfg.model).eval()
    trainer = Trainer(cfg.trainer.copy(), task, model, torch.device("cpu"), seed=0)
    trainer.cfg.eval_batch_size = 3  # several windows per batch, the last one padded
    reduced = []  # a distributed run sums the statistics over its processes through ctx.reduce
    result = task.evaluate(model, "test", EvalContext(loader=lambda s: trainer.loader(s, train=False), device=torch.device("cpu"),
                                                      reduce=lambda stats: reduced.append(dict(stats)) or stats))
    assert len(reduced) == 1 and reduced[0]
    test = task.splits["test"]
    stream, nll = test.stream, []
    with torch.no_grad():
        for i in range(len(stream)):  # brute force: token i alone, on exactly the context the evaluator gives it
            k = i // test.block
            a = max(0, k * test.block - test.context)
            x = torch.cat([torch.tensor([EOS]), stream[:-1].long()])[a:i + 1]
            logp = torch.log_softmax(model(x[None])[0, -1], -1)
            nll.append(-logp[stream[i].long()].item())
    assert result["loss"] == pytest.approx(sum(nll) / len(nll), rel=1e-5)
    assert result["perplexity"] == pytest.approx(math.exp(sum(nll) / len(nll)), rel=1e-5)


@pytest.mark.parametrize("model", causal_models(2))
def test_every_causal_variant_is_causal_in_the_lm(model, tmp_path):
    cfg = causal_config(("task=lm", "task.backbone.d_model=16", "task.backbone.d_ff=32", "task.backbone.n_layers=2",
                         "task.backbone.n_heads=2", "task.tokens_per_sample=12"), model, "wikitext103")
    task = task_class("lm")(cfg.task, tmp_path)
    task.setup_synthetic(12)
    torch.manual_seed(0)
    net = task.build_model(cfg.model).eval()
    x = torch.randint(4, 64, (2, 12))
    y = x.clone()
    y[:, 7:] = torch.randint(4, 64, (2, 5))
    with torch.no_grad():
        a, b = net(x), net(y)
    assert torch.allclose(a[:, :7], b[:, :7], atol=1e-5), "a later token changed an earlier output"
    assert not torch.allclose(a[:, 7:], b[:, 7:])


def test_non_causal_variants_are_refused_in_one_line(workdir, capsys):
    with pytest.raises(SystemExit) as e:
        main(["run", "task=lm", "model=linear_bn"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "linear_bn cannot be the causal self-attention (layers 1-6 of 6)" in err and len(err.splitlines()) <= 2
    write_wikitext(workdir / "data" / "wikitext" / "fixture")
    with pytest.raises(SystemExit):  # the preset's data-dependent Primal-Attention cannot be causal (Listing 1)
        main(["run", "task=lm", "task.dataset=fixture", "model=primal_plus"])
    assert "causal Primal-Attention needs data_dependent=false" in capsys.readouterr().err


def test_inverse_sqrt_schedule_as_fairseq():
    from bench_cli.engine.optim import make_scheduler
    from omegaconf import OmegaConf

    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.AdamW([p], lr=1e-3)
    sched = make_scheduler(opt, OmegaConf.create({"name": "inverse_sqrt", "warmup_steps": 4, "warmup_init_lr": 1e-7}), 100, 10)
    lrs = []
    for _ in range(9):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    step = (1e-3 - 1e-7) / 4  # fairseq: warmup_init_lr + n * lr_step, then lr * sqrt(warmup / n)
    expected = [1e-7 + n * step for n in range(4)] + [1e-3 * math.sqrt(4 / n) for n in range(4, 9)]
    assert lrs == pytest.approx(expected, rel=1e-9)


def test_published_facts_are_checked_for_wikitext103(tmp_path):
    write_wikitext(tmp_path / "wikitext" / "wikitext-103")  # the fixture under the real name
    cfg = compose(["task=lm"])
    task = task_class("lm")(cfg.task, tmp_path)
    with pytest.raises(UserError, match="267,744 and 245,569"):
        task.setup("holdout")


# One sentence over and over: with a few tokens of context every next token is certain, so a model
# that learns ends far below the unigram perplexity (what word frequencies alone give).
SENTENCE = " The game is a role @-@ playing game made in Japan . \n"
PREDICTABLE = {"train": SENTENCE * 40, "valid": SENTENCE * 4, "test": SENTENCE * 4}


def unigram_perplexity(train: str, test: str) -> float:
    """exp of the mean NLL of the test tokens (words and one </s> per line) under the training
    split's token frequencies."""
    from collections import Counter

    tokens = lambda text: [t for line in text.splitlines() for t in [*line.split(), "</s>"]]  # noqa: E731
    counts = Counter(tokens(train))
    total = sum(counts.values())
    scored = tokens(test)
    return math.exp(-sum(math.log(counts[t] / total) for t in scored) / len(scored))


def test_tiny_lm_run_learns_a_predictable_corpus_and_records_perplexity(workdir):
    write_wikitext(workdir / "data" / "wikitext" / "fixture", PREDICTABLE)
    main(["run", "task=lm", "task.dataset=fixture", "model=primal_plus", "+per_dataset.data_dependent.primal_plus.fixture=false",
          "+per_dataset.low_rank.primal_plus.fixture=4", "task.backbone.d_model=16", "task.backbone.d_ff=32",
          "task.backbone.n_layers=2", "task.backbone.n_heads=2", "task.backbone.dropout=0", "task.tokens_per_sample=8",
          "task.context_window=5", "trainer.max_steps=60", "trainer.eval_every_steps=15", "trainer.batch_size=8",
          "trainer.micro_batch_size=4", "trainer.optimizer.lr=1e-2", "trainer.scheduler.warmup_steps=2", "seed=0",
          "trainer.progress=false", "results.path=res.csv", "measure.flops=false", "measure.memory=false"])
    row = read_records("res.csv")[-1]
    assert row["status"] == "ok" and row["metric"] == "perplexity" and row["higher_is_better"] == "False"
    assert float(row["test_perplexity"]) == float(row["test_score"]) == pytest.approx(math.exp(float(row["test_loss"])))
    assert row["attention"] == "softmax"
    losses = [h["train_loss"] for h in json.loads(row["metrics_json"])["history"]]
    unigram = unigram_perplexity(PREDICTABLE["train"], PREDICTABLE["test"])  # 11.7; the vocabulary: 16 ids
    assert float(row["test_perplexity"]) < 0.25 * unigram, (row["test_perplexity"], unigram)
    assert len(losses) == 4 and losses[-1] < 0.5 * losses[0], losses


def test_an_empty_token_file_is_one_line_naming_it(workdir, capsys):
    folder = write_wikitext(workdir / "data" / "wikitext" / "fixture")
    (folder / "wiki.train.tokens").write_text("")
    with pytest.raises(SystemExit) as e:
        main(["run", "task=lm", "task.dataset=fixture", "trainer.max_steps=1", "trainer.progress=false",
              "results.path=res.csv"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert e.value.code == 2 and "wiki.train.tokens is empty" in err and "attnbench data wikitext" in err
