"""Checked readers of profile settings, shared by the profile config and the pay-better-attention
reproduction (bench_cli/commands/reproduce/pba.py) without either importing the other."""
from __future__ import annotations

from omegaconf import DictConfig, ListConfig, OmegaConf

from bench_cli.config.omegaconf_private import full_key
from bench_cli.core.errors import UserError


def int_list(p: DictConfig, key: str, *, allow_null: bool = False, minimum: int = 1) -> list[int] | None:
    """``p[key]`` as a non-empty list of integers >= minimum (a single integer is a list of one)."""
    value = p.get(key)
    where = full_key(p, key)
    if value is None and allow_null:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, (list, ListConfig)) or not value or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= minimum for v in value):
        raise UserError(f"{where} must be a non-empty list of integers >= {minimum}"
                        f"{' or null' if allow_null else ''}, got {_show(value)}")
    return [int(v) for v in value]


def _show(value) -> str:
    return str(OmegaConf.to_container(value) if OmegaConf.is_config(value) else value)
