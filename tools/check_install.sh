#!/usr/bin/env bash
# `make check-install`: docs/gpu.md's install beside a torch the environment already has, done for
# real in throwaway virtual environments with the newest pip and this machine's CPU torch
# (torch==2.13.0, which this machine's pip config finds on disk as 2.13.0+cpu: a build whose label
# no index at hand serves, as with a cluster's CUDA torch).
#   offline: keep-torch.txt and an inventory, a wheelhouse built online (PyPI alone), then
#            `pip install --no-index --find-links` in a network namespace without a network;
#   online:  `pip install -c keep-torch.txt` from PyPI alone;
# each first without torchvision, then again with the torchvision it installed. After each: torch is
# the very same installed files (a reinstall rewrites them: new inode, new RECORD), torchvision is
# 0.28.0 and, once there, not replaced, and `attnbench --help` and the extras import.
# Two controls show what the check would see fail: a constraint with a label the installed torch
# lacks (what the docs used to write from torch.__version__ on PyPI's CUDA torch) is refused
# offline, and online without the constraint pip would replace torch (the newest torchvision pins
# a newer one).
# Minutes and ~250 MB from PyPI; CHECK_INSTALL_DIR=folder keeps the environments there.
set -euo pipefail

PYTHON=${PYTHON:-python3}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
EXTRAS='.[vision,rl,text]'
TORCH=2.13.0
TORCHVISION=0.28.0  # the one PyPI has for torch 2.13.0 (it pins torch==2.13.0)
if [[ -n "${CHECK_INSTALL_DIR:-}" ]]; then
    WORK=$CHECK_INSTALL_DIR; mkdir -p "$WORK"
else
    WORK=$(mktemp -d /tmp/attnbench-check-install.XXXXXX); trap 'rm -rf "$WORK"' EXIT
fi
cd "$ROOT"

step() { printf '\n== %s\n' "$*"; }
fail() { echo "check-install: FAILED: $*" >&2; exit 1; }

# PyPI alone, as on a GPU machine or a login node: none of this machine's find-links, local indexes
# or constraints (its config and PIP_* variables).
pypi_only() { env -u PIP_FIND_LINKS -u PIP_INDEX_URL -u PIP_EXTRA_INDEX_URL -u PIP_CONSTRAINT PIP_CONFIG_FILE=/dev/null "$@"; }
# Offline: no index either, and no network at all where a network namespace can be made.
if unshare --net true 2>/dev/null; then NO_NET=(unshare --net); OFFLINE_HOW="a network namespace without a network"
elif unshare --map-root-user --net true 2>/dev/null; then NO_NET=(unshare --map-root-user --net); OFFLINE_HOW="a user and network namespace without a network"
else NO_NET=(); OFFLINE_HOW="--no-index only (no network namespace here)"; fi
offline() { pypi_only "${NO_NET[@]}" "$@"; }

quietly() {  # a pip command: its errors and warnings shown, all of it when it fails
    local log="$WORK/pip.log"
    "$@" > "$log" 2>&1 || { tail -40 "$log"; fail "$*"; }
    grep -E "^(ERROR|WARNING)" "$log" | grep -v "is ignored" || true
}

new_env() {  # $1: a venv with the newest pip and this machine's torch (its pip config finds the CPU build)
    "$PYTHON" -m venv "$1"
    quietly "$1/bin/pip" install --upgrade pip
    quietly "$1/bin/pip" install "torch==$TORCH"
    echo "$1: $("$1/bin/pip" --version | cut -d' ' -f1-2), torch $("$1/bin/python" -c 'import importlib.metadata as m; print(m.version("torch"))')"
}

fingerprint() {  # $1: venv, $2: distribution: version, its RECORD's hash, its __init__.py's inode and mtime
    "$1/bin/python" - "$2" <<'EOF'
import hashlib, importlib.metadata as m, os, sys
try:
    d = m.distribution(sys.argv[1])
except m.PackageNotFoundError:
    print("absent"); sys.exit()
record = next(f for f in d.files if f.name == "RECORD")
init = os.stat(d.locate_file(f"{sys.argv[1]}/__init__.py"))
print(d.version, hashlib.sha256(d.locate_file(record).read_bytes()).hexdigest()[:16], init.st_ino, init.st_mtime_ns)
EOF
}

keep() {  # $1: venv: writes $WORK/keep-torch.txt as docs/gpu.md does, shows it, checks it has no label
    "$1/bin/python" tools/keep_torch.py > "$WORK/keep-torch.txt"
    echo "keep-torch.txt: $(tr '\n' ' ' < "$WORK/keep-torch.txt")"
    grep -qx "torch==$TORCH" "$WORK/keep-torch.txt" || fail "keep-torch.txt does not say torch==$TORCH"
    ! grep -q '+' "$WORK/keep-torch.txt" || fail "keep-torch.txt names a local label"
}

verify() {  # $1: venv, $2: torch's fingerprint before, $3: torchvision's before ("absent": may be installed now)
    local torch vision
    torch=$(fingerprint "$1" torch); vision=$(fingerprint "$1" torchvision)
    echo "torch:       $torch"; echo "torchvision: $vision"
    [[ "$torch" == "$2" ]] || fail "torch changed: was '$2'"
    [[ "$torch" == "$TORCH+cpu "* ]] || fail "torch is not $TORCH+cpu"
    [[ "$vision" == "$TORCHVISION "* ]] || fail "torchvision is not $TORCHVISION"
    [[ "$3" == absent || "$vision" == "$3" ]] || fail "torchvision was replaced: was '$3'"
    (cd "$WORK" && "$1/bin/attnbench" --help > attnbench-help.txt) || fail "attnbench --help failed"
    echo "attnbench --help: $(head -1 "$WORK/attnbench-help.txt")"
    # torchvision and timm through attnbench's shim: PyPI's torchvision 0.28.0 is a CUDA build, whose
    # ops do not load over the CPU torch (tasks/vision/torchvision_shim.py says why that is harmless).
    "$1/bin/python" -c "import bench_cli.commands.cli, mlxtend, h5py, gymnasium, mujoco, datasets, sacrebleu
from tasks.vision.torchvision_shim import import_timm, import_torchvision
import_torchvision(); import_timm()" || fail "an extra does not import"
    echo "imports: bench_cli, torchvision and timm (through attnbench's shim), mlxtend, h5py, gymnasium, mujoco, datasets, sacrebleu"
}

SECONDS=0
step "offline: a venv with torch $TORCH (CPU build), no torchvision"
new_env "$WORK/offline"
torch_before=$(fingerprint "$WORK/offline" torch)
echo "torch:       $torch_before"
keep "$WORK/offline"
"$WORK/offline/bin/python" tools/wheelhouse.py inventory > "$WORK/compute-node.json"

step "offline: the wheelhouse, built online from PyPI alone (as on a login node)"
pypi_only "$WORK/offline/bin/python" tools/wheelhouse.py build "$WORK/compute-node.json" -d "$WORK/wheelhouse" \
    -c "$WORK/keep-torch.txt" "$EXTRAS"
! ls "$WORK/wheelhouse" | grep -qi '^torch-' || fail "the wheelhouse holds a torch"
ls "$WORK/wheelhouse" | grep -q '^setuptools-' || fail "the wheelhouse lacks setuptools (building attnbench needs it)"
echo "torch in the wheelhouse: none; torchvision: $(cd "$WORK/wheelhouse" && ls torchvision-*)"

step "control: a constraint with a label the installed torch lacks (what torch.__version__ gave on PyPI's CUDA torch) is refused offline"
echo "torch==$TORCH+cu130" > "$WORK/keep-label.txt"
if offline "$WORK/offline/bin/pip" install --dry-run --no-index --find-links "$WORK/wheelhouse" \
        -c "$WORK/keep-label.txt" "$EXTRAS" > "$WORK/control.txt" 2>&1; then
    fail "a label the installed torch does not carry was accepted: the check could not see the failure"
fi
grep -E "ResolutionImpossible|constraint\) torch" "$WORK/control.txt"

step "offline: pip install --no-index --find-links wheelhouse -c keep-torch.txt -e '$EXTRAS' ($OFFLINE_HOW)"
quietly offline "$WORK/offline/bin/pip" install --no-index --find-links "$WORK/wheelhouse" \
    -c "$WORK/keep-torch.txt" -e "$EXTRAS"
verify "$WORK/offline" "$torch_before" absent

step "offline, again with torchvision there: neither is replaced"
keep "$WORK/offline"
vision_before=$(fingerprint "$WORK/offline" torchvision)
quietly offline "$WORK/offline/bin/pip" install --no-index --find-links "$WORK/wheelhouse" \
    -c "$WORK/keep-torch.txt" -e "$EXTRAS"
verify "$WORK/offline" "$torch_before" "$vision_before"

step "online: a venv with torch $TORCH (CPU build), no torchvision; pip install -c keep-torch.txt -e '$EXTRAS' from PyPI alone"
new_env "$WORK/online"
torch_before=$(fingerprint "$WORK/online" torch)
keep "$WORK/online"
replaced=$(pypi_only "$WORK/online/bin/pip" install --dry-run -e "$EXTRAS" 2>/dev/null | grep "^Would install" \
    | grep -oE ' (torch|torchvision)-[0-9.]+' | tr -d '\n') || true
[[ "$replaced" == *" torch-"* ]] || fail "without the constraint pip would keep torch too: the control shows nothing"
echo "control, without -c keep-torch.txt pip would install:$replaced"
quietly pypi_only "$WORK/online/bin/pip" install -c "$WORK/keep-torch.txt" -e "$EXTRAS"
verify "$WORK/online" "$torch_before" absent

step "online, again with torchvision there: neither is replaced"
keep "$WORK/online"
vision_before=$(fingerprint "$WORK/online" torchvision)
quietly pypi_only "$WORK/online/bin/pip" install -c "$WORK/keep-torch.txt" -e "$EXTRAS"
verify "$WORK/online" "$torch_before" "$vision_before"

printf '\ncheck-install: passed in %d min %d s (offline from a wheelhouse and online, torch %s+cpu kept)\n' \
    $((SECONDS / 60)) $((SECONDS % 60)) "$TORCH"
