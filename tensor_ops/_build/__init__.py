"""Build-time helpers used by setup.py.

setup.py loads these modules *by file path* (see ``setup.py:_load_build_module``) so that
building never imports the ``tensor_ops`` package itself, which needs NumPy and may run in
pip's isolated build environment. Keep every module here free of ``tensor_ops`` imports:
each gets :mod:`jsonfile` (backend.json: locate, read, atomic write) by a relative import
when the package is imported and by file path otherwise, and reads environment variables
through ``jsonfile.env`` (``tensor_ops/_env.py``, the registry of every variable).
"""
