"""Voila with no network: ``python -m qviz.apps.voila notebook.ipynb``.

Voila's own page template links Font Awesome's stylesheets from a CDN (cdn.jsdelivr.net), so an
offline Voila app makes two failing requests and logs console errors. qviz ships a Voila
template, ``qviz`` (``voila_share/voila/templates/qviz``): Voila's "lab" template with those two
links emptied, the icons coming from the Font Awesome that Voila's widget manager bundles. This
module runs Voila with that template found (its folder put first on ``JUPYTER_PATH``) and
chosen (``--template=qviz``); every other argument goes to Voila unchanged::

    python -m qviz.apps.voila notebooks/05_interactive_quantization.ipynb --port=8866

Example:
    >>> env = voila_env({"JUPYTER_PATH": "/opt/jupyter"})
    >>> env["JUPYTER_PATH"].split(os.pathsep)[1]
    '/opt/jupyter'
    >>> (Path(env["JUPYTER_PATH"].split(os.pathsep)[0]) / "voila/templates/qviz").is_dir()
    True
    >>> voila_args(["app.ipynb", "--port=8866"])
    ['--template=qviz', 'app.ipynb', '--port=8866']
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

#: The name of qviz's Voila template.
TEMPLATE = "qviz"
#: The Jupyter data folder that holds ``voila/templates/qviz``.
TEMPLATE_ROOT = Path(__file__).parent / "voila_share"


def voila_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's environment) with :data:`TEMPLATE_ROOT` first on
    ``JUPYTER_PATH``, where Voila looks for templates.

    Example:
        >>> voila_env({})["JUPYTER_PATH"] == str(TEMPLATE_ROOT)
        True
    """
    out = dict(os.environ if env is None else env)
    paths = [p for p in out.get("JUPYTER_PATH", "").split(os.pathsep) if p]
    out["JUPYTER_PATH"] = os.pathsep.join([str(TEMPLATE_ROOT), *paths])
    return out


def voila_args(argv: Sequence[str]) -> list[str]:
    """Voila's command-line arguments: ``--template=qviz``, then ``argv`` (a later
    ``--template=...`` in ``argv`` wins).

    Example:
        >>> voila_args(["app.ipynb"])
        ['--template=qviz', 'app.ipynb']
    """
    return [f"--template={TEMPLATE}", *argv]


def main(argv: Sequence[str] | None = None) -> None:
    """Run Voila on the arguments (default: the command line's) with qviz's template.

    Example:
        >>> callable(main)  # python -m qviz.apps.voila notebook.ipynb
        True
    """
    os.environ.update(voila_env())
    from voila.app import main as voila_main

    sys.argv = [sys.argv[0], *voila_args(sys.argv[1:] if argv is None else argv)]
    voila_main()


if __name__ == "__main__":
    main()
