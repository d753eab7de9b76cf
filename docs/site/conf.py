"""Sphinx configuration of the nf4lab site (built by tools/build_site.py, which stages the sources).

The site renders the notebooks' committed (or just executed) outputs: it never executes a notebook,
and it needs no network, neither to build nor to be read (MathJax is served from the site itself).
"""
from __future__ import annotations

import os

project = "nf4lab"
author = "nf4lab contributors"
copyright = "nf4lab contributors, MIT License"

extensions = ["myst_nb"]

# Outputs are the record of a GPU run: render them, never recompute them.
nb_execution_mode = "off"
nb_merge_streams = True               # one block per cell instead of a fragment per print
nb_ipywidgets_js = {}                 # no widgets in the series; their loader would fetch from a CDN
myst_enable_extensions = ["dollarmath", "colon_fence", "deflist"]
myst_heading_anchors = 3              # the notebooks' contents lines link to their own headings
master_doc = "index"
# The pages of docs/ are also read on GitHub, where a heading level skipped (H2 to H4) is harmless.
suppress_warnings = ["myst.header"]
exclude_patterns = ["_build", "**.ipynb_checkpoints"]

html_theme = "sphinx_book_theme"
html_title = "nf4lab"
html_static_path = ["_static"]
html_css_files = ["nf4lab.css"]
html_favicon = "_static/favicon.svg"   # else every page asks the server for /favicon.ico
html_theme_options = {
    "show_toc_level": 2,
    "use_download_button": True,      # the .ipynb of each page, from _sources/
    "use_fullscreen_button": False,
    "home_page_in_toc": True,
}
# Unset, pydata-sphinx-theme starts a first visit with mode "" and logs a console error for it.
html_context = {"default_mode": "auto"}
html_last_updated_fmt = None

# MathJax from the site's own _static (tools/build_site.py copies it from the sphinx-mathjax-offline
# wheel): a reader offline, or the browser test, must not depend on a CDN.
_mathjax = os.environ.get("NF4LAB_SITE_MATHJAX")
if _mathjax:
    html_static_path.append(_mathjax)
    mathjax_path = "mathjax/tex-chtml.js"
