"""A small Sphinx extension for the book's page chrome (loaded by ``_config.yml``: ``sphinx.local_extensions``).

sphinx-thebe registers its inline configuration script (``const THEBE_JS_URL = ...``) once per read phase, and a
Jupyter Book build can run that phase twice, so every page declared the constant twice and the browser logged
"Identifier 'THEBE_JS_URL' has already been declared". This removes repeated scripts from each page, keeping the
first of each (same file or same inline body, same attributes).

Sphinx's search page fetches every result page to show a summary under it. A browser refuses those fetches for a
book opened from ``file://`` (CORS: the results still show, but the console logs one error per page), so there the
summaries are switched off; a served book (http, https) keeps them.
"""

#: runs after ``documentation_options.js`` (priority 200) and before the search runs (on page load)
NO_SUMMARY_FROM_FILES = ("if (location.protocol === 'file:' && typeof DOCUMENTATION_OPTIONS !== 'undefined') "
                         "{ DOCUMENTATION_OPTIONS.SHOW_SEARCH_SUMMARY = false; }")


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
    app.add_js_file(None, body=NO_SUMMARY_FROM_FILES, priority=300)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
