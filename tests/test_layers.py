"""The packages of rul/ import only downwards: no module imports a package above its own.

Each import of a `rul.` module (at module level or inside a function: a deferred import is
still a dependency) is mapped to its package (rul/<package>/ or a top-level module), and the
packages are ranked in LAYERS, lowest first. Packages in one tier sit beside each other and
may import each other.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

LAYERS = [
    ("errors", "files", "urls"),  # no rul import
    ("console", "interrupts", "tracking_uri"),  # those only
    ("data",),
    ("preprocessing",),
    ("models",),
    ("evaluation",),  # measures, intervals, ensembles' averages: numbers, no training
    ("training",),  # executes a plan and scores it with evaluation's measures
    ("serving",),  # the served model: preprocessing, networks, interval
    ("config", "services", "machine", "parallel"),
    ("plan",),
    ("tracking",),  # MLflow only
    ("tuning",),  # Optuna's side of a study: storage, sampler, pruner, search space
    ("workflows",),  # tracked runs, ensembles, evaluations, studies: plans + tracking
    ("inference", "reporting"),
    ("cli",),
    ("reference", "__main__"),  # the docs' reference pages read the CLI
]
RANK = {package: rank for rank, tier in enumerate(LAYERS) for package in tier}
# Upward imports still allowed, as (importing module, imported module): none.
ALLOWED: set[tuple[str, str]] = set()


def _package(module: str) -> str:
    """rul.tracking.store -> tracking; rul.plan -> plan; rul -> rul (the package itself)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "rul"


def _imports(tree: ast.AST):
    """Every rul module a module imports (`from rul import config` imports rul.config)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name.split(".")[0] == "rul")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "rul":
                yield from (f"rul.{a.name}" for a in node.names)
            elif node.module.startswith("rul."):
                yield node.module


def upward_imports(root: Path = ROOT / "rul") -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        own = _package(module)
        for imported in _imports(ast.parse(path.read_text())):
            target = _package(imported)
            if own == "rul" or target == "rul" or target == own:
                continue
            if (module, imported) in ALLOWED:
                continue
            if RANK[target] > RANK[own]:
                found.append(f"{module} imports {imported} ({own} is below {target})")
    return found


def test_every_package_has_a_layer():
    packages = {p.stem if p.is_file() else p.name for p in (ROOT / "rul").iterdir()
                if (p.suffix == ".py" and p.stem != "__init__")
                or (p.is_dir() and (p / "__init__.py").exists())}
    assert packages == set(RANK)


def test_no_module_imports_a_package_above_its_own():
    assert upward_imports() == []
