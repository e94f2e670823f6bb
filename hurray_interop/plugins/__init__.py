"""The built-in formats, one module each: the format's :class:`~hurray_interop.registry.Format`
record -- how to recognise a file, its options, and small shims that import its reader,
converters, inspection and verifier when first called -- and the one
:func:`~hurray_interop.registry.register_format` call that adds it.

The registry loads them by name (:data:`hurray_interop.registry.BUILTIN_FORMATS`) on its
first look-up; nothing imports them otherwise (``tests/test_architecture.py``).  A new
format is a module here beside its reader (``formats/``), converters (``conversions/``) and
verifier (``verification/``), and its name in ``BUILTIN_FORMATS``: the verbs, the batch
layer and the command line take its options from the record.
"""
