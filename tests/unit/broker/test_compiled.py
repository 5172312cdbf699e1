"""The check that keeps a compiled module from running in place of an edited source."""

from __future__ import annotations

import importlib.machinery
import os

from broker import compiled


def test_a_source_edited_after_its_compiled_module_was_built_is_stale(tmp_path, monkeypatch):
    monkeypatch.setattr(compiled, "REPO_ROOT", tmp_path)
    monkeypatch.setattr(compiled, "COMPILED", ("pkg/edited.py", "pkg/built.py", "pkg/pure.py"))
    (tmp_path / "pkg").mkdir()
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    for name in ("edited", "built", "pure"):
        (tmp_path / "pkg" / f"{name}.py").write_text("")
    for name, built_at in (("edited", 1_000), ("built", 3_000)):
        extension = tmp_path / "pkg" / f"{name}{suffix}"
        extension.write_bytes(b"")
        os.utime(extension, (built_at, built_at))
    for name in ("edited", "built", "pure"):
        os.utime(tmp_path / "pkg" / f"{name}.py", (2_000, 2_000))
    (tmp_path / f"0123__mypyc{suffix}").write_bytes(b"")

    assert compiled.stale() == ["pkg/edited.py"]  # a source without a compiled module is simply pure Python
    assert "pkg/edited.py" in compiled.refusal() and "python -m broker.compiled" in compiled.refusal()
    compiled.clean()
    assert compiled.stale() == [] and compiled.refusal() is None
    assert sorted(path.name for path in tmp_path.rglob("*") if path.is_file()) == ["built.py", "edited.py", "pure.py"]
