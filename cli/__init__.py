"""The ``embnic`` command line: the top layer, above the testbed and the control library.

``main.py`` is the click group and the console-script entry point (:func:`embnic.cli.main.main`);
``commands/`` holds one module per CLI noun. Only this package knows click; library errors become
click errors and exit codes in one place (:func:`embnic.cli.main.to_click`, docs/cli.md).
"""
