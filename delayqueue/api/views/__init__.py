"""The camellia-compatible HTTP API's views, one module per kind of endpoint; urls.py maps each
path to its view. Views only parse (api/validation.py) and render (api/wire.py, `reply`); the
queue's logic is in the services. Every answer is HTTP 200 with the business result in `code`,
as the camellia Java SDK expects; an error answer is `code` and `msg` (and `retryAfterMillis`
when throttled), from core/exceptions.error_body."""
