"""Reef: turn an inference server into a learner.

Owns: nothing but the package version. Importing ``reef`` must stay cheap: it loads
no torch, transformers or peft (``tests/architecture`` proves it).
"""

__version__ = "0.1.0"
