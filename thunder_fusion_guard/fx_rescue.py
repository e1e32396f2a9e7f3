"""Rescue of ThunderFX subgraphs: a split subgraph that Thunder fails to compile or to run is run the way ThunderFX
runs the ops it splits off, and one whose outputs come back in another layout than Dynamo recorded hands them
back in the recorded one.

ThunderFX compiles each split subgraph with ``thunder.jit`` at its first call; an error there (Thunder's
interpreter, a transform, a fusion executor) ends the user's step. :class:`SubgraphRescue` stands between the
subgraph's ThunderModule and Thunder's compiled function. Where a call fails it runs, from then on:

1. where the failure came from a ``CUDAGraphTransform`` (Thunder's, or ``GuardedCUDAGraphs``): where one of its
   own checks refused the trace (a backward that gets no saved tensors), the same subgraph compiled by Thunder
   with the same capture adapted to it (:func:`~._thunder.capture_for_any_trace`); else, or where that fails too,
   compiled without it (it only captures and replays, so no value changes: that part stays uncaptured);
2. otherwise the subgraph's fx module compiled by Inductor, as ThunderFX compiles the ops it splits off;
3. that module run eagerly, where Inductor fails too.

A call on fake tensors (torch.compile's DDP optimizer runs each bucket's compiled module on them to learn the next
bucket's inputs) runs the subgraph's own ops on them, as Dynamo traced them: Thunder cannot run on fake tensors
(unguarded, the compile fails), and its first call on real tensors is still Thunder's.

An error the eager module raises as well is the user's: it reaches the caller unchanged. The parts ThunderFX
compiled with Inductor were compiled for the strides Dynamo recorded, and check them, so on a subgraph's first
call each output whose strides differ from the recorded ones, that is no view of an input and that such a part
reads, is copied into that layout from then on (same values). A subgraph that updates an input in place with a value
requiring grad (a copy into a buffer), which Thunder would do outside autograd's record (gradients lost without an
error), runs eagerly from its first call, where autograd records the update; an output that comes back without its
recorded history is said, not changed.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from . import _thunder as th
from .decisions import Action, Decision, Details
from .ops import writes_inputs
from .reasons import Facts, ReasonCode, words
from .wording import error_line, error_text

# Told of each rescue, and of outputs restrided.
OnRescue = Callable[["Rescued"], None]
# Called once, after the first call Thunder ran, with that call's positional arguments (None where it had keyword
# ones): may give the rescue a direct entry (``SubgraphRescue.enter``) or an eager run (``run_eagerly``).
OnFirstCall = Callable[["SubgraphRescue", tuple | None], None]


@dataclass(frozen=True)
class Rescued:
    """What happened to one subgraph: ``by`` runs it now after ``error`` (None: only ``restrided`` outputs)."""

    by: str | None
    error: Exception | None
    args: tuple
    restrided: tuple[int, ...] = ()
    problems: tuple[str, ...] = ()
    lost_grad: tuple[str, ...] = ()  # values Thunder left without the autograd history Dynamo recorded
    remade: tuple[int, ...] = ()  # inputs made again as views of their bases (views_without_history)
    aliased: tuple[int, ...] = ()  # inputs updated in place whose memory other tensors hold too: not rescued
    inductor_skipped: bool = False  # Inductor not tried: the subgraph updates its inputs in place
    fake: bool = False  # called on fake tensors: its own ops ran on them (not a failure, said once)
    received: tuple | None = None  # a rescue's: copies of the call's inputs as unguarded Thunder would get them


def compile_fx_module(
    module: torch.fx.GraphModule, inputs: list[Any], backend: str, options: dict[str, Any] | None = None
) -> Callable:
    """A copy of ``module`` run eagerly (``backend='eager'``) or compiled by Inductor for ``inputs``
    (``'inductor'``, with Inductor's config ``options`` for this compile only, read from and written to Inductor's
    caches: ``th.inductor_compile``); a copy, since Inductor's passes may rewrite the graph they are given."""
    copied = torch.fx.GraphModule(module, copy.deepcopy(module.graph))
    if backend == "eager":
        return copied
    if backend == "inductor":
        return th.inductor_compile(copied, list(inputs), options)  # kept by Inductor's caches, as Dynamo's
    raise ValueError(f"unknown backend {backend!r}; allowed: 'eager', 'inductor'")


def copy_input(x: Any) -> Any:
    """A copy with the same sizes and strides (Inductor compiles for the strides it is shown, and checks them),
    also where elements share memory (an ``expand``ed tensor: no copy can write into such a layout, so the span
    of memory it reads is copied and viewed the same way); detached, keeping whether it requires grad."""
    if not isinstance(x, torch.Tensor):
        return x
    grad, x = x.requires_grad, x.detach()
    if x.numel() and any(st == 0 and n > 1 for n, st in zip(x.size(), x.stride(), strict=True)):
        span = 1 + sum((n - 1) * st for n, st in zip(x.size(), x.stride(), strict=True))
        copied = x.as_strided((span,), (1,)).clone().as_strided(x.size(), x.stride())
    else:
        copied = torch.empty_strided(x.size(), x.stride(), dtype=x.dtype, device=x.device).copy_(x)
    return copied.requires_grad_(grad)


class SubgraphRescue:
    """What a ThunderFX subgraph's ThunderModule calls instead of Thunder's compiled function ``thunder_fn``."""

    def __init__(
        self,
        jitted: Any,
        thunder_fn: Callable,
        module: torch.fx.GraphModule,
        on_rescue: OnRescue,
        on_first_call: OnFirstCall | None = None,
    ) -> None:
        self.jitted, self.thunder_fn, self.module = jitted, thunder_fn, module
        self.__wrapped__ = thunder_fn  # the call it stands in front of (``unwrap_module_call`` puts it back)
        self._run: Callable = thunder_fn
        self._entry: Callable | None = None  # Thunder's compiled function entered directly (``enter``)
        self._eager: Callable | None = None  # the subgraph's own ops, found to give Thunder's bits (``run_eagerly``)
        self._on_first_call = on_first_call
        self._after: Callable[[Any, tuple], Any] | None = self._check_layout
        self._restrided: tuple[int, ...] = ()
        self._examples: list[Any] = []
        self._refused = False
        self._first_call = True
        self._remade: tuple[int, ...] = ()  # inputs made again from their bases at each call (views_without_history)
        self._on_rescue = on_rescue
        self._told_fake = False
        self._before_next: Callable[[tuple], None] | None = None  # run once at the next call (``at_next_call``)
        # What checks, at the next call, the graph calling this subgraph, after one of its fusion regions failed
        # (given by the guard where it times such graphs whole): called with that call's arguments and, as
        # ``failed``, the region's rescue
        self.on_region_failure: Callable[..., None] | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        grad = torch.is_grad_enabled()
        received = args  # as unguarded Thunder would get them
        if self._before_next is not None:
            before, self._before_next = self._before_next, None
            with contextlib.suppress(Exception):  # a check for later calls: never a reason to fail this one
                before(received)
        if self._first_call:
            if any(is_fake(a) for a in args):  # before the first real call only: the check costs µs an argument
                return self._on_fakes(args, kwargs)
            self._first_call = False
            self._remade = views_without_history(args)
            args = remade_views(args, self._remade)
            losing = inputs_updated_outside_autograd(self.module, args)
            if losing:
                return self._keep_history(losing, args, kwargs, received)
            if self._remade:
                self._tell(Rescued(None, None, args, remade=self._remade))
        elif self._remade:
            args = remade_views(args, self._remade)
        try:
            out = self._run(*args, **kwargs)
        except Exception as error:  # whatever Thunder, a transform or an executor raises is the rescue's to try
            if self.rescued or self._run is self._eager or th.is_out_of_memory(error):
                raise
            torch.set_grad_enabled(grad)  # a compilation that failed can leave Thunder's no-grad mode on
            return self._rescue(error, args, kwargs, received)
        if self._on_first_call is not None and self._run is self.thunder_fn:
            first, self._on_first_call = self._on_first_call, None
            with contextlib.suppress(Exception):  # a direct entry is a shortcut: never a reason to fail the call
                first(self, None if kwargs else args)
        return out if self._after is None else self._after(out, args)

    @property
    def rescued(self) -> bool:
        """Whether what runs the subgraph now is a rescue's (Thunder failed on it), not Thunder's nor its eager run."""
        return self._run is not self.thunder_fn and self._run is not self._entry and self._run is not self._eager

    def enter(self, entry: Callable) -> None:
        """Call ``entry`` (Thunder's compiled function entered directly, the same computation) from now on, until
        a rescue replaces it."""
        if not self.rescued:
            self._entry = self._run = entry

    def run_eagerly(self, eager: Callable) -> None:
        """Call ``eager`` (the subgraph's own ops, found to give Thunder's bits) from now on, in Thunder's place."""
        if not self.rescued:
            self._eager = self._run = eager

    def at_next_call(self, before: Callable[[tuple], None]) -> None:
        """Call ``before`` once, with the arguments of the subgraph's next call, before that call runs (a region
        that failed inside a backward is checked at the next forward, where the graph calling it is on the stack)."""
        self._before_next = before

    @property
    def run(self) -> Callable:
        """What runs the subgraph now: Thunder's compiled function, its direct entry, or what a rescue put there."""
        return self._run

    def _rescue(self, error: Exception, args: tuple, kwargs: dict, received: tuple) -> Any:
        problems: list[str] = []
        transforms = th.jitted_transforms(self.jitted)
        for transform in transforms:
            th.forget_forward(transform)  # a failed compilation may have left its forward's state behind
        culprit = _failing_transform(error, transforms)
        if culprit is not None and th.is_cudagraph_transform(culprit):
            name = type(culprit).__name__
            adapted = th.capture_for_any_trace(culprit, writes_inputs) if th.refused_by_its_checks(error) else None
            if adapted is not None:
                try:
                    again = _unrescued(th.jit_again_without(self.jitted, culprit, instead=adapted))
                    out = again(*args, **kwargs)
                    by = f"Thunder with {name} adapted to a trace its checks refuse"
                    return self._rescued(by, again, out, error, args, problems, thunder=True)
                except Exception as e:  # one way tried: any failure of it leaves the next to try
                    problems.append(f"Thunder with {name} adapted: {error_line(e)}")
                    th.forget_forward(adapted)
            try:
                again = _unrescued(th.jit_again_without(self.jitted, culprit))
                out = again(*args, **kwargs)
                return self._rescued(f"Thunder without {name}", again, out, error, args, problems, thunder=True)
            except Exception as e:  # what remains of the failure once the capture is out of the way
                problems.append(f"Thunder without {name}: {error_line(e)}")
                th.forget_forward(culprit)
                error = e
        received = tuple(copy_input(a) for a in received)  # before a rescue's run updates any in place
        updated = updated_inputs(self.module)
        aliased = [i for i in sorted(updated) if i < len(args) and shares_memory_beyond_itself(args[i], args)]
        if aliased and torch.is_grad_enabled():
            # Autograd through an update of memory another tensor also holds (a view another compiled part made,
            # which may reach autograd as a tensor of its own) is where a run could go wrong without a word
            # (gradients lost or wrong): the failure is the user's to see, as unguarded.
            if not self._refused:
                self._refused = True
                self._tell(Rescued(None, error, args, aliased=tuple(aliased)))
            raise error
        if not updated:  # Inductor applies an update of an input outside autograd's view: gradients would be lost
            try:
                inductor = compile_fx_module(self.module, list(args), "inductor")
                out = inductor(*args)
                return self._rescued("Inductor", inductor, out, error, args, problems, received=received)
            except Exception as e:  # Inductor's failure of any kind leaves eager PyTorch to try
                problems.append(f"Inductor: {error_line(e)}")
        eager = compile_fx_module(self.module, list(args), "eager")
        out = eager(*args, **kwargs)  # its error is the user's, as eager PyTorch raises it
        return self._rescued(
            "eager PyTorch", eager, out, error, args, problems, inductor_skipped=bool(updated), received=received
        )

    def _on_fakes(self, args: tuple, kwargs: dict) -> Any:
        """The subgraph's own ops on fake tensors (the outputs' shapes, no values): Thunder's compile and the first
        call's checks wait for real tensors."""
        if not self._told_fake:
            self._told_fake = True
            self._tell(Rescued("its own ops on fake tensors", None, args, fake=True))
        return self.module(*args, **kwargs)

    def _keep_history(self, losing: tuple[str, ...], args: tuple, kwargs: dict, received: tuple) -> Any:
        """Run the subgraph eagerly from now on, before Thunder compiles it: Thunder would update ``losing``, inputs
        it updates in place, outside autograd's record (gradients through them lost without an error); eagerly,
        the update is autograd's. An error here is the user's, as eager PyTorch raises it."""
        eager = compile_fx_module(self.module, list(args), "eager")
        self._run, self._after, self._on_first_call = eager, None, None
        received = tuple(copy_input(a) for a in received)  # before the eager run updates any in place
        out = eager(*args, **kwargs)
        what = Rescued("eager PyTorch", None, args, lost_grad=losing, remade=self._remade, received=received)
        self._tell(what)
        return out

    def _rescued(
        self,
        by: str,
        run: Callable,
        out: Any,
        error: Exception,
        args: tuple,
        problems: list[str],
        thunder: bool = False,
        inductor_skipped: bool = False,
        received: tuple | None = None,
    ) -> Any:
        """``run`` runs the subgraph from now on; Thunder's outputs (``thunder``) still go through the layout
        check."""
        self._run, self._after = run, (self._check_layout if thunder else None)
        what = Rescued(by, error, args, problems=tuple(problems), inductor_skipped=inductor_skipped, received=received)
        self._tell(what)
        return out if self._after is None else self._after(out, args)

    def _check_layout(self, out: Any, args: tuple) -> Any:
        """The first call's outputs against Dynamo's record (their autograd history, their strides); from then on,
        the mismatched ones restrided."""
        self._after = None
        outputs = list(out) if isinstance(out, (tuple, list)) else [out]
        self._examples = examples = th.fx_output_examples(self.module)
        lost = gradients_lost(self.module, outputs, examples, args)
        if lost:  # said, not changed: the values stay Thunder's, as unguarded
            self._tell(Rescued(None, None, args, lost_grad=lost))
        if len(examples) != len(outputs):
            return out
        inputs = [a for a in args if isinstance(a, torch.Tensor)]
        differ = [
            i
            for i, (o, ex) in enumerate(zip(outputs, examples, strict=True))
            if _layout_differs(o, ex) and not any(_shares_memory(o, a) for a in inputs)
        ]
        # Only where a part compiled for the recorded strides reads it (unknown: every one that differs).
        readers = th.split_graph_readers(self.jitted) if differ else None
        self._restrided = tuple(i for i in differ if readers is None or i >= len(readers) or "other" in readers[i])
        if not self._restrided:
            return out
        self._after = self._restride
        self._tell(Rescued(None, None, args, restrided=self._restrided))
        return self._restride(out, args)

    def _restride(self, out: Any, args: tuple) -> Any:
        single = not isinstance(out, (tuple, list))
        outputs = [out] if single else list(out)
        for i in self._restrided:
            o, ex = outputs[i], self._examples[i]
            if isinstance(o, torch.Tensor) and _layout_differs(o, ex):
                outputs[i] = torch.empty_strided(ex.size(), ex.stride(), dtype=o.dtype, device=o.device).copy_(o)
        return outputs[0] if single else type(out)(outputs)

    def _tell(self, what: Rescued) -> None:
        with contextlib.suppress(Exception):  # recording never breaks the call
            self._on_rescue(what)


def is_fake(value: Any) -> bool:
    """Whether ``value`` is a fake tensor (Dynamo learning shapes): no real call, nothing to run or check on it."""
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(value, FakeTensor)


def _unrescued(jitted: Any) -> Any:
    """``jitted``, a subgraph compiled again by the rescue, without the rescue the guard gave it as it was built
    (this rescue goes on where it fails)."""
    if isinstance(th.module_call(jitted), SubgraphRescue):
        th.unwrap_module_call(jitted)
    return jitted


def gradients_lost(gm: torch.fx.GraphModule, outputs: list[Any], examples: list[Any], args: tuple) -> tuple[str, ...]:
    """The outputs (where there are as many as Dynamo recorded), and the inputs updated in place, that Dynamo
    recorded as requiring grad (eager gives them a gradient) but that came back from ``gm``'s call without
    autograd history, with grad on: gradients through them would be lost without an error (Thunder leaves an
    input it updated in place, ``buf.copy_(x)``, so)."""
    if not torch.is_grad_enabled():
        return ()

    def lost(value: Any, example: Any) -> bool:
        return (
            isinstance(value, torch.Tensor)
            and isinstance(example, torch.Tensor)
            and example.requires_grad
            and not value.requires_grad
        )

    pairs = enumerate(zip(outputs, examples, strict=True)) if len(outputs) == len(examples) else ()
    found = [f"output {i}" for i, (o, ex) in pairs if lost(o, ex)]
    updated = {i: node.meta.get("example_value") for i, node in in_place_updates(gm) if i < len(args)}
    found += [f"input {i} (updated in place)" for i, ex in sorted(updated.items()) if lost(args[i], ex)]
    return tuple(found)


def views_without_history(args: tuple) -> tuple[int, ...]:
    """The positions of ``args`` that are views requiring grad without autograd history of a base that requires
    none (a view another compiled part handed back marked so: ThunderFX's splitter runs a ``narrow`` of a buffer by
    Inductor, which marks it requiring grad since a later copy into it does). Eager PyTorch refuses to update such a
    view in place (a view of a leaf); a view of the same memory made again from its base is what eager has."""
    if not torch.is_grad_enabled():
        return ()
    return tuple(i for i, a in enumerate(args) if _view_without_history(a))


def _view_without_history(a: Any) -> bool:
    return (
        isinstance(a, torch.Tensor)
        and a._is_view()
        and a.requires_grad
        and a.grad_fn is None
        and a._base is not None
        and not a._base.requires_grad
    )


def remade_views(args: tuple, positions: tuple[int, ...]) -> tuple:
    """``args`` with each view at ``positions`` that is still one :func:`views_without_history` finds made again
    from its base (the same size, strides and offset: the same memory)."""
    if not positions or not torch.is_grad_enabled():
        return args
    return tuple(
        a._base.as_strided(a.size(), a.stride(), a.storage_offset())
        if i in positions and _view_without_history(a)
        else a
        for i, a in enumerate(args)
    )


def refusing_lost_gradients(
    call: Callable, module: torch.fx.GraphModule, refuse: Callable[[str], Exception]
) -> Callable:
    """``call`` (a ThunderFX subgraph's function, strict mode: nothing is rescued) checked at its first call: where
    Thunder would lose a gradient without an error (:func:`inputs_updated_outside_autograd`), it raises
    ``refuse(why)`` before anything runs; ``__wrapped__`` is ``call``."""
    first = [True]

    def checked(*args: Any, **kwargs: Any) -> Any:
        if first[0]:
            first[0] = False
            losing = inputs_updated_outside_autograd(module, args)
            if losing:
                raise refuse(
                    f"Thunder {th.software_versions()['thunder']} would update {', '.join(losing)} outside autograd's "
                    "record and lose its gradient without an error (strict: not run eagerly instead)"
                )
        return call(*args, **kwargs)

    checked.__wrapped__ = call  # type: ignore[attr-defined]
    return checked


def inputs_updated_outside_autograd(gm: torch.fx.GraphModule, args: tuple) -> tuple[str, ...]:
    """The inputs ``gm`` updates in place with a value Dynamo recorded requiring grad (as
    ``buf.narrow(...).copy_(x)``), with grad on: Thunder 0.2.6 writes into an input outside autograd's record (its
    autograd function marks nothing dirty), so a gradient through the update is lost without an error, whether
    the input had autograd history before or not. Only where autograd knows what else holds their memory
    (:func:`aliasing_known_to_autograd`): eagerly, autograd then records the update for all of them."""
    if not torch.is_grad_enabled():
        return ()
    found = set()
    for i, node in in_place_updates(gm):
        example = node.meta.get("example_value")
        if (
            i < len(args)
            and isinstance(args[i], torch.Tensor)
            and isinstance(example, torch.Tensor)
            and example.requires_grad
            and aliasing_known_to_autograd(args[i], args)
        ):
            found.add(i)
    return tuple(f"input {i} (updated in place)" for i in sorted(found))


def aliasing_known_to_autograd(tensor: Any, args: tuple) -> bool:
    """Whether autograd knows every tensor of ``args`` that shares ``tensor``'s memory: each is ``tensor``'s
    autograd base or a view of that same base, and that base holds its whole storage. Then an eager in-place update
    of ``tensor`` reaches them all through autograd; a tensor sharing memory without being autograd's view (a view
    another compiled part returned as a tensor of its own) would not see it, without a word."""
    if not isinstance(tensor, torch.Tensor):
        return True
    try:
        base = tensor._base if tensor._is_view() else tensor
        storage = base.untyped_storage()
        if base.storage_offset() or storage.nbytes() != base.numel() * base.element_size():
            return False
        holders = [a for a in args if isinstance(a, torch.Tensor) and a is not tensor]
        return all(
            (a._base if a._is_view() else a) is base
            for a in holders
            if a.untyped_storage().data_ptr() == storage.data_ptr()
        )
    except Exception:  # a tensor without storage (fake, some subclasses): nothing known, so assume the worst
        return False


def shares_memory_beyond_itself(tensor: Any, args: tuple) -> bool:
    """Whether ``tensor`` is a view, shares its storage with another tensor of ``args``, or holds less than its
    whole storage (so another tensor may hold the rest: a view that reached autograd as a tensor of its own)."""
    if not isinstance(tensor, torch.Tensor):
        return False
    if tensor._base is not None:
        return True
    try:
        storage = tensor.untyped_storage()
        if tensor.storage_offset() or storage.nbytes() != tensor.numel() * tensor.element_size():
            return True
        return any(
            isinstance(a, torch.Tensor) and a is not tensor and a.untyped_storage().data_ptr() == storage.data_ptr()
            for a in args
        )
    except Exception:  # a tensor without storage (fake, some subclasses): nothing known, so assume the worst
        return True


def updated_inputs(gm: torch.fx.GraphModule) -> set[int]:
    """The positions of the inputs of ``gm`` that it updates in place (through views of them too): the first
    argument of each in-place op (a method or function whose name ends in one ``_``: ``copy_``, ``add_``; an
    augmented assignment, ``+=``) and of each item set, followed back to a placeholder."""
    return {i for i, _ in in_place_updates(gm)}


def in_place_updates(gm: torch.fx.GraphModule) -> list[tuple[int, torch.fx.Node]]:
    """Each in-place op of ``gm`` on one of its inputs: (the input's position, the op's node)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    found = []
    for node in gm.graph.nodes:
        if node.op not in ("call_method", "call_function") or not node.args:
            continue
        name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
        if not _updates_in_place(name, node.target):
            continue
        target = node.args[0]
        while isinstance(target, torch.fx.Node) and target.op != "placeholder" and target.args:
            target = target.args[0]
        if isinstance(target, torch.fx.Node) and target in placeholders:
            found.append((placeholders.index(target), node))
    return found


_AUGMENTED = frozenset(
    (
        "iadd",
        "isub",
        "imul",
        "itruediv",
        "ifloordiv",
        "imod",
        "ipow",
        "iand",
        "ior",
        "ixor",
        "ilshift",
        "irshift",
        "imatmul",
    )
)


def _updates_in_place(name: str, target: Any) -> bool:
    """Whether an FX node's target updates its first argument in place: ``setitem``, a method or function whose
    name ends in one ``_`` (``copy_``, ``add_``), an augmented assignment (``operator.iadd`` as Dynamo records
    ``z += out``, or the ``__iadd__`` method)."""
    if name == "setitem" or (name.endswith("_") and not name.endswith("__")):
        return True
    if name.startswith("__") and name.endswith("__"):
        return name[2:-2] in _AUGMENTED
    return name in _AUGMENTED and (
        isinstance(target, str) or getattr(target, "__module__", None) in ("_operator", "operator")
    )


def _failing_transform(error: BaseException, transforms: list[Any]) -> Any | None:
    """The transform of ``transforms`` that raised ``error``: the innermost frame of its traceback that is one of
    the transform's methods, or code of a module that defines its class or a base of it (``CUDAGraphTransform``'s
    capture runs in a runner object of its module)."""
    files = {}
    for t in transforms:
        for cls in th.transform_classes(t):
            with contextlib.suppress(TypeError, OSError):
                files.setdefault(inspect.getfile(cls), t)
    found = None
    for frame, _ in traceback.walk_tb(error.__traceback__):
        owner = frame.f_locals.get("self")
        by_method = next((t for t in transforms if owner is t), None)
        found = by_method or files.get(frame.f_code.co_filename) or found
    return found


def _layout_differs(out: Any, example: Any) -> bool:
    """Whether tensor ``out`` has the sizes of Dynamo's ``example`` but other strides, in a layout a copy can
    take (dense, no two elements in one place); False where either is no tensor or sizes are symbolic."""
    if not isinstance(out, torch.Tensor) or not isinstance(example, torch.Tensor):
        return False
    try:
        size, stride = tuple(int(n) for n in example.size()), tuple(int(s) for s in example.stride())
    except Exception:  # a symbolic size or stride raises whatever its shape environment raises: not comparable
        return False
    if tuple(out.size()) != size or tuple(out.stride()) == stride:
        return False
    return _dense(size, stride)


def _dense(size: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    """Whether a tensor of ``size`` and ``stride`` covers its memory exactly once (a permuted contiguous layout)."""
    expected = 1
    for n, s in sorted((d for d in zip(size, stride, strict=True) if d[0] != 1), key=lambda d: d[1]):
        if s != expected:
            return False
        expected *= n
    return True


def _shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    try:
        return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    except Exception:  # a tensor without storage (fake, some subclasses): nothing known, so assume it does
        return True


def subgraph_op_decision(
    subgraph: str, module: torch.fx.GraphModule, action: Action, code: ReasonCode, facts: Facts, details: Details
) -> Decision:
    """A decision about ThunderFX subgraph ``subgraph`` as a whole (its fx ``module``: its ops and the user's line),
    scope "op", worded from ``code`` and ``facts``; ``details`` adds what the caller knows."""
    return _subgraph_decision(subgraph, module, action, code, facts, {"scope": "op", **details})


def _subgraph_decision(
    subgraph: str,
    module: torch.fx.GraphModule,
    action: Action,
    code: ReasonCode,
    facts: Facts,
    details: Details,
    error: str | None = None,
) -> Decision:
    """A decision about ThunderFX subgraph ``subgraph`` (its fx ``module``: its ops and the user's line), worded
    from ``code`` and ``facts``, its details the wording's, then ``details``, then the user's line."""
    reason, told = words(code, facts)
    merged: Details = {**told, **details}
    source = th.fx_module_source(module)
    if source:
        merged["source"] = source
    return Decision(
        "forward",
        subgraph,
        "thunder",
        th.fx_graph_ops(module),
        action,
        reason,
        subgraph=subgraph,
        details=merged,
        code=code,
        facts=dict(facts),
        error=error,
    )


def entry_decision(subgraph: str, module: torch.fx.GraphModule, not_entered: str) -> Decision:
    """The decision recording whether ThunderFX subgraph ``subgraph``'s compiled function is entered directly
    (``not_entered`` empty) or keeps Thunder's call, and why (worded by :func:`.reasons.words`)."""
    code: ReasonCode = "entry_kept" if not_entered else "entered"
    details: Details = {"entered": not not_entered}
    if not_entered:
        details["not_entered"] = not_entered
    return subgraph_op_decision(
        subgraph, module, "enter", code, Facts(why=not_entered) if not_entered else Facts(), details
    )


def rescue_decision(subgraph: str, module: torch.fx.GraphModule, what: Rescued, describe: Callable) -> Decision:
    """The decision recording ``what`` happened to ThunderFX subgraph ``subgraph`` (its fx ``module``), worded
    from its code and facts by :func:`.reasons.words`; ``describe(args)`` words the failing call's inputs."""
    details: Details = {}
    action: Action = "rescue"
    if what.lost_grad and what.by:
        code: ReasonCode = "grad_update_rescued"
        facts = Facts(region=subgraph, values=list(what.lost_grad), rescued_by=what.by)
        details.update(without_grad=list(what.lost_grad), rescued_by=what.by)
        if what.remade:
            details["remade_views"] = list(what.remade)
    elif what.fake:
        code, action = "fake_inputs", "keep"
        facts = Facts(region=subgraph)
    elif what.lost_grad:
        code, action = "grad_lost", "keep"
        facts = Facts(region=subgraph, values=list(what.lost_grad))
        details.update(without_grad=list(what.lost_grad))
    elif what.error is not None and what.by is None:
        code, action = "not_rescued", "keep"
        facts = Facts(region=subgraph, error=error_line(what.error), aliased=list(what.aliased))
        details.update(error_type=type(what.error).__name__)
    elif what.remade and what.error is None and not what.restrided:
        code = "views_remade"
        facts = Facts(region=subgraph, remade=list(what.remade))
        details.update(remade_views=list(what.remade))
    elif what.error is None:
        code = "outputs_restrided"
        facts = Facts(region=subgraph, restrided=list(what.restrided))
        details.update(outputs_restrided=list(what.restrided))
    else:
        code = "subgraph_rescued"
        facts = Facts(
            region=subgraph,
            error=error_line(what.error),
            rescued_by=what.by,
            tried=list(what.problems),
            inductor_skipped=what.inductor_skipped,
        )
        details.update(rescued_by=what.by, error_type=type(what.error).__name__, inputs=describe(what.args))
    error = error_text(what.error) if code in ("not_rescued", "subgraph_rescued") else None
    return _subgraph_decision(subgraph, module, action, code, facts, details, error)
