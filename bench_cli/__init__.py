"""attnbench: CLI, config composition, training, measurement, records and reports."""
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("attnbench")
except PackageNotFoundError:  # running from a source tree without install
    __version__ = "0.0.0+src"
