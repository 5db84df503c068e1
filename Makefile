# Quickstart: make lab (students) | make grade (instructors) | make docs (the site) | make test (contributors, and CI)
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
READY  := $(VENV)/.installed
# The PATH this make was started with, for the GPU check, which must not use .venv.
ORIGINAL_PATH := $(PATH)
comma := ,
# nbgrader and Jupyter start `alembic`, `python` and kernels by name: use the venv's.
export PATH := $(CURDIR)/$(BIN):$(PATH)

.PHONY: help install docs browser postgres lab lab-plugin grade course-dir export-grades test mistakes course execute both-ways screenshots clean gpu-check gpu-torch wheels slurm-check slurm

help:
	@echo "make lab        JupyterLab on course/ (the student notebooks)"
	@echo "make grade      autograde two assignments of the demo class, print the table and what it shows (ALL=1: all)"
	@echo "make course-dir DIR=...  a course directory for a term: nbgrader's layout, assignments released, a gradebook"
	@echo "                [EXCHANGE=folder] [DB_URL=postgresql://...] [DUE='00_environment=2026-09-07 17:00 UTC']"
	@echo "make export-grades  the last grading's scores: nbgrader's CSV, and Canvas's and Moodle's import CSVs"
	@echo "make docs       the documentation site, lessons included, into build/site (strict: a warning fails it)"
	@echo "make test       contributors: the whole test suite (what CI runs); installs chromium, postgresql, slurm"
	@echo "make test-lite  the same suite without those packages: the tests that need one skip, each saying why"
	@echo "make mistakes   grade every real mistake of tests/mistakes/catalog.py through the grader (about 7 minutes)"
	@echo "make browser    install Debian's chromium for the browser tests, if it is missing"
	@echo "make postgres   install Debian's postgresql for the gradebook test, if it is missing"
	@echo "make slurm      install Debian's Slurm and munge for the Slurm test, if they are missing"
	@echo "make course     regenerate course/ and the demo submissions from solutions/"
	@echo "make execute    re-run solutions/ and store their outputs (after editing one)"
	@echo "make both-ways  every solution passes its tests, every student version none"
	@echo "make screenshots  the docs' pictures of JupyterLab and a feedback page, from the browser tests, into docs/"
	@echo "make gpu-check  on a CUDA machine: notebooks, grading, DDP, AMP and loading on the GPU -> docs/gpu-log.md"
	@echo "make wheels     download the packages gpu-check needs (all but torch) into wheels/, for a GPU box without network"
	@echo "make slurm-check  on a Slurm login node: grade part of the demo class through Slurm jobs (SLURM_CHECK_ARGS=--gpu ...)"
	@echo "                (sudo tools/practice-slurm.sh up: a two-node Slurm on this machine to try it on)"
	@echo "make lab-plugin rebuild the students' Lab plugin for Validate (needs node and npm)"
	@echo "make clean      remove build output (keeps .venv)"

install: $(READY)

$(READY): requirements.txt pyproject.toml autograder/pyproject.toml simdevice/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements.txt -e ./simdevice -e ./autograder -e .
	touch $@

# Jupyter refuses to run as root unless told; containers often run as root.
LAB_FLAGS ?= $(if $(filter 0,$(shell id -u)),--allow-root)

# The students' Lab: no formgrader, course list or "Create assignment" (jupyter/student-lab).
STUDENT_LAB := $(CURDIR)/jupyter/student-lab
# Its data folder holds the prebuilt Lab plugin that adds hidden checks' points to Validate's message.
lab: $(READY)
	JUPYTER_CONFIG_PATH="$(STUDENT_LAB)$(if $(JUPYTER_CONFIG_PATH),:$(JUPYTER_CONFIG_PATH))" \
	JUPYTER_PATH="$(STUDENT_LAB)/data$(if $(JUPYTER_PATH),:$(JUPYTER_PATH))" \
	  $(BIN)/jupyter lab --ServerApp.root_dir=course $(LAB_FLAGS)

# Rebuild that plugin from jupyter/student-lab/validate-hint (needs node and npm; its output is committed,
# so students and CI never need them).
lab-plugin: $(READY)
	cd $(STUDENT_LAB)/validate-hint && npm install --no-audit --no-fund && \
	  npx build-labextension --core-path "$$($(CURDIR)/$(BIN)/python -c 'import jupyterlab, os; print(os.path.join(os.path.dirname(jupyterlab.__file__), "staging"))')" .

# The demo class's first two assignments: every kind of student but the endless loop and the memory hog,
# graded in a few minutes. ALL=1 grades the whole demo class.
DEMO_ASSIGNMENTS := 00_environment 01_device_placement
grade: $(READY)
	$(BIN)/python -m autograder grade $(if $(ALL),,$(foreach name,$(DEMO_ASSIGNMENTS),--assignment $(name)))

# A term's course directory (autograder/course/directory.py; docs/instructors.md walks through a term).
course-dir: $(READY)
	@test -n "$(DIR)" || { echo "make course-dir needs DIR=/path/to/new/folder"; exit 2; }
	$(BIN)/python -m autograder course init "$(DIR)" $(if $(EXCHANGE),--exchange "$(EXCHANGE)") \
	  $(if $(DB_URL),--db-url "$(DB_URL)") $(if $(DUE),--due "$(DUE)")

# The last make grade's gradebook as nbgrader's CSV and as Canvas's and Moodle's import shapes
# (autograder/plugins/canvas.py, moodle.py), into GRADES_DIR. GRADEBOOK=postgresql://... reads another gradebook.
GRADES_DIR ?= build/grade
GRADEBOOK ?= sqlite:///$(abspath $(GRADES_DIR))/gradebook.db
export-grades: $(READY)
	$(BIN)/python -m nbgrader export --CourseDirectory.db_url=$(GRADEBOOK) --to=$(GRADES_DIR)/grades.csv
	for lms in canvas moodle; do \
	  $(BIN)/python -m nbgrader export --exporter=autograder.plugins.lms.LmsExportPlugin --LmsExportPlugin.lms=$$lms \
	    --CourseDirectory.db_url=$(GRADEBOOK) --to=$(GRADES_DIR)/grades-$$lms.csv || exit 1; done

# The documentation site (mkdocs.yml): docs/ and the lessons (tools/lessons.py) into build/site.
# --strict: a warning (a broken link or anchor, a missing page, a notebook that does not parse) fails it.
docs: $(READY)
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict

# Some tests need Debian packages: the browser tests drive Debian's Chromium through
# Playwright, which downloads no browser of its own (CHROMIUM=/path/to/chromium uses
# another one), the gradebook and cluster tests start a PostgreSQL server of their own,
# and the Slurm test a two-node Slurm on this machine (tools/practice-slurm.sh).
CHROMIUM ?= /usr/bin/chromium
SUDO     := $(if $(filter 0,$(shell id -u)),,sudo)
# $(call apt_install,package,what for,how else)
apt_install = echo "Installing Debian's $(1) package $(2)"; \
  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y $(1) || \
  { $(SUDO) apt-get update && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y $(1); } || \
  { echo "Could not install $(1) with apt-get. Install Debian's $(1) package$(3)."; exit 1; }

browser:
	@test -x "$(CHROMIUM)" || { $(call apt_install,chromium,for the browser tests,$(comma) or run with CHROMIUM=/path/to/chromium); }

postgres:
	@ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 || { $(call apt_install,postgresql,for the gradebook test,); }

slurm:
	@command -v ip >/dev/null && test -x /usr/sbin/slurmd -a -x /usr/sbin/slurmctld -a -x /usr/sbin/munged -a -x /usr/bin/sbatch || \
	  { $(call apt_install,slurmctld slurmd slurm-client munge iproute2,for the Slurm test (tools/practice-slurm.sh),); }

# Three test processes, each file in one of them (see conftest.py): on two cores a third keeps them busy while
# another waits for a server, a browser or a kernel. TEST_WORKERS=0 runs in one.
TEST_WORKERS ?= 3
test: $(READY) browser postgres slurm
	$(BIN)/python -m pytest $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)

# The same suite without the Debian packages: the tests that need one that is missing skip, each with a line.
test-lite: $(READY)
	COURSE_WITHOUT_SYSTEM_PACKAGES=1 $(BIN)/python -m pytest $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)

# The browser tests that picture what the docs show, each copying its picture into docs/ (about 3 minutes: one
# of them reads a feedback page of a graded demo class).
screenshots: $(READY) browser
	DOCS_SCREENSHOTS=1 $(BIN)/python -m pytest -p no:cacheprovider tests/devcourse/test_browser.py \
	  tests/autograder/batch/test_grade.py -k "map_location_explorer or student_types or feedback_page_in_a_browser"

mistakes: $(READY)
	COURSE_MISTAKE_ROUNDS=all $(BIN)/python -m pytest tests/mistakes/test_mistakes.py

course: $(READY)
	$(BIN)/python -m autograder build course
	$(BIN)/python -m autograder demo

execute: $(READY)
	$(BIN)/python -m autograder build execute

both-ways: $(READY)
	$(BIN)/python -m autograder build both-ways

clean:
	rm -rf build .pytest_cache .nbgrader

# ---- GPU check -------------------------------------------------------------
# A GPU box may have PyTorch with CUDA and nothing else, and no network. gpu-check
# uses that PyTorch as it is, and installs the rest of the stack next to it
# (into GPU_SITE) from wheels/ when that folder holds wheels. GPU_SITE lies outside
# the course folder: the grading sandbox hides the course folder from kernels, and
# brings back only the Python folders outside it (autograder.run.sandbox.python_paths).
GPU_PYTHON   ?= python3
GPU_SITE     ?= $(HOME)/.cache/devcourse/gpu-site
WHEELS       := wheels
WHEEL_PYTHON ?= 3.12
GPU_CHECK_ARGS ?=

build/requirements-gpu.txt: requirements.txt
	mkdir -p build
	grep -v '^torch==' requirements.txt > $@

$(GPU_SITE)/.installed: build/requirements-gpu.txt
	env PATH="$(ORIGINAL_PATH)" $(GPU_PYTHON) -m pip install --quiet --disable-pip-version-check --target $(GPU_SITE) \
	  $(if $(wildcard $(WHEELS)/*.whl),--no-index --find-links $(WHEELS)) -r build/requirements-gpu.txt
	touch $@

gpu-torch:
	@env PATH="$(ORIGINAL_PATH)" $(GPU_PYTHON) -c "import torch" 2>/dev/null || \
	  { echo "make gpu-check uses this machine's own PyTorch, and '$(GPU_PYTHON)' cannot import torch (set GPU_PYTHON=...)"; exit 2; }

gpu-check: gpu-torch $(GPU_SITE)/.installed
	env PATH="$(abspath $(GPU_SITE))/bin:$(ORIGINAL_PATH)" PYTHONPATH="$(abspath $(GPU_SITE)):$(CURDIR)" \
	  JUPYTER_PATH="$(abspath $(GPU_SITE))/share/jupyter" \
	  $(GPU_PYTHON) -m autograder gpu-check $(GPU_CHECK_ARGS)

wheels: build/requirements-gpu.txt
	mkdir -p $(WHEELS)
	$(PYTHON) -m pip download --quiet --disable-pip-version-check --only-binary=:all: \
	  --python-version $(WHEEL_PYTHON) --implementation cp \
	  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
	  -d $(WHEELS) -r build/requirements-gpu.txt

# On a Slurm login node: workers as Slurm jobs through dask-jobqueue, as docs/cluster.md sets them up,
# grading 01 of the demo class (python -m autograder slurm-check --help for the options).
SLURM_CHECK_ARGS ?=
slurm-check: $(READY)
	$(BIN)/python -m autograder slurm-check $(SLURM_CHECK_ARGS)
