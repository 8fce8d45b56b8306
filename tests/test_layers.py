"""The package's layers (docs/architecture.md, "Package layout"): every import of every module points down
the list, the pure rules import no storage library, the public API reaches storage only through the
engine, and only sparkbus.storage imports a store's client. Read from the source with ast, nothing
imported; but the data source's module, imported in a fresh process to see that it leaves pandas out."""
from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import sparkbus

PACKAGE = pathlib.Path(sparkbus.__file__).parent
# lower number: lower layer; a module imports its own layer and the ones below
LAYERS = {"exceptions": 0, "core": 1, "storage": 2, "engine": 3, "spark": 4}
API = 5  # every other module: the public API, its async form and the command line
STORAGE_LIBRARIES = ("deltalake", "obstore", "pyspark")
STORE_CLIENTS = ("deltalake", "obstore")  # imported by sparkbus/storage alone



def _layer(module: str) -> int:
    """The layer of a module named as 'sparkbus.a.b'."""
    parts = module.split(".")
    return LAYERS.get(parts[1], API) if len(parts) > 1 else API


def _imports(path: pathlib.Path) -> list[tuple[str, int]]:
    """(absolute module name, line) of every import in the file, relative ones resolved; `from . import x`
    names the module x when x is one."""
    name = "sparkbus." + ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    package = package.removesuffix(".__init__")
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            base = base[:len(base) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:
                candidate = f"{module}.{alias.name}"
                is_module = (PACKAGE.parent / candidate.replace(".", "/")).with_suffix(".py").exists() or \
                    (PACKAGE.parent / candidate.replace(".", "/")).is_dir()
                found.append((candidate if is_module else module, node.lineno))
    return found


def _modules() -> list[pathlib.Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_every_import_points_down_the_layers():
    upward = []
    for path in _modules():
        here = "sparkbus." + ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
        for module, line in _imports(path):
            if module.startswith("sparkbus.") and _layer(module) > _layer(here):
                upward.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {module}")
    assert not upward, "imports running back up:\n" + "\n".join(upward)


def test_the_pure_rules_and_the_public_api_import_no_storage_library():
    """core/ is rules without I/O (no delta-rs, no Spark); the public API reaches tables through the engine,
    never importing delta-rs or sparkbus.storage itself."""
    found = []
    for path in _modules():
        here = "sparkbus." + ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
        if _layer(here) == LAYERS["core"]:
            refused = STORAGE_LIBRARIES + ("sparkbus.storage", "sparkbus.engine", "sparkbus.spark")
        elif _layer(here) == API:
            refused = ("deltalake", "obstore", "sparkbus.storage")
        else:
            continue
        found += [f"{path.relative_to(PACKAGE.parent)}:{line} imports {module}" for module, line in _imports(path)
                  if any(module == name or module.startswith(name + ".") for name in refused)]
    assert not found, "storage reached past the engine:\n" + "\n".join(found)


def test_only_the_storage_layer_imports_a_store_client():
    """delta-rs and obstore are imported by sparkbus/storage alone: every call that reaches a store goes
    through its functions, which raise a store's refusal as the SDK's error (sparkbus.storage.errors)."""
    found = []
    for path in _modules():
        here = "sparkbus." + ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
        if _layer(here) == LAYERS["storage"]:
            continue
        found += [f"{path.relative_to(PACKAGE.parent)}:{line} imports {module}" for module, line in _imports(path)
                  if any(module == name or module.startswith(name + ".") for name in STORE_CLIENTS)]
    assert not found, "store clients imported outside sparkbus/storage:\n" + "\n".join(found)


def test_no_module_imports_itself_round_a_circle():
    """No circle of imports between modules, type-only imports included (they tie the modules as much for a
    reader): each module can be read after the ones it imports."""
    graph: dict[str, set[str]] = {}
    for path in _modules():
        here = "sparkbus." + ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
        graph[here.removesuffix(".__init__")] = set()
    for path in _modules():
        here = ("sparkbus." + ".".join(path.relative_to(PACKAGE).with_suffix("").parts)).removesuffix(".__init__")
        graph[here] = {module for module, _ in _imports(path) if module in graph and module != here}
    circles, state = [], {}

    def visit(module: str, trail: list[str]) -> None:
        state[module] = "open"
        for imported in sorted(graph[module]):
            if state.get(imported) == "open":
                circles.append(" -> ".join(trail[trail.index(imported):] + [imported]))
            elif imported not in state:
                visit(imported, trail + [imported])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not circles, "circles of imports:\n" + "\n".join(circles)


def test_the_data_source_module_loads_without_pandas():
    """Spark starts a fresh Python process for each planning step of a query on the sparkbus data source (its
    schema, its partitions), and each imports sparkbus.spark.datasource: pandas, about a second of each
    process, is imported only by what needs it (placement_udf)."""
    script = "import sys, sparkbus.spark.datasource; print('pandas' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False"]
