"""core's imports run one way: down the layers below, with no circle.

Every ``import core.X`` / ``from core.X import ...`` of core's source (those inside
functions too: a lazy import is still an arrow) is read with :mod:`ast`. A module may import
its own part and the parts of lower layers, never a higher layer; neither files nor parts
import each other in a circle. A new top-level module or package of core goes into
:data:`LAYERS` where it belongs.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parents[1] / "src" / "core"

#: core's parts (top-level modules and packages), bottom layer first
LAYERS: list[set[str]] = [
    # structured outputs' request params ride in SamplingParams: the feature sits this low
    # and a sequence's LoRA adapter (its request, its prefix-cache key) rides in Sequence
    {"config", "sampling_params", "outputs", "sequence", "detokenizer", "discovery", "structured", "lora"},
    {"tools"},  # tool calling: tool_choice as a structured-outputs constraint, the parsers the server runs
    {"partition"},  # sharding plans and the collectives of a split model
    {"models"},
    {"loader"},
    {"block_manager", "sampler", "resolve"},
    {"scheduler", "request_state"},
    {"model_runner"},
    # speculative decoding: n-gram and draft-model proposals (a draft runs on a ModelRunner of its
    # own) and the acceptance rule the engine calls
    {"spec_decode"},
    {"distributed"},  # one rank's worker and the executors that run workers
    {"engine"},
    {"pooling"},  # pooling models: their prefill-only engine, and the choice between it and the engine
    {"async_engine", "llm"},
    {"__init__"},  # the package's face: the offline API (lazily) and __version__
    {"bench", "server"},
    {"cli"},
]
LAYER_OF = {part: i for i, layer in enumerate(LAYERS) for part in layer}


def module_name(path: Path) -> str:
    parts = ["core", *path.relative_to(SOURCE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def part_of(module: str) -> str:
    """``core.loader.gguf_model`` -> ``loader``; ``core`` itself -> ``__init__``."""
    names = module.split(".")
    return names[1] if len(names) > 1 else "__init__"


def imports(path: Path, modules: set[str]) -> set[str]:
    """The core modules ``path`` imports (``from core.x import y`` is module ``core.x.y`` when that is one)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found |= {
                f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module for a in node.names
            }
    return {name for name in found if name == "core" or name.startswith("core.")}


def import_graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in sorted(SOURCE.rglob("*.py"))}
    return {name: imports(path, set(files)) - {name} for name, path in files.items()}


def find_circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of ``graph`` as its nodes in order, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (circle := visit(nxt)):
                return circle
        state[node] = 2
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (circle := visit(node)):
            return circle
    return None


GRAPH = import_graph()


def test_every_part_has_a_layer():
    unplaced = sorted({part_of(m) for m in GRAPH} - set(LAYER_OF))
    assert not unplaced, f"core parts without a layer: {unplaced}; add each to LAYERS in {Path(__file__).name}"


def test_no_import_runs_up_a_layer():
    upward = [
        f"{m} (layer {LAYER_OF[part_of(m)]}) imports {t} (layer {LAYER_OF[part_of(t)]})"
        for m, targets in sorted(GRAPH.items())
        for t in sorted(targets)
        if LAYER_OF.get(part_of(t), -1) > LAYER_OF.get(part_of(m), len(LAYERS))
    ]
    assert not upward, "imports from a lower layer to a higher one:\n" + "\n".join(upward)


def test_no_circle_between_files():
    assert find_circle(GRAPH) is None, f"import circle: {' -> '.join(find_circle(GRAPH))}"


def test_no_circle_between_parts():
    parts: dict[str, set[str]] = {}
    for m, targets in GRAPH.items():
        parts.setdefault(part_of(m), set()).update(part_of(t) for t in targets if part_of(t) != part_of(m))
    circle = find_circle(parts)
    assert circle is None, f"parts of core import each other: {' -> '.join(circle)}"


@pytest.mark.parametrize(
    "graph,circle",
    [
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, ["a", "b", "c", "a"]),
        ({"a": {"b"}, "b": set(), "c": {"a", "b"}}, None),
    ],
)
def test_find_circle(graph, circle):
    """The checker itself finds a circle (and none where there is none)."""
    assert find_circle(graph) == circle
