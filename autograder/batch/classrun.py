"""One grading of a class in a work folder, as the phases :func:`autograder.batch.grade` runs in
order."""

from __future__ import annotations

import secrets
import shutil
import time
from concurrent.futures import as_completed
from pathlib import Path

import nbformat

from autograder.batch.records import Course, Submission, longest_first
from autograder.batch.stop import INTERRUPTS, ChoiceError, GradingStopped
from autograder.batch.workdir import SUBMISSION_FILES, discard, has_earlier, submitted_notebook
from autograder.course.cells import grade_ids_of
from autograder.course.config import answer_stubs, course_directory
from autograder.judge import reference
from autograder.judge.verdict import judge
from autograder.prepare.job import Job
from autograder.prepare.submission import OverLimit, SubmissionError, fingerprint, read_submission
from autograder.record.feedback import page_notes
from autograder.record.feedback_worker import FeedbackApart
from autograder.record.gradebook import (
    EXECUTED,
    GradebookLock,
    failure_of,
    nbgrader_api,
    ready_gradebook,
)
from autograder.record.marks import flag_for_review
from autograder.record.report import Progress
from autograder.record.state import WorkState, journal_pair, write_state
from autograder.run import cgroups, sandbox
from autograder.run.cgroups import usable_cores
from autograder.run.executors import ClusterError, Executor
from autograder.run.jobfile import RunContext, ready
from autograder.settings import Pair, Settings


class ClassRun:
    """What one run knows as it goes: the course, who is graded, the jobs under way, and what each
    pair got."""

    def __init__(
        self,
        workdir: Path,
        db_url: str,
        settings: Settings,
        ipc_root: Path,
        lock: GradebookLock,
        state: WorkState,
        executor: Executor,
    ):
        self.workdir, self.db_url, self.settings, self.lock = workdir, db_url, settings, lock
        self.state, self.executor, self.ipc_root = state, executor, ipc_root
        with lock.held():
            ready_gradebook(db_url)
        self.api = nbgrader_api(workdir, db_url)
        self.course_id = course_directory(workdir).course_id
        self.submitted = workdir / "submitted"
        self.course = Course()  # read by read_course
        self.run: RunContext | None = None  # what every job of the run shares
        # who is graded (choose): every pair of the class, and those this run grades, in the order
        # it submits them
        self.students: list[str] = []
        self.chosen_names: list[str] = []
        self.canary_names: list[str] = []
        self.submissions: dict[Pair, Submission] = {}
        self.todo: list[Submission] = []
        self.futures: dict = {}  # the executor's future -> its Job
        self.reached = 0  # the pairs of todo whose jobs are prepared and submitted
        self.handling_s = 0.0  # this process's own time per finished job: what workers cannot share
        self.feedback: FeedbackApart | None = None
        self.pending = None
        self.references: dict = {}

    # ---- 1. the course: its assignments and notebooks, the due dates, what every job shares
    def read_course(self, due: dict[str, str]) -> None:
        settings, source_dir = self.settings, self.workdir / "source"
        self.course = Course.read(source_dir)
        unknown = sorted(set(settings.assignments or ()) - set(self.course.names))
        if unknown:
            raise ChoiceError(f"no assignment named {', '.join(unknown)} in {source_dir}")
        if due:
            self._record_due(due)
        self.run = RunContext(
            settings,
            sandbox.isolation_of(settings),
            "_grader_" + secrets.token_hex(8),
            self.ipc_root,
            self.course.imports,
            cgroups.find(),
            self.executor,
            answer_stubs(self.workdir),
        )
        cgroups.sweep(self.run.cgroups)  # what runners killed outright left behind

    def _record_due(self, due: dict[str, str]) -> None:
        from nbgrader.api import Gradebook
        from nbgrader.utils import parse_utc

        with (
            INTERRUPTS.holding(),
            self.lock.held(),
            Gradebook(self.db_url, self.course_id) as gradebook,
        ):
            for name, when in due.items():
                gradebook.update_or_create_assignment(name, duedate=parse_utc(when))

    # ---- 2. who is graded: every pair not graded yet, or changed since an earlier run graded it
    def choose(self) -> None:
        settings, state = self.settings, self.state
        self.students = sorted(
            p.name for p in self.submitted.iterdir() if p.is_dir() and not p.name.startswith(".")
        )
        unknown = sorted(set(settings.students or ()) - set(self.students))
        if unknown:
            raise ChoiceError(f"no submissions of {', '.join(unknown)} in {self.submitted}")
        chosen_students = [
            s for s in self.students if not settings.students or s in settings.students
        ]
        self.chosen_names = [
            n for n in self.course.names if not settings.assignments or n in settings.assignments
        ]
        for student in self.students:
            for name in self.course.names:
                pair = Pair(student, name)
                submission = self.submissions[pair] = Submission(pair)
                folder = self.submitted / student / name
                if not folder.is_dir():
                    submission.notes.append("not submitted")
                    continue
                submission.fingerprint = fingerprint(folder, recursive=True)
                changed = state.graded.get(pair.key) != submission.fingerprint
                if (
                    student in chosen_students
                    and name in self.chosen_names
                    and (settings.regrade or changed)
                ):
                    self.todo.append(submission)
                elif pair.key in state.graded:
                    submission.earlier = submission.graded = True
                else:
                    submission.notes.append("not graded yet")

    def graded_pairs(self) -> list[Pair]:
        """The pairs graded, by this run or an earlier one."""
        return sorted(s.pair for s in self.submissions.values() if s.graded)

    # ---- 3. the references: the instructor's solutions run first, in the same sandbox
    def start_references(self) -> None:
        """The canary's jobs go first; students' follow at once and run beside them (on a cluster,
        the longest solution notebook would otherwise keep every worker waiting), the longest
        first where references kept say how long. A pair an earlier run graded keeps what that run
        left until the canary has passed: a failed canary loses nothing."""
        self.canary_names = (
            self.chosen_names
            if self.settings.canary == "all"
            else sorted({s.pair.assignment for s in self.todo})
        )
        self.pending = reference.start(
            [
                (name, notebook, nb)
                for name in self.canary_names
                for notebook, nb in self.course.sources[name].items()
            ],
            self.workdir,
            self.run,
        )
        for submission in self.todo:
            submission.before = has_earlier(self.workdir, self.state, submission.pair)
        self.todo = longest_first(self.todo, self.pending.costs)
        # new pairs: at most a stopped run's job folders
        self._clear([s for s in self.todo if not s.before])

    def _clear(self, submissions: list[Submission]) -> None:
        for submission in submissions:
            student, name = submission.pair
            self.state.forget(submission.pair.key)
            shutil.rmtree(self.workdir / EXECUTED / student / name, ignore_errors=True)
            shutil.rmtree(self.workdir / "jobs" / student / name, ignore_errors=True)
            submission.cleared = True
        write_state(self.workdir, self.state)

    def open_feedback(self) -> None:
        """The feedback pages in a process of their own where a core is left over for it (or where
        asked)."""
        settings = self.settings
        apart = (
            settings.feedback_apart
            if settings.feedback_apart is not None
            else usable_cores() - self.executor.local_cores - 1 >= 1
        )
        if settings.feedback and self.todo and apart:
            try:
                self.feedback = FeedbackApart(self.workdir, self.db_url, self._feedback_in_line)
            except (OSError, RuntimeError):
                # no process or thread to be had (a limit): the grader makes the pages
                self.feedback = None

    # ---- 4. the jobs: each submitted notebook prepared and handed to the executor at once
    def submit(self) -> None:
        """Each job goes to the executor as soon as it is prepared: the first runs while the rest
        are prepared (a class of a thousand has thousands), and nbgrader's release is made while
        they run."""
        new = sum(not s.before for s in self.todo)
        for index, submission in enumerate(self.todo):
            if index == new:
                self.pending.result()
                self._clear(self.todo[new:])
            self._submit_pair(submission)
            self.reached += 1
        self.references = self.pending.result()

    def _submit_pair(self, submission: Submission) -> None:
        (student, name), notes = submission.pair, submission.notes
        folder = self.submitted / student / name
        others = {a: ids for a, ids in self.course.grade_ids.items() if a != name}
        for notebook, source in self.course.sources[name].items():
            path = submitted_notebook(folder, notebook)
            if path is None:
                notes.append(f"{notebook}.ipynb missing: 0 points for it")
                continue
            if path.name != f"{notebook}.ipynb":
                notes.append(f"graded {path.name} as {notebook}.ipynb")
            try:
                nb = read_submission(path, grade_ids_of(source), others)
            except OverLimit as error:
                # graded without an answer: 0 points, and its gradebook entry says so
                notes.append(str(error))
                nb = nbformat.v4.new_notebook(metadata=source.metadata)
            except SubmissionError as error:
                notes.append(f"not graded: {error}")
                continue
            job = Job(student, name, notebook, self.workdir / "jobs" / student / name / notebook)
            job_file = ready(job, source, nb, folder, self.run)
            submission.jobs.append(job)
            submission.remaining += 1
            self.futures[self.executor.submit(job_file)] = job

    # ---- 5. nbgrader's release and gradebook entries, only of what this run grades
    def release(self) -> None:
        state = self.state
        for name in self.canary_names:
            source_print = fingerprint(self.workdir / "source" / name, recursive=True)
            if (
                state.generated.get(name) != source_print
                or not (self.workdir / "release" / name).is_dir()
            ):
                with INTERRUPTS.holding(), self.lock.held():
                    outcome = self.api.generate_assignment(name, force=True)
                if not outcome["success"]:
                    raise RuntimeError(
                        f"could not generate {name}:\n{outcome.get('error') or outcome.get('log')}"
                    )
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
            submission = self.submissions[Pair(job.student, job.assignment)]
            self._judge(job, submission.notes)
            submission.remaining -= 1
            # its scores and feedback, while the pool runs the next notebooks
            if submission.remaining == 0:
                self._autograde(submission.pair)
            if self.feedback is not None:  # the pages made so far; at most depth - 1 left waiting
                self.feedback.deliver(
                    self._record, INTERRUPTS.holding, keep=self.feedback.depth - 1
                )
            progress.step(Pair(job.student, job.assignment).key)
            self.handling_s += time.monotonic() - began
        if self.feedback is not None:
            self.feedback.deliver(self._record, INTERRUPTS.holding)

    def _judge(self, job: Job, notes: list[str]) -> None:
        """The job's verdict, written where nbgrader's autograde reads it, with the notes its run
        leaves."""
        executed = judge(
            job,
            self.course.sources[job.assignment][job.notebook],
            self.references[job.assignment][job.notebook],
        )
        target = self.workdir / EXECUTED / job.student / job.assignment
        target.mkdir(parents=True, exist_ok=True)
        nbformat.write(executed, target / f"{job.notebook}.ipynb")
        for kept in SUBMISSION_FILES:
            if (self.submitted / job.student / job.assignment / kept).is_file():
                shutil.copy2(self.submitted / job.student / job.assignment / kept, target / kept)
        if job.status.stopped:
            notes.append(f"{job.notebook}: stopped, {job.status.stopped}")
        if job.status.disk_full:
            notes.append(
                f"{job.notebook}: filled the disk limit of {job.status.disk_full} MiB (writes past"
                " it failed)"
            )
        if job.findings:
            notes.append(
                f"{job.notebook}: score withheld for review, " + "; ".join(job.findings[:3])
            )
            withheld = self.state.withheld.setdefault(Pair(job.student, job.assignment).key, {})
            withheld[job.notebook] = job.findings

    def _autograde(self, pair: Pair) -> None:
        student, name = pair
        with INTERRUPTS.holding():
            with self.lock.held():
                outcome = self.api.autograde(name, student, force=True, create=True)
            if not outcome["success"]:
                self.submissions[pair].notes.append("not graded: " + failure_of(outcome))
                return
            key = Pair(student, name).key
            if key in self.state.withheld:
                with self.lock.held():
                    flag_for_review(self.db_url, self.course_id, pair, self.state.withheld[key])
            if self.feedback is not None:
                self.feedback.hand_on(pair, self.course.hidden[name])
            else:
                self._record(pair, self._feedback_in_line(pair) if self.settings.feedback else [])

    def _feedback_in_line(self, pair: Pair) -> list[str]:
        return page_notes(self.api, self.workdir, pair, self.course.hidden[pair[1]])

    def _record(self, pair: Pair, pair_notes: list[str]) -> None:
        """The pair's scores and feedback are in: it is graded (state.json says so from here)."""
        submission = self.submissions[Pair(*pair)]
        key = submission.pair.key
        submission.graded = True
        submission.notes.extend(pair_notes)
        self.state.graded[key] = submission.fingerprint
        self.state.rows[key] = {
            "note": "; ".join(submission.notes),
            "seconds": round(sum(j.status.seconds for j in submission.jobs), 1),
        }
        journal_pair(self.workdir, self.state, key)

    # ---- 7. the end: a run stopped, a run that failed, or a run done
    def stopped(self, error: BaseException) -> GradingStopped:
        """A run stopped (a signal, a cluster that could not run a job): what was graded stays
        graded."""
        self.executor.stop()
        self.pending.close()
        unfinished = {s.pair for s in self.submissions.values() if s.remaining} | {
            s.pair for s in self.todo[self.reached :]
        }
        # the pairs nbgrader has graded get their pages (a few, a second or so each)
        if self.feedback is not None:
            try:
                self.feedback.deliver(self._record, INTERRUPTS.holding)
            except KeyboardInterrupt:
                # asked again: the run ends now, the pairs still waiting not graded
                pass
            unfinished |= set(self.feedback.close())
        unfinished = sorted(unfinished)
        discard(
            self.workdir, [pair for pair in unfinished if self.submissions[Pair(*pair)].cleared]
        )
        # the pairs graded before the stop, in state.json itself
        write_state(self.workdir, self.state)
        if isinstance(error, ClusterError):
            return GradingStopped(
                0, self.graded_pairs(), unfinished, reason=f"grading stopped: {error}"
            )
        return GradingStopped(INTERRUPTS.received, self.graded_pairs(), unfinished)

    def failed(self) -> None:
        """A failed canary, a release nbgrader cannot make: no job goes on without the run."""
        self.executor.stop()
        if self.pending is not None:
            self.pending.close()
        if self.feedback is not None:
            self.feedback.close()
        discard(
            self.workdir, [s.pair for s in self.submissions.values() if s.remaining and s.cleared]
        )

    def finish(self) -> None:
        if self.feedback is not None:
            self.feedback.close()
        cgroups.sweep(self.run.cgroups)
        state = self.state
        state.finished = True
        # The assignments whose references this run checked (made, or kept under the same key), for
        # a run with no submissions that made them ahead.
        state.last_run = {
            "jobs": len(self.futures),
            "grader_s": round(self.handling_s, 2),
            "references": sorted(self.references),
        }
        if self.feedback is not None:
            state.last_run["feedback_apart_s"] = round(self.feedback.seconds, 2)
        write_state(self.workdir, state)
