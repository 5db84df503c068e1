"""Grade a whole class: every submission's jobs in a pool, one per core, then the gradebook and feedback.

First :mod:`autograder.canary` runs the instructor's solution in the
same sandbox, which checks the sandbox and makes the reference every
submission is judged against. The data flow, module by module: :mod:`autograder.submission` (read and
assemble), :mod:`autograder.scan`, :mod:`autograder.job` (prepare, run in
:mod:`autograder.sandbox`, started by :mod:`autograder.launcher`, through
:mod:`autograder.runner`),
:mod:`autograder.verdict`, :mod:`autograder.gradebook` (nbgrader's
autograde), :mod:`autograder.feedback`, :mod:`autograder.report`.

A run can be stopped (Ctrl-C, SIGTERM, SIGHUP: :class:`Interrupts` turns
them into ``KeyboardInterrupt``, held back while the gradebook is written).
Then every runner is ended with its sandbox, the jobs not finished lose
their folders, :class:`GradingStopped` says what was graded and what not,
and ``state.json`` in the work folder remembers it: the next run on the same
work folder keeps the gradebook and grades only the submissions that were not
graded, or that changed since.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import shutil
import signal
import tempfile
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

import nbformat

from autograder import canary, cgroups, sandbox
from autograder.feedback import hidden_lines, write_feedback
from autograder.gradebook import GradebookLock, grading_environment, gradebook_url, last_line, nbgrader_api
from autograder.intake import RENAMED
from autograder.job import RUNNERS, Job, RunContext, course_imports, execute, prepare
from autograder.pipeline import SOLUTIONS, assignments, course_config
from autograder.report import Progress, devices_text
from autograder.settings import DEMO_CLASS, WORKDIR, Result, Settings
from autograder.submission import SubmissionError, grade_ids_of, read_submission
from autograder.verdict import judge


class GradingStopped(Exception):
    """A run that was stopped: which (student, assignment) pairs were graded, and which not."""

    def __init__(self, signum: int, graded: list[tuple[str, str]], not_graded: list[tuple[str, str]]):
        super().__init__(f"grading was stopped by {signal.Signals(signum).name}")
        self.signum, self.graded, self.not_graded = signum, graded, not_graded


class Interrupts:
    """SIGINT, SIGTERM and SIGHUP raise KeyboardInterrupt in the main thread, except while held."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self):
        self.held = False
        self.pending = 0
        self.received = signal.SIGINT

    def _handle(self, signum, _frame):
        self.received = signum
        if self.held:
            self.pending = signum
            return
        raise KeyboardInterrupt

    @contextlib.contextmanager
    def installed(self):
        """Handle the signals for the block (main thread only), then restore the previous handlers."""
        previous = {signum: signal.signal(signum, self._handle) for signum in self.SIGNALS}
        try:
            yield self
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    @contextlib.contextmanager
    def holding(self):
        """A signal that arrives in the block takes effect at its end (the gradebook is never half written)."""
        self.held = True
        try:
            yield
        finally:
            self.held = False
            if self.pending:
                self.pending = 0
                raise KeyboardInterrupt


INTERRUPTS = Interrupts()
STATE = "state.json"


def submitted_notebook(folder: Path, notebook: str) -> Path | None:
    """``folder/<notebook>.ipynb``, else the newest copy an LMS or a browser renamed (``<notebook> (1).ipynb``,
    ``<notebook>-2.ipynb``), else None."""
    exact = folder / f"{notebook}.ipynb"
    if exact.is_file():
        return exact
    copies = [path for path in folder.glob("*.ipynb") if path.is_file()
              and (match := RENAMED.match(path.stem)) and match.group("stem") == notebook]
    return max(copies, key=lambda path: (path.stat().st_mtime, path.name), default=None)


def fingerprint(root: Path, recursive: bool = False) -> str:
    """A hash of the notebooks in ``root`` (and below it, if ``recursive``), names included.

    Of a submission folder: a re-run grades a changed submission again. Of the
    solutions (recursive): a stopped run is resumed only for the same course.
    """
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.ipynb") if recursive else root.glob("*.ipynb")):
        if ".ipynb_checkpoints" not in path.parts:
            digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def read_state(workdir: Path) -> dict | None:
    """The state an interrupted run left in ``workdir``, if it can be resumed; else None."""
    try:
        state = json.loads((workdir / STATE).read_text())
    except (OSError, ValueError):
        return None
    if state.get("finished") or state.get("course") != fingerprint(SOLUTIONS, recursive=True):
        return None
    return state


def write_state(workdir: Path, state: dict) -> None:
    temporary = workdir / (STATE + ".tmp")
    temporary.write_text(json.dumps(state, indent=1))
    temporary.replace(workdir / STATE)  # atomic: a run stopped here leaves the old state or the new one


def grade(submitted: Path = DEMO_CLASS, workdir: Path = WORKDIR, settings: Settings | None = None) -> list[Result]:
    """Autograde every ``submitted/<student>/<assignment>/`` folder; return one Result per pair.

    A student who handed nothing in for an assignment gets ``score=None`` and
    a note; a notebook that cannot be graded (corrupt, from another
    assignment) gets a note with the reason, and the batch goes on.
    """
    settings = settings or Settings()
    submitted, workdir = Path(submitted).resolve(), Path(workdir).resolve()
    state = read_state(workdir)
    if state is None:  # a fresh run
        if workdir.exists():
            shutil.rmtree(workdir)
        workdir.mkdir(parents=True)
        shutil.copytree(SOLUTIONS, workdir / "source", ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
        (workdir / "submitted").mkdir()
        state = {"course": fingerprint(SOLUTIONS, recursive=True), "finished": False, "graded": {}}
        write_state(workdir, state)
    RUNNERS.stopping.clear()
    db_url = gradebook_url(settings, workdir)
    with grading_environment(), tempfile.TemporaryDirectory(prefix="grade-") as ipc_root, \
            GradebookLock(db_url) as lock:
        os.chmod(ipc_root, 0o755)
        return _grade_in(submitted, workdir, db_url, settings, Path(ipc_root), lock, state)


def _grade_in(submitted: Path, workdir: Path, db_url: str, settings: Settings, ipc_root: Path,
              lock: GradebookLock, state: dict) -> list[Result]:
    from nbgrader.api import Gradebook, MissingEntry

    api = nbgrader_api(workdir, db_url)
    names = assignments()
    sources: dict[str, dict[str, nbformat.NotebookNode]] = {}
    for name in names:
        with INTERRUPTS.holding(), lock.held():
            outcome = api.generate_assignment(name, force=True)
        if not outcome["success"]:
            raise RuntimeError(f"could not generate {name}:\n{outcome.get('error') or outcome.get('log')}")
        sources[name] = {p.stem: nbformat.read(p, as_version=4) for p in sorted((workdir / "source" / name).glob("*.ipynb"))}
    grade_ids = {a: set().union(*(grade_ids_of(nb) for nb in nbs.values())) for a, nbs in sources.items()}
    imports = {a: {notebook: course_imports(nb) for notebook, nb in nbs.items()} for a, nbs in sources.items()}
    read_only = sandbox.python_paths()

    run = RunContext(settings, settings.isolation(), "_grader_" + secrets.token_hex(8), ipc_root, imports, read_only,
                     cgroups.find())
    cgroups.sweep(run.cgroups)  # what runners killed outright left behind
    students = sorted(p.name for p in submitted.iterdir() if p.is_dir() and not p.name.startswith("."))
    chosen = names if settings.canary == "all" else [
        name for name in names if any((submitted / student / name).is_dir() for student in students)]
    references = canary.references([(name, notebook, nb) for name in chosen for notebook, nb in sources[name].items()],
                                   workdir, run)
    notes: dict[tuple[str, str], list[str]] = {}
    jobs: dict[tuple[str, str], list[Job]] = {}
    job_files: list[tuple[Job, Path]] = []
    earlier: set[tuple[str, str]] = set()  # graded by an earlier, interrupted run, unchanged since
    for student in students:
        for name in names:
            folder = submitted / student / name
            if not folder.is_dir():
                notes[student, name] = ["not submitted"]
                continue
            if state["graded"].get(f"{student}/{name}") == fingerprint(folder):
                earlier.add((student, name))
                continue
            state.setdefault("withheld", {}).pop(f"{student}/{name}", None)  # graded afresh below
            others = {a: ids for a, ids in grade_ids.items() if a != name}
            for notebook, source in sources[name].items():
                path = submitted_notebook(folder, notebook)
                if path is None:
                    notes.setdefault((student, name), []).append(f"{notebook}.ipynb missing: 0 points for it")
                    continue
                if path.name != f"{notebook}.ipynb":
                    notes.setdefault((student, name), []).append(f"graded {path.name} as {notebook}.ipynb")
                try:
                    nb = read_submission(path, grade_ids_of(source), others)
                except SubmissionError as error:
                    notes.setdefault((student, name), []).append(f"not graded: {error}")
                    continue
                job = Job(student, name, notebook, workdir / "jobs" / student / name / notebook)
                job_files.append((job, prepare(job, source, nb, folder, run)))
                jobs.setdefault((student, name), []).append(job)

    hidden = {name: set().union(*(hidden_lines(nb) for nb in sources[name].values())) for name in names}
    progress = Progress(len(job_files), settings.progress)
    remaining = {pair: len(pair_jobs) for pair, pair_jobs in jobs.items()}
    graded: set[tuple[str, str]] = set(earlier)
    pool = ThreadPoolExecutor(max_workers=max(1, settings.jobs))
    futures = {pool.submit(execute, path, settings): job for job, path in job_files}
    try:
        for future in as_completed(futures):
            job = futures[future]
            pair = (job.student, job.assignment)
            executed = judge(job, sources[job.assignment][job.notebook], references[job.assignment][job.notebook])
            target = workdir / "submitted" / job.student / job.assignment
            target.mkdir(parents=True, exist_ok=True)
            nbformat.write(executed, target / f"{job.notebook}.ipynb")
            if job.status.get("stopped"):
                notes.setdefault(pair, []).append(f"{job.notebook}: stopped, {job.status['stopped']}")
            if job.status.get("disk_full"):
                notes.setdefault(pair, []).append(f"{job.notebook}: filled the disk limit of "
                                                  f"{job.status['disk_full']} MiB (writes past it failed)")
            if job.findings:
                notes.setdefault(pair, []).append(f"{job.notebook}: score withheld for review, " + "; ".join(job.findings[:3]))
                state.setdefault("withheld", {}).setdefault(f"{job.student}/{job.assignment}", {})[job.notebook] = \
                    job.findings
            remaining[pair] -= 1
            if remaining[pair] == 0:
                # Scores and feedback of a finished pair, while the pool runs the next notebooks.
                with INTERRUPTS.holding():
                    with lock.held():
                        outcome = api.autograde(job.assignment, job.student, force=True, create=True)
                    if outcome["success"]:
                        graded.add(pair)
                        state["graded"][f"{job.student}/{job.assignment}"] = fingerprint(submitted / job.student / job.assignment)
                        write_state(workdir, state)
                        if settings.feedback:
                            write_feedback(api, workdir, pair, hidden[job.assignment], notes)
                    else:
                        notes.setdefault(pair, []).append("not graded: " + last_line(outcome.get("error") or outcome.get("log")))
            progress.step(f"{job.student}/{job.assignment}")
    except KeyboardInterrupt:
        RUNNERS.stop()
        pool.shutdown(wait=True, cancel_futures=True)
        unfinished = sorted(pair for pair, left in remaining.items() if left)
        for student, name in unfinished:  # what they wrote is not graded: nothing of it stays
            shutil.rmtree(workdir / "jobs" / student / name, ignore_errors=True)
            with contextlib.suppress(OSError):
                (workdir / "jobs" / student).rmdir()  # if no other assignment of theirs is there
        raise GradingStopped(INTERRUPTS.received, sorted(graded), unfinished) from None
    pool.shutdown(wait=True)
    cgroups.sweep(run.cgroups)
    state["finished"] = True
    write_state(workdir, state)

    devices = devices_text()
    results = []
    with Gradebook(db_url, course_config().CourseDirectory.course_id) as gradebook:
        for student in students:
            for name in names:
                max_score = gradebook.find_assignment(name).max_score
                pair_notes = notes.get((student, name), [])
                score = None
                if (student, name) in graded:
                    try:
                        score = gradebook.find_submission(name, student).score
                    except MissingEntry:
                        pair_notes = [*pair_notes, "not graded: no submission in the gradebook"]
                if (student, name) in earlier:
                    pair_notes = [*pair_notes, "graded by an earlier run that was stopped"]
                ran = any(j.status.get("seconds") for j in jobs.get((student, name), []))
                seconds = sum(j.status.get("seconds", 0) for j in jobs.get((student, name), []))
                withheld = f"{student}/{name}" in state.get("withheld", {}) and (student, name) in graded
                if withheld:
                    pair_notes = [*pair_notes, f"review: python -m autograder.review {student}/{name} --release "
                                               "(or --confirm)"]
                results.append(Result(student, name, score, max_score, "; ".join(pair_notes),
                                      devices if ran else "", round(seconds, 1), withheld=withheld))
    return results
