"""What the zoo records of a model: each path's result, the guard's rescues, the Thunder limitations it met."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .zoo_paths import EAGER, ZooPath

# Thunder's failures the zoo meets, by a piece of their message, with the test that shows each on CPU.
LIMITATIONS_FILE = "tests/test_thunder_limitations.py"
KNOWN_LIMITATIONS = {
    "trying to set .global_var of ProvenanceRecord": "test_setting_attribute_of_global_object_to_dict",
    "Expected a.dtype=": "test_dtype_compared_with_torch_dtype",
    "is not registered": "test_unregistered_custom_op",
    "Unknown attribute layout": "test_tensor_layout",
    "Attempting to reshape": "test_aliased_inputs_of_different_sizes_with_inplace",
    "Failed to find a gradient transform for bound symbol": "test_index_add_grad",
    "multi_head_attention_forward": "test_multihead_attention_backward",
}


def known_limitation(error: str) -> str | None:
    """The test of tests/test_thunder_limitations.py that shows Thunder failing as ``error`` says, if any."""
    for piece, test in KNOWN_LIMITATIONS.items():
        if piece in error:
            return f"{LIMITATIONS_FILE}::{test}"
    return None


@dataclass
class Rescue:
    """What the zoo keeps of one rescue decision of the guard: where, what failed, what runs it now."""

    where: str
    reason: str
    rescued_by: str | None = None  # None: the outputs handed back in the strides Dynamo recorded
    region: Any = None
    trace: str | None = None
    outputs_restrided: Any = None
    source: Any = None

    @classmethod
    def of(cls, d: Any) -> Rescue:
        """The record of the guard's decision ``d``."""
        return cls(
            where=d.subgraph or d.trace,
            reason=d.reason,
            rescued_by=d.details.get("rescued_by"),
            region=d.region,
            trace=d.trace,
            outputs_restrided=d.details.get("outputs_restrided"),
            source=d.details.get("source"),
        )

    def to_dict(self) -> dict[str, Any]:
        """As JSON, every field."""
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Rescue:
        """Read back from :meth:`to_dict`."""
        return cls(**d)


@dataclass
class PathResult:
    """One path of one model: whether it runs (else why not), its first call, how its results compare and with
    what, its timed steps, and what the guard did on it."""

    runs: bool = False
    error: str | None = None  # the error's first line, whole (error_line), or why the path was not started
    error_detail: str | None = None  # the whole error (error_text), where its message has more lines
    first_call_s: float | None = None
    phases_s: dict[str, float] | None = None  # a Thunder path's first call by phase (examine.first_call)
    backends: dict[str, int] | None = None  # the backend choice: subgraphs per backend chosen
    self_difference: float | None = None  # an unguarded Thunder path: the largest difference of it against itself
    compared_with: ZooPath | None = None  # the path its results were compared with (its baseline, or eager)
    difference: float | None = None  # the largest absolute difference from it (None: not the same tensors)
    bits: str | None = None  # the comparison in words
    samples_s: list[float] = field(default_factory=list)
    eager_samples_s: list[float] | None = None  # with its path group's eager apart: that eager's samples
    actions: dict[str, int] | None = None
    rescues: list[Rescue] = field(default_factory=list)
    why: list[str] = field(default_factory=list)

    @property
    def known_limitation(self) -> str | None:
        """The test that shows the Thunder limitation this path failed at, if it failed at a known one."""
        return None if self.runs or not self.error else known_limitation(self.error + (self.error_detail or ""))

    @property
    def error_kind(self) -> str:
        """The kind of the failure, short enough for a table cell: the exception's type (or 'not compiled')."""
        found = re.match(r"([\w.]+)(?=: | \(no message\))", self.error or "")
        return found.group(1) if found else (self.error or "").split(":")[0]

    def to_dict(self) -> dict[str, Any]:
        """As JSON: the fields that hold something (``difference`` wherever something was compared, null there
        meaning other tensors), paths by name, and the known Thunder limitation a failure is."""
        out: dict[str, Any] = {"runs": self.runs}
        for key, value in self.__dict__.items():
            if key != "runs" and value not in (None, [], {}):
                out[key] = value
        if self.compared_with is not None:
            out["compared_with"], out["difference"] = self.compared_with.name, self.difference
        if self.rescues:
            out["rescues"] = [r.to_dict() for r in self.rescues]
        if self.known_limitation:
            out["known_limitation"] = self.known_limitation
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PathResult:
        """Read back from :meth:`to_dict` (keys it does not know, such as ``known_limitation``, are derived)."""
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        if known.get("compared_with") is not None:
            known["compared_with"] = ZooPath.parse(known["compared_with"])
        known["rescues"] = [Rescue.from_dict(r) for r in known.get("rescues", [])]
        return cls(**known)


@dataclass
class ModelResult:
    """One zoo model's record: what it is, each path's result by path, and what stopped its process, if anything."""

    model: str
    library: str = ""
    what: str = ""
    paths: dict[ZooPath, PathResult] = field(default_factory=dict)
    translated: bool = False  # with the package's translations of library ops (translate_library_ops)
    path_groups: list[list[ZooPath]] | None = None  # merged from path groups: the paths of each process
    rounds_cut: int | None = None  # timing stopped at the deadline after this many rounds
    problem: str | None = None  # a process that timed out or crashed

    def to_dict(self) -> dict[str, Any]:
        """As JSON, paths by name, the fields that hold something."""
        out: dict[str, Any] = {"model": self.model, "library": self.library, "what": self.what}
        out["paths"] = {p.name: row.to_dict() for p, row in self.paths.items()}
        if self.translated:
            out["translated"] = True
        if self.path_groups is not None:
            out["path_groups"] = [[p.name for p in group] for group in self.path_groups]
        if self.rounds_cut is not None:
            out["rounds_cut"] = self.rounds_cut
        if self.problem:
            out["problem"] = self.problem
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelResult:
        """Read back from :meth:`to_dict`."""
        groups = d.get("path_groups")
        return cls(
            model=d["model"],
            library=d.get("library", ""),
            what=d.get("what", ""),
            paths={ZooPath.parse(p): PathResult.from_dict(row) for p, row in d.get("paths", {}).items()},
            translated=bool(d.get("translated")),
            path_groups=None if groups is None else [[ZooPath.parse(p) for p in g] for g in groups],
            rounds_cut=d.get("rounds_cut"),
            problem=d.get("problem"),
        )


def merge_groups(parts: Sequence[ModelResult]) -> ModelResult:
    """One model's records from its path groups as one record: the paths of each in group order (a path that
    ran in several groups keeps its first record, and each other path the eager samples of its own group, its
    yardstick), the groups' problems joined."""
    merged = replace(parts[0], paths={}, problem=None)
    if len(parts) > 1:  # the paths timed together (interleaved) in one process
        merged.path_groups = [list(part.paths) for part in parts]
    for part in parts:
        eager = part.paths[EAGER].samples_s if EAGER in part.paths else []
        for path, row in part.paths.items():
            if eager and path != EAGER and len(parts) > 1:
                row = replace(row, eager_samples_s=eager)
            merged.paths.setdefault(path, row)
    problems = [p.problem for p in parts if p.problem]
    if problems:
        merged.problem = "; ".join(dict.fromkeys(problems))
    return merged
