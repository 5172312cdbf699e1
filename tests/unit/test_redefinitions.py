"""No module or class of the project defines one name twice: the second def (or class) silently replaces the first,
and the callers of the first get the second (a supervisor's method that forgets vhosts was once replaced so by one
that forgets nodes, and with workers every vhost's deletion through the API hung)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("broker", "cluster", "protocol", "storage", "spark_connector", "warrenctl", "warrenperf", "examples",
            "tests")
VENDORED = REPO_ROOT / "tests" / "mqtt" / "paho_interop"  # Eclipse Paho's interoperability suite, as it is published


def redefinitions(path: Path) -> list[str]:
    """Each def or class that a later one of the same name replaces in the same module or class body (a property's
    setter and an @overload are meant to)."""
    found = []
    for scope in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(scope, (ast.Module, ast.ClassDef)):
            continue
        seen: dict[str, int] = {}
        for item in scope.body:
            if not isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            decorators = {ast.unparse(decorator) for decorator in item.decorator_list}
            if any(name.endswith((".setter", ".deleter")) or name in ("overload", "typing.overload")
                   for name in decorators):
                continue
            if item.name in seen:
                found.append(f"{path.relative_to(REPO_ROOT)}:{item.lineno}: {item.name} (first at line "
                             f"{seen[item.name]})")
            seen[item.name] = item.lineno
    return found


def test_no_module_or_class_defines_one_name_twice():
    found = [line for package in PACKAGES for path in sorted((REPO_ROOT / package).rglob("*.py"))
             if not path.is_relative_to(VENDORED) for line in redefinitions(path)]
    assert found == []
