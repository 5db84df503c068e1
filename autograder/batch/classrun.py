"""One grading of a class in a work folder, as the phases :func:`autograder.batch.grade` runs in order."""

from __future__ import annotations

import secrets
import shutil
import time
from concurrent.futures import as_completed
from pathlib import Path

import nbformat

from autograder.batch.stop import INTERRUPTS, ChoiceError, GradingStopped
from autograder.batch.workdir import SUBMISSION_FILES, discard, has_earlier, submitted_notebook
from autograder.course.cells import grade_ids_of, hidden_test_lines
from autograder.course.config import answer_stubs, course_directory
from autograder.judge import reference
from autograder.judge.verdict import judge
from autograder.prepare.job import Job, course_imports
from autograder.prepare.submission import OverLimit, SubmissionError, fingerprint, read_submission
from autograder.record.feedback import page_notes
from autograder.record.feedback_worker import FeedbackApart
from autograder.record.gradebook import EXECUTED, GradebookLock, failure_of, nbgrader_api, ready_gradebook
from autograder.record.marks import flag_for_review
from autograder.record.report import Progress
from autograder.record.state import WorkState, journal_pair, write_state
from autograder.run import cgroups, sandbox
from autograder.run.cgroups import usable_cores
from autograder.run.executors import ClusterError, Executor
from autograder.run.jobfile import RunContext, ready
from autograder.settings import Pair, Settings



class ClassRun:
    """What one run knows as it goes: the course, who is graded, the jobs under way, and what each pair got."""

    def __init__(self, workdir: Path, db_url: str, settings: Settings, ipc_root: Path, lock: GradebookLock,
                 state: WorkState, executor: Executor):
        self.workdir, self.db_url, self.settings, self.lock = workdir, db_url, settings, lock
        self.state, self.executor, self.ipc_root = state, executor, ipc_root
        with lock.held():
            ready_gradebook(db_url)
        self.api = nbgrader_api(workdir, db_url)
        self.course_id = course_directory(workdir).course_id
        self.submitted = workdir / "submitted"
        self.notes: dict[Pair, list[str]] = {}
        self.earlier: set[Pair] = set()  # graded by an earlier run, unchanged since
        self.todo: list[Pair] = []
        self.before: list[Pair] = []  # of todo, what an earlier run left something of: cleared once the canary passed
        self.prints: dict[Pair, str] = {}  # each submission folder's fingerprint as this run found it
        self.cleared: set[Pair] = set()  # what an earlier run kept of these is gone: graded afresh
        self.jobs: dict[Pair, list[Job]] = {}
        self.remaining: dict[Pair, int] = {}
        self.graded: set[Pair] = set()
        self.futures: dict = {}
        self.reached = 0  # the pairs of todo whose jobs are prepared and submitted
        self.handling_s = 0.0  # this process's own time per finished job: what workers cannot share
        self.feedback: FeedbackApart | None = None
        self.pending = None
        self.references: dict = {}

    # ---- 1. the course: its assignments, their notebooks, the due dates, what every job of the run shares
    def read_course(self, due: dict[str, str]) -> None:
        settings, source_dir = self.settings, self.workdir / "source"
        self.names = sorted(p.name for p in source_dir.iterdir() if p.is_dir() and any(p.glob("*.ipynb")))
        unknown = sorted(set(settings.assignments or ()) - set(self.names))
        if unknown:
            raise ChoiceError(f"no assignment named {', '.join(unknown)} in {source_dir}")
        self.sources = {name: {p.stem: nbformat.read(p, as_version=4)
                               for p in sorted((source_dir / name).glob("*.ipynb"))} for name in self.names}
        if due:
            self._record_due(due)
        sources = self.sources.items()
        self.grade_ids = {a: set().union(*(grade_ids_of(nb) for nb in nbs.values())) for a, nbs in sources}
        self.hidden = {a: set().union(*(hidden_test_lines(nb) for nb in nbs.values())) for a, nbs in sources}
        imports = {a: {notebook: course_imports(nb) for notebook, nb in nbs.items()} for a, nbs in sources}
        self.run = RunContext(settings, sandbox.isolation_of(settings), "_grader_" + secrets.token_hex(8),
                              self.ipc_root, imports, cgroups.find(), self.executor, answer_stubs(self.workdir))
        cgroups.sweep(self.run.cgroups)  # what runners killed outright left behind

    def _record_due(self, due: dict[str, str]) -> None:
        from nbgrader.api import Gradebook
        from nbgrader.utils import parse_utc

        with INTERRUPTS.holding(), self.lock.held(), Gradebook(self.db_url, self.course_id) as gradebook:
            for name, when in due.items():
                gradebook.update_or_create_assignment(name, duedate=parse_utc(when))

    # ---- 2. who is graded: every pair not graded yet, or changed since an earlier run graded it
    def choose(self) -> None:
        settings, state = self.settings, self.state
        self.students = sorted(p.name for p in self.submitted.iterdir() if p.is_dir() and not p.name.startswith("."))
        unknown = sorted(set(settings.students or ()) - set(self.students))
        if unknown:
            raise ChoiceError(f"no submissions of {', '.join(unknown)} in {self.submitted}")
        chosen_students = [s for s in self.students if not settings.students or s in settings.students]
        self.chosen_names = [n for n in self.names if not settings.assignments or n in settings.assignments]
        for student in self.students:
            for name in self.names:
                folder = self.submitted / student / name
                if not folder.is_dir():
                    self.notes[student, name] = ["not submitted"]
                    continue
                self.prints[student, name] = fingerprint(folder, recursive=True)
                key = Pair(student, name).key
                changed = state.graded.get(key) != self.prints[student, name]
                if student in chosen_students and name in self.chosen_names and (settings.regrade or changed):
                    self.todo.append((student, name))
                elif key in state.graded:
                    self.earlier.add((student, name))
                else:
                    self.notes[student, name] = ["not graded yet"]
        self.graded = set(self.earlier)

    # ---- 3. the references: the instructor's solutions run first, in the same sandbox
    def start_references(self) -> None:
        """The canary's jobs go first; students' follow at once and run beside them (on a cluster, the longest
        solution notebook would otherwise keep every worker waiting). A pair an earlier run graded keeps what that
        run left until the canary has passed: a failed canary loses nothing."""
        self.canary_names = (self.chosen_names if self.settings.canary == "all"
                             else sorted({name for _, name in self.todo}))
        self.pending = reference.start([(name, notebook, nb) for name in self.canary_names
                                        for notebook, nb in self.sources[name].items()], self.workdir, self.run)
        self.before = [pair for pair in self.todo if has_earlier(self.workdir, self.state, pair)]
        self.todo = [pair for pair in self.todo if pair not in self.before] + self.before
        self._clear(self.todo[:len(self.todo) - len(self.before)])  # new pairs: at most a stopped run's job folders

    def _clear(self, pairs: list[Pair]) -> None:
        for student, name in pairs:
            self.state.forget(Pair(student, name).key)
            shutil.rmtree(self.workdir / EXECUTED / student / name, ignore_errors=True)
            shutil.rmtree(self.workdir / "jobs" / student / name, ignore_errors=True)
            self.cleared.add((student, name))
        write_state(self.workdir, self.state)

    def open_feedback(self) -> None:
        """The feedback pages in a process of their own where a core is left over for it (or where asked)."""
        settings = self.settings
        apart = (settings.feedback_apart if settings.feedback_apart is not None
                 else usable_cores() - self.executor.local_cores - 1 >= 1)
        if settings.feedback and self.todo and apart:
            try:
                self.feedback = FeedbackApart(self.workdir, self.db_url, self._feedback_in_line)
            except (OSError, RuntimeError):  # no process or thread to be had (a limit): the grader makes the pages
                self.feedback = None

    # ---- 4. the jobs: each submitted notebook prepared and handed to the executor at once
    def submit(self) -> None:
        """Each job goes to the executor as soon as it is prepared: the first runs while the rest are prepared
        (a class of a thousand has thousands), and nbgrader's release is made while they run."""
        for index, (student, name) in enumerate(self.todo):
            if index == len(self.todo) - len(self.before):
                self.pending.result()
                self._clear(self.before)
            self._submit_pair(student, name)
            self.reached += 1
        self.references = self.pending.result()

    def _submit_pair(self, student: str, name: str) -> None:
        folder, pair = self.submitted / student / name, (student, name)
        others = {a: ids for a, ids in self.grade_ids.items() if a != name}
        for notebook, source in self.sources[name].items():
            path = submitted_notebook(folder, notebook)
            if path is None:
                self.notes.setdefault(pair, []).append(f"{notebook}.ipynb missing: 0 points for it")
                continue
            if path.name != f"{notebook}.ipynb":
                self.notes.setdefault(pair, []).append(f"graded {path.name} as {notebook}.ipynb")
            try:
                nb = read_submission(path, grade_ids_of(source), others)
            except OverLimit as error:  # graded without an answer: 0 points, and its gradebook entry says so
                self.notes.setdefault(pair, []).append(str(error))
                nb = nbformat.v4.new_notebook(metadata=source.metadata)
            except SubmissionError as error:
                self.notes.setdefault(pair, []).append(f"not graded: {error}")
                continue
            job = Job(student, name, notebook, self.workdir / "jobs" / student / name / notebook)
            job_file = ready(job, source, nb, folder, self.run)
            self.jobs.setdefault(pair, []).append(job)
            self.remaining[pair] = self.remaining.get(pair, 0) + 1
            self.futures[self.executor.submit(job_file)] = job

    # ---- 5. nbgrader's release and gradebook entries, only of what this run grades
    def release(self) -> None:
        state = self.state
        for name in self.canary_names:
            source_print = fingerprint(self.workdir / "source" / name, recursive=True)
            if state.generated.get(name) != source_print or not (self.workdir / "release" / name).is_dir():
                with INTERRUPTS.holding(), self.lock.held():
                    outcome = self.api.generate_assignment(name, force=True)
                if not outcome["success"]:
                    raise RuntimeError(f"could not generate {name}:\n{outcome.get('error') or outcome.get('log')}")
                state.generated[name] = source_print
        write_state(self.workdir, state)

    # ---- 6. each finished job judged; each finished pair autograded by nbgrader, with its feedback
    def collect(self) -> None:
        progress = Progress(len(self.futures), self.settings.progress)
        for future in as_completed(self.futures):
            if future.exception() is not None:  # the cluster could not run the job (a ClusterError)
                raise future.exception()
            began = time.monotonic()
            job = self.futures[future]
            self._judge(job)
            pair = (job.student, job.assignment)
            self.remaining[pair] -= 1
            if self.remaining[pair] == 0:  # its scores and feedback, while the pool runs the next notebooks
                self._autograde(pair)
            if self.feedback is not None:  # the pages made so far; at most depth - 1 left waiting
                self.feedback.deliver(self._record, INTERRUPTS.holding, keep=self.feedback.depth - 1)
            progress.step(Pair(job.student, job.assignment).key)
            self.handling_s += time.monotonic() - began
        if self.feedback is not None:
            self.feedback.deliver(self._record, INTERRUPTS.holding)

    def _judge(self, job: Job) -> None:
        """The job's verdict, written where nbgrader's autograde reads it, with the notes its run leaves."""
        pair, notes = (job.student, job.assignment), self.notes
        executed = judge(job, self.sources[job.assignment][job.notebook],
                         self.references[job.assignment][job.notebook])
        target = self.workdir / EXECUTED / job.student / job.assignment
        target.mkdir(parents=True, exist_ok=True)
        nbformat.write(executed, target / f"{job.notebook}.ipynb")
        for kept in SUBMISSION_FILES:
            if (self.submitted / job.student / job.assignment / kept).is_file():
                shutil.copy2(self.submitted / job.student / job.assignment / kept, target / kept)
        if job.status.stopped:
            notes.setdefault(pair, []).append(f"{job.notebook}: stopped, {job.status.stopped}")
        if job.status.disk_full:
            notes.setdefault(pair, []).append(f"{job.notebook}: filled the disk limit of "
                                              f"{job.status.disk_full} MiB (writes past it failed)")
        if job.findings:
            notes.setdefault(pair, []).append(f"{job.notebook}: score withheld for review, "
                                              + "; ".join(job.findings[:3]))
            withheld = self.state.withheld.setdefault(Pair(job.student, job.assignment).key, {})
            withheld[job.notebook] = job.findings

    def _autograde(self, pair: Pair) -> None:
        student, name = pair
        with INTERRUPTS.holding():
            with self.lock.held():
                outcome = self.api.autograde(name, student, force=True, create=True)
            if not outcome["success"]:
                self.notes.setdefault(pair, []).append("not graded: " + failure_of(outcome))
                return
            key = Pair(student, name).key
            if key in self.state.withheld:
                with self.lock.held():
                    flag_for_review(self.db_url, self.course_id, pair, self.state.withheld[key])
            if self.feedback is not None:
                self.feedback.hand_on(pair, self.hidden[name])
            else:
                self._record(pair, self._feedback_in_line(pair) if self.settings.feedback else [])

    def _feedback_in_line(self, pair: Pair) -> list[str]:
        return page_notes(self.api, self.workdir, pair, self.hidden[pair[1]])

    def _record(self, pair: Pair, pair_notes: list[str]) -> None:
        """The pair's scores and feedback are in: it is graded (state.json says so from here)."""
        key = Pair(*pair).key
        self.graded.add(pair)
        if pair_notes:
            self.notes.setdefault(pair, []).extend(pair_notes)
        self.state.graded[key] = self.prints[pair]
        self.state.rows[key] = {"note": "; ".join(self.notes.get(pair, [])),
                                "seconds": round(sum(j.status.seconds for j in self.jobs[pair]), 1)}
        journal_pair(self.workdir, self.state, key)

    # ---- 7. the end: a run stopped, a run that failed, or a run done
    def stopped(self, error: BaseException) -> GradingStopped:
        """A run stopped (a signal, a cluster that could not run a job): what was graded stays graded."""
        self.executor.stop()
        self.pending.close()
        unfinished = {pair for pair, left in self.remaining.items() if left} | set(self.todo[self.reached:])
        if self.feedback is not None:  # the pairs nbgrader has graded get their pages (a few, a second or so each)
            try:
                self.feedback.deliver(self._record, INTERRUPTS.holding)
            except KeyboardInterrupt:  # asked again: the run ends now, the pairs still waiting not graded
                pass
            unfinished |= set(self.feedback.close())
        unfinished = sorted(unfinished)
        discard(self.workdir, [pair for pair in unfinished if pair in self.cleared])
        write_state(self.workdir, self.state)  # the pairs graded before the stop, in state.json itself
        if isinstance(error, ClusterError):
            return GradingStopped(0, sorted(self.graded), unfinished, reason=f"grading stopped: {error}")
        return GradingStopped(INTERRUPTS.received, sorted(self.graded), unfinished)

    def failed(self) -> None:
        """A failed canary, a release nbgrader cannot make: no job goes on without the run."""
        self.executor.stop()
        if self.pending is not None:
            self.pending.close()
        if self.feedback is not None:
            self.feedback.close()
        discard(self.workdir, [pair for pair, left in self.remaining.items() if left and pair in self.cleared])

    def finish(self) -> None:
        if self.feedback is not None:
            self.feedback.close()
        cgroups.sweep(self.run.cgroups)
        state = self.state
        state.finished = True
        # The assignments whose references this run checked (made, or kept under the same key), for a run with no
        # submissions that made them ahead.
        state.last_run = {"jobs": len(self.futures), "grader_s": round(self.handling_s, 2),
                          "references": sorted(self.references)}
        if self.feedback is not None:
            state.last_run["feedback_apart_s"] = round(self.feedback.seconds, 2)
        write_state(self.workdir, state)
