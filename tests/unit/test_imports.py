"""delayqueue's modules import each other without cycles (at module level: an import inside a
function, made on first use, is how a lower layer reaches a higher one on purpose)."""
import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "delayqueue"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_level_imports(path: Path, modules: set[str]) -> set[str]:
    found = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("delayqueue"):
            for alias in node.names:
                child = f"{node.module}.{alias.name}"
                found.add(child if child in modules else node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("delayqueue"))
    return found


def test_module_level_imports_form_no_cycle():
    paths = [p for p in PACKAGE.rglob("*.py") if "migrations" not in p.parts]
    modules = {module_name(p) for p in paths}
    graph = {module_name(p): module_level_imports(p, modules) & modules for p in paths}
    state: dict[str, str] = {}

    def visit(module: str, trail: list[str]) -> None:
        state[module] = "open"
        for imported in sorted(graph[module]):
            if state.get(imported) == "open":
                raise AssertionError("import cycle: " + " -> ".join([*trail, module, imported]))
            if imported not in state:
                visit(imported, [*trail, module])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [])
    assert len(graph) > 40  # the walk saw the whole package
