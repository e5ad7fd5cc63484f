"""``python -m depthlib.tracing facts [MODEL]``: re-make the packaged fact set (:func:`depthlib.tracing.facts.main`)."""
from depthlib.tracing.facts import main

if __name__ == "__main__":
    raise SystemExit(main())
