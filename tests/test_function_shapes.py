"""Every function of rul/ is short: at most 6 parameters (self and cls not counted) and at
most 50 lines (its docstring included). Exceptions are named here with the reason: a click
command takes one parameter per option, and the scikit-learn estimator's __init__ takes one
per hyperparameter (get_params reads them from its signature)."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_PARAMETERS, MAX_LINES = 6, 50
ESTIMATORS = {("rul/preprocessing/pipeline.py", "__init__")}


def _parameters(node: ast.FunctionDef) -> int:
    args = node.args
    named = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs
             if a.arg not in ("self", "cls")]
    return len(named) + bool(args.vararg) + bool(args.kwarg)


def _is_click_command(node: ast.FunctionDef) -> bool:
    return any(isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute)
               and d.func.attr in ("command", "group") for d in node.decorator_list)


def too_long(source: str, path: str) -> list[str]:
    """`path`'s functions over the limits, one line each."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        if _is_click_command(node) or (path, node.name) in ESTIMATORS:
            continue
        lines, parameters = node.end_lineno - node.lineno + 1, _parameters(node)
        if parameters > MAX_PARAMETERS or lines > MAX_LINES:
            found.append(f"{path}:{node.lineno} {node.name}: {parameters} parameters, "
                         f"{lines} lines")
    return found


def test_every_function_of_rul_is_short():
    found = [line for path in sorted((ROOT / "rul").rglob("*.py"))
             for line in too_long(path.read_text(), str(path.relative_to(ROOT)))]
    assert found == []


def test_a_long_function_is_found():
    seven = "def f(a, b, c, d, e, f, g):\n    pass\n"
    long = "def g(self):\n" + "    x = 1\n" * 50
    command = "@main.command()\ndef h(a, b, c, d, e, f, g):\n    pass\n"
    assert too_long(seven + long + command, "m.py") == [
        "m.py:1 f: 7 parameters, 2 lines", "m.py:3 g: 0 parameters, 51 lines"]
