"""A Python function on a class swapped for another without ``setattr``'s slot updates (``_class_attrs.c``,
through ``_patches.set_on_class``): what every instance, subclass and later subclass then calls is what
``setattr`` would have made it call, and every case it does not apply to is left to ``setattr``."""

from __future__ import annotations

import functools
from typing import Any, ClassVar

import pytest
import torch
from torch import nn

from stepwatch import _block_base
from stepwatch._patches import set_on_class

swap = _block_base.swap_class_function
needs_compiled = pytest.mark.skipif(swap is None, reason="the C speedups are not built")


def hierarchy() -> tuple[type, type, type, type]:
    """A base with ``__call__`` and ``method``, a subclass, its subclass, and a subclass with its own ``__call__``."""

    class Base:
        def __call__(self, x: int) -> str:
            return f"base {x}"

        def method(self) -> str:
            return "base method"

    class Sub(Base):
        pass

    class SubSub(Sub):
        pass

    class Own(Base):
        def __call__(self, x: int) -> str:
            return f"own {x}"

    return Base, Sub, SubSub, Own


def replacement_call(self: Any, x: int) -> str:
    return f"new {x}"


def replacement_method(self: Any) -> str:
    return "new method"


@needs_compiled
def test_a_dunder_swapped_in_c_reaches_every_instance_and_subclass_but_one_that_overrides_it() -> None:
    assert swap is not None
    Base, Sub, SubSub, Own = hierarchy()
    instances = [Base(), Sub(), SubSub(), Own()]
    assert [i(1) for i in instances] == ["base 1", "base 1", "base 1", "own 1"]  # the slots and caches in use
    original = vars(Base)["__call__"]
    assert swap(Base, "__call__", replacement_call) is True
    assert vars(Base)["__call__"] is replacement_call and Sub.__call__ is replacement_call
    assert [i(2) for i in instances] == ["new 2", "new 2", "new 2", "own 2"]

    class Later(SubSub):  # a subclass made after the swap inherits it
        pass

    assert Later()(3) == "new 3"
    assert swap(Base, "__call__", original) is True  # and back, as the narrowing does
    assert [i(4) for i in [*instances, Later()]] == ["base 4", "base 4", "base 4", "own 4", "base 4"]


@needs_compiled
def test_a_method_swapped_in_c_is_not_read_from_a_stale_lookup_cache() -> None:
    assert swap is not None
    Base, Sub, _, _ = hierarchy()
    sub = Sub()
    for _ in range(100):  # the interpreter specializes the attribute read on the class's version
        assert sub.method() == "base method"
    assert swap(Base, "method", replacement_method) is True
    assert sub.method() == "new method" and Sub().method() == "new method"


class SettingMeta(type):
    """A metaclass with its own ``__setattr__``: it decides how its classes take an attribute."""

    seen: ClassVar[list[str]] = []

    def __setattr__(cls, name: str, value: Any) -> None:
        SettingMeta.seen.append(name)
        super().__setattr__(name, value)


class Metered(metaclass=SettingMeta):
    def __call__(self) -> str:
        return "metered"


def static_call(x: int) -> str:
    return f"static {x}"


@needs_compiled
@pytest.mark.parametrize(
    "case",
    ["inherited", "not a function", "current not a function", "own setattr", "not a class", "builtin class"],
)
def test_every_other_case_is_left_to_setattr(case: str) -> None:
    assert swap is not None
    Base, Sub, _, _ = hierarchy()
    if case == "inherited":  # Sub's dictionary has no __call__: setattr adds one and updates Sub's slots
        assert swap(Sub, "__call__", replacement_call) is False and "__call__" not in vars(Sub)
    elif case == "not a function":
        partial = functools.partial(replacement_call)
        assert swap(Base, "__call__", partial) is False and vars(Base)["__call__"] is not partial
    elif case == "current not a function":
        Base.helper = staticmethod(static_call)  # type: ignore[attr-defined]
        assert swap(Base, "helper", replacement_method) is False
        assert isinstance(vars(Base)["helper"], staticmethod)
    elif case == "own setattr":
        before = vars(Metered)["__call__"]
        assert swap(Metered, "__call__", replacement_call) is False and vars(Metered)["__call__"] is before
    elif case == "not a class":
        assert swap(torch.autograd, "backward", replacement_method) is False  # type: ignore[arg-type]
    else:
        assert swap(int, "__repr__", replacement_method) is False and int.__repr__ is not replacement_method
    with pytest.raises(TypeError, match="takes 3 arguments"):
        swap(Base, "__call__")  # type: ignore[call-arg]


@pytest.mark.parametrize("target", ["own", "inherited", "metaclass", "module"])
def test_set_on_class_does_what_setattr_does(target: str) -> None:
    """Swapped in C or set by setattr, each case ends as ``setattr`` leaves it (the C path or not)."""
    Base, Sub, _, _ = hierarchy()
    owner: Any = {"own": Base, "inherited": Sub, "metaclass": Metered}.get(target)
    if owner is None:
        import types

        owner = types.ModuleType("scratch")
        owner.__call__ = None
    SettingMeta.seen.clear()
    set_on_class(owner, "__call__", replacement_call)
    assert vars(owner)["__call__"] is replacement_call
    if target == "metaclass":
        assert SettingMeta.seen == ["__call__"]  # its own __setattr__ ran
    if isinstance(owner, type):
        assert owner()(5) == "new 5"


def test_nn_module_call_moves_through_set_on_class_and_back() -> None:
    """What auto() does to ``nn.Module.__call__``: a wrapper on every module, then torch's own again."""
    original = vars(nn.Module)["__call__"]
    calls: list[str] = []

    @functools.wraps(original)
    def wrapper(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
        calls.append(type(module).__name__)
        return original(module, *args, **kwargs)

    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    model(torch.ones(1, 2))
    set_on_class(nn.Module, "__call__", wrapper)
    try:
        model(torch.ones(1, 2))
    finally:
        set_on_class(nn.Module, "__call__", original)
    model(torch.ones(1, 2))
    assert calls == ["Sequential", "Linear", "ReLU"]
    assert nn.Module.__call__ is nn.Module._wrapped_call_impl
