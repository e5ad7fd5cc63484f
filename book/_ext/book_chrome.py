"""A small Sphinx extension for the book's page chrome (loaded by ``_config.yml``: ``sphinx.local_extensions``).

sphinx-thebe registers its inline configuration script (``const THEBE_JS_URL = ...``) once per read phase, and a
Jupyter Book build can run that phase twice, so every page declared the constant twice and the browser logged
"Identifier 'THEBE_JS_URL' has already been declared". This removes repeated scripts from each page, keeping the
first of each (same file or same inline body, same attributes).
"""


def _key(js):
    attributes = getattr(js, "attributes", {}) or {}
    return (str(getattr(js, "filename", js) or ""), tuple(sorted((k, str(v)) for k, v in attributes.items())))


def dedupe_scripts(app, pagename, templatename, context, doctree):
    files = context.get("script_files")
    if not files:
        return
    seen, kept = set(), []
    for js in files:
        key = _key(js)
        if key not in seen:
            seen.add(key)
            kept.append(js)
    context["script_files"] = kept


def setup(app):
    app.connect("html-page-context", dedupe_scripts, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
