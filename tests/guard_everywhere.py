"""A pytest plugin for Thunder's own test suite: every ``thunder.jit`` gets a ``FusionGuard(strict=True)``.

Thunder's wheel ships its tests (``thunder/tests``); they jit with ``DebugOptions(check_traces=2)``. Run the
parts near a change with the guard added, from this checkout (CONTRIBUTING.md has the command):

    cd "$(python3 -c 'import thunder, os; print(os.path.dirname(thunder.__file__))')/tests" &&
      PYTHONPATH=$OLDPWD/tests:$OLDPWD python3 -m pytest -q -p guard_everywhere -p no:cacheprovider \\
      test_jit_general.py -k "litgpt_variants and cpu"

Loaded with ``-p``, it patches ``thunder.jit`` before the test modules bind it (``partial(thunder.jit, ...)``).
"""

import thunder

_jit = thunder.jit


def jit(fn=None, *args, transforms=None, **kwargs):
    """``thunder.jit`` with a strict ``FusionGuard`` after the caller's transforms."""
    from thunder_fusion_guard import Costs, FusionGuard

    transforms = [*(transforms or []), FusionGuard(strict=True, costs=Costs(calibration="shipped"))]
    if fn is None:
        return lambda f: _jit(f, *args, transforms=transforms, **kwargs)
    return _jit(fn, *args, transforms=transforms, **kwargs)


thunder.jit = jit
