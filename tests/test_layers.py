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
    ("errors", "files", "urls", "orphans"),  # no rul import
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


# Below the plan: the packages under the config's tier. The plan narrows the config into the
# settings each of them reads (rul.plan), so none takes, names or reads a config.
BELOW_THE_PLAN = {package for package, rank in RANK.items() if rank < RANK["config"]}
CONFIG_NAMES = {"config", "configs", "TrainConfig", "TuningConfig"}


def config_reads(root: Path = ROOT / "rul") -> list[str]:
    """Each parameter, name or attribute called like a config in a module below the plan."""
    found = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if _package(module) not in BELOW_THE_PLAN:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            name = (node.arg if isinstance(node, ast.arg) else node.id if isinstance(
                node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else
                    node.name if isinstance(node, ast.alias) else None)
            if name is not None and name.split(".")[-1] in CONFIG_NAMES:
                found.append(f"{module}:{node.lineno} {name}")
    return found


def test_nothing_below_the_plan_reads_the_config():
    assert {"data", "preprocessing", "models", "evaluation", "training", "serving"} <= \
        BELOW_THE_PLAN
    assert config_reads() == []


def test_the_config_check_sees_a_config_read(tmp_path):
    """A module below the plan that took the config again would be found."""
    package = tmp_path / "rul" / "training"
    package.mkdir(parents=True)
    (package / "loop.py").write_text("def fit(model, plan):\n    return plan.config.epochs\n")
    (package / "step.py").write_text("def step(config):\n    return 1\n")
    assert config_reads(tmp_path / "rul") == ["rul.training.loop:2 config",
                                              "rul.training.step:1 config"]


def module_imports(root: Path = ROOT / "rul") -> dict[str, set[str]]:
    """Each module of rul/ and the rul modules it imports (at module level or inside a
    function), as dotted names; `from rul.x import y` imports rul.x.y where that is a module."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for module, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                    node.module.split(".")[0] == "rul":
                names = [f"{node.module}.{a.name}" for a in node.names]
                found |= {n for n in names if n in modules} or {node.module}
            elif isinstance(node, ast.Import):
                found |= {a.name for a in node.names if a.name in modules}
        graph[module] = {m for m in found if m in modules and m != module}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm), each
    sorted. A package's __init__ re-exporting its modules is not a cycle of theirs."""
    graph = {m: {t for t in targets if not (m.startswith(t + ".") and t != "rul")}
             for m, targets in graph.items()}
    index, low, stack, on_stack, cycles, counter = {}, {}, [], set(), [], [0]

    def visit(node):
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


def test_no_modules_import_each_other():
    """Not even through an import inside a function: a cycle dodged at import time is still
    two modules that cannot be read apart."""
    assert import_cycles(module_imports()) == []


def test_the_cycle_check_sees_a_deferred_cycle():
    graph = {"rul.a": {"rul.b"}, "rul.b": {"rul.c"}, "rul.c": {"rul.a"}, "rul.d": {"rul.a"}}
    assert import_cycles(graph) == [["rul.a", "rul.b", "rul.c"]]
