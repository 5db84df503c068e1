# Quickstart: make lab (students) | make grade (instructors) | make test (everyone, and CI)
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
READY  := $(VENV)/.installed
# nbgrader and Jupyter start `alembic`, `python` and kernels by name: use the venv's.
export PATH := $(CURDIR)/$(BIN):$(PATH)

.PHONY: help install lab grade test course execute both-ways clean

help:
	@echo "make lab        JupyterLab on course/ (the student notebooks)"
	@echo "make grade      autograde the demo class and print the score table"
	@echo "make test       the whole test suite (what CI runs)"
	@echo "make course     regenerate course/ and the demo submissions from solutions/"
	@echo "make execute    re-run solutions/ and store their outputs (after editing one)"
	@echo "make both-ways  every solution passes its tests, every student version none"
	@echo "make clean      remove build output (keeps .venv)"

install: $(READY)

$(READY): requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements.txt -e .
	touch $@

# Jupyter refuses to run as root unless told; containers often run as root.
LAB_FLAGS ?= $(if $(filter 0,$(shell id -u)),--allow-root)

lab: $(READY)
	$(BIN)/jupyter lab --ServerApp.root_dir=course $(LAB_FLAGS)

grade: $(READY)
	$(BIN)/python -m autograder.grade

test: $(READY)
	$(BIN)/python -m pytest

course: $(READY)
	$(BIN)/python -m autograder.pipeline course
	$(BIN)/python -m autograder.demo

execute: $(READY)
	$(BIN)/python -m autograder.pipeline execute

both-ways: $(READY)
	$(BIN)/python -m autograder.pipeline both-ways

clean:
	rm -rf build .pytest_cache .nbgrader
