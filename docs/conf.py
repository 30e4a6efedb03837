"""Sphinx configuration of the dp_ckpt_plugin documentation."""

project = "dp_ckpt_plugin"
author = "dp_ckpt_plugin developers"

extensions = [
    "dargs.sphinx",
    "myst_parser",
]

source_suffix = {
    ".rst": "restructuredtext",
    ".md": "markdown",
}
root_doc = "index"
exclude_patterns = ["_build", "examples"]

myst_heading_anchors = 3
html_theme = "alabaster"
