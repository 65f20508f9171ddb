"""Launchers: qviz's widgets as apps outside JupyterLab.

:mod:`~qviz.apps.voila` runs Voila with qviz's offline template (no CDN), every other argument
passed to Voila unchanged::

    python -m qviz.apps.voila notebooks/05_interactive_quantization.ipynb --port=8866

A launcher runs as a program (``python -m``), so this package imports none of them.

Example:
    >>> import importlib
    >>> importlib.import_module("qviz.apps.voila").voila_args(["app.ipynb"])
    ['--template=qviz', 'app.ipynb']
"""
