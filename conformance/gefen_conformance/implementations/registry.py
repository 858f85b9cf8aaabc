"""Finding implementations: entry points and ``package.module:attribute`` specs (SPEC 4.1.2).

Every way an implementation can fail to load (an unknown name, a module that is not importable,
an import that raises anything at all, a missing attribute, a target that is not an
``Implementation``, an ``Implementation`` that refuses its own fields) is one
:class:`ImplementationError` whose message is one line naming the spec, the module and the cause.
The plugin turns it into a usage error (exit status 4).

An implementation is resolved once per process: :func:`resolve` keeps what it resolved, by spec,
and an :class:`Implementation` it returned pickles as its spec, so a rank body given one receives
its own process's instance, resolved there once (SPEC 4.2.11).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from importlib.metadata import entry_points

from gefen_conformance.implementations.contract import Implementation

ENTRY_POINT_GROUP = "gefen_conformance.implementations"

#: this process's implementations, by the spec they were resolved from
_RESOLVED: dict[str, Implementation] = {}


class MissingPackage(ModuleNotFoundError):
    """Raised by an implementation whose package is not installed: ``requirement`` is what to install
    (``gefen-x==0.5.0``), so that the error can say so (SPEC 4.1.6)."""

    def __init__(self, module: str, requirement: str):
        super().__init__(
            f"No module named {module!r}: install {requirement} (pip install {requirement})", name=module
        )
        self.requirement = requirement


class ImplementationError(LookupError):
    """The implementation named by a spec cannot be loaded; ``str()`` is one line."""

    def __init__(self, spec: str, module: str, cause: str):
        self.spec, self.module, self.cause = spec, module, cause
        where = f" (module {module})" if module else ""
        super().__init__(f"implementation {spec!r}{where}: {cause}")


def registered() -> dict[str, str]:
    """Registered names mapped to their ``module:attribute`` targets."""
    return {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}


def unavailable(name: str) -> str:
    """Why the registered implementation ``name`` cannot be loaded here (one line), or "" when it
    can (SPEC 4.1.6): ``pytest --impl-list`` marks such entries."""
    try:
        resolve(name)
    except ImplementationError as error:
        return error.cause
    return ""


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    if isinstance(error, SyntaxError) and error.filename:
        text = f"{error.msg} ({error.filename}, line {error.lineno})"
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _missing_package(spec: str, module_name: str, error: MissingPackage) -> ImplementationError:
    return ImplementationError(
        spec,
        module_name,
        f"needs the package {error.requirement}, which is not installed "
        f"here (module {error.name!r}): pip install {error.requirement}",
    )


def _import(spec: str, module_name: str):
    try:
        return importlib.import_module(module_name)
    except MissingPackage as error:
        raise _missing_package(spec, module_name, error) from None
    except ModuleNotFoundError as error:
        missing = error.name or ""
        if missing and (module_name == missing or module_name.startswith(missing + ".")):
            raise _not_importable(spec, module_name, missing) from None
        raise ImplementationError(spec, module_name, f"importing it failed: {_one_line(error)}") from None
    except (Exception, SystemExit) as error:  # anything an import can raise: OSError, SyntaxError, ...
        raise ImplementationError(spec, module_name, f"importing it failed: {_one_line(error)}") from None


def _target(spec) -> str:
    """The ``module:attribute`` a spec names, or :class:`ImplementationError`; imports nothing."""
    if not isinstance(spec, str) or not spec.strip():
        raise ImplementationError(
            str(spec), "", "no implementation named (give a registered name or package.module:attribute)"
        )
    if ":" in spec:
        target = spec
    else:
        names = registered()
        if spec not in names:
            known = ", ".join(sorted(names)) or "none"
            raise ImplementationError(
                spec,
                "",
                f"no implementation of that name is registered (registered: {known}); "
                "give a registered name or package.module:attribute",
            )
        target = names[spec]
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise ImplementationError(spec, "", f"{target!r} must look like 'package.module:attribute'")
    return target


def _not_importable(spec: str, module_name: str, missing: str) -> ImplementationError:
    return ImplementationError(
        spec,
        module_name,
        f"module {missing!r} is not importable from {os.getcwd()} "
        "(is the package installed or on PYTHONPATH?)",
    )


def check(spec) -> None:
    """What :func:`resolve` refuses without importing anything: an unknown name, a spec that is not
    ``package.module:attribute``, a top-level package this process cannot find. Raises
    :class:`ImplementationError` with the words :func:`resolve` would use, so that such a mistake
    is answered before torch is imported (seconds)."""
    if isinstance(spec, str) and spec in _RESOLVED:
        return
    module_name = _target(spec).partition(":")[0]
    top = module_name.partition(".")[0]
    try:
        found = importlib.util.find_spec(top)
    except (ImportError, ValueError):  # resolve() reports what the import itself says
        return
    if found is None:
        raise _not_importable(spec, module_name, top)


def _load_target(spec: str, target: str) -> object:
    module_name, _, attribute = target.partition(":")
    obj = _import(spec, module_name)
    for part in attribute.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ImplementationError(
                spec, module_name, f"module {module_name!r} has no attribute {attribute!r}"
            ) from None
    return obj


def resolve(spec: str) -> Implementation:
    """An :class:`Implementation` from a registered name or a ``package.module:attribute`` spec.

    The attribute may be the instance or a zero-argument callable returning it. Resolved once
    per process: a spec resolved before returns the same instance. Raises
    :class:`ImplementationError` for every way this can fail (a failure is not kept).
    """
    if isinstance(spec, str) and spec in _RESOLVED:
        return _RESOLVED[spec]
    target = _target(spec)
    module_name = target.partition(":")[0]
    obj = _load_target(spec, target)
    if not isinstance(obj, Implementation) and callable(obj):
        try:
            obj = obj()
        except MissingPackage as error:
            raise _missing_package(spec, module_name, error) from None
        except Exception as error:
            raise ImplementationError(
                spec, module_name, f"calling {target}() failed: {_one_line(error)}"
            ) from None
    if not isinstance(obj, Implementation):
        raise ImplementationError(
            spec, module_name, f"{target} is a {type(obj).__name__}, not a gefen_conformance.Implementation"
        )
    obj.resolved_as(spec, resolve)
    _RESOLVED[spec] = obj
    return obj
