"""Where configs are looked up: conf/ (shipped as a package), the root config of --config-path,
the folders of --config-dir and of ``hydra.searchpath``, in the order Hydra searches them.

The folders are set once per process by the CLI (``set_config_path``, ``add_config_dir``) and by
the overrides a command checks (``note_searchpath``); every composition, listing and check of the
process then sees the same folders (Hydra's search path is built from them: hydra_private.py)."""
from __future__ import annotations

import os
from pathlib import Path

from bench_cli.core.errors import UserError

CONFIG_NAME = "config"

# User config folders (a plugin's model/*.yaml, experiments), searched after conf/ as Hydra
# searches them: those of --config-dir, then those of hydra.searchpath (conf/ wins a name both have).
_CONFIG_DIRS: list[Path] = []
_SEARCHPATH_DIRS: list[Path] = []
# --config-path: a folder whose config.yaml is the root config instead of conf/'s; conf/ is
# searched right after it, so its groups stay available (Hydra alone would drop them).
_CONFIG_PATH: list[Path] = []


def conf_dir() -> Path:
    import attnbench.conf as conf

    return Path(conf.__file__).parent


def set_config_path(path: str | os.PathLike) -> Path:
    """The --config-path of every command that composes: the root config is DIR/config.yaml."""
    folder = Path(path).expanduser().resolve()
    if not (folder / f"{CONFIG_NAME}.yaml").is_file():
        raise UserError(f"--config-path {path}: no {CONFIG_NAME}.yaml there (--config-path replaces the root "
                        f"config, conf/{CONFIG_NAME}.yaml; to add your own model/*.yaml or experiments use "
                        f"--config-dir {path})")
    _CONFIG_PATH[:] = [folder]
    return folder


def config_path() -> Path | None:
    """The folder --config-path named, if any."""
    return _CONFIG_PATH[0] if _CONFIG_PATH else None


def root_dir() -> Path:
    """The folder of the root config: --config-path's, else conf/."""
    return _CONFIG_PATH[0] if _CONFIG_PATH else conf_dir()


def primary_path() -> str:
    """The primary config folder as Hydra names it."""
    return str(_CONFIG_PATH[0]) if _CONFIG_PATH else "pkg://attnbench.conf"  # absolute: Hydra takes it as a folder


def add_config_dir(path: str | os.PathLike) -> Path:
    """A folder of configs searched in every composition of this process (the --config-dir of
    every command that composes)."""
    folder = Path(path).expanduser().resolve()
    if not folder.is_dir():
        raise UserError(f"--config-dir {path}: no such directory")
    if folder not in _CONFIG_DIRS:
        _CONFIG_DIRS.append(folder)
    return folder


def user_config_dirs() -> list[Path]:
    """The --config-dir folders, in the order they were given."""
    return list(_CONFIG_DIRS)


def config_dirs() -> list[Path]:
    """Where options are looked up, in Hydra's order: --config-path, conf/, --config-dir folders,
    hydra.searchpath."""
    return [*_CONFIG_PATH, conf_dir(), *_CONFIG_DIRS, *_SEARCHPATH_DIRS]


def note_searchpath(overrides: list[str]) -> None:
    """Folders of a ``hydra.searchpath=[file://DIR,...]`` override (Hydra composes with them
    itself), so option listings and checks see their options too."""
    for o in overrides:
        key, _, value = o.partition("=")
        if key.lstrip("+~") != "hydra.searchpath" or not value:
            continue
        for entry in value.strip("[]").split(","):
            entry = entry.strip().strip("'\"")
            if entry.startswith("pkg://") or not entry:
                continue
            folder = Path(entry.removeprefix("file://")).expanduser().resolve()
            if folder.is_dir() and folder not in _SEARCHPATH_DIRS:
                _SEARCHPATH_DIRS.append(folder)
