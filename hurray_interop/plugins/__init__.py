"""The built-in formats, one module each: the format's :class:`~hurray_interop.registry.Format`
record ``FORMAT`` -- how to recognise a file, its options, and small shims that import its
reader, converters, inspection and verifier when first called.  A plugin registers nothing
itself: the registry registers each ``FORMAT`` in the order of ``BUILTIN_FORMATS``, so
importing a plugin module (a test, a tool) changes neither what is registered nor its order.

The registry loads them by name (:data:`hurray_interop.registry.BUILTIN_FORMATS`) on its
first look-up; nothing imports them otherwise (``tests/test_architecture.py``).  A new
format is a module here beside its reader (``formats/``), converters (``conversions/``) and
verifier (``verification/``), and its name in ``BUILTIN_FORMATS``: the verbs, the batch
layer and the command line take its options from the record.
"""
