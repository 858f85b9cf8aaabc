"""Build the C kernels when gefen-fast is installed, as kernel packages do.

``pip install [-e] examples/gefen-fast`` compiles ``gefen_fast/csrc/*.c`` with the system C
compiler (``$CC``, else ``cc``) into ``gefen_fast/gefen_kernels-<key>.so``. A compiler that
fails is an installation error with its output. Without any C compiler the installation goes on
with a warning and the optimizer uses the reference's torch step (correct, as slow as the
reference); see ``gefen_fast/native.py`` for how the library is found at run time.
"""

import importlib.util
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("_gefen_fast_build", HERE / "gefen_fast" / "_build.py")
_build = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_build)

KERNELS = "gefen_fast.gefen_kernels"


class BuildKernels(build_ext):
    """Compiles the kernel library with gefen_fast._build (not as a Python extension module)."""

    def get_ext_filename(self, fullname):
        # setuptools asks with the full name (copying in editable mode) and with the last part
        # (get_ext_fullpath, which adds the package directory)
        if fullname == KERNELS:
            return str(Path(*KERNELS.split(".")[:-1], _build.library_name()))
        if fullname == KERNELS.rsplit(".", 1)[1]:
            return _build.library_name()
        return super().get_ext_filename(fullname)

    def build_extension(self, ext):
        if ext.name != KERNELS:
            return super().build_extension(ext)
        target = Path(self.get_ext_fullpath(ext.name))
        try:
            result = _build.compile_library(target)
        except _build.NoCompiler as exc:
            print(
                f"WARNING gefen-fast: {exc}; the kernels are not built and the optimizer will use "
                "the reference's torch step",
                file=sys.stderr,
            )
            return
        except _build.BuildError as exc:
            raise SystemExit(f"error: gefen-fast: {exc}") from None
        # an older build left in the build directory or (editable installs) in the sources
        for directory in {target.parent, HERE / "gefen_fast"}:
            _build.remove_other_builds(directory, target.name)
        note = "" if result["openmp"] else " (without OpenMP: the kernels run on one thread)"
        print(f"gefen-fast: built {target.name} with {result['compiler']} in {result['seconds']:.1f} s{note}")

    def get_outputs(self):
        return [path for path in super().get_outputs() if Path(path).exists()]


setup(
    # optional: without a compiler there is no library to copy (a failing compiler still stops the install)
    ext_modules=[Extension(KERNELS, sources=[], optional=True)],
    cmdclass={"build_ext": BuildKernels},
)
