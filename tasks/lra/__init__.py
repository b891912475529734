"""Long Range Arena (Tay et al. 2021): `task=lra_listops|lra_text|lra_retrieval|lra_image|lra_pathfinder`
(tasks.lra.tasks), their data in the official formats and the LRA input pipelines (tasks.lra.data),
the fetchers of `attnbench data lra|lra_listops|lra_text|lra_image` (tasks.lra.fetchers) and the
offline ListOps generator (tasks.lra.listops_generator)."""
from attnbench.tasks.lra import fetchers, tasks  # noqa: F401  (register the fetchers and the tasks)
from attnbench.tasks.lra.data import (  # noqa: F401
    LISTOPS_TOKENS, encode_bytes, encode_listops, listops_tokens, listops_vocab, read_aan_tsv, read_listops_tsv,
    rgb_to_gray,
)
from attnbench.tasks.lra.tasks import LRAImage, LRAListOps, LRAPathfinder, LRARetrieval, LRAText  # noqa: F401
