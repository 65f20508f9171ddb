"""Sphinx configuration of the qviz documentation site (``make docs``).

The site builds offline: no intersphinx, no remote JavaScript or fonts (furo ships its own
assets), and the notebooks are rendered from executed copies, never executed here
(``docs/execute_notebooks.py`` prepares them before the build). See ``contributing.md``.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("MPLBACKEND", "Agg")

project = "qviz"
author = "the qviz authors"
copyright = "the qviz authors"
release = version = "0.1.0"

extensions = [
    "myst_nb",  # Markdown pages (MyST) and notebooks, rendered with their stored outputs
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",  # the Google-style docstrings
    "sphinx.ext.viewcode",
]

exclude_patterns = ["_build", "Thumbs.db", ".DS_Store", "execute_notebooks.py"]
source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}
root_doc = "index"

# MyST: ```python fences stay code; cross-document links are checked (-W fails on a broken one)
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

# Notebooks: never executed by Sphinx (docs/execute_notebooks.py runs the missing ones first);
# widget views need a live kernel and a widget manager from a CDN, so the site shows their
# text fallback; no JavaScript output is embedded.
nb_execution_mode = "off"
nb_ipywidgets_js: dict[str, dict[str, str]] = {}
nb_mime_priority_overrides = [
    ("html", "application/vnd.jupyter.widget-view+json", None),
    ("html", "application/javascript", None),
]
nb_output_stderr = "remove"
nb_merge_streams = True

# API reference: public names through each package's __all__, in source order
autodoc_default_options = {
    "members": True,
    "show-inheritance": True,
}
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_format = "short"
autodoc_preserve_defaults = True
autodoc_mock_imports: list[str] = []
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
napoleon_attr_annotations = True

# Docstrings cross-reference private module paths (``:mod:`~qviz.engine.distributed.sharded```)
# that the reference deliberately leaves out (modules move; the public names do not): an
# unresolved Python reference renders as plain code, not as a broken link, so nitpicky stays off.
nitpicky = False

html_theme = "furo"
html_title = "qviz"
html_static_path: list[str] = []
html_show_sourcelink = False
html_theme_options = {"navigation_with_keys": True}
napoleon_use_ivar = True  # an "Attributes:" section as fields: no second entry beside autodoc's

# Docstrings write an absolute value as |x| (reST reads a substitution): show it as written.
rst_prolog = ".. |x| unicode:: U+007C U+0078 U+007C\n"

#: Docstring formatting that reST reads differently from what the author meant, known and
#: reported (a continuation line inside "Args:", a paragraph after "Raises:"): (object, message).
#: Each entry goes once the docstring is fixed; a new one fails the build like any warning.
KNOWN_DOCSTRING_WARNINGS: list[tuple[str, str]] = []


class _KnownDocstringWarnings(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        where = str(getattr(record, "location", "") or "")
        text = record.getMessage()
        return not any(o in where and m in text for o, m in KNOWN_DOCSTRING_WARNINGS)


def setup(app: object) -> None:
    for handler in logging.getLogger("sphinx").handlers:
        handler.filters.insert(0, _KnownDocstringWarnings())
