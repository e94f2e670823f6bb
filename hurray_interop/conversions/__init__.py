"""Whole-file conversions between foreign checkpoint formats and ``.hrry`` files."""
