"""Sphinx configuration for the coarse_jax documentation (`make docs`).

The build is offline: no intersphinx, no downloads. Pages are MyST Markdown; the
API reference comes from the package's Google-style docstrings (napoleon), so
it documents the installed coarse_jax (`make docs` installs it first).
"""

import os

# Importing coarse_jax imports jax; 8 virtual CPU devices, as everywhere in this project.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import coarse_jax

project = "coarse_jax"
author = "the coarse_jax authors"
release = coarse_jax.__version__
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build", "api/generated/*.md"]
root_doc = "index"
templates_path = ["_templates"]

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

# Docstrings write `name` for a name, as Markdown does. The default role
# (`coarse_ref`, below) links it to its API entry when there is one
# (`coarse.sync`, `Config`, `SyncedStep.restore`, a method of the class being
# documented) and otherwise renders it as code, never as reStructuredText's
# italic title reference.
default_role = "coarse_ref"

autosummary_generate = True
autosummary_imported_members = True
autodoc_default_options = {"members": True, "member-order": "bysource"}
autodoc_typehints = "description"
autodoc_typehints_description_target = "documented_params"
autodoc_class_signature = "mixed"
autodoc_preserve_defaults = True
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
napoleon_attr_annotations = True

# Every cross-reference must resolve (`make docs` runs with -W). Intersphinx
# is off so the build needs no network; the types below live in other
# projects' documentation (jax, numpy, optax, flax, the standard library), so a
# reference to them has nothing in this site to point at. They are ignored by
# name; a reference to anything of coarse_jax must still resolve.
nitpicky = True
nitpick_ignore_regex = [
    (r"py:.*", r"(jax|jaxlib|numpy|np|optax|flax|nnx|orbax|matplotlib)(\..*)?"),
    (r"py:.*", r"(typing|collections\.abc|collections|pathlib|os|concurrent\.futures)\..*"),
    (r"py:.*", r"(Any|Callable|Sequence|Mapping|Iterable|Iterator|Hashable|Path|PathLike)"),
    (r"py:.*", r"(Mesh|Array|ArrayLike|Device|PartitionSpec|NamedSharding|PyTree|DTypeLike)"),
    (r"py:.*", r"(GradientTransformation|Schedule|ScalarOrSchedule|OptState|Params|Updates)"),
]

html_theme = "furo"
html_static_path = ["_static"]
html_css_files = ["custom.css"]
html_title = f"coarse_jax {release}"
html_show_sourcelink = False
html_show_copyright = False
# Signatures read `sync(fn=None, mesh=None, ...)` under the page title `coarse.sync`.
add_module_names = False
pygments_style = "friendly"


def _coarse_ref(name, rawtext, text, lineno, inliner, options=None, content=None):
    """`text`: a cross-reference to a Python object, shown as code either way."""
    from docutils import nodes
    from sphinx import addnodes

    target = text.strip().removesuffix("()")
    if target.startswith("coarse."):
        target = "coarse_jax." + target.removeprefix("coarse.")
    literal = nodes.literal(rawtext, text, classes=["xref", "py", "py-obj"])
    env = inliner.document.settings.env
    ref = addnodes.pending_xref(
        rawtext,
        literal,
        refdomain="py",
        reftype="obj",
        reftarget=target,
        refexplicit=False,
        refwarn=False,
        coarse_default_role=True,
    )
    ref["py:module"] = env.ref_context.get("py:module")
    ref["py:class"] = env.ref_context.get("py:class")
    return [ref], []


def _code_when_unresolved(app, env, node, contnode):
    """A `name` of the default role that names nothing documented stays code, silently."""
    if node.get("coarse_default_role"):
        return contnode
    return None


def setup(app):
    from docutils.parsers.rst import roles

    roles.register_local_role("coarse_ref", _coarse_ref)
    app.connect("missing-reference", _code_when_unresolved)
