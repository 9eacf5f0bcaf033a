"""The patches auto-instrumentation puts on torch: each wraps one call, keeps its signature, arguments, return
value and exceptions, and times it only when the session says a step of its loop is running on this thread.

- ``DataLoader.__iter__``: a loop over a DataLoader is watched as ``watch(loader)`` would watch it;
- ``nn.Module.__call__``: the outermost module call of a step is ``forward`` (``loss`` for a loss module);
  once the classes of those calls are known, the wrapper is on those classes only (``_module_calls``);
- ``torch.autograd.backward``, which ``Tensor.backward`` calls: ``backward`` (one wrapper a step, not two);
- torch's global optimizer step hooks: ``optimizer``; ``Optimizer.zero_grad`` and ``Module.zero_grad``:
  ``zero_grad``;
- ``Tensor.to`` and ``Tensor.cuda`` from host to an accelerator, outside forward: ``h2d`` (only patched when
  an accelerator is in use).

Every wrapper first reads :data:`session`: ``None`` (stepwatch not auto-instrumenting, or a forked child)
makes it a plain call. Inside an auto block (``session.busy``) nested calls are plain too, so submodules,
backward inside an optimizer's closure and copies inside forward are not timed twice.
"""

from __future__ import annotations

import functools
import logging
import sys
import types
from collections.abc import Callable, Iterator
from threading import get_ident
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._auto import AutoSession

logger = logging.getLogger("stepwatch")

session: AutoSession | None = None
"""The running auto-instrumentation, read by every wrapper; None when off. Assigned from outside this module
(``_patches.session = ...``), never with ``global`` in it: its module class hands each value to the compiled
wrappers too."""


class _SessionModule(types.ModuleType):
    """This module's class: an assignment or deletion of ``session`` also hands the value over to the compiled
    wrappers (``_speedups.share_session``), which read it there, on one cache line, rather than from this
    module's dictionary (about six lines a call, cold in a real step)."""

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        if name == "session":
            _share(value)

    def __delattr__(self, name: str) -> None:
        super().__delattr__(name)
        if name == "session":
            _share(None)


def _share(value: Any) -> None:
    from ._block_base import share_session

    if share_session is not None:
        share_session(value)


sys.modules[__name__].__class__ = _SessionModule


def _timed(name: str, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    current = session
    assert current is not None
    current.busy += 1
    try:
        with current.sw.timed(name):
            return call(*args, **kwargs)
    finally:
        current.busy -= 1


def _timing(current: AutoSession | None) -> bool:
    """Whether a patched call made now on this thread is timed: a step of the session's loop is running
    here, no auto block is open, and the stopwatch is measuring."""
    return (
        current is not None
        and not current.busy
        and current.loop_thread == get_ident()
        and current.sw.stacks.measuring is True
    )


MODULE_CALL, BACKWARD, ZERO_GRAD, PRE_STEP, POST_STEP = 0, 1, 2, 3, 4
"""The kinds of ``_speedups.AutoCall``: which wrapper's common case it runs."""


def compiled(kind: int, original: Callable[..., Any] | None, wrapper: Callable[..., Any]) -> Callable[..., Any]:
    """``wrapper``, or where the C speedups are built, ``_speedups.AutoCall``: the common case of a step in C,
    everything else by ``wrapper`` (see ``_auto_calls.c``). Both carry ``original``'s name, doc and
    ``__wrapped__`` (a hook, with no original: the hook's)."""
    from ._block_base import AutoCall

    if AutoCall is None:
        return wrapper
    torch: Any = sys.modules["torch"]
    fast = AutoCall(kind, original, wrapper, torch.is_grad_enabled, torch.is_inference_mode_enabled)
    functools.update_wrapper(fast, wrapper if original is None else original)
    return fast  # type: ignore[no-any-return]


def wrap_module_call(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def __call__(module: Any, *args: Any, **kwargs: Any) -> Any:
        current = session
        if current is None or current.busy or current.loop_thread != get_ident():
            return original(module, *args, **kwargs)
        calls = current.module_calls
        if type(module) not in calls.outer:
            calls.found(type(module))
        if current.sw.stacks.measuring is not True:
            counting = current.sw.flop_count
            if counting is not None and counting.counter is not None:  # the step whose FLOPs are counted:
                module = getattr(module, "_orig_mod", module)  # a compiled model runs eagerly (see _flops)
            return original(module, *args, **kwargs)
        torch: Any = current.torch
        steady = current.steady_forward  # the model and the loss module last called for training, if any
        if steady is not None and module is steady():
            known = "forward" if module.training else None  # type: ignore[union-attr]
        else:
            steady = current.steady_loss
            known = "loss" if steady is not None and module is steady() else None
        if (  # module_stage's answer, known: what could change it is read again
            known is not None
            and current.evaluation is None
            and torch.is_grad_enabled()
            and not torch.is_inference_mode_enabled()
        ):
            current.training_blocks += 1
            stage = known
        else:
            stage = current.module_stage(module)
        block = current.sw.timed(stage)
        current.busy += 1  # (``_timed``, inlined: once a step for the model, once for a loss module)
        try:
            with block:
                return original(module, *args, **kwargs)
        finally:
            current.busy -= 1

    return __call__


def wrap_outer_module_call(original: Callable[..., Any]) -> Callable[..., Any]:
    """The module-call wrapper for the classes of a step's outermost calls, once narrowed to them: its common
    case in C where built, unless ``torch.compile`` has compiled something (dynamo traces the Python wrapper
    when such a class is called inside a compiled region, and would break the graph at the C one). The wrapper
    on ``nn.Module`` itself, which every call inside a compiled model meets while learning, stays in Python."""
    wrapper = wrap_module_call(original)
    if dynamo_compiled():
        return wrapper
    return compiled(MODULE_CALL, original, wrapper)


def dynamo_compiled() -> bool:
    """Whether dynamo (``torch.compile``) has compiled a frame in this process; where its counters are not
    found (another torch), whether it is loaded at all. (Creating an optimizer loads it: that alone says
    nothing.)"""
    utils = sys.modules.get("torch._dynamo.utils")
    if utils is None:
        return False
    try:
        return bool(utils.counters["frames"]["total"])
    except (AttributeError, KeyError, TypeError):
        return True


def wrap_backward(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def backward(*args: Any, **kwargs: Any) -> Any:
        current = session
        if current is None:
            return original(*args, **kwargs)
        current.backward_calls += 1
        if current.busy or current.loop_thread != get_ident() or current.sw.stacks.measuring is not True:
            return original(*args, **kwargs)  # (``_timing``, inlined: a nested backward comes here)
        if current.evaluation is not None:
            current.end_evaluation()
        current.training_blocks += 1
        current.found.backward = True
        block = current.sw.timed("backward")
        current.busy += 1  # (``_timed``, inlined: once a step)
        try:
            with block:
                return original(*args, **kwargs)
        finally:
            current.busy -= 1

    return compiled(BACKWARD, original, backward)


def wrap_zero_grad(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def zero_grad(*args: Any, **kwargs: Any) -> Any:
        current = session
        if (
            current is None
            or current.busy
            or current.loop_thread != get_ident()
            or current.sw.stacks.measuring is not True
        ):
            return original(*args, **kwargs)  # (``_timing``, inlined: once a step)
        if current.evaluation is not None:
            current.end_evaluation()
        current.found.zero_grad = True
        current.zero_grads += 1
        block = current.sw.timed("zero_grad")
        current.busy += 1
        try:
            with block:
                return original(*args, **kwargs)
        finally:
            current.busy -= 1

    return compiled(ZERO_GRAD, original, zero_grad)


def moves_to_device(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether ``Tensor.to(*args, **kwargs)`` names a device other than the host: a device string or
    ``torch.device`` (``"cuda"``, ``"cuda:1"``, ``"mps"``, ``"meta"``), a device index, or another tensor's
    device. A dtype alone, or the host, is not a move."""
    device = kwargs.get("device")
    if device is None and args:
        first = args[0]
        if isinstance(first, (str, int)) or type(first).__name__ == "device":
            device = first
        elif hasattr(first, "device") and hasattr(first, "dtype") and hasattr(first, "shape"):  # a tensor
            device = first.device
    if device is None or isinstance(device, bool):
        return False
    if isinstance(device, int):
        return True  # an accelerator's index
    kind = device.split(":", 1)[0] if isinstance(device, str) else getattr(device, "type", "cpu")
    return bool(kind != "cpu")


def wrap_to(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def to(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        current = session
        if not _timing(current) or tensor.device.type != "cpu" or not moves_to_device(args, kwargs):
            return original(tensor, *args, **kwargs)
        current.found.h2d = True  # type: ignore[union-attr]
        return _timed("h2d", original, tensor, *args, **kwargs)

    return to


def wrap_cuda(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def cuda(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        current = session
        if not _timing(current) or tensor.device.type != "cpu":
            return original(tensor, *args, **kwargs)
        current.found.h2d = True  # type: ignore[union-attr]
        return _timed("h2d", original, tensor, *args, **kwargs)

    return cuda


def optimizer_pre_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
    """Torch's global hook before every ``Optimizer.step``: opens the ``optimizer`` block."""
    current = session
    if current is None or current.busy or current.loop_thread != get_ident() or current.sw.stacks.measuring is not True:
        return  # (``_timing``, inlined: once a step)
    if current.evaluation is not None:
        current.end_evaluation()
    optimizers = current.found.optimizers
    name = type(optimizer).__name__
    if name not in optimizers:
        optimizers[name] = None
    block = current.sw.timed("optimizer")
    block.__enter__()
    current.open_blocks.append(block)
    current.busy += 1


def optimizer_post_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
    """Torch's global hook after every ``Optimizer.step``: closes the ``optimizer`` block; without a
    DataLoader loop, the step ends here."""
    current = session
    if current is None or current.loop_thread not in (None, get_ident()):
        return
    if current.open_blocks:
        current.busy -= 1
        current.open_blocks.pop().__exit__(None, None, None)
    if current.evaluation is None and current.driven is None and current.loop_thread is not None:
        return  # a DataLoader loop's step: nothing ends here (``optimizer_stepped``'s common case, inlined)
    current.optimizer_stepped()


def set_on_class(owner: Any, name: str, value: Any) -> None:
    """``setattr(owner, name, value)``; a Python function on a class swapped for another in C where built
    (``_class_attrs.c``): ``nn.Module.__call__`` set by ``setattr`` updates the slot of each of its 353 subclasses,
    about 280 us in a training step, each time auto()'s module-call wrapper moves."""
    from ._block_base import swap_class_function

    if swap_class_function is None or not swap_class_function(owner, name, value):
        setattr(owner, name, value)


class Patches:
    """What was patched, to undo it: attributes replaced on torch's classes and modules, and hook handles."""

    def __init__(self) -> None:
        self._replaced: list[tuple[Any, str, Any, Any]] = []  # (owner, name, original or None, wrapper)
        self._handles: list[Any] = []

    def replace(self, owner: Any, name: str, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
        """Sets ``owner.name`` to ``wrap(original)``; an attribute inherited from a base class (``Tensor.to``
        comes from ``TensorBase``) is shadowed, and the shadow deleted on undo."""
        own = vars(owner).get(name)
        wrapper = wrap(getattr(owner, name))
        set_on_class(owner, name, wrapper)
        self._replaced.append((owner, name, own, wrapper))

    def restore(self, owner: Any, name: str) -> None:
        """Undoes the patch of ``owner.name`` alone (if stepwatch's is still there)."""
        for index, (patched, patched_name, original, wrapper) in enumerate(self._replaced):
            if patched is owner and patched_name == name:
                if vars(owner).get(name) is wrapper:
                    if original is None:
                        delattr(owner, name)
                    else:
                        set_on_class(owner, name, original)
                del self._replaced[index]
                return

    def hook(self, handle: Any) -> None:
        self._handles.append(handle)

    def patched(self, owner: Any, name: str) -> bool:
        return any(o is owner and n == name for o, n, _, _ in self._replaced)

    def undo(self) -> None:
        """Restores every original, newest first; one that was patched again over stepwatch's is left as it
        is (undoing it would remove the other patch too), and said."""
        for owner, name, original, wrapper in reversed(self._replaced):
            if vars(owner).get(name) is wrapper:
                if original is None:
                    delattr(owner, name)
                else:
                    set_on_class(owner, name, original)
            else:
                logger.warning(
                    "stepwatch: %s.%s was replaced again after stepwatch patched it; left as it is",
                    getattr(owner, "__name__", owner),
                    name,
                )
        self._replaced.clear()
        for handle in reversed(self._handles):
            handle.remove()
        self._handles.clear()


def install(patches: Patches, torch: Any, accelerator: bool) -> None:
    """Puts every patch on ``torch`` (already imported) but the module calls' (see ``_module_calls``);
    ``accelerator`` adds the host-to-device copies."""
    from torch.optim import optimizer as optim_module

    patches.replace(torch.utils.data.DataLoader, "__iter__", wrap_loader_iter)
    patches.replace(torch.autograd, "backward", wrap_backward)
    patches.replace(torch.optim.Optimizer, "zero_grad", wrap_zero_grad)
    patches.replace(torch.nn.Module, "zero_grad", wrap_zero_grad)
    pre_hook = compiled(PRE_STEP, None, optimizer_pre_hook)
    post_hook = compiled(POST_STEP, None, optimizer_post_hook)
    patches.hook(optim_module.register_optimizer_step_pre_hook(pre_hook))
    patches.hook(optim_module.register_optimizer_step_post_hook(post_hook))
    if accelerator:
        install_h2d(patches, torch)


def install_h2d(patches: Patches, torch: Any) -> None:
    if not patches.patched(torch.Tensor, "to"):
        patches.replace(torch.Tensor, "to", wrap_to)
        patches.replace(torch.Tensor, "cuda", wrap_cuda)


def wrap_loader_iter(original: Callable[[Any], Iterator[Any]]) -> Callable[[Any], Iterator[Any]]:
    """``DataLoader.__iter__`` while auto-instrumenting: loops are watched when the stopwatch is on."""

    def __iter__(loader: Any) -> Iterator[Any]:
        current = session
        if current is None or not current.sw.is_enabled():
            return original(loader)
        return current.loop(loader, original)

    __iter__.__wrapped__ = original  # type: ignore[attr-defined]
    __iter__.__doc__ = original.__doc__
    return __iter__
