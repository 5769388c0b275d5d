"""Integrations with model libraries (each an optional extra): ``tensor_ops.integrations.transformers``
patches Hugging Face models in place (``pip install tensor_ops[transformers]``)."""
