"""How pytest imports a suite module: by its installed name, never by its path (SPEC 4.1.7)."""

from __future__ import annotations

from pathlib import Path

import pytest

#: The suite's modules are imported under these names, whatever directory pytest runs from.
SUITE_PACKAGE = "gefen_conformance.suite"


class SuiteModule(pytest.Module):
    """A suite module imported by its installed name (``gefen_conformance.suite.<module>``), never
    by pytest's path-derived one: in an editable install that would be "conformance.suite.<module>"
    with the checkout put on ``sys.path``, which collides with a user's own ``conformance``
    package and makes rank bodies unpicklable in the ranks (SPEC 4.1.7)."""

    def _getobj(self):
        # Why a private method: pytest has no public way to import a collected file under another
        # module name. Every import mode derives the name from the path; importing in
        # pytest_pycollect_makemodule and setting the public ``obj`` would skip the getter's marker
        # extraction (a module-level ``pytestmark`` silently dropped) and turn one module's import
        # error into a failure of the whole directory. ``_getobj`` and its caller, the ``obj`` getter,
        # are unchanged from pytest 8.0 to 9.2 (benchmarks/dependency_floors.results.txt); the
        # package's pytest range stops there.
        import importlib

        name = f"{SUITE_PACKAGE}.{self.path.stem}"
        try:
            module = importlib.import_module(name)
        except Exception:
            raise self.CollectError(
                f"the suite module {name} failed to import:\n{_exception_text()}"
            ) from None
        if Path(module.__file__).resolve() != self.path.resolve():
            raise self.CollectError(
                f"{name} was imported from {module.__file__}, not from {self.path}: "
                "another gefen_conformance shadows this one"
            )
        self.config.pluginmanager.consider_module(module)
        return module


def _exception_text() -> str:
    import traceback

    return traceback.format_exc(limit=-3)
