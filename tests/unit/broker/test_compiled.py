"""The check that keeps a compiled module from running in place of an edited source, and that says which modules
run as pure Python; the build's compiling of an extension's C files at once."""

from __future__ import annotations

import hashlib
import importlib.machinery
import json
import threading

import pytest

from broker import compiled


def test_a_source_edited_after_its_compiled_module_was_built_is_stale(tmp_path, monkeypatch):
    monkeypatch.setattr(compiled, "REPO_ROOT", tmp_path)
    monkeypatch.setattr(compiled, "COMPILED", ("pkg/edited.py", "pkg/built.py", "pkg/pure.py"))
    monkeypatch.setattr(compiled, "C_SOURCES", ("pkg/native.c",))
    (tmp_path / "pkg").mkdir()
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    sources = {"pkg/edited.py": "edited = 1\n", "pkg/built.py": "built = 1\n", "pkg/pure.py": "pure = 1\n",
               "pkg/native.c": "int native;\n"}
    for name, text in sources.items():
        (tmp_path / name).write_text(text)
    for name in ("edited", "built", "native"):
        (tmp_path / "pkg" / f"{name}{suffix}").write_bytes(b"")
    (tmp_path / "broker").mkdir()
    (tmp_path / compiled.MANIFEST).write_text(json.dumps({
        name: hashlib.sha256(text.encode()).hexdigest() for name, text in sources.items() if name != "pkg/pure.py"}))
    (tmp_path / f"0123__mypyc{suffix}").write_bytes(b"")
    assert compiled.stale() == [] and compiled.missing() == ["pkg/pure.py"]

    (tmp_path / "pkg" / "edited.py").write_text("edited = 2\n")  # (whatever the files' times say)
    (tmp_path / "pkg" / "native.c").write_text("int native = 2;\n")

    assert compiled.stale() == ["pkg/edited.py", "pkg/native.c"]  # a source without a module is simply pure Python
    assert "pkg/edited.py" in compiled.refusal() and "python -m broker.compiled" in compiled.refusal()
    assert compiled.main(["--check"]) == 1
    compiled.clean()
    assert compiled.stale() == [] and compiled.refusal() is None
    assert compiled.missing() == ["pkg/edited.py", "pkg/built.py", "pkg/pure.py", "pkg/native.c"]
    assert sorted(path.name for path in tmp_path.rglob("*") if path.is_file()) == ["built.py", "edited.py",
                                                                                   "native.c", "pure.py"]


def test_compiled_modules_without_the_hashes_of_their_sources_are_stale(tmp_path, monkeypatch):
    monkeypatch.setattr(compiled, "REPO_ROOT", tmp_path)
    monkeypatch.setattr(compiled, "COMPILED", ("pkg/built.py",))
    monkeypatch.setattr(compiled, "C_SOURCES", ())
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "built.py").write_text("")
    (tmp_path / "pkg" / f"built{importlib.machinery.EXTENSION_SUFFIXES[0]}").write_bytes(b"")
    assert compiled.stale() == ["pkg/built.py"]  # (built by an earlier version, which recorded none)


@pytest.mark.skipif(compiled.usable_cores() < 2, reason="compiling at once needs two cores at least")
def test_an_extensions_c_files_are_compiled_at_once_and_their_objects_come_in_their_order():
    both_compiling = threading.Barrier(2, timeout=10)  # passed only by two compiles under way together

    def compile_one(sources: list[str], output_dir: str) -> list[str]:
        assert len(sources) == 1
        both_compiling.wait()
        return [f"{output_dir}/{sources[0].removesuffix('.c')}.o"]

    compile_all = compiled.compiling_at_once(compile_one)
    assert compile_all(["vhost.c", "queue.c"], output_dir="build") == ["build/vhost.o", "build/queue.o"]
