#!/usr/bin/env bash
# The whole test suite: install, lint (ruff), type-check (mypy; strict on messages/ and actors/),
# then pytest (GPU tests skip without CUDA) in two worker processes, each taking whole test
# files (module and session fixtures stay one per worker). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ops/install.sh
if [ -f .ci/install-browser.sh ]; then bash .ci/install-browser.sh; fi
echo "== ruff"; .venv/bin/ruff check .
echo "== mypy"
TC=$(mktemp -d) && ln -s "$PWD" "$TC/troupe"
(cd "$TC" && "$OLDPWD/.venv/bin/mypy" --config-file "$OLDPWD/pyproject.toml" -p troupe)
# The repo root is the package `troupe`: its folders (kernels/, messages/, gpu/, ...) must not
# shadow installed packages (Hugging Face's `kernels`, which transformers >= 5.25 imports).
# tests/conftest.py moves the root to the end of the suite's sys.path; PYTHONSAFEPATH (Python
# 3.11's -P) keeps `python -m` from putting it in front in the Pythons the tests start.
export PYTHONSAFEPATH=1
# Two workers on two cores: one intra-op thread each (and in the processes they start), or
# the OpenMP threads of one spin while the other worker holds the core (a third slower).
export OMP_NUM_THREADS=1
echo "== pytest"; .venv/bin/python -m pytest -n 2 --dist loadfile "$@"
