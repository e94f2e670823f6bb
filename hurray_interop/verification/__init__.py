"""Proof that nothing changed: the ``verify`` checks per format.

``common`` holds the skeleton (round trip, pair with a .hrry, pair of one format)
and the result types; ``gguf`` and ``safetensors`` say what differs per foreign
format; ``hurray`` compares two .hrry files.  The registry hands each format's
verifier to :mod:`hurray_interop._verify`.
"""
