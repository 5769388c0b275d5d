"""Placeholder until the opencl backend lands: the command exits non-zero and says why."""
from __future__ import annotations

import sys

from setuptools import Command


class BuildOpenCL(Command):
    description = "build the opencl backend (not implemented yet)"
    user_options: list = []

    def initialize_options(self):
        pass

    def finalize_options(self):
        pass

    def run(self):
        print("build_opencl: the opencl backend is not implemented in this version; nothing was built",
              file=sys.stderr)
        raise SystemExit(1)
