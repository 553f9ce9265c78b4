"""The admin's template filters (part of the operator's UI layer)."""
