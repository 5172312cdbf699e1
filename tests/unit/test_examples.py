"""What a newcomer running the Spark examples meets: their --help says what they do, and their defaults keep
their checkpoints and outputs under the current directory, on queues of their own (not the docs' snippets')."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

EXAMPLES = ("pipeline", "stream_replay", "throughput")


def first_paragraph(example: str) -> str:
    text = (REPO_ROOT / "examples" / f"{example}.py").read_text()
    return " ".join(re.search(r'"""(.*?)(\n\n|""")', text, re.DOTALL).group(1).split())


@pytest.mark.parametrize("example", EXAMPLES)
def test_the_help_of_an_example_says_what_it_does_whole(example):
    result = subprocess.run([sys.executable, str(REPO_ROOT / "examples" / f"{example}.py"), "--help"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert first_paragraph(example) in " ".join(result.stdout.split())


def parsed_defaults(example: str) -> dict:
    """The options an example runs with when given none."""
    code = (f"import sys; sys.path.insert(0, {str(REPO_ROOT / 'examples')!r}); import json, {example}; "
            f"print(json.dumps(vars({example}.parse_args([]))))")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize("example", ("pipeline", "stream_replay"))
def test_an_examples_checkpoint_and_output_default_to_the_current_directory(example):
    defaults = parsed_defaults(example)
    paths = [defaults[key] for key in ("checkpoint", "output") if key in defaults]
    assert paths and all(not Path(path).is_absolute() for path in paths), paths


def test_the_replay_examples_stream_is_not_the_docs_snippets():
    docs = (REPO_ROOT / "docs" / "spark.md").read_text()
    stream = parsed_defaults("stream_replay")["stream"]
    assert f'"{stream}"' not in docs and '.option("stream", "events")' in docs
