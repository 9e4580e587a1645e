"""Build hook (the project's metadata is in ``pyproject.toml``): compiles the simulator's numeric and run-once
modules (:data:`sim.compiled.COMPILED_MODULES`) from their source with Cython (typed only where an augmenting
``.pxd`` says so), each optional
(:class:`OptionalBuildExt`: a failed compile leaves that module in Python), and records the sources' hashes for the import guard
(:data:`sim.compiled.HASHES_FILE`). ``KVSIM_PURE_PYTHON=1 pip install ...`` compiles nothing."""
import importlib.util
import json
import os
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


def _compiled_list():
    """:mod:`sim.compiled`, loaded on its own (``sim`` is not importable while it is being built)."""
    spec = importlib.util.spec_from_file_location("_kvsim_compiled_list", ROOT / "sim" / "compiled.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


LISTED = _compiled_list()

SOURCE_HASHES: dict = {}
"""Module -> hash of the source handed to Cython (:func:`extensions`); recorded for the modules that built."""


def extensions() -> list:
    listed = LISTED
    if listed.pure_requested():
        return []
    try:
        from Cython.Build import cythonize
    except ImportError:       # Cython is a build requirement; a build without it stays pure Python
        return []
    sim_dir = ROOT / "sim"
    SOURCE_HASHES.update({module: listed.source_hash(listed.source_path(module, sim_dir))
                          for module in listed.COMPILED_MODULES})
    # (not optional=True: OptionalBuildExt takes each failure, which setuptools' own handling lets through)
    modules = [Extension(module, [str(listed.source_path(module, sim_dir).relative_to(ROOT))],
                         extra_compile_args=list(listed.COMPILE_ARGS))
               for module in listed.COMPILED_MODULES]
    try:
        return cythonize(modules, build_dir="build/cython", compiler_directives=listed.CYTHON_DIRECTIVES,
                         quiet=True, nthreads=os.cpu_count() or 1)
    except Exception as exc:  # a Cython that cannot translate them: the install goes on in pure Python
        print(f"kvsim: the hot modules are not compiled ({type(exc).__name__}: {exc}); they run as Python",
              file=sys.stderr)
        return []


class OptionalBuildExt(build_ext):
    """Every compiled module is optional: one that does not build (no C compiler, no Python headers) stays
    Python, with one line saying so (setuptools' own ``optional=True`` lets a failed parallel build through, and
    an editable install then looks for the missing file). Only the modules that built are recorded in
    :data:`sim.compiled.HASHES_FILE`, after the build: an extension left from an earlier build of a module that
    failed now has no record, so the import guard runs that module from its source."""

    def build_extensions(self):
        self._failed = set()
        super().build_extensions()
        self.extensions = [ext for ext in self.extensions if ext.name not in self._failed]
        built = {ext.name: SOURCE_HASHES[ext.name] for ext in self.extensions if ext.name in SOURCE_HASHES}
        text = json.dumps(built, indent=1, sort_keys=True) + "\n"
        for sim_dir in {ROOT / "sim", Path(self.build_lib) / "sim"}:      # the source tree, and a wheel's tree
            if sim_dir.is_dir():
                (sim_dir / LISTED.HASHES_FILE).write_text(text)
        write_bytecode()

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as exc:     # the compiler's or the linker's failure, whatever its class
            self._failed.add(ext.name)
            print(f"kvsim: {ext.name} is not compiled ({type(exc).__name__}: {exc}); it runs as Python",
                  file=sys.stderr)


PACKAGES = ("sim", "traces", "analysis", "hwbackend")
"""The project's packages, byte-compiled by :func:`write_bytecode` (with ``cli.py``)."""


def write_bytecode() -> None:
    """Byte-compile the project's modules in the source tree (``__pycache__``, as pip does for a wheel's files):
    an editable install's modules are otherwise compiled from source at every start where Python does not write
    bytecode (``PYTHONDONTWRITEBYTECODE``, set on this project's machines and in many containers): 30-40 ms of a
    ``simulate`` process (``docs/scale.md``, Round 9). Python checks each file against its source's size and
    modification time, so an edit after the install is compiled from source as before. Best effort: a tree that
    cannot be written is left as it is."""
    import compileall
    try:
        for package in PACKAGES:
            if (ROOT / package).is_dir():
                compileall.compile_dir(str(ROOT / package), quiet=2)
        compileall.compile_file(str(ROOT / "cli.py"), quiet=2)
    except OSError as exc:
        print(f"kvsim: bytecode not written ({exc}); modules compile at start-up", file=sys.stderr)


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt},
      options={"build_ext": {"parallel": os.cpu_count() or 1}})
