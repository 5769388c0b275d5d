"""The fp64 oracles live with the op definitions (``tensor_ops._ops``, public as
``tensor_ops.testing.oracles``); this alias keeps ``from tests import _reference`` working."""
from tensor_ops.testing import oracles

globals().update(vars(oracles))
