"""headstart: lossless self-speculative decoding with trained draft heads.

A frozen target model produces hidden states; draft heads (Medusa, EAGLE-1/2/3) are trained on
the target's own outputs; a tree-attention verifier decodes faster with exactly the target's output.
"""

import headstart.catalogue  # noqa: F401  the built-in head kinds, registered by name (strings: no torch)
from headstart.errors import HeadstartError

__version__ = "0.1.0"
__all__ = ["HeadstartError", "__version__"]
