"""Check tests/mistakes/catalog.py against the solution notebooks.

For every entry of the catalog, the answer cell whose ``grade_id`` is
``entry.answer`` in ``solutions/<assignment>/<assignment>.ipynb`` is replaced
by ``entry.code`` (the mistake) or ``entry.fix`` (the other correct answer),
the notebook is executed with errors allowed, and the graded test cells that
follow that answer cell (up to the next answer cell) are inspected:

* a mistake is good when at least one of those test cells raised, and raised otherwise than it
  does with the course's own solution (each assignment's unmodified solution notebook is run
  once too, so that a test cell that fails anyway, on this machine, is not credited to a mistake);
* a fix is good when none of them raised.

In both cases the answer cell itself must run without an error (a mistake
must be a plausible answer, not a broken cell).

Several entries of one assignment share a notebook execution when they
replace different answer cells and none of them uses what another one's cell
defines. At most ``--jobs`` notebooks (default 2) run at once.

Usage (from the repository root)::

    .venv/bin/python tests/mistakes/check_catalog.py                 # everything .venv/bin/python
    tests/mistakes/check_catalog.py --static        # the catalog's rules only, no execution
    .venv/bin/python tests/mistakes/check_catalog.py 03_saving_and_loading 06_mixed_precision
    .venv/bin/python tests/mistakes/check_catalog.py --id resume_without_map_location --kind fix

Exit status 0 when every checked entry behaves, 1 otherwise.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import re
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SOLUTIONS = ROOT / "solutions"
CELL_TIMEOUT = 300
MIN_MISTAKES = 54
MAX_PER_ANSWER = 7  # the AMP, out-of-memory and loading exercises each have many real mistakes
MIN_ASSIGNMENTS = 6
HOSTS = ("github.com", "discuss.pytorch.org", "stackoverflow.com")


def load_catalog():
    spec = importlib.util.spec_from_file_location("mistakes_catalog", HERE / "catalog.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def read_notebook(assignment: str) -> dict:
    path = SOLUTIONS / assignment / f"{assignment}.ipynb"
    return json.loads(path.read_text())


def nbgrader(cell: dict) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def source(cell: dict) -> str:
    text = cell.get("source", "")
    return text if isinstance(text, str) else "".join(text)


def answer_cells(nb: dict) -> dict[str, int]:
    return {
        nbgrader(c)["grade_id"]: i
        for i, c in enumerate(nb["cells"])
        if c["cell_type"] == "code" and nbgrader(c).get("solution")
    }


def test_cells(nb: dict, answer_index: int) -> list[int]:
    """Indices of the graded test cells after the answer cell, up to the next answer cell."""
    found = []
    for i in range(answer_index + 1, len(nb["cells"])):
        cell = nb["cells"][i]
        if cell["cell_type"] != "code":
            continue
        if nbgrader(cell).get("solution"):
            break
        if nbgrader(cell).get("grade") and "raises-exception" not in cell.get("metadata", {}).get(
            "tags", []
        ):
            found.append(i)
    return found


def defined_names(text: str) -> set[str]:
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return set()
    return {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}


def used_names(text: str) -> set[str]:
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return set()
    return {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}


def strip_markers(text: str) -> str:
    return "\n".join(
        line
        for line in text.splitlines()
        if line.strip() not in ("### BEGIN SOLUTION", "### END SOLUTION")
    )


def normalized(text: str) -> str:
    return re.sub(r"\s+", "", text)


# ---------------------------------------------------------------------------------------------
# static rules


def static_problems(catalog) -> list[str]:
    problems = []
    mistakes = catalog.MISTAKES
    ids = [m.id for m in mistakes]
    if len(mistakes) < MIN_MISTAKES:
        problems.append(f"{len(mistakes)} mistakes, at least {MIN_MISTAKES} needed")
    for duplicate in sorted({i for i in ids if ids.count(i) > 1}):
        problems.append(f"duplicate id {duplicate}")
    per_answer: dict[tuple[str, str], int] = {}
    notebooks: dict[str, dict] = {}
    for m in mistakes:
        if not re.fullmatch(r"[a-z][a-z0-9_]*", m.id):
            problems.append(f"{m.id}: id is not snake_case")
        if not m.url.startswith("https://") or not any(
            f"//{host}/" in m.url or f".{host}/" in m.url for host in HOSTS
        ):
            problems.append(
                f"{m.id}: url {m.url!r} is not a GitHub, PyTorch forums or Stack Overflow thread"
            )
        if not m.summary.strip():
            problems.append(f"{m.id}: empty summary")
        if m.assignment not in notebooks:
            try:
                notebooks[m.assignment] = read_notebook(m.assignment)
            except FileNotFoundError:
                problems.append(f"{m.id}: no assignment {m.assignment}")
                continue
        cells = answer_cells(notebooks[m.assignment])
        if m.answer not in cells:
            problems.append(f"{m.id}: {m.assignment} has no answer cell {m.answer!r}")
            continue
        per_answer[(m.assignment, m.answer)] = per_answer.get((m.assignment, m.answer), 0) + 1
        original = strip_markers(source(notebooks[m.assignment]["cells"][cells[m.answer]]))
        for kind, text in (("code", m.code), ("fix", m.fix)):
            if text is None:
                continue
            if "### BEGIN SOLUTION" in text or "### END SOLUTION" in text:
                problems.append(f"{m.id}: {kind} keeps the SOLUTION markers")
            if "NotImplementedError" in text:
                problems.append(f"{m.id}: {kind} raises NotImplementedError")
            try:
                ast.parse(text)
            except SyntaxError as err:
                problems.append(f"{m.id}: {kind} does not parse: {err}")
            if normalized(text) == normalized(original):
                problems.append(f"{m.id}: {kind} is the course's own solution")
            if not defined_names(original) <= defined_names(text):
                problems.append(
                    f"{m.id}: {kind} does not define "
                    f"{sorted(defined_names(original) - defined_names(text))}"
                )
        if m.fix is not None and normalized(m.fix) == normalized(m.code):
            problems.append(f"{m.id}: fix is the same as code")
    for (assignment, answer), count in sorted(per_answer.items()):
        if count > MAX_PER_ANSWER:
            problems.append(f"{assignment}/{answer}: {count} mistakes, at most {MAX_PER_ANSWER}")
    assignments = {m.assignment for m in mistakes}
    if len(assignments) < MIN_ASSIGNMENTS:
        problems.append(
            f"mistakes in {len(assignments)} assignments, at least {MIN_ASSIGNMENTS} needed"
        )
    return problems


# ---------------------------------------------------------------------------------------------
# execution


def plan_rounds(items: list[dict], nb: dict) -> list[list[dict]]:
    """Group items (one assignment) into executions: one item per answer cell, no dependencies
    between them."""
    cells = answer_cells(nb)
    defines = {answer: defined_names(source(nb["cells"][index])) for answer, index in cells.items()}
    for item in items:
        tests = "\n".join(source(nb["cells"][i]) for i in test_cells(nb, cells[item["answer"]]))
        item["uses"] = used_names(item["text"]) | used_names(tests)
    rounds: list[list[dict]] = []
    for item in items:
        for round_ in rounds:
            if any(other["answer"] == item["answer"] for other in round_):
                continue
            if any(
                item["uses"] & defines[other["answer"]] or other["uses"] & defines[item["answer"]]
                for other in round_
            ):
                continue
            round_.append(item)
            break
        else:
            rounds.append([item])
    return rounds


def first_line(text: str) -> str:
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    return text.strip().splitlines()[0][:300] if text.strip() else ""


def execute_round(assignment: str, items: list[dict]) -> dict:
    """Execute the notebook with the items' answer cells replaced; report the failing test cells.

    Returns ``{"seconds": ..., "failed": {grade_id: error}, "answer_errors": {answer: error}}``
    where ``failed`` covers every graded test cell of the notebook (not only those of the replaced
    cells).
    """
    import nbformat
    from nbclient import NotebookClient

    folder = SOLUTIONS / assignment
    nb = nbformat.read(folder / f"{assignment}.ipynb", as_version=4)
    raw = json.loads(json.dumps(nb))
    cells = answer_cells(raw)
    for item in items:
        nb.cells[cells[item["answer"]]].source = item["text"]
    started = time.monotonic()
    client = NotebookClient(
        nb,
        timeout=CELL_TIMEOUT,
        kernel_name="python3",
        allow_errors=True,
        resources={"metadata": {"path": str(folder)}},
    )
    client.execute()
    failed, answer_errors = {}, {}
    for answer, index in cells.items():
        for output in nb.cells[index].get("outputs", []):
            if output.get("output_type") == "error":
                answer_errors[answer] = (
                    f"{output.get('ename')}: {first_line(output.get('evalue', ''))}"
                )
        for i in test_cells(raw, index):
            for output in nb.cells[i].get("outputs", []):
                if output.get("output_type") == "error":
                    grade_id = raw["cells"][i]["metadata"]["nbgrader"]["grade_id"]
                    failed[grade_id] = (
                        f"{output.get('ename')}: {first_line(output.get('evalue', ''))}"
                    )
    return {
        "seconds": round(time.monotonic() - started, 1),
        "failed": failed,
        "answer_errors": answer_errors,
    }


def execute_round_with_retry(assignment: str, items: list[dict]) -> dict:
    """execute_round, tried once more when the execution itself breaks (a kernel that fails to
    start)."""
    try:
        return execute_round(assignment, items)
    except Exception:  # noqa: BLE001 - whatever broke the execution, it is tried once more
        return execute_round(assignment, items)


def judge(item: dict, run: dict, baseline_failed: dict[str, str], nb: dict) -> dict:
    """Whether one entry behaves, given its notebook run and the failures of the unmodified
    solution."""
    index = answer_cells(nb)[item["answer"]]
    tests = [nb["cells"][i]["metadata"]["nbgrader"]["grade_id"] for i in test_cells(nb, index)]
    failed = {g: e for g, e in run["failed"].items() if g in tests}
    # a failure counts for a mistake unless the course's own solution fails that test cell the same
    # way
    new = {g: e for g, e in failed.items() if baseline_failed.get(g) != e}
    if item["answer"] in run["answer_errors"]:
        ok, why = False, "the answer cell itself raised: " + run["answer_errors"][item["answer"]]
    elif item["kind"] == "code":
        ok = bool(new)
        why = (
            f"{len(new)} of {len(tests)} test cells fail"
            if ok
            else (
                f"no test cell fails that the course's solution passes ({len(failed)} of"
                f" {len(tests)} fail)"
            )
        )
    else:
        ok = not failed
        why = (
            f"all {len(tests)} test cells pass"
            if ok
            else f"{len(failed)} of {len(tests)} test cells fail"
        )
        if failed and not new:
            why += " (all of them fail with the course's own solution too)"
    return {
        "id": item["id"],
        "kind": item["kind"],
        "assignment": item["assignment"],
        "answer": item["answer"],
        "ok": ok,
        "why": why,
        "failed": failed,
        "seconds": run["seconds"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("assignments", nargs="*", help="only these assignments (default: all)")
    parser.add_argument("--id", action="append", default=[], help="only this entry (repeatable)")
    parser.add_argument(
        "--kind", choices=("code", "fix", "both"), default="both", help="mistakes, fixes or both"
    )
    parser.add_argument(
        "--jobs", type=int, default=2, help="notebooks executed at once (default 2)"
    )
    parser.add_argument(
        "--static", action="store_true", help="check the catalog's rules only, execute nothing"
    )
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    parser.add_argument(
        "--no-baseline",
        action="store_true",
        help="do not run the unmodified solution first (a mistake then counts every failing test)",
    )
    args = parser.parse_args(argv)

    catalog = load_catalog()
    problems = static_problems(catalog)
    for problem in problems:
        print("RULE", problem)
    mistakes = catalog.MISTAKES
    fixes = [m for m in mistakes if m.fix is not None]
    print(
        f"{len(mistakes)} mistakes, {len(fixes)} fixes, {len({m.assignment for m in mistakes})}"
        " assignments"
    )
    if args.static:
        return 1 if problems else 0

    chosen = [
        m
        for m in mistakes
        if (not args.assignments or m.assignment in args.assignments)
        and (not args.id or m.id in args.id)
    ]
    items_by_assignment: dict[str, list[dict]] = {}
    for m in chosen:
        if args.kind in ("code", "both"):
            items_by_assignment.setdefault(m.assignment, []).append(
                {"id": m.id, "kind": "code", "answer": m.answer, "text": m.code}
            )
        if args.kind in ("fix", "both") and m.fix is not None:
            items_by_assignment.setdefault(m.assignment, []).append(
                {"id": m.id, "kind": "fix", "answer": m.answer, "text": m.fix}
            )
    jobs = []
    for assignment, items in sorted(items_by_assignment.items()):
        if not args.no_baseline:
            jobs.append((assignment, []))  # the unmodified solution: which tests fail anyway
        for round_ in plan_rounds(items, read_notebook(assignment)):
            jobs.append(
                (assignment, [{k: v for k, v in item.items() if k != "uses"} for item in round_])
            )
    print(
        f"{sum(len(items) for _, items in jobs)} entries to check in {len(jobs)} notebook"
        " executions"
        f"{'' if args.no_baseline else ' (one per assignment runs the unmodified solution)'}",
        flush=True,
    )

    runs: list[tuple[str, list[dict], dict]] = []
    baseline: dict[str, dict[str, str]] = {}
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = {
            pool.submit(execute_round_with_retry, assignment, items): (assignment, items)
            for assignment, items in jobs
        }
        for future in as_completed(futures):
            assignment, items = futures[future]
            try:
                run = future.result()
            except Exception as exc:  # noqa: BLE001 - the execution itself broke: every entry of the round is unchecked
                run = {
                    "seconds": 0,
                    "failed": {},
                    "error": f"{type(exc).__name__}: {exc}",
                    "answer_errors": {
                        item["answer"]: f"execution failed: {exc!r}" for item in items
                    },
                }
            if not items and "error" in run:
                problems.append(f"baseline {assignment} could not run: {run['error']}")
                print(
                    f"baseline {assignment}: the unmodified solution could not run: {run['error']}",
                    flush=True,
                )
            elif not items:
                baseline[assignment] = dict(run["failed"])
                print(
                    f"baseline {assignment}: {len(run['failed'])} test cells fail with the course's"
                    f" solution ({run['seconds']} s)",
                    flush=True,
                )
                for grade_id, error in run["failed"].items():
                    print(f"        {grade_id}: {error}", flush=True)
            else:
                print(
                    f"ran {assignment} with {len(items)} replaced answer cells"
                    f" ({run['seconds']} s)",
                    flush=True,
                )
                runs.append((assignment, items, run))

    results = []
    for assignment, items, run in runs:
        nb = read_notebook(assignment)
        for item in items:
            item = dict(item, assignment=assignment)
            results.append(judge(item, run, baseline.get(assignment, {}), nb))
    results.sort(key=lambda r: (r["assignment"], r["answer"], r["id"], r["kind"]))
    for result in results:
        mark = "ok " if result["ok"] else "BAD"
        print(
            f"{mark} {result['kind']:4} {result['assignment']}/{result['answer']} {result['id']}:"
            f" {result['why']}"
        )
        for grade_id, error in result["failed"].items():
            print(f"        {grade_id}: {error}")

    bad = [r for r in results if not r["ok"]]
    print(
        f"\n{len(results) - len(bad)} of {len(results)} checked entries behave; rule problems:"
        f" {len(problems)}"
    )
    if args.json:
        args.json.write_text(
            json.dumps(
                sorted(results, key=lambda r: (r["assignment"], r["id"], r["kind"])), indent=1
            )
        )
    return 1 if bad or problems else 0


if __name__ == "__main__":
    sys.exit(main())
