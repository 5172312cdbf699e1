"""The wheel's build (pyproject.toml holds the project's metadata): the modules broker/compiled.py names compiled by
mypyc where this machine can (a C compiler and Python's headers), else pure Python, the build log saying why. Run by
`pip install .`, `pip wheel .` and `python -m build`; WARREN_COMPILE=0 builds pure Python (make's editable install:
make compiles in place itself), WARREN_OPT_LEVEL=0 compiles without optimizing (broker.compiled)."""

import os
import sys

from setuptools import setup

os.chdir(os.path.dirname(os.path.abspath(__file__)))  # (mypyc takes the sources' paths relative to the tree)
sys.path.insert(0, os.getcwd())
from broker import compiled  # noqa: E402  (the tree's own, which the build env does not install)

# The commands that build what they install (the metadata's, egg_info and dist_info, need nothing compiled: mypyc would
# check and translate every module for nothing before the build itself does it again)
BUILDING = ("bdist_wheel", "build", "build_ext", "install", "develop", "editable_wheel")
wanted = os.environ.get("WARREN_COMPILE") != "0" and any(command in sys.argv[1:] for command in BUILDING)
setup(ext_modules=compiled.extensions() if wanted else [], cmdclass={"build_ext": compiled.parallel_build()})
