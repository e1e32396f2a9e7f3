"""A compiled function's one cache entry called directly (the guard's ``runtime.direct_entry``): Thunder's per-call path
without the work that only chooses among entries or keeps statistics.

Each call of a ``thunder.jit`` function (Thunder 0.2.6's ``fn_``) builds the cache info of the call (default dtype
and device, autocast, which tensor arguments share storage, grad mode, DDP's no-sync), then tries each cached
entry's prologue until one accepts the arguments, runs its computation, connects the outputs to autograd and runs
its epilogue; timestamps and counters go to the compile statistics. Where a function has one entry, the guard's
:class:`DirectEntry` does the same steps for it, in the same order and in the same contexts (compile data, the
language context, the cache info the prologue reads), with the cache info built without flattening the
arguments. Every check the prologue makes is still made on every call: a call it refuses, and any call outside
the cases above (keyword arguments, autocast on, a function traced inside another, a second entry), goes through
Thunder's own path, which then does what it always does. So each call computes what Thunder's call computes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import thunder
import torch
from thunder.core.compile_data import compile_data_and_stats
from thunder.core.langctxs import langctx
from thunder.core.options import CACHE_OPTIONS
from thunder.core.trace import is_tracing
from thunder.executors.torch_autograd import connect_to_autograd

__all__ = ["DirectEntry", "direct_entry"]

THUNDER_VERSION = "0.2.6"  # the release whose call path this mirrors; any other keeps Thunder's call


class DirectEntry:
    """``thunder_fn`` (a ``thunder.jit`` function of one cache entry) called without its search of the cache."""

    def __init__(self, thunder_fn: Callable, cd: Any, cs: Any, entry: Any) -> None:
        self.thunder_fn, self.cd, self.cs, self.entry = thunder_fn, cd, cs, entry
        self._langctx = langctx(cd.langctx)
        options = cd.compile_options
        self._alias_info = not options.get("skip_inplace_alias_updates", False)
        self._split = options.get("thunderfx_disable_split_autograd", False)
        self._differentiable = options.get("is_differentiable_outputs", None)
        self.calls = 0  # calls that took this path (the rest went through Thunder's)
        self.on_leave: Callable[[str], None] | None = None  # told once, when a second entry ends direct calls
        self.__name__ = self.__qualname__ = getattr(thunder_fn, "__name__", "direct_entry")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        cd, cs, entry = self.cd, self.cs, self.entry
        if len(cs.interpreter_cache) != 1 or cs.interpreter_cache[0] is not entry:
            self._leave(f"{len(cs.interpreter_cache)} cache entries: Thunder chooses among them at each call")
            return self.thunder_fn(*args, **kwargs)
        if kwargs or is_tracing() or torch.is_autocast_enabled() or torch.is_autocast_cpu_enabled():
            return self.thunder_fn(*args, **kwargs)
        info = _cache_info(args, self._alias_info)
        if info is None:
            return self.thunder_fn(*args, **kwargs)
        cd.is_grad_enabled = info["is_grad_enabled"]
        token = thunder._cache_info_ctx.set(info)
        try:
            with self._langctx, compile_data_and_stats(cd, cs):
                inps, pro_to_epi = entry.prologue_fn(*args)
        except Exception:  # refused: Thunder's own path decides (another entry, a compilation, its error)
            return self.thunder_fn(*args, **kwargs)
        finally:
            thunder._cache_info_ctx.reset(token)
        cs.calls += 1
        cs.cache_hits += 1
        self.calls += 1
        result = entry.computation_fn(*inps)
        if entry.backward_fn:
            data, (saved_tensors, saved_other) = result
            connect_to_autograd(
                backward_fn=entry.backward_fn,
                flat_args=data["flat_args"],
                flat_output=data["flat_output"],
                saved_tensors=saved_tensors,
                saved_other=saved_other,
                return_none_instead_of_grads=entry.return_none_instead_of_grads,
                disable_split_autograd=self._split,
                is_differentiable_outputs=self._differentiable,
            )
            result = data["output"]
        result = entry.epilogue_fn(*pro_to_epi, *result)
        torch.set_grad_enabled(cd.is_grad_enabled)
        cs.last_computation = entry.computation_fn
        return result

    def _leave(self, why: str) -> None:
        told, self.on_leave = self.on_leave, None
        if told is not None:
            told(why)


def _cache_info(args: tuple, alias_info: bool) -> dict[str, Any] | None:
    """The cache info Thunder 0.2.6's ``populate_cache_info`` builds for positional ``args`` without autocast or
    DDP/FSDP, in its key order; None where an argument is a container (Thunder flattens those: its own path)."""
    groups: dict[int, list[int]] = {}
    for i, a in enumerate(args):
        if type(a) is torch.Tensor:
            if a.layout is torch.strided:  # as Thunder: exact torch.Tensor only (not Parameter), strided
                groups.setdefault(a.untyped_storage().data_ptr(), []).append(i)
        elif not isinstance(a, (torch.Tensor, int, float, bool, str, type(None), torch.SymInt, torch.SymFloat)):
            return None
    info: dict[str, Any] = {
        "default_dtype": torch.get_default_dtype(),
        "default_device": torch.get_default_device(),
        "is_autocast_enabled": False,
    }
    if alias_info:
        info["alias_tensor_indices"] = "-".join(",".join(map(str, g)) for g in groups.values() if len(g) > 1)
    info["is_grad_enabled"] = torch.is_grad_enabled()
    info["no_grad_sync"] = False
    return info


def direct_entry(jitted: Any, thunder_fn: Callable) -> tuple[DirectEntry | None, str]:
    """A :class:`DirectEntry` for ``thunder_fn``, the function the ThunderModule ``jitted`` calls, once it has
    compiled; or None and why not (another Thunder release, DDP/FSDP, a cache option or a number of entries the
    direct call does not mirror). Thunder's debug options act while it compiles, so they change nothing here."""
    if thunder.__version__ != THUNDER_VERSION:
        return None, f"Thunder {thunder.__version__}: the direct call mirrors Thunder {THUNDER_VERSION}'s call"
    cd, cs = getattr(thunder_fn, "_lc_cd", None), getattr(thunder_fn, "_lc_cs", None)
    if cd is None or cs is None:
        cd, cs = getattr(jitted, "_lc_cd", None), getattr(jitted, "_lc_cs", None)
    if cd is None or cs is None:
        return None, "not a thunder.jit function"
    if cd.cache_option not in (CACHE_OPTIONS.CONSTANT_VALUES, CACHE_OPTIONS.SYMBOLIC_VALUES):
        return None, f"cache option {cd.cache_option.name.lower()}"
    if getattr(cd.fn, "use_ddp", False) or getattr(cd.fn, "use_fsdp", False):
        return None, "DDP or FSDP: each call asks whether gradients are synchronized"
    if len(cs.interpreter_cache) != 1:
        return None, f"{len(cs.interpreter_cache)} cache entries: Thunder chooses among them at each call"
    return DirectEntry(thunder_fn, cd, cs, cs.interpreter_cache[0]), ""
