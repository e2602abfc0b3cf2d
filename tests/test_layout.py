"""The package's layers: formats, plan and native plane stand on the container, and none reaches up.

Imports are read from the source (those inside functions too), so a lazy import that runs
back up fails here as a module-level one would.
"""

from __future__ import annotations

import ast
from pathlib import Path

import ckptz

PACKAGE = Path(ckptz.__file__).parent

#: The layers from the ground up: a module may import, directly or through modules on no
#: layer, only from its own layer and those below it.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("codecs", ("ckptz.codecs",)),
    ("container", ("ckptz.container", "ckptz.checksums", "ckptz.digest")),
    ("formats", ("ckptz.formats",)),
    ("engines", ("ckptz.engines",)),
    ("pipeline", ("ckptz.pipeline",)),
    (
        "runs and the library",
        (
            "ckptz.runs",
            "ckptz.series",
            "ckptz.library",
            "ckptz.dcp",
            "ckptz.api",
            "ckptz.integrations",
            "ckptz.bench",
            "ckptz.report",
            "ckptz.cli",
            "ckptz.__main__",
        ),
    ),
)


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The ckptz modules that ``name`` imports anywhere in its source."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    named: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            named.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # ``from ckptz import trace`` imports the module ckptz.trace, not a name of ckptz
            named.update(f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names)
    return {m for m in named if m in modules and m != name}


def _layer(name: str) -> int | None:
    for height, (_, prefixes) in enumerate(LAYERS):
        if any(name == p or name.startswith(p + ".") for p in prefixes):
            return height
    return None


def test_no_import_runs_back_up_a_layer() -> None:
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    upward = []
    for start in graph:
        height = _layer(start)
        if height is None:
            continue
        # every module it reaches, with the chain that reaches it
        chains = {start: [start]}
        todo = [start]
        while todo:
            here = todo.pop()
            for there in sorted(graph[here] - chains.keys()):
                chains[there] = [*chains[here], there]
                todo.append(there)
        for reached, chain in chains.items():
            above = _layer(reached)
            if above is not None and above > height:
                upward.append(f"{' -> '.join(chain)} ({LAYERS[height][0]} reaches {LAYERS[above][0]})")
    assert not upward, "\n".join(sorted(upward)[:20])


def test_every_layer_names_modules_that_exist() -> None:
    modules = _modules()
    for _, prefixes in LAYERS:
        for prefix in prefixes:
            assert prefix in modules, prefix
