"""Every way ``--impl`` can fail is exit status 4 with one line naming the implementation, its
module and the cause, before anything is collected, and writes no file (SPEC 4.1.2, 4.1.6).

Every cause is checked in this process (``registry.resolve`` and ``registry.check``), and end to
end, in a pytest of its own, for one cause of each stage: a name, a package, an import that raises,
an ``Implementation`` that refuses itself, a factory; .ci/run runs the rest end to end too."""

from __future__ import annotations

import sys

import pytest

from gefen_conformance.implementations import registry

MODULES = {
    "unknown_cap": "from gefen_conformance import Implementation\n"
    "IMPL = Implementation(name='u', version='1', make_optimizer=lambda p, **h: None,"
    " capabilities={'warp-drive'})\n",
    "raises_oserror": "raise OSError('libfastgefen.so: cannot open shared object file')\n",
    "bad_syntax": "def broken(:\n    pass\n",
    "raises_runtime": "raise RuntimeError('CUDA driver too old')\n",
    "missing_dep": "import no_such_dependency_xyz\n",
    "not_impl": "IMPL = 42\n",
    "factory_fails": "def IMPL():\n    raise KeyError('config')\n",
    # a plugin that says at exit whether the process imported torch
    "torch_probe": "import atexit, sys\n"
    "atexit.register(lambda: open('torch-imported', 'w').write(str('torch' in sys.modules)))\n",
}

CASES = [
    ("does-not-exist", "no implementation of that name is registered"),
    ("unknown_cap:IMPL", "unknown capabilities ['warp-drive']"),
    ("raises_oserror:IMPL", "OSError: libfastgefen.so: cannot open shared object file"),
    ("bad_syntax:IMPL", "SyntaxError"),
    ("raises_runtime:IMPL", "RuntimeError: CUDA driver too old"),
    ("missing_dep:IMPL", "ModuleNotFoundError: No module named 'no_such_dependency_xyz'"),
    ("not_impl:IMPL", "is a int, not a gefen_conformance.Implementation"),
    ("factory_fails:IMPL", "calling factory_fails:IMPL() failed: KeyError"),
    ("not_impl:NOPE", "has no attribute 'NOPE'"),
    ("nowhere_pkg.fast:IMPL", "is the package installed or on PYTHONPATH?"),
    ("no-colon-but-dots.x", "no implementation of that name is registered"),
]
#: refused before torch is imported (seconds): nothing needs importing to know them wrong
BEFORE_TORCH = {"does-not-exist", "nowhere_pkg.fast:IMPL", "no-colon-but-dots.x"}
#: run end to end by the default run (one cause of each stage)
END_TO_END = {
    "does-not-exist",
    "nowhere_pkg.fast:IMPL",
    "raises_runtime:IMPL",
    "unknown_cap:IMPL",
    "factory_fails:IMPL",
}


@pytest.fixture
def project(pytester):
    for name, source in MODULES.items():
        (pytester.path / f"{name}.py").write_text(source)
    return pytester


@pytest.mark.parametrize("spec,cause", CASES, ids=[c[0] for c in CASES])
def test_every_way_to_fail_is_one_implementation_error(tmp_path, monkeypatch, spec, cause):
    for name, source in MODULES.items():
        (tmp_path / f"{name}.py").write_text(source)
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(registry.ImplementationError) as raised:
        registry.resolve(spec)
    message = str(raised.value)
    assert "\n" not in message and message.startswith(f"implementation {spec!r}") and cause in message
    if ":" in spec:
        assert f"(module {spec.partition(':')[0]})" in message
    if spec in BEFORE_TORCH:  # the same words before anything is imported
        with pytest.raises(registry.ImplementationError) as early:
            registry.check(spec)
        assert str(early.value) == message
    else:
        registry.check(spec)


@pytest.mark.parametrize(
    "spec,cause",
    [pytest.param(*c, id=c[0], marks=() if c[0] in END_TO_END else pytest.mark.slow) for c in CASES],
)
def test_usage_error_is_one_line_exit_4(project, spec, cause):
    result = project.runpytest_subprocess(f"--impl={spec}", "-p", "no:cacheprovider", "-p", "torch_probe")
    err = result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str() + err
    assert "INTERNALERROR" not in err + result.stdout.str()
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"ERROR: --impl={spec}: implementation {spec!r}") and cause in lines[0], lines[
        0
    ]
    if ":" in spec:
        assert f"(module {spec.partition(':')[0]})" in lines[0]
    assert "collected" not in result.stdout.str()  # refused before collection
    if spec in BEFORE_TORCH:
        assert (project.path / "torch-imported").read_text() == "False"
    written = [
        p.name for p in project.path.iterdir() if p.name.startswith((".hypothesis", "gefen-certificate"))
    ]
    assert not written


def test_usage_error_with_pyargs_and_xdist(project):
    result = project.runpytest_subprocess(
        "--pyargs", "gefen_conformance", "--impl=unknown_cap:IMPL", "-n", "2", "-p", "no:cacheprovider"
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "INTERNALERROR" not in result.stderr.str() + result.stdout.str()
    assert "warp-drive" in result.stderr.str()
