"""UEA loader and preprocessing on `.ts` files written in the real format."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from bench_cli.core.errors import DataNotFoundError, UserError
from attnbench.tasks.uea import UEAClassification, UEAFetcher, interpolate_missing, read_ts, stratified_split


def task_cfg(dataset="Fixture", **kw):
    cfg = {"name": "uea", "dataset": dataset, "protocol": "holdout", "val_fraction": 0.25, "split_seed": 0,
           "max_len": None, "backbone": {}}
    cfg.update(kw)
    return OmegaConf.create(cfg)


def test_read_ts_keeps_missing_values_and_unequal_lengths(uea_fixture):
    series, labels = read_ts(uea_fixture / "Fixture_TRAIN.ts")
    assert len(series) == 40 and set(labels) == {"up", "down"}
    lengths = {len(s) for s in series}
    assert len(lengths) > 1 and min(lengths) >= 5 and max(lengths) <= 9
    assert all(s.shape[1] == 3 for s in series)
    assert sum(np.isnan(s).sum() for s in series) > 0


def test_interpolate_missing_is_linear_inside_and_constant_at_ends():
    x = np.array([[np.nan, 1.0], [2.0, np.nan], [np.nan, 3.0], [4.0, np.nan]])
    out = interpolate_missing(x)
    np.testing.assert_allclose(out[:, 0], [2.0, 2.0, 3.0, 4.0])
    np.testing.assert_allclose(out[:, 1], [1.0, 2.0, 3.0, 3.0])
    assert (interpolate_missing(np.full((3, 1), np.nan)) == 0).all()


def test_stratified_split_keeps_class_proportions():
    labels = np.array([0] * 20 + [1] * 10)
    fit, val = stratified_split(labels, 0.2, seed=0)
    assert sorted(np.concatenate([fit, val]).tolist()) == list(range(30))
    assert (labels[val] == 0).sum() == 4 and (labels[val] == 1).sum() == 2


def test_setup_standardises_with_train_statistics_and_pads_with_mask(uea_fixture):
    task = UEAClassification(task_cfg(), uea_fixture.parents[1])
    task.setup("holdout")
    train, val, test = (task.splits[k] for k in ("train", "val", "test"))
    assert len(train) == 30 and len(val) == 10 and len(test) == 20
    x, mask = train.tensors["x"], train.tensors["mask"]
    assert x.shape == (30, task.max_len, 3) and task.max_len == 9
    real = x[mask]  # statistics of the training split: mean 0, std 1 per channel on real steps
    torch.testing.assert_close(real.mean(0), torch.zeros(3), atol=1e-5, rtol=0)
    torch.testing.assert_close(real.std(0, unbiased=False), torch.ones(3), atol=1e-4, rtol=0)
    assert (x[~mask] == 0).all() and not torch.isnan(x).any()
    assert mask.sum(1).min() >= 5
    assert set(task.splits["test"].tensors["y"].tolist()) == {0, 1}


def test_paper_protocol_trains_on_all_of_train_and_max_len_truncates(uea_fixture):
    task = UEAClassification(task_cfg(max_len=6, protocol="paper"), uea_fixture.parents[1])
    task.setup("paper")
    assert "val" not in task.splits and len(task.splits["train"]) == 40
    assert task.splits["test"].tensors["x"].shape[1] == 6


def test_packaged_datasets_are_found_without_data_root(tmp_path):
    task = UEAClassification(task_cfg("JapaneseVowels"), tmp_path)
    task.check_data()
    assert UEAFetcher().status("JapaneseVowels", tmp_path) == "package"
    assert UEAFetcher().status("BasicMotions", tmp_path) == "package"


def test_missing_and_unknown_datasets_are_one_line_errors(tmp_path):
    with pytest.raises(DataNotFoundError) as e:
        UEAClassification(task_cfg("EthanolConcentration"), tmp_path).check_data()
    msg = str(e.value)
    assert "\n" not in msg and str(tmp_path / "uea" / "EthanolConcentration") in msg
    assert "attnbench data uea EthanolConcentration" in msg
    with pytest.raises(UserError, match="did you mean 'JapaneseVowels'"):
        UEAClassification(task_cfg("JapaneseVowel"), tmp_path).check_data()


def test_data_command_copies_packaged_dataset(workdir):
    from bench_cli.commands.cli import main

    main(["data", "uea", "BasicMotions"])
    d = workdir / "data" / "uea" / "BasicMotions"
    assert (d / "BasicMotions_TRAIN.ts").is_file() and (d / "BasicMotions_TEST.ts").is_file()
    assert UEAFetcher().status("BasicMotions", workdir / "data") == "local"


def test_download_unpacks_zip_and_records_checksum(uea_fixture, tmp_path, monkeypatch):
    """The download path end to end, with the archive's zip served from a file:// URL."""
    import hashlib
    import zipfile

    import attnbench.tasks.uea as uea

    served = tmp_path / "served"
    served.mkdir()
    zpath = served / "Cricket.zip"
    with zipfile.ZipFile(zpath, "w") as z:  # the archive's zips hold the two .ts files
        for split in ("TRAIN", "TEST"):
            z.write(uea_fixture / f"Fixture_{split}.ts", f"Cricket_{split}.ts")
    monkeypatch.setattr(uea, "UEA_URL", served.as_uri() + "/{name}.zip")
    root = tmp_path / "root"
    target = uea.UEAFetcher().fetch("Cricket", root)
    assert (target / "Cricket_TRAIN.ts").is_file() and (target / "Cricket_TEST.ts").is_file()
    digest = hashlib.sha256(zpath.read_bytes()).hexdigest()
    assert (target / "SHA256SUMS").read_text() == f"{digest}  Cricket.zip\n"
    assert uea.UEAFetcher().status("Cricket", root) == "local"


def test_download_without_network_is_one_line(tmp_path, monkeypatch):
    import attnbench.tasks.uea as uea

    monkeypatch.setattr(uea, "UEA_URL", (tmp_path / "nowhere").as_uri() + "/{name}.zip")
    with pytest.raises(DataNotFoundError) as e:
        uea.UEAFetcher().fetch("Cricket", tmp_path / "root")
    msg = str(e.value)
    assert "\n" not in msg and "cannot download" in msg and str(tmp_path / "root" / "uea" / "Cricket") in msg
    assert not (tmp_path / "root" / "uea" / "Cricket").exists()  # no empty folder left behind


def test_bad_ts_files_are_one_line_naming_the_file(uea_fixture, workdir, capsys):
    """A TRAIN file without labels, and TEST series with other channels than TRAIN's: one line each
    that names the file(s) and what is wrong (exit 2), never sktime's internals or a traceback."""
    from bench_cli.commands.cli import main
    from conftest import write_ts

    run = ["run", "task.dataset=Fixture", "trainer.max_epochs=1", "trainer.progress=false", "results.path=r.csv"]
    train = uea_fixture / "Fixture_TRAIN.ts"
    good = train.read_text()
    lines = [line for line in good.splitlines() if not line.startswith("@classLabel")]
    train.write_text("\n".join(line.rsplit(":", 1)[0] if line and line[0] not in "#@" else line for line in
                               [*lines[:7], "@classLabel false", *lines[7:]]) + "\n")
    with pytest.raises(SystemExit) as e:
        main(run)
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1, err
    assert "Fixture_TRAIN.ts has no labels" in err and "Traceback" not in err
    train.write_text(good)
    rng = np.random.RandomState(0)
    write_ts(uea_fixture / "Fixture_TEST.ts", [rng.randn(6, 2) for _ in range(4)], ["up", "down"] * 2,
             ["down", "up"], missing=False)
    with pytest.raises(SystemExit) as e:
        main(run)
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1, err
    assert "3 channel(s) in Fixture_TRAIN.ts but 2 in Fixture_TEST.ts" in err
