"""The built-in chat page: `/` serves static/index.html, `/ui/*` its script and style sheet.
Three hand-written files shipped in the package, read once at start-up: no build step, and
nothing is fetched from outside (the Content-Security-Policy says so to the browser too).
The page itself needs no API key; the API calls it makes send the one typed into it."""
from __future__ import annotations

from importlib import resources

from starlette.responses import Response
from starlette.routing import Route

# The page loads only this server's files, and sends its requests only to this server;
# images are attached as data: URLs.
_CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self' data: blob:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
_FILES = {"/": ("index.html", "text/html; charset=utf-8"),
          "/ui/app.js": ("app.js", "text/javascript; charset=utf-8"),
          "/ui/style.css": ("style.css", "text/css; charset=utf-8")}


def web_ui_routes() -> list[Route]:
    """GET routes of the page's files (read now, so a broken install fails at start-up)."""
    static = resources.files(__package__) / "static"
    routes = []
    for path, (name, media_type) in _FILES.items():
        body = (static / name).read_bytes()
        headers = {"Content-Security-Policy": _CSP, "X-Content-Type-Options": "nosniff",
                   "Cache-Control": "no-cache"}

        async def serve(request, body=body, media_type=media_type, headers=headers):
            return Response(body, media_type=media_type, headers=headers)
        routes.append(Route(path, serve, methods=["GET"]))
    return routes
