"""Where the user wrote an op: the user's frame Thunder's trace keeps of it (beside the innermost frame Thunder
records), read from bound symbols, from a torch.fx node Dynamo made, or from a formatted stack; the frames of
torch, Thunder, this package and Python's own library are never the user's. Another installed library's frame
(a Hugging Face ``transformers`` model's) is not the user's either: the user's line names the op, with the
library's innermost line kept after it in parentheses, ``model.py:42 (modeling_gpt_bigcode.py:310)``."""

from __future__ import annotations

import contextlib
import dis
import functools
import importlib.util
import itertools
import os
import re
import sysconfig
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import thunder
import torch
from thunder.core.proxies import Proxy
from thunder.core.symbol import BoundSymbol
from thunder.core.trace import TraceCtx

from .. import shims
from .compat import direct_descriptors_patch, fix_needed, package_compiling
from .scoped import _compiling_guarded, _Patch
from .traces import is_fusion

__all__ = [
    "applied_in_scope",
    "calls_with_user_lines",
    "compilation_begins",
    "compilation_ends",
    "fx_node_source",
    "is_installed_library_file",
    "is_library_file",
    "module_path",
    "package_compilations",
    "record_backward_frames",
    "record_user_frames",
    "source_finder",
    "source_line",
    "stack_trace_source",
    "user_frame",
    "user_lines",
    "with_library",
]


def source_line(*bsyms: BoundSymbol) -> str | None:
    """Where the user wrote the first of ``bsyms`` (or of their subsymbols, breadth first) that knows it: the
    user's frame that made it (the first outside torch, Thunder, this package and Python's own library, or where
    the user wrote no frame, the module of their model: :func:`record_user_frames`), else the innermost frame
    Thunder recorded where that is the user's; never a line of torch, Thunder or a program torch.fx generated. An op
    of a backward trace knows the line of the forward op it is part of the gradient of
    (:func:`record_backward_frames`)."""
    for bsym in bsyms:
        stack = [bsym]
        while stack:
            b = stack.pop(0)
            positions, filename = getattr(b, "source_positions", None), getattr(b, "source_filename", None)
            user = getattr(positions, "user", None)  # a backward op's has no file: record_backward_frames
            if user:
                return user
            if filename and positions is not None and positions.lineno is not None and not is_library_file(filename):
                return f"{filename}:{positions.lineno}"
            stack.extend(b.subsymbols)
    return None


def source_finder(trace: TraceCtx) -> Callable[[Iterable[str]], str | None]:
    """A function of names giving :func:`source_line` of the first that names a fusion region of ``trace`` or a
    value one of its ops (or an op in one of its regions) makes; None where none is known."""
    made: dict[str, BoundSymbol] = {}
    for bsym in trace.bound_symbols:
        if is_fusion(bsym):
            made.setdefault(bsym.sym.name, bsym)
        for b in (bsym, *bsym.subsymbols):
            for out in b.flat_outs:
                if isinstance(out, Proxy):
                    made.setdefault(out.name, b)

    def source_of(names: Iterable[str]) -> str | None:
        for name in names:
            line = source_line(made[name]) if name in made else None
            if line:
                return line
        return None

    return source_of


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # this package: _thunder's parent
# Libraries whose frames are no user's line: torch, Thunder, this package, and the tensor-notation libraries that
# only hand their calls on to torch (einops' rearrange is the user's line that called it, not einops' own)
_NOTATION_LIBRARIES = ("einops", "opt_einsum")


def _package_dirs(names: Iterable[str]) -> list[str]:
    """The folders of the installed packages ``names`` (found without importing them)."""
    dirs = []
    for name in names:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin:
            dirs.append(os.path.dirname(os.path.abspath(spec.origin)))
    return dirs


_LIBRARIES = tuple(
    path + os.sep
    for path in (
        os.path.dirname(os.path.abspath(torch.__file__)),
        os.path.dirname(os.path.abspath(thunder.__file__)),
        _PACKAGE,
        *_package_dirs(_NOTATION_LIBRARIES),
    )
)
# this package's example models (the demo's functions, the benchmark cases, the zoo's own models): a user's code
_EXAMPLES = frozenset(
    os.path.join(_PACKAGE, *parts)
    for parts in (("tools", "demo.py"), ("bench", "cases.py"), ("bench", "zoo_models.py"))
)
_STDLIB = os.path.abspath(sysconfig.get_paths()["stdlib"]) + os.sep
_GENERATED = ("<eval_with_key>", "thunder.")  # torch.fx's and Thunder's generated programs
_STACK_FRAME = re.compile(r'File "([^"]+)", line (\d+)')


@functools.lru_cache(maxsize=4096)
def is_library_file(filename: str) -> bool:
    """True for a file of torch, Thunder, this package (its example models aside) or Python's own library, or a
    program torch.fx or Thunder generated: no frame a user wrote."""
    path = os.path.abspath(filename)
    if path in _EXAMPLES:
        return False
    if filename.startswith(_GENERATED) or path.startswith(_LIBRARIES):
        return True
    return path.startswith(_STDLIB) and not {"site-packages", "dist-packages"} & set(path.split(os.sep))


@functools.lru_cache(maxsize=4096)
def is_installed_library_file(filename: str) -> bool:
    """True for a file of an installed library other than those of :func:`is_library_file` (under
    ``site-packages``: ``transformers``, ``timm``, ``e3nn``): no line of the user's, but one worth keeping beside
    it (:func:`user_frame`)."""
    path = os.path.abspath(filename)
    if path in _EXAMPLES or is_library_file(filename):
        return False
    return bool({"site-packages", "dist-packages"} & set(path.split(os.sep)))


def user_frame(frames: Iterable[tuple[str, int]]) -> str | None:
    """``file:line`` of the first of ``frames`` ((file, line), innermost first) that the user wrote (outside the
    libraries of :func:`is_library_file` and :func:`is_installed_library_file`), followed, where an installed
    library's frame comes before it, by the first such in parentheses: ``model.py:42 (modeling_gpt_bigcode.py:310)``;
    that library frame alone where the user wrote none; None where every frame is torch's, Thunder's or this
    package's."""
    user, library = _user_and_library(frames)
    return with_library(user, library) if user else library


def with_library(user: str, library: str | None) -> str:
    """``user`` (a ``file:line`` or a module of the model) and in parentheses the installed library's line
    inside it, where there is one."""
    return f"{user} ({library})" if library else user


def _user_and_library(frames: Iterable[tuple[str, int]]) -> tuple[str | None, str | None]:
    """The user's first frame of ``frames`` (innermost first) and the first installed library's frame before it,
    each ``file:line`` (None: none)."""
    library = None
    for file, line in frames:
        if is_library_file(file):
            continue
        if is_installed_library_file(file):
            library = library or f"{file}:{line}"
            continue
        return f"{file}:{line}", library
    return None, library


def stack_trace_source(text: str | None) -> str | None:
    """The user's frame (:func:`user_frame`) of a formatted stack (a torch.fx node's ``stack_trace``, outermost
    first)."""
    return user_frame(reversed(_STACK_FRAME.findall(text or "")))


class _Located(dis.Positions):
    """Thunder's position of an op in its innermost frame, and ``user``: the user's frame that led there."""

    user: str | None = None


class _Scope:
    """How many guarded compilations (or calls of a guarded program) now want the user's lines, the patches that
    install them (built on first need), and whether each thread's compilation holds them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.holders = 0
        self.patches: list[_Patch] | None = None
        self.thread = threading.local()


_SCOPE = _Scope()
_PATCHES = 4  # how many _scoped_patches() makes where every shim applies, nvFuser's descriptors aside


def _expected_patches() -> int:
    """How many patches :func:`_scoped_patches` makes where every shim applies: nvFuser's descriptors only where
    they are needed (:func:`.compat.fix_needed`), so that a machine without them does not build them each hold."""
    return _PATCHES + fix_needed()


@contextlib.contextmanager
def user_lines() -> Iterator[None]:
    """Within: each op a guarded compilation traces remembers the user's frame that led to it and each backward op
    the line of its forward op (:func:`record_user_frames`, :func:`record_backward_frames`); outside, Thunder's
    functions are its own again. Nested and thread-safe: installed by the first to enter, removed by the last."""
    _hold()
    try:
        yield
    finally:
        _release()


def _hold() -> None:
    with _locked():
        _hold_locked()


def _hold_locked() -> None:
    _SCOPE.holders += 1
    if _SCOPE.holders == 1:
        patches = _SCOPE.patches
        # built once; again where one is missing (turned off, or applied by hand when built) or stale
        if patches is None or len(patches) < _expected_patches() or not all(p.current() for p in patches):
            _SCOPE.patches = [p for p in _scoped_patches() if p is not None]
        for patch in _SCOPE.patches:
            patch.install()


def _scoped_patches() -> tuple[_Patch | None, ...]:
    """Every patch held with the user's lines: theirs, torch.fx's error handler left uninterpreted, einsum's
    labels walked in sorted order, and nvFuser's regions given ``nvfuser_direct``'s descriptors where needed."""
    from .einsum_order import einsum_order_patch
    from .fx_errors import fx_error_handler_patch

    return (
        _user_frames_patch(),
        _backward_frames_patch(),
        fx_error_handler_patch(),
        einsum_order_patch(),
        direct_descriptors_patch(),
    )


@contextlib.contextmanager
def package_compilations() -> Iterator[None]:
    """Within, in this thread: the package's own compilations and fusions, guarded or not (calibration's probes,
    the guard's regions built after Thunder's), make nvFuser regions that run on builds shipping only
    ``nvfuser_direct`` (:func:`.compat.direct_descriptors_patch`, held with the user's lines: :func:`user_lines`)."""
    with package_compiling():
        _hold()
        try:
            yield
        finally:
            _release()


def _release() -> None:
    with _locked():
        _release_locked()


def _release_locked() -> None:
    _SCOPE.holders -= 1
    if _SCOPE.holders == 0:
        for patch in _SCOPE.patches or ():
            patch.remove()


def calls_with_user_lines(call: Callable) -> Callable:
    """``call`` (a guarded ThunderModule's function, which compiles on a miss of Thunder's cache) run with the
    user's lines held (:func:`user_lines`), its ``__wrapped__``; a compilation it began and failed is closed."""

    def scoped(*args: Any, **kwargs: Any) -> Any:
        _hold()
        try:
            return call(*args, **kwargs)
        except BaseException:
            compilation_ends()  # a compilation this call began, left open by a failure
            raise
        finally:
            _release()

    scoped.__wrapped__ = call  # type: ignore[attr-defined]
    scoped.__name__ = scoped.__qualname__ = getattr(call, "__name__", "scoped")
    return scoped


class _Compilation:
    """One guarded compilation's hold of the user's lines: ``open`` until it ends or its trace is freed."""

    open = True


# Compilations whose trace was freed while the scope's lock was taken (a garbage collection may run inside it, in any
# thread): closed by the lock's holder as it lets go (_locked, _unlock).
_PENDING: list[_Compilation] = []


def compilation_begins(trace: object) -> None:
    """Hold the user's lines from here to :func:`compilation_ends` in this thread (a guarded compilation of a
    function, which no call of a module holds them for: its backward lines), or until ``trace`` (the compilation's
    computation trace, which Thunder keeps while it compiles) is freed: a compilation that fails ends there, once
    its error is handled. A compilation left open by a failure in this thread is taken over by the next."""
    with _locked():
        earlier: _Compilation | None = getattr(_SCOPE.thread, "compilation", None)
        if earlier is not None and earlier.open:
            earlier.open = False  # its hold carries over to this one
        else:
            _hold_locked()
        now = _SCOPE.thread.compilation = _Compilation()
    weakref.finalize(trace, _close, now)


def compilation_ends() -> None:
    """Release what :func:`compilation_begins` held in this thread (nothing where nothing is held)."""
    compilation = getattr(_SCOPE.thread, "compilation", None)
    if compilation is not None:
        with _locked():
            _PENDING.append(compilation)


def _close(compilation: _Compilation) -> None:
    """End ``compilation``'s hold once its trace is freed: in any thread, at any point (a garbage collection), so
    where the lock is taken, even by this thread, it is left to the lock's holder."""
    _PENDING.append(compilation)
    if _SCOPE.lock.acquire(blocking=False):
        try:
            _close_pending()
        finally:
            _unlock()


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """The scope's lock held within; the compilations pending at the end closed before it is let go."""
    _SCOPE.lock.acquire()
    try:
        yield
        _close_pending()
    finally:
        _unlock()


def _unlock() -> None:
    """Let go of the scope's lock, then close what a finalizer left pending while it was held (it found the lock
    taken): a finalizer that appends before this looks finds the lock taken and leaves it here; one after, takes it."""
    _SCOPE.lock.release()
    while _PENDING and _SCOPE.lock.acquire(blocking=False):
        try:
            _close_pending()
        finally:
            _SCOPE.lock.release()


def _close_pending() -> None:
    """With the lock held: release each pending compilation's hold that is still open."""
    while _PENDING:
        compilation = _PENDING.pop()
        if compilation.open:
            compilation.open = False
            _release_locked()


def applied_in_scope() -> bool:
    """Whether the user's lines are installed now (some guarded compilation or call holds them)."""
    return _SCOPE.holders > 0


def record_user_frames() -> Callable[[], None] | None:
    """Make each op a guarded compilation traces remember the user's frame that led to it (the first outside
    torch, Thunder, this package and Python's library; under ThunderFX the one torch.fx recorded for its node),
    beside the innermost frame Thunder records and prints (``torch/nn/modules/linear.py`` for an ``nn.Linear``):
    read by :func:`source_line`. What Thunder records and prints is unchanged, and any other compilation calls
    Thunder's own. Installed by :func:`user_lines` only; returns its undo (None: not applied). The shim
    ``user-source-lines`` (:mod:`..shims`): only on the Thunder version it was written for, unless turned off;
    without it a source line is Thunder's innermost frame where that is the user's."""
    patch = _user_frames_patch()
    return None if patch is None else patch.install()


def _user_frames_patch() -> _Patch | None:
    """The wrapper of :func:`record_user_frames`, not installed; None where the shim does not apply."""
    from thunder.core.interpreter import InterpreterRuntimeCtx

    original = InterpreterRuntimeCtx.get_current_user_source_location
    if getattr(original, "_fusion_guard", False) or not shims.applies("user-source-lines"):
        return None

    def located(self: Any) -> Any:
        filename, positions = original(self)
        if filename is None or positions is None or not _compiling_guarded():
            return filename, positions
        if not is_library_file(filename) and not is_installed_library_file(filename):
            return filename, positions
        try:
            user = _user_frame_of(self.frame_stack)
        except Exception:  # a frame this reading does not know: Thunder's own position stays
            user = None
        if user is None:
            return filename, positions
        marked = _Located(*positions)
        marked.user = user
        return filename, marked

    located._fusion_guard = True  # type: ignore[attr-defined]
    located.__wrapped__ = original  # type: ignore[attr-defined]
    return _Patch("user-source-lines", [(InterpreterRuntimeCtx, "get_current_user_source_location", original, located)])


def record_backward_frames() -> Callable[[], None] | None:
    """Make each op of a guarded compilation's backward trace remember the user's line of the forward op whose
    gradient it is part of (:func:`source_line` of that op): Thunder's grad transform makes the backward ops of
    each forward op with no position of their own, so a backward region would have no line of the user's. The
    line is kept beside an empty file name, so what Thunder prints of a backward trace is unchanged. Installed by
    :func:`user_lines` only; returns its undo (None: not applied). The shim ``backward-source-lines``
    (:mod:`..shims`): it wraps ``grad_transform_on_trace``, the test of each op it reads
    (``_should_recompute_bsym_in_backward``, called first for each) and ``TraceCtx.pop_scope`` (the ops a forward
    op's gradient rule made); only on the Thunder version it was written for, unless turned off."""
    patch = _backward_frames_patch()
    return None if patch is None else patch.install()


def _backward_frames_patch() -> _Patch | None:
    """The wrappers of :func:`record_backward_frames`, not installed; None where the shim does not apply."""
    import thunder.transforms.autodiff as autodiff
    from thunder.core.symbol import BoundSymbolTag
    from thunder.core.trace import TraceCtx

    original = autodiff.grad_transform_on_trace
    if getattr(original, "_fusion_guard", False) or not shims.applies("backward-source-lines"):
        return None
    reading, popping = autodiff._should_recompute_bsym_in_backward, TraceCtx.pop_scope
    now = threading.local()  # per thread: the lines of the ops made so far, and the forward op being read

    def read(bsym: BoundSymbol) -> Any:
        if getattr(now, "lines", None) is not None:
            now.forward = source_line(bsym)
        return reading(bsym)

    def pop_scope(self: TraceCtx) -> list:
        made = popping(self)
        lines, forward = getattr(now, "lines", None), getattr(now, "forward", None)
        if lines is not None and forward and made:  # a primitive's scope is None
            for b in made:
                for out in b.flat_proxy_outs:
                    lines.setdefault(out.name, forward)
        return made

    def grad_transform_on_trace(trace: TraceCtx, /, *args: Any, **kwargs: Any) -> TraceCtx:
        if not _compiling_guarded():
            return original(trace, *args, **kwargs)
        outer = getattr(now, "lines", None), getattr(now, "forward", None)
        now.lines, now.forward = {}, None
        try:
            joint = original(trace, *args, **kwargs)
            lines = now.lines
        finally:
            now.lines, now.forward = outer
        with contextlib.suppress(Exception):  # a trace this reading does not know: no line, as Thunder made it
            _mark_backward_ops(joint, lines, BoundSymbolTag.BACKWARD)
        return joint

    grad_transform_on_trace._fusion_guard = True  # type: ignore[attr-defined]
    grad_transform_on_trace.__wrapped__ = original  # type: ignore[attr-defined]
    return _Patch(
        "backward-source-lines",
        [
            (autodiff, "grad_transform_on_trace", original, grad_transform_on_trace),
            (autodiff, "_should_recompute_bsym_in_backward", reading, read),
            (TraceCtx, "pop_scope", popping, pop_scope),
        ],
    )


def _mark_backward_ops(joint: TraceCtx, lines: dict[str, str], backward: Any) -> None:
    """Give each backward op of ``joint`` without a line of its own the line ``lines`` has for one of its
    outputs, beside an empty file name (Thunder prints no position without a file)."""
    symbols = joint.bound_symbols
    for i, b in enumerate(symbols):
        if backward not in b.tags or source_line(b):
            continue
        line = next((lines[o.name] for o in b.flat_proxy_outs if o.name in lines), None)
        if line:
            marked = _Located(None, None, None, None)
            marked.user = line
            symbols[i] = b.from_bsym(source_filename=None, source_positions=marked)


def _user_frame_of(frames: Sequence[Any]) -> str | None:
    """The user's frame among the interpreter's ``frames`` (outermost first), with the installed library's frame
    inside it (:func:`user_frame`); in a torch.fx program, what :func:`fx_node_source` says of the node of the
    line running; where the user wrote no frame (a model built of torch's modules alone, an ``nn.Sequential``, or
    a library's model called whole), the module of their model that ran it (:func:`module_path`), with the
    library's frame."""
    library = None
    for frame in reversed(frames):
        filename, positions = frame.code.co_filename, frame.positions
        if positions is None or positions.lineno is None:
            continue
        if filename.startswith("<eval_with_key>"):
            found = fx_node_source(_fx_node(frame, positions.lineno))
            if found:
                return found
        elif is_installed_library_file(filename):
            library = library or f"{filename}:{positions.lineno}"
        elif not is_library_file(filename):
            return with_library(f"{filename}:{positions.lineno}", library)
    modules = [m for m in (_frame_self(f) for f in frames) if isinstance(m, torch.nn.Module)]
    return with_library(module_path(modules[0], modules[-1]), library) if modules else library


def _frame_self(frame: Any) -> Any:
    """The first local of an interpreter frame (``self`` in a method), unwrapped; None where it has none."""
    first = frame.localsplus[0] if frame.localsplus else None
    return getattr(first, "value", first)  # the interpreter's wrapped value


def _fx_node(frame: Any, lineno: int) -> Any:
    """The torch.fx node whose generated line ``lineno`` the ``forward`` frame of a GraphModule runs; None where
    it is not known."""
    module = _frame_self(frame)
    index = (getattr(module, "_lineno_map", None) or {}).get(lineno - frame.code.co_firstlineno)  # body lines
    graph = getattr(module, "graph", None)
    if index is None or graph is None:
        return None
    return next(itertools.islice(graph.nodes, index, None), None)


def module_path(root: torch.nn.Module, module: torch.nn.Module) -> str:
    """``model.blocks.0.conv (Conv2d)``: where ``module`` sits in the user's model ``root`` (its name in
    ``root.named_modules()``) and its class, how a user finds a line of a model built of torch's modules alone."""
    if module is root:
        return f"model ({type(root).__name__})"
    name = next((n for n, m in root.named_modules() if m is module), None)
    return f"model.{name} ({type(module).__name__})" if name else f"model ({type(module).__name__})"


# Dynamo's name of a module in ``nn_module_stack``: ``L['self'].blocks[0]._modules['conv']``
_DYNAMO_ROOT = re.compile(r"^L\['(\w+)'\]")
_DYNAMO_MODEL = ("self", "fn")  # the compiled module itself: torch.compile's ``self``, ThunderFX's ``fn``
_DYNAMO_ITEM = re.compile(r"(?:\._modules)?\[['\"]?([^'\"\]]+)['\"]?\]")


def fx_node_source(node: Any) -> str | None:
    """Where the user wrote a torch.fx node Dynamo made: their frame in its recorded stack, with an installed
    library's frame inside it (:func:`user_frame`), else, for a model built of torch's or a library's modules
    alone, the module of their model Dynamo recorded it ran in (``model.0 (Linear)``, as :func:`module_path`
    names it), with the library's frame; None where neither is known."""
    if node is None:
        return None
    user, library = _user_and_library(reversed(_STACK_FRAME.findall(node.meta.get("stack_trace") or "")))
    stack = node.meta.get("nn_module_stack") or {}
    if user or not stack:
        return with_library(user, library) if user else library
    path, cls = list(stack.values())[-1]
    root = _DYNAMO_ROOT.match(path)
    name = _DYNAMO_ITEM.sub(r".\1", path[root.end() :] if root else path)
    base = "model" if root is None or root.group(1) in _DYNAMO_MODEL else root.group(1)
    kind = getattr(cls, "__name__", None) or str(cls).rsplit(".", 1)[-1]
    return with_library(f"{base}{name} ({kind})", library)
