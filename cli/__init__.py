"""The ``embnic`` command line, the top layer: ``main.py`` is the click group and the console-script entry
point, ``commands/`` one module per CLI noun. Only this package knows click."""
