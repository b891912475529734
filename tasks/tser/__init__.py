"""Time-series extrinsic regression (Tan et al. 2020: the Monash/UEA/UCR TSER archive), `task=tser`.

Data: ``<data root>/tser/<Name>/<Name>_{TRAIN,TEST}.ts`` (``@targetLabel true``: one float target
per series). Covid3Month and Tecator ship inside sktime and are used from there when the data
root lacks them; ``attnbench data tser NAME`` copies those, or downloads the archive's files
from Zenodo (the archive's home, tseregression.org -> zenodo.org/record/3902651, one record per
dataset) with their sha256 recorded beside them.

Preprocessing as mvts_transformer's `tsra` data class with ``--task regression`` (Zerveas et al.
2021, the code primal-dual Table 8 followed): missing values linearly interpolated per series,
features standardised with TRAIN statistics, **targets not scaled** (the RMSE is on the raw
scale), series padded with a mask to the longest TRAIN series. Model: the UEA encoder with
mvts_transformer's regression head (flattened output -> linear -> 1), MSE loss, RMSE reported.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from bench_cli.core.metrics import MAE, MSE, RMSE
from bench_cli.core.errors import UserError
from attnbench.tasks import register_task
from bench_cli.core.fetch import register_fetcher
from attnbench.tasks.timeseries import TimeSeriesTask, TsArchiveFetcher

# The Monash TSER archive (19 sets) with the Zenodo record of each (as listed by the archive and
# by aeon's loader). Names as the archive spells them; primal-dual Table 8 shortens
# BeijingPM10Quality, BeijingPM25Quality and LiveFuelMoistureContent.
ZENODO_RECORDS = {
    "AppliancesEnergy": 3902637, "AustraliaRainfall": 3902654, "BeijingPM10Quality": 3902667,
    "BeijingPM25Quality": 3902671, "BenzeneConcentration": 3902673, "BIDMC32HR": 4001456,
    "BIDMC32RR": 4001463, "BIDMC32SpO2": 4001464, "Covid3Month": 3902690, "FloodModeling1": 3902694,
    "FloodModeling2": 3902696, "FloodModeling3": 3902698, "HouseholdPowerConsumption1": 3902704,
    "HouseholdPowerConsumption2": 3902706, "IEEEPPG": 3902710, "LiveFuelMoistureContent": 4632439,
    "NewsHeadlineSentiment": 3902718, "NewsTitleSentiment": 3902726, "PPGDalia": 3902728,
}
ZENODO_URL = "https://zenodo.org/record/{record}/files/{name}_{split}.ts?download=1"
# Sets of the expanded archive (Guijo-Rubio et al. 2023) that are not on Zenodo, e.g. Tecator:
# the archive's zips on timeseriesclassification.com (aeon's mirror).
ARCHIVE_ZIP_URL = "https://timeseriesclassification.com/aeon-toolkit/{name}.zip"
TSER_DATASETS = tuple(sorted([*ZENODO_RECORDS, "Tecator"]))


@register_fetcher
class TSERFetcher(TsArchiveFetcher):
    name = "tser"
    summary = "Monash/UEA/UCR time-series extrinsic regression archive (.ts)"
    archive = "tser"
    known = TSER_DATASETS
    what = "TSER"

    def urls(self, name: str) -> list[tuple[str, str]]:
        if name in ZENODO_RECORDS:
            record = ZENODO_RECORDS[name]
            return [(ZENODO_URL.format(record=record, name=name, split=s), s) for s in ("TRAIN", "TEST")]
        return [(ARCHIVE_ZIP_URL.format(name=name), "zip")]


@register_task
class TSERRegression(TimeSeriesTask):
    """Regression of one float target per series; RMSE selects (lower is better)."""

    name = "tser"
    fetcher = "tser"
    metrics = (RMSE(), MAE(), MSE())
    selection = "rmse"

    def targets(self, train_labels, test_labels, test_path: Path):
        for labels, which in ((train_labels, "TRAIN"), (test_labels, "TEST")):
            if labels.dtype.kind != "f":
                raise UserError(f"{test_path.parent}: the {which} file's labels are not numbers; "
                                f"TSER needs `@targetLabel true` files (classification sets belong to task=uea)")
        self.n_outputs = 1
        return train_labels.astype(np.float64), test_labels.astype(np.float64)

    def target_tensor(self, values: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(values, dtype=torch.float32)

    def synthetic_targets(self, batch_size: int, g: torch.Generator) -> torch.Tensor:
        return torch.randn(batch_size, generator=g)

    def loss(self, output: torch.Tensor, batch: dict) -> torch.Tensor:
        return F.mse_loss(output.squeeze(-1), batch["y"])  # mvts_transformer: MSE on raw targets

    def sample_outputs(self, output: torch.Tensor, batch: dict) -> dict[str, torch.Tensor]:
        """Per sample: the prediction, the target and the squared error (the loss above, unreduced)."""
        prediction = output.squeeze(-1).float()
        return {"prediction": prediction, "target": batch["y"], "loss": (prediction - batch["y"]) ** 2}

    def describe(self) -> dict:
        out = super().describe()
        if self.splits:
            y = self.splits["train"].tensors["y"]
            out.update(target_mean=round(float(y.mean()), 6), target_std=round(float(y.std()), 6))
        return out
