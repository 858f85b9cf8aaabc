"""Building mutants without touching the reference: module clones with swapped globals.

``clone(module, **overrides)`` executes a reference module's source into a fresh module object
(registered under a private name), then replaces the named globals. Relative imports inside the
clone resolve to the real sibling modules, so only what is overridden differs. The reference
itself, used by the suite as the oracle in the same process, stays intact.
"""

from __future__ import annotations

import inspect
import itertools
import sys
import types

_counter = itertools.count()


def clone(module: types.ModuleType, **overrides) -> types.ModuleType:
    name = f"{module.__name__}__mutant{next(_counter)}"
    copy = types.ModuleType(name, module.__doc__)
    copy.__dict__.update(__package__=module.__package__, __file__=module.__file__)
    sys.modules[name] = copy  # dataclasses look their module up while the class is built
    exec(compile(inspect.getsource(module), module.__file__, "exec"), copy.__dict__)
    copy.__dict__.update(overrides)
    return copy


def proxy(module: types.ModuleType, **overrides) -> types.SimpleNamespace:
    """A stand-in for ``module`` whose attributes are the module's, except ``overrides``."""
    attrs = {k: getattr(module, k) for k in dir(module) if not k.startswith("__")}
    attrs.update(overrides)
    return types.SimpleNamespace(**attrs)
