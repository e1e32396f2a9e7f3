"""Calling nvFuser's fusion regions: a direct caller that does Thunder's per-call work once per input layout.

On every call Thunder's ``FusionDefinitionWrapper`` turns each input into a descriptor (contiguity, stride
order), looks the fusion definition up by them, and checks each input for distributed tensors before nvFuser
runs. In a host-bound step that is 10-25 µs of a region's call. The descriptors depend only on each tensor's
shape and strides, so :class:`DirectNvFuserCall` asks Thunder for the definition once per (shape, strides)
of the inputs and then runs it the way Thunder would: the same definition, the same ``execute`` arguments,
so the same kernels and the same bits.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from typing import Any

import torch

from .shared_fusions import SharedFusions

__all__ = [
    "ContiguousWrites",
    "DirectNvFuserCall",
    "RescuingCall",
    "Unrescuable",
    "direct_nvfuser_call",
    "is_out_of_memory",
    "nvfuser_definition",
]

_PLAIN = (torch.Tensor, torch.nn.Parameter)
# More layouts than this for one region (shapes that keep changing): start the table again.
MAX_LAYOUTS = 1024


def _wrapper_type() -> type | None:
    """Thunder's nvFuser region callable type; None where Thunder's nvFuser executor is not loaded."""
    impl = sys.modules.get("thunder.executors.nvfuserex_impl")
    return getattr(impl, "FusionDefinitionWrapper", None)


def _profiling_annotations() -> bool:
    from thunder.core.profile import profiling_enabled

    return profiling_enabled()


class _Wrapper:
    """A callable standing in for another (``inner``): attributes it does not have are the inner callable's
    (``name``, ``last_used``), so Thunder's code that reads them keeps working."""

    __slots__ = ()

    @property
    def inner(self) -> Any:
        raise NotImplementedError

    def __getattr__(self, name: str) -> Any:
        if name in type(self).__slots__:  # not set yet (a copy being made)
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.inner!r})"


class DirectNvFuserCall(_Wrapper):
    """Runs one nvFuser region as Thunder's ``FusionDefinitionWrapper`` ``wrapped`` would, with the fusion
    definition found once per input layout. Inputs that are not plain tensors or numbers (distributed or other
    tensor subclasses) go through ``wrapped`` itself. Other attributes (``name``, ``last_used``) are ``wrapped``'s.

    With ``shared`` (a :class:`.shared_fusions.SharedFusions`), a definition equal to one made before for another
    region (``label`` names this one) runs as that one, compiled once; ``on_shared(first)`` is told the first
    time, with the label of the region that compiled it.
    """

    __slots__ = ("_by_layout", "_on_shared", "label", "shared", "wrapped")

    def __init__(
        self,
        wrapped: Any,
        shared: SharedFusions | None = None,
        label: str = "",
        on_shared: Callable[[str], None] | None = None,
    ) -> None:
        self.wrapped = wrapped
        self._by_layout: dict[tuple, Any] = {}
        self.shared = shared
        self.label = label
        self._on_shared = on_shared

    def __call__(self, *args: Any) -> Any:
        key = []
        for a in args:
            if type(a) in _PLAIN:
                key.append((a.shape, a.stride()))
            elif isinstance(a, torch.Tensor):
                return self.wrapped(*args)
            else:
                key.append(None)
        w = self.wrapped
        layout = tuple(key)
        fd = self._by_layout.get(layout)
        if fd is None:
            if len(self._by_layout) >= MAX_LAYOUTS:
                self._by_layout.clear()
            fd = self._by_layout[layout] = self._definition(w, args)
        w.last_used = fd
        return fd.execute(
            args,
            device=fd._selected_device,
            save_repro_inputs=False,
            _enable_options=w.enable_options,
            _disable_options=w.disable_options,
        )

    def _definition(self, w: Any, args: tuple) -> Any:
        """Thunder's definition for the layout of ``args``, or an equal one compiled before (``shared``)."""
        fd = w.get_fd(w.to_descriptors(args))
        if self.shared is None:
            return fd
        options = (tuple(w.enable_options or ()), tuple(w.disable_options or ()))
        fd, first = self.shared.share(fd, self.label, options)
        if first is not None and self._on_shared is not None:
            on_shared, self._on_shared = self._on_shared, None
            with contextlib.suppress(Exception):  # recording never breaks the call
                on_shared(first)
        return fd

    @property
    def inner(self) -> Any:
        return self.wrapped


def direct_nvfuser_call(
    fn: Callable,
    shared: SharedFusions | None = None,
    label: str = "",
    on_shared: Callable[[str], None] | None = None,
) -> DirectNvFuserCall | str:
    """A direct caller for nvFuser region callable ``fn`` (sharing equal definitions through ``shared``, as
    :class:`DirectNvFuserCall`), or why ``fn`` keeps Thunder's own call."""
    if isinstance(fn, DirectNvFuserCall):
        return fn
    wrapper = _wrapper_type()
    if wrapper is None or type(fn) is not wrapper:
        return f"not Thunder's nvFuser region callable ({type(fn).__name__})"
    if not all(hasattr(fn, a) for a in ("get_fd", "to_descriptors", "enable_options", "disable_options")):
        return "Thunder's nvFuser region callable lacks what a direct call needs (another Thunder version?)"
    if not fn.use_cache:
        return "nv_skip_cache is set: Thunder runs the fusion definition it used last"
    if fn.store_inputs or fn.save_fake_inputs:
        return "nv_store_fusion_inputs or nv_save_fake_inputs is set: Thunder's call keeps the inputs"
    if _profiling_annotations():
        return "THUNDER_ANNOTATE_TRACES is set: Thunder's call marks each region for the profiler"
    return DirectNvFuserCall(fn, shared, label, on_shared)


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` says the device or host ran out of memory (``torch.OutOfMemoryError``, or an executor's
    error saying so): no sign that a region is broken, so never a reason to rescue it."""
    if isinstance(error, torch.OutOfMemoryError):
        return True
    text = str(error).lower()
    return isinstance(error, RuntimeError) and any(
        s in text for s in ("out of memory", "out_of_memory", "can't allocate memory")
    )


class Unrescuable(Exception):
    """Raised by a :class:`RescuingCall`'s fallback maker where the region can run no other way for a reason the
    user must read (a backward region that reads values Thunder lost): raised instead of the region's own error,
    chained from it."""


class RescuingCall(_Wrapper):
    """Runs one fusion region's callable ``fused``; where a call raises, runs ``make_fallback()`` (the region's
    ops one by one) on the same arguments instead, and from then on, and hands ``on_rescue(error, args)`` the
    failure; running out of memory is raised as it is, the fusion tried again at the next call. Where the
    fallback raises too, its error (the one eager PyTorch gives for those ops) reaches the
    caller and the region stays as it was; where no fallback can be built, the original error does, or the
    maker's :class:`Unrescuable` saying why, chained from it. Nothing
    more than one call and a ``try`` runs while the fusion works, so its outputs are the fusion's own.
    Other attributes are ``fused``'s (``name``, ``last_used``). ``first_call(fused, args)``, given, runs the first
    call (timing it, where the fusion executor compiles); later calls are ``fused``'s own again."""

    __slots__ = ("_first_call", "_make_fallback", "_on_rescue", "_run", "fused")

    def __init__(
        self,
        fused: Callable,
        make_fallback: Callable[[], Callable],
        on_rescue: Callable,
        first_call: Callable[[Callable, tuple], Any] | None = None,
    ) -> None:
        self.fused = fused
        self._first_call = first_call
        self._run = fused if first_call is None else self._first
        self._make_fallback = make_fallback
        self._on_rescue = on_rescue

    def _first(self, *args: Any) -> Any:
        self._run = self.fused  # from now on (a failure of this call too) as without a first-call timer
        first, self._first_call = self._first_call, None
        return first(self.fused, args)

    def __call__(self, *args: Any) -> Any:
        try:
            return self._run(*args)
        except Exception as error:  # the fused region may fail with any type: the rescue decides (out of memory raised)
            if self._run is not self.fused or is_out_of_memory(error):
                raise
            return self._rescue(error, args)

    @property
    def rescued(self) -> bool:
        """Whether the region runs by its fallback now."""
        return self._run is not self.fused and self._first_call is None

    def _rescue(self, error: Exception, args: tuple) -> Any:
        try:
            fallback = self._make_fallback()
        except Unrescuable as why:
            raise why from error
        except Exception:  # a fallback is a shortcut: if making it fails in any way, the region's own error is raised
            raise error from None
        out = fallback(*args)  # its error is the user's, as eager PyTorch raises it
        self._run = fallback
        with contextlib.suppress(Exception):  # recording never breaks the call
            self._on_rescue(error, args)
        return out

    @property
    def inner(self) -> Any:
        return self.fused


class ContiguousWrites(_Wrapper):
    """Runs a fusion region that writes some of its inputs (positions ``written``) so that each write lands:
    a written input that is not contiguous is handed to the fusion as a contiguous copy, copied into it after
    the call, and an output that is that copy is handed back as the input itself. nvFuser 0.2.36 loses or
    misplaces a write into a non-contiguous input (a ``narrow`` of a wider tensor): the input keeps its values.
    ``on_first(args, positions)`` is told the first call that needs it. A call whose written inputs are all
    contiguous is the fusion's own. The copy in goes through ``.data``, as the fusion's own write would:
    autograd's version counter does not move."""

    __slots__ = ("_on_first", "fused", "written")

    def __init__(self, fused: Callable, written: tuple[int, ...], on_first: Callable[[tuple, list[int]], None]) -> None:
        self.fused = fused
        self.written = written
        self._on_first = on_first

    def __call__(self, *args: Any) -> Any:
        strided = [i for i in self.written if isinstance(args[i], torch.Tensor) and not args[i].is_contiguous()]
        if not strided:
            return self.fused(*args)
        if self._on_first is not None:
            on_first, self._on_first = self._on_first, None
            with contextlib.suppress(Exception):  # recording never breaks the call
                on_first(args, strided)
        given = list(args)
        copies = {i: args[i].detach().clone(memory_format=torch.contiguous_format) for i in strided}
        for i, copy in copies.items():
            given[i] = copy
        out = self.fused(*given)
        back = {}
        for i, copy in copies.items():
            args[i].data.copy_(copy)
            back[(copy.data_ptr(), copy.shape)] = args[i]
        if isinstance(out, (list, tuple)):
            out = type(out)(_same_or(o, back) for o in out)
        return _same_or(out, back)

    @property
    def inner(self) -> Any:
        return self.fused


def _same_or(value: Any, back: dict) -> Any:
    if isinstance(value, torch.Tensor) and value.is_contiguous():
        return back.get((value.data_ptr(), value.shape), value)
    return value


def nvfuser_definition(fn: Callable, args: tuple) -> str | None:
    """nvFuser's Python definition of the fusion that region callable ``fn`` runs for ``args`` (a function
    ``nvfuser_fusion(fd)``, as ``nvfuser_direct`` prints it); None where ``fn`` is no nvFuser region or nvFuser
    cannot say."""
    while isinstance(fn, _Wrapper):
        fn = fn.inner
    wrapper = _wrapper_type()
    if wrapper is None or type(fn) is not wrapper:
        return None
    try:
        return repr(fn.get_fd(fn.to_descriptors(args)))
    except Exception:  # Thunder's private wrapper API and nvFuser's C++ may raise anything: None means "cannot say"
        return None
