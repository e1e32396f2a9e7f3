"""FusionGuard's option surface: a few top-level keywords, the finer options in three groups (a frozen dataclass
or a dict of its fields), errors that name ``group.field`` and say where a grouped option's name belongs."""

from __future__ import annotations

import dataclasses
import inspect
import re

import pytest

from thunder_fusion_guard import Costs, FusionGuard, Rewrites, Runtime
from thunder_fusion_guard.options import GROUP_OF, GROUPS, GuardOptions, nested


def test_at_most_twelve_top_level_options():
    params = list(inspect.signature(FusionGuard.__init__).parameters.values())[1:]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params)
    assert len(params) <= 12, [p.name for p in params]
    assert {"costs", "rewrites", "runtime"} <= {p.name for p in params}
    assert not {f.name for group in GROUPS for f in dataclasses.fields(group)} & {p.name for p in params}


@pytest.mark.parametrize("group", GROUPS, ids=lambda g: g.__name__)
def test_a_group_is_a_frozen_record_whose_default_is_the_keywords_default(group):
    default = inspect.signature(FusionGuard.__init__).parameters[group.option].default
    assert default == group() and getattr(GuardOptions(), group.option) == group()
    with pytest.raises(dataclasses.FrozenInstanceError):
        group().anything = 1


def test_a_group_given_as_a_dict_is_the_same_record():
    by_dict = FusionGuard(rewrites={"rehome": False}, costs={"margin": 0.1}, runtime={"direct_calls": False})
    by_record = FusionGuard(
        rewrites=Rewrites(rehome=False), costs=Costs(margin=0.1), runtime=Runtime(direct_calls=False)
    )
    assert by_dict.options == by_record.options
    assert by_dict.options.rewrites.rehome is False and by_dict.options.rewrites.fold_setitem is True
    assert by_dict.options.costs.margin == 0.1 and by_dict.measurer.budget_s == Costs().measure_budget_s
    assert repr(by_dict) == (
        "FusionGuard(costs=Costs(margin=0.1), rewrites=Rewrites(rehome=False), runtime=Runtime(direct_calls=False))"
    )
    assert repr(FusionGuard()) == "FusionGuard()"


def test_a_bad_value_in_a_group_names_its_path():
    expected = "FusionGuard option 'rewrites.rehome' must be True or False, got 1"
    for make in (lambda: Rewrites(rehome=1), lambda: FusionGuard(rewrites={"rehome": 1})):
        with pytest.raises(ValueError) as caught:
            make()
        assert str(caught.value) == expected
    with pytest.raises(ValueError, match=re.escape("'costs.margin' must be a number in")):
        FusionGuard(costs={"margin": 1.5})
    with pytest.raises(ValueError, match=re.escape("'runtime.hoist_max_bytes'")):
        Runtime(hoist_max_bytes=-1)


@pytest.mark.parametrize(
    ("value", "match"),
    [
        (Rewrites(), "option 'costs' must be a Costs or a dict of its fields, got Rewrites()"),
        (0.1, "option 'costs' must be a Costs or a dict of its fields, got 0.1"),
    ],
)
def test_a_group_of_the_wrong_kind_is_a_value_error(value, match):
    with pytest.raises(ValueError, match=re.escape(match)):
        FusionGuard(costs=value)


def test_an_unknown_key_in_a_group_dict_is_a_type_error_naming_it():
    with pytest.raises(TypeError) as caught:
        FusionGuard(rewrites={"rehome": False, "bogus": 1})
    assert str(caught.value) == (
        "FusionGuard option 'rewrites' got an unexpected key 'bogus'; its keys are metadata_ops, fold_setitem, "
        "concat_padded_sums, remove_identities, rehome, merge_regions, small_matmuls, "
        "override_compile_options"
    )
    with pytest.raises(TypeError, match=r"unexpected key 'margin' \(it is a field of the group 'costs': write "):
        FusionGuard(rewrites={"margin": 0.1})


@pytest.mark.parametrize("name", sorted(GROUP_OF))
def test_a_grouped_option_as_a_keyword_says_which_group_to_write_it_in(name):
    group = GROUP_OF[name]
    value = next(f.default for f in dataclasses.fields(group) if f.name == name)
    with pytest.raises(TypeError) as caught:
        FusionGuard(strict=True, **{name: value})
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"FusionGuard() got an unexpected keyword argument {name!r}: ")
    assert f"{group.option}={group.__name__}({name}={value!r})" in message
    assert f"{group.option}={{{name!r}: {value!r}}}" in message


def test_option_dicts_written_as_json_may_name_a_grouped_option_alone():
    """Benchmark scripts take FusionGuard options as JSON; a grouped option there is its group's field."""
    given = {"choose_executor": True, "margin": 0.1, "costs": {"cost_model": True}, "rehome": False, "hoist": False}
    assert nested(given) == {
        "choose_executor": True,
        "costs": {"margin": 0.1, "cost_model": True},
        "rewrites": {"rehome": False},
        "hoist": False,
    }
    assert nested(nested(given)) == nested(given)
    assert FusionGuard(**nested(given)).options.rewrites == Rewrites(rehome=False)
    with pytest.raises(ValueError, match="'costs' is given both whole and by its fields"):
        nested({"costs": Costs(), "margin": 0.1})
    with pytest.raises(TypeError, match="'bogus'"):
        FusionGuard(**nested({"bogus": 1}))
