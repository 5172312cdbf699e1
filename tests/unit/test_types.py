"""The modules on the path of every message stay clean under mypy: they are the ones mypyc is to compile
(docs/benchmarks.md), and mypyc trusts annotations, so a wrong one would fail at run time instead of here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from broker.compiled import COMPILED

REPO_ROOT = Path(__file__).resolve().parents[2]

# those mypyc compiles, and those whose types they rely on
HOT_PATH_MODULES = [*COMPILED, "broker/model/interfaces.py", "broker/session/interfaces.py", "broker/session/direct_reply.py",
                    "broker/session/transaction.py"]


def test_the_hot_path_modules_are_clean_under_mypy(tmp_path):
    checked = subprocess.run(
        [sys.executable, "-m", "mypy", "--ignore-missing-imports", "--follow-imports=silent",
         "--disable-error-code", "annotation-unchecked", "--cache-dir", str(tmp_path), *HOT_PATH_MODULES],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert checked.returncode == 0, checked.stdout + checked.stderr
