"""Build-time helpers used by setup.py.

setup.py loads these modules *by file path* (see ``setup.py:_load_build_module``) so that
building never imports the ``tensor_ops`` package itself, which needs NumPy and may run in
pip's isolated build environment. Keep every module here free of ``tensor_ops`` imports.
"""
