"""The ``embnic`` commands: one module per CLI noun (``peers.py``: ``route`` and ``client``), registered by
:mod:`embnic.cli.main`; ``options.py`` holds the shared click options, parameter types and decorators."""
