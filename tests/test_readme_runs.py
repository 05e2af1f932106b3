"""Every command the README, the getting-started page and the serve guide show in a fenced
block runs as written, from a project folder as a fresh clone has it after its first
`make train`, on the CPU with tiny epochs, with the data downloaded into data/cmapss/; and
every line naming a data file (and the Python snippets) again with the data elsewhere through
CMAPSS_DIR (no data/cmapss/ at all, as the README tells an offline user), after `make train`
made their model; what the commands write is ignored by git.

The folder holds the Makefile, pyproject.toml and experiments/ of this checkout, this
virtualenv (a link: make is told its stamp is up to date, so nothing is installed) and the
real data under data/cmapss/ or named by CMAPSS_DIR. What the test adds to a line, nothing
else:
- a `make` target that trains gets TINY (and tune 2 trials) appended to its ARGS;
- `make ui` and `make serve` run until they answer (the UI's printed address, the server's
  /ping), the serve guide's curl lines meanwhile against the port the README gives it (5001),
  then stop with Ctrl-C (SIGINT to their process group): no traceback, no make `Error`.
What it does not run, each by a stated rule (SKIPPED): `make test` (this suite), lines with a
placeholder (`<run id>`, `...`: shapes, not commands), the lean environment's lines
(serve-env/: tests/test_lean_env.py builds it), and the other `make serve` lines (variants
of the one started).
"""

import os
import re
import shutil
import signal
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
PAGES = ["README.md", "docs/getting-started.md", "docs/guides/serve.md"]
TINY = "epochs=1 patience=1 filters=4 num_layers=2 hidden_size=8"
TRAINS = ("train", "evaluate", "tune")
STAMP = ".venv/.installed"
SKIPPED = [("this suite", re.compile(r"^make test\b")),
           ("a placeholder", re.compile(r"<[a-z ]+>|\.\.\.")),
           ("the lean environment", re.compile(r"serve-env\b")),
           ("a variant of the server started", re.compile(r"^make serve (MODEL|SERVE_ARGS)="))]
ANSWER_S = 300
# A line naming a data file: through CMAPSS_DIR only these run (with `make train`, for their
# model); every other line finds the data as make train does, through the same config.
NAMES_DATA = re.compile(r"cmapss[-_]file")


def fenced(path: Path) -> list[tuple[str, str]]:
    """(language, text) of each fenced block of `path`."""
    return re.findall(r"^```(\w+)\n(.*?)^```", path.read_text(), flags=re.M | re.S)


def command_lines(text: str) -> list[str]:
    """A bash block's commands: continuation lines joined, comments and blank lines gone."""
    joined = re.sub(r"\\\n\s*", "", text)
    lines = [re.sub(r"\s+#.*$", "", line).strip() for line in joined.splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def documented() -> tuple[list[str], list[str]]:
    """Every bash command (in page order, each once) and every Python block of PAGES."""
    commands, snippets = [], []
    for page in PAGES:
        for language, text in fenced(ROOT / page):
            if language == "bash":
                commands += [c for c in command_lines(text) if c not in commands]
            elif language == "python" and "load_model" in text and "rows" in text:
                snippets.append(text)
    return commands, snippets


def skipped(command: str) -> str | None:
    return next((why for why, pattern in SKIPPED if pattern.search(command)), None)


def tiny(command: str) -> str:
    """A training make target with TINY appended to its ARGS (given on the line or not)."""
    target = re.match(r"make (\w+)", command)
    if not target or target.group(1) not in TRAINS:
        return command
    # a tiny study: its base (the tiny network) is not a trial the recipe's space can draw
    extra = TINY + (" n_trials=2 baseline_trial=false" if target.group(1) == "tune" else "")
    if 'ARGS="' in command:
        return re.sub(r'ARGS="([^"]*)"', lambda m: f'ARGS="{m.group(1)} {extra}"', command)
    return f'{command} ARGS="{extra}"'


def as_run(command: str) -> str:
    """`make X` never reinstalls into the shared virtualenv (its stamp taken as up to date)."""
    return re.sub(r"^make ", f"make -o {STAMP} ", command)


@dataclass(frozen=True)
class Project:
    """A clone's folder and the environment its user's shell has."""

    folder: Path
    env: dict


@pytest.fixture(scope="module", params=["data/cmapss", "CMAPSS_DIR"])
def project(request, tmp_path_factory, real_data_dir) -> Project:
    folder = tmp_path_factory.mktemp("clone")
    shutil.copy2(ROOT / "Makefile", folder)
    shutil.copy2(ROOT / "pyproject.toml", folder)
    shutil.copytree(ROOT / "experiments", folder / "experiments")
    (folder / ".venv").symlink_to(ROOT / ".venv")
    env = {k: v for k, v in os.environ.items()
           if k not in ("MLFLOW_TRACKING_URI", "CMAPSS_DIR", "ARGS", "MAKEFLAGS", "MFLAGS")}
    if request.param == "CMAPSS_DIR":  # the data elsewhere, as an offline user has it
        env["CMAPSS_DIR"] = str(real_data_dir)
    else:
        (folder / "data").mkdir()
        (folder / "data" / "cmapss").symlink_to(real_data_dir)
    return Project(folder, env)


def run(command: str, project: Project) -> str:
    done = subprocess.run(command, shell=True, cwd=project.folder, env=project.env,
                          capture_output=True, text=True, timeout=1200)
    said = done.stdout + done.stderr
    assert done.returncode == 0, f"{command}\n{said[-3000:]}"
    return said


class Started:
    """A long-running make target in its own process group, its output in a file."""

    def __init__(self, command: str, project: Project):
        self.log = project.folder / f".{command.split()[1]}.log"
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen(as_run(command), shell=True, cwd=project.folder,
                                            env=project.env, stdout=out,
                                            stderr=subprocess.STDOUT, start_new_session=True)

    def said(self) -> str:
        return self.log.read_text()

    def wait_for(self, found) -> None:
        deadline = time.monotonic() + ANSWER_S
        while not found():
            assert self.process.poll() is None, self.said()[-3000:]
            assert time.monotonic() < deadline, self.said()[-3000:]
            time.sleep(0.5)

    def ctrl_c(self) -> None:
        """SIGINT to the group, as a terminal sends it: no make error line, no traceback."""
        os.killpg(self.process.pid, signal.SIGINT)
        try:
            code = self.process.wait(timeout=30)
        finally:
            if self.process.poll() is None:
                os.killpg(self.process.pid, signal.SIGKILL)
        # make, interrupted too, ends by the signal it got and may say "Interrupt" as it does
        # from a terminal (see the Makefile); a recipe exiting 130 would add "Error 130"
        assert code in (0, -signal.SIGINT), self.said()[-3000:]
        said = self.said()
        assert not re.search(r"make: \*\*\* .*Error \d+", said) and "Traceback" not in said, said


def _answers(url: str):
    def check() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return response.status == 200
        except OSError:
            return False

    return check


def test_the_readme_and_guides_run_as_written(project):
    commands, snippets = documented()
    assert snippets and any(c.startswith(".venv/bin/rul predict") for c in commands)
    said_skipped = {c: skipped(c) for c in commands}
    assert len([c for c, why in said_skipped.items() if why]) <= 10, said_skipped
    short = [c for c, why in said_skipped.items()
             if not why and not c.startswith(("make ui", "make serve", "curl "))]
    elsewhere = "CMAPSS_DIR" in project.env
    if elsewhere:  # the lines naming a data file, and the training that makes their model
        short = [c for c in short if c == "make train" or NAMES_DATA.search(c)]
    for command in short:  # in page order: training first, then what reads its model
        run(as_run(tiny(command)), project)
    for snippet in snippets:  # rows defined as the page defines them
        run(f".venv/bin/python - <<'EOF'\n{snippet}\nEOF", project)
    if elsewhere:  # every line read the data where it is: none downloaded
        assert not (project.folder / "data").exists()
        return

    curls = [c for c in commands if c.startswith("curl ") and not said_skipped[c]]
    assert curls and all("localhost:5001/" in c for c in curls)  # the README's port
    (serve,) = [c for c in commands if c.startswith("make serve") and not said_skipped[c]]
    assert "PORT=5001" in serve
    server = Started(serve, project)
    try:
        server.wait_for(_answers("http://127.0.0.1:5001/ping"))
        for curl in curls:
            answer = run(f"{curl} --fail-with-body", project)
            assert '"rul"' in answer, answer[:500]
    finally:
        server.ctrl_c()

    (ui,) = [c for c in commands if c.startswith("make ui")]
    started = Started(ui, project)
    try:
        started.wait_for(lambda: "experiment rul-fd001: http://" in started.said())
    finally:
        started.ctrl_c()

    folder = project.folder
    written = [str(p.relative_to(folder)) for p in folder.rglob("*")
               if p.is_file() and not p.name.startswith(".")
               and not str(p.relative_to(folder)).startswith((".venv", "data/", "experiments/"))
               and p.name not in ("Makefile", "pyproject.toml")]
    assert written, "the commands wrote nothing"
    ignored = subprocess.run(["git", "check-ignore", "--no-index", "--stdin"], cwd=ROOT,
                             input="\n".join(written), capture_output=True, text=True).stdout
    assert sorted(set(written) - set(ignored.splitlines())) == []
