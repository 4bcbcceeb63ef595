"""Blob ids, the codec, verification and the on-disk blob layout."""
