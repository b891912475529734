"""UEA multivariate time-series classification archive (Bagnall et al. 2018), `task=uea`.

Data: ``<data root>/uea/<Name>/<Name>_{TRAIN,TEST}.ts``; JapaneseVowels and BasicMotions ship
inside sktime and are used from there when the data root lacks them; ``attnbench data uea NAME``
copies those or downloads the archive's zip. Preprocessing and backbone are mvts_transformer's
(Zerveas et al. 2021), which the primal-dual paper used (tasks/timeseries.py).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from bench_cli.core.errors import UserError
from attnbench.tasks import register_task
from bench_cli.core.fetch import register_fetcher
from attnbench.tasks.timeseries import TimeSeriesTask, TsArchiveFetcher, interpolate_missing, read_ts  # noqa: F401
from attnbench.tasks.data import stratified_split  # noqa: F401  (re-exported: the UEA split)

UEA_DATASETS = (
    "ArticularyWordRecognition", "AtrialFibrillation", "BasicMotions", "CharacterTrajectories",
    "Cricket", "DuckDuckGeese", "EigenWorms", "Epilepsy", "ERing", "EthanolConcentration",
    "FaceDetection", "FingerMovements", "HandMovementDirection", "Handwriting", "Heartbeat",
    "InsectWingbeat", "JapaneseVowels", "Libras", "LSST", "MotorImagery", "NATOPS", "PEMS-SF",
    "PenDigits", "PhonemeSpectra", "RacketSports", "SelfRegulationSCP1", "SelfRegulationSCP2",
    "SpokenArabicDigits", "StandWalkJump", "UWaveGestureLibrary",
)
# The archive's per-dataset zips (the mirror sktime uses); each holds <Name>_TRAIN.ts and _TEST.ts.
UEA_URL = "https://timeseriesclassification.com/aeon-toolkit/{name}.zip"


@register_fetcher
class UEAFetcher(TsArchiveFetcher):
    name = "uea"
    summary = "UEA multivariate classification archive (.ts), 30 datasets"
    archive = "uea"
    known = UEA_DATASETS
    what = "UEA"

    def urls(self, name: str) -> list[tuple[str, str]]:
        return [(UEA_URL.format(name=name), "zip")]


@register_task
class UEAClassification(TimeSeriesTask):
    name = "uea"
    fetcher = "uea"
    stratify = True
    synthetic_outputs = ("classes", 9)

    def targets(self, train_labels, test_labels, test_path: Path):
        self.classes = sorted(set(train_labels))
        unseen = sorted(set(test_labels) - set(self.classes))
        if unseen:
            raise UserError(f"{test_path} has labels absent from TRAIN: {unseen}")
        to_index = {c: i for i, c in enumerate(self.classes)}
        self.n_outputs = len(self.classes)
        return (np.array([to_index[c] for c in train_labels]), np.array([to_index[c] for c in test_labels]))

    def target_tensor(self, values: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(values, dtype=torch.long)

    def synthetic_targets(self, batch_size: int, g: torch.Generator) -> torch.Tensor:
        return torch.randint(0, self.n_outputs, (batch_size,), generator=g)

    @property
    def n_classes(self) -> int:
        return self.n_outputs

    def describe(self) -> dict:
        return {**super().describe(), "classes": self.n_outputs}
