"""Grade a whole class: every submission's jobs in a pool, one per core, then the gradebook and feedback.

First :mod:`autograder.judge.reference` runs the instructor's solution in the
same sandbox, which checks the sandbox and makes the reference every
submission is judged against. The data flow, module by module: :mod:`autograder.prepare.submission` (read and
assemble), :mod:`autograder.prepare.scan`, :mod:`autograder.prepare.job` (prepare, run in
:mod:`autograder.run.sandbox`, started by :mod:`autograder.inside.launcher`, through
:mod:`autograder.run.runner`),
:mod:`autograder.judge.verdict`, :mod:`autograder.record.gradebook` (nbgrader's
autograde), :mod:`autograder.record.feedback`, :mod:`autograder.record.report`.

A run can be stopped (Ctrl-C, SIGTERM, SIGHUP: :class:`Interrupts` turns
them into ``KeyboardInterrupt``, held back while the gradebook is written).
Then every runner is ended with its sandbox, the jobs not finished lose
their folders, :class:`GradingStopped` says what was graded and what not,
and ``state.json`` in the work folder remembers it (with ``state.journal``, a line
per pair graded since it was written whole): the next run on the same
work folder keeps the gradebook and grades only the submissions that were not
graded, or that changed since.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import tempfile
import threading
import time
from concurrent.futures import as_completed
from pathlib import Path

import nbformat

from autograder.course.build import copy_solutions
from autograder.course.cells import grade_ids_of
from autograder.course.cells import hidden_test_lines as hidden_lines
from autograder.course.config import config_of
from autograder.course.directory import is_course_dir
from autograder.course.paths import DEMO_CLASS, RENAMED, SOLUTIONS, WORKDIR, demo_due
from autograder.course.profile import devices_text
from autograder.judge import reference
from autograder.judge.verdict import judge
from autograder.prepare.job import Job, course_imports
from autograder.prepare.submission import SubmissionError, fingerprint, read_submission
from autograder.record.feedback import FeedbackApart, page_notes
from autograder.record.gradebook import (
    EXECUTED,
    GradebookLock,
    failure_of,
    gradebook_url,
    grading_environment,
    nbgrader_api,
)
from autograder.record.marks import flag_for_review, hand_graded_points_left
from autograder.record.report import Progress
from autograder.record.state import EARLIER, journal_pair, read_state, write_state
from autograder.run import cgroups, sandbox
from autograder.run.cgroups import usable_cores
from autograder.run.executors import ClusterError, Executor, executor_for
from autograder.run.jobfile import RunContext, ready
from autograder.run.process import RUNNERS
from autograder.settings import Result, Settings
from devcourse.validation import total_points


class GradingStopped(Exception):
    """A run that was stopped: which (student, assignment) pairs were graded, and which not."""

    def __init__(self, signum: int, graded: list[tuple[str, str]], not_graded: list[tuple[str, str]],
                 reason: str = ""):
        """``signum``: the signal that stopped it; 0 with ``reason`` for a cluster that could not run a job."""
        super().__init__(reason or f"grading was stopped by {signal.Signals(signum).name}")
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


class ChoiceError(ValueError):
    """An assignment or student chosen that is not there, or no submissions to grade; the message says which."""


INTERRUPTS = Interrupts()


def submitted_notebook(folder: Path, notebook: str) -> Path | None:
    """``folder/<notebook>.ipynb``, else the newest copy an LMS or a browser renamed (``<notebook> (1).ipynb``,
    ``<notebook>-2.ipynb``), else None."""
    exact = folder / f"{notebook}.ipynb"
    if exact.is_file():
        return exact
    copies = [path for path in folder.glob("*.ipynb") if path.is_file()
              and (match := RENAMED.match(path.stem)) and match.group("stem") == notebook]
    return max(copies, key=lambda path: (path.stat().st_mtime, path.name), default=None)


def take_in(intake: Path, workdir: Path) -> None:
    """Copy each ``intake/<student>/<assignment>/`` folder into ``workdir/submitted/`` where it differs."""
    for folder in sorted(intake.glob("*/*")):
        if not folder.is_dir() or folder.name.startswith(".") or folder.parent.name.startswith("."):
            continue
        target = workdir / "submitted" / folder.parent.name / folder.name
        if target.is_dir() and fingerprint(target, recursive=True) == fingerprint(folder, recursive=True):
            continue
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(folder, target, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))


def open_workdir(workdir: Path, intake: Path | None) -> dict:
    """Ready ``workdir`` for a run; return its state.

    A course directory (:mod:`autograder.course.directory`) is never emptied: its
    ``source/`` is the instructor's, and when it changed every submission is
    graded again. Any other work folder mirrors ``solutions/`` and one
    submissions folder; it is emptied first when either differs from its last run's.
    """
    course_dir = is_course_dir(workdir)
    source = workdir / "source" if course_dir else SOLUTIONS
    course = fingerprint(source, recursive=True, suffix=".ipynb")
    state = read_state(workdir)
    if not course_dir and (state is None or state.get("course") != course
                           or state.get("intake") != (str(intake) if intake else None)):
        if workdir.exists():
            shutil.rmtree(workdir)
        workdir.mkdir(parents=True)
        copy_solutions(workdir / "source")
        state = None
    if state is None or state.get("course") != course:
        state = {"course": course, "intake": str(intake) if intake else None, "finished": True, "graded": {},
                 "generated": {}, "rows": {},
                 **{key: state[key] for key in ("withheld", "reviewed") if state and key in state}}
    state["finished"] = False
    (workdir / "submitted").mkdir(exist_ok=True)
    if intake is not None:
        take_in(intake, workdir)
    write_state(workdir, state)
    return state


def grade(submitted: Path | None = DEMO_CLASS, workdir: Path = WORKDIR,
          settings: Settings | None = None) -> list[Result]:
    """Autograde every ``submitted/<student>/<assignment>/`` folder not graded yet; return one Result per pair.

    ``submitted`` is copied into ``workdir/submitted/`` first; None grades what
    a course directory's ``submitted/`` holds (``nbgrader collect``). What an
    earlier run graded and has not changed since is not graded again
    (``settings.regrade`` grades the chosen submissions anyway);
    ``settings.assignments`` and ``settings.students`` choose. A student who
    handed nothing in for an assignment gets ``score=None`` and a note; a
    notebook that cannot be graded (corrupt, from another assignment) gets a
    note with the reason, and the batch goes on.
    """
    settings = settings or Settings()
    workdir = Path(workdir).resolve()
    intake = Path(submitted).resolve() if submitted is not None else None
    if intake is None and not is_course_dir(workdir):
        raise ChoiceError(f"{workdir} is not a course directory: name the submissions folder")
    # Called as a library (gpu-check, slurm-check, a notebook) too: a Ctrl-C must wait for nbgrader's calls to end,
    # since nbgrader catches every exception there, KeyboardInterrupt too (a bare except in its capture_log), and the
    # pair would be recorded as not graded while the run went on.
    main_thread = threading.current_thread() is threading.main_thread()
    with INTERRUPTS.installed() if main_thread else contextlib.nullcontext():
        executor = executor_for(settings)  # a cluster that does not answer stops here, before anything is written
        try:
            return _grade_with(workdir, intake, settings, executor)
        finally:
            executor.close()


def _grade_with(workdir: Path, intake: Path | None, settings: Settings, executor: Executor) -> list[Result]:
    state = open_workdir(workdir, intake)
    due = settings.due if settings.due is not None else demo_due() if intake == DEMO_CLASS.resolve() else {}
    RUNNERS.stopping.clear()
    db_url = gradebook_url(settings, workdir)
    with grading_environment(), ipc_folder() as ipc_root, GradebookLock(db_url) as lock:
        return _grade_in(workdir, db_url, settings, ipc_root, lock, state, due, executor)


IPC_OWNER = ".owner"  # in a run's folder of sockets: locked (flock) for as long as the run lives


@contextlib.contextmanager
def ipc_folder():
    """The run's folder for its kernels' sockets, in the temporary folder, removed when the run ends.

    A run killed outright (SIGKILL, a machine's OOM killer) cannot remove its own, so every run first
    removes those of runs that are gone: each run holds a lock on its folder's :data:`IPC_OWNER`
    (made under another name and locked before it takes that name, so no run ever finds it unlocked
    while its owner lives); a folder whose lock can be taken belongs to nobody. A folder without that
    file is left alone: it is not a run's (or was left by a grader from before the lock).
    """
    import fcntl

    for folder in Path(tempfile.gettempdir()).glob("grade-*"):
        try:
            with open(folder / IPC_OWNER) as owner:
                fcntl.flock(owner, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # no such file (not a run's folder, or one being made), or its run lives
            continue
        shutil.rmtree(folder, ignore_errors=True)
    with tempfile.TemporaryDirectory(prefix="grade-") as root:
        os.chmod(root, 0o755)
        with open(Path(root) / f"{IPC_OWNER}.new", "w") as owner:
            fcntl.flock(owner, fcntl.LOCK_EX)
            os.rename(owner.name, Path(root) / IPC_OWNER)
            yield Path(root)


def _grade_in(workdir: Path, db_url: str, settings: Settings, ipc_root: Path,
              lock: GradebookLock, state: dict, due: dict[str, str], executor: Executor) -> list[Result]:
    from nbgrader.api import Gradebook, MissingEntry
    from nbgrader.utils import parse_utc

    api = nbgrader_api(workdir, db_url)
    course_id = config_of(workdir).CourseDirectory.course_id
    submitted = workdir / "submitted"
    names = sorted(p.name for p in (workdir / "source").iterdir() if p.is_dir() and any(p.glob("*.ipynb")))
    unknown = sorted(set(settings.assignments or ()) - set(names))
    if unknown:
        raise ChoiceError(f"no assignment named {', '.join(unknown)} in {workdir / 'source'}")
    sources = {name: {p.stem: nbformat.read(p, as_version=4)
                      for p in sorted((workdir / "source" / name).glob("*.ipynb"))}
               for name in names}
    if due:
        with INTERRUPTS.holding(), lock.held(), Gradebook(db_url, course_id) as gradebook:
            for name, when in due.items():
                gradebook.update_or_create_assignment(name, duedate=parse_utc(when))
    grade_ids = {a: set().union(*(grade_ids_of(nb) for nb in nbs.values())) for a, nbs in sources.items()}
    imports = {a: {notebook: course_imports(nb) for notebook, nb in nbs.items()} for a, nbs in sources.items()}

    run = RunContext(settings, sandbox.isolation_of(settings), "_grader_" + secrets.token_hex(8), ipc_root, imports,
                     cgroups.find(), executor)
    cgroups.sweep(run.cgroups)  # what runners killed outright left behind
    students = sorted(p.name for p in submitted.iterdir() if p.is_dir() and not p.name.startswith("."))
    unknown = sorted(set(settings.students or ()) - set(students))
    if unknown:
        raise ChoiceError(f"no submissions of {', '.join(unknown)} in {submitted}")
    chosen_students = [s for s in students if not settings.students or s in settings.students]
    chosen_names = [n for n in names if not settings.assignments or n in settings.assignments]
    notes: dict[tuple[str, str], list[str]] = {}
    earlier: set[tuple[str, str]] = set()  # graded by an earlier run, unchanged since
    todo: list[tuple[str, str]] = []
    prints: dict[tuple[str, str], str] = {}  # each submission folder's fingerprint as this run found it
    for student in students:
        for name in names:
            folder = submitted / student / name
            if not folder.is_dir():
                notes[student, name] = ["not submitted"]
                continue
            prints[student, name] = fingerprint(folder, recursive=True)
            if (student in chosen_students and name in chosen_names
                    and (settings.regrade or state["graded"].get(f"{student}/{name}") != prints[student, name])):
                todo.append((student, name))
            elif f"{student}/{name}" in state["graded"]:
                earlier.add((student, name))
            else:
                notes[student, name] = ["not graded yet"]
    canary_names = chosen_names if settings.canary == "all" else sorted({name for _, name in todo})
    # The canary's jobs go first; students' follow at once and run beside them (on a cluster, the longest solution
    # notebook would otherwise keep every worker waiting). A pair an earlier run graded keeps what that run left
    # until the canary has passed: a failed canary loses nothing.
    pending = reference.start([(name, notebook, nb) for name in canary_names for notebook, nb in sources[name].items()],
                           workdir, run)
    before = [pair for pair in todo if has_earlier(workdir, state, pair)]
    todo = [pair for pair in todo if pair not in before] + before
    cleared: set[tuple[str, str]] = set()  # what an earlier run kept of these is gone: graded afresh below

    def clear(pairs: list[tuple[str, str]]) -> None:
        for student, name in pairs:
            for kept in EARLIER:
                state.setdefault(kept, {}).pop(f"{student}/{name}", None)
            shutil.rmtree(workdir / EXECUTED / student / name, ignore_errors=True)
            shutil.rmtree(workdir / "jobs" / student / name, ignore_errors=True)
            cleared.add((student, name))
        write_state(workdir, state)

    clear(todo[:len(todo) - len(before)])  # new pairs: at most the job folders of a stopped run

    jobs: dict[tuple[str, str], list[Job]] = {}
    remaining: dict[tuple[str, str], int] = {}
    graded: set[tuple[str, str]] = set(earlier)
    futures: dict = {}
    reached = 0  # the pairs of todo whose jobs are prepared and submitted
    handling_s = 0.0  # this process's own time per finished job (judge, gradebook, feedback): what workers cannot share
    hidden = {name: set().union(*(hidden_lines(nb) for nb in sources[name].values())) for name in names}

    def feedback_in_line(pair: tuple[str, str]) -> list[str]:
        return page_notes(api, workdir, pair, hidden[pair[1]])

    def record(pair: tuple[str, str], pair_notes: list[str]) -> None:
        """The pair's scores and feedback are in: it is graded (state.json says so from here)."""
        key = f"{pair[0]}/{pair[1]}"
        graded.add(pair)
        if pair_notes:
            notes.setdefault(pair, []).extend(pair_notes)
        state["graded"][key] = prints[pair]
        state["rows"][key] = {"note": "; ".join(notes.get(pair, [])),
                              "seconds": round(sum(j.status.get("seconds", 0) for j in jobs[pair]), 1)}
        journal_pair(workdir, state, key)

    feedback = None
    if settings.feedback and todo and (settings.feedback_apart if settings.feedback_apart is not None
                              else usable_cores() - executor.local_cores - 1 >= 1):
        try:
            feedback = FeedbackApart(workdir, db_url, feedback_in_line)
        except (OSError, RuntimeError):  # no process or thread to be had (a limit): the grader makes the pages
            feedback = None
    try:
        # Each job goes to the executor as soon as it is prepared: the first run while the rest are prepared
        # (a class of a thousand has thousands), and nbgrader's release is made while they run.
        for index, (student, name) in enumerate(todo):
            if index == len(todo) - len(before):
                pending.result()
                clear(before)
            folder = submitted / student / name
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
                job_file = ready(job, source, nb, folder, run)
                jobs.setdefault((student, name), []).append(job)
                remaining[student, name] = remaining.get((student, name), 0) + 1
                futures[executor.submit(job_file)] = job
            reached += 1
        references = pending.result()
        for name in canary_names:  # nbgrader's release and gradebook entries: only of what this run grades
            source_print = fingerprint(workdir / "source" / name, recursive=True)
            if state["generated"].get(name) != source_print or not (workdir / "release" / name).is_dir():
                with INTERRUPTS.holding(), lock.held():
                    outcome = api.generate_assignment(name, force=True)
                if not outcome["success"]:
                    raise RuntimeError(f"could not generate {name}:\n{outcome.get('error') or outcome.get('log')}")
                state["generated"][name] = source_print
        write_state(workdir, state)
        progress = Progress(len(futures), settings.progress)
        for future in as_completed(futures):
            if future.exception() is not None:  # the cluster could not run the job (a ClusterError)
                raise future.exception()
            began = time.monotonic()
            job = futures[future]
            pair = (job.student, job.assignment)
            executed = judge(job, sources[job.assignment][job.notebook], references[job.assignment][job.notebook])
            target = workdir / EXECUTED / job.student / job.assignment
            target.mkdir(parents=True, exist_ok=True)
            nbformat.write(executed, target / f"{job.notebook}.ipynb")
            for kept in SUBMISSION_FILES:  # the submission's time (late penalty) and nbgrader's feedback key
                if (submitted / job.student / job.assignment / kept).is_file():
                    shutil.copy2(submitted / job.student / job.assignment / kept, target / kept)
            if job.status.get("stopped"):
                notes.setdefault(pair, []).append(f"{job.notebook}: stopped, {job.status['stopped']}")
            if job.status.get("disk_full"):
                notes.setdefault(pair, []).append(f"{job.notebook}: filled the disk limit of "
                                                  f"{job.status['disk_full']} MiB (writes past it failed)")
            if job.findings:
                notes.setdefault(pair, []).append(f"{job.notebook}: score withheld for review, "
                                                  + "; ".join(job.findings[:3]))
                state.setdefault("withheld", {}).setdefault(f"{job.student}/{job.assignment}", {})[job.notebook] = \
                    job.findings
            remaining[pair] -= 1
            if remaining[pair] == 0:
                # Scores and feedback of a finished pair, while the pool runs the next notebooks.
                with INTERRUPTS.holding():
                    with lock.held():
                        outcome = api.autograde(job.assignment, job.student, force=True, create=True)
                    if outcome["success"]:
                        key = f"{job.student}/{job.assignment}"
                        if key in state.get("withheld", {}):
                            with lock.held():
                                flag_for_review(db_url, course_id, pair, state["withheld"][key])
                        if feedback is not None:
                            feedback.hand_on(pair, hidden[job.assignment])
                        else:
                            record(pair, feedback_in_line(pair) if settings.feedback else [])
                    else:
                        notes.setdefault(pair, []).append("not graded: "
                                                          + failure_of(outcome))
            if feedback is not None:  # the pages made so far; at most depth - 1 left waiting
                feedback.deliver(record, INTERRUPTS.holding, keep=feedback.depth - 1)
            progress.step(f"{job.student}/{job.assignment}")
            handling_s += time.monotonic() - began
        if feedback is not None:
            feedback.deliver(record, INTERRUPTS.holding)
    except (KeyboardInterrupt, ClusterError) as error:
        executor.stop()
        pending.close()
        unfinished = {pair for pair, left in remaining.items() if left} | set(todo[reached:])
        if feedback is not None:  # the pairs nbgrader has graded get their pages (a few, a second or so each)
            try:
                feedback.deliver(record, INTERRUPTS.holding)
            except KeyboardInterrupt:  # asked again: the run ends now, the pairs still waiting not graded
                pass
            unfinished |= set(feedback.close())
        unfinished = sorted(unfinished)
        discard(workdir, [pair for pair in unfinished if pair in cleared])
        write_state(workdir, state)  # the pairs graded before the stop, in state.json itself
        if isinstance(error, ClusterError):
            raise GradingStopped(0, sorted(graded), unfinished, reason=f"grading stopped: {error}") from None
        raise GradingStopped(INTERRUPTS.received, sorted(graded), unfinished) from None
    except BaseException:  # a failed canary, a release nbgrader cannot make: no job goes on without the run
        executor.stop()
        pending.close()
        if feedback is not None:
            feedback.close()
        discard(workdir, [pair for pair, left in remaining.items() if left and pair in cleared])
        raise
    if feedback is not None:
        feedback.close()
    cgroups.sweep(run.cgroups)
    state["finished"] = True
    # The assignments whose references this run checked (made, or kept under the same key), for a run with no
    # submissions that made them ahead.
    state["last_run"] = {"jobs": len(futures), "grader_s": round(handling_s, 2), "references": sorted(references)}
    if feedback is not None:
        state["last_run"]["feedback_apart_s"] = round(feedback.seconds, 2)
    write_state(workdir, state)

    devices = devices_text()
    results = []
    with Gradebook(db_url, course_id) as gradebook:
        for student in students:
            for name in names:
                # nbgrader's maximum (every grade cell's points), also of an assignment it has not generated
                max_score = sum(total_points(nb) for nb in sources[name].values())
                pair, key = (student, name), f"{student}/{name}"
                pair_notes = notes.get(pair, [])
                seconds = sum(j.status.get("seconds", 0) for j in jobs.get(pair, []))
                if pair in earlier:
                    row = state["rows"].get(key, {})
                    pair_notes = [row["note"]] if row.get("note") else []
                    pair_notes.append("graded by an earlier run" + (
                        ", changed since" if state["graded"][key] != prints[pair] else ""))
                    seconds = row.get("seconds", 0.0)
                score = None
                if pair in graded:
                    try:
                        submission = gradebook.find_submission(name, student)
                        score = submission.score
                        if submission.late_submission_penalty:
                            pair_notes = [*pair_notes, f"late by {late_text(submission.total_seconds_late)}: "
                                                       f"-{submission.late_submission_penalty:g} points"]
                        by_hand = hand_graded_points_left(submission)
                        if by_hand:
                            pair_notes = [*pair_notes, f"{by_hand:g} points of written answers to grade by hand "
                                                       "(formgrader)"]
                    except MissingEntry:
                        pair_notes = [*pair_notes, "not graded: no submission in the gradebook"]
                ran = any(j.status.get("seconds") for j in jobs.get(pair, []))
                withheld = key in state.get("withheld", {}) and pair in graded
                if withheld:
                    pair_notes = [*pair_notes, f"review: python -m autograder.record.review {key} --release "
                                               "(or --confirm), or in formgrader"]
                results.append(Result(student, name, score, max_score, "; ".join(pair_notes),
                                      devices if ran else "", round(seconds, 1), withheld=withheld))
    return results


SUBMISSION_FILES = ("timestamp.txt", "submission_secret.txt")


def has_earlier(workdir: Path, state: dict, pair: tuple[str, str]) -> bool:
    """Whether an earlier run left anything of the pair: a score, a withheld or reviewed row, executed notebooks."""
    key = f"{pair[0]}/{pair[1]}"
    return (any(key in state.get(kept, {}) for kept in EARLIER)
            or (workdir / EXECUTED / pair[0] / pair[1]).exists())


def discard(workdir: Path, pairs: list[tuple[str, str]]) -> None:
    """What a stopped run's unfinished pairs wrote is not graded: nothing of it stays."""
    for student, name in pairs:
        shutil.rmtree(workdir / "jobs" / student / name, ignore_errors=True)
        with contextlib.suppress(OSError):
            (workdir / "jobs" / student).rmdir()  # if no other assignment of theirs is there


def late_text(seconds: float) -> str:
    hours = seconds / 3600
    return f"{hours / 24:.1f} days" if hours >= 24 else f"{hours:.1f} hours"


