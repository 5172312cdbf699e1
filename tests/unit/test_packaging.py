"""What a newcomer meets first: the installed commands, make, the Docker image and the README's instructions."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from broker import compiled
from tests.unit.test_docs_links import markdown_pages

REPO_ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _pyproject_packages() -> set[str]:
    """The top-level packages pyproject.toml installs (its [tool.setuptools.packages.find] include patterns)."""
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    return {pattern.rstrip("*").rstrip(".") for pattern in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]}


@pytest.fixture
def given_to_mypyc(tmp_path, monkeypatch) -> dict:
    """The options compiled.build() gives mypycify, once called: in an empty tree (build() cleans first: nothing of
    the real tree goes), mypy taken for 1.17, nothing built."""
    mypyc_build = pytest.importorskip("mypyc.build")
    setuptools = pytest.importorskip("setuptools")
    given = {}
    monkeypatch.setattr(compiled, "REPO_ROOT", tmp_path)
    monkeypatch.setattr(compiled, "COMPILED", ())
    monkeypatch.setattr(compiled, "C_SOURCES", ())
    monkeypatch.setattr(mypyc_build, "mypycify", lambda paths, **options: given.update(options) or [])
    monkeypatch.setattr(setuptools, "setup", lambda **arguments: None)
    monkeypatch.setattr("mypy.version.__version__", "1.17.0")
    return given


def test_the_optimization_level_is_warren_opt_levels_and_a_wrong_one_is_named(given_to_mypyc, monkeypatch, capsys):
    monkeypatch.delenv("WARREN_OPT_LEVEL", raising=False)
    compiled.build()
    assert given_to_mypyc["opt_level"] == "3"
    monkeypatch.setenv("WARREN_OPT_LEVEL", "0")
    compiled.build()
    assert given_to_mypyc["opt_level"] == "0"
    given_to_mypyc.clear()
    monkeypatch.setenv("WARREN_OPT_LEVEL", "fast")
    compiled.build()
    assert given_to_mypyc == {}
    assert "WARREN_OPT_LEVEL is 'fast', where 0, 1, 2 or 3 is meant" in capsys.readouterr().err


# The installed commands, run from / (so the repo root is not on the path: an editable install puts the packages
# there, nothing else), with the compiled modules built.
@pytest.mark.parametrize("command", [
    ["warren-server", "--version"],
    ["warrenctl", "--help"],
    ["-m", "broker", "--version"],
], ids=["warren-server", "warrenctl", "python -m broker"])
def test_the_installed_commands_run_from_any_directory_with_the_modules_compiled(command):
    if not any(compiled._extensions(REPO_ROOT / name) for name in compiled.COMPILED):
        pytest.skip("the modules are not compiled here (no C compiler, Python headers or mypy, or "
                    "python -m broker.compiled --clean): nothing compiled for the commands to load")
    if command[0] == "-m":
        argv = [sys.executable, *command]
    else:
        script = BIN / command[0]
        if not script.exists():
            pytest.skip(f"{script} is not installed (pip install -e . installs it)")
        argv = [str(script), *command[1:]]
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    result = subprocess.run(argv, cwd="/", env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr, result.stderr


def test_the_runtime_library_of_the_compiled_modules_is_built_inside_an_installed_package(given_to_mypyc):
    """mypyc's runtime library is a module of its own, which every compiled module imports: one built at the repo
    root (mypyc's default) is found only when the current directory is the repo root."""
    compiled.build()

    package = given_to_mypyc.get("group_name", "").rpartition(".")[0]
    assert package.split(".")[0] in _pyproject_packages(), given_to_mypyc
    assert (REPO_ROOT / package.replace(".", "/") / "__init__.py").exists()


def test_the_runtime_library_inside_the_package_and_one_an_older_build_left_at_the_root_are_cleaned(tmp_path,
                                                                                                 monkeypatch):
    monkeypatch.setattr(compiled, "REPO_ROOT", tmp_path)
    monkeypatch.setattr(compiled, "COMPILED", ())
    monkeypatch.setattr(compiled, "C_SOURCES", ())
    package, _, name = compiled.RUNTIME_GROUP.rpartition(".")
    (tmp_path / package).mkdir()
    (tmp_path / package / f"{name}__mypyc.cpython-311-x86_64-linux-gnu.so").write_bytes(b"")
    (tmp_path / "5db959973b55e9abee0c__mypyc.cpython-311-x86_64-linux-gnu.so").write_bytes(b"")

    compiled.clean()

    assert [path for path in tmp_path.rglob("*") if path.is_file()] == []


def test_mypycs_modules_are_compiled_without_the_indentation_check_each_once(given_to_mypyc, monkeypatch):
    """gcc's look at the indentation of mypyc's C (-Wall's) costs a third of the build and changes nothing built."""
    from setuptools import Extension
    flags = ["-O3"]  # (mypyc gives every module one list)
    made = [Extension(name, [f"{name}.c"], extra_compile_args=flags) for name in ("a", "b")]
    monkeypatch.setattr("mypyc.build.mypycify", lambda paths, **options: made)

    modules = compiled.extensions()

    assert [module.extra_compile_args for module in modules] == [["-O3", "-Wno-misleading-indentation"]] * 2


def test_an_older_mypy_leaves_warren_pure_python_saying_why(given_to_mypyc, monkeypatch, capsys):
    monkeypatch.setattr("mypy.version.__version__", "1.15.0")

    compiled.build()

    assert given_to_mypyc == {} and "mypy 1.15.0 is older than 1.17" in capsys.readouterr().err


# make with no target (and make run, make test) rebuilds a compiled module whose source changed: dry runs, with -W
# pretending the source was just edited (nothing is built or touched).
@pytest.mark.parametrize("target", [[], ["run"], ["test"]], ids=["make", "make run", "make test"])
def test_make_rebuilds_the_compiled_modules_after_a_source_changed(target):
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    env = {key: value for key, value in os.environ.items() if key not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    result = subprocess.run(["make", "-n", "-W", compiled.COMPILED[0], *target], cwd=REPO_ROOT, env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "-m broker.compiled" in result.stdout, result.stdout


@pytest.mark.parametrize("port, command", [("15672", ".venv/bin/warrenctl list_queues"),
                                           ("15999", ".venv/bin/warrenctl --port 15999 list_queues")])
def test_make_run_says_how_to_call_warrenctl_on_its_management_port(port, command):
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    env = {key: value for key, value in os.environ.items() if key not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    result = subprocess.run(["make", "-n", "run", f"MANAGEMENT_PORT={port}"], cwd=REPO_ROOT, env=env,
                            capture_output=True, text=True, timeout=60)
    assert f'echo "warrenctl: {command}"' in result.stdout, result.stdout


def test_the_docker_image_copies_every_package_pyproject_installs():
    copied = set(re.findall(r"^COPY\s+([\w.]+)/\s+/src/\1/?\s*$", (REPO_ROOT / "Dockerfile").read_text(),
                            re.MULTILINE))
    assert copied == _pyproject_packages()


def _stages() -> list[str]:
    """The Dockerfile's build stages, each from its FROM line on."""
    text = (REPO_ROOT / "Dockerfile").read_text()
    return re.split(r"^(?=FROM )", text, flags=re.MULTILINE)[1:]


def test_the_image_installs_a_wheel_compiled_in_a_stage_of_its_own_and_checks_it():
    """No Docker daemon runs here: the stages are checked as written. The first has a compiler and builds the wheel;
    the image (the last) installs that wheel, has no compiler, and its build fails unless every module is
    compiled, by the check the broker makes at start."""
    builder, image = _stages()
    assert re.search(r"apt-get install .*\bgcc\b", builder) and "pip wheel" in builder
    name = re.match(r"FROM \S+ AS (\w+)", builder).group(1)
    assert f"COPY --from={name} /wheels/" in image
    assert "gcc" not in image and "apt-get" not in image
    assert re.search(r"pip install /tmp/wheels/\*\.whl .*python -m broker\.compiled --check", image)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_wheel_built_from_the_sources_holds_the_compiled_modules_and_runs_them(tmp_path):
    """pip wheel compiles the modules, as the image's first stage does (from a copy of what it copies); the wheel's
    files, put on the path, pass the check the broker makes at start, from any directory."""
    if compiled.missing():
        pytest.skip("the modules are not compiled here (no C compiler or Python headers): nor would the wheel be")
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(REPO_ROOT / name, source / name)
    for package in _pyproject_packages():
        shutil.copytree(REPO_ROOT / package, source / package,
                        ignore=shutil.ignore_patterns("__pycache__", "*.so", "*__mypyc.*", "_compiled_sources.json"))
    # (not optimized: the build takes less than half the time, and what is checked is what the wheel holds)
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--wheel-dir",
                             str(tmp_path / "wheels"), str(source)], capture_output=True, text=True, timeout=840,
                            env={**os.environ, "WARREN_OPT_LEVEL": "0"})
    assert result.returncode == 0, result.stderr[-3000:]
    [wheel] = (tmp_path / "wheels").glob("*.whl")
    assert not wheel.name.endswith("-py3-none-any.whl"), wheel.name  # (a platform's wheel: compiled modules in it)
    installed = tmp_path / "installed"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(installed)
    env = {**{key: value for key, value in os.environ.items() if key != "PYTHONPATH"}, "PYTHONPATH": str(installed)}
    check = subprocess.run([sys.executable, "-m", "broker.compiled", "--check"], cwd="/", env=env,
                           capture_output=True, text=True, timeout=60)
    assert (check.returncode, check.stdout.strip()) == (0, f"warren: the {len(compiled.built_sources())} modules are "
                                                           "compiled"), check.stderr
    loaded = subprocess.run([sys.executable, "-c", "import broker.session.channel as m; print(m.__file__)"], cwd="/",
                            env=env, capture_output=True, text=True, timeout=60)
    assert loaded.stdout.strip().startswith(str(installed)) and loaded.stdout.strip().endswith(".so"), loaded


def test_the_docs_and_the_compose_file_give_the_same_compose_command():
    command = re.compile(r"docker compose -f docker/compose\.yaml up[^`\n]*")
    docs = "\n".join(page.read_text() for page in markdown_pages())
    readme = {found.strip() for found in command.findall(docs)}
    compose_comment = "\n".join(line for line in (REPO_ROOT / "docker" / "compose.yaml").read_text().splitlines()
                                if line.startswith("#"))
    compose = {found.strip() for found in command.findall(compose_comment)}
    assert readme and readme == compose


def test_the_readme_names_every_variable_make_run_takes():
    makefile = (REPO_ROOT / "Makefile").read_text()
    settable = set(re.findall(r"^(\w+)\s*\?=", makefile, re.MULTILINE))
    recipe = re.search(r"^run:.*\n((?:\t.*\n)+)", makefile, re.MULTILINE).group(1)
    taken = settable & set(re.findall(r"\$\((\w+)\)", recipe))
    assert {"HOST", "PORT", "PROMETHEUS_PORT"} <= taken
    readme = (REPO_ROOT / "README.md").read_text()
    assert sorted(name for name in taken if f"`{name}=`" not in readme) == []
