"""The demos shipped with the package: ``examples/`` of the source tree, linked here so that a
wheel carries them and ``dxopt demo <name>`` works after ``pip install dxopt``.

:func:`dxopt.cli.main` puts this folder on ``sys.path`` and runs ``examples.<name>.run``.
"""
