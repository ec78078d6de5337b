import os

from mypyc.build import mypycify
from setuptools import setup

mods = os.environ["MYPYC_MODS"].split()
flags = os.environ.get("MYPYC_FLAGS", "--follow-imports=silent --python-executable=/work/venv/bin/python").split()
setup(name="scratch", ext_modules=mypycify(flags + mods, opt_level=os.environ.get("MYPYC_OPT", "3")), packages=[])
