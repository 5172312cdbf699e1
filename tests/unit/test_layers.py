"""The layers only look down (docs/design.md): each package's modules, their TYPE_CHECKING imports included, import
nothing of the layers above them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

# a layer (a folder of the repository) -> the packages above it, which none of its modules may import
NEVER = {
    "protocol": ("broker", "storage", "cluster", "spark_connector"),
    "storage": ("broker", "cluster", "spark_connector"),
    "broker/model": ("broker.session", "broker.connection", "broker.management", "broker.workers", "cluster"),
    "broker/session": ("broker.connection", "broker.management", "broker.workers", "cluster"),
    "broker/connection": ("broker.management", "broker.workers", "cluster"),
    # the links are clients of brokers, this one or others, over the network: they know nothing of a broker
    "broker/links": ("broker.model", "broker.session", "broker.connection", "broker.management", "broker.workers",
                     "broker.shovel", "broker.federation", "cluster"),
    # a shovel speaks to brokers over the network, as any client: it knows nothing of this broker's sessions
    "broker/shovel": ("broker.session", "broker.connection", "broker.management", "broker.workers",
                      "broker.federation", "cluster"),
    # a federation link reads its upstream over the network and acts on this broker's model through its operations
    "broker/federation": ("broker.session", "broker.connection", "broker.management", "broker.workers",
                          "broker.shovel", "cluster"),
    # the links between a node's processes carry what the model's queues are asked and answer: they know no client
    "broker/crossing": ("broker.session", "broker.connection", "broker.management", "broker.workers",
                        "broker.shovel", "broker.federation", "cluster"),
    # the broker knows nothing of the cluster above it (the supervisor starts a clustered node's workers by their
    # module's name: cluster.worker)
    "broker": ("cluster", "spark_connector"),
    "spark_connector": ("broker", "storage", "protocol", "cluster"),
    # the load tool is a client of any broker, over the network
    "warrenperf": ("broker", "storage", "protocol", "cluster", "spark_connector", "warrenctl"),
}


def imported(path: Path) -> set[str]:
    """Every module path names in an import, at run time or for type checking alone."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


@pytest.mark.parametrize("layer", sorted(NEVER))
def test_no_module_of_a_layer_imports_a_layer_above_it(layer):
    above = NEVER[layer]
    reaching_up = {f"{path.relative_to(REPO_ROOT)} imports {name}"
                   for path in (REPO_ROOT / layer).rglob("*.py")
                   for name in imported(path) if name.split(".")[0] in above or name.startswith(above)}
    assert not reaching_up, sorted(reaching_up)
