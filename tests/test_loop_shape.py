"""The training loop stays readable: no function or method written in rul/training/ or
rul/plan.py takes more than six parameters (what is fixed for a run is bundled once: the plan,
the step's settings), found by walking the modules, nested functions and lambdas included."""

import importlib
import inspect
import pkgutil
import types

import rul.plan
import rul.training

LIMIT = 6  # self included, as inspect.signature counts a method accessed from its class


def modules() -> list[types.ModuleType]:
    found = [importlib.import_module(info.name)
             for info in pkgutil.walk_packages(rul.training.__path__, "rul.training.")]
    return [rul.plan, *found]


def written_in(module: types.ModuleType) -> list:
    """The functions and methods whose source is `module`'s file (not those a dataclass
    generates, nor those imported or inherited)."""
    def own(obj) -> bool:
        code = getattr(obj, "__code__", None)
        return code is not None and code.co_filename == module.__file__

    functions = []
    for obj in vars(module).values():
        if inspect.isfunction(obj) and own(inspect.unwrap(obj)):  # decorated ones too
            functions.append(obj)
        elif inspect.isclass(obj) and obj.__module__ == module.__name__:
            for name, member in vars(obj).items():
                if isinstance(member, property):
                    functions += [f for f in (member.fget, member.fset) if f and own(f)]
                elif own(inspect.unwrap(getattr(obj, name))):
                    functions.append(getattr(obj, name))  # as accessed from the class
    return functions


def nested(code: types.CodeType):
    """The code of the functions and lambdas defined inside `code`, at any depth."""
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield const
            yield from nested(const)


def parameter_count(code: types.CodeType) -> int:
    """What inspect.signature would count for a function of `code`."""
    flags = inspect.CO_VARARGS | inspect.CO_VARKEYWORDS
    return (code.co_argcount + code.co_kwonlyargcount
            + bin(code.co_flags & flags).count("1"))


def over_the_limit() -> dict[str, int]:
    too_many = {}
    for module in modules():
        for function in written_in(module):
            name = f"{module.__name__}.{function.__qualname__}"
            if (n := len(inspect.signature(function).parameters)) > LIMIT:
                too_many[name] = n
            for code in nested(inspect.unwrap(function).__code__):
                if (n := parameter_count(code)) > LIMIT:
                    too_many[f"{name}.<{code.co_name}>"] = n
    return too_many


def test_the_walk_finds_the_loop_down_to_the_step():
    from rul.training import backoff, batching, engine, step

    found = {f for module in modules() for f in written_in(module)}
    for function in (engine.fit, engine.TrainState.end_epoch, backoff.BackoffStep.__call__,
                     step.optimizer_step, rul.plan.step_settings, batching.effective_batches,
                     rul.plan.plan_run, rul.plan.RunPlan.global_batch_size.fget):
        assert function in found, function


def test_no_function_of_the_training_loop_takes_more_than_six_parameters():
    assert over_the_limit() == {}
