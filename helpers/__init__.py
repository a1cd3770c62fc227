"""helpers: the code behind the course companion's notebooks.

Importing it makes Triton run on machines without CUDA: TRITON_INTERPRET=1 must
be set before triton is first imported, so neither a notebook nor a test has to
know. Set TRITON_INTERPRET yourself to override.
"""
import os
import sys

if "TRITON_INTERPRET" not in os.environ:
    import torch

    if not torch.cuda.is_available():
        if "triton" in sys.modules:
            import warnings

            warnings.warn(
                "triton was imported before helpers on a machine without CUDA, so its "
                "interpreter could not be switched on; import helpers first or set TRITON_INTERPRET=1"
            )
        os.environ["TRITON_INTERPRET"] = "1"

__version__ = "0.1.0"
