"""The package list, which pyproject.toml cannot state: the repository's models/, tasks/ and conf/
folders are installed under attnbench (attnbench.models, attnbench.tasks, attnbench.conf), so that
no top-level ``models`` or ``tasks`` collides with a research project's own folders. Everything
else about the project is in pyproject.toml."""
from setuptools import find_namespace_packages, setup

UNDER_ATTNBENCH = ("models", "tasks", "conf")  # folders of the repository installed as attnbench.<folder>
EXCLUDE = ["*.__pycache__", "*.__pycache__.*"]

packages = find_namespace_packages(include=["bench_cli", "bench_cli.*", "attnbench"], exclude=EXCLUDE)
for folder in UNDER_ATTNBENCH:
    packages += [f"attnbench.{name}" for name in
                 find_namespace_packages(include=[folder, f"{folder}.*"], exclude=EXCLUDE)]

setup(packages=packages, package_dir={f"attnbench.{folder}": folder for folder in UNDER_ATTNBENCH})
