"""The operators' console: a static page every node serves at ``/console`` and the small read
endpoint it needs that no other endpoint gives (``GET /v1/console/node``).

The page (``static/``: plain HTML, JS and CSS, no build step, nothing fetched from elsewhere)
reads the plane's shared state (regions, placement, drills, halt, audit) from one *source*
region and each region's own figures (led shards and epochs, appends, replay) from that region
directly; see ``services.console.routes`` for why, and the README's "Console" section.
"""
