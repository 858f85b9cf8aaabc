"""The suite's hypothesis profiles, loaded only while the suite runs (SPEC 4.4.4, 4.4.7).

``gefen-certify`` (the default of a suite run: 300 derandomized examples, no example database)
and ``gefen-fuzz`` (5000 random examples). A certifying run uses ``gefen-certify``; a run under a
profile that generates differently is ``partial``. Nothing here is imported, registered or loaded
in a pytest session that does not run the suite, and the profile active before the run is loaded
again when it ends, so other projects' hypothesis tests keep their own settings.

Hypothesis keeps a cache under ``.hypothesis/`` in the current directory; a suite run points it
at a temporary directory of its own, removed when the run ends.

The examples a suite run draws depend on the suite's version only. Hypothesis (6.131 and later)
also draws, now and then, constants it finds in the source of every imported module outside
site-packages and the standard library: an editable install of the suite, an implementation
checked out beside it, or whatever else the process imported would each change the derandomized
examples. A suite run turns that source of constants off (:func:`without_local_constants`) and
turns it back on when it ends.
"""

from __future__ import annotations

import shutil
import tempfile

CERTIFY = "gefen-certify"
FUZZ = "gefen-fuzz"
# the settings that decide which examples run: a profile that differs in one of them narrows the run
_GENERATION = ("max_examples", "derandomize", "phases", "backend")


def register() -> None:
    from hypothesis import HealthCheck, settings

    quiet = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
    both = dict(database=None, deadline=None, suppress_health_check=quiet, print_blob=True)
    settings.register_profile(CERTIFY, derandomize=True, max_examples=300, **both)
    settings.register_profile(FUZZ, derandomize=False, max_examples=5000, **both)


def without_local_constants():
    """Hypothesis's constants from local modules turned off in this process; a callable that turns
    them back on. A no-op where this hypothesis draws no such constants."""
    try:
        from hypothesis.internal.conjecture import providers
    except ImportError:
        return lambda: None
    original = getattr(providers, "_get_local_constants", None)
    empty = getattr(providers, "Constants", None)
    if original is None or empty is None:
        return lambda: None
    none = empty()
    providers._get_local_constants = lambda: none
    cache = getattr(getattr(providers, "CONSTANTS_CACHE", None), "cache", None)
    if cache is not None:  # choices computed with the local constants, if any were
        cache.clear()

    def restore():
        providers._get_local_constants = original
        if cache is not None:
            cache.clear()

    return restore


class HypothesisProfile:
    """Loads ``gefen-certify`` (unless ``--hypothesis-profile`` chose one) and undoes it afterwards."""

    def __init__(self, requested: str | None):
        self.requested = requested
        self._previous: str | None = None
        self._home: str | None = None
        self._restore_constants = None

    def enter(self) -> None:
        from hypothesis import configuration, settings

        register()
        self._previous = current_name()
        if not self.requested:
            settings.load_profile(CERTIFY)
        self._home = tempfile.mkdtemp(prefix="gefen-hypothesis-")
        configuration.set_hypothesis_home_dir(self._home)
        self._restore_constants = without_local_constants()

    def exit(self) -> None:
        if self._previous is None and self._home is None:
            return  # nothing entered: no import of hypothesis (seconds at load) on the way out
        if self._restore_constants is not None:
            self._restore_constants()
            self._restore_constants = None
        from hypothesis import configuration, settings

        if self._previous is not None:
            settings.load_profile(self._previous)
            self._previous = None
        if self._home is not None:
            configuration.set_hypothesis_home_dir(None)
            shutil.rmtree(self._home, ignore_errors=True)
            self._home = None


def _jsonable(value):
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if hasattr(value, "total_seconds"):  # a deadline
        return value.total_seconds()
    if isinstance(value, (list, tuple, set, frozenset)):
        items = [_jsonable(v) for v in value]
        return sorted(items, key=str) if isinstance(value, (set, frozenset)) else items
    name = getattr(value, "name", None)
    return name if isinstance(name, str) else repr(value)


def describe() -> dict:
    """``{"profile": name, "settings": {...}}`` of the profile in effect now."""
    from hypothesis import settings

    current = settings.default
    names = (
        "max_examples",
        "derandomize",
        "deadline",
        "phases",
        "database",
        "backend",
        "stateful_step_count",
        "suppress_health_check",
        "print_blob",
    )
    values = {}
    for name in names:
        try:
            values[name] = _jsonable(getattr(current, name))
        except AttributeError:  # older hypothesis without the setting
            continue
    return {"profile": current_name(), "settings": values}


def narrowing() -> str | None:
    """Why the profile in effect generates differently from ``gefen-certify`` (None when it does not)."""
    from hypothesis import settings

    register_if_missing()
    current, certify = settings.default, settings.get_profile(CERTIFY)
    changed = [
        f"{name}={_jsonable(getattr(current, name, None))}"
        for name in _GENERATION
        if _jsonable(getattr(current, name, None)) != _jsonable(getattr(certify, name, None))
    ]
    if not changed:
        return None
    return f"hypothesis profile {current_name()} ({', '.join(changed)})"


def register_if_missing() -> None:
    from hypothesis import settings

    try:
        settings.get_profile(CERTIFY)
    except Exception:
        register()


def current_name() -> str:
    from hypothesis import settings

    getter = getattr(settings, "get_current_profile_name", None)  # not in older hypothesis
    return getter() if getter is not None else (getattr(settings, "_current_profile", None) or "default")
