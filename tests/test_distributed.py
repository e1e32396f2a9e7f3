"""Distributed runs: communication ops are never rewritten, moved across or reordered; every rank decides
alike; reports name their rank. The two-process tests (gloo, CPU) train under Thunder's FSDP by default
and, with ``--run-slow``, under each set-up that thunder 0.2.6 can run, with the extra cases and Thunder's
own failures; the others build execution traces in one process (a one-rank gloo group) without running
them."""

from __future__ import annotations

import copy
import json
import socket
import warnings
from dataclasses import replace

import distributed_worker
import pytest
import thunder.distributed.prims as dist_prims
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from thunder.common import trace as trace_of
from thunder.core import prims
from thunder.executors.passes import transform_for_execution
from thunder.executors.torch_compile import TorchCompileExecutor, torch_compile_ex
from thunder.extend import ImplInfo, get_always_executors

from thunder_fusion_guard import CommunicationChanged, Costs, Decision, FusionGuard, RankMismatch, Rewrites
from thunder_fusion_guard import _thunder as th
from thunder_fusion_guard.distributed import current_rank, decision_key, rank_path
from thunder_fusion_guard.ops import identity_reason, is_communication
from thunder_fusion_guard.options import make_options
from thunder_fusion_guard.passes import TraceContext, guard_trace
from thunder_fusion_guard.passes.collectives import communication_changes, communication_sequence
from thunder_fusion_guard.passes.pipeline import Pass, PassContext, run_pass
from thunder_fusion_guard.report import Report
from thunder_fusion_guard.tools.cli import main

SUM = dist_prims.DistributedReduceOps.SUM


@pytest.fixture
def group(one_rank):
    """The one-rank gloo group of conftest.py (Thunder's collectives need one to be traced)."""
    return one_rank


def _executor(name: str, *, reshape: bool = True, comms: bool = False) -> TorchCompileExecutor:
    """torch.compile's executor, optionally without reshape (so that it stays outside, as nvFuser's edge
    views do) and without Thunder's collectives (torch_compile_ex fuses them)."""
    ex = TorchCompileExecutor(name=name)
    skip = set() if reshape else {prims.PrimIDs.RESHAPE, "torch.reshape"}
    ex._implmap = {
        op: ImplInfo()
        for op in torch_compile_ex._implmap
        if op not in skip and (comms or not isinstance(op, dist_prims.PrimIDs))
    }
    return ex


def _execution_trace(fn, args, executor):
    """The execution trace Thunder would run (fusion regions formed, nothing compiled or run)."""
    return transform_for_execution(trace_of()(fn, *args), [executor, *get_always_executors()])


def _claims_reshape_again(ex: TorchCompileExecutor) -> None:
    """After fusing without reshape: the executor can run reshape, it only left it out (as nvFuser's
    bookend views), so re-homing may move it in."""
    ex._implmap.update({prims.PrimIDs.RESHAPE: ImplInfo(), "torch.reshape": ImplInfo()})


def _view_then_allreduce(group):
    def f(x, w):
        v = x.reshape(2, 8)
        y = dist_prims.wait(dist_prims.all_reduce(w, SUM, group, True))
        return v * 2 + y

    return f


def _names(trace) -> list[str]:
    return [b.sym.name for b in trace.bound_symbols if not th.is_comment_or_del(b)]


def test_communication_ops_are_recognised(group):
    args = (torch.randn(4, 4), torch.randn(2, 8))
    trace = _execution_trace(_view_then_allreduce(group), args, _executor("tc_noreshape", reshape=False))
    found = {b.sym.name: is_communication(b) for b in trace.bound_symbols}
    assert found["torch_all_reduce_prim_impl"] and found["torch_wait_prim_impl"]
    assert not found["reshape"] and not found["TorchCompile0"]
    assert all(identity_reason(b) is None for b in trace.bound_symbols if is_communication(b))
    fused = _execution_trace(_view_then_allreduce(group), args, _executor("tc_comms", comms=True))
    regions = [b for b in fused.bound_symbols if th.is_fusion(b)]
    assert any(is_communication(r) for r in regions), "torch.compile's executor fuses Thunder's collectives"


def test_region_holding_a_collective_is_never_rewritten(group):
    def f(x):
        y = dist_prims.wait(dist_prims.all_reduce(x.reshape(16), SUM, group, True))
        return y.reshape(4, 4)

    trace = _execution_trace(f, (torch.randn(4, 4),), _executor("tc_comms", comms=True))
    (region,) = [b for b in trace.bound_symbols if th.is_fusion(b)]
    report = Report()
    # A fusion call priced at a second: every other region would go to the torch executor.
    cheap_eager = dict(fusion_call_us=1e6, fusion_gbps=1.0, eager_op_us=1.0, eager_meta_us=1.0, eager_gbps=1.0)
    options = make_options(
        exact_only=False,
        strict=True,
        costs=Costs(calibration={**cheap_eager, "overlapped": False}),
        rewrites=Rewrites(merge_regions=True),
    )
    new = guard_trace(trace, options, report, TraceContext("forward"), lambda device, ex: options.costs.calibration)
    (decision,) = [d for d in report if d.about_region]
    assert decision.action == "keep" and decision.details["decided_by"] == "rule"  # not the cost model
    assert {"all_reduce", "wait"} <= set(decision.ops)  # Thunder's distributed prims, inside the region
    assert [d.action for d in report if not d.about_region] == []  # its inner reshapes stay too
    (after,) = [b for b in new.bound_symbols if th.is_fusion(b)]
    assert after is region


def test_view_is_not_moved_across_a_wait(group):
    ex = _executor("tc_noreshape", reshape=False)
    trace = _execution_trace(_view_then_allreduce(group), (torch.randn(4, 4), torch.randn(2, 8)), ex)
    report = Report()
    new = guard_trace(trace, make_options(strict=True, costs=Costs(cost_model=False)), report, TraceContext("forward"))
    (kept,) = [d for d in report if d.ops == ["reshape"]]
    assert (kept.action, kept.code, kept.details["blocked_by"]) == (
        "keep",
        "rehome_blocked",
        "torch_all_reduce_prim_impl",
    )
    assert _names(new) == _names(trace)
    assert _names(new).index("reshape") < _names(new).index("torch_all_reduce_prim_impl")

    def no_collective(x, w):
        return x.reshape(2, 8) * 2 + w

    report = Report()
    plain = _execution_trace(no_collective, (torch.randn(4, 4), torch.randn(2, 8)), ex)
    _claims_reshape_again(ex)
    moved = guard_trace(
        plain,
        make_options(strict=True, costs=Costs(cost_model=False)),
        report,
        TraceContext("forward"),
    )
    assert [d.action for d in report if d.ops == ["reshape"]] == ["rehome"]
    assert "reshape" not in _names(moved)


def _moved_across(trace):
    """``trace`` with its reshape moved after the wait: what a careless pass would do."""
    bsyms = list(trace.bound_symbols)
    view = next(i for i, b in enumerate(bsyms) if b.sym.name == "reshape")
    wait = next(i for i, b in enumerate(bsyms) if b.sym.name == "torch_wait_prim_impl")
    bsyms.insert(wait, bsyms.pop(view))
    return th.new_trace_like(trace, bsyms)


def _swapped_collectives(trace):
    bsyms = list(trace.bound_symbols)
    first, second = [i for i, b in enumerate(bsyms) if is_communication(b)][:2]
    bsyms[first], bsyms[second] = bsyms[second], bsyms[first]
    return th.new_trace_like(trace, bsyms)


def test_communication_check_drops_a_pass_that_moves_across(group):
    ex = _executor("tc_noreshape", reshape=False)
    trace = _execution_trace(_view_then_allreduce(group), (torch.randn(4, 4), torch.randn(2, 8)), ex)
    assert communication_changes(trace, trace) is None
    assert [s[0] for s in communication_sequence(trace)] == ["torch_all_reduce_prim_impl", "torch_wait_prim_impl"]
    assert "moved across a communication op" in communication_changes(trace, _moved_across(trace))
    assert "communication op 0 was torch_all_reduce_prim_impl" in communication_changes(
        trace, _swapped_collectives(trace)
    )

    def careless_pass(trace, context):
        """Move a view past a wait."""
        return _moved_across(trace), []

    careless = Pass("careless_pass", None, careless_pass)
    kept, made = run_pass(careless, trace, PassContext(make_options(), TraceContext("forward"), trace))
    assert kept is trace
    (decision,) = made
    assert decision.action == "keep" and decision.ops == [] and decision.details["scope"] == "op"
    assert decision.error.startswith("CommunicationChanged")
    with pytest.raises(CommunicationChanged, match="careless_pass would change the communication"):
        run_pass(careless, trace, PassContext(make_options(strict=True), TraceContext("forward"), trace))


def _decision(rank=None, action="keep") -> Decision:
    return Decision("forward", "TorchCompile0", "torchcompile", ["add"], action, "why", function="f", rank=rank)


def test_ranks_that_name_the_same_ops_otherwise_decided_alike(group, monkeypatch):
    """Thunder numbers proxies in an order string hashing can change: a removed op named t176 on one rank and t177
    on the other is the same decision; a region of another name is not."""
    from thunder_fusion_guard.decisions import Details

    guard = FusionGuard()
    guard.report.add(_decision(rank=0))
    removed = Decision(
        "forward", "t176", "torch", ["reshape"], "remove", "why", function="f", details=Details(scope="op")
    )
    guard.report.add(removed)
    other = replace(removed, region="t177")
    _fake_world(monkeypatch, lambda keys: [decision_key(d) for d in (_decision(rank=1), other)])
    assert guard.check_ranks() == []
    _fake_world(
        monkeypatch, lambda keys: [decision_key(d) for d in (replace(_decision(), region="TorchCompile1"), other)]
    )
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        (problem,) = guard.check_ranks()
    assert "rank 1 f#0:forward TorchCompile1" in problem
    _fake_world(monkeypatch, lambda keys: [keys[0], decision_key(replace(other, action="keep"))])
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        (problem,) = guard.check_ranks()
    assert "rank 0 f#0:forward ops (torch, 1 ops): remove" in problem


def test_reports_and_files_name_the_rank(monkeypatch):
    report = Report()
    report.add(_decision(rank=3))
    text = str(report)
    assert text.splitlines()[0] == "FusionGuard report (rank 3)"
    assert text.splitlines()[-1] == "FusionGuard (rank 3): 1 decision (1 keep)"
    assert report.to_markdown().startswith("# FusionGuard report (rank 3)")
    assert report.to_dict()["rank"] == 3 and report.rank == 3
    assert rank_path("out/report.json", 1) == "out/report.rank1.json"
    assert rank_path("out/report-{rank}.json", 1) == "out/report-1.json"
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert current_rank() is None and rank_path("report.json") == "report.json"
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert current_rank() == 1 and rank_path("report.json") == "report.rank1.json"


def test_report_cli_writes_one_file_per_rank(tmp_path, monkeypatch, capsys):
    target = tmp_path / "target.py"
    target.write_text(
        "import torch\n\ndef make():\n    return (lambda x: x.reshape(-1, 4).t() * 2), (torch.randn(3, 4),)\n"
    )
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    argv = ["report", f"{target}:make", "--device", "cpu", "--no-backward"]
    assert main([*argv, "--json", str(tmp_path / "r-{rank}.json"), "--markdown", str(tmp_path / "r.md")]) == 0
    assert "FusionGuard report (rank 1)" in capsys.readouterr().out
    doc = json.loads((tmp_path / "r-1.json").read_text())
    assert doc["rank"] == 1 and doc["report"]["rank"] == 1
    assert {d["rank"] for d in doc["report"]["decisions"]} == {1}
    assert (tmp_path / "r.rank1.md").read_text().startswith("# FusionGuard report: ")


def _fake_world(monkeypatch, other_rank_decides):
    """Pretend a second rank answered all_gather_object with ``other_rank_decides`` applied to our keys."""

    def all_gather_object(out, obj, group=None):
        out[0], out[1] = obj, other_rank_decides(list(obj))

    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(dist, "all_gather_object", all_gather_object)


def test_check_ranks_finds_a_rank_that_decided_otherwise(group, monkeypatch):
    guard = FusionGuard()
    guard.report.add(_decision(rank=0))
    assert guard.check_ranks() == []  # one rank: nothing to compare
    _fake_world(monkeypatch, lambda keys: keys)
    assert guard.check_ranks() == []
    _fake_world(monkeypatch, lambda keys: [(*k[:-2], "reject", True) for k in keys])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        (problem,) = guard.check_ranks()
    assert "rank 1 decided differently from rank 0" in problem and "rank 1 f#0:forward TorchCompile0" in problem
    assert guard.report.warnings == [problem] and guard.report.to_text(wide=True).endswith(f"warning: {problem}")
    assert any(problem in str(w.message) for w in caught)
    strict = FusionGuard(strict=True)
    strict.report.add(_decision(rank=0))
    with pytest.raises(RankMismatch, match="rank 1 decided differently"):
        strict.check_ranks()
    with pytest.raises(ValueError, match="compare_ranks"):
        FusionGuard(compare_ranks="yes")


def test_guard_is_shared_not_copied():
    """ThunderFX deep-copies split graphs, which under DDP and FSDP2 reach the backend and its guard."""
    guard = FusionGuard()
    options = copy.deepcopy({"transforms": [guard]})
    assert options["transforms"][0] is guard


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _two_ranks(tmp_path, setups: list[str], failures: list[str], lane=None) -> list[dict]:
    """Run tests/distributed_worker.py on two gloo processes; each rank's results. ``lane``: the
    BackgroundLane of tests/conftest.py running this, told how to end the ranks."""
    args = (2, _free_port(), str(tmp_path), setups, failures)
    context = mp.spawn(distributed_worker.main, args=args, nprocs=2, join=False)
    if lane is not None:
        lane.track(lambda: [p.kill() for p in context.processes if p.is_alive()])
    while not context.join(timeout=5):  # a hang ends at pytest-timeout's limit, not at a bound of this test's
        pass
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for rank, result in enumerate(ranks):
        for name in setups:
            got = result["setups"][name]
            assert "error" not in got, f"{name} on rank {rank}: {got.get('traceback')}"
    return ranks


def _alike(ranks: list[dict], name: str) -> None:
    """Guarded equal to unguarded Thunder to the bit on every rank, the same collectives in the same
    order, the same decisions on both ranks."""
    for rank, result in enumerate(ranks):
        got = result["setups"][name]
        assert got["losses_equal"] and got["grads_equal"], (name, rank)
        assert got["collectives_guarded"] == got["collectives_unguarded"], (name, rank)
        assert got["rank_in_report"] == rank and got["check_ranks"] == [], (name, rank)
    first, second = (r["setups"][name] for r in ranks)
    assert first["decisions"] == second["decisions"], name
    assert first["collectives_guarded"] == second["collectives_guarded"], name
    assert first["losses"] != second["losses"]  # each rank trained on its own batches


MASK = ["full", "arange", "unsqueeze", "arange", "unsqueeze", "sub", "ge", "where"]  # full(-inf).triu(1)


def _check_main_setups(ranks: list[dict], setups: list[str]) -> None:
    """What every main set-up shows (the guard at its defaults, strict, ranks compared): the position table
    and the causal mask hoisted on every rank, guarded equal to unguarded Thunder to the bit, the same
    decisions on both ranks, the same collectives in the same order; and what each set-up shows of its own."""
    for name in setups:
        _alike(ranks, name)
        for rank, result in enumerate(ranks):
            hoisted = result["setups"][name]["hoisted"]
            assert hoisted and all(h["applied"] and h["trace"] == "forward" for h in hoisted), (name, rank)
            ops = [op for h in hoisted for op in h["ops"]]
            assert ops.count("full") == 1 and ops[ops.index("full") :][: len(MASK)] == MASK, (name, rank, ops)
            assert ops.count("arange") == 4, (name, rank, ops)  # the table's two, the mask's two
            assert all(h["split"] for h in hoisted), (name, rank)  # taken out of an element-wise region
    for name in {"thunder.distributed.fsdp", "FSDPTransform"} & set(setups):
        got = ranks[0]["setups"][name]
        assert all(c != "[]" for c in got["collectives_guarded"])  # all-gathers forward, reduce-scatters backward
        # Under Thunder's FSDP the table and the mask share one region (before the first wait): one piece.
        assert len(got["hoisted"]) == 1
    for name in {"thunder.distributed.ddp", "DDPTransform", "ThunderFX+DDP", "ThunderFX+FSDP2"} & set(setups):
        assert len(ranks[0]["setups"][name]["hoisted"]) == 2, name  # the table and the mask, one piece each
    for name in {"thunder.distributed.ddp", "DDPTransform"} & set(setups):
        forward, backward = ranks[0]["setups"][name]["collectives_guarded"]
        assert forward == "[]" and "torch_all_reduce_prim_impl" in backward
    if "thunder.distributed.fsdp" in setups:
        for rank, result in enumerate(ranks):
            profile = result["setups"]["thunder.distributed.fsdp"]["profile"]
            assert profile["rank"] == rank and f"on cpu, rank {rank} " in profile["title"] and profile["rows"] > 0
    for name in {"ThunderFX+DDP", "ThunderFX+FSDP2"} & set(setups):
        # PyTorch's DDP and FSDP2 communicate outside the Thunder-compiled subgraphs.
        assert all(c == "[]" for c in ranks[0]["setups"][name]["collectives_guarded"])


def _check_one_op_regions(ranks: list[dict]) -> None:
    """The extra case with one-op regions sent to the torch executor: the pre-averaging divisions between
    FSDP's reduce-scatters are rejected, the collectives stay where they were, the mask is still hoisted."""
    name = "thunder.distributed.fsdp+one-op-regions"
    _alike(ranks, name)
    got = ranks[0]["setups"][name]
    assert got["actions"].get("reject", 0) >= 3  # the pre-averaging divisions between reduce-scatters
    assert got["actions"]["hoist"] == 1


FSDP = "thunder.distributed.fsdp"


def _fsdp_ranks(lane, folder) -> list[dict]:
    return _two_ranks(folder, [FSDP], [], lane=lane)


@pytest.mark.background.with_args(_fsdp_ranks)  # the two ranks train beside the other tests (tests/conftest.py)
def test_two_ranks_train_alike_under_thunders_fsdp(background):
    """The short form of the two-process tests, in the default run: one main set-up, the guard at its defaults
    (Thunder's FSDP, whose traces hold the collectives: all-gathers forward, reduce-scatters backward).
    ``--run-slow`` runs every set-up and every extra case (non-default options that reject the regions between
    FSDP's reduce-scatters among them)."""
    ranks = background
    _check_main_setups(ranks, [FSDP])


@pytest.mark.slow
def test_two_ranks_train_alike_guarded_and_unguarded(tmp_path):
    """Three training steps on two processes under each set-up, the guard at its defaults (strict, ranks
    compared): the position table and the causal mask hoisted on every rank, guarded equal to unguarded
    Thunder to the bit, the same decisions on both ranks, the same collectives in the same order."""
    setups = list(distributed_worker.SETUPS)
    ranks = _two_ranks(tmp_path, setups, [])
    _check_main_setups(ranks, setups)


@pytest.mark.slow
def test_two_ranks_extra_cases_and_thunders_own_failures(tmp_path):
    """Extra cases on two processes, and the README table's "with the guard" column.

    - matmul inside torch.compile's regions: the mask shares a region with reductions, which the default
      ``exact_only`` does not rebuild: nothing is hoisted, everything else as in the main set-ups.
    - one-op regions (non-default options, exact_only=False and a cost model that sends one-op regions to
      the torch executor): the pre-averaging divisions between FSDP's reduce-scatters are rejected, and
      the collectives stay where they were.
    - Thunder's DDP and FSDP with ``torch_compile_ex`` fail in thunder 0.2.6; with the guard they fail the
      same way (the guard neither hides nor changes the error).
    """
    extras = list(distributed_worker.EXTRAS)
    failures = ["ddp+torch_compile_ex", "fsdp+torch_compile_ex"]
    ranks = _two_ranks(tmp_path, extras, [*failures, *(f"{f}+guard" for f in failures)])
    for name in extras:
        _alike(ranks, name)
    for name in ("thunder.distributed.ddp+matmul-in-regions", "thunder.distributed.fsdp+matmul-in-regions"):
        for result in ranks:
            got = result["setups"][name]
            assert got["hoisted"] == [] and set(got["actions"]) == {"keep"}, name
            (masked,) = [ops for trace, _, _, ops in got["regions"] if trace == "forward" and "full" in ops]
            assert "matmul" in masked or "linear" in masked, (name, masked)
    _check_one_op_regions(ranks)
    for result in ranks:
        found = result["failures"]
        ddp_error = "builtins.IndexError in get_bsym_of_allreduce_of_grad: tuple index out of range"
        fsdp_error = "torch._dynamo.exc.Unsupported in compile_wrapper: async_op=True for distributed collectives"
        assert found["ddp+torch_compile_ex"]["error"] == ddp_error
        assert found["fsdp+torch_compile_ex"]["error"].startswith(fsdp_error)
        # With the guard: the same error, unchanged.
        assert found["ddp+torch_compile_ex+guard"]["error"] == found["ddp+torch_compile_ex"]["error"]
        assert found["fsdp+torch_compile_ex+guard"]["error"] == found["fsdp+torch_compile_ex"]["error"]
        # Thunder's DDP fails in its own transform before the guard sees a trace; under FSDP the guard ran
        # and kept the regions that hold a collective, and torch.compile then fails on them as without it.
        assert found["ddp+torch_compile_ex+guard"]["actions"] == {}
        # Besides, a row says which input-independent work the default exact_only leaves in its region.
        codes = found["fsdp+torch_compile_ex+guard"]["codes"]
        assert set(codes) - {"hoist_refused", "hoist_not_taken"} == {"communication"}, codes


class _Buckets(torch.nn.Module):
    """Three layers of 1.4 MB: DDP's 1 MiB buckets split the graph Dynamo captures between them; ``cummax``, which
    Thunder lacks, is a part ThunderFX's splitter gives Inductor."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = (torch.nn.Linear(600, 600) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.cummax(torch.sin(self.a(x)), 0).values
        return self.c(torch.cos(self.b(h))).sum()


def test_a_subgraph_called_on_fake_tensors_under_ddp_runs_its_own_ops_and_thunder_on_real_ones(group):
    """torch.compile's DDP optimizer runs each bucket's compiled module on fake tensors to learn the next bucket's
    inputs (where a part of it went to Inductor); Thunder cannot run NequIP's subgraphs on them (unguarded, the
    compile fails). Guarded, a subgraph called on fake tensors runs its own ops on them, recorded once and not
    announced; Thunder compiles it at its first call on real tensors: the step's loss and gradients are unguarded
    Thunder's bits."""
    from thunder.dynamo import ThunderCompiler
    from torch.nn.parallel import DistributedDataParallel

    def run(guard):
        torch.manual_seed(0)
        model = _Buckets()
        backend = ThunderCompiler(transforms=[guard] if guard else [])
        step = torch.compile(DistributedDataParallel(model, bucket_cap_mb=1), backend=backend)
        loss = step(torch.randn(8, 600, generator=torch.Generator().manual_seed(1)))
        loss.backward()
        return loss.detach(), [p.grad for p in model.parameters()]

    want_loss, want_grads = run(None)
    guard = FusionGuard()
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        loss, grads = run(guard)
    assert torch.equal(loss, want_loss) and all(torch.equal(a, b) for a, b in zip(grads, want_grads, strict=True))
    (fake,) = [d for d in guard.report if d.code == "fake_inputs"]
    assert fake.action == "keep" and fake.subgraph
    assert [d for d in guard.report if d.action == "enter"]  # Thunder compiled and ran the subgraphs
    assert not [w for w in said if "FusionGuard" in str(w.message)]
