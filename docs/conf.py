"""Sphinx configuration for the coarse_jax documentation (`make docs`).

The build is offline: no intersphinx, no downloads. Pages are MyST Markdown; the
API reference comes from the package's Google-style docstrings (napoleon), so
it documents the installed coarse_jax (`make docs` installs it first).
"""

import os

# Importing coarse_jax imports jax; 8 virtual CPU devices, as everywhere in this project.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import coarse_jax  # noqa: E402

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

# Docstrings write `name` for code, as Markdown does: render it as code rather
# than as reStructuredText's default (an italic title reference).
default_role = "literal"

autosummary_generate = True
autosummary_imported_members = True
autodoc_default_options = {"members": True, "member-order": "bysource", "show-inheritance": False}
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
html_title = f"coarse_jax {release}"
html_static_path: list[str] = []
html_show_sourcelink = False
pygments_style = "friendly"
