"""A compiled block's methods bound once (``_bound.c``): a ``with`` finds the block's own bound methods instead of
binding new ones, and they behave as the methods they stand for, called bound, through the class or wrongly."""

from __future__ import annotations

import gc

import pytest

from stepwatch import Stopwatch, _block_base
from stepwatch._blocks import Block, DroppedBlock

METHODS = ("__enter__", "__exit__", "_dropped_enter", "_dropped_exit")


@pytest.fixture(autouse=True)
def compiled() -> None:
    if not _block_base.COMPILED:
        pytest.fail("the development install was expected to build the C speedups")


def test_a_block_hands_out_the_same_bound_method_each_time() -> None:
    block = Stopwatch().timed("forward")
    for name in METHODS:
        bound = getattr(block, name)
        assert getattr(block, name) is bound and bound.__self__ is block and bound.__name__ == name
        assert repr(bound) == f"<bound method '{name}' of {block!r}>"
        assert getattr(Block, name) is vars(_block_base.BlockBase)[name]  # through the class: the method itself
    assert block.__enter__ is not block.__exit__


def test_bound_unbound_and_by_with_the_block_records_the_same() -> None:
    sw = Stopwatch()
    sw.enable()
    block = sw.timed("forward")
    with block:
        pass
    block.__enter__()
    block.__exit__(None, None, None)
    Block.__enter__(block)
    Block.__exit__(block, None, None, None)
    enter, leave = block.__enter__, block.__exit__
    enter()
    with sw.timed("inner"):
        pass
    leave(None, None, None)
    stages = sw.summary().phases["train"].stages
    assert stages["forward"].calls == 4 and stages["forward/inner"].calls == 1 and "inner" not in stages


def test_an_exception_goes_through_the_bound_exit() -> None:
    sw = Stopwatch()
    sw.enable()
    with pytest.raises(KeyError), sw.timed("forward"):
        raise KeyError("x")
    with sw.timed("after"):
        pass
    stages = sw.summary().phases["train"].stages
    assert stages["forward"].calls == 1 and stages["after"].calls == 1  # the stack was left whole


def test_wrong_calls_are_refused_as_the_methods_refuse_them() -> None:
    block = Stopwatch().timed("forward")
    with pytest.raises(TypeError, match="expected 3 arguments, got 1"):
        block.__exit__(None)
    with pytest.raises(TypeError, match="takes no arguments"):
        block.__enter__(1)
    with pytest.raises(TypeError, match="takes no keyword arguments"):
        block.__exit__(None, None, tb=None)
    with pytest.raises(TypeError, match="needs a stepwatch block"):
        Block.__exit__(object(), None, None, None)
    with pytest.raises(TypeError, match="needs a stepwatch block"):
        Block.__enter__()
    with pytest.raises(TypeError, match="does not apply to a 'int' object"):
        vars(_block_base.BlockBase)["__enter__"].__get__(3, int)


def test_the_dropped_class_takes_its_methods_from_the_same_kind() -> None:
    sw = Stopwatch()
    sw.enable()
    block = sw.timed("forward")
    sw.disable()
    assert type(block) is DroppedBlock
    assert block.__enter__ is block._dropped_enter and block.__exit__ is block._dropped_exit
    with block:
        assert len(block.inside) == 1
    assert block.inside == []


def test_a_block_and_its_bound_methods_are_collected_with_their_stopwatch() -> None:
    def bound_methods() -> int:
        gc.collect()
        return sum(type(thing).__name__ == "BoundBlockMethod" for thing in gc.get_objects())

    before = bound_methods()
    sw = Stopwatch()  # never enabled: nothing outside this test holds it (a ``with`` binds all the same)
    for _ in range(3):
        with sw.timed("a"), sw.timed("b"):
            pass
    assert bound_methods() == before + 4  # two blocks, each its __enter__ and __exit__
    del sw
    assert bound_methods() == before  # each block's cycle with its bound methods collected
