"""``GET /docs``: the interactive API page (Swagger UI) with its assets served by the node itself.

FastAPI's default page loads Swagger UI from a CDN, so it was blank on a machine without
internet access and ran third-party script on the console's origin. The assets come from the
``swagger-ui-bundle`` package (Apache-2.0) instead, under ``/docs/static/``, and the page's
Content-Security-Policy allows nothing from elsewhere. ReDoc (CDN only) is not served.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from starlette.staticfiles import StaticFiles

DOCS_PATH = "/docs"
DOCS_STATIC_PATH = "/docs/static"
#: Swagger UI's page starts itself with one inline script; nothing may come from elsewhere
DOCS_CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'"
)


def install_docs(app: FastAPI, openapi_url: str = "/openapi.json") -> None:
    """Serve ``/docs`` and its assets; call on an app built with ``docs_url=None``."""
    from swagger_ui_bundle import swagger_ui_path

    app.mount(DOCS_STATIC_PATH, StaticFiles(directory=str(swagger_ui_path)), name="docs-static")

    @app.get(DOCS_PATH, include_in_schema=False)
    async def swagger_ui() -> HTMLResponse:
        page = get_swagger_ui_html(
            openapi_url=openapi_url,
            title=f"{app.title}: API",
            swagger_js_url=f"{DOCS_STATIC_PATH}/swagger-ui-bundle.js",
            swagger_css_url=f"{DOCS_STATIC_PATH}/swagger-ui.css",
            swagger_favicon_url=f"{DOCS_STATIC_PATH}/favicon-32x32.png",
        )
        page.headers["Content-Security-Policy"] = DOCS_CONTENT_SECURITY_POLICY
        return page
