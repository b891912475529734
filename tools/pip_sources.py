"""Print, as shell assignments, the package sources of pip's configuration in uv's terms.

`make install` installs with uv when it can (about a minute less than pip on the 2-core machine:
uv links files from its cache instead of unpacking every wheel again, and compiles no bytecode,
which the first process to import a module writes). uv reads none of pip's configuration, so a
machine whose pip is pointed at a local wheel folder, a mirror or a constraints file (a cluster's
pip.conf, this project's CI machines with their CPU torch in a find-links folder) would have uv
install from somewhere else: a CUDA torch of several GB from PyPI instead of the CPU build on disk.
This reads what pip itself would use (`pip config list`: the global, user and site files and the
PIP_* variables, in pip's order of precedence) and prints the UV_* variables that say the same:

    eval "$(python tools/pip_sources.py)"  # then: uv pip install ...

Every index counts alike, as in pip (uv's own default prefers the first index that has a package).
Only the settings that choose where packages come from are translated; any other pip setting is
left to pip.
"""
from __future__ import annotations

import shlex
import subprocess
import sys

# pip's key -> (uv's variable, how uv separates several values)
TRANSLATION = {
    "index-url": ("UV_DEFAULT_INDEX", None),
    "extra-index-url": ("UV_EXTRA_INDEX_URL", " "),
    "find-links": ("UV_FIND_LINKS", ","),
    "constraint": ("UV_CONSTRAINT", " "),
    "no-index": ("UV_NO_INDEX", None),
}
# pip's order of precedence, lowest first: a later scope's value replaces an earlier one's.
SCOPES = ("global", "install", ":env:")


def pip_settings(pip_config_list: str) -> dict[str, str]:
    """``key -> value`` from the lines of `pip config list` (``scope.key='value'``), the scope of
    highest precedence winning."""
    ranked: dict[str, tuple[int, str]] = {}
    for line in pip_config_list.splitlines():
        name, sep, quoted = line.partition("=")
        scope, dot, key = name.rpartition(".")
        if not sep or not dot or scope not in SCOPES:
            continue
        value = " ".join(shlex.split(quoted))
        rank = SCOPES.index(scope)
        if key not in ranked or rank >= ranked[key][0]:
            ranked[key] = (rank, value)
    return {key: value for key, (_, value) in ranked.items()}


def uv_environment(settings: dict[str, str]) -> dict[str, str]:
    """The UV_* variables that point uv at the sources ``settings`` points pip at."""
    env = {"UV_INDEX_STRATEGY": "unsafe-best-match"}
    for key, (variable, separator) in TRANSLATION.items():
        value = settings.get(key)
        if not value:
            continue
        if key == "no-index":
            if value.lower() in ("1", "true", "yes", "on"):
                env[variable] = "1"
            continue
        env[variable] = separator.join(value.split()) if separator else value
    return env


def main() -> int:
    listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True)
    for variable, value in uv_environment(pip_settings(listed.stdout)).items():
        print(f"export {variable}={shlex.quote(value)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
