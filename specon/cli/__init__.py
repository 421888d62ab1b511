"""The ``specon`` command line."""
