"""The user's manual, README.md and docs/*.md, says only what runs (a stale manual misleads): every shell command of
its fenced ```bash blocks is run or checked, and every relative link points at a file (and heading)
that exists.

How each command is checked, cheaply (the whole file takes well under a minute):
- `attnbench run OVERRIDES` is planned as `attnbench sweep --dry-run OVERRIDES` (composition, every
  setting, the model against the task; data may be missing), which must plan exactly one job;
  `run --cfg ...` and the other flags that print and run nothing run as they are;
- `attnbench sweep` runs with `--dry-run`; `profile` with timing, FLOPs and memory off and its CSV
  and plot in a temporary folder (`profile --replot` draws its figures from a committed CSV but
  renders none: tests/test_figures.py renders each kind); `report` with `--out` a temporary folder;
  `ls`, `validate`, `check-attention` and `--help` as they are;
- `attnbench data SOURCE NAME` asks the source whether it knows NAME and its options (nothing is
  downloaded); the commands that time or need a GPU (`bench*`, `smoke`, `evaluate`) answer
  `--help`, which must name every option the manual gives them;
- `make TARGET` must be a target (`make -n`); `torchrun ... -m bench_cli.cli ARGS` is checked as
  `attnbench ARGS`; `pip install '.[EXTRAS]'` must name extras of pyproject.toml; any other program
  must be installed; the few commands that are not checkable are in NOT_RUN with the reason.
Everything runs in-process in a temporary working folder with an empty data root (the shipped
sktime datasets stay available), with the manual's own example plugin importable as `mymod`.
"""
from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from bench_cli.commands.cli import main
from test_plugins import isolated, plugin_dir  # noqa: F401 - fixtures: the manual's plugin, registries restored

# Every test of this file in one xdist worker (`make test` runs --dist loadgroup): the commands the
# manual writes twice and the checks two commands share (PASSED, CHECKED_FORMS) are checked once per
# process, and the compositions and imports they need are made once. Split over the two workers, the
# file took 41 s of CPU instead of 31 s.
pytestmark = pytest.mark.xdist_group("manual_commands")

ROOT = Path(__file__).resolve().parents[1]
MANUAL = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
SHELL = {"bash", "sh", "shell", "console"}
FENCE = re.compile(r"^```([\w+-]*)[^\n]*\n(.*?)^```", re.M | re.S)

# Commands a test cannot run or check, each with the reason. A new command the checks below cannot
# handle fails until it is listed here.
NOT_RUN = {
    "git clone <this repository> attnbench": "the repository's address is the reader's",
    "cd attnbench": "follows the clone above",
    "source .venv/bin/activate": "a shell builtin; `make install` creates .venv",
    "export PYTHONPATH=/path/to/folder/of/mymod": "a placeholder folder: the test puts the plugin on sys.path",
}
# Grids too large to plan here (the zoo: 150 compositions, ~30 s of CPU; Table 1: 40): a part of
# them is planned, unless the command sets that key itself (tests/test_sweep.py plans every
# experiment's whole grid).
NARROWED = {"experiment=zoo/offline": ["model=softmax"], "experiment=primal_dual/table1": ["task.dataset=JapaneseVowels"],
            "experiment=primal_attention/d4rl": ["task.dataset=hopper-medium-v2"]}
HYDRA_PRINT_FLAGS = {"--cfg", "-c", "--info", "-i", "--hydra-help", "--help", "-h", "--version", "--shell-completion"}
HELP_ONLY = {"bench", "bench-cli", "bench-overhead", "smoke", "evaluate"}  # time for minutes or need a GPU
CHEAP_PROFILE = ["profile.timing.enabled=false", "profile.flops=off", "profile.memory=off", "profile.memory_budget_gb=null"]


@dataclass
class Command:
    where: str  # file:line
    text: str  # as written, continuation lines joined
    env: dict[str, str]
    argv: list[str]
    earlier: list[Command] = field(default_factory=list)  # the commands before it in its block

    def __str__(self) -> str:
        return f"{self.where}: {self.text}"


def code_blocks(text: str) -> list[tuple[str, str, int]]:
    """(language, body, line of the body's first line) of every fenced block."""
    return [(m.group(1), m.group(2), text.count("\n", 0, m.start(2)) + 1) for m in FENCE.finditer(text)]


def shell_commands(path: Path, text: str | None = None) -> list[Command]:
    """Every command of the shell blocks: continuation lines joined, comments and output redirections
    dropped, `A && B` split, leading NAME=VALUE words taken as the environment."""
    text = path.read_text() if text is None else text
    commands = []
    for language, body, first in code_blocks(text):
        if language not in SHELL:
            continue
        block: list[Command] = []
        lines = body.split("\n")
        i = 0
        while i < len(lines):
            start, line = i, lines[i]
            while line.endswith("\\") and i + 1 < len(lines):
                i += 1
                line = line[:-1] + " " + lines[i].strip()
            i += 1
            for cmd in commands_of(line, f"{path.name}:{first + start}", block):
                block.append(cmd)
                commands.append(cmd)
    return commands


def commands_of(line: str, where: str, earlier: list[Command]) -> list[Command]:
    """The commands of one shell line: split at ; && || and pipes, comments and redirections
    dropped, leading NAME=VALUE words taken as the environment."""
    line = re.sub(r"\s\d*>&\d+", "", line)  # 2>&1: a descriptor duplicated, no file named
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    parts, skip = [[]], False
    for word in lexer:
        if skip:
            skip = False
        elif word in (">", ">>", "<", "2>"):
            skip = True
        elif word and set(word) <= set(";&|"):
            parts.append([])
        else:
            parts[-1].append(word)
    commands = []
    for part in parts:
        env = {}
        while len(part) > 1 and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", part[0]):
            key, _, value = part.pop(0).partition("=")
            env[key] = value
        if part:
            text = " ".join(shlex.quote(w) for w in [*(f"{k}={v}" for k, v in env.items()), *part])
            commands.append(Command(where, text, env, part, [*earlier, *commands]))
    return commands


# --- the checks ------------------------------------------------------------------------------------
def attnbench_in_process(argv: list[str], capsys) -> tuple[int, str]:
    """`attnbench ARGV` in this process: (exit status, stdout + stderr)."""
    try:
        main(list(argv))
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    out = capsys.readouterr()
    return code, out.out + out.err


def replot_form(argv: list[str], tmp: Path) -> list[str]:
    """`profile ... --replot` drawing from a copy of the CSV it names (a committed one stands in for
    a CSV an earlier command of the manual would have written) into ``tmp``: the committed figures
    are not rewritten by a test."""
    from bench_cli.commands.profile.config import load_config

    overrides = [a for a in argv[1:] if a != "--replot"]
    p = load_config(overrides).profile
    source = Path(str(p.output)) if Path(str(p.output)).is_absolute() else ROOT / str(p.output)
    shutil.copy(source if source.exists() else ROOT / "results/reproduced/figure2.csv", tmp / "profile.csv")
    if str(p.mode) == "pba":
        figures = [f"profile.figures.{k}.path={tmp / k}.png" for k in p.figures if "path" in p.figures[k]]
    else:
        figures = [f"profile.plot={tmp / 'figure.png'}"]
    return [*argv, f"profile.output={tmp / 'profile.csv'}", *figures]


DEFAULT_RECORDS = "results/runs.csv"  # results.path of every run: the manual's reports read it after its runs
NO_RECORDS = "no records of experiment"  # the one failure a report of an experiment the test only planned may end with


def searched_only(name: str, cmd: Command) -> bool:
    """An experiment of the manual's own sweeps above (run as --dry-run here): its report may find
    no records, unless some are committed (then it must print them)."""
    return any(f"experiment={name}" in c.argv for c in cmd.earlier)


def cheap_form(cmd: Command, argv: list[str], tmp: Path) -> tuple[list[str], int | str | None]:
    """The attnbench command that checks ``argv`` without training, downloading or timing, and the
    number of jobs its plan must hold (None: any; NO_RECORDS: a report that can find none). Returns ([], None) when checked here already."""
    verb, rest = (argv[0], argv[1:]) if argv else ("--help", [])
    if verb.startswith("-"):
        return argv, None
    # Settings that need a GPU (trainer.device=cuda, fp16) are planned as they are written: a plan
    # checks the config, each job its machine (the GPU's side is `attnbench smoke`'s).
    if verb in ("run", "sweep") and not HYDRA_PRINT_FLAGS & {a.split("=")[0] for a in rest}:
        given = {a.split("=")[0] for a in rest}
        rest += [o for a in rest for o in NARROWED.get(a, []) if o.split("=")[0] not in given]
        return ["sweep", *([] if "--dry-run" in rest else ["--dry-run"]), *rest], (1 if verb == "run" else None)
    if verb == "profile" and "--replot" in rest:
        return replot_form(argv, tmp), None
    if verb == "profile":
        return [*argv, *CHEAP_PROFILE, f"profile.output={tmp / 'profile.csv'}", "profile.plot=null"], None
    if verb == "report":
        records = rest[rest.index("--records") + 1] if "--records" in rest else None
        if records and not Path(records).exists() and (ROOT / records).exists():  # a committed file, named from the repository
            argv = [str(ROOT / records) if a == records else a for a in argv]
            records = str(ROOT / records)
        if records and not Path(records).exists():  # written by the block's sweep above: a committed file stands in
            written = any(f"results.path={records}" in c.argv for c in cmd.earlier) or records == DEFAULT_RECORDS
            assert written, f"{cmd}: no such records file"
            Path(records).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / "results/reproduced/primal_dual/table1.records.csv", records)
        names = [a for a in rest if not a.startswith("-") and "=" not in a and a != records]
        if names and searched_only(names[0], cmd):  # its sweep above was only planned: no records of it exist
            return [*argv, "--no-write"], NO_RECORDS
        return [*argv, "--no-write"], None
    if verb == "data":
        check_data_command(cmd, rest)
        return [], None
    if verb in HELP_ONLY:
        return [verb, "--help"], None
    return argv, None  # ls, validate, check-attention, ...


def check_data_command(cmd: Command, rest: list[str]) -> None:
    """`attnbench data SOURCE [NAME] [--options]`: the source knows NAME and the options; nothing fetched."""
    from bench_cli.config.args import parse
    from attnbench.tasks.fetch import available_fetchers, fetcher

    p = parse("data", rest, {"--force": False}, free_options=True)
    assert p.positional and p.positional[0] in available_fetchers(), f"{cmd}: unknown data source"
    source = fetcher(p.positional[0])
    p.options.pop("--force", None)
    source.check_options({k[2:].replace("-", "_"): v for k, v in p.options.items()})
    if len(p.positional) == 2:
        datasets = source.datasets(Path("data"))
        assert p.positional[1] in datasets, f"{cmd}: {source.name} has no dataset {p.positional[1]} ({datasets})"


def check_attnbench(cmd: Command, argv: list[str], tmp: Path, capsys, monkeypatch) -> None:
    for key, value in cmd.env.items():
        monkeypatch.setenv(key, value)
    checked, jobs = cheap_form(cmd, argv, tmp)
    form = (tuple(checked), tuple(sorted(cmd.env.items())), jobs)
    if not checked or form in CHECKED_FORMS:  # checked as it is already
        return
    drawn = []
    if "--replot" in checked:  # drawn, not rendered: test_figures.py renders each kind of figure
        from bench_cli.results import plots

        monkeypatch.setattr(plots, "save_figure", lambda fig, path, **options: drawn.append(Path(path)))
    code, out = attnbench_in_process(checked, capsys)
    if jobs == NO_RECORDS and code == 2:  # the name and the options parsed; its records do not exist here
        assert f"{NO_RECORDS} {checked[1]}" in out, f"{cmd}\n  exit {code}: {out.strip()[-1500:]}"
        return
    assert code == 0, f"{cmd}\n  checked as: attnbench {shlex.join(checked)}\n  exit {code}: {out.strip()[-1500:]}"
    if checked[-1] == "--help" and argv[-1:] != ["--help"]:  # a command that is not run: its options are known
        for option in (a.split("=")[0] for a in argv[1:] if a.startswith("--")):
            assert option in out, f"{cmd}: `attnbench {argv[0]} --help` does not know {option}"
    if "--replot" in checked:
        wanted = [Path(a.partition("=")[2]) for a in checked if a.startswith(("profile.plot=", "profile.figures."))]
        assert wanted and {*wanted} <= {*drawn}, f"{cmd}: drew {drawn}, not {wanted}"
    if isinstance(jobs, int):
        planned = re.search(r": (\d+) jobs,", out)
        assert planned and int(planned.group(1)) == jobs, f"{cmd}: a run is one job; planned: {out[:300]}"
    CHECKED_FORMS.add(form)


def check_make(cmd: Command, tmp: Path, capsys, monkeypatch) -> None:
    """The target exists; when the manual gives it variables (DATASETS=, ARGS=), the sweeps of its
    recipe are planned (`make -n` prints them), so the variables are checked too."""
    r = subprocess.run(["make", "-n", *cmd.argv[1:]], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"{cmd}: {r.stderr.strip()}"
    if not any("=" in a for a in cmd.argv[1:]):
        return
    for line in r.stdout.splitlines():
        for step in commands_of(line, cmd.where, []):
            if Path(step.argv[0]).name == "attnbench" and step.argv[1:2] == ["sweep"]:
                check_attnbench(Command(cmd.where, f"{cmd.text} -> {step.text}", {}, step.argv), step.argv[1:],
                                tmp, capsys, monkeypatch)


def check_pip(cmd: Command) -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    for spec in cmd.argv:
        m = re.fullmatch(r"\.\[([\w,-]+)\]", spec)
        if m:
            unknown = set(m.group(1).split(",")) - extras
            assert not unknown, f"{cmd}: no extra {sorted(unknown)} in pyproject.toml ({sorted(extras)})"


PASSED: set[str] = set()  # a command written twice in the manual (README and a docs page) is checked once
# The same check of two commands (`sweep X --dry-run` and `sweep X`, both planned) runs once: (the
# checked form, its environment, the jobs its plan must hold) of each that passed.
CHECKED_FORMS: set[tuple] = set()


def check(cmd: Command, tmp: Path, capsys, monkeypatch) -> None:
    if cmd.text in NOT_RUN or cmd.text in PASSED:
        return
    program = Path(cmd.argv[0]).name
    if program == "attnbench":
        check_attnbench(cmd, cmd.argv[1:], tmp, capsys, monkeypatch)
    elif program == "make":
        check_make(cmd, tmp, capsys, monkeypatch)
    elif program == "torchrun":
        assert shutil.which("torchrun") or Path(sys.executable).with_name("torchrun").exists(), f"{cmd}: no torchrun"
        module = cmd.argv.index("-m")
        assert cmd.argv[module + 1] == "bench_cli.cli", f"{cmd}: attnbench's module is bench_cli.cli"
        check_attnbench(cmd, cmd.argv[module + 2:], tmp, capsys, monkeypatch)
    elif program == "pip":
        check_pip(cmd)
    elif program in ("python", "python3") or shutil.which(program) or Path(sys.executable).with_name(program).exists():
        pass  # an installed program (python -m venv, wandb ...)
    else:
        pytest.fail(f"{cmd}: neither checkable nor in NOT_RUN")
    PASSED.add(cmd.text)


COMMANDS = [c for path in MANUAL for c in shell_commands(path)]


@pytest.fixture
def manual_env(isolated, tmp_path, monkeypatch):  # noqa: F811 - the imported fixture
    """A temporary working folder and data root, nothing of the user's touched."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ATTNBENCH_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("ATTNBENCH_OUTPUT", str(tmp_path / "outputs"))
    monkeypatch.setenv("COLUMNS", "200")
    from bench_cli.results.provenance import COMMAND_ENV

    monkeypatch.delenv(COMMAND_ENV, raising=False)  # a sweep notes its command line there: restored afterwards
    return tmp_path


@pytest.mark.parametrize("cmd", COMMANDS, ids=[c.where for c in COMMANDS])
def test_every_command_of_the_manual_runs(cmd, manual_env, capsys, monkeypatch):
    check(cmd, manual_env, capsys, monkeypatch)


def test_the_manual_has_commands_and_every_code_block_names_its_language():
    """An unmarked block would hide its commands from the test above."""
    for path in MANUAL:
        for language, _body, line in code_blocks(path.read_text()):
            assert language, f"{path.name}:{line - 1}: a code block without a language (```bash, ```text ...)"
    assert len(COMMANDS) > 30 and any("--dry-run" in c.argv for c in COMMANDS if c.where.startswith("README"))


MUTATIONS = [  # (command in the README, mistake): each must be caught
    ("model=attention_bn_sh", "model=attention_bn_shh"),
    ("run task=uea", "run task=ueaa"),
    ("run --cfg job", "run --cfgg job"),
    ("task.dataset=JapaneseVowels", "task.dataset=JapaneseVowel"),
    ("experiment=primal_dual/table1 task.dataset", "experiment=primal_dual/table99 task.dataset"),
    ("trainer.max_epochs=50", "trainer.max_epoch=50"),
    ("sweep --dry-run experiment", "sweep --dry-runs experiment"),
    ("ls models", "ls model"),
    ("data uea BasicMotions", "data uea BasicMotion"),
    ("make help", "make hepl"),
    ("DATASETS=JapaneseVowels ", "DATASETS=JapaneseVowelz "),
]


@pytest.mark.parametrize("right,wrong", MUTATIONS)
def test_a_mistake_in_a_readme_command_fails(right, wrong, manual_env, capsys, monkeypatch):
    readme = (ROOT / "README.md").read_text()
    assert right in readme
    copy = manual_env / "README.md"
    copy.write_text(readme.replace(right, wrong, 1))
    right_commands = {c.text for c in shell_commands(ROOT / "README.md")}
    (mutated,) = [c for c in shell_commands(copy) if c.text not in right_commands]
    with pytest.raises(AssertionError):
        check(mutated, manual_env, capsys, monkeypatch)


def test_every_make_target_and_command_named_in_the_prose_exists():
    """`make TARGET` and `attnbench VERB` written inline in the text, outside code blocks."""
    from bench_cli.commands.cli import COMMANDS

    targets, verbs = {}, {}
    for path in MANUAL:
        prose = FENCE.sub("", path.read_text())
        for target in re.findall(r"`make ([a-z][\w.-]*)", prose):
            targets.setdefault(target, path.name)
        for verb in re.findall(r"`(?:\S*/)?attnbench ([a-z][\w-]*)", prose):
            verbs.setdefault(verb, path.name)
    unknown = [f"{where}: attnbench {verb}" for verb, where in verbs.items() if verb not in COMMANDS]
    for target, where in targets.items():
        r = subprocess.run(["make", "-n", target], cwd=ROOT, capture_output=True, text=True, timeout=60)
        if r.returncode:
            unknown.append(f"{where}: make {target}: {r.stderr.strip()}")
    assert len(targets) > 20 and len(verbs) > 8 and not unknown, "\n".join(unknown)


# --- links -----------------------------------------------------------------------------------------
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def anchors(path: Path) -> set[str]:
    """GitHub's ids of the headings: lower case, punctuation dropped, spaces to hyphens."""
    text = FENCE.sub("", path.read_text())
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+ (.+)$", text, re.M)}


def test_every_relative_link_of_the_manual_points_at_a_file_and_heading():
    broken = []
    for path in MANUAL:
        for target in LINK.findall(FENCE.sub("", path.read_text())):
            if re.match(r"[a-z]+:", target):
                continue  # http(s), mailto
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            if not dest.exists():
                broken.append(f"{path.name}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{path.name}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_nothing_a_user_reads_cites_an_issue_number():
    """The manual, the committed reports, the make help and the configs say why, not which issue:
    a user has no issue tracker to look the number up in."""
    import re
    import subprocess

    issue = re.compile(r"\bissues? \d+", re.I)
    read = [ROOT / "README.md", ROOT / "Makefile", *(ROOT / "docs").glob("*.md"), *(ROOT / "mk").glob("*.mk"),
            *(ROOT / "conf").rglob("*.yaml"), *(ROOT / "results").rglob("*.md")]
    cited = [f"{p.relative_to(ROOT)}: {m.group()}" for p in read for m in issue.finditer(p.read_text())]
    assert not cited, cited
    out = subprocess.run(["make", "-s", "help"], cwd=ROOT, capture_output=True, text=True, timeout=60).stdout
    assert out and not issue.search(out)
