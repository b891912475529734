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
bin=$venv/bin
# The venv is made without pip and uv put into it by the interpreter's own pip (`pip --python`,
# pip >= 22.3): ensurepip's copy of pip into a new venv was 5 s of the 12 s install; uv then adds
# pip from its cache. Where that fails, the venv gets pip from ensurepip and installs uv with it.
# -qq: errors only (the machines' pip config lists local indexes that warn once per package)
"$python" -m venv --without-pip "$venv"
pip_python=$python  # the interpreter whose pip reads pip's configuration (tools/pip_sources.py)
if ! "$python" -m pip --python "$bin/python" install -qq uv 2>/dev/null; then
  pip_python=$bin/python
  "$bin/python" -m ensurepip --default-pip >/dev/null && "$bin/pip" install -qq uv 2>/dev/null || true
fi
if [ -x "$bin/uv" ]; then
  eval "$("$pip_python" tools/pip_sources.py)"
  set -x
  "$bin/uv" pip install -q --python "$bin/python" torch==2.13.0
  "$bin/uv" pip install -q --python "$bin/python" -c constraints.txt -e "$extras" pip
else
  echo "uv could not be installed: installing with pip"
  [ -x "$bin/pip" ] || "$bin/python" -m ensurepip --default-pip >/dev/null
  set -x
  "$bin/pip" install -qq --no-compile torch==2.13.0
  "$bin/pip" install -qq --no-compile -c constraints.txt -e "$extras"
fi
