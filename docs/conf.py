"""Sphinx configuration of the dp_ckpt_plugin documentation."""

project = "dp_ckpt_plugin"
author = "dp_ckpt_plugin developers"

extensions = [
    "dargs.sphinx",
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
]

source_suffix = {
    ".rst": "restructuredtext",
    ".md": "markdown",
}
root_doc = "index"
exclude_patterns = ["_build", "examples"]

myst_heading_anchors = 3
html_theme = "alabaster"

# The API reference (api.md) is written from the numpy-style docstrings.
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_description_target = "documented"
napoleon_numpy_docstring = True
napoleon_google_docstring = False
napoleon_preprocess_types = True
napoleon_type_aliases = {
    "Path": "pathlib.Path",
    "Mapping": "collections.abc.Mapping",
    "Iterable": "collections.abc.Iterable",
    "iterable": "collections.abc.Iterable",
    "Sequence": "collections.abc.Sequence",
    "sequence": "collections.abc.Sequence",
    "callable": "collections.abc.Callable",
    # the package's own names, as docstrings write them short
    **{
        name: f"dp_ckpt_plugin.{module}.{name}"
        for module, names in {
            "checkpoint": ["Checkpoint", "Commit"],
            "plugin.hooks": ["Hooks"],
            "store.catalogue": ["Catalogue"],
            "store.place": ["StorePlace"],
            "checkpoint.resume": ["ResumeState"],
            "storage": ["Storage", "Entry", "PayloadBytes"],
            "storage.local": ["LocalStorage"],
            "errors": ["InvalidRecordError", "CorruptCheckpointError"],
            "checkpoint.layout": ["Family"],
            "checkpoint.manifest": ["Manifest", "FamilyInfo"],
            "store.publish": ["Mirror"],
            "ranks": ["Ranks"],
            "checkpoint.records": ["CommitRecord"],
            "resolution": ["Resolved", "ResolveContext", "Verifier"],
            "retention": ["RetentionPolicy", "Candidate", "Verdict", "KeepBest"],
            "store.core": ["CheckpointStore"],
            "store.family": ["FamilyConfig"],
        }.items()
        for name in names
    },
}

# Every reference must resolve (the docs build with -n -W) except those into
# the standard library and third-party packages, which have no inventory here
# (the build runs offline).
nitpicky = True
nitpick_ignore_regex = [
    (
        r"py:.*",
        r"(pathlib|os|collections(\.abc)?|typing|types|pluggy|dargs|argparse)(\..*)?",
    ),
    # pieces of compound types in docstrings, such as ``(int, str) or None``
    # or ``Mapping[str, float]``: not names
    (r"py:class", r".*[\[\](){}].*"),
]


def _public_name(app, env, node, contnode):
    """Resolve ``dp_ckpt_plugin.Name`` (and a bare ``Name``) where ``Name`` is defined.

    The package re-exports its public names at the top level
    (``dp_ckpt_plugin._EXPORTS``); docstrings refer to them there, the API
    reference documents them in their modules.
    """
    from dp_ckpt_plugin import _EXPORTS

    if node.get("refdomain") != "py":
        return None
    target = node.get("reftarget", "")
    name = target.removeprefix("dp_ckpt_plugin.")
    head = name.partition(".")[0]
    module = _EXPORTS.get(head)
    if module is None:
        return None
    full = f"dp_ckpt_plugin.{module}.{name}"
    return env.get_domain("py").resolve_xref(
        env, node["refdoc"], app.builder, node["reftype"], full, node, contnode
    )


def setup(app):
    """Hook :func:`_public_name` into the build."""
    app.connect("missing-reference", _public_name)
