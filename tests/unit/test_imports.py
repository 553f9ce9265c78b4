"""Every import between delayqueue's modules, wherever it stands (module level, inside a function,
under TYPE_CHECKING), points down or sideways in delayqueue.LAYERS, and none closes a circle."""
import ast
from pathlib import Path

from delayqueue import LAYERS

PACKAGE = Path(__file__).resolve().parents[2] / "delayqueue"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, modules: set[str]) -> set[str]:
    """Every delayqueue module the file imports, anywhere in it."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import"
            if node.module and node.module.split(".")[0] == "delayqueue":
                for alias in node.names:
                    child = f"{node.module}.{alias.name}"
                    found.add(child if child in modules else node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.split(".")[0] == "delayqueue")
    return found - {"delayqueue"}


def layer_of(module: str) -> int:
    for index, (_name, prefixes) in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return index
    raise AssertionError(f"{module} is in no layer of delayqueue.LAYERS")


def import_graph() -> dict[str, set[str]]:
    paths = list(PACKAGE.rglob("*.py"))
    modules = {module_name(p) for p in paths}
    return {module_name(p): imported_modules(p, modules) for p in paths}


def test_every_module_is_in_a_layer_and_imports_only_its_own_or_lower_layers():
    graph = import_graph()
    upward = sorted(f"{module} ({LAYERS[layer_of(module)][0]}) imports {target} ({LAYERS[layer_of(target)][0]})"
                    for module, targets in graph.items() if module != "delayqueue"
                    for target in targets if layer_of(target) > layer_of(module))
    assert not upward, "imports pointing up:\n" + "\n".join(upward)
    assert len(graph) > 60  # the walk saw the whole package


def test_no_import_closes_a_circle():
    graph = import_graph()
    state: dict[str, str] = {}

    def visit(module: str, trail: list[str]) -> None:
        state[module] = "open"
        for imported in sorted(graph[module]):
            if state.get(imported) == "open":
                raise AssertionError("import circle: " + " -> ".join([*trail, module, imported]))
            if imported not in state:
                visit(imported, [*trail, module])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [])


def test_the_walk_sees_imports_inside_functions_and_type_checking_blocks(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from delayqueue.runtime import Runtime\n"
                      "def f():\n    from delayqueue.api import views\n")
    assert imported_modules(source, {"delayqueue.runtime", "delayqueue.api.views"}) == {
        "delayqueue.runtime", "delayqueue.api.views"}
