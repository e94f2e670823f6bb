"""Generic file I/O shared by every format: a bounds-checked binary reader and atomic outputs."""
