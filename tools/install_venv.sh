#!/usr/bin/env bash
# `make install`'s steps: the venv at $1 with torch (this machine's CPU build, constraints.txt) and
# attnbench with every extra and the test tools ($2, e.g. '.[all,bench,test]').
# With uv where it installs: about a minute less than pip on the 2-core machine, because uv links
# files from its cache instead of unpacking every wheel again and compiles no bytecode (the first
# process to import a module writes it). uv reads none of pip's configuration, so it is pointed at
# the sources pip's own configuration names (tools/pip_sources.py: a find-links folder with the CPU
# torch, local indexes, a constraints file). Where uv cannot be installed, pip, without compiling
# every file at install.
set -euo pipefail
venv=$1 extras=$2
python=${PYTHON:-python3}
"$python" -m venv "$venv"
bin=$venv/bin
# -qq: errors only (the machines' pip config lists local indexes that warn once per package)
if "$bin/pip" install -qq uv 2>/dev/null && [ -x "$bin/uv" ]; then
  eval "$("$bin/python" tools/pip_sources.py)"
  set -x
  "$bin/uv" pip install -q --python "$bin/python" torch==2.13.0
  "$bin/uv" pip install -q --python "$bin/python" -c constraints.txt -e "$extras"
else
  echo "uv could not be installed: installing with pip"
  set -x
  "$bin/pip" install -qq --no-compile torch==2.13.0
  "$bin/pip" install -qq --no-compile -c constraints.txt -e "$extras"
fi
