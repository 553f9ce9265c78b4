"""The camellia-compatible HTTP edge: the event-loop ASGI handler, the browser-safe edge checks,
token checks, request parsing and validation, the views (views/), the wire shapes (wire.py) and
the OpenAPI schema. Imports the workers' layer and below (in practice: the services)."""
